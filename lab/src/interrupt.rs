//! Ctrl-C (SIGINT, SIGTERM, SIGHUP) during a run: the daemons end with the harness (they are
//! tied to it, `strait_devkit::spawn_tied`), but the file systems it mounted would not: the
//! loop-mounted disks of [`crate::disk`] and the FUSE mounts (whose processes live in sessions
//! of their own). [`install`] takes those signals, detaches every
//! mount point registered with [`detach_on_signal`] (`umount -l`), and exits.

use std::path::{Path, PathBuf};

use parking_lot::Mutex;

static POINTS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Detach `point` if the run is interrupted.
pub fn detach_on_signal(point: &Path) {
    let mut v = POINTS.lock();
    if !v.iter().any(|p| p == point) {
        v.push(point.to_path_buf());
    }
}

/// `point` was detached already.
pub fn forget(point: &Path) {
    POINTS.lock().retain(|p| p != point);
}

/// Take SIGINT, SIGTERM and SIGHUP with a task on `rt` that detaches the registered mount
/// points and exits (status 130). A handler, not a blocked signal waited for on a thread:
/// child processes inherit a blocked set (the daemons then ignored SIGTERM at the end of a
/// run), while handlers are reset to the default at exec.
pub fn install(rt: &tokio::runtime::Handle) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let _in = rt.enter();
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut hup = signal(SignalKind::hangup())?;
    rt.spawn(async move {
        let sig = tokio::select! {
            _ = int.recv() => "SIGINT",
            _ = term.recv() => "SIGTERM",
            _ = hup.recv() => "SIGHUP",
        };
        let points: Vec<PathBuf> = POINTS.lock().iter().rev().cloned().collect();
        eprintln!(
            "strait-lab chaos: {sig}: detaching {} mounts and stopping",
            points.len()
        );
        for p in points {
            if let Err(e) = strait_devkit::cluster::detach(&p) {
                eprintln!("strait-lab chaos: {e:#}");
            }
        }
        std::process::exit(130);
    });
    Ok(())
}
