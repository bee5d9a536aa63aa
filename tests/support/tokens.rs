//! The tokens a test replicator cluster's nodes accept, one per role.

/// The token each role presents to a test cluster's nodes (every node accepts them all).
pub const PRIMARY_TOKEN: &str = "test-replicator-primary-token";
pub const MIRROR_TOKEN: &str = "test-replicator-mirror-token";
/// A second mirror's token (another region's credentials, for tests of what one mirror may
/// do to another's cursor).
pub const MIRROR_TOKEN_2: &str = "test-replicator-mirror-token-2";
pub const ADMIN_TOKEN: &str = "test-replicator-admin-token";
pub const PEER_TOKEN: &str = "test-replicator-peer-token";
/// What a test itself presents: it grants the roles primary, mirror and admin, for tests
/// that append, subscribe and administer by hand.
pub const HARNESS_TOKEN: &str = "test-replicator-harness-token";

/// The `--token ROLE=TOKEN` flags of a test node.
pub fn token_args() -> Vec<String> {
    let mut v = vec![];
    for (role, t) in [
        ("primary", PRIMARY_TOKEN),
        ("mirror", MIRROR_TOKEN),
        ("mirror", MIRROR_TOKEN_2),
        ("admin", ADMIN_TOKEN),
        ("peer", PEER_TOKEN),
        ("primary", HARNESS_TOKEN),
        ("mirror", HARNESS_TOKEN),
        ("admin", HARNESS_TOKEN),
    ] {
        v.push("--token".to_string());
        v.push(format!("{role}={t}"));
    }
    v
}
