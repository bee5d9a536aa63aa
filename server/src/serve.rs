//! How a site daemon serves its gRPC services: TLS from its settings, and the guard
//! (`strait_auth::Guard`) in front of every service, which refuses a call whose credentials do
//! not name a role its method admits before the call reaches the service.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use strait_auth::{Guard, Refusal, Security};
use tonic::transport::Server;
use tower::layer::util::{Identity, Stack};

use crate::config::SiteConfig;
use crate::metrics::Metrics;

/// A server builder with the guard in front of every service added to it.
pub type Guarded = Server<Stack<Guard, Identity>>;

/// The server builder of a site daemon named `daemon` (`primary`, `mirror region-b`): TCP
/// settings, TLS when the daemon has a certificate, and the guard. Returns it with how the
/// link reads in a log line (`TLS, client certificates required`, `plain text`).
pub fn server(
    cfg: &SiteConfig,
    sec: &Security,
    daemon: &str,
    metrics: Arc<Metrics>,
) -> Result<(Guarded, &'static str)> {
    let tokens = cfg.accepted_tokens(sec)?;
    if cfg.one_token_for_every_role(sec) {
        tracing::warn!(
            "one token serves every role here: a mount's token can also pause a mirror, stream \
             a snapshot or run GC; give [tokens] mount, mirror and admin of their own \
             (docs/security.md)"
        );
    }
    let guard = Guard::counted(daemon, tokens, move |why| match why {
        Refusal::Unauthenticated => metrics.unauthenticated.inc(),
        Refusal::PermissionDenied => metrics.permission_denied.inc(),
    });
    // TCP keepalive finds dead peers; HTTP/2 pings would close the idle connections of
    // mounts, whose connection tasks run only while a call is made
    let mut builder = Server::builder()
        .tcp_keepalive(Some(Duration::from_secs(60)))
        .tcp_nodelay(true)
        .max_frame_size(strait_proto::HTTP2_FRAME_BYTES);
    if let Some(tls) = sec.server_tls()? {
        builder = builder.tls_config(tls).context("TLS settings")?;
    }
    Ok((builder.layer(guard), sec.describe()))
}
