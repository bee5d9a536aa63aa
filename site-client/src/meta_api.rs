//! The [`MetaClient`] methods of [`RemoteMeta`]: each builds its request and makes one call.

use std::sync::atomic::Ordering;
use std::sync::mpsc::TrySendError;
use std::sync::OnceLock;
use std::time::Duration;

use strait_fs_core::error::{Error, Result};
use strait_fs_core::meta::*;
use strait_fs_core::SliceId;
use strait_proto::meta as w;

use crate::call::{naming_version, wire_err};
use crate::remote_meta::RemoteMeta;

/// Slice ids taken from the daemon per call.
pub const SLICE_IDS_PER_ALLOC: u32 = 1000;
/// How long closing the session at unmount waits for an unreachable daemon.
const CLOSE_PATIENCE: Duration = Duration::from_secs(5);

impl RemoteMeta {
    /// Open `ino`, with chunk 0's slice list in the reply when `chunk0` asks for it.
    #[allow(clippy::type_complexity)]
    fn open_with(
        &self,
        c: &Ctx,
        ino: Ino,
        flags: i32,
        chunk0: bool,
    ) -> Result<(Attr, Option<(Vec<SliceRef>, Vec<Vec<u8>>)>)> {
        let req = w::OpenRequest {
            ctx: ctx(c),
            ino,
            flags,
            chunk0,
        };
        // opening only checks access and counts a handle: repeating it after a broken
        // connection can at worst count a handle the daemon drops with the session
        // close-to-open: once opened, what this mount keeps is at least as new as the open
        // saw (a getattr after it must not answer an older length)
        let keeps = self.opts.keep_names;
        let (mut r, _) = self.call_versioned("open", true, self.patience(), |mut c| {
            let req = req.clone();
            async move {
                if keeps {
                    c.open(naming_version(req)).await
                } else {
                    c.open(req).await
                }
            }
        })?;
        self.counted_open(ino);
        // the handle is open at the daemon now: a chunk list that does not decode is only
        // asked again by the first read
        let chunk = match r.chunk0.take() {
            Some(ch) if chunk0 => match strait_proto::slices_from_wire(ch.slices) {
                Ok(slices) => Some((slices, ch.unsynced)),
                Err(e) => {
                    tracing::warn!("{}", wire_err("open: chunk 0 in the reply", e));
                    None
                }
            },
            _ => None,
        };
        Ok((attr("open", r)?, chunk))
    }

    /// Make an entry of kind `what` in `parent`: the body of mknod, mkdir and create.
    fn make_entry(
        &self,
        what: NewEntry,
        c: &Ctx,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<(Ino, Attr)> {
        let req = w::MkNodRequest {
            ctx: ctx(c),
            parent,
            name: name.to_vec(),
            mode,
            umask,
            rdev: match what {
                NewEntry::Node { rdev } => rdev,
                NewEntry::Dir | NewEntry::File => 0,
            },
        };
        let ticket = self.cache.ticket();
        let (r, version) = self.call_versioned(what.op(), false, self.patience(), |mut c| {
            let req = req.clone();
            async move {
                match what {
                    NewEntry::Node { .. } => c.mk_nod(req).await,
                    NewEntry::Dir => c.mk_dir(req).await,
                    NewEntry::File => c.create(req).await,
                }
            }
        })?;
        let (ino, a) = entry(what.op(), r)?;
        self.keep_made(ticket, version, parent, name, ino, &a);
        Ok((ino, a))
    }

    fn patience(&self) -> Duration {
        self.opts.reconnect_timeout
    }

    /// Keep the entry a change made (see `meta_cache.rs`).
    fn keep_made(
        &self,
        ticket: Option<crate::meta_cache::Ticket>,
        version: Option<u64>,
        parent: Ino,
        name: &[u8],
        ino: Ino,
        a: &Attr,
    ) {
        if let (Some(t), Some(v)) = (ticket, version) {
            self.cache.keep_made(t, v, parent, name, ino, a);
        }
    }

    /// Keep the attributes a change answered (see `meta_cache.rs`).
    fn keep_changed(
        &self,
        ticket: Option<crate::meta_cache::Ticket>,
        version: Option<u64>,
        ino: Ino,
        a: &Attr,
    ) {
        if let (Some(t), Some(v)) = (ticket, version) {
            self.cache.keep_changed(t, v, ino, a);
        }
    }

    /// After the daemon refused a slice id as not given to this session (it restarted and
    /// forgot its ranges, or the session was replaced), drop what is left of the current
    /// range: the next id comes from a new one, which the daemon will know.
    fn forget_ids_if_refused<T>(&self, r: Result<T>) -> Result<T> {
        if let Err(Error::SliceNotAllocated(why)) = &r {
            tracing::info!("{why}; taking a new range of slice ids");
            *self.slice_ids.lock() = (0, 0);
        }
        r
    }
}

/// MkNod, MkDir and Create: one request, three calls (the daemon's `NewEntry` likewise).
#[derive(Clone, Copy)]
enum NewEntry {
    Node { rdev: u32 },
    Dir,
    File,
}

impl NewEntry {
    fn op(self) -> &'static str {
        match self {
            NewEntry::Node { .. } => "mknod",
            NewEntry::Dir => "mkdir",
            NewEntry::File => "create",
        }
    }
}

