//! The sync policy: which paths are copied eagerly, by the configured rules.

use strait_fs_core::kv::KvTxn;
use strait_fs_core::meta::{keys, Ino, ROOT_INO};

use super::keys::name_key;
use super::{corrupt, Blocks};
use crate::config::{MirrorConfig, SyncPolicy};

/// Deepest directory nesting walked to find a file's path.
const PATH_DEPTH_MAX: usize = 4096;

/// Which policy each path gets.
#[derive(Clone, Debug)]
pub struct Rules {
    default: SyncPolicy,
    /// (prefix, policy), longest prefix first.
    rules: Vec<(Vec<u8>, SyncPolicy)>,
}

impl Rules {
    pub fn new(cfg: &MirrorConfig) -> Self {
        let mut rules: Vec<(Vec<u8>, SyncPolicy)> = cfg
            .sync_rules
            .iter()
            .map(|r| (r.path().as_bytes().to_vec(), r.policy))
            .collect();
        rules.sort_by_key(|r| std::cmp::Reverse(r.0.len()));
        Rules {
            default: cfg.sync,
            rules,
        }
    }

    pub fn policy_of(&self, path: &[u8]) -> SyncPolicy {
        self.rules
            .iter()
            .find(|(p, _)| path.starts_with(p))
            .map(|r| r.1)
            .unwrap_or(self.default)
    }

    /// Whether every path gets the same policy (no path needs resolving).
    pub(super) fn uniform(&self) -> Option<SyncPolicy> {
        if self.rules.iter().all(|r| r.1 == self.default) {
            Some(self.default)
        } else {
            None
        }
    }

    pub fn describe(&self) -> String {
        let mut s = self.default.to_string();
        for (p, pol) in &self.rules {
            s.push_str(&format!(", {}*={pol}", String::from_utf8_lossy(p)));
        }
        s
    }
}

/// The path of `ino` as far as the name index knows it (None: not known, or too deep).
fn path_of(t: &mut dyn KvTxn, ino: Ino) -> strait_fs_core::Result<Option<Vec<u8>>> {
    let mut parts: Vec<Vec<u8>> = vec![];
    let mut cur = ino;
    for _ in 0..PATH_DEPTH_MAX {
        if cur == ROOT_INO {
            let mut p = vec![];
            for part in parts.iter().rev() {
                p.push(b'/');
                p.extend_from_slice(part);
            }
            if p.is_empty() {
                p.push(b'/');
            }
            return Ok(Some(p));
        }
        let Some(v) = t.get(&name_key(cur))? else {
            return Ok(None);
        };
        let parent = keys::u64_at(&v, 0).ok_or_else(|| corrupt("name index entry".into()))?;
        parts.push(v[8..].to_vec());
        cur = parent;
    }
    Ok(None)
}

impl Blocks {
    pub(super) fn eager(&self, t: &mut dyn KvTxn, ino: Ino) -> strait_fs_core::Result<bool> {
        if let Some(p) = self.rules.uniform() {
            return Ok(p == SyncPolicy::Eager);
        }
        Ok(match path_of(t, ino)? {
            Some(path) => self.rules.policy_of(&path) == SyncPolicy::Eager,
            None => self.rules.default == SyncPolicy::Eager,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SyncRule;

    #[test]
    fn the_longest_prefix_decides() {
        let cfg = MirrorConfig {
            sync: SyncPolicy::Lazy,
            sync_rules: vec![
                SyncRule {
                    prefix: "/datasets/*".into(),
                    policy: SyncPolicy::Eager,
                },
                SyncRule {
                    prefix: "/datasets/scratch/".into(),
                    policy: SyncPolicy::Lazy,
                },
            ],
            ..Default::default()
        };
        let r = Rules::new(&cfg);
        assert_eq!(r.policy_of(b"/datasets/a/b"), SyncPolicy::Eager);
        assert_eq!(r.policy_of(b"/datasets/scratch/x"), SyncPolicy::Lazy);
        assert_eq!(r.policy_of(b"/home/x"), SyncPolicy::Lazy);
        assert!(r.uniform().is_none());
    }
}
