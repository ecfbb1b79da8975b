//! `stripe`: the 1-to-M pattern of DeFUSE. Each file's bytes are spread
//! over K backing files, one in each of K directories.
//!
//! Layout: file offsets `[i·S, (i+1)·S)` live in chunk `i` (S = stripe
//! size), in `DIR_i/data/<inode>`; the last chunk also holds everything past
//! `K·S`. Namespace and attributes live in one small metadata file,
//! `DIR_0/meta` (the journal of [`crate::pack::tree`]).
//!
//! Why contiguous chunks rather than round-robin stripes: a [`DataMap`]
//! carries at most 16 extents, and round-robin striping of a file larger
//! than 16 stripes needs one extent per stripe, so no map could describe
//! it. With one contiguous range per backing file, every file of any size
//! is described by K ≤ 16 extents, and the map never changes as the file
//! grows (the last extent is open-ended), so a client holding it (the
//! preload shim) never needs a new one. The cost is that a file smaller
//! than S uses one backing file only: spreading comes from large files.
//!
//! Invariant kept by every write and truncate ([`DataMap::write_at`] and
//! [`Storage::truncate`]): a chunk is non-empty only when all chunks before
//! it are full, so the file size is the sum of the chunk sizes. The size is
//! taken from the chunks, not the metadata, so data written through the map
//! past the daemon (kernel passthrough when K = 1) is seen.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;

use shortfuse::{DataMap, Errno, Extent, Result};

use crate::pack::metafs::{MetaFs, Storage};
use crate::pack::tree::{Payload, Tree};
use crate::passthrough::sys;

/// Which chunk files hold a file: `DIR_i/data/<id>`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Chunks {
    pub id: u64,
}

impl Payload for Chunks {
    fn encode(&self) -> String {
        self.id.to_string()
    }

    fn decode(f: &[&str]) -> Option<Chunks> {
        Some(Chunks {
            id: f.first()?.parse().ok()?,
        })
    }
}

/// The chunk directories and the open chunk files.
pub struct StripeStore {
    dirs: Vec<PathBuf>,
    stripe: u64,
    open: HashMap<u64, Vec<Arc<OwnedFd>>>,
}

/// The stripe file system.
pub type StripeFs = MetaFs<StripeStore>;

impl StripeStore {
    fn path(&self, i: usize, id: u64) -> PathBuf {
        self.dirs[i].join("data").join(id.to_string())
    }

    /// The chunk files of `p`: those kept while the file is open, or
    /// opened for the caller alone.
    fn chunks(&self, p: &Chunks) -> Result<Vec<Arc<OwnedFd>>> {
        if let Some(c) = self.open.get(&p.id) {
            return Ok(c.clone());
        }
        (0..self.dirs.len())
            .map(|i| {
                let f = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(self.path(i, p.id))
                    .map_err(Errno::from)?;
                Ok(Arc::new(OwnedFd::from(f)))
            })
            .collect()
    }

    /// Bytes chunk `i` holds when the file has `size` bytes.
    fn chunk_len(&self, i: usize, size: u64) -> u64 {
        let start = i as u64 * self.stripe;
        let rest = size.saturating_sub(start);
        if i + 1 == self.dirs.len() {
            rest
        } else {
            rest.min(self.stripe)
        }
    }
}

fn as_file(fd: &Arc<OwnedFd>) -> Result<std::fs::File> {
    fd.try_clone().map(std::fs::File::from).map_err(Errno::from)
}

impl Storage for StripeStore {
    type Payload = Chunks;

    fn create(&mut self, ino: u64) -> Result<Chunks> {
        let p = Chunks { id: ino };
        // A chunk left by an inode number used before a restart is stale.
        for fd in self.chunks(&p)? {
            as_file(&fd)?.set_len(0).map_err(Errno::from)?;
        }
        Ok(p)
    }

    fn read(&mut self, p: &Chunks, size: u64, off: u64, buf: &mut [u8]) -> Result<usize> {
        self.map(p, size)?.read_at(off, buf).map_err(Errno::from)
    }

    fn write(&mut self, p: &mut Chunks, size: u64, off: u64, data: &[u8]) -> Result<()> {
        self.map(p, size)?.write_at(off, data).map_err(Errno::from)?;
        Ok(())
    }

    fn truncate(&mut self, p: &mut Chunks, _size: u64, new: u64) -> Result<()> {
        let fds = self.chunks(p)?;
        for (i, fd) in fds.iter().enumerate() {
            as_file(fd)?.set_len(self.chunk_len(i, new)).map_err(Errno::from)?;
        }
        Ok(())
    }

    fn punch(&mut self, p: &Chunks, _size: u64, off: u64, len: u64) -> Result<()> {
        use std::os::fd::AsFd;
        let fds = self.chunks(p)?;
        let end = off + len;
        for (i, fd) in fds.iter().enumerate() {
            let start = i as u64 * self.stripe;
            let stop = if i + 1 == fds.len() {
                u64::MAX
            } else {
                start + self.stripe
            };
            let (from, to) = (off.max(start), end.min(stop));
            if from < to {
                let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
                sys::fallocate(fd.as_fd(), mode, from - start, to - from)?;
            }
        }
        Ok(())
    }

