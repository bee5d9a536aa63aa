//! Which roles may call each method of every strait service: one table, for every daemon.
//!
//! A method missing from the table is refused to everyone (PERMISSION_DENIED), so a method
//! added to a `.proto` without a line here cannot be called until someone decides who may;
//! a unit test reads the `.proto` files and fails until every method has its line.

use crate::role::{Role, Roles};

const MOUNT: Role = Role::Mount;
const MIRROR: Role = Role::Mirror;
const PRIMARY: Role = Role::Primary;
const ADMIN: Role = Role::Admin;
const PEER: Role = Role::Peer;

/// Every role: for calls that only read what a daemon says about itself.
const ANYONE: Roles = Roles::of(&[MOUNT, MIRROR, PRIMARY, ADMIN, PEER]);
/// The metadata service: a region's mounts, a mirror forwarding its region's calls to the
/// primary, and operators' tools (`strait status`, `fsck`).
const META: Roles = Roles::of(&[MOUNT, MIRROR, ADMIN]);

const META_SERVICE: &str = "strait.meta.v1.MetaService";
const SITE_SERVICE: &str = "strait.site.v1.SiteService";
const REPLICATOR: &str = "strait.replicator.v1.Replicator";

/// `(service, method, roles)`.
const TABLE: &[(&str, &str, Roles)] = &[
    // sessions
    (META_SERVICE, "OpenSession", META),
    (META_SERVICE, "Heartbeat", META),
    (META_SERVICE, "CloseSession", META),
    // reads
    (META_SERVICE, "Lookup", META),
    (META_SERVICE, "GetAttr", META),
    (META_SERVICE, "Access", META),
    (META_SERVICE, "ReadLink", META),
    (META_SERVICE, "ReadDir", META),
    (META_SERVICE, "StatFs", META),
    // mutations (at a mirror: forwarded to the primary with the mirror's credentials)
    (META_SERVICE, "SetAttr", META),
    (META_SERVICE, "MkNod", META),
    (META_SERVICE, "MkDir", META),
    (META_SERVICE, "Create", META),
    (META_SERVICE, "Symlink", META),
    (META_SERVICE, "Link", META),
    (META_SERVICE, "Unlink", META),
    (META_SERVICE, "RmDir", META),
    (META_SERVICE, "Rename", META),
    (META_SERVICE, "Open", META),
    (META_SERVICE, "Release", META),
    (META_SERVICE, "ReadChunk", META),
    (META_SERVICE, "WriteSlice", META),
    (META_SERVICE, "CompactChunk", META),
    (META_SERVICE, "AllocSliceIds", META),
    (META_SERVICE, "GetXattr", META),
    (META_SERVICE, "ListXattr", META),
    (META_SERVICE, "SetXattr", META),
    (META_SERVICE, "RemoveXattr", META),
    (META_SERVICE, "Flock", META),
    (META_SERVICE, "GetLk", META),
    (META_SERVICE, "SetLk", META),
    (META_SERVICE, "Sync", META),
    (META_SERVICE, "FetchBlock", Roles::of(&[MOUNT, MIRROR])),
    (META_SERVICE, "Watch", META),
    // between sites, and for operators
    (SITE_SERVICE, "Snapshot", Roles::of(&[MIRROR, ADMIN])),
    (SITE_SERVICE, "Digest", Roles::of(&[MIRROR, ADMIN])),
    (SITE_SERVICE, "Status", ANYONE),
    (SITE_SERVICE, "Pause", Roles::of(&[ADMIN])),
    (SITE_SERVICE, "Gc", Roles::of(&[ADMIN])),
    (SITE_SERVICE, "SweepOrphans", Roles::of(&[ADMIN])),
    (SITE_SERVICE, "Promote", Roles::of(&[ADMIN])),
    (SITE_SERVICE, "Handover", Roles::of(&[ADMIN])),
    (SITE_SERVICE, "Warmup", Roles::of(&[ADMIN])),
    // the change log
    (REPLICATOR, "Raft", Roles::of(&[PEER])),
    (REPLICATOR, "Append", Roles::of(&[PRIMARY])),
    (REPLICATOR, "Heartbeat", Roles::of(&[PRIMARY])),
    // raising the epoch fences the primary: the primary itself, or an operator failing over
    (REPLICATOR, "BumpEpoch", Roles::of(&[PRIMARY, ADMIN])),
    // the primary acks its own cursor (`@primary`); a mirror with a certificate only its own
    (REPLICATOR, "Ack", Roles::of(&[PRIMARY, MIRROR])),
    // a node relays its leader's records (peer); the primary reads back its own records
    (
        REPLICATOR,
        "Subscribe",
        Roles::of(&[MIRROR, PRIMARY, PEER, ADMIN]),
    ),
    (REPLICATOR, "SetRetention", Roles::of(&[ADMIN])),
    // an operator retiring a mirror, or a mirror promoted to primary dropping its own cursor
    (REPLICATOR, "ForgetMirror", Roles::of(&[PRIMARY, ADMIN])),
    (REPLICATOR, "Status", ANYONE),
    (REPLICATOR, "Init", Roles::of(&[ADMIN])),
    (REPLICATOR, "AddNode", Roles::of(&[ADMIN])),
    (REPLICATOR, "RemoveNode", Roles::of(&[ADMIN])),
];

