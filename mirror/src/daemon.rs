//! The mirror daemon: bootstraps, follows the log, serves its region's mounts and its status,
//! until SIGTERM or SIGINT.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use strait_fs_core::meta::{Meta, MetaOptions};
use strait_fs_core::Version;
use strait_proto::site::site_service_server::SiteServiceServer;
use strait_server::metrics::StatusCode;
use strait_server::sessions::expire_sessions;
use strait_server::{wait_for_signal, BlockSource, MetaServer, MESSAGE_BYTES_MAX};
use tokio_util::sync::CancellationToken;

use crate::config::{MirrorConfig, Writes};
use crate::follower::{self, Primary};
use crate::forward::ForwardSession;
use crate::metrics::Metrics;
use crate::promote::{Following, Promoter};
use crate::router::Router;
use crate::site::MirrorSite;
use crate::state::{Mirror, Phase};

/// How long the background workers have to end after the services stopped.
const WORKERS_STOP_WITHIN: Duration = Duration::from_secs(5);
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// FetchBlock, served by the region's [`crate::blocks::Blocks`].
struct Source(Arc<crate::blocks::Blocks>);

impl BlockSource for Source {
    fn unsynced(&self, slices: &[strait_fs_core::meta::SliceRef]) -> Vec<Vec<u8>> {
        self.0.unsynced(slices)
    }

