//! `spawn_tied` and `spawn_tied_with`: a child outlives the thread that started it, and ends
//! with its parent process, even when the parent is killed with SIGKILL.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ROLE: &str = "STRAIT_TIED_TEST_PARENT";

/// Whether `pid` is a live process (not gone, not a zombie waiting to be reaped).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
            .unwrap_or(false),
        Err(_) => false,
    }
}

#[test]
fn a_tied_child_ends_with_its_parent_process() {
    a_child_ends_with_its_parent("a_tied_child_ends_with_its_parent_process");
}

#[test]
fn a_child_tied_from_its_own_file_table_ends_with_its_parent_process() {
    a_child_ends_with_its_parent(
        "a_child_tied_from_its_own_file_table_ends_with_its_parent_process",
    );
}

/// Run test `name` again as a parent process that starts a child, SIGKILL that parent, and
/// wait for the child to end; `spawn_tied_with` when the name says "own_file_table".
fn a_child_ends_with_its_parent(name: &str) {
    let private = name.contains("own_file_table");
    if std::env::var_os(ROLE).is_some() {
        // the parent: start a child from a thread that ends at once, say its pid, then wait
        let mut child = std::thread::spawn(move || {
            let mut cmd = Command::new("sleep");
            cmd.arg("600");
            if private {
                strait_devkit::process::spawn_tied_with(|| Ok(cmd))
            } else {
                strait_devkit::spawn_tied(cmd)
            }
            .expect("start sleep")
        })
        .join()
        .expect("the starting thread");
        println!("child {}", child.id());
        // killed by the test before the child's 600 s are over
        let _ = child.wait();
        return;
    }
    let mut parent = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture"])
        .env(ROLE, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = BufReader::new(parent.stdout.take().unwrap());
    let mut pid = None;
    for line in out.lines() {
        let line = line.unwrap();
        if let Some(p) = line.strip_prefix("child ") {
            pid = Some(p.trim().parse::<u32>().unwrap());
            break;
        }
    }
    let pid = pid.expect("the parent said its child's pid");
    // the thread that started it has ended; the child has not
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        alive(pid),
        "the child ended with the thread that started it"
    );
    parent.kill().unwrap();
    parent.wait().unwrap();
    let start = Instant::now();
    while alive(pid) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the child {pid} outlived its killed parent by 10 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
