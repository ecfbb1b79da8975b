//! `pack`: the M-to-1 pattern of DeFUSE. Many small files live packed in
//! a few large container files, each file one contiguous range of one
//! container; an index (the journal of [`tree`]) says which.
//!
//! Layout of the directory given to [`PackFs::new`]:
//! - `index`: the namespace, attributes and each file's `(container,
//!   offset, capacity)`;
//! - `pack-N`: containers, up to [`CONTAINER_TARGET`] bytes each (a file
//!   larger than that gets a container of its own size).
//!
//! New data is appended: a file that outgrows its capacity is copied to the
//! end of the active container with room to grow (doubling, in steps of at
//! most 1 MiB), unless it already sits at the end, where it simply grows.
//! The space it leaves is garbage, reclaimed by [`PackFs::compact`]: every
//! file that is not open is copied tightly into fresh containers, and
//! containers left without files are deleted. Compaction also runs by
//! itself after a release once garbage exceeds both the live data and
//! 1 MiB. Open files are never moved, so the map they were opened with
//! stays right.
//!
//! Holes stay holes: the bytes a file skips (a write past its end, a
//! truncation up) are punched in the container, not written, slots of 4
//! KiB or more start on a 4 KiB boundary of their container, and a file
//! moved copies its data ranges only, so the container's holes are the
//! file's, block for block, and `SEEK_DATA`/`SEEK_HOLE` read them there.
//!
//! The map returned by `open` is one bounded extent (the file's bytes in its
//! container, `len` = size), or no extent for an empty file: it is valid
//! until the file grows past its capacity or is truncated. The kernel cannot
//! pass such a map through, so the daemon serves reads and writes, with
//! [`DataMap::read_at`]/[`DataMap::write_at`] on the same ranges.

pub mod metafs;
pub mod tree;

use std::collections::{HashMap, HashSet};
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use shortfuse::{DataMap, Errno, Extent, FileType, Result};

pub use metafs::MetaFs;

use crate::passthrough::sys;
use metafs::Storage;
use tree::{Payload, Tree};

/// Size past which a new container is started.
pub const CONTAINER_TARGET: u64 = 64 << 20;
/// Largest step by which a file's capacity grows.
const GROW_STEP: u64 = 1 << 20;
/// Slots of this size or more start on a multiple of it (the block size
/// of the usual container file systems), so that their holes line up.
const ALIGN: u64 = 4096;
/// Garbage below this is never worth a compaction.
const COMPACT_MIN_GARBAGE: u64 = 1 << 20;

/// Where a file's bytes are: `cap` bytes at `offset` in container
/// `container` (`cap == 0`: nowhere yet).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slot {
    pub container: u32,
    pub offset: u64,
    pub cap: u64,
}

impl Payload for Slot {
    fn encode(&self) -> String {
        format!("{} {} {}", self.container, self.offset, self.cap)
    }

    fn decode(f: &[&str]) -> Option<Slot> {
        Some(Slot {
            container: f.first()?.parse().ok()?,
            offset: f.get(1)?.parse().ok()?,
            cap: f.get(2)?.parse().ok()?,
        })
    }
}

/// The containers of a pack directory.
pub struct PackStore {
    dir: PathBuf,
    containers: HashMap<u32, Arc<OwnedFd>>,
    /// Container new data is appended to, and its end.
    active: u32,
    tail: u64,
    /// Bytes in containers that no file uses.
    garbage: u64,
    live: u64,
}

/// The pack file system.
pub type PackFs = MetaFs<PackStore>;

/// What a compaction did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Compaction {
    pub files_moved: usize,
    pub containers_removed: usize,
    pub bytes_reclaimed: u64,
}

fn grow(need: u64) -> u64 {
    need.next_power_of_two()
        .clamp(64, need.div_ceil(GROW_STEP).max(1) * GROW_STEP)
}

impl PackStore {
    fn path(&self, id: u32) -> PathBuf {
        self.dir.join(format!("pack-{id}"))
    }

    fn open_container(&mut self, id: u32) -> io::Result<Arc<OwnedFd>> {
        if let Some(fd) = self.containers.get(&id) {
            return Ok(fd.clone());
        }
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(self.path(id))?;
        let fd = Arc::new(OwnedFd::from(f));
        self.containers.insert(id, fd.clone());
        Ok(fd)
    }

