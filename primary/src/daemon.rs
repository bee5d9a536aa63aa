//! The primary daemon: owns the engine, serves [`MetaServer`], expires dead sessions and old
//! request records, deletes dead slices' blocks and serves metrics, until SIGTERM or SIGINT.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use strait_fs_core::meta::{Meta, MetaOptions, ROOT_INO};
use strait_proto::meta::meta_service_server::MetaServiceServer;
use strait_server::metrics::{self, Metrics, StatusCode};
use strait_server::requests::sweep::sweep_request_records;
use strait_server::sessions::expire_sessions;
use strait_server::workers::Workers;
use strait_server::{wait_for_signal, MetaServer, MESSAGE_BYTES_MAX};
use tokio_util::sync::CancellationToken;

use crate::config::PrimaryConfig;
use crate::ship::tap::TappedKv;

/// How long calls in flight may take to finish after SIGTERM.
/// How long the background workers have to end after the service stopped.
const WORKERS_STOP_WITHIN: Duration = Duration::from_secs(5);
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// How long a stopping daemon waits for the shipper to send what is left.
const SHIP_DRAIN: Duration = Duration::from_secs(5);
/// Most calls served at once on one connection.
const STREAMS_PER_CONNECTION_MAX: u32 = 1024;

/// Run the daemon until a signal asks it to stop.
pub async fn run(cfg: PrimaryConfig) -> Result<()> {
    cfg.validate()?;
    let meta_url = cfg.meta_url.clone();
    let read_only = cfg.read_only;
    let ship = !cfg.replicator.is_empty();
    let replicator_creds = if ship {
        cfg.site.replicator_credentials(&cfg.security)?
    } else {
        strait_replicator_client::Credentials::default()
    };
    let accept_loss = cfg.accept_redis_loss;
    let (engine, signal, watch) = tokio::task::spawn_blocking(move || -> Result<_> {
        // an engine that may lose what it acknowledged breaks the durability promise
        // (docs/guarantees.md §1), and hands slice ids out twice after a loss
        if let Some(why) = strait_fs_core::kv::durability_problem(&meta_url)? {
            if !accept_loss {
                anyhow::bail!("{why}; or start with --accept-redis-loss to accept that");
            }
            tracing::warn!("{why}; started all the same (accept_redis_loss)");
        }
        let kv = strait_fs_core::kv::open(&meta_url)?;
        let (kv, signal) = if ship {
            let (kv, s) = TappedKv::wrap(kv);
            (kv, Some(s))
        } else {
            (kv, None)
        };
        // each commit's changes to names and attributes, told to the mounts' Watch streams
        let (kv, watch) = strait_server::watch::WatchedKv::wrap(kv)?;
        Ok((
            Meta::open(
                kv,
                MetaOptions {
                    read_only,
                    ..Default::default()
                },
            )?,
            signal,
            watch,
        ))
    })
    .await
    .context("open the metadata engine")??;
    let format = engine.settings().clone();
    strait_server::sessions::lock_grace_at_start(&engine).await?;
    // the store its mounts write to: synced before shipping, and GC's
    let store = strait_fs_core::object::open(&format.data_url).await;
    let metrics = Metrics::new();
    strait_server::metrics::note_certificate_expiries(&metrics.tls_expiry, &cfg.security);
    let stop = CancellationToken::new();
    // the background workers: `/health` lists them
    let workers = Workers::new(&metrics.registry);
    let mut server = MetaServer::new(engine.clone(), cfg.site.session_timeout_ms, metrics.clone());
    if let Some(hub) = watch {
        server = server.watched_by(hub);
    }
    // the shipper outlives the service by a moment at shutdown, to ship what is left
    let ship_stop = CancellationToken::new();
    let mut shipped = None;
    let mut fence = None;
    // a planned switchover (`Handover`)
    let handover = Arc::new(crate::handover::Handover::default());
    if let Some(signal) = signal {
        let settings = crate::ship::Settings {
            replicator: cfg.replicator.clone(),
            creds: replicator_creds.clone(),
            epoch: cfg.epoch,
            heartbeat: Duration::from_millis(cfg.heartbeat_ms),
            durability: cfg.durability,
            replicated_timeout: Duration::from_millis(cfg.replicated_timeout_ms),
            lease: (cfg.lease_ms > 0).then(|| Duration::from_millis(cfg.lease_ms)),
            blocks: store.as_ref().ok().cloned(),
            fenced_reads: Duration::from_millis(cfg.fenced_window_ms),
        };
        let shipping = crate::ship::start(
            engine.kv().clone(),
            signal,
            &settings,
            metrics.clone(),
            &workers,
            ship_stop.clone(),
        )?;
        if let Some(wait) = shipping.wait {
            server = server.replicated(wait);
        }
        // a primary whose epoch another primary superseded commits nothing more, and deletes
        // nothing on its own (an unlinked file's last close, a session's end, GC)
        fence = Some(shipping.fence.clone());
        let (gate, handing) = (shipping.fence.clone(), handover.clone());
        engine.gate_deletions(Arc::new(move || {
            gate.deletions_refused().or_else(|| {
                handing
                    .active()
                    .then(|| "this primary is handing over to a mirror".to_string())
            })
        }));
        server = server.fenced_by(Arc::new(crate::handover::HandoverFence {
            inner: shipping.fence,
            handover: handover.clone(),
        }));
        shipped = Some(shipping.shipper.watch());
        tracing::info!(
            "shipping the change log to the replicator at {} (epoch {}, durability {})",
            cfg.replicator.join(", "),
            cfg.epoch,
            cfg.durability
        );
    }
    let server = Arc::new(server);

    // dead slices' blocks: a pass every gc_interval_s, and on demand (`strait gc`)
    let mut gc_handle = None;
    if !cfg.read_only {
        match store {
            Ok(store) => {
                let epoch = cfg.epoch;
                let fence = fence.as_ref().map(|f| {
                    let f = f.clone();
                    let gate: strait_fs_core::meta::DeletionGate =
                        Arc::new(move || f.deletions_refused());
                    (epoch, gate)
                });
                gc_handle = Some(crate::gc::Gc::start(
                    engine.clone(),
                    store,
                    &cfg.replicator,
                    &replicator_creds,
                    Duration::from_millis(cfg.gc_mirror_grace_ms),
                    fence,
                    (cfg.gc_interval_s > 0).then(|| Duration::from_secs(cfg.gc_interval_s)),
                    &workers,
                    &stop,
                    metrics.clone(),
                )?);
            }
            Err(e) if cfg.gc_interval_s == 0 => {
                tracing::warn!(
                    "open the object store {}: {e}; `strait gc` against this daemon will fail",
                    format.data_url
                );
            }
            Err(e) => {
                return Err(anyhow::Error::from(e).context(format!(
                    "open the object store {} to delete dead blocks (set gc_interval_s = 0 to leave that to `strait gc`)",
                    format.data_url
                )))
            }
        }
    }

    // metadata backups in the object store, every backup_interval_s
    if cfg.backup_interval_s > 0 {
        match strait_fs_core::object::open(&format.data_url).await {
            Ok(store) => {
                let gate = fence.as_ref().map(|f| {
                    let (f, h) = (f.clone(), handover.clone());
                    let g: strait_fs_core::meta::DeletionGate = Arc::new(move || {
                        f.deletions_refused()
                            .or_else(|| h.active().then(|| "handing over".to_string()))
                    });
                    g
                });
                workers.spawn(
                    "metadata-backup",
                    &stop,
                    crate::backup::run(
                        engine.clone(),
                        store,
                        crate::backup::Settings {
                            interval: Duration::from_secs(cfg.backup_interval_s),
                            keep: cfg.backup_keep,
                        },
                        gate,
                        crate::backup::BackupMetrics::new(&metrics.registry),
                        stop.clone(),
                    ),
                );
            }
            Err(e) => tracing::warn!(
                "open the object store {} for metadata backups: {e}; none will be taken \
                 (backup_interval_s = 0 turns them off)",
                format.data_url
            ),
        }
    }

    let listener = tokio::net::TcpListener::bind(&cfg.listen)
        .await
        .with_context(|| format!("listen on {}", cfg.listen))?;
    let addr = listener.local_addr().context("the listening address")?;

    let (builder, tls) =
        strait_server::serve::server(&cfg.site, &cfg.security, "the primary", metrics.clone())?;
    let mut builder = builder.max_concurrent_streams(Some(STREAMS_PER_CONNECTION_MAX));
    let svc = MetaServiceServer::from_arc(server.clone())
        .max_decoding_message_size(MESSAGE_BYTES_MAX)
        .max_encoding_message_size(MESSAGE_BYTES_MAX);
    let site =
        strait_proto::site::site_service_server::SiteServiceServer::new(crate::site::PrimarySite {
            engine: engine.clone(),
            replicator: cfg.replicator.clone(),
            gc: gc_handle,
            shipped: shipped.clone(),
            fence,
            handover,
            epoch: cfg.epoch,
        })
        .max_decoding_message_size(MESSAGE_BYTES_MAX)
        .max_encoding_message_size(MESSAGE_BYTES_MAX);

    // request records past the retry horizon
    if !cfg.read_only {
        workers.spawn(
            "request-sweep",
            &stop,
            sweep_request_records(engine.clone(), stop.clone(), metrics.clone()),
        );
    }

    // sessions whose mounts went silent: close them (locks, unlinked open files)
    let timeout = Duration::from_millis(cfg.site.session_timeout_ms);
    workers.spawn(
        "session-expiry",
        &stop,
        expire_sessions(server.clone(), timeout, stop.clone(), metrics.clone()),
    );

    let mut metrics_addr = None;
    if !cfg.metrics_listen.is_empty() {
        let l = tokio::net::TcpListener::bind(&cfg.metrics_listen)
            .await
            .with_context(|| format!("listen on {} for metrics", cfg.metrics_listen))?;
        metrics_addr = l.local_addr().ok();
        let (m, e, e2) = (metrics.clone(), engine.clone(), engine.clone());
        let (fenced, w) = (shipped.clone(), workers.clone());
        workers.spawn(
            "metrics-http",
            &stop,
            metrics::serve(
                l,
                move || render(m.clone(), e.clone()),
                move || health(e2.clone(), fenced.clone(), w.clone()),
                stop.clone(),
            ),
        );
    }

    tokio::spawn(wait_for_signal(stop.clone()));
    // one line on stdout, for scripts and tests that wait for the daemon
    println!(
        "strait primary: serving {} ({}) on {addr} ({tls}){}",
        format.name,
        cfg.meta_url,
        metrics_addr
            .map(|a| format!(", metrics on http://{a}/metrics"))
            .unwrap_or_default()
    );
    tracing::info!(
        "serving {} on {addr} ({tls}) with {} serving threads; sessions time out after {timeout:?}",
        format.name,
        cfg.resolved_serve_threads()
    );

    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let s2 = stop.clone();
    let serve = builder
        .add_service(svc)
        .add_service(site)
        .serve_with_incoming_shutdown(incoming, async move { s2.cancelled().await });
    // after the stop signal, calls in flight get SHUTDOWN_GRACE to finish; idle mounts do not
    // answer the GOAWAY until their next call, so the server is not waited for beyond that
    tokio::select! {
        r = serve => r.context("serve the metadata service")?,
        _ = async { stop.cancelled().await; tokio::time::sleep(SHUTDOWN_GRACE).await } => {
            tracing::info!("closing the connections still open after {SHUTDOWN_GRACE:?}");
        }
    }
    stop.cancel();
    if let Some(mut rx) = shipped {
        let e = engine.clone();
        if let Ok(Ok(latest)) = tokio::task::spawn_blocking(move || e.kv().last_version()).await {
            match crate::ship::fence::wait_committed(&mut rx, latest, SHIP_DRAIN).await {
                Ok(()) => tracing::info!("the replicator holds every version up to {latest}"),
                Err(why) => tracing::warn!(
                    "stopping with versions the replicator does not hold yet ({why}); they are \
                     in the outbox and are shipped at the next start"
                ),
            }
        }
    }
    ship_stop.cancel();
    workers.shutdown(WORKERS_STOP_WITHIN).await;
    let e = engine.clone();
    tokio::task::spawn_blocking(move || e.kv().sync())
        .await
        .context("sync the metadata engine")??;
    tracing::info!("stopped; every acknowledged change is on disk");
    Ok(())
}

