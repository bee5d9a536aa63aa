//! Snapshots of the change log as files, written and read as streams, so a snapshot of a
//! large retained log never sits in memory whole (a snapshot once was one `Vec`, copied
//! three times over; 450 MB of records took a three-node process to 5 GB).
//!
//! A snapshot file is, all integers big-endian:
//!
//! ```text
//! magic "STRSNAP1"
//! u32 length, then the state machine's state (postcard)
//! per record: u8 1, u64 version, u32 length, the record's bytes   (ascending versions)
//! u8 0
//! u32 CRC-32 of every byte before it
//! ```
//!
//! Files live in the `snapshots` directory of the node's database directory: `snap-*` are
//! complete snapshots, `incoming-*` are being received from the leader and `tmp-*` are being
//! built; the last two are removed when the node starts.

use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite, ReadBuf};

const MAGIC: &[u8; 8] = b"STRSNAP1";
const TAG_RECORD: u8 = 1;
const TAG_END: u8 = 0;
/// The largest state accepted from a file: the state holds the cursors and a few marks.
const STATE_MAX: usize = 64 << 20;
/// A snapshot being written is synced after every this many bytes: written out all at once at
/// the end, a large snapshot's dirty pages hold up the Raft log's own syncs behind them.
const SYNC_EVERY: u64 = 8 << 20;

pub const DIR: &str = "snapshots";

/// A snapshot's bytes in a file: openraft reads it in chunks to send it, and writes the
/// chunks it receives into one.
#[derive(Debug)]
pub struct SnapFile {
    file: tokio::fs::File,
    path: PathBuf,
}

impl SnapFile {
    pub async fn open(path: PathBuf) -> io::Result<SnapFile> {
        let file = tokio::fs::File::open(&path).await?;
        Ok(SnapFile { file, path })
    }

    /// A new empty file to receive a snapshot into.
    pub async fn create(path: PathBuf) -> io::Result<SnapFile> {
        let file = tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .await?;
        Ok(SnapFile { file, path })
    }

    /// Write out everything received and sync it; returns the file's path.
    pub async fn finish(mut self) -> io::Result<PathBuf> {
        use tokio::io::AsyncWriteExt;
        self.file.flush().await?;
        self.file.sync_all().await?;
        Ok(self.path)
    }
}

impl AsyncRead for SnapFile {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.file).poll_read(cx, buf)
    }
}

impl AsyncWrite for SnapFile {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.file).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.file).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.file).poll_shutdown(cx)
    }
}

impl AsyncSeek for SnapFile {
    fn start_seek(mut self: Pin<&mut Self>, position: io::SeekFrom) -> io::Result<()> {
        Pin::new(&mut self.file).start_seek(position)
    }

    fn poll_complete(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        Pin::new(&mut self.file).poll_complete(cx)
    }
}