    fn fd(&self, id: u32) -> Result<&Arc<OwnedFd>> {
        self.containers.get(&id).ok_or(Errno::EIO)
    }

    /// `cap` bytes at the end of the active container (a new one when it
    /// would pass the target size).
    fn allocate(&mut self, cap: u64) -> Result<Slot> {
        let align = |tail: u64| {
            if cap >= ALIGN {
                tail.next_multiple_of(ALIGN)
            } else {
                tail
            }
        };
        if self.tail > 0 && align(self.tail) + cap > CONTAINER_TARGET {
            let next = self.containers.keys().max().map_or(0, |m| m + 1);
            self.open_container(next).map_err(Errno::from)?;
            self.active = next;
            self.tail = 0;
        }
        let offset = align(self.tail);
        // The padding is garbage until a compaction.
        self.garbage += offset - self.tail;
        let slot = Slot {
            container: self.active,
            offset,
            cap,
        };
        self.tail = offset + cap;
        self.live += cap;
        Ok(slot)
    }

    fn free(&mut self, slot: &Slot) {
        self.live -= slot.cap.min(self.live);
        if slot.container == self.active && slot.offset + slot.cap == self.tail {
            // The last slot of the active container: the tail simply moves back.
            self.tail = slot.offset;
            let _ = file(self.fd(slot.container)).and_then(|f| f.set_len(self.tail).map_err(Errno::from));
        } else {
            self.garbage += slot.cap;
        }
    }

    /// A map of `size` bytes of `slot`.
    fn slot_map(&self, slot: &Slot, size: u64) -> Result<DataMap> {
        if size == 0 {
            return Ok(DataMap::default());
        }
        Ok(DataMap {
            extents: vec![Extent {
                backing: self.fd(slot.container)?.clone(),
                file_offset: 0,
                backing_offset: slot.offset,
                len: size,
            }],
        })
    }

    /// Makes room for `need` bytes, keeping the first `size` bytes.
    fn reserve(&mut self, slot: &mut Slot, size: u64, need: u64) -> Result<()> {
        if need <= slot.cap {
            return Ok(());
        }
        if slot.cap > 0 && slot.container == self.active && slot.offset + slot.cap == self.tail {
            let cap = grow(need);
            self.tail = slot.offset + cap;
            self.live += cap - slot.cap;
            slot.cap = cap;
            return Ok(());
        }
        let old = *slot;
        let new = self.allocate(grow(need))?;
        self.copy_slot(&old, &new, size)?;
        if old.cap > 0 {
            self.free(&old);
        }
        *slot = new;
        Ok(())
    }

    /// The first `size` bytes of `old` into `new` (a fresh slot, a hole
    /// until written): its data ranges only, so its holes stay holes.
    fn copy_slot(&self, old: &Slot, new: &Slot, size: u64) -> Result<()> {
        if size == 0 {
            return Ok(());
        }
        let (from, to) = (self.slot_map(old, size)?, self.slot_map(new, size)?);
        let mut buf = vec![0u8; size.min(GROW_STEP) as usize];
        let mut at = 0;
        while at < size {
            let start = match self.seek(old, size, at, libc::SEEK_DATA) {
                Ok(x) => x,
                Err(Errno::ENXIO) => break,
                Err(e) => return Err(e),
            };
            let end = self.seek(old, size, start, libc::SEEK_HOLE)?;
            let mut pos = start;
            while pos < end {
                let n = (end - pos).min(buf.len() as u64) as usize;
                let got = from.read_at(pos, &mut buf[..n]).map_err(Errno::from)?;
                buf[got..n].fill(0);
                to.write_at(pos, &buf[..n]).map_err(Errno::from)?;
                pos += n as u64;
            }
            at = end;
        }
        self.extend(new, size)
    }

    /// Makes `[from, to)` of `slot` read as zeros: a hole punched in the
    /// container (which zeroes the partial blocks at its edges), and the
    /// container long enough to hold `to`.
    fn zero(&self, slot: &Slot, from: u64, to: u64) -> Result<()> {
        if to <= from {
            return Ok(());
        }
        let fd = self.fd(slot.container)?;
        sys::fallocate(
            fd.as_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            slot.offset + from,
            to - from,
        )?;
        self.extend(slot, to)
    }

