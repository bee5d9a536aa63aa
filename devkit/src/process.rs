//! Child processes that end with this one.
//!
//! # Why children are started from a private file table
//!
//! `fork` copies the whole file table of the process into the child, and `exec` then closes
//! the copies (they are all close-on-exec). Closing a file of a FUSE mount sends FLUSH to the
//! mount, and a strait mount's flush waits until the file's buffered writes are committed,
//! through the daemons. A process that holds files open on a strait mount (the chaos
//! harness's clients) and starts one of those very daemons would wait on itself: the child
//! stays stuck in `exec` until the mount gives up on the daemon (60 s). So
//! [`spawn_tied_with`] and [`output_tied_with`] fork from a thread with a file table of its
//! own, which holds no file but standard input, output and error: every file the child
//! needs (its log, `/dev/null`, pipes) is opened in that thread, by the closure that builds
//! the [`Command`].

use std::fs::File;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::process::{Child, Command, Output};
use std::sync::{mpsc, Mutex, OnceLock};

type Job = Box<dyn FnOnce() + Send>;

/// A thread that lives as long as the process and runs the jobs sent to it, in order.
struct Spawner {
    jobs: Mutex<mpsc::Sender<Job>>,
}

impl Spawner {
    /// Start the thread; `private`: give it a file table of its own first. `None` when no
    /// thread can be started.
    fn start(name: &str, private: bool) -> Option<Spawner> {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                if private {
                    own_file_table();
                }
                for job in rx {
                    job();
                }
            })
            .ok()?;
        Some(Spawner {
            jobs: Mutex::new(tx),
        })
    }

    /// Run `f` on the thread and return its result. A panic in `f` is resumed here: it must
    /// not end the thread, whose children would get SIGTERM.
    fn run<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> std::io::Result<R> {
        let (reply_tx, reply_rx) = mpsc::channel();
        let gone = || std::io::Error::other("the thread that starts child processes is gone");
        self.jobs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .send(Box::new(move || {
                let _ = reply_tx.send(std::panic::catch_unwind(AssertUnwindSafe(f)));
            }))
            .map_err(|_| gone())?;
        match reply_rx.recv().map_err(|_| gone())? {
            Ok(r) => Ok(r),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

/// Give the calling thread a file table of its own, holding standard input, output and error
/// alone. On failure the thread goes on with the process's table (children then close copies
/// of every file of the process on `exec`, as any child of a `fork` does).
fn own_file_table() {
    // SAFETY: unshare only detaches this thread's file table from the process's one
    if unsafe { libc::unshare(libc::CLONE_FILES) } != 0 {
        tracing::warn!(
            "start child processes from a file table of their own: unshare: {}; children \
             start from the process's file table",
            std::io::Error::last_os_error()
        );
        return;
    }
    // The table is a copy of the process's at this moment: close the copies (they would
    // keep other threads' files, sockets and FUSE connections open, and flush mount files
    // when closed later). Nothing in this thread owns them.
    // SAFETY: close_range closes descriptors of this thread's private table only
    if unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) } == 0 {
        return;
    }
    let fds: Vec<i32> = std::fs::read_dir("/proc/thread-self/fd")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    for fd in fds.into_iter().filter(|&fd| fd > 2) {
        // SAFETY: as above; the descriptor of the directory listing is closed already, so
        // this closes at most an EBADF
        unsafe { libc::close(fd) };
    }
}

