//! A mount of a mirror keeps the names and attributes it has seen, coherent through the
//! mirror's change stream (each batch of records it applies): lookups and stats it can
//! answer never reach the mirror, a change made at the primary reaches it once the mirror
//! applies it, and a change it forwards is seen by it at once. (Outside the window: the
//! partition test.)

use std::time::Duration;

use strait_fs_core::meta::{Ctx, MetaClient, ROOT_INO};

use crate::support::daemon::Primary;
use crate::support::names::{absent, calls, chmod};
use crate::support::replicator::RegionA;
use crate::support::wait_until;

fn client(url: &str, token: &str) -> std::sync::Arc<strait_site_client::RemoteMeta> {
    crate::support::names::client(url, token, true)
}

const PATIENCE: Duration = Duration::from_secs(20);

#[test]
fn a_mount_of_a_mirror_answers_what_it_has_seen_and_hears_what_the_mirror_applies() {
    let rt = crate::support::runtime();
    let region = RegionA::start(&rt);
    let primary = region.primary(&[]);
    let mirror = Primary::mirror(
        &primary,
        "region-b",
        &region.addrs,
        &["--window-ms", "60000"],
    );
    let root = Ctx::root();
    let at_a = client(&primary.url(), &primary.token);
    let at_b = client(&mirror.url(), &primary.token);
    wait_until("the mirror's mount hears its stream", PATIENCE, || {
        at_b.keeps_names()
    });

    // made at the primary, found at the mirror once applied; then answered by the mount
    let (f, _) = at_a.create(&root, ROOT_INO, b"f", 0o644, 0).unwrap();
    wait_until("f reaches the mirror", PATIENCE, || {
        at_b.lookup(&root, ROOT_INO, b"f").ok().map(|(i, _)| i) == Some(f)
    });
    let (lookups, getattrs) = (calls(&mirror, "lookup"), calls(&mirror, "getattr"));
    for _ in 0..20 {
        assert_eq!(at_b.lookup(&root, ROOT_INO, b"f").unwrap().0, f);
        assert_eq!(at_b.getattr(f).unwrap().perm, 0o644);
    }
    assert_eq!(
        calls(&mirror, "lookup"),
        lookups,
        "the mount asked the mirror again"
    );
    assert_eq!(
        calls(&mirror, "getattr"),
        getattrs,
        "the mount asked the mirror again"
    );

    // a change at the primary reaches the mirror's mount as the mirror applies it
    chmod(&at_a, f, 0o600);
    wait_until("the mirror's mount sees the chmod", PATIENCE, || {
        at_b.getattr(f).unwrap().perm == 0o600
    });
    // a change the mirror's mount makes (forwarded to the primary) is seen by it at once,
    // with its effects: a directory it made is empty, a name it removed is gone
    chmod(&at_b, f, 0o640);
    assert_eq!(at_b.getattr(f).unwrap().perm, 0o640);
    let (d, _) = at_b.mkdir(&root, ROOT_INO, b"d", 0o755, 0).unwrap();
    assert!(absent(&at_b, d, b"x"));
    at_b.create(&root, d, b"y", 0o644, 0).unwrap();
    assert_eq!(at_b.lookup(&root, d, b"y").unwrap().1.perm, 0o644);
    at_b.unlink(&root, d, b"y").unwrap();
    assert!(absent(&at_b, d, b"y"));
    // and the primary's mount hears the mirror's mount's changes
    at_b.create(&root, d, b"x", 0o644, 0).unwrap();
    assert!(!absent(&at_b, d, b"x"));
    wait_until("the primary's mount sees d/x", PATIENCE, || {
        !absent(&at_a, d, b"x")
    });
    for c in [at_a, at_b] {
        c.close_session().unwrap();
    }
}
