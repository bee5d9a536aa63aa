//! A Garage S3 server for one test ([`strait_devkit::Garage`] in a temporary directory),
//! killed when dropped; its log is printed when the test fails while it runs.

use std::ops::Deref;

pub use strait_devkit::{ACCESS_KEY, BUCKET, REGION, SECRET_KEY};

pub struct Garage {
    // dropped first: the server stops before its directory goes
    server: strait_devkit::Garage,
    _dir: tempfile::TempDir,
}

impl Garage {
    /// Start a ready Garage, or None (after printing SKIPPED) when the `garage` binary is
    /// missing. Under `CI=true` a missing binary panics; a failed start always panics.
    pub fn start() -> Option<Garage> {
        if !super::require_program("garage") {
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("strait-garage-")
            .tempdir()
            .unwrap_or_else(|e| panic!("create a directory for Garage: {e}"));
        match strait_devkit::Garage::start_in(dir.path()) {
            Ok(server) => {
                eprintln!(
                    "Garage ready at {} in {} ms (dir {})",
                    server.endpoint(),
                    server.startup_time().as_millis(),
                    server.dir().display()
                );
                Some(Garage { server, _dir: dir })
            }
            Err(e) => panic!("start Garage: {e:#}"),
        }
    }
}

impl Garage {
    /// The bucket, as strait's S3 object store sees it with the server's key.
    pub async fn store(&self) -> strait_fs_core::object::DynStore {
        use strait_fs_core::object::s3::{S3Config, S3Store, StaticCredentials};
        std::sync::Arc::new(
            S3Store::open_with(S3Config {
                bucket: self.bucket().to_string(),
                prefix: String::new(),
                endpoint: Some(self.endpoint()),
                region: Some(self.region().to_string()),
                credentials: Some(StaticCredentials {
                    access_key_id: self.access_key().to_string(),
                    secret_access_key: self.secret_key().to_string(),
                }),
                ca: None,
            })
            .await
            .unwrap_or_else(|e| panic!("open the Garage bucket: {e}")),
        )
    }
}

impl Deref for Garage {
    type Target = strait_devkit::Garage;

    fn deref(&self) -> &Self::Target {
        &self.server
    }
}

impl Drop for Garage {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.server.log_tail());
        }
    }
}
