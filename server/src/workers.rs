//! A daemon's background work, with a shape: every long-running loop (the mirror's copier,
//! its follower, the sessions' expiry, the primary's GC, ...) is a named worker in one
//! registry, [`Workers`], as Garage runs its background tasks through its `BackgroundRunner`.
//!
//! The registry gives each worker:
//! - a **state** that `/health` and `strait mirror status` list ([`Workers::statuses`]):
//!   `running`, `retrying` (it failed and waits its backoff), `stopped` (it returned once its
//!   cancellation token was cancelled), `done` (a retrying worker's run succeeded, a
//!   one-shot worker's job is done),
//!   `exited` (a loop returned while its token was not: it gave up, logged as an error) or
//!   `panicked`;
//! - **backoff on error** for work that can fail as a whole ([`Workers::spawn_retrying`]):
//!   run again after 1 s, doubling up to a minute, until it succeeds or is cancelled; the
//!   error count and the last error are kept;
//! - a **cancellation token**, given by the caller: the worker's state says whether it stopped
//!   because it was asked to;
//! - **shutdown within a deadline** ([`Workers::shutdown`]): wait for every worker to end,
//!   and name those that did not;
//! - **metrics**: `strait_worker_running{worker}` (1 while running or retrying) and
//!   `strait_worker_errors_total{worker}` (failed runs and panics).
//!
//! Loops that handle their own errors (most of them: a failed pass is logged and tried again
//! at the next tick) are spawned with [`Workers::spawn`]; the registry then only sees them end.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};
use tokio_util::sync::CancellationToken;

/// The first pause after a failed run of a retrying worker.
pub const BACKOFF_MIN: Duration = Duration::from_secs(1);
/// The longest pause after failed runs.
pub const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// The longest error message a worker's status keeps.
const ERROR_LEN_MAX: usize = 300;

/// What a worker is doing (see the module's docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Running,
    Retrying,
    Stopped,
    Done,
    Exited,
    Panicked,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Retrying => "retrying",
            State::Stopped => "stopped",
            State::Done => "done",
            State::Exited => "exited",
            State::Panicked => "panicked",
        }
    }

    /// Whether the worker has ended.
    pub fn ended(self) -> bool {
        matches!(
            self,
            State::Stopped | State::Done | State::Exited | State::Panicked
        )
    }
}

/// One worker's status, as listed.
#[derive(Clone, Debug)]
pub struct Status {
    pub name: String,
    pub state: State,
    /// Since when the worker is in its state.
    pub since: Instant,
    /// Failed runs (and panics) since the start.
    pub errors: u64,
    /// The last failure, cut to a few hundred characters (empty when none).
    pub last_error: String,
}

struct Entry {
    status: Mutex<Status>,
}

struct Inner {
    list: Mutex<Vec<Arc<Entry>>>,
    /// The first and the longest pause after failed runs.
    backoff: (Duration, Duration),
    ended: tokio::sync::Notify,
    running: IntGaugeVec,
    errors: IntCounterVec,
}

/// The registry of a daemon's workers (cheap to clone).
#[derive(Clone)]
pub struct Workers {
    inner: Arc<Inner>,
}

impl Workers {
    /// A registry whose metrics are registered in `registry`.
    pub fn new(registry: &Registry) -> Self {
        let running = IntGaugeVec::new(
            Opts::new(
                "strait_worker_running",
                "1 while a background worker runs (or waits to run again after an error)",
            ),
            &["worker"],
        )
        .expect("valid metric");
        let errors = IntCounterVec::new(
            Opts::new(
                "strait_worker_errors_total",
                "Failed runs and panics of a background worker",
            ),
            &["worker"],
        )
        .expect("valid metric");
        // a second registry of one process (tests) has its own families
        let _ = registry.register(Box::new(running.clone()));
        let _ = registry.register(Box::new(errors.clone()));
        Workers {
            inner: Arc::new(Inner {
                list: Mutex::new(vec![]),
                backoff: (BACKOFF_MIN, BACKOFF_MAX),
                ended: tokio::sync::Notify::new(),
                running,
                errors,
            }),
        }
    }

    fn entry(&self, name: &str) -> Arc<Entry> {
        let e = Arc::new(Entry {
            status: Mutex::new(Status {
                name: name.to_string(),
                state: State::Running,
                since: Instant::now(),
                errors: 0,
                last_error: String::new(),
            }),
        });
        self.inner.list.lock().push(e.clone());
        self.inner.running.with_label_values(&[name]).set(1);
        e
    }

    fn set(&self, e: &Entry, state: State, error: Option<String>) {
        let mut st = e.status.lock();
        if st.state != state {
            st.state = state;
            st.since = Instant::now();
        }
        if let Some(msg) = error {
            st.errors += 1;
            self.inner.errors.with_label_values(&[&st.name]).inc();
            st.last_error = cut(&msg);
        }
        let up = !state.ended();
        self.inner
            .running
            .with_label_values(&[&st.name])
            .set(up as i64);
        drop(st);
        if !up {
            self.inner.ended.notify_waiters();
        }
    }

