//! Self-describing file contents. Every byte the workload writes belongs to a 64-byte record
//! that names the client and operation that wrote it and the offset it was written at, with a
//! CRC over the rest, so a reader can tell for any byte which write wrote it, or that no write
//! did (checker 5).
//!
//! Layout: `b"STRT"`, client (u32 LE), operation sequence number (u64 LE, from 1), offset in
//! the file (u64 LE), 36 filler bytes derived from the three, CRC32 of the first 60 bytes.
//! A record of 64 zero bytes is a hole (a file extended by truncate).

/// Size of one record; files are always a whole number of records long.
pub const RECORD: usize = 64;
const MAGIC: &[u8; 4] = b"STRT";

/// What one record of a file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    /// 64 zero bytes.
    Hole,
    /// Written by operation `seq` of `client`.
    Written { client: u32, seq: u64 },
}

/// Why some bytes are not a file the workload wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Garbage {
    /// The length is not a whole number of records.
    Length(usize),
    /// Record `index` is neither a hole nor a valid record written at its own offset.
    Record { index: usize, why: &'static str },
}

impl std::fmt::Display for Garbage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Garbage::Length(n) => write!(f, "{n} bytes is not a whole number of 64-byte records"),
            Garbage::Record { index, why } => {
                write!(f, "record {index} (bytes {}..): {why}", index * RECORD)
            }
        }
    }
}

fn filler(client: u32, seq: u64, offset: u64, out: &mut [u8]) {
    // xorshift64 seeded from the three values: cheap, and different for every record
    let mut x = (u64::from(client) << 40) ^ seq.rotate_left(17) ^ offset ^ 0x9e37_79b9_7f4a_7c15;
    for b in out.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}

/// `n` records written by operation `seq` of `client`, the first at byte `offset` of the
/// file (a multiple of [`RECORD`]).
pub fn records(client: u32, seq: u64, offset: u64, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n * RECORD];
    for (i, r) in out.chunks_exact_mut(RECORD).enumerate() {
        let at = offset + (i * RECORD) as u64;
        r[0..4].copy_from_slice(MAGIC);
        r[4..8].copy_from_slice(&client.to_le_bytes());
        r[8..16].copy_from_slice(&seq.to_le_bytes());
        r[16..24].copy_from_slice(&at.to_le_bytes());
        filler(client, seq, at, &mut r[24..60]);
        let crc = crc32fast::hash(&r[..60]);
        r[60..64].copy_from_slice(&crc.to_le_bytes());
    }
    out
}

/// Decode a whole file's contents, record by record.
pub fn decode(bytes: &[u8]) -> Result<Vec<Record>, Garbage> {
    if !bytes.len().is_multiple_of(RECORD) {
        return Err(Garbage::Length(bytes.len()));
    }
    let mut out = Vec::with_capacity(bytes.len() / RECORD);
    for (index, r) in bytes.chunks_exact(RECORD).enumerate() {
        if r.iter().all(|&b| b == 0) {
            out.push(Record::Hole);
            continue;
        }
        let bad = |why| Err(Garbage::Record { index, why });
        if &r[0..4] != MAGIC {
            return bad("no record magic: bytes no write wrote");
        }
        let word = |a: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&r[a..a + 8]);
            u64::from_le_bytes(w)
        };
        let mut c = [0u8; 4];
        c.copy_from_slice(&r[4..8]);
        let client = u32::from_le_bytes(c);
        let (seq, at) = (word(8), word(16));
        let mut crc = [0u8; 4];
        crc.copy_from_slice(&r[60..64]);
        if crc32fast::hash(&r[..60]) != u32::from_le_bytes(crc) {
            return bad("CRC mismatch: a torn or corrupted record");
        }
        if at != (index * RECORD) as u64 {
            return bad("a record written at another offset (or in another file)");
        }
        let mut f = [0u8; 36];
        filler(client, seq, at, &mut f);
        if f[..] != r[24..60] {
            return bad("filler does not match its header");
        }
        out.push(Record::Written { client, seq });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_decode_to_their_writer_and_holes_to_holes() {
        let mut file = records(7, 3, 0, 2);
        file.extend(vec![0u8; RECORD]);
        file.extend(records(7, 9, 3 * RECORD as u64, 1));
        let got = decode(&file).expect("valid");
        assert_eq!(
            got,
            vec![
                Record::Written { client: 7, seq: 3 },
                Record::Written { client: 7, seq: 3 },
                Record::Hole,
                Record::Written { client: 7, seq: 9 },
            ]
        );
    }

    #[test]
    fn foreign_torn_and_misplaced_bytes_are_garbage() {
        assert_eq!(decode(&[1u8; 10]), Err(Garbage::Length(10)));
        // a record at the wrong offset (as if a block of another file were read)
        let shifted = records(1, 1, RECORD as u64, 1);
        assert!(matches!(
            decode(&shifted),
            Err(Garbage::Record { index: 0, .. })
        ));
        // one flipped bit anywhere
        for bit in [0usize, 40, 200, 511] {
            let mut r = records(1, 1, 0, 1);
            r[bit / 8] ^= 1 << (bit % 8);
            assert!(decode(&r).is_err(), "bit {bit}");
        }
        // a block of some other program's bytes
        assert!(decode(&[0xab; RECORD]).is_err());
    }
}
