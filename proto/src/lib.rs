//! strait's wire protocol: the generated tonic/prost code for `proto/*.proto` and the
//! conversions between wire and domain types. No logic lives here.

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

mod convert;

/// The largest HTTP/2 frame strait's gRPC clients and servers accept
/// (`SETTINGS_MAX_FRAME_SIZE`). At h2's default, 16 KiB, a 128 KiB block is sent as 8 frames,
/// each its own `writev`, and read on the other side 8 KiB at a time: on loopback and LANs
/// that costs CPU, not bandwidth. A frame is never bigger than the message it carries.
pub const HTTP2_FRAME_BYTES: u32 = 1 << 20;

pub use convert::*;
