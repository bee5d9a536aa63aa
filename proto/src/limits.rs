//! How big strait's gRPC messages and batches may be, in one place: a server and its clients
//! read the same bound, and a reader finds every limit on the wire here.
//!
//! A limit on a message (`*_MESSAGE_BYTES_MAX`) is what tonic is told to decode and encode
//! (`max_decoding_message_size`, `max_encoding_message_size`); a limit on a batch
//! (`APPEND_*_MAX`) is checked by the replicator on every append and respected by its callers.

/// The largest HTTP/2 frame strait's gRPC clients and servers accept
/// (`SETTINGS_MAX_FRAME_SIZE`). At h2's default, 16 KiB, a 128 KiB block is sent as 8 frames,
/// each its own `writev`, and read on the other side 8 KiB at a time: on loopback and LANs
/// that costs CPU, not bandwidth. A frame is never bigger than the message it carries.
pub const HTTP2_FRAME_BYTES: u32 = 1 << 20;

/// Largest message of a site daemon's metadata and site services, either way (a directory
/// page, a snapshot chunk, a digest).
pub const META_MESSAGE_BYTES_MAX: usize = 64 << 20;

/// Largest message a mount's connection to its site daemon sends or receives (a block fetched
/// through the site daemon, with its envelope).
pub const BLOCK_MESSAGE_BYTES_MAX: usize = 80 << 20;

/// Largest message a client of the replicator (the primary's shipper, a mirror, the CLI)
/// sends or receives: an append of many records, a batch of a subscription.
pub const REPLICATOR_MESSAGE_BYTES_MAX: usize = 96 << 20;

/// Largest message a replicator node receives when it relays its leader's subscription
/// (batches of at most `APPEND_BYTES_MAX`-sized records).
pub const RELAY_MESSAGE_BYTES_MAX: usize = 64 << 20;

/// Largest message between replicator nodes, and any message a replicator node accepts: a
/// snapshot chunk or a batch of Raft entries.
pub const RAFT_MESSAGE_BYTES_MAX: usize = 256 << 20;

/// Most records in one append.
pub const APPEND_RECORDS_MAX: usize = 65_536;

/// Most bytes of records in one append (their sum, and so the largest record). An append is
/// one Raft entry, and each replication call must finish within the heartbeat interval (see
/// the replicator's `node::PAYLOAD_ENTRIES_MAX`).
pub const APPEND_BYTES_MAX: usize = 4 << 20;

/// Largest request of a metadata call that names inodes, names or a lock (with the caller's
/// supplementary groups, at most 65,536 of them): every metadata method but `OpenSession` (its
/// list of open inodes) and `CompactChunk` (a chunk's slice lists), which take
/// [`META_MESSAGE_BYTES_MAX`].
pub const META_CALL_REQUEST_BYTES_MAX: usize = 1 << 20;

/// Largest request of a control call: the site service's (snapshot, digest, status, pause,
/// GC) and the replicator's other than `Raft` and `Append` (heartbeat, epoch, ack, subscribe,
/// retention, membership, status).
pub const CONTROL_REQUEST_BYTES_MAX: usize = 64 << 10;

/// Largest `Append` request: [`APPEND_BYTES_MAX`] of records, with each record's field header
/// (at most 8 bytes for [`APPEND_RECORDS_MAX`] records) and the epoch and first version.
pub const APPEND_REQUEST_BYTES_MAX: usize = APPEND_BYTES_MAX + 8 * APPEND_RECORDS_MAX + 64;

/// The largest request the gRPC method at `path` (`/package.Service/Method`) accepts, counted
/// as its bytes arrive, before anything is decoded: the guard in front of every strait server
/// refuses a request past it (RESOURCE_EXHAUSTED) without reading the rest.
pub fn request_bytes_max(path: &str) -> usize {
    let (service, method) = path
        .strip_prefix('/')
        .and_then(|p| p.split_once('/'))
        .unwrap_or(("", ""));
    match (service, method) {
        ("strait.meta.v1.MetaService", "OpenSession" | "CompactChunk") => META_MESSAGE_BYTES_MAX,
        ("strait.meta.v1.MetaService", _) => META_CALL_REQUEST_BYTES_MAX,
        ("strait.replicator.v1.Replicator", "Raft") => RAFT_MESSAGE_BYTES_MAX,
        ("strait.replicator.v1.Replicator", "Append") => APPEND_REQUEST_BYTES_MAX,
        _ => CONTROL_REQUEST_BYTES_MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_method_has_its_request_limit() {
        let m = |s: &str| request_bytes_max(s);
        assert_eq!(
            m("/strait.meta.v1.MetaService/Lookup"),
            META_CALL_REQUEST_BYTES_MAX
        );
        assert_eq!(
            m("/strait.meta.v1.MetaService/OpenSession"),
            META_MESSAGE_BYTES_MAX
        );
        assert_eq!(
            m("/strait.replicator.v1.Replicator/Append"),
            APPEND_REQUEST_BYTES_MAX
        );
        assert_eq!(
            m("/strait.replicator.v1.Replicator/Raft"),
            RAFT_MESSAGE_BYTES_MAX
        );
        assert_eq!(
            m("/strait.replicator.v1.Replicator/Ack"),
            CONTROL_REQUEST_BYTES_MAX
        );
        assert_eq!(
            m("/strait.site.v1.SiteService/Pause"),
            CONTROL_REQUEST_BYTES_MAX
        );
        assert_eq!(m("garbage"), CONTROL_REQUEST_BYTES_MAX);
        // an append of the largest batch fits, with its envelope
        const {
            assert!(APPEND_REQUEST_BYTES_MAX < REPLICATOR_MESSAGE_BYTES_MAX);
            assert!(APPEND_REQUEST_BYTES_MAX > APPEND_BYTES_MAX + 5 * APPEND_RECORDS_MAX);
        }
    }
}
