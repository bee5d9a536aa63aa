//! Running one engine call: on the serving thread or the blocking pool, timed, its error
//! turned into a status, its version waited for in `replicated` durability; once per request
//! id, answered from its request record when it committed before (`requests.rs`); refused
//! while the daemon is fenced; a forwarded read's version named.

use std::sync::Arc;
use std::time::Instant;

use strait_fs_core::clock::now_ns;
use strait_fs_core::error::Error;
use strait_fs_core::meta::requests::{Lookup, Outcome, RECORDS_MAX};
use strait_fs_core::meta::{Committed, Meta};
use strait_fs_core::Version;
use strait_proto::{to_status, VERSION_HEADER};
use tonic::{Response, Status};

use super::replay::Recorded;
use super::{MetaServer, ReplicationWait};
use crate::metrics::Metrics;
use crate::requests::{Claim, Finisher};

/// What running an engine call needs, owned, so a call can run in a task of its own.
#[derive(Clone)]
pub(super) struct Exec {
    inline: bool,
    replicated: Option<Arc<dyn ReplicationWait>>,
    metrics: Arc<Metrics>,
}

/// A call that commits nothing, as [`MetaServer::blocking_v`] takes it.
pub(super) fn unversioned<T>(
    f: impl FnOnce() -> strait_fs_core::Result<T>,
) -> impl FnOnce() -> strait_fs_core::Result<Committed<T>> {
    move || f().map(Committed::unversioned)
}

impl MetaServer {
    /// [`Self::check_settled`], then EROFS with the fence's reason when mutations are
    /// refused.
    pub(super) async fn check_fence(&self, op: &str) -> Result<(), Status> {
        self.check_settled(op).await?;
        let Some(fence) = &self.fence else {
            return Ok(());
        };
        let Some(why) = fence.refused().await else {
            return Ok(());
        };
        self.metrics.observe(op, "EROFS", std::time::Duration::ZERO);
        let mut s =
            Status::failed_precondition(format!("{op}: {why}: this primary takes no changes"));
        if let Ok(v) = libc::EROFS.to_string().parse() {
            s.metadata_mut().insert(strait_proto::ERRNO_HEADER, v);
        }
        Err(s)
    }

    /// EIO, with the fence's reason, once reads of the metadata are refused (a primary fenced
    /// for a while: [`super::WriteFence::reads_refused`]).
    pub(super) fn check_reads(&self, op: &str) -> Result<(), Status> {
        let Some(why) = self.fence.as_ref().and_then(|f| f.reads_refused()) else {
            return Ok(());
        };
        self.metrics.observe(op, "EIO", std::time::Duration::ZERO);
        let mut s = Status::failed_precondition(format!("{op}: {why}"));
        if let Ok(v) = libc::EIO.to_string().parse() {
            s.metadata_mut().insert(strait_proto::ERRNO_HEADER, v);
        }
        Err(s)
    }

    /// UNAVAILABLE (the client sends the call again) while the fence says the state may still
    /// lack acknowledged changes ([`super::WriteFence::unsettled`]).
    pub(super) async fn check_settled(&self, op: &str) -> Result<(), Status> {
        let Some(fence) = &self.fence else {
            return Ok(());
        };
        let Some(why) = fence.unsettled().await else {
            return Ok(());
        };
        self.metrics
            .observe(op, "UNAVAILABLE", std::time::Duration::ZERO);
        Err(Status::unavailable(format!(
            "{op}: {why}: try again in a moment"
        )))
    }

    /// Name the engine's latest version in `resp` (see [`READ_VERSION_HEADER`]): read after
    /// the call's own read, it is at least the version of anything that read saw, since a
    /// transaction moves the version counter with its changes.
    pub(super) async fn stamp_version<T>(&self, resp: &mut Response<T>) -> Result<(), Status> {
        let kv = self.engine.kv().clone();
        // one read of a local engine: cheaper in place than handed to the blocking pool
        let version = if self.inline {
            kv.last_version()
        } else {
            tokio::task::spawn_blocking(move || kv.last_version())
                .await
                .map_err(|_| Status::internal("read the latest version: the task failed"))?
        }
        .map_err(|e| to_status(&e))?;
        if let Ok(v) = version.to_string().parse() {
            resp.metadata_mut().insert(VERSION_HEADER, v);
        }
        Ok(())
    }

