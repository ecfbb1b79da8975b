//! Sparse file contents: a map from 4 KiB block index to block. Holes are
//! not stored. The block size matches ext4 with 4 KiB blocks, so that
//! `SEEK_DATA`/`SEEK_HOLE` and `st_blocks` answer as ext4 does.
//!
//! Invariant: every byte of a stored block that lies at or past the file
//! size reads as zero, so growing the file (truncate up, write past the end)
//! never exposes stale bytes.
//!
//! A file that a program maps (see `MemFs::map_file`) moves into a memfd
//! for the rest of its life: the programs map that memfd, and every read,
//! write, truncation and allocation here goes to it, so that the stores
//! through the maps and the file system's bytes are one. The memfd is as
//! long as the file (the size is still the inode's to say), and keeps the
//! holes and unwritten blocks it was given.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use shortfuse::{BackingFile, Errno};

/// Bytes per block.
pub const BLOCK: u64 = 4096;
const BLOCK_USIZE: usize = BLOCK as usize;

/// One stored block.
pub enum Block {
    /// Written data.
    Data(Box<[u8; BLOCK_USIZE]>),
    /// Allocated by `fallocate` but never written: reads as zeros, counts in
    /// `st_blocks`, and is a hole for `SEEK_DATA`/`SEEK_HOLE` (ext4 reports
    /// its unwritten extents the same way).
    Unwritten,
}

fn zeroed() -> Box<[u8; BLOCK_USIZE]> {
    Box::new([0u8; BLOCK_USIZE])
}

/// The contents of a regular file.
#[derive(Default)]
pub struct FileData {
    blocks: BTreeMap<u64, Block>,
    /// Where the bytes live once the file was mapped (see the module doc).
    kernel: Option<Kernel>,
}

/// A mapped file's memfd, and the blocks it held when last counted.
struct Kernel {
    file: BackingFile,
    counted: u64,
}

/// The error of a failed system call.
fn last_errno() -> Errno {
    Errno::from_raw(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO))
}

impl Kernel {
    fn fd(&self) -> i32 {
        self.file.as_raw_fd()
    }

    /// Blocks the memfd holds now, and the change since last counted.
    fn recount(&mut self) -> i64 {
        // SAFETY: fstat of our own descriptor into a stat of our own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(self.fd(), &mut st) } != 0 {
            return 0;
        }
        let now = st.st_blocks as u64 / (BLOCK / 512);
        let delta = now as i64 - self.counted as i64;
        self.counted = now;
        delta
    }

    fn set_len(&self, size: u64) -> Result<(), Errno> {
        // SAFETY: ftruncate of our own descriptor.
        if unsafe { libc::ftruncate(self.fd(), size as libc::off_t) } != 0 {
            return Err(last_errno());
        }
        Ok(())
    }

    fn fallocate(&self, mode: i32, offset: u64, end: u64) -> Result<(), Errno> {
        if end <= offset {
            return Ok(());
        }
        // SAFETY: fallocate of our own descriptor.
        let r = unsafe { libc::fallocate(self.fd(), mode, offset as libc::off_t, (end - offset) as libc::off_t) };
        if r != 0 {
            return Err(last_errno());
        }
        Ok(())
    }

    fn pwrite(&self, offset: u64, data: &[u8]) -> Result<(), Errno> {
        let mut done = 0;
        while done < data.len() {
            let rest = &data[done..];
            // SAFETY: a write from our own slice, with its length.
            let n = unsafe {
                libc::pwrite(
                    self.fd(),
                    rest.as_ptr().cast(),
                    rest.len(),
                    (offset + done as u64) as i64,
                )
            };
            if n <= 0 {
                return Err(if n < 0 { last_errno() } else { Errno::EIO });
            }
            done += n as usize;
        }
        Ok(())
    }

    fn pread(&self, offset: u64, buf: &mut [u8]) -> usize {
        let mut done = 0;
        while done < buf.len() {
            let rest = &mut buf[done..];
            // SAFETY: a read into our own slice, with its length.
            let n = unsafe {
                libc::pread(
                    self.fd(),
                    rest.as_mut_ptr().cast(),
                    rest.len(),
                    (offset + done as u64) as i64,
                )
            };
            if n <= 0 {
                break;
            }
            done += n as usize;
        }
        // Past the memfd's end (never, while it is as long as the file).
        buf[done..].fill(0);
        buf.len()
    }

    fn seek(&self, whence: i32, offset: u64) -> Option<u64> {
        // SAFETY: lseek of our own descriptor (whose offset nothing uses).
        let r = unsafe { libc::lseek(self.fd(), offset as libc::off_t, whence) };
        (r >= 0).then_some(r as u64)
    }
}

