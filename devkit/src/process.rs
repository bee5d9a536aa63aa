//! Child processes that end with this one.

use std::process::{Child, Command};
use std::sync::{mpsc, Mutex, OnceLock};

type SpawnJob = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Start `cmd` so that the process gets SIGTERM when this process ends, however it ends (a
/// test binary killed at a timeout, a benchmark stopped halfway): the servers, daemons and
/// mounts that tests, benchmarks and `dev up` start never outlive them.
///
/// Linux sends this "parent death" signal when the *thread* that started the child ends, so
/// every child is started by one thread that lives as long as the process. Should that
/// thread be impossible to start, children are started untied.
pub fn spawn_tied(mut cmd: Command) -> std::io::Result<Child> {
    static SPAWNER: OnceLock<Option<Mutex<mpsc::Sender<SpawnJob>>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnJob>();
        std::thread::Builder::new()
            .name("strait-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .ok()
            .map(|_| Mutex::new(tx))
    });
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: prctl, getppid and _exit are async-signal-safe, and the closure touches no
    // memory of this process but a copied pid
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
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
    let Some(spawner) = spawner else {
        return cmd.spawn();
    };
    let (reply_tx, reply_rx) = mpsc::channel();
    let gone = || std::io::Error::other("the thread that starts child processes is gone");
    spawner
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .send((cmd, reply_tx))
        .map_err(|_| gone())?;
    reply_rx.recv().map_err(|_| gone())?
}
