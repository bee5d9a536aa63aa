fn main() -> Result<(), Box<dyn std::error::Error>> {
    // protoc comes from the vendored crate, so a fresh machine needs no system package
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure()
        // a block's bytes go from the object store to the wire without a copy
        .bytes(".strait.meta.v1.FetchBlockReply.data")
        .compile_with_config(
            config,
            &[
                "proto/meta.proto",
                "proto/site.proto",
                "proto/replicator.proto",
            ],
            &["proto"],
        )?;
    println!("cargo:rerun-if-changed=proto/meta.proto");
    println!("cargo:rerun-if-changed=proto/site.proto");
    println!("cargo:rerun-if-changed=proto/replicator.proto");
    Ok(())
}
