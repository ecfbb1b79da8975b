//! Sparse file contents: a map from 4 KiB block index to block. Holes are
//! not stored. The block size matches ext4 with 4 KiB blocks, so that
//! `SEEK_DATA`/`SEEK_HOLE` and `st_blocks` answer as ext4 does.
//!
//! Invariant: every byte of a stored block that lies at or past the file
//! size reads as zero, so growing the file (truncate up, write past the end)
//! never exposes stale bytes.

use std::collections::BTreeMap;

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
}

impl FileData {
    /// Number of stored blocks (data and unwritten).
    pub fn block_count(&self) -> u64 {
        self.blocks.len() as u64
    }

    /// Copies bytes at `offset` into `buf`, up to `size` (the file size).
    /// Returns the number of bytes read.
    pub fn read(&self, size: u64, offset: u64, buf: &mut [u8]) -> usize {
        if offset >= size {
            return 0;
        }
        let len = (buf.len() as u64).min(size - offset) as usize;
        let buf = &mut buf[..len];
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
    pub fn write(&mut self, offset: u64, data: &[u8]) -> i64 {
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
        added
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
    pub fn allocate(&mut self, offset: u64, end: u64) -> i64 {
        let mut added = 0;
        for idx in offset / BLOCK..end.div_ceil(BLOCK) {
            self.blocks.entry(idx).or_insert_with(|| {
                added += 1;
                Block::Unwritten
            });
        }
        added
    }

    /// `FALLOC_FL_PUNCH_HOLE`: frees whole blocks in `[offset, end)` and
    /// zeroes the partial blocks at either edge. Returns the change in blocks.
    pub fn punch(&mut self, offset: u64, end: u64) -> i64 {
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
    pub fn zero_range(&mut self, offset: u64, end: u64) -> i64 {
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
        delta
    }

    /// `SEEK_DATA`: the first offset at or after `offset` inside written
    /// data, or `None` (ENXIO) when only holes follow before `size`.
    pub fn seek_data(&self, size: u64, offset: u64) -> Option<u64> {
        if offset >= size {
            return None;
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
        assert_eq!(f.write(100, &data), 3);
        let mut buf = vec![0xffu8; 10200];
        assert_eq!(f.read(10100, 0, &mut buf), 10100);
        assert!(buf[..100].iter().all(|&b| b == 0));
        assert_eq!(&buf[100..10100], &data[..]);
    }

    #[test]
    fn truncate_zeroes_tail() {
        let mut f = FileData::default();
        f.write(0, &[7u8; 5000]);
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
        f.allocate(0, 3 * BLOCK);
        f.write(BLOCK, b"x");
        assert_eq!(f.seek_data(3 * BLOCK, 0), Some(BLOCK));
        assert_eq!(f.seek_hole(3 * BLOCK, BLOCK), Some(2 * BLOCK));
        assert_eq!(f.seek_hole(3 * BLOCK, 0), Some(0));
        assert_eq!(f.seek_data(3 * BLOCK, 2 * BLOCK), None);
    }
}