/// `/metrics`: every metric, with the newest version read from the engine.
async fn render(metrics: Arc<Metrics>, engine: Arc<Meta>) -> String {
    let read = tokio::task::spawn_blocking(move || {
        let kv = engine.kv();
        Ok::<_, strait_fs_core::Error>((
            kv.last_version()?,
            strait_fs_core::meta::requests::applied_twice(kv.as_ref())?,
            kv.memory(),
        ))
    })
    .await;
    if let Ok(Ok((v, twice, memory))) = read {
        metrics.version.set(v.0 as i64);
        metrics.requests_applied_twice.set(twice);
        metrics.note_memory(&memory);
    }
    metrics.render()
}

/// `/health`: healthy when the engine answers a read and this primary is not fenced (a
/// fenced one is no longer the file system's primary: it serves no one well).
async fn health(
    engine: Arc<Meta>,
    shipped: Option<tokio::sync::watch::Receiver<crate::ship::shipper::Shipped>>,
    workers: Workers,
) -> (StatusCode, String) {
    let (code, text) = engine_health(engine, shipped).await;
    (
        code,
        text + &strait_server::workers::health_lines(&workers.statuses()),
    )
}

/// The first line of `/health`: the engine's answer, or why this primary is fenced.
async fn engine_health(
    engine: Arc<Meta>,
    shipped: Option<tokio::sync::watch::Receiver<crate::ship::shipper::Shipped>>,
) -> (StatusCode, String) {
    if let Some(why) = shipped.and_then(|s| s.borrow().fenced.clone()) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("fenced: {why}; this primary takes no changes (rejoin it as a mirror)\n"),
        );
    }
    match tokio::task::spawn_blocking(move || engine.getattr(ROOT_INO)).await {
        Ok(Ok(_)) => (StatusCode::OK, "ok\n".to_string()),
        Ok(Err(err)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the metadata engine fails: {err}\n"),
        ),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the engine check did not finish\n".to_string(),
        ),
    }
}