impl FileData {
    /// Number of stored blocks (data and unwritten).
    pub fn block_count(&self) -> u64 {
        match &self.kernel {
            Some(k) => k.counted,
            None => self.blocks.len() as u64,
        }
    }

    /// The memfd holding the bytes, made on the first call (see the
    /// module doc) from the blocks of a file of `size` bytes, and the
    /// change in stored blocks.
    pub fn kernel_file(&mut self, size: u64) -> Result<(BackingFile, i64), Errno> {
        if let Some(k) = &self.kernel {
            return Ok((k.file.clone(), 0));
        }
        // SAFETY: a NUL-terminated name.
        let fd = unsafe { libc::memfd_create(c"shortfuse-mem".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(last_errno());
        }
        // SAFETY: a descriptor just made, ours alone.
        let file = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
        let mut k = Kernel { file, counted: 0 };
        k.set_len(size)?;
        for (&idx, block) in &self.blocks {
            let at = idx * BLOCK;
            match block {
                Block::Data(data) => {
                    // Bytes past the size are zero (see the invariant), and not the file's.
                    let len = (size.saturating_sub(at)).min(BLOCK) as usize;
                    k.pwrite(at, &data[..len])?;
                }
                Block::Unwritten => k.fallocate(libc::FALLOC_FL_KEEP_SIZE, at, at + BLOCK)?,
            }
        }
        let before = self.blocks.len() as i64;
        self.blocks.clear();
        let delta = k.recount() - before;
        let file = k.file.clone();
        self.kernel = Some(k);
        Ok((file, delta))
    }

    /// Makes a file grown to `new_size` (by a truncation or an allocation)
    /// that long in its memfd too; stored blocks need nothing.
    pub fn grow(&mut self, new_size: u64) -> Result<(), Errno> {
        match &self.kernel {
            Some(k) => k.set_len(new_size),
            None => Ok(()),
        }
    }

    /// Copies bytes at `offset` into `buf`, up to `size` (the file size).
    /// Returns the number of bytes read.
    pub fn read(&self, size: u64, offset: u64, buf: &mut [u8]) -> usize {
        if offset >= size {
            return 0;
        }
        let len = (buf.len() as u64).min(size - offset) as usize;
        let buf = &mut buf[..len];
        if let Some(k) = &self.kernel {
            return k.pread(offset, buf);
        }
        buf.fill(0);
        let end = offset + len as u64;
        for (&idx, block) in self.blocks.range(offset / BLOCK..end.div_ceil(BLOCK)) {
            if let Block::Data(data) = block {
                let start = (idx * BLOCK).max(offset);
                let stop = ((idx + 1) * BLOCK).min(end);
                let src = &data[(start - idx * BLOCK) as usize..(stop - idx * BLOCK) as usize];
                buf[(start - offset) as usize..(stop - offset) as usize].copy_from_slice(src);
            }
        }
        len
    }

    /// Writes `data` at `offset`; returns the change in stored blocks.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<i64, Errno> {
        if let Some(k) = &mut self.kernel {
            k.pwrite(offset, data)?;
            return Ok(k.recount());
        }
        let mut added = 0i64;
        let end = offset + data.len() as u64;
        let mut pos = offset;
        while pos < end {
            let idx = pos / BLOCK;
            let stop = ((idx + 1) * BLOCK).min(end);
            let block = self.blocks.entry(idx).or_insert_with(|| {
                added += 1;
                Block::Unwritten
            });
            if let Block::Unwritten = block {
                *block = Block::Data(zeroed());
            }
            if let Block::Data(buf) = block {
                buf[(pos - idx * BLOCK) as usize..(stop - idx * BLOCK) as usize]
                    .copy_from_slice(&data[(pos - offset) as usize..(stop - offset) as usize]);
            }
            pos = stop;
        }
        Ok(added)
    }

    /// Zeroes `[from, to)` inside one block without allocating it.
    fn zero_within(&mut self, idx: u64, from: u64, to: u64) {
        if let Some(Block::Data(buf)) = self.blocks.get_mut(&idx) {
            buf[(from - idx * BLOCK) as usize..(to - idx * BLOCK) as usize].fill(0);
        }
    }

