//! strait's wire protocol: the generated tonic/prost code for `proto/*.proto`, the limits on
//! its messages ([`limits`]) and the conversions between wire and domain types (feature
//! `fs-core`, on by default). No logic lives here.

pub mod meta {
    //! `strait.meta.v1`: the metadata service of a site daemon.
    #![allow(clippy::all)]
    tonic::include_proto!("strait.meta.v1");
}

pub mod site {
    //! `strait.site.v1`: what a site daemon tells other sites and operators about itself.
    #![allow(clippy::all)]
    tonic::include_proto!("strait.site.v1");
}

pub mod replicator {
    //! `strait.replicator.v1`: the change log's service, between replicator nodes and for the
    //! primary, the mirrors and operators.
    #![allow(clippy::all)]
    tonic::include_proto!("strait.replicator.v1");

    /// The metadata entry naming why an append was refused (`gap`, `overlap`, `stale-epoch`,
    /// `future-epoch`, `malformed`).
    pub const APPEND_HEADER: &str = "x-strait-append";
    /// The metadata entry naming the leader (`<id>@<address>`) on a call a follower cannot
    /// take.
    pub const LEADER_HEADER: &str = "x-strait-leader";
    /// The cursor through which the primary tells the replicator how far its own metadata
    /// is on stable storage (its commits are not synced one by one): the log keeps every
    /// record above it, so that a primary whose unsynced tail a power loss took can take it
    /// back from the log. No mirror may take this name (a mirror's id cannot start with `@`).
    pub const PRIMARY_CURSOR: &str = "@primary";
}

pub mod limits;

#[cfg(feature = "fs-core")]
mod convert;

pub use limits::HTTP2_FRAME_BYTES;

#[cfg(feature = "fs-core")]
pub use convert::*;

/// `text` followed by the chain of errors under it (`src` and its sources), each once: TLS
/// and connection failures hide their cause there (a status's message says "transport error"
/// where its source says "Connection refused").
pub fn with_causes(
    mut text: String,
    mut src: Option<&(dyn std::error::Error + 'static)>,
) -> String {
    while let Some(e) = src {
        let t = e.to_string();
        if !text.contains(&t) {
            text.push_str(": ");
            text.push_str(&t);
        }
        src = e.source();
    }
    text
}
