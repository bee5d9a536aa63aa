//! A mount whose site daemon restarted (and so forgot the slice ids it had handed out) writes
//! a slice it had not committed yet again under a new id, and nothing it wrote is lost
//! (docs/consistency.md, "Slice ids belong to the session that took them").
//!
//! In a file of its own: the file below is held open without O_CLOEXEC across the daemon's
//! restart, and a test running beside it in the same process would hand it to every process
//! it starts.

use crate::support::daemon::Primary;
use crate::support::mount::TestFs;

/// A new file opened for writing without O_CLOEXEC.
fn open_inheritable(p: &std::path::Path) -> std::fs::File {
    use std::os::fd::FromRawFd;
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
            0o644,
        )
    };
    assert!(
        fd >= 0,
        "open {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
    unsafe { std::fs::File::from_raw_fd(fd) }
}

#[test]
fn a_mount_writes_its_slice_again_under_a_new_id_after_its_daemon_restarted() {
    if !crate::support::require_fuse() {
        return;
    }
    let fs = TestFs::rocks_local(&[]);
    let mut primary = Primary::start(&fs.meta_url, &fs.env, &["--gc-interval-s", "0"]);
    let m = primary.mount(&[]);
    // a block and a half written, the full block uploaded before the restart. The file is
    // opened without O_CLOEXEC: every close of a descriptor sends the mount a flush, and the
    // restart below spawns a process, whose exec would close an O_CLOEXEC copy (committing
    // the slice while the daemon is down); the new daemon inherits the copy instead
    let data = crate::support::random_bytes(7, (6 << 20) + 333);
    let mut f = open_inheritable(&m.path("f"));
    std::io::Write::write_all(&mut f, &data).unwrap();
    // the restarted daemon knows no range: the commit at close is refused once, and the
    // mount writes the slice again under an id from a new range
    primary.restart();
    drop(f);
    assert!(std::fs::read(m.path("f")).unwrap() == data);
    let log = m.log_text();
    assert!(
        log.contains("again under a new slice id"),
        "the mount did not write the slice again:\n{log}"
    );
    // and from a fresh mount, past every cache (a second restart lets go of the copy the
    // first one inherited)
    primary.restart();
    m.unmount();
    let m = primary.mount(&[]);
    assert!(std::fs::read(m.path("f")).unwrap() == data);
}
