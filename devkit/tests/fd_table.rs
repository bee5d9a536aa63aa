//! `spawn_tied_with` forks from a file table of its own: a child never gets a copy of a file
//! that another thread of this process holds, whether opened before or after the first
//! child was started. (A child that got copies of files on a strait mount would flush them
//! when it execs, and wait for the very daemon it is to become.)
//!
//! The files here are pipes made without close-on-exec, so that a copy that reached a child
//! would survive its `exec`: a pipe's reader sees the end of the pipe only once every copy
//! of its write end is closed.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::time::Duration;

use strait_devkit::process::{output_tied_with, spawn_tied_with};

/// A pipe whose ends are not closed on exec: (read end, write end).
fn inheritable_pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: fds has room for the two descriptors pipe writes
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
    // SAFETY: pipe returned two descriptors that nothing else owns
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// Whether the reader sees the end of the pipe within `within` (every write end closed).
fn ends_within(read: &OwnedFd, within: Duration) -> bool {
    let mut p = libc::pollfd {
        fd: read.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: p is one valid pollfd
    let n = unsafe { libc::poll(&mut p, 1, within.as_millis() as libc::c_int) };
    n == 1 && p.revents & libc::POLLHUP != 0
}

fn sleeper() -> std::process::Child {
    spawn_tied_with(|| {
        let mut cmd = Command::new("sleep");
        cmd.arg("60").stdin(Stdio::null());
        Ok(cmd)
    })
    .expect("start sleep")
}

/// One test: the thread that starts children must start within it, after the first pipe.
#[test]
fn a_child_gets_no_file_of_the_other_threads() {
    // a file opened before the first child (and the thread that starts children) exists
    let (early_r, early_w) = inheritable_pipe();
    let mut first = sleeper();
    // a file opened after it
    let (late_r, late_w) = inheritable_pipe();
    let mut second = sleeper();

    // once this thread closes the write ends, no copy of them is left anywhere
    drop(early_w);
    drop(late_w);
    let early_ended = ends_within(&early_r, Duration::from_secs(5));
    let late_ended = ends_within(&late_r, Duration::from_secs(5));
    for c in [&mut first, &mut second] {
        let _ = c.kill();
        let _ = c.wait();
    }
    assert!(
        early_ended,
        "a copy of a file opened before the first child outlived its closing"
    );
    assert!(
        late_ended,
        "a child holds a copy of a file another thread opened"
    );

    // output_tied_with: the child's output pipes are made and read where it is started
    let out = output_tied_with(|| {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo out; echo err >&2"]);
        Ok(cmd)
    })
    .expect("run sh");
    assert!(out.status.success());
    assert_eq!(out.stdout, b"out\n");
    assert_eq!(out.stderr, b"err\n");

    // spawn_tied_with: the parent end of a pipe would not exist in this thread's table
    let piped = spawn_tied_with(|| {
        let mut cmd = Command::new("true");
        cmd.stdout(Stdio::piped());
        Ok(cmd)
    });
    assert_eq!(
        piped.expect_err("a piped child").kind(),
        std::io::ErrorKind::InvalidInput
    );

    // a failure to build the command is returned as it is
    let failed = spawn_tied_with(|| Err(std::io::Error::other("no log")));
    assert_eq!(failed.expect_err("a failed build").to_string(), "no log");
}
