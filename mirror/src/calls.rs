//! What a mirror does with each call of the metadata service: the one table the
//! [`crate::router::Router`] decides by. A test holds it to the `.proto`, so a method added
//! there cannot reach a mirror unclassified.

/// How a mirror answers one method of `strait.meta.v1.MetaService`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Reads metadata: answered from the mirror's own while it is inside its staleness
    /// window; outside it, as the policy says (forward, wait or serve stale).
    Read,
    /// Changes metadata: sent to the primary under `writes = "forward"` (the mirror's
    /// read-only engine answers EROFS under `writes = "refuse"`).
    Mutation,
    /// The region's own and answered here whatever the lag: sessions, opening and releasing
    /// (the region counts its handles), locks, sync, fetching blocks into the region, and the
    /// change stream (which ends while the mirror is outside its window).
    /// (`Open` still obeys the window for the attributes it answers: see the router.)
    Local,
}

/// Every method of the metadata service and its class.
pub const METHODS: [(&str, Class); 34] = [
    ("OpenSession", Class::Local),
    ("Heartbeat", Class::Local),
    ("CloseSession", Class::Local),
    ("Lookup", Class::Read),
    ("GetAttr", Class::Read),
    ("Access", Class::Read),
    ("ReadLink", Class::Read),
    ("ReadDir", Class::Read),
    ("StatFs", Class::Read),
    ("SetAttr", Class::Mutation),
    ("MkNod", Class::Mutation),
    ("MkDir", Class::Mutation),
    ("Create", Class::Mutation),
    ("Symlink", Class::Mutation),
    ("Link", Class::Mutation),
    ("Unlink", Class::Mutation),
    ("RmDir", Class::Mutation),
    ("Rename", Class::Mutation),
    ("Open", Class::Local),
    ("Release", Class::Local),
    ("ReadChunk", Class::Read),
    ("WriteSlice", Class::Mutation),
    ("CompactChunk", Class::Mutation),
    ("AllocSliceIds", Class::Mutation),
    ("GetXattr", Class::Read),
    ("ListXattr", Class::Read),
    ("SetXattr", Class::Mutation),
    ("RemoveXattr", Class::Mutation),
    ("Flock", Class::Local),
    ("GetLk", Class::Local),
    ("SetLk", Class::Local),
    ("Sync", Class::Local),
    ("FetchBlock", Class::Local),
    ("Watch", Class::Local),
];

/// The class of `method` (the last segment of the call's path), None for a method the
/// service does not have.
pub fn classify(method: &str) -> Option<Class> {
    METHODS.iter().find(|(m, _)| *m == method).map(|&(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// The `.proto` files of the site daemons' services.
    const PROTOS: [(&str, &str); 2] = [
        ("meta.proto", include_str!("../../proto/proto/meta.proto")),
        ("site.proto", include_str!("../../proto/proto/site.proto")),
    ];

    /// The `rpc Name(` lines of `service NAME { ... }` in `proto`.
    fn rpcs_of(proto: &str, service: &str) -> Vec<String> {
        let mut inside = false;
        let mut names = vec![];
        for line in proto.lines().map(str::trim) {
            if !inside {
                inside = line
                    .strip_prefix("service ")
                    .is_some_and(|rest| rest.trim_end_matches('{').trim() == service);
                continue;
            }
            if line.starts_with('}') {
                inside = false;
                continue;
            }
            if let Some(rest) = line.strip_prefix("rpc ") {
                let name = rest.split('(').next().unwrap_or("").trim();
                names.push(name.to_string());
            }
        }
        names
    }

    #[test]
    fn every_method_of_the_metadata_service_is_classified() {
        // the methods the .proto files declare for the metadata service
        let declared: BTreeSet<String> = PROTOS
            .iter()
            .flat_map(|(_, text)| rpcs_of(text, "MetaService"))
            .collect();
        assert!(
            declared.len() >= 30,
            "the .proto parse found only {declared:?}"
        );
        let table: BTreeSet<String> = METHODS.iter().map(|(m, _)| m.to_string()).collect();
        assert_eq!(table.len(), METHODS.len(), "a method is in the table twice");
        // a method declared but not classified would reach the mirror's router unknown
        let unclassified: Vec<_> = declared.difference(&table).collect();
        assert!(
            unclassified.is_empty(),
            "methods of MetaService no class is given for in mirror/src/calls.rs: {unclassified:?}"
        );
        // a table entry no method has is a name that went stale
        let stale: Vec<_> = table.difference(&declared).collect();
        assert!(
            stale.is_empty(),
            "classified methods MetaService does not declare: {stale:?}"
        );
    }

    #[test]
    fn the_classes_are_as_the_router_needs_them() {
        assert_eq!(classify("GetAttr"), Some(Class::Read));
        assert_eq!(classify("ReadChunk"), Some(Class::Read));
        assert_eq!(classify("WriteSlice"), Some(Class::Mutation));
        assert_eq!(classify("Rename"), Some(Class::Mutation));
        // handles and locks are the region's own
        assert_eq!(classify("Open"), Some(Class::Local));
        assert_eq!(classify("SetLk"), Some(Class::Local));
        assert_eq!(classify("NoSuchMethod"), None);
    }

    #[test]
    fn the_parser_reads_a_service_block() {
        let text = "service A {\n  rpc One(X) returns (Y);\n  // rpc Two(X)\n  rpc Three (X) returns (stream Y);\n}\nservice B {\n  rpc Four(X) returns (Y);\n}\n";
        assert_eq!(rpcs_of(text, "A"), vec!["One", "Three"]);
        assert_eq!(rpcs_of(text, "B"), vec!["Four"]);
    }
}