    /// Cuts the file to `new_size` bytes (`old_size` before): frees blocks
    /// past the new end (ext4 frees preallocated blocks past EOF too) and
    /// zeroes the tail of the last block. Returns the change in blocks.
    pub fn truncate(&mut self, new_size: u64) -> i64 {
        if let Some(k) = &mut self.kernel {
            // Shrinking a memfd fails only without memory for the call.
            let _ = k.set_len(new_size);
            return k.recount();
        }
        let first_free = new_size.div_ceil(BLOCK);
        let freed = self.blocks.split_off(&first_free);
        if !new_size.is_multiple_of(BLOCK) {
            let idx = new_size / BLOCK;
            self.zero_within(idx, new_size, (idx + 1) * BLOCK);
        }
        -(freed.len() as i64)
    }

    /// `fallocate` mode 0: allocates every hole in `[offset, end)` as
    /// unwritten blocks. Returns the change in blocks.
    pub fn allocate(&mut self, offset: u64, end: u64) -> Result<i64, Errno> {
        if let Some(k) = &mut self.kernel {
            k.fallocate(libc::FALLOC_FL_KEEP_SIZE, offset, end)?;
            return Ok(k.recount());
        }
        let mut added = 0;
        for idx in offset / BLOCK..end.div_ceil(BLOCK) {
            self.blocks.entry(idx).or_insert_with(|| {
                added += 1;
                Block::Unwritten
            });
        }
        Ok(added)
    }

    /// `FALLOC_FL_PUNCH_HOLE`: frees whole blocks in `[offset, end)` and
    /// zeroes the partial blocks at either edge. Returns the change in blocks.
    pub fn punch(&mut self, offset: u64, end: u64) -> i64 {
        if let Some(k) = &mut self.kernel {
            let _ = k.fallocate(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, offset, end);
            return k.recount();
        }
        let mut removed = 0i64;
        let first_full = offset.div_ceil(BLOCK);
        let last_full = end / BLOCK; // exclusive
        if first_full < last_full {
            let keys: Vec<u64> = self.blocks.range(first_full..last_full).map(|(k, _)| *k).collect();
            for k in keys {
                self.blocks.remove(&k);
                removed += 1;
            }
        }
        self.zero_edges(offset, end);
        -removed
    }

    /// Zeroes the partial blocks at the edges of `[offset, end)`.
    fn zero_edges(&mut self, offset: u64, end: u64) {
        let head = offset / BLOCK;
        let tail = end / BLOCK;
        if head == tail {
            self.zero_within(head, offset, end);
            return;
        }
        if !offset.is_multiple_of(BLOCK) {
            self.zero_within(head, offset, (head + 1) * BLOCK);
        }
        if !end.is_multiple_of(BLOCK) {
            self.zero_within(tail, tail * BLOCK, end);
        }
    }

    /// `FALLOC_FL_ZERO_RANGE`: whole blocks become unwritten, partial edge
    /// blocks become zeroed data (ext4 allocates the edges and writes zeros
    /// into them). Returns the change in blocks.
    pub fn zero_range(&mut self, offset: u64, end: u64) -> Result<i64, Errno> {
        if let Some(k) = &mut self.kernel {
            // A memfd has no zero-range: a hole, then allocated.
            k.fallocate(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, offset, end)?;
            k.fallocate(libc::FALLOC_FL_KEEP_SIZE, offset, end)?;
            return Ok(k.recount());
        }
        let mut delta = 0i64;
        let first_full = offset.div_ceil(BLOCK);
        let last_full = end / BLOCK;
        for idx in first_full..last_full.max(first_full) {
            if self.blocks.insert(idx, Block::Unwritten).is_none() {
                delta += 1;
            }
        }
        let mut edges = Vec::with_capacity(2);
        if !offset.is_multiple_of(BLOCK) || (offset / BLOCK == end / BLOCK) {
            edges.push(offset / BLOCK);
        }
        if !end.is_multiple_of(BLOCK) && end / BLOCK != offset / BLOCK {
            edges.push(end / BLOCK);
        }
        for idx in edges {
            let block = self.blocks.entry(idx).or_insert_with(|| {
                delta += 1;
                Block::Unwritten
            });
            if let Block::Unwritten = block {
                *block = Block::Data(zeroed());
            }
        }
        self.zero_edges(offset, end);
        Ok(delta)
    }