    /// Grows the container, with a hole, to hold the first `size` bytes
    /// of `slot` (never shrinks it: later slots may lie beyond).
    fn extend(&self, slot: &Slot, size: u64) -> Result<()> {
        let f = file(self.fd(slot.container))?;
        let end = slot.offset + size;
        if f.metadata().map_err(Errno::from)?.len() < end {
            f.set_len(end).map_err(Errno::from)?;
        }
        Ok(())
    }

    /// `SEEK_DATA`/`SEEK_HOLE` from `off < size` within `slot`, in the
    /// container: data found past the file is none of its, a hole found
    /// past it is its end, and a file running past the container's end
    /// (never expected) is a hole there.
    fn seek(&self, slot: &Slot, size: u64, off: u64, whence: i32) -> Result<u64> {
        if slot.cap == 0 {
            return if whence == libc::SEEK_DATA {
                Err(Errno::ENXIO)
            } else {
                Ok(off)
            };
        }
        let fd = self.fd(slot.container)?;
        match sys::lseek(fd.as_fd(), (slot.offset + off) as i64, whence) {
            Ok(x) if whence == libc::SEEK_DATA => match x - slot.offset {
                x if x < size => Ok(x),
                _ => Err(Errno::ENXIO),
            },
            Ok(x) => Ok((x - slot.offset).min(size)),
            Err(Errno::ENXIO) if whence == libc::SEEK_HOLE => Ok(off),
            Err(e) => Err(e),
        }
    }

    /// Copies every file that is not open tightly into fresh containers and
    /// deletes the containers left without files.
    pub(crate) fn compact(&mut self, tree: &mut Tree<Slot>) -> Result<Compaction> {
        let before: u64 = self.container_bytes();
        let first_new = self.containers.keys().max().map_or(0, |m| m + 1);
        self.open_container(first_new).map_err(Errno::from)?;
        let old: HashSet<u32> = self.containers.keys().copied().filter(|&c| c != first_new).collect();
        self.active = first_new;
        self.tail = 0;
        let mut moved = Vec::new();
        let inos: Vec<u64> = tree
            .nodes
            .values()
            .filter(|n| n.kind == FileType::Regular && n.opens == 0 && n.payload.cap > 0)
            .map(|n| n.ino)
            .collect();
        for ino in inos {
            let n = tree.get(ino)?;
            let (slot, size) = (n.payload, n.size);
            let new = if size == 0 {
                Slot::default()
            } else {
                let new = self.allocate(size)?;
                self.copy_slot(&slot, &new, size)?;
                new
            };
            moved.push((ino, new));
        }
        for c in self.containers.values() {
            file(Ok(c))?.sync_data().map_err(Errno::from)?;
        }
        for &(ino, new) in &moved {
            tree.get_mut(ino)?.payload = new;
        }
        tree.snapshot().map_err(Errno::from)?;
        // Containers still used by open files stay.
        let in_use: HashSet<u32> = tree
            .nodes
            .values()
            .filter(|n| n.kind == FileType::Regular && n.payload.cap > 0)
            .map(|n| n.payload.container)
            .collect();
        let mut removed = 0;
        for c in old {
            if !in_use.contains(&c) {
                self.containers.remove(&c);
                std::fs::remove_file(self.path(c)).map_err(Errno::from)?;
                removed += 1;
            }
        }
        self.recount(tree);
        Ok(Compaction {
            files_moved: moved.len(),
            containers_removed: removed,
            bytes_reclaimed: before.saturating_sub(self.container_bytes()),
        })
    }

    fn container_bytes(&self) -> u64 {
        self.containers
            .values()
            .filter_map(|c| file(Ok(c)).ok()?.metadata().ok())
            .map(|m| m.len())
            .sum()
    }

    /// Live and garbage bytes from the tree and the containers' sizes.
    fn recount(&mut self, tree: &Tree<Slot>) {
        self.live = tree
            .nodes
            .values()
            .filter(|n| n.kind == FileType::Regular)
            .map(|n| n.payload.cap)
            .sum();
        self.garbage = self.container_bytes().saturating_sub(self.live);
        if let Some(fd) = self.containers.get(&self.active) {
            self.tail = file(Ok(fd))
                .and_then(|f| f.metadata().map_err(Errno::from))
                .map_or(0, |m| m.len());
        }
    }

    /// Bytes no file uses.
    pub fn garbage(&self) -> u64 {
        self.garbage
    }