/// The roles that may call the gRPC method at `path` (`/package.Service/Method`); none for a
/// path that names no method of strait's.
pub fn allowed(path: &str) -> Roles {
    let Some((service, method)) = path.strip_prefix('/').and_then(|p| p.split_once('/')) else {
        return Roles::NONE;
    };
    TABLE
        .iter()
        .find(|(s, m, _)| *s == service && *m == method)
        .map(|(_, _, r)| *r)
        .unwrap_or(Roles::NONE)
}

/// Every `(path, roles)` of the table, for documentation and for tests that probe each method.
pub fn methods() -> impl Iterator<Item = (String, Roles)> {
    TABLE.iter().map(|(s, m, r)| (format!("/{s}/{m}"), *r))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// `/package.Service/Method` of every rpc in `text`, a `.proto` file.
    fn rpcs(text: &str) -> Vec<String> {
        let mut package = String::new();
        let mut service = String::new();
        let mut out = Vec::new();
        for line in text.lines().map(str::trim) {
            if let Some(p) = line.strip_prefix("package ") {
                package = p.trim_end_matches(';').trim().to_string();
            } else if let Some(s) = line.strip_prefix("service ") {
                service = s.trim_end_matches('{').trim().to_string();
            } else if let Some(r) = line.strip_prefix("rpc ") {
                let name = r.split('(').next().unwrap_or_default().trim();
                out.push(format!("/{package}.{service}/{name}"));
            }
        }
        out
    }

    #[test]
    fn every_method_of_every_proto_has_its_roles_and_no_line_is_stale() {
        // cargo test gives the checkout's directory at run time; the one built in may be
        // another checkout's that shared the target directory
        let root = std::env::var_os("CARGO_MANIFEST_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into());
        let dir = root.join("../proto/proto");
        let mut in_protos = BTreeSet::new();
        for f in std::fs::read_dir(&dir).unwrap() {
            let p = f.unwrap().path();
            if p.extension().is_some_and(|e| e == "proto") {
                in_protos.extend(rpcs(&std::fs::read_to_string(&p).unwrap()));
            }
        }
        assert!(in_protos.len() > 40, "found only {in_protos:?}");
        let in_table: BTreeSet<String> = methods().map(|(p, _)| p).collect();
        let missing: Vec<_> = in_protos.difference(&in_table).collect();
        let stale: Vec<_> = in_table.difference(&in_protos).collect();
        assert!(missing.is_empty(), "methods without roles: {missing:?}");
        assert!(stale.is_empty(), "lines for no method: {stale:?}");
        for (p, r) in methods() {
            assert!(!r.is_empty(), "{p} admits no role");
        }
    }

    #[test]
    fn the_table_keeps_each_role_to_its_own_calls() {
        let may = |path: &str, r: Role| allowed(path).contains(r);
        assert!(may("/strait.meta.v1.MetaService/Create", Role::Mount));
        assert!(!may("/strait.site.v1.SiteService/Pause", Role::Mount));
        assert!(!may("/strait.site.v1.SiteService/Snapshot", Role::Mount));
        assert!(!may("/strait.site.v1.SiteService/Gc", Role::Mirror));
        assert!(may("/strait.site.v1.SiteService/Gc", Role::Admin));
        assert!(!may("/strait.replicator.v1.Replicator/Append", Role::Admin));
        assert!(!may(
            "/strait.replicator.v1.Replicator/Append",
            Role::Mirror
        ));
        assert!(may(
            "/strait.replicator.v1.Replicator/Append",
            Role::Primary
        ));
        assert!(!may("/strait.replicator.v1.Replicator/Raft", Role::Admin));
        assert!(!may(
            "/strait.replicator.v1.Replicator/AddNode",
            Role::Primary
        ));
        assert!(!may(
            "/strait.replicator.v1.Replicator/Subscribe",
            Role::Mount
        ));
        assert!(may("/strait.replicator.v1.Replicator/Status", Role::Mount));
        assert!(allowed("/strait.replicator.v1.Replicator/Nope").is_empty());
        assert!(allowed("garbage").is_empty());
        assert!(allowed("/x").is_empty());
    }
}