    fn remove(&mut self, p: &Chunks) {
        self.open.remove(&p.id);
        for i in 0..self.dirs.len() {
            if let Err(e) = std::fs::remove_file(self.path(i, p.id)) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!("stripe: removing {}: {e}", self.path(i, p.id).display());
                }
            }
        }
    }

    fn map(&mut self, p: &Chunks, _size: u64) -> Result<DataMap> {
        // Kept until the last close (`closed`).
        let fds = self.chunks(p)?;
        self.open.insert(p.id, fds.clone());
        let k = fds.len();
        let extents = fds
            .into_iter()
            .enumerate()
            .map(|(i, backing)| Extent {
                backing,
                file_offset: i as u64 * self.stripe,
                backing_offset: 0,
                len: if i + 1 == k { u64::MAX } else { self.stripe },
            })
            .collect();
        Ok(DataMap { extents })
    }

    fn seek(&mut self, p: &Chunks, size: u64, off: u64, whence: i32) -> Result<u64> {
        use std::os::fd::AsFd;
        let fds = self.chunks(p)?;
        let first = usize::try_from(off / self.stripe)
            .unwrap_or(usize::MAX)
            .min(fds.len() - 1);
        for (i, fd) in fds.iter().enumerate().skip(first) {
            let start = i as u64 * self.stripe;
            let len = self.chunk_len(i, size);
            let local = off.saturating_sub(start);
            if local >= len {
                // Past this chunk's bytes: the file ends here.
                break;
            }
            match sys::lseek(fd.as_fd(), local as i64, whence) {
                // Data within this chunk's bytes.
                Ok(x) if whence == libc::SEEK_DATA && x < len => return Ok(start + x),
                // A hole within them, or the end of a chunk the next does
                // not continue (the last, or one not full).
                Ok(x) if whence == libc::SEEK_HOLE && (x < len || len < self.stripe || i + 1 == fds.len()) => {
                    return Ok((start + x).min(size));
                }
                // No data left in this chunk, or it is full of data to its
                // end: the next chunk goes on.
                Ok(_) | Err(Errno::ENXIO) => {}
                Err(e) => return Err(e),
            }
        }
        if whence == libc::SEEK_DATA {
            Err(Errno::ENXIO)
        } else {
            Ok(size)
        }
    }

    fn size(&mut self, p: &Chunks) -> Option<u64> {
        let mut size = 0;
        match self.open.get(&p.id) {
            Some(fds) => {
                for fd in fds {
                    size += as_file(fd).ok()?.metadata().ok()?.len();
                }
            }
            // A stat of every file looked up must not open its chunks.
            None => {
                for i in 0..self.dirs.len() {
                    size += std::fs::metadata(self.path(i, p.id)).ok()?.len();
                }
            }
        }
        Some(size)
    }

    fn sync(&mut self, p: &Chunks) -> Result<()> {
        for fd in self.chunks(p)? {
            as_file(&fd)?.sync_data().map_err(Errno::from)?;
        }
        Ok(())
    }

    fn closed(&mut self, p: &Chunks) {
        self.open.remove(&p.id);
    }

    fn maintain(&mut self, _tree: &mut Tree<Chunks>) -> Result<()> {
        Ok(())
    }
}

impl MetaFs<StripeStore> {
    /// From a mount's SOURCE (`DIR1,DIR2,...`) and the options meant for
    /// the file system (`stripe_size=N`, default 1 MiB), as `shortfuse
    /// mount` and `shortfuse run` spell them.
    pub fn with_options(source: &str, opts: &[(String, Option<String>)]) -> io::Result<StripeFs> {
        let invalid = |msg: String| io::Error::new(io::ErrorKind::InvalidInput, msg);
        let dirs: Vec<PathBuf> = source.split(',').map(PathBuf::from).collect();
        let mut stripe_size = 1 << 20;
        for (k, v) in opts {
            match k.as_str() {
                "stripe_size" => {
                    stripe_size = shortfuse::options::size_value(k, v.as_deref(), 4096, 1 << 40)
                        .map_err(|e| invalid(format!("-o stripe_size: {e}")))?
                }
                _ => return Err(invalid(format!("-o {k}: not an option of stripe"))),
            }
        }
        StripeFs::new(dirs, stripe_size)
    }

    /// A stripe file system over `dirs` (1 to 16 directories, created if
    /// missing) with chunks of `stripe_size` bytes; what an earlier instance
    /// stored there is loaded. The directories must be given in the same
    /// order every time.
    pub fn new(dirs: Vec<PathBuf>, stripe_size: u64) -> io::Result<StripeFs> {
        if dirs.is_empty() || dirs.len() > DataMap::MAX_EXTENTS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "stripe needs 1 to {} directories, got {}",
                    DataMap::MAX_EXTENTS,
                    dirs.len()
                ),
            ));
        }
        if stripe_size == 0 || stripe_size > i64::MAX as u64 / 16 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("stripe size {stripe_size} is out of range"),
            ));
        }
        for d in &dirs {
            std::fs::create_dir_all(d.join("data"))?;
        }
        let meta = dirs[0].join("meta");
        let tree: Tree<Chunks> = Tree::open(&meta)?;
        let store = StripeStore {
            dirs,
            stripe: stripe_size,
            open: HashMap::new(),
        };
        Ok(MetaFs::from_parts(tree, store))
    }

    /// Directory `i`'s chunk file of the file with inode number `ino`.
    pub fn chunk_path(&self, i: usize, ino: u64) -> Option<PathBuf> {
        self.with(|store, _| (i < store.dirs.len()).then(|| store.path(i, ino)))
    }

    /// How many files have their chunk files held open (those open).
    pub fn files_held(&self) -> usize {
        self.with(|store, _| store.open.len())
    }
}