    /// Number of container files.
    pub fn containers(&self) -> usize {
        self.containers.len()
    }
}

/// A `File` view of a shared container descriptor, for std's positioned I/O
/// and metadata.
fn file(fd: Result<&Arc<OwnedFd>>) -> Result<std::fs::File> {
    fd?.try_clone().map(std::fs::File::from).map_err(Errno::from)
}

impl Storage for PackStore {
    type Payload = Slot;

    fn create(&mut self, _ino: u64) -> Result<Slot> {
        Ok(Slot::default())
    }

    fn read(&mut self, p: &Slot, size: u64, off: u64, buf: &mut [u8]) -> Result<usize> {
        self.slot_map(p, size)?.read_at(off, buf).map_err(Errno::from)
    }

    fn write(&mut self, p: &mut Slot, size: u64, off: u64, data: &[u8]) -> Result<()> {
        let end = off + data.len() as u64;
        self.reserve(p, size, end.max(size))?;
        // Bytes between the old end and the write may hold old garbage.
        self.zero(p, size, off)?;
        self.slot_map(p, end.max(size))?
            .write_at(off, data)
            .map_err(Errno::from)?;
        Ok(())
    }

    fn truncate(&mut self, p: &mut Slot, size: u64, new: u64) -> Result<()> {
        if new > size {
            self.reserve(p, size, new)?;
            self.zero(p, size, new)?;
        }
        Ok(())
    }

    fn punch(&mut self, p: &Slot, _size: u64, off: u64, len: u64) -> Result<()> {
        self.zero(p, off, off + len)
    }

    fn remove(&mut self, p: &Slot) {
        if p.cap > 0 {
            self.free(p);
        }
    }

    fn map(&mut self, p: &Slot, size: u64) -> Result<DataMap> {
        self.slot_map(p, size)
    }

    fn size(&mut self, _p: &Slot) -> Option<u64> {
        None
    }

    fn seek(&mut self, p: &Slot, size: u64, off: u64, whence: i32) -> Result<u64> {
        PackStore::seek(self, p, size, off, whence)
    }

    fn sync(&mut self, p: &Slot) -> Result<()> {
        if p.cap == 0 {
            return Ok(());
        }
        file(self.fd(p.container))?.sync_data().map_err(Errno::from)
    }

    fn maintain(&mut self, tree: &mut Tree<Slot>) -> Result<()> {
        if self.garbage > COMPACT_MIN_GARBAGE && self.garbage > self.live {
            self.compact(tree)?;
        }
        Ok(())
    }
}

impl MetaFs<PackStore> {
    /// A pack file system kept in `dir` (created if missing); what an
    /// earlier instance stored there is loaded.
    pub fn new(dir: impl AsRef<Path>) -> io::Result<PackFs> {
        let dir = dir.as_ref().to_path_buf();
        std::fs::create_dir_all(&dir)?;
        let tree: Tree<Slot> = Tree::open(&dir.join("index"))?;
        let mut store = PackStore {
            dir: dir.clone(),
            containers: HashMap::new(),
            active: 0,
            tail: 0,
            garbage: 0,
            live: 0,
        };
        for entry in std::fs::read_dir(&dir)? {
            let name = entry?.file_name();
            if let Some(id) = name.to_str().and_then(|n| n.strip_prefix("pack-")?.parse::<u32>().ok()) {
                store.open_container(id)?;
            }
        }
        for n in tree
            .nodes
            .values()
            .filter(|n| n.kind == FileType::Regular && n.payload.cap > 0)
        {
            if !store.containers.contains_key(&n.payload.container) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{}: index names container pack-{} that is missing",
                        dir.display(),
                        n.payload.container
                    ),
                ));
            }
        }
        store.active = store.containers.keys().max().copied().unwrap_or(0);
        store.open_container(store.active)?;
        store.recount(&tree);
        Ok(MetaFs::from_parts(tree, store))
    }

    /// Reclaims the space of deleted and moved data now (see the module docs).
    pub fn compact(&self) -> Result<Compaction> {
        self.flush_all()?;
        self.with(|store, tree| store.compact(tree))
    }

    /// Bytes of containers that no file uses, and the number of containers.
    pub fn space(&self) -> (u64, usize) {
        self.with(|store, _| (store.garbage(), store.containers()))
    }
}