    /// Run `work`, a loop that ends when `stop` is cancelled and handles its own errors, as
    /// the worker `name`. The handle ends when the worker does.
    pub fn spawn<F>(
        &self,
        name: &str,
        stop: &CancellationToken,
        work: F,
    ) -> tokio::task::JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let e = self.entry(name);
        self.supervise(e, stop, work, State::Exited)
    }

    /// Run `work`, which ends when its job is done (a watcher that fires once) or `stop` is
    /// cancelled, as the worker `name`: its return is `done`, not an error.
    pub fn spawn_once<F>(
        &self,
        name: &str,
        stop: &CancellationToken,
        work: F,
    ) -> tokio::task::JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let e = self.entry(name);
        self.supervise(e, stop, work, State::Done)
    }

    /// Run `work` as the worker `name` until a run succeeds or `stop` is cancelled: a failed
    /// run is logged, counted, and tried again after a backoff (from [`BACKOFF_MIN`],
    /// doubling to [`BACKOFF_MAX`]).
    pub fn spawn_retrying<F, Fut>(
        &self,
        name: &str,
        stop: &CancellationToken,
        mut work: F,
    ) -> tokio::task::JoinHandle<()>
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let e = self.entry(name);
        let me = self.clone();
        let s = stop.clone();
        let name = name.to_string();
        self.supervise(
            e.clone(),
            stop,
            async move {
                let (mut pause, longest) = me.inner.backoff;
                loop {
                    let run = tokio::select! {
                        _ = s.cancelled() => return,
                        r = work() => r,
                    };
                    match run {
                        Ok(()) => return,
                        Err(err) => {
                            tracing::warn!(
                                "background worker {name}: {err:#}; trying again in {pause:?}"
                            );
                            me.set(&e, State::Retrying, Some(format!("{err:#}")));
                        }
                    }
                    tokio::select! {
                        _ = s.cancelled() => return,
                        _ = tokio::time::sleep(pause) => {}
                    }
                    pause = (pause * 2).min(longest);
                    me.set(&e, State::Running, None);
                }
            },
            State::Done,
        )
    }

    /// Run `work` for entry `e`; when it returns while `stop` is not cancelled its state
    /// becomes `returned` (an error for a loop, the end of its work for a retrying worker).
    fn supervise<F>(
        &self,
        e: Arc<Entry>,
        stop: &CancellationToken,
        work: F,
        returned: State,
    ) -> tokio::task::JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let (me, stop) = (self.clone(), stop.clone());
        let inner = tokio::spawn(work);
        tokio::spawn(async move {
            let name = e.status.lock().name.clone();
            match inner.await {
                Ok(()) if stop.is_cancelled() => me.set(&e, State::Stopped, None),
                Ok(()) => {
                    if returned == State::Exited {
                        tracing::error!("background worker {name} ended while it should run");
                    }
                    me.set(&e, returned, None)
                }
                Err(j) => {
                    let why = panic_message(j);
                    tracing::error!("background worker {name} panicked: {why}");
                    me.set(&e, State::Panicked, Some(why))
                }
            }
        })
    }

    /// Every worker's status, in the order they were started.
    pub fn statuses(&self) -> Vec<Status> {
        self.inner
            .list
            .lock()
            .iter()
            .map(|e| e.status.lock().clone())
            .collect()
    }

    /// Wait until every worker has ended (their tokens cancelled by the caller), at most
    /// `within`; the names of those still running then.
    pub async fn shutdown(&self, within: Duration) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let ended = self.inner.ended.notified();
            let left: Vec<String> = self
                .statuses()
                .into_iter()
                .filter(|s| !s.state.ended())
                .map(|s| s.name)
                .collect();
            if left.is_empty() || tokio::time::Instant::now() >= deadline {
                if !left.is_empty() {
                    tracing::warn!(
                        "background workers still running after {within:?}: {}",
                        left.join(", ")
                    );
                }
                return left;
            }
            let _ = tokio::time::timeout_at(deadline, ended).await;
        }
    }
}

/// `statuses` as the wire carries them (`strait mirror status`).
pub fn wire(statuses: &[Status]) -> Vec<strait_proto::site::WorkerState> {
    statuses
        .iter()
        .map(|s| strait_proto::site::WorkerState {
            name: s.name.clone(),
            state: s.state.as_str().to_string(),
            for_ms: s.since.elapsed().as_millis() as u64,
            errors: s.errors,
            last_error: s.last_error.clone(),
        })
        .collect()
}

/// `statuses` as lines for `/health`: one per worker, `worker NAME: STATE` and its errors.
pub fn health_lines(statuses: &[Status]) -> String {
    let mut out = String::new();
    for s in statuses {
        out.push_str(&format!("worker {}: {}", s.name, s.state.as_str()));
        if s.errors > 0 {
            out.push_str(&format!(
                " ({} errors; last: {})",
                s.errors,
                s.last_error.replace('\n', " ")
            ));
        }
        out.push('\n');
    }
    out
}

