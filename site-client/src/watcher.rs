//! The watcher: a thread that follows the daemon's Watch stream into the mount's
//! [`MetaCache`] (see `meta_cache.rs`), opening it again when it breaks.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use strait_fs_core::error::{Error, Result};
use strait_proto::meta as w;
use strait_proto::meta::meta_service_client::MetaServiceClient;
use tonic::Code;

use crate::meta_cache::MetaCache;
use crate::remote_meta::RemoteMeta;

/// Waits before opening the stream again after it broke: first, and at most.
const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(2);
/// How often a daemon that has no change stream is asked again.
const UNIMPLEMENTED_RETRY: Duration = Duration::from_secs(30);

impl RemoteMeta {
    /// Start following the daemon's changes (once per client).
    pub(crate) fn start_watcher(&self) -> Result<()> {
        if !self.opts.keep_names || self.watching.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let endpoint = self.endpoint.clone();
        let stamp = self.stamp.clone();
        let cache = self.cache.clone();
        let stop = self.watch_stop.clone();
        let target = self.target.clone();
        std::thread::Builder::new()
            .name("strait-watch".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::warn!("cannot start the change stream's runtime: {e}; every lookup asks the daemon");
                        return;
                    }
                };
                rt.block_on(follow(endpoint, stamp, cache, stop, target));
            })
            .map_err(|e| Error::io("start the change stream's thread", e))?;
        Ok(())
    }

    /// Stop following (at unmount).
    pub(crate) fn stop_watcher(&self) {
        self.watch_stop.store(true, Ordering::Release);
        self.cache.closed();
    }
}

async fn follow(
    endpoint: tonic::transport::Endpoint,
    stamp: crate::stamp::Stamp,
    cache: Arc<MetaCache>,
    stop: Arc<AtomicBool>,
    target: String,
) {
    // a stream lives as long as the mount: no per-call deadline
    let channel = endpoint
        .timeout(Duration::from_secs(3600 * 24 * 365))
        .connect_lazy();
    let mut wait = RETRY_MIN;
    let mut warned = false;
    let mut quiet = false;
    while !stop.load(Ordering::Acquire) {
        let mut client = MetaServiceClient::with_interceptor(channel.clone(), stamp.clone())
            .max_decoding_message_size(strait_proto::limits::META_MESSAGE_BYTES_MAX);
        match client.watch(w::WatchRequest {}).await {
            Ok(stream) => {
                let mut stream = stream.into_inner();
                let mut first = true;
                loop {
                    if stop.load(Ordering::Acquire) {
                        cache.closed();
                        return;
                    }
                    // a heartbeat comes every 250 ms: a longer silence is a stream gone
                    let next =
                        tokio::time::timeout(crate::meta_cache::LIVE_FOR, stream.message()).await;
                    let batch = match next {
                        Ok(Ok(Some(b))) => b,
                        Ok(Ok(None)) | Err(_) => break,
                        Ok(Err(s)) => {
                            tracing::debug!("the change stream ended: {}", s.message());
                            break;
                        }
                    };
                    if first && !batch.reset {
                        // every stream starts with a reset; one that does not is not ours
                        break;
                    }
                    if first && warned {
                        tracing::info!("following the changes of {target} again");
                        warned = false;
                    }
                    first = false;
                    wait = RETRY_MIN;
                    apply(&cache, batch);
                }
                cache.closed();
            }
            Err(s) if s.code() == Code::Unimplemented => {
                if !quiet {
                    tracing::info!(
                        "{target} does not tell its mounts what changes ({}): every lookup and \
                         stat asks it",
                        s.message()
                    );
                    quiet = true;
                }
                cache.closed();
                // the daemon behind the address may change (a switchover): ask again later
                sleep_unless_stopped(UNIMPLEMENTED_RETRY, &stop).await;
                continue;
            }
            Err(s) => {
                cache.closed();
                if !warned {
                    tracing::debug!(
                        "cannot follow the changes of {target}: {}; trying again",
                        crate::call::describe(&s)
                    );
                    warned = true;
                }
            }
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(RETRY_MAX);
    }
    cache.closed();
}

/// Sleep `d`, waking early (every 250 ms) to see whether the mount is going away.
async fn sleep_unless_stopped(d: Duration, stop: &AtomicBool) {
    let end = tokio::time::Instant::now() + d;
    while tokio::time::Instant::now() < end && !stop.load(Ordering::Acquire) {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Take one batch into the cache; a batch that does not decode forgets everything.
fn apply(cache: &MetaCache, b: w::WatchBatch) {
    if b.reset {
        cache.reset(b.version);
        return;
    }
    let mut attrs = Vec::with_capacity(b.attrs.len());
    for c in b.attrs {
        let a = match c.attr {
            Some(a) => match strait_proto::attr_from_wire(Some(a)) {
                Ok(a) => Some(a),
                Err(e) => {
                    tracing::warn!("the change stream sent invalid attributes: {}", e.0);
                    cache.reset(b.version);
                    return;
                }
            },
            None => None,
        };
        attrs.push((c.ino, a));
    }
    cache.apply(
        b.version,
        b.latest,
        attrs,
        b.entries.into_iter().map(|e| (e.parent, e.name, e.ino)),
    );
}