    /// Run `f` on the blocking pool, timing it and turning its error into a status.
    pub(super) async fn blocking<T, F>(&self, op: &'static str, f: F) -> Result<T, Status>
    where
        T: Send + 'static,
        F: FnOnce() -> strait_fs_core::Result<T> + Send + 'static,
    {
        self.blocking_v(op, unversioned(f)).await.map(|(v, _)| v)
    }

    /// [`MetaServer::blocking`] for a call that reports the version it committed; returns
    /// that version (None: it changed nothing) once, in `replicated` durability, it is
    /// replicated.
    pub(super) async fn blocking_v<T, F>(
        &self,
        op: &'static str,
        f: F,
    ) -> Result<(T, Option<Version>), Status>
    where
        T: Send + 'static,
        F: FnOnce() -> strait_fs_core::Result<Committed<T>> + Send + 'static,
    {
        self.exec().run(op, f).await
    }

    fn exec(&self) -> Exec {
        Exec {
            inline: self.inline,
            replicated: self.replicated.clone(),
            metrics: self.metrics.clone(),
        }
    }

    /// [`MetaServer::blocking_v`] for a call with a request id (see `requests.rs`): the first
    /// call with the id runs in a task of its own; it and every retry get its result. A
    /// `recorded` call first looks its request record up, in the same engine call: found, it
    /// is answered from it and not run again.
    pub(super) async fn once<T, F>(
        &self,
        id: String,
        retry: bool,
        op: &'static str,
        recorded: Option<Recorded<T>>,
        f: F,
    ) -> Result<(T, Option<Version>), Status>
    where
        T: Clone + Send + Sync + 'static,
        F: FnOnce() -> strait_fs_core::Result<Committed<T>> + Send + 'static,
    {
        let slot = match self.requests.claim(&id, Instant::now()) {
            Claim::First(slot) => {
                let exec = self.exec();
                let finisher = Finisher(slot.clone());
                let engine = self.engine.clone();
                let started_ns = self.started_ns;
                let id = id.clone();
                // in the call's span: its commit, and what ships it, join the caller's trace
                let span = tracing::Span::current();
                tokio::spawn(tracing::Instrument::instrument(
                    async move {
                        let out = match recorded {
                            Some(r) => {
                                let first = RecordLookup {
                                    engine,
                                    id: &id,
                                    retry,
                                    started_ns,
                                };
                                exec.run_recorded(op, first, r, f).await
                            }
                            None => exec.run(op, f).await,
                        };
                        let out = out.map(|(v, version)| {
                            (Arc::new(v) as Arc<dyn std::any::Any + Send + Sync>, version)
                        });
                        finisher.0.finish(out);
                    },
                    span,
                ));
                slot
            }
            Claim::Again(slot) => {
                tracing::info!("{op}: request {id} sent again; answering with its first result");
                self.metrics.requests_retried.inc();
                slot
            }
        };
        let (any, version) = slot.outcome().await?;
        let v = any.downcast_ref::<T>().cloned().ok_or_else(|| {
            Status::invalid_argument(format!(
                "request id {id} was first used by a call of another kind"
            ))
        })?;
        Ok((v, version))
    }
}

/// Where and how a recorded call looks its request record up.
struct RecordLookup<'a> {
    engine: Arc<Meta>,
    id: &'a str,
    /// The client sent the call before.
    retry: bool,
    /// When this daemon started: a record older than that was committed by an earlier run.
    started_ns: i64,
}

/// What a recorded call found when it looked its request record up.
enum Prior<T> {
    /// No record: it ran now.
    Ran(T),
    /// A record: the change committed before, with this outcome, at this time.
    Recorded(Outcome, i64),
}