fn cut(msg: &str) -> String {
    if msg.len() <= ERROR_LEN_MAX {
        return msg.to_string();
    }
    let mut end = ERROR_LEN_MAX;
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &msg[..end])
}

fn panic_message(j: tokio::task::JoinError) -> String {
    if !j.is_panic() {
        return "cancelled".into();
    }
    let p = j.into_panic();
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with no message".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state_of(w: &Workers, name: &str) -> Status {
        w.statuses()
            .into_iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no worker {name}"))
    }

    async fn until(w: &Workers, name: &str, want: State) -> Status {
        for _ in 0..200 {
            let s = state_of(w, name);
            if s.state == want {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{name} never became {want:?}: {:?}", state_of(w, name));
    }

    /// Each way a worker can end is told apart, counted, and shown in the metrics.
    #[tokio::test]
    async fn a_worker_is_stopped_exited_or_panicked_as_it_ended() {
        let registry = Registry::new();
        let w = Workers::new(&registry);
        let stop = CancellationToken::new();
        let s = stop.clone();
        w.spawn("loop", &stop, async move { s.cancelled().await });
        w.spawn("gives-up", &stop, async {});
        w.spawn_once("fired", &stop, async {});
        w.spawn("bug", &stop, async { panic!("an index out of range") });
        until(&w, "gives-up", State::Exited).await;
        until(&w, "fired", State::Done).await;
        let p = until(&w, "bug", State::Panicked).await;
        assert_eq!(
            (p.errors, p.last_error.as_str()),
            (1, "an index out of range")
        );
        assert_eq!(state_of(&w, "loop").state, State::Running);
        let text = health_lines(&w.statuses());
        assert!(text.contains("worker loop: running\n"), "{text}");
        assert!(text.contains("worker gives-up: exited\n"), "{text}");
        assert!(
            text.contains("worker bug: panicked (1 errors; last: an index out of range)"),
            "{text}"
        );
        let running = w.inner.running.with_label_values(&["loop"]).get();
        let bug = w.inner.running.with_label_values(&["bug"]).get();
        assert_eq!((running, bug), (1, 0));
        stop.cancel();
        assert!(w.shutdown(Duration::from_secs(5)).await.is_empty());
        assert_eq!(state_of(&w, "loop").state, State::Stopped);
    }

    /// Failed runs are tried again after a doubling pause, counted, and the last error kept;
    /// a run that succeeds ends the worker.
    #[tokio::test]
    async fn a_failing_worker_backs_off_and_keeps_its_last_error() {
        let mut w = Workers::new(&Registry::new());
        let ms = Duration::from_millis;
        Arc::get_mut(&mut w.inner).expect("not shared yet").backoff = (ms(20), ms(80));
        let stop = CancellationToken::new();
        let runs = Arc::new(Mutex::new(vec![]));
        let r = runs.clone();
        let t0 = Instant::now();
        w.spawn_retrying("flaky", &stop, move || {
            let r = r.clone();
            async move {
                let n = {
                    let mut v = r.lock();
                    v.push(t0.elapsed());
                    v.len()
                };
                if n < 4 {
                    anyhow::bail!("attempt {n} failed")
                }
                Ok(())
            }
        });
        let s = until(&w, "flaky", State::Done).await;
        assert_eq!((s.errors, s.last_error.as_str()), (3, "attempt 3 failed"));
        // each pause at least the backoff (a sleep never ends early), doubling
        let at = runs.lock().clone();
        assert_eq!(at.len(), 4);
        for (i, least) in [ms(20), ms(40), ms(80)].into_iter().enumerate() {
            assert!(at[i + 1] - at[i] >= least, "{at:?}");
        }
        assert_eq!(w.inner.errors.with_label_values(&["flaky"]).get(), 3);

        // one that never succeeds ends when it is cancelled, during its pause
        w.spawn_retrying("broken", &stop, || async { anyhow::bail!("no") });
        until(&w, "broken", State::Retrying).await;
        stop.cancel();
        assert!(w.shutdown(Duration::from_secs(5)).await.is_empty());
        assert_eq!(state_of(&w, "broken").state, State::Stopped);
    }

    /// Shutdown names the workers that did not end within the deadline.
    #[tokio::test]
    async fn shutdown_names_the_workers_still_running_at_the_deadline() {
        let w = Workers::new(&Registry::new());
        let stop = CancellationToken::new();
        let s = stop.clone();
        w.spawn("prompt", &stop, async move { s.cancelled().await });
        w.spawn("deaf", &stop, async {
            tokio::time::sleep(Duration::from_secs(3600)).await
        });
        stop.cancel();
        assert_eq!(w.shutdown(Duration::from_millis(300)).await, vec!["deaf"]);
        assert_eq!(state_of(&w, "prompt").state, State::Stopped);
    }
}