fn ctx(c: &Ctx) -> Option<w::Ctx> {
    Some(c.into())
}

fn entry(op: &str, r: w::EntryReply) -> Result<(Ino, Attr)> {
    Ok((
        r.ino,
        strait_proto::attr_from_wire(r.attr).map_err(|e| wire_err(op, e))?,
    ))
}

fn attr(op: &str, r: w::AttrReply) -> Result<Attr> {
    strait_proto::attr_from_wire(r.attr).map_err(|e| wire_err(op, e))
}

impl MetaClient for RemoteMeta {
    fn settings(&self) -> &Format {
        static UNSET: OnceLock<Format> = OnceLock::new();
        self.format.get().unwrap_or_else(|| {
            UNSET.get_or_init(|| Format {
                name: String::new(),
                uuid: String::new(),
                data_url: String::new(),
                block_size: 4 << 20,
                capacity_bytes: 0,
                trash_delay_s: 0,
                created_ns: 0,
            })
        })
    }

    fn is_read_only(&self) -> bool {
        self.opts.read_only || self.read_only.load(Ordering::Relaxed) != 0
    }

    fn open_session(&self, info: &str) -> Result<u64> {
        *self.info.lock() = info.to_string();
        let req = w::OpenSessionRequest {
            info: info.to_string(),
            resume_session: 0,
            open_inodes: vec![],
            locks: vec![],
        };
        let r = self.call("open session", true, |mut c| {
            let req = req.clone();
            async move { c.open_session(req).await }
        })?;
        let format =
            strait_proto::format_from_wire(r.format).map_err(|e| wire_err("open session", e))?;
        let _ = self.format.set(format);
        self.read_only.store(r.read_only as u64, Ordering::Relaxed);
        self.block_fallback
            .store(r.block_fallback, Ordering::Relaxed);
        self.session_timeout_ms
            .store(r.session_timeout_ms, Ordering::Relaxed);
        self.session.store(r.session, Ordering::Relaxed);
        self.start_releaser()?;
        self.start_watcher()?;
        Ok(r.session)
    }

    fn heartbeat(&self) -> Result<()> {
        self.call("heartbeat", true, |mut c| async move {
            c.heartbeat(w::HeartbeatRequest {}).await
        })?;
        Ok(())
    }

    fn heartbeat_interval(&self) -> Duration {
        let t = self.session_timeout();
        if t.is_zero() {
            Duration::from_secs(10)
        } else {
            (t / 4).clamp(Duration::from_millis(100), Duration::from_secs(10))
        }
    }

    fn close_session(&self) -> Result<()> {
        self.stop_releaser();
        self.stop_watcher();
        // an unreachable daemon expires the session by itself: an unmount does not wait the
        // whole reconnect timeout for it
        self.call_for("close session", false, CLOSE_PATIENCE, |mut c| async move {
            c.close_session(w::Empty {}).await
        })?;
        self.session.store(0, Ordering::Relaxed);
        Ok(())
    }

    fn getattr(&self, ino: Ino) -> Result<Attr> {
        if let Some(a) = self.cache.attr(ino) {
            return Ok(a);
        }
        let ticket = self.cache.ticket();
        let r = self.call("getattr", true, |mut c| async move {
            c.get_attr(w::InodeRequest { ctx: None, ino }).await
        })?;
        let a = attr("getattr", r)?;
        if let Some(t) = ticket {
            self.cache.keep_attr(t, ino, &a);
        }
        Ok(a)
    }