impl Exec {
    /// Run a call that commits its request record: look the record up first, in the same
    /// engine call, and answer from it when the change committed before (see `requests.rs`).
    async fn run_recorded<T, F>(
        self,
        op: &'static str,
        lookup: RecordLookup<'_>,
        recorded: Recorded<T>,
        f: F,
    ) -> Result<(T, Option<Version>), Status>
    where
        T: Send + 'static,
        F: FnOnce() -> strait_fs_core::Result<Committed<T>> + Send + 'static,
    {
        let RecordLookup {
            engine,
            id,
            retry,
            started_ns,
        } = lookup;
        let key = id.to_string();
        let first = move || -> strait_fs_core::Result<Committed<Prior<T>>> {
            match engine.request_lookup(&key, now_ns(), retry)? {
                Lookup::NotCommitted => Ok(f()?.map(Prior::Ran)),
                Lookup::Committed(r) => Ok(Committed::new(
                    Prior::Recorded(r.outcome, r.ts_ns),
                    Some(r.version),
                )),
                Lookup::Unknown => Err(Error::Meta(format!(
                    "request {key} was sent again and has no record, while records may be \
                     missing (more than {RECORDS_MAX} were kept, or the primary took changes \
                     back from the replicator): it may or may not have been applied"
                ))),
            }
        };
        let metrics = self.metrics.clone();
        // the version, a recorded one too, is waited for in `replicated` durability
        let (prior, version) = self.run(op, first).await?;
        match prior {
            Prior::Ran(v) => Ok((v, version)),
            Prior::Recorded(outcome, ts_ns) => {
                let earlier_run = ts_ns < started_ns;
                let v =
                    (recorded.replay)(&outcome, &recorded.view, earlier_run).ok_or_else(|| {
                        Status::invalid_argument(format!(
                            "request id {id} was first used by a call of another kind"
                        ))
                    })?;
                tracing::info!(
                    "{op}: request {id} sent again, committed as version {}{}; answering with its \
                     first result",
                    version.map(|v| v.to_string()).unwrap_or_default(),
                    if earlier_run {
                        " before this daemon started"
                    } else {
                        ""
                    }
                );
                metrics.requests_retried.inc();
                metrics.requests_replayed.inc();
                Ok((v, version))
            }
        }
    }

    /// Run an engine call that reports the version it committed; returns that version (None:
    /// it changed nothing) once, in `replicated` durability, it is replicated.
    async fn run<T, F>(self, op: &'static str, f: F) -> Result<(T, Option<Version>), Status>
    where
        T: Send + 'static,
        F: FnOnce() -> strait_fs_core::Result<Committed<T>> + Send + 'static,
    {
        let start = Instant::now();
        let res = if self.inline {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
                .map_err(|_| "the engine call panicked")
        } else {
            let span = tracing::Span::current();
            tokio::task::spawn_blocking(move || span.in_scope(f))
                .await
                .map_err(|_| "the engine call panicked")
        };
        let (res, committed) = match res {
            Ok(r) => {
                let version = r.as_ref().ok().and_then(|c| c.version);
                if let (Some(wait), Some(version)) = (&self.replicated, version) {
                    if let Err(why) = wait.wait(version).await {
                        tracing::error!("{op}: {why}");
                        self.metrics.replication_timeouts.inc();
                        self.metrics.observe(op, "EIO", start.elapsed());
                        return Err(to_status(&Error::Meta(format!(
                            "{op}: {why} (durability = replicated)"
                        ))));
                    }
                }
                (r.map(Committed::into_value), version)
            }
            Err(e) => {
                tracing::error!("{op}: the engine call failed: {e}");
                self.metrics.observe(op, "panic", start.elapsed());
                return Err(Status::internal(format!("{op}: the engine call failed")));
            }
        };
        match res {
            Ok(v) => {
                self.metrics.observe(op, "ok", start.elapsed());
                Ok((v, committed))
            }
            Err(e) => {
                let errno = e.errno();
                if !e.is_sys() && !matches!(e, Error::Invalid(_)) {
                    tracing::error!("{op}: {e}");
                }
                self.metrics.observe(
                    op,
                    &strait_fs_core::error::errno_name(errno),
                    start.elapsed(),
                );
                Err(to_status(&e))
            }
        }
    }
}