/// A name no other file of this process's snapshot directories has: `prefix`-`tag`-time-n.
pub fn unique_name(prefix: &str, tag: u64) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = strait_ids::clock::now_ns();
    format!(
        "{prefix}-{tag}-{nanos}-{}",
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Remove every complete snapshot file of `dir` but `keep`, and with `unfinished`, the files of
/// snapshots being built or received too (only when the node starts: at any other time one
/// may be in use).
pub fn remove_all_but(dir: &Path, keep: Option<&str>, unfinished: bool) -> io::Result<()> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in rd {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let ours = name.starts_with("snap-")
            || (unfinished && (name.starts_with("incoming-") || name.starts_with("tmp-")));
        if ours && Some(name) != keep {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

/// Make a rename or a new file in `dir` durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

struct Crc<T> {
    inner: T,
    hasher: crc32fast::Hasher,
}

impl<W: Write> Write for Crc<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<R: Read> Read for Crc<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// Writes a snapshot file: [`Writer::new`], a [`Writer::record`] per record in ascending
/// order, then [`Writer::finish`].
pub struct Writer {
    out: Crc<BufWriter<std::fs::File>>,
    last: Option<u64>,
    unsynced: u64,
}

impl Writer {
    pub fn new(file: std::fs::File, state: &[u8]) -> io::Result<Writer> {
        let mut out = Crc {
            inner: BufWriter::with_capacity(1 << 20, file),
            hasher: crc32fast::Hasher::new(),
        };
        out.write_all(MAGIC)?;
        out.write_all(&len32(state.len())?.to_be_bytes())?;
        out.write_all(state)?;
        Ok(Writer {
            out,
            last: None,
            unsynced: 0,
        })
    }

    pub fn record(&mut self, version: u64, bytes: &[u8]) -> io::Result<()> {
        if self.last.is_some_and(|l| version <= l) {
            return Err(io::Error::other(format!(
                "snapshot records out of order: {version} after {:?}",
                self.last
            )));
        }
        self.last = Some(version);
        self.out.write_all(&[TAG_RECORD])?;
        self.out.write_all(&version.to_be_bytes())?;
        self.out.write_all(&len32(bytes.len())?.to_be_bytes())?;
        self.out.write_all(bytes)?;
        self.unsynced += 13 + bytes.len() as u64;
        if self.unsynced >= SYNC_EVERY {
            self.out.flush()?;
            self.out.inner.get_ref().sync_data()?;
            self.unsynced = 0;
        }
        Ok(())
    }

    /// Write the end and the checksum, and sync the file.
    pub fn finish(mut self) -> io::Result<()> {
        self.out.write_all(&[TAG_END])?;
        let crc = self.out.hasher.clone().finalize();
        self.out.inner.write_all(&crc.to_be_bytes())?;
        let file = self.out.inner.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()
    }
}

fn len32(n: usize) -> io::Result<u32> {
    u32::try_from(n).map_err(|_| io::Error::other(format!("{n} bytes do not fit a snapshot")))
}

fn bad(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("bad snapshot file: {what}"),
    )
}

/// Reads a snapshot file back: the state first, then the records in order. The checksum is
/// checked at the end, so a caller that acts on the records as they come must read the whole
/// file once with [`verify`] first.
pub struct Reader {
    input: Crc<BufReader<std::fs::File>>,
    /// The largest record accepted.
    record_max: usize,
    done: bool,
}

impl Reader {
    /// Open `path` and read its state.
    pub fn open(path: &Path, record_max: usize) -> io::Result<(Reader, Vec<u8>)> {
        let file = std::fs::File::open(path)?;
        let mut input = Crc {
            inner: BufReader::with_capacity(1 << 20, file),
            hasher: crc32fast::Hasher::new(),
        };
        let mut magic = [0u8; 8];
        input
            .read_exact(&mut magic)
            .map_err(|_| bad("shorter than its header"))?;
        if &magic != MAGIC {
            return Err(bad("not a strait snapshot"));
        }
        let n = read_u32(&mut input)? as usize;
        if n > STATE_MAX {
            return Err(bad(format!("a state of {n} bytes")));
        }
        let mut state = vec![0u8; n];
        input
            .read_exact(&mut state)
            .map_err(|_| bad("cut short in its state"))?;
        Ok((
            Reader {
                input,
                record_max,
                done: false,
            },
            state,
        ))
    }

    /// The next record, or None after the last one once the checksum matched.
    pub fn next_record(&mut self) -> io::Result<Option<(u64, Vec<u8>)>> {
        if self.done {
            return Ok(None);
        }
        let mut tag = [0u8; 1];
        self.input
            .read_exact(&mut tag)
            .map_err(|_| bad("cut short"))?;
        match tag[0] {
            TAG_RECORD => {
                let mut v = [0u8; 8];
                self.input
                    .read_exact(&mut v)
                    .map_err(|_| bad("cut short in a record"))?;
                let n = read_u32(&mut self.input)? as usize;
                if n > self.record_max {
                    return Err(bad(format!("a record of {n} bytes")));
                }
                let mut bytes = vec![0u8; n];
                self.input
                    .read_exact(&mut bytes)
                    .map_err(|_| bad("cut short in a record"))?;
                Ok(Some((u64::from_be_bytes(v), bytes)))
            }
            TAG_END => {
                let want = self.input.hasher.clone().finalize();
                let mut crc = [0u8; 4];
                self.input
                    .inner
                    .read_exact(&mut crc)
                    .map_err(|_| bad("cut short before its checksum"))?;
                if u32::from_be_bytes(crc) != want {
                    return Err(bad("checksum mismatch"));
                }
                let mut rest = [0u8; 1];
                if self.input.inner.read(&mut rest)? != 0 {
                    return Err(bad("bytes after the checksum"));
                }
                self.done = true;
                Ok(None)
            }
            t => Err(bad(format!("unknown tag {t}"))),
        }
    }
}

fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b).map_err(|_| bad("cut short"))?;
    Ok(u32::from_be_bytes(b))
}

/// Read the whole file and check it: its framing, record order and checksum. Returns the
/// state and the number of records.
pub fn verify(path: &Path, record_max: usize) -> io::Result<(Vec<u8>, u64)> {
    let (mut r, state) = Reader::open(path, record_max)?;
    let mut n = 0u64;
    let mut last: Option<u64> = None;
    while let Some((v, _)) = r.next_record()? {
        if last.is_some_and(|l| v <= l) {
            return Err(bad(format!("record {v} after {last:?}")));
        }
        last = Some(v);
        n += 1;
    }
    Ok((state, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, state: &[u8], recs: &[(u64, Vec<u8>)]) {
        let f = std::fs::File::create(path).expect("create");
        let mut w = Writer::new(f, state).expect("writer");
        for (v, b) in recs {
            w.record(*v, b).expect("record");
        }
        w.finish().expect("finish");
    }

    #[test]
    fn round_trip_and_every_corruption_is_caught() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("s");
        let recs: Vec<(u64, Vec<u8>)> = (10..60).map(|v| (v, vec![v as u8; v as usize])).collect();
        write(&p, b"state!", &recs);
        let (state, n) = verify(&p, 1 << 20).expect("verify");
        assert_eq!((state.as_slice(), n), (&b"state!"[..], 50));
        let (mut r, _) = Reader::open(&p, 1 << 20).expect("open");
        let mut back = vec![];
        while let Some(x) = r.next_record().expect("next") {
            back.push(x);
        }
        assert_eq!(back, recs);

        // flip each byte in turn: every file so changed is refused
        let good = std::fs::read(&p).expect("read");
        for i in 0..good.len() {
            let mut b = good.clone();
            b[i] ^= 0x40;
            std::fs::write(&p, &b).expect("write");
            assert!(verify(&p, 1 << 20).is_err(), "byte {i} changed, not caught");
        }
        // cut short anywhere, or with a byte added
        for len in 0..good.len() {
            std::fs::write(&p, &good[..len]).expect("write");
            assert!(verify(&p, 1 << 20).is_err(), "cut at {len}, not caught");
        }
        let mut longer = good.clone();
        longer.push(0);
        std::fs::write(&p, &longer).expect("write");
        assert!(verify(&p, 1 << 20).is_err());
        // a record over the cap
        std::fs::write(&p, &good).expect("write");
        assert!(verify(&p, 20).is_err());
    }

    #[test]
    fn records_must_ascend() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = std::fs::File::create(dir.path().join("s")).expect("create");
        let mut w = Writer::new(f, b"").expect("writer");
        w.record(5, b"a").expect("record");
        assert!(w.record(5, b"b").is_err());
        assert!(w.record(4, b"b").is_err());
    }
}