    fn lookup(&self, c: &Ctx, parent: Ino, name: &[u8]) -> Result<(Ino, Attr)> {
        // a plain name is answered from what is kept, with the daemon's own checks made here
        let plain = !name.is_empty()
            && name.len() <= NAME_LEN_MAX
            && name != b"."
            && name != b".."
            && !name.contains(&b'/')
            && !name.contains(&0);
        if plain {
            if let Some((pa, found)) = self.cache.lookup(parent, name) {
                if !pa.is_dir() {
                    return Err(Error::Sys(libc::ENOTDIR));
                }
                perm::access(&pa, c, perm::MAY_EXEC)?;
                return match found {
                    crate::meta_cache::Found::Entry(ino, a) => Ok((ino, a)),
                    crate::meta_cache::Found::Absent => Err(Error::Sys(libc::ENOENT)),
                };
            }
        }
        let ticket = self.cache.ticket().filter(|_| plain);
        let req = w::LookupRequest {
            ctx: ctx(c),
            parent,
            name: name.to_vec(),
        };
        let r = self.call("lookup", true, |mut c| {
            let req = req.clone();
            async move { c.lookup(req).await }
        });
        match (r, ticket) {
            (Ok(r), t) => {
                let (ino, a) = entry("lookup", r)?;
                if let Some(t) = t {
                    self.cache.keep_lookup(t, parent, name, Some((ino, &a)));
                }
                Ok((ino, a))
            }
            (Err(Error::Sys(libc::ENOENT)), Some(t)) => {
                self.cache.keep_lookup(t, parent, name, None);
                Err(Error::Sys(libc::ENOENT))
            }
            (Err(e), _) => Err(e),
        }
    }

    fn access(&self, c: &Ctx, ino: Ino, mask: u32) -> Result<()> {
        let req = w::AccessRequest {
            ctx: ctx(c),
            ino,
            mask,
        };
        self.call("access", true, |mut c| {
            let req = req.clone();
            async move { c.access(req).await }
        })?;
        Ok(())
    }

    fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        let r = self.call("readlink", true, |mut c| async move {
            c.read_link(w::InodeRequest { ctx: None, ino }).await
        })?;
        Ok(r.target)
    }

    fn readdir(&self, c: &Ctx, ino: Ino) -> Result<Vec<DirEntry>> {
        let req = w::InodeRequest { ctx: ctx(c), ino };
        let r = self.call("readdir", true, |mut c| {
            let req = req.clone();
            async move { c.read_dir(req).await }
        })?;
        r.entries
            .into_iter()
            .map(|e| DirEntry::try_from(e).map_err(|e| wire_err("readdir", e)))
            .collect()
    }

    fn statfs(&self) -> Result<StatFs> {
        let r = self.call("statfs", true, |mut c| async move {
            c.stat_fs(w::Empty {}).await
        })?;
        Ok(r.into())
    }

    fn setattr(&self, c: &Ctx, ino: Ino, req: &SetAttr) -> Result<Attr> {
        let req = strait_proto::setattr_to_wire(c, ino, req);
        let ticket = self.cache.ticket();
        let (r, version) = self.call_versioned("setattr", false, self.patience(), |mut c| {
            let req = req.clone();
            async move { c.set_attr(req).await }
        })?;
        let a = attr("setattr", r)?;
        self.keep_changed(ticket, version, ino, &a);
        Ok(a)
    }

    fn mknod(
        &self,
        c: &Ctx,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Result<(Ino, Attr)> {
        self.make_entry(NewEntry::Node { rdev }, c, parent, name, mode, umask)
    }

    fn mkdir(
        &self,
        c: &Ctx,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<(Ino, Attr)> {
        self.make_entry(NewEntry::Dir, c, parent, name, mode, umask)
    }

    fn create(
        &self,
        c: &Ctx,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<(Ino, Attr)> {
        let (ino, a) = self.make_entry(NewEntry::File, c, parent, name, mode, umask)?;
        self.counted_open(ino);
        Ok((ino, a))
    }

    fn symlink(&self, c: &Ctx, parent: Ino, name: &[u8], target: &[u8]) -> Result<(Ino, Attr)> {
        let req = w::SymlinkRequest {
            ctx: ctx(c),
            parent,
            name: name.to_vec(),
            target: target.to_vec(),
        };
        let ticket = self.cache.ticket();
        let (r, version) = self.call_versioned("symlink", false, self.patience(), |mut c| {
            let req = req.clone();
            async move { c.symlink(req).await }
        })?;
        let (ino, a) = entry("symlink", r)?;
        self.keep_made(ticket, version, parent, name, ino, &a);
        Ok((ino, a))
    }

    fn link(&self, c: &Ctx, ino: Ino, parent: Ino, name: &[u8]) -> Result<Attr> {
        let req = w::LinkRequest {
            ctx: ctx(c),
            ino,
            new_parent: parent,
            new_name: name.to_vec(),
        };
        let r = self.call("link", false, |mut c| {
            let req = req.clone();
            async move { c.link(req).await }
        })?;
        attr("link", r)
    }

    fn unlink(&self, c: &Ctx, parent: Ino, name: &[u8]) -> Result<()> {
        let req = w::NameRequest {
            ctx: ctx(c),
            parent,
            name: name.to_vec(),
        };
        self.call("unlink", false, |mut c| {
            let req = req.clone();
            async move { c.unlink(req).await }
        })?;
        Ok(())
    }

    fn rmdir(&self, c: &Ctx, parent: Ino, name: &[u8]) -> Result<()> {
        let req = w::NameRequest {
            ctx: ctx(c),
            parent,
            name: name.to_vec(),
        };
        self.call("rmdir", false, |mut c| {
            let req = req.clone();
            async move { c.rm_dir(req).await }
        })?;
        Ok(())
    }

    fn rename(&self, c: &Ctx, sp: Ino, sn: &[u8], dp: Ino, dn: &[u8], flags: u32) -> Result<()> {
        let req = w::RenameRequest {
            ctx: ctx(c),
            parent: sp,
            name: sn.to_vec(),
            new_parent: dp,
            new_name: dn.to_vec(),
            flags,
        };
        self.call("rename", false, |mut c| {
            let req = req.clone();
            async move { c.rename(req).await }
        })?;
        Ok(())
    }

    fn open_inode(&self, c: &Ctx, ino: Ino, flags: i32) -> Result<Attr> {
        Ok(self.open_with(c, ino, flags, false)?.0)
    }

    fn open_inode_chunk0(
        &self,
        c: &Ctx,
        ino: Ino,
        flags: i32,
    ) -> Result<(Attr, Option<(Vec<SliceRef>, Vec<Vec<u8>>)>)> {
        self.open_with(c, ino, flags, true)
    }

    fn release(&self, ino: Ino) -> Result<()> {
        let queued = match &*self.releaser.lock() {
            Some((tx, _)) => match tx.try_send(ino) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => false,
            },
            None => false,
        };
        if queued {
            Ok(())
        } else {
            self.send_releases(vec![ino])
        }
    }

    fn read_chunk(&self, ino: Ino, idx: u32) -> Result<Vec<SliceRef>> {
        Ok(self.read_chunk_unsynced(ino, idx)?.0)
    }

    fn read_chunk_unsynced(&self, ino: Ino, idx: u32) -> Result<(Vec<SliceRef>, Vec<Vec<u8>>)> {
        let r = self.call("read chunk", true, |mut c| async move {
            c.read_chunk(w::ChunkRequest { ino, index: idx }).await
        })?;
        let slices =
            strait_proto::slices_from_wire(r.slices).map_err(|e| wire_err("read chunk", e))?;
        Ok((slices, r.unsynced))
    }

    fn next_slice_id(&self) -> Result<SliceId> {
        let mut ids = self.slice_ids.lock();
        if ids.0 >= ids.1 {
            // a lost reply only wastes the ids it carried
            let r = self.call("allocate slice ids", true, |mut c| async move {
                c.alloc_slice_ids(w::AllocRequest {
                    count: SLICE_IDS_PER_ALLOC,
                })
                .await
            })?;
            if r.first == 0 || r.count == 0 {
                return Err(Error::Meta(
                    "allocate slice ids: the site daemon returned an empty range".into(),
                ));
            }
            *ids = (r.first, r.first.saturating_add(r.count as u64));
        }
        let id = ids.0;
        ids.0 += 1;
        Ok(SliceId(id))
    }

    fn write_slice(&self, ino: Ino, idx: u32, slice: SliceRef, mtime_ns: i64) -> Result<Attr> {
        let req = w::WriteSliceRequest {
            ino,
            index: idx,
            slice: Some((&slice).into()),
            mtime_ns,
        };
        let r = self.call("write slice", false, |mut c| {
            let req = req.clone();
            async move { c.write_slice(req).await }
        });
        attr("write slice", self.forget_ids_if_refused(r)?)
    }

    fn compact_chunk(
        &self,
        ino: Ino,
        idx: u32,
        old: &[SliceRef],
        new: Vec<SliceRef>,
    ) -> Result<bool> {
        let req = w::CompactChunkRequest {
            ino,
            index: idx,
            old: strait_proto::slices_to_wire(old),
            new: strait_proto::slices_to_wire(&new),
        };
        // compaction checks the old list under its transaction: a repeat is refused harmlessly
        let r = self.call("compact chunk", true, |mut c| {
            let req = req.clone();
            async move { c.compact_chunk(req).await }
        });
        Ok(self.forget_ids_if_refused(r)?.done)
    }

    fn getxattr(&self, c: &Ctx, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        let req = w::XattrRequest {
            ctx: ctx(c),
            ino,
            name: name.to_vec(),
        };
        let r = self.call("getxattr", true, |mut c| {
            let req = req.clone();
            async move { c.get_xattr(req).await }
        })?;
        Ok(r.value)
    }

    fn listxattr(&self, c: &Ctx, ino: Ino) -> Result<Vec<Vec<u8>>> {
        let req = w::InodeRequest { ctx: ctx(c), ino };
        let r = self.call("listxattr", true, |mut c| {
            let req = req.clone();
            async move { c.list_xattr(req).await }
        })?;
        Ok(r.names)
    }

    fn setxattr(&self, c: &Ctx, ino: Ino, name: &[u8], value: &[u8], flags: i32) -> Result<()> {
        let req = w::SetXattrRequest {
            ctx: ctx(c),
            ino,
            name: name.to_vec(),
            value: value.to_vec(),
            flags,
        };
        self.call("setxattr", false, |mut c| {
            let req = req.clone();
            async move { c.set_xattr(req).await }
        })?;
        Ok(())
    }

    fn removexattr(&self, c: &Ctx, ino: Ino, name: &[u8]) -> Result<()> {
        let req = w::XattrRequest {
            ctx: ctx(c),
            ino,
            name: name.to_vec(),
        };
        self.call("removexattr", false, |mut c| {
            let req = req.clone();
            async move { c.remove_xattr(req).await }
        })?;
        Ok(())
    }

    fn flock(&self, ino: Ino, owner: u64, typ: LockType) -> Result<()> {
        let req = w::FlockRequest {
            ino,
            owner,
            typ: w::LockType::from(typ) as i32,
        };
        // taking or releasing a lock the owner already holds changes nothing: safe to repeat;
        // a lock taken: what this mount keeps shows every change made before it
        let fresh = self.opts.keep_names && typ != LockType::Unlock;
        self.call_versioned("flock", true, self.patience(), |mut c| async move {
            if fresh {
                c.flock(naming_version(req)).await
            } else {
                c.flock(req).await
            }
        })?;
        self.locks.lock().flock(ino, owner, typ);
        Ok(())
    }

    fn getlk(
        &self,
        ino: Ino,
        owner: u64,
        typ: LockType,
        start: u64,
        end: u64,
    ) -> Result<Option<PosixLock>> {
        let req = w::LockRequest {
            ino,
            owner,
            pid: 0,
            typ: w::LockType::from(typ) as i32,
            start,
            end,
        };
        let r = self.call("getlk", true, |mut c| async move { c.get_lk(req).await })?;
        r.conflict
            .map(|l| PosixLock::try_from(l).map_err(|e| wire_err("getlk", e)))
            .transpose()
    }

    fn setlk(
        &self,
        ino: Ino,
        owner: u64,
        pid: u32,
        typ: LockType,
        start: u64,
        end: u64,
    ) -> Result<()> {
        let req = w::LockRequest {
            ino,
            owner,
            pid,
            typ: w::LockType::from(typ) as i32,
            start,
            end,
        };
        let fresh = self.opts.keep_names && typ != LockType::Unlock;
        self.call_versioned("setlk", true, self.patience(), |mut c| async move {
            if fresh {
                c.set_lk(naming_version(req)).await
            } else {
                c.set_lk(req).await
            }
        })?;
        self.locks.lock().setlk(ino, owner, pid, typ, start, end);
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        self.call(
            "sync",
            true,
            |mut c| async move { c.sync(w::Empty {}).await },
        )?;
        Ok(())
    }
}
