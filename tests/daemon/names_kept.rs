//! A mount of a site daemon keeps the names and attributes it has seen, coherent through the
//! daemon's change stream (`MetaService.Watch`, site-client's `meta_cache.rs`): lookups and
//! stats it can answer never reach the daemon, and every change made elsewhere reaches it.
//! Two clients of one `strait primary`, as two mounts would use it (no FUSE needed).

use std::time::Duration;

use strait_fs_core::error::Error;
use strait_fs_core::meta::{Ctx, LockType, MetaClient, SetAttr, ROOT_INO};
use strait_site_client::RemoteMeta;

use crate::support::daemon::Primary;
use crate::support::mount::TestFs;
use crate::support::names::{self, calls, chmod};
use crate::support::wait_until;

const PATIENCE: Duration = Duration::from_secs(10);

fn client(d: &Primary, keep_names: bool) -> std::sync::Arc<strait_site_client::RemoteMeta> {
    names::client(&d.url(), &d.token, keep_names)
}

#[test]
fn a_mount_answers_what_it_has_seen_and_hears_every_change_made_elsewhere() {
    let fs = TestFs::rocks_local(&[]);
    let mut daemon = Primary::start(&fs.meta_url, &[], &[]);
    let root = Ctx::root();
    let a = client(&daemon, true);
    let b = client(&daemon, true);
    wait_until("a's change stream is heard", PATIENCE, || a.keeps_names());

    // a name a looked up once is answered by a from then on
    let (f, _) = b.create(&root, ROOT_INO, b"f", 0o644, 0).unwrap();
    assert_eq!(a.lookup(&root, ROOT_INO, b"f").unwrap().0, f);
    let (lookups, getattrs) = (calls(&daemon, "lookup"), calls(&daemon, "getattr"));
    for _ in 0..20 {
        assert_eq!(a.lookup(&root, ROOT_INO, b"f").unwrap().0, f);
        assert_eq!(a.getattr(f).unwrap().perm, 0o644);
    }
    assert_eq!(
        calls(&daemon, "lookup"),
        lookups,
        "a asked the daemon again"
    );
    assert_eq!(
        calls(&daemon, "getattr"),
        getattrs,
        "a asked the daemon again"
    );

    // a change made by b reaches a
    chmod(&b, f, 0o600);
    wait_until("a sees b's chmod", PATIENCE, || {
        a.getattr(f).unwrap().perm == 0o600
    });
    // a's own change is seen by a at once (the call returns once a's stream has it)
    chmod(&a, f, 0o640);
    assert_eq!(a.getattr(f).unwrap().perm, 0o640);

    // close-to-open: once a's open returns, what a keeps is at least what the open saw (b's
    // truncate, committed before it), whatever a's stream has told it by then
    let truncate = |c: &RemoteMeta, size: u64| {
        c.setattr(
            &root,
            f,
            &SetAttr {
                size: Some(size),
                ..Default::default()
            },
        )
        .unwrap()
    };
    for size in [100, 7, 4096] {
        truncate(&b, size);
        a.open_inode(&root, f, libc::O_RDONLY).unwrap();
        assert_eq!(
            a.getattr(f).unwrap().length,
            size,
            "a's getattr after its open"
        );
        a.release(f).unwrap();
    }
    // a lock taken: every change made before it is seen
    truncate(&b, 300);
    a.setlk(f, 1, 1, LockType::Write, 0, u64::MAX).unwrap();
    assert_eq!(
        a.getattr(f).unwrap().length,
        300,
        "a's getattr under its lock"
    );
    a.setlk(f, 1, 1, LockType::Unlock, 0, u64::MAX).unwrap();

    // a directory a made: a name not in it is absent without asking the daemon
    let (d, _) = a.mkdir(&root, ROOT_INO, b"d", 0o755, 0).unwrap();
    let lookups = calls(&daemon, "lookup");
    for name in [&b"x"[..], b"y", b"z"] {
        assert!(matches!(
            a.lookup(&root, d, name),
            Err(Error::Sys(libc::ENOENT))
        ));
    }
    assert_eq!(calls(&daemon, "lookup"), lookups, "a asked the daemon");
    // b makes d/x, renames it, removes it: a follows each step
    let (x, _) = b.create(&root, d, b"x", 0o644, 0).unwrap();
    wait_until("a finds b's d/x", PATIENCE, || {
        a.lookup(&root, d, b"x").ok().map(|(i, _)| i) == Some(x)
    });
    b.rename(&root, d, b"x", d, b"y", 0).unwrap();
    wait_until("a sees d/x renamed to d/y", PATIENCE, || {
        matches!(a.lookup(&root, d, b"x"), Err(Error::Sys(libc::ENOENT)))
            && a.lookup(&root, d, b"y").ok().map(|(i, _)| i) == Some(x)
    });
    b.unlink(&root, d, b"y").unwrap();
    wait_until("a sees d/y removed", PATIENCE, || {
        matches!(a.lookup(&root, d, b"y"), Err(Error::Sys(libc::ENOENT)))
    });
    // a's own unlink: the name is gone for a at once
    a.create(&root, d, b"w", 0o644, 0).unwrap();
    a.unlink(&root, d, b"w").unwrap();
    assert!(matches!(
        a.lookup(&root, d, b"w"),
        Err(Error::Sys(libc::ENOENT))
    ));

    // the search permission is checked as the daemon checks it, from what is kept
    chmod(&a, d, 0o700);
    let other = Ctx::new(1000, 1000);
    let lookups = calls(&daemon, "lookup");
    assert!(matches!(
        a.lookup(&other, d, b"x"),
        Err(Error::Sys(libc::EACCES))
    ));
    assert_eq!(calls(&daemon, "lookup"), lookups, "a asked the daemon");

    // the daemon restarts: nothing kept is used until a's stream is back, and changes
    // made after it are heard
    daemon.restart();
    assert_eq!(a.getattr(f).unwrap().perm, 0o640);
    chmod(&b, f, 0o604);
    wait_until("a sees b's chmod after the restart", PATIENCE, || {
        a.getattr(f).unwrap().perm == 0o604
    });
    wait_until("a's change stream is heard again", PATIENCE, || {
        a.keeps_names()
    });
    chmod(&b, f, 0o606);
    wait_until("a sees b's next chmod", PATIENCE, || {
        a.getattr(f).unwrap().perm == 0o606
    });

    // a client told to keep nothing asks the daemon every time
    let c = client(&daemon, false);
    assert!(!c.keeps_names());
    let getattrs = calls(&daemon, "getattr");
    for _ in 0..3 {
        c.getattr(f).unwrap();
    }
    assert_eq!(calls(&daemon, "getattr"), getattrs + 3);
    for m in [a, b, c] {
        m.close_session().unwrap();
    }
}