/// Make `cmd`'s process get SIGTERM when the thread that forks it ends (which, for the
/// spawner threads, is when this process ends).
fn tie(cmd: &mut Command) {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: prctl, getppid and _exit are async-signal-safe, and the closure touches no
    // memory of this process but a copied pid
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(cmd, move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // this process ended between the fork and the prctl: no signal will come
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

/// The thread that forks from a file table of its own ([`spawn_tied_with`]).
fn private_spawner() -> Option<&'static Spawner> {
    static SPAWNER: OnceLock<Option<Spawner>> = OnceLock::new();
    SPAWNER
        .get_or_init(|| Spawner::start("strait-spawner", true))
        .as_ref()
}

/// Start the [`Command`] that `build` makes, so that the process gets SIGTERM when this
/// process ends, however it ends (a test binary killed at a timeout, a benchmark stopped
/// halfway): the servers, daemons and mounts that tests, benchmarks and `dev up` start never
/// outlive them. The process's stdio must be null, inherited, or files that `build` opens.
///
/// Linux sends this "parent death" signal when the *thread* that started the child ends, so
/// every child is started by one thread that lives as long as the process. That thread has a
/// file table of its own (see the [module docs](self)), so `build` runs there: a file opened
/// in any other thread does not exist in it, and piped stdio (whose parent ends would be
/// there too) is refused. Should that thread be impossible to start, `build` runs here and
/// the child is started untied.
pub fn spawn_tied_with(
    build: impl FnOnce() -> std::io::Result<Command> + Send + 'static,
) -> std::io::Result<Child> {
    let start = move || {
        let mut cmd = build()?;
        tie(&mut cmd);
        let mut child = cmd.spawn()?;
        let piped = [
            child.stdin.take().is_some(),
            child.stdout.take().is_some(),
            child.stderr.take().is_some(),
        ];
        if piped.contains(&true) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "spawn_tied_with cannot pipe a child's stdio: use output_tied_with, or files",
            ));
        }
        Ok(child)
    };
    match private_spawner() {
        Some(spawner) => spawner.run(start)?,
        None => start(),
    }
}

/// Run the [`Command`] that `build` makes to its end and collect its output (as
/// [`Command::output`]), forked from a file table that holds no file of this process, as
/// [`spawn_tied_with`]; the process gets SIGTERM should this process end first. Other
/// children can be started meanwhile.
pub fn output_tied_with(
    build: impl FnOnce() -> std::io::Result<Command> + Send + 'static,
) -> std::io::Result<Output> {
    let run = move || {
        let mut cmd = build()?;
        tie(&mut cmd);
        cmd.output()
    };
    let Some(spawner) = private_spawner() else {
        return run();
    };
    // a thread started from the spawner shares its file table; it lives until the child
    // ends, so the child stays tied, and the spawner is not held up meanwhile
    let (tx, rx) = mpsc::channel();
    spawner.run(move || {
        std::thread::Builder::new()
            .name("strait-spawner-run".into())
            .spawn(move || {
                let _ = tx.send(run());
            })
            .map(|_| ())
    })??;
    rx.recv()
        .map_err(|_| std::io::Error::other("the thread that ran a child process is gone"))?
}

/// Start `cmd` tied to this process, as [`spawn_tied_with`], but forked from a thread that
/// shares this process's file table: `cmd` may hold files opened anywhere and piped stdio.
/// The child closes a copy of every file of this process on `exec`, which, for a file on a
/// strait mount, waits until its buffered writes are committed: never start this way a
/// daemon that such writes could be waiting for.
pub fn spawn_tied(mut cmd: Command) -> std::io::Result<Child> {
    static SPAWNER: OnceLock<Option<Spawner>> = OnceLock::new();
    tie(&mut cmd);
    match SPAWNER
        .get_or_init(|| Spawner::start("strait-spawner-shared", false))
        .as_ref()
    {
        Some(spawner) => spawner.run(move || cmd.spawn())?,
        None => cmd.spawn(),
    }
}

/// Open `path` as a child's log, truncated, or appended to when `append`: two handles, for
/// its standard output and error. Call it in the closure given to [`spawn_tied_with`].
pub fn open_log(path: &Path, append: bool) -> std::io::Result<(File, File)> {
    let with_path = |e: std::io::Error| {
        std::io::Error::new(e.kind(), format!("open log {}: {e}", path.display()))
    };
    let f = File::options()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(path)
        .map_err(with_path)?;
    let g = f.try_clone().map_err(with_path)?;
    Ok((f, g))
}
