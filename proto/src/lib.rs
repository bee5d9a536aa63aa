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

pub use convert::*;
