//! The one signal wait of strait's daemons.

use tokio_util::sync::CancellationToken;

/// Wait for SIGTERM or SIGINT (or for `stop` to fire elsewhere), then fire `stop`.
pub async fn wait_for_signal(stop: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot listen for signals; stop the daemon with SIGKILL");
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: finishing the calls in flight, then stopping"),
        _ = int.recv() => tracing::info!("SIGINT: finishing the calls in flight, then stopping"),
        _ = stop.cancelled() => {}
    }
    stop.cancel();
}
