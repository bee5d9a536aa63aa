//! strait's wire protocol: the generated tonic/prost code for `proto/*.proto` and the
//! conversions between wire and domain types. No logic lives here.

pub mod meta {
    //! `strait.meta.v1`: the metadata service of a site daemon.
    #![allow(clippy::all)]
    tonic::include_proto!("strait.meta.v1");
}

mod convert;

pub use convert::*;
