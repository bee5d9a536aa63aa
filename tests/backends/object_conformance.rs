//! Every object store backend passes the one conformance suite: the local directory here,
//! and S3 on a real Garage server. Plus the failures users meet first with S3: a wrong
//! secret, a key without permission, and credentials taken from the AWS environment.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::garage::Garage;
use strait_fs_core::object::local::LocalStore;
use strait_fs_core::object::s3::{S3Config, S3Store, StaticCredentials};
use strait_fs_core::object::{conformance, ObjectError, ObjectStore};
use strait_fs_core::Error;

/// A bad credential must fail fast: no retry loop, no hang.
const AUTH_FAILURE_MAX_MS: u64 = 10_000;

fn s3_config(garage: &Garage, prefix: &str, secret_key: &str) -> S3Config {
    S3Config {
        bucket: garage.bucket().to_string(),
        prefix: prefix.to_string(),
        endpoint: Some(garage.endpoint()),
        region: Some(garage.region().to_string()),
        credentials: Some(StaticCredentials {
            access_key_id: garage.access_key().to_string(),
            secret_access_key: secret_key.to_string(),
        }),
        ca: None,
    }
}

#[tokio::test]
async fn local_store_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalStore::open(&dir.path().join("data")).unwrap();
    conformance::run_all(&store).await;
}

#[tokio::test]
async fn s3_store_on_garage_conforms() {
    let Some(garage) = Garage::start() else {
        return;
    };

    // At the root of the bucket.
    let root = S3Store::open_with(s3_config(&garage, "", garage.secret_key()))
        .await
        .expect("open S3 store");
    conformance::run_all(&root).await;

    // Under a key prefix: the same behaviour, and objects really live under the prefix.
    let prefixed = S3Store::open_with(s3_config(&garage, "tenant/a", garage.secret_key()))
        .await
        .expect("open S3 store with prefix");
    assert_eq!(
        prefixed.describe(),
        format!("s3://{}/tenant/a", garage.bucket())
    );
    conformance::run_all(&prefixed).await;
    prefixed
        .put("chunks/0/0/1_0_3", b"abc".to_vec().into())
        .await
        .unwrap();
    assert_eq!(
        root.get("tenant/a/chunks/0/0/1_0_3").await.unwrap(),
        &b"abc"[..]
    );
    let listed: Vec<String> = prefixed
        .list("", None, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    assert_eq!(listed, ["chunks/0/0/1_0_3"]);
    prefixed.delete("chunks/0/0/1_0_3").await.unwrap();
}

#[tokio::test]
async fn a_wrong_secret_key_is_a_clear_fatal_error() {
    let Some(garage) = Garage::start() else {
        return;
    };

    // open checks the bucket, so a wrong secret fails there, permanently and quickly.
    let wrong = "0".repeat(64);
    let started = Instant::now();
    let err = S3Store::open_with(s3_config(&garage, "", &wrong))
        .await
        .err()
        .expect("open with a wrong secret key must fail");
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_millis(AUTH_FAILURE_MAX_MS),
        "took {elapsed:?}"
    );
    let msg = err.to_string();
    eprintln!("open with a wrong secret key: {msg}");
    match &err {
        Error::Object(e @ ObjectError::Fatal(_)) => assert!(e.is_permanent()),
        other => panic!("want a Fatal object error, got {other:?}"),
    }
    assert!(
        msg.starts_with("reach bucket strait-test at http://127.0.0.1:"),
        "{msg}"
    );
    assert!(
        msg.contains("HTTP 403") && msg.contains("access denied"),
        "{msg}"
    );
}

#[tokio::test]
async fn an_operation_the_key_may_not_do_is_fatal() {
    let Some(garage) = Garage::start() else {
        return;
    };
    let store = S3Store::open_with(s3_config(&garage, "", garage.secret_key()))
        .await
        .expect("open S3 store");
    store
        .put("chunks/0/0/1_0_1", b"x".to_vec().into())
        .await
        .unwrap();

    // Take write permission away: a put is refused, with the reason, and not retried.
    garage
        .cli(&[
            "bucket",
            "deny",
            "--write",
            garage.bucket(),
            "--key",
            garage.access_key(),
        ])
        .unwrap();
    let started = Instant::now();
    let err = store
        .put("chunks/0/0/2_0_1", b"y".to_vec().into())
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_millis(AUTH_FAILURE_MAX_MS));
    eprintln!("put without write permission: {err}");
    let ObjectError::Fatal(msg) = &err else {
        panic!("want Fatal, got {err:?}")
    };
    assert!(
        msg.starts_with("put object chunks/0/0/2_0_1 to s3://strait-test: HTTP 403"),
        "{msg}"
    );
    // Reads are still allowed.
    assert_eq!(store.get("chunks/0/0/1_0_1").await.unwrap(), &b"x"[..]);
}

/// Users give credentials as AWS_* variables. Setting them in this process would race with
/// the other tests, so a child process (this test binary, one ignored test) gets them.
#[test]
fn s3_credentials_come_from_the_aws_environment() {
    let Some(garage) = Garage::start() else {
        return;
    };
    let isolated = tempfile::tempdir().unwrap();
    // the test's name as the harness knows it: its module path within the test binary
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    let child = format!("{module}::child_opens_the_data_url_with_aws_env");
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &child, "--ignored", "--nocapture"])
        .envs(garage.env())
        .env("STRAIT_TEST_DATA_URL", garage.data_url())
        // Nothing but the variables above may provide credentials.
        .env("AWS_CONFIG_FILE", isolated.path().join("config"))
        .env(
            "AWS_SHARED_CREDENTIALS_FILE",
            isolated.path().join("credentials"),
        )
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_SESSION_TOKEN")
        .env_remove("AWS_ENDPOINT_URL")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("1 passed"),
        "child did not run the test:\n{stdout}\n{stderr}"
    );
}

#[tokio::test]
#[ignore = "run in a child process by s3_credentials_come_from_the_aws_environment"]
async fn child_opens_the_data_url_with_aws_env() {
    let url = std::env::var("STRAIT_TEST_DATA_URL")
        .expect("STRAIT_TEST_DATA_URL is set by the parent test");
    let store = strait_fs_core::object::open(&url)
        .await
        .expect("open the data URL with AWS_* credentials");
    store
        .put("env/check", b"env".to_vec().into())
        .await
        .unwrap();
    assert_eq!(store.get("env/check").await.unwrap(), &b"env"[..]);
    store.delete("env/check").await.unwrap();
}