    /// `SEEK_DATA`: the first offset at or after `offset` inside written
    /// data, or `None` (ENXIO) when only holes follow before `size`.
    pub fn seek_data(&self, size: u64, offset: u64) -> Option<u64> {
        if offset >= size {
            return None;
        }
        if let Some(k) = &self.kernel {
            return k.seek(libc::SEEK_DATA, offset).filter(|&at| at < size);
        }
        let found = self
            .blocks
            .range(offset / BLOCK..)
            .find(|(_, b)| matches!(b, Block::Data(_)))
            .map(|(idx, _)| (idx * BLOCK).max(offset))?;
        (found < size).then_some(found)
    }

    /// `SEEK_HOLE`: the first offset at or after `offset` inside a hole;
    /// the end of the file counts as a hole. `None` (ENXIO) past the end.
    pub fn seek_hole(&self, size: u64, offset: u64) -> Option<u64> {
        if offset >= size {
            return None;
        }
        if let Some(k) = &self.kernel {
            return Some(k.seek(libc::SEEK_HOLE, offset).unwrap_or(size).min(size));
        }
        let mut idx = offset / BLOCK;
        for (&k, b) in self.blocks.range(idx..) {
            if k != idx || !matches!(b, Block::Data(_)) {
                break;
            }
            idx += 1;
        }
        Some((idx * BLOCK).max(offset).min(size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_read_across_blocks() {
        let mut f = FileData::default();
        let data: Vec<u8> = (0..10000u32).map(|i| i as u8).collect();
        assert_eq!(f.write(100, &data), Ok(3));
        let mut buf = vec![0xffu8; 10200];
        assert_eq!(f.read(10100, 0, &mut buf), 10100);
        assert!(buf[..100].iter().all(|&b| b == 0));
        assert_eq!(&buf[100..10100], &data[..]);
    }

    #[test]
    fn truncate_zeroes_tail() {
        let mut f = FileData::default();
        f.write(0, &[7u8; 5000]).unwrap();
        assert_eq!(f.truncate(10), -1);
        let mut buf = [1u8; 20];
        // Regrown: the old bytes past 10 must not come back.
        assert_eq!(f.read(20, 0, &mut buf), 20);
        assert_eq!(&buf[..10], &[7u8; 10]);
        assert_eq!(&buf[10..], &[0u8; 10]);
    }

    #[test]
    fn seek_over_unwritten() {
        let mut f = FileData::default();
        f.allocate(0, 3 * BLOCK).unwrap();
        f.write(BLOCK, b"x").unwrap();
        assert_eq!(f.seek_data(3 * BLOCK, 0), Some(BLOCK));
        assert_eq!(f.seek_hole(3 * BLOCK, BLOCK), Some(2 * BLOCK));
        assert_eq!(f.seek_hole(3 * BLOCK, 0), Some(0));
        assert_eq!(f.seek_data(3 * BLOCK, 2 * BLOCK), None);
    }

    #[test]
    fn a_mapped_file_is_one_set_of_bytes_with_its_map() {
        let mut f = FileData::default();
        f.write(0, b"hello").unwrap();
        f.write(3 * BLOCK, b"far").unwrap();
        let size = 3 * BLOCK + 3;
        let (file, delta) = f.kernel_file(size).unwrap();
        assert_eq!(delta, 0, "the same two blocks, now in the memfd");
        let mut buf = [0u8; 5];
        assert_eq!(f.read(size, 0, &mut buf), 5);
        assert_eq!(&buf, b"hello");
        assert_eq!(f.seek_data(size, BLOCK), Some(3 * BLOCK), "the hole stayed one");
        // SAFETY: a shared map of our own memfd, unmapped below.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED);
        // SAFETY: within the map, which is as long as the file.
        let bytes = unsafe { std::slice::from_raw_parts_mut(map.cast::<u8>(), size as usize) };
        bytes[0] = b'J';
        assert_eq!(f.read(size, 0, &mut buf), 5);
        assert_eq!(&buf, b"Jello", "a store through the map is read");
        f.write(1, b"ELLO").unwrap();
        assert_eq!(&bytes[..5], b"JELLO", "a write is seen in the map");
        assert_eq!(f.truncate(2), -1);
        f.grow(size).unwrap();
        assert_eq!(&bytes[..5], b"JE\0\0\0");
        // SAFETY: the map made above.
        unsafe { libc::munmap(map, size as usize) };
    }
}
