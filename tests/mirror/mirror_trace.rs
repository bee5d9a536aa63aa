//! One OpenTelemetry trace follows a write made at a mirror's mount across the regions: the
//! mount's call, the mirror forwarding it, the primary's call, the shipper's append of its
//! record, the replicator's append (and its Raft commit), and the apply at the mirror that
//! made the write visible there. Every process of a three-region `dev up` (`replicated`
//! durability, 5 ms one way) exports to a small OTLP collector in the test; the test finds
//! the trace of one create at region B's mount, checks each link of the chain, and prints the
//! trace as a tree with span durations.

use std::time::Duration;

use crate::support::otlp::{tree, Collector, Span};
use crate::support::wait_until;
use strait_devkit::cluster::ClusterConfig;

/// Whether `ancestor` is `s`'s parent, or its parent's, and so on.
fn descends(spans: &[Span], s: &Span, ancestor: &Span) -> bool {
    let mut at = s;
    for _ in 0..32 {
        if at.parent_id == ancestor.span_id {
            return true;
        }
        match spans
            .iter()
            .find(|p| p.trace_id == at.trace_id && p.span_id == at.parent_id)
        {
            Some(p) => at = p,
            None => return false,
        }
    }
    false
}

#[test]
fn a_write_at_a_mirrors_mount_is_one_trace_through_the_primary_and_the_replicator_to_the_apply() {
    if !crate::support::require_fuse() {
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let collector = Collector::default();
    let endpoint = collector.serve(&rt);
    let work = tempfile::tempdir().unwrap();
    let cfg = ClusterConfig {
        delay_ms: 5,
        witness: true,
        primary_args: vec!["--durability".into(), "replicated".into()],
        mirror_args: vec!["--promotion-durability".into(), "replicated".into()],
        // every daemon, node and mount the cluster starts exports its spans there
        env: vec![("STRAIT_OTLP_ENDPOINT".into(), endpoint)],
        ..ClusterConfig::new(crate::support::strait_bin(), work.path().join("dev"))
    };
    let (cluster, mounts) = crate::support::dev_up::start_cluster(&cfg, &rt);
    let mb = cluster
        .topology()
        .mount_b
        .clone()
        .expect("region B's mount");
    std::fs::write(mb.join("traced"), b"a write at the mirror").unwrap();

    // each process exports its spans every 5 s: wait until the whole chain is in
    let (spans, forward) = wait_until(
        "no trace of a Create forwarded by the mirror holds the whole chain",
        Duration::from_secs(30),
        || {
            let spans = collector.spans();
            let found = named(&spans, "strait-mirror", "forward")
                .into_iter()
                .filter(|f| f.attributes.iter().any(|a| a == "method=Create"))
                .map(|f| chain(&spans, &f).map(|()| f))
                .collect::<Vec<_>>();
            if let Some(Ok(f)) = found.iter().find(|r| r.is_ok()) {
                let f = f.clone();
                return Ok((spans, f));
            }
            Err(format!(
                "{:?}; {} spans collected, by service and name: {:?}",
                found
                    .iter()
                    .filter_map(|r| r.as_ref().err())
                    .collect::<Vec<_>>(),
                spans.len(),
                spans
                    .iter()
                    .map(|s| format!("{}/{}", s.service, s.name))
                    .collect::<std::collections::BTreeSet<_>>()
            ))
        },
    );
    drop(mounts);
    drop(cluster);
    eprintln!(
        "the trace of a create at region B's mount:\n{}",
        tree(&spans, &forward.trace_id)
    );
}

fn named(spans: &[Span], service: &str, name: &str) -> Vec<Span> {
    spans
        .iter()
        .filter(|s| s.service.contains(service) && s.name == name)
        .cloned()
        .collect()
}

/// Whether the trace of the mirror's `forward` span holds the whole chain: the mount's call
/// above it; the primary's call under it, the shipper's append under that, the replicator's
/// append and Raft commit under that; the apply at the mirror under the forward span, ended
/// after the commit began. Else what is missing.
fn chain(spans: &[Span], forward: &Span) -> Result<(), String> {
    let trace: Vec<Span> = spans
        .iter()
        .filter(|s| s.trace_id == forward.trace_id)
        .cloned()
        .collect();
    let one = |service: &str, name: &str| -> Result<Span, String> {
        named(&trace, service, name)
            .into_iter()
            .next()
            .ok_or(format!("no {service} {name} span"))
    };
    let mount = trace
        .iter()
        .find(|s| s.span_id == forward.parent_id)
        .ok_or("the forward span's parent is not in the trace")?;
    if !mount.service.contains("strait-mount") {
        return Err(format!("the forward span's parent is {mount:?}"));
    }
    let rpc = named(&trace, "strait-primary", "rpc")
        .into_iter()
        .find(|s| s.parent_id == forward.span_id && s.attributes.iter().any(|a| a == "op=create"))
        .ok_or("no primary create span under the forward span")?;
    let ship = one("strait-primary", "ship")?;
    if !descends(&trace, &ship, &rpc) {
        return Err("the ship span is not under the primary's call".into());
    }
    let append = one("strait-replicator", "append")?;
    if append.parent_id != ship.span_id {
        return Err("the replicator's append is not under the ship span".into());
    }
    let commit = one("strait-replicator", "raft_commit")?;
    if commit.parent_id != append.span_id {
        return Err("raft_commit is not under the append".into());
    }
    let apply = one("strait-mirror", "apply")?;
    if apply.parent_id != forward.span_id {
        return Err("the apply is not under the forward span".into());
    }
    if apply.end_ns < commit.start_ns {
        return Err("the apply at the mirror ended before the replicator's commit began".into());
    }
    Ok(())
}
