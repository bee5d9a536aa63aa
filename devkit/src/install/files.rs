//! The files of `deploy/` that an installation uses: the units and each region's example
//! configuration. `strait-lab netns` reads them from a `deploy/` directory (the guide's own,
//! as an operator copies it); `strait dev up` uses the copies built into the program, so that
//! an installed `strait` needs no source tree.

use std::path::PathBuf;

use anyhow::{Context, Result};

/// Where the files come from.
#[derive(Debug, Clone)]
pub enum DeployFiles {
    /// A `deploy/` directory.
    Dir(PathBuf),
    /// The copies built into this program (the repository's `deploy/` when it was built).
    BuiltIn,
}

/// deploy/'s files that an installation reads, by their path under `deploy/`.
const BUILT_IN: [(&str, &str); 12] = [
    (
        "systemd/strait-replicator.service",
        include_str!("../../../deploy/systemd/strait-replicator.service"),
    ),
    (
        "systemd/strait-primary.service",
        include_str!("../../../deploy/systemd/strait-primary.service"),
    ),
    (
        "systemd/strait-mirror.service",
        include_str!("../../../deploy/systemd/strait-mirror.service"),
    ),
    (
        "systemd/strait-mount@.service",
        include_str!("../../../deploy/systemd/strait-mount@.service"),
    ),
    (
        "config/region-a/primary.toml",
        include_str!("../../../deploy/config/region-a/primary.toml"),
    ),
    (
        "config/region-a/replicator.toml",
        include_str!("../../../deploy/config/region-a/replicator.toml"),
    ),
    (
        "config/region-a/mount-data.env",
        include_str!("../../../deploy/config/region-a/mount-data.env"),
    ),
    (
        "config/region-b/mirror.toml",
        include_str!("../../../deploy/config/region-b/mirror.toml"),
    ),
    (
        "config/region-b/replicator.toml",
        include_str!("../../../deploy/config/region-b/replicator.toml"),
    ),
    (
        "config/region-b/mount-data.env",
        include_str!("../../../deploy/config/region-b/mount-data.env"),
    ),
    (
        "config/region-c/replicator.toml",
        include_str!("../../../deploy/config/region-c/replicator.toml"),
    ),
    ("README.md", include_str!("../../../deploy/README.md")),
];

impl DeployFiles {
    /// The text of `deploy/PATH`.
    pub fn read(&self, path: &str) -> Result<String> {
        match self {
            DeployFiles::Dir(d) => {
                let p = d.join(path);
                std::fs::read_to_string(&p).with_context(|| format!("read {}", p.display()))
            }
            DeployFiles::BuiltIn => BUILT_IN
                .iter()
                .find(|(p, _)| *p == path)
                .map(|(_, t)| t.to_string())
                .with_context(|| format!("deploy/{path} is not built into this program")),
        }
    }

    /// The names of the files in `deploy/config/region-REGION/`, sorted.
    pub fn config_files(&self, region: &str) -> Result<Vec<String>> {
        let dir = format!("config/region-{region}/");
        let mut names: Vec<String> = match self {
            DeployFiles::Dir(d) => {
                let from = d.join(&dir);
                std::fs::read_dir(&from)
                    .with_context(|| format!("read {}", from.display()))?
                    .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                    .collect::<std::io::Result<_>>()
                    .with_context(|| format!("read {}", from.display()))?
            }
            DeployFiles::BuiltIn => BUILT_IN
                .iter()
                .filter_map(|(p, _)| p.strip_prefix(dir.as_str()))
                .map(str::to_string)
                .collect(),
        };
        names.sort();
        Ok(names)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_files_are_the_repositorys() {
        let dir = DeployFiles::Dir(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy"));
        for region in ["a", "b", "c"] {
            let names = dir.config_files(region).unwrap();
            assert_eq!(names, DeployFiles::BuiltIn.config_files(region).unwrap());
            for n in names {
                let p = format!("config/region-{region}/{n}");
                assert_eq!(
                    dir.read(&p).unwrap(),
                    DeployFiles::BuiltIn.read(&p).unwrap()
                );
            }
        }
    }
}