    fn fetch(
        &self,
        req: strait_proto::meta::FetchBlockRequest,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<bytes::Bytes, tonic::Status>> + Send>,
    > {
        let b = self.0.clone();
        Box::pin(async move { b.fetch(&req.key, req.len, req.crc, &req.reason).await })
    }
}

/// How many times the daemon opens its metadata again after a new bootstrap emptied it while it
/// started.
const REOPEN_MAX: u32 = 5;

/// Wait for a change of the mirror's state, or 100 ms; false when the daemon is stopping.
async fn pause(stop: &CancellationToken, changed: &mut tokio::sync::watch::Receiver<u64>) -> bool {
    tokio::select! {
        _ = stop.cancelled() => false,
        _ = changed.changed() => true,
        _ = tokio::time::sleep(Duration::from_millis(100)) => true,
    }
}

pub async fn run(cfg: MirrorConfig) -> Result<()> {
    cfg.validate()?;
    let primary = Primary::new(&cfg.primary, &cfg.primary_credentials()?)?;
    let meta_url = cfg.meta_url.clone();
    let kv = tokio::task::spawn_blocking(move || strait_fs_core::kv::open(&meta_url))
        .await
        .context("open task")?
        .with_context(|| format!("open the mirror's metadata engine {}", cfg.meta_url))?;
    // the shipper of a promoted mirror hears of each commit at once
    let (kv, signal) = strait_primary::ship::tap::TappedKv::wrap(kv);
    // each applied batch's changes to names and attributes, told to the mounts' Watch streams
    let (kv, watch) = strait_server::watch::WatchedKv::wrap(kv)?;
    let kv2 = kv.clone();
    let promoted = tokio::task::spawn_blocking(move || strait_primary::promotion::recorded(&kv2))
        .await
        .context("open task")??;
    let kv2 = kv.clone();
    let applied = tokio::task::spawn_blocking(move || kv2.last_version())
        .await
        .context("open task")??;
    let metrics = Metrics::new();
    metrics.window_seconds.set(cfg.window_ms as f64 / 1000.0);
    strait_server::metrics::note_certificate_expiries(&metrics.base.tls_expiry, &cfg.security);
    let blocks = crate::blocks::Blocks::open(&cfg, kv.clone()).await?;
    let mirror = Mirror::new(
        cfg.clone(),
        cfg.site.replicator_credentials(&cfg.security)?,
        kv.clone(),
        metrics.clone(),
        blocks.clone(),
        applied,
    );
    let stop = CancellationToken::new();
    tokio::spawn(wait_for_signal(stop.clone()));

    // the follower bootstraps when the engine is empty, then applies the log; it and
    // everything else that follows the old primary stop at a promotion (a promoted mirror
    // started again follows nothing)
    let follow_stop = stop.child_token();
    if promoted.is_some() {
        follow_stop.cancel();
    }
    let workers = mirror.workers.clone();
    let follower = workers.spawn(
        "follower",
        &follow_stop,
        follower::run(mirror.clone(), primary.clone(), follow_stop.clone()),
    );
    // a promotion elsewhere names the new primary: forward there (it may have happened before
    // this start, so this runs before the first bootstrap, which asks the primary too)
    let late_forward = crate::new_primary::LateForward::default();
    workers.spawn(
        "new-primary",
        &follow_stop,
        crate::new_primary::run(
            mirror.clone(),
            primary.clone(),
            late_forward.clone(),
            follow_stop.clone(),
        ),
    );
    if applied == Version::ZERO {
        println!(
            "strait mirror: bootstrapping from the primary at {}",
            cfg.primary
        );
    }
    let mut changed = mirror.changed.subscribe();
    while mirror.applied() == Version::ZERO {
        if !pause(&stop, &mut changed).await {
            return Ok(());
        }
        if mirror.phase() == Phase::Halted {
            anyhow::bail!("the mirror halted before its first bootstrap finished");
        }
    }

    let writes = cfg.writes == Writes::Forward;
    let options = MetaOptions {
        read_only: true,
        writes_elsewhere: writes,
    };
    // The follower may empty the engine for a new bootstrap (the log it needs was purged)
    // between the wait above and this open: then wait for that bootstrap and open again.
    let mut reopened = 0;
    let engine = loop {
        let (kv2, o) = (kv.clone(), options.clone());
        let opened = tokio::task::spawn_blocking(move || Meta::open(kv2, o))
            .await
            .context("open task")?;
        let e = match opened {
            Ok(engine) => break engine,
            Err(e) => e,
        };
        let kv2 = kv.clone();
        let empty = tokio::task::spawn_blocking(move || kv2.last_version())
            .await
            .context("open task")??
            == Version::ZERO;
        if !(empty || mirror.phase() == Phase::Bootstrapping) || reopened >= REOPEN_MAX {
            return Err(anyhow::Error::from(e)).context("open the mirror's metadata");
        }
        reopened += 1;
        tracing::info!("the metadata was emptied for a new bootstrap: opening it after that");
        loop {
            if !pause(&stop, &mut changed).await {
                return Ok(());
            }
            if mirror.phase() == Phase::Halted {
                anyhow::bail!("the mirror halted during a new bootstrap");
            }
            let kv2 = kv.clone();
            let v = tokio::task::spawn_blocking(move || kv2.last_version())
                .await
                .context("open task")??;
            if v > Version::ZERO && mirror.phase() != Phase::Bootstrapping {
                break;
            }
        }
    };
    let format = engine.settings().clone();
    strait_server::sessions::lock_grace_at_start(&engine).await?;
    let mut server = MetaServer::new(
        engine.clone(),
        cfg.site.session_timeout_ms,
        metrics.base.clone(),
    );
    if blocks.has_local() {
        server = server.with_blocks(cfg.data_url.clone(), Arc::new(Source(blocks.clone())));
    }
    if let Some(hub) = watch {
        // the mounts keep what the mirror tells them only while its reads are answered here:
        // inside its staleness window
        let m = mirror.clone();
        let window_ms = cfg.window_ms;
        server = server.watched_by(hub).watch_while(Arc::new(move || {
            (!m.fresh()).then(|| {
                format!(
                    "the mirror is outside its {window_ms} ms staleness window (or not following \
                     the log): its mounts ask for every lookup until it is back"
                )
            })
        }));
    }
    // the shipper's fence and wait, filled in at a promotion
    let late = Arc::new(crate::promote::LateShipping::default());
    let server = Arc::new(server.fenced_by(late.clone()).replicated(late.clone()));
    workers.spawn("copier", &stop, blocks.clone().run_copier(stop.clone()));
    workers.spawn("deleter", &stop, blocks.clone().run_deleter(stop.clone()));
    let forward = ForwardSession::new(primary.clone(), &cfg.id, engine.clone());
    let _ = late_forward.set(forward.clone());
    let router = Router::new(
        server.clone(),
        mirror.clone(),
        forward.clone(),
        format.block_size,
    );
    let promoter = Arc::new(Promoter {
        mirror: mirror.clone(),
        engine: engine.clone(),
        server: server.clone(),
        forward: forward.clone(),
        late,
        signal,
        following: parking_lot::Mutex::new(Some(Following {
            stop: follow_stop.clone(),
            follower,
        })),
        stop: stop.clone(),
        ship_stop: CancellationToken::new(),
        busy: tokio::sync::Mutex::new(()),
        gc: std::sync::OnceLock::new(),
    });
    if let Some(p) = &promoted {
        promoter.switch(p).with_context(|| {
            format!(
                "this mirror was promoted to primary at epoch {} (from version {}), so it \
                 starts as the primary",
                p.epoch, p.from_version
            )
        })?;
    }
    if promoted.is_none() && cfg.promotion.failover == crate::config::Failover::Auto {
        workers.spawn_once(
            "failover-watch",
            &stop,
            promoter.clone().watch_primary(
                Duration::from_millis(cfg.promotion.failover_after_ms),
                stop.clone(),
            ),
        );
    }
    let mut mirror_site = MirrorSite::new(mirror.clone());
    mirror_site.promoter = Some(promoter.clone());
    let site = SiteServiceServer::new(mirror_site)
        .max_decoding_message_size(MESSAGE_BYTES_MAX)
        .max_encoding_message_size(MESSAGE_BYTES_MAX);
    let (mut builder, tls) = strait_server::serve::server(
        &cfg.site,
        &cfg.security,
        &format!("mirror {}", cfg.id),
        metrics.base.clone(),
    )?;

    workers.spawn(
        "session-expiry",
        &stop,
        expire_sessions(
            server.clone(),
            Duration::from_millis(cfg.site.session_timeout_ms),
            stop.clone(),
            metrics.base.clone(),
        ),
    );
    // request records past the retry horizon: the log brings the primary's, and a promoted
    // mirror writes its own
    workers.spawn(
        "request-sweep",
        &stop,
        strait_server::requests::sweep::sweep_request_records(
            engine.clone(),
            stop.clone(),
            metrics.base.clone(),
        ),
    );
    workers.spawn(
        "ack",
        &follow_stop,
        follower::ack(mirror.clone(), follow_stop.clone()),
    );
    workers.spawn(
        "primary-clock",
        &follow_stop,
        follower::poll_clock(mirror.clone(), primary.clone(), follow_stop.clone()),
    );
    workers.spawn(
        "forward-heartbeat",
        &follow_stop,
        forward.clone().heartbeat(follow_stop.clone()),
    );
    workers.spawn(
        "open-files",
        &follow_stop,
        forward.clone().run_holds(follow_stop.clone()),
    );
    {
        let m = mirror.clone();
        let s = stop.clone();
        workers.spawn("tick", &stop, async move {
            loop {
                tokio::select! {
                    _ = s.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {
                        m.tick();
                        let b = m.blocks.clone();
                        let _ = tokio::task::spawn_blocking(move || b.tick()).await;
                    }
                }
            }
        });
    }
    let mut metrics_addr = None;
    if !cfg.metrics_listen.is_empty() {
        let l = tokio::net::TcpListener::bind(&cfg.metrics_listen)
            .await
            .with_context(|| format!("listen on {} for metrics", cfg.metrics_listen))?;
        metrics_addr = l.local_addr().ok();
        let (m, m2) = (mirror.clone(), mirror.clone());
        workers.spawn(
            "metrics-http",
            &stop,
            strait_server::metrics::serve(
                l,
                move || render(m.clone()),
                move || health(m2.clone()),
                stop.clone(),
            ),
        );
    }

    let listener = tokio::net::TcpListener::bind(&cfg.listen)
        .await
        .with_context(|| format!("listen on {}", cfg.listen))?;
    let addr = listener.local_addr().context("the listening address")?;
    let role = match &promoted {
        Some(p) => format!(
            "the primary since its promotion at epoch {} (from version {}), shipping to {}",
            p.epoch,
            p.from_version,
            cfg.replicator.join(", ")
        ),
        None => format!(
            "following {} from version {}",
            cfg.replicator.join(", "),
            mirror.applied()
        ),
    };
    println!(
        "strait mirror: serving {} ({}) on {addr} ({tls}), {role}{}",
        format.name,
        cfg.meta_url,
        metrics_addr
            .map(|a| format!(", metrics on http://{a}/metrics"))
            .unwrap_or_default()
    );
    tracing::info!(
        "mirror {} serving {} on {addr}: window {} ms, policy {}",
        cfg.id,
        format.name,
        cfg.window_ms,
        cfg.policy
    );
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let s2 = stop.clone();
    let serve = builder
        .add_service(router)
        .add_service(site)
        .serve_with_incoming_shutdown(incoming, async move { s2.cancelled().await });
    tokio::select! {
        r = serve => r.context("serve the mirror's services")?,
        _ = async { stop.cancelled().await; tokio::time::sleep(SHUTDOWN_GRACE).await } => {}
    }
    stop.cancel();
    let following = promoter.following.lock().take();
    if let Some(f) = following {
        let _ = f.follower.await;
    }
    // a promoted mirror ships what is left, as a stopping primary does
    promoter.drain().await;
    workers.shutdown(WORKERS_STOP_WITHIN).await;
    let kv2 = kv.clone();
    tokio::task::spawn_blocking(move || kv2.sync())
        .await
        .context("sync task")??;
    tracing::info!("stopped at version {}", mirror.applied());
    Ok(())
}

/// `/metrics`: every metric, the gauges brought up to date first.
async fn render(mirror: Arc<Mirror>) -> String {
    mirror.tick_gauges();
    let kv = mirror.kv.clone();
    let read = tokio::task::spawn_blocking(move || {
        strait_fs_core::meta::requests::applied_twice(kv.as_ref()).map(|n| (n, kv.memory()))
    })
    .await;
    if let Ok(Ok((twice, memory))) = read {
        mirror.metrics.base.requests_applied_twice.set(twice);
        mirror.metrics.base.note_memory(&memory);
    }
    mirror.metrics.base.render()
}

/// `/health`: 200 while following inside the window, and once promoted (it serves as the
/// primary).
async fn health(mirror: Arc<Mirror>) -> (StatusCode, String) {
    if let Some(why) = mirror.fenced() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("fenced: {why}; this promoted mirror takes no changes (rejoin it)\n"),
        );
    }
    let st = mirror.status();
    let code = if st.state == "following" || st.state == "promoted" {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        code,
        format!(
            "{} applied {} lag {} ms {}\n{}",
            st.state,
            st.applied_version,
            st.lag_ms,
            st.error,
            strait_server::workers::health_lines(&mirror.workers.statuses())
        ),
    )
}
