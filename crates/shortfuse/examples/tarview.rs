//! A tar archive mounted read-only as a tree, on the node layer
//! ([`shortfuse::node`]): each member is a node, a hard link is the same
//! node under two names, and file data is read from the archive in place.
//! Run: `cargo run --example tarview -- ARCHIVE.tar /mnt/tar` (as root).
//!
//! Reads the POSIX ustar format (`tar --format=ustar`, also what GNU tar
//! writes for short names): regular files, directories, symbolic and hard
//! links. Members of other types (devices, FIFOs) and the extended headers
//! of pax and GNU long names are skipped with a line on stderr.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use shortfuse::{
    serve, Attr, DirItem, Errno, FileType, MountOptions, Node, NodeFs, Request, SessionOptions, Timestamp,
};

/// A directory: its children by name, fixed once the archive is read.
struct Dir {
    attr: Attr,
    children: BTreeMap<OsString, (Arc<dyn Node>, FileType)>,
}

impl Node for Dir {
    fn getattr(&self, _req: &Request) -> shortfuse::Result<Attr> {
        Ok(self.attr)
    }

    fn lookup(&self, _req: &Request, name: &OsStr) -> shortfuse::Result<Arc<dyn Node>> {
        self.children.get(name).map(|(n, _)| n.clone()).ok_or(Errno::ENOENT)
    }

    fn readdir(&self, _req: &Request) -> shortfuse::Result<Vec<DirItem>> {
        Ok(self
            .children
            .iter()
            .map(|(name, (_, kind))| DirItem::new(name.clone(), *kind))
            .collect())
    }
}

/// A regular file: `attr.size` bytes at `offset` in the archive.
struct Member {
    attr: Attr,
    archive: Arc<File>,
    offset: u64,
}

impl Node for Member {
    fn getattr(&self, _req: &Request) -> shortfuse::Result<Attr> {
        Ok(self.attr)
    }

    fn read(&self, _req: &Request, offset: u64, buf: &mut [u8]) -> shortfuse::Result<usize> {
        let left = self.attr.size.saturating_sub(offset);
        let n = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        self.archive
            .read_exact_at(&mut buf[..n], self.offset + offset)
            .map_err(Errno::from)?;
        Ok(n)
    }
}

/// A symbolic link.
struct Link {
    attr: Attr,
    target: Vec<u8>,
}

impl Node for Link {
    fn getattr(&self, _req: &Request) -> shortfuse::Result<Attr> {
        Ok(self.attr)
    }

    fn readlink(&self, _req: &Request) -> shortfuse::Result<Vec<u8>> {
        Ok(self.target.clone())
    }
}

/// One ustar header block, decoded.
struct Header {
    path: Vec<u8>,
    kind: u8,
    size: u64,
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: i64,
    link: Vec<u8>,
}

fn field(block: &[u8], at: usize, len: usize) -> &[u8] {
    let f = &block[at..at + len];
    &f[..f.iter().position(|&b| b == 0).unwrap_or(len)]
}

fn octal(block: &[u8], at: usize, len: usize) -> io::Result<u64> {
    let text = field(block, at, len);
    let digits = std::str::from_utf8(text)
        .unwrap_or("")
        .trim_matches(|c| c == ' ' || c == '\0');
    if digits.is_empty() {
        return Ok(0);
    }
    u64::from_str_radix(digits, 8).map_err(|_| bad(format!("bad number {text:?} in a header")))
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

impl Header {
    /// `None` at the end-of-archive block (all zeros).
    fn parse(block: &[u8; 512]) -> io::Result<Option<Header>> {
        if block.iter().all(|&b| b == 0) {
            return Ok(None);
        }
        let sum: u64 = block
            .iter()
            .enumerate()
            .map(|(i, &b)| {
                if (148..156).contains(&i) {
                    u64::from(b' ')
                } else {
                    u64::from(b)
                }
            })
            .sum();
        if sum != octal(block, 148, 8)? {
            return Err(bad(
                "header checksum mismatch: not a tar archive, or a damaged one".into()
            ));
        }
        if field(block, 257, 5) != b"ustar" {
            return Err(bad("not a ustar archive (make it with tar --format=ustar)".into()));
        }
        let mut path = field(block, 345, 155).to_vec();
        if !path.is_empty() {
            path.push(b'/');
        }
        path.extend_from_slice(field(block, 0, 100));
        Ok(Some(Header {
            path,
            kind: block[156],
            size: octal(block, 124, 12)?,
            mode: octal(block, 100, 8)? as u32 & 0o7777,
            uid: octal(block, 108, 8)? as u32,
            gid: octal(block, 116, 8)? as u32,
            mtime: octal(block, 136, 12)? as i64,
            link: field(block, 157, 100).to_vec(),
        }))
    }

    fn attr(&self, kind: FileType, size: u64) -> Attr {
        let t = Timestamp {
            sec: self.mtime,
            nsec: 0,
        };
        Attr {
            size,
            blocks: size.div_ceil(512),
            atime: t,
            mtime: t,
            ctime: t,
            mode: kind.mode_bits() | self.mode,
            nlink: if kind == FileType::Directory { 2 } else { 1 },
            uid: self.uid,
            gid: self.gid,
            blksize: 4096,
            ..Attr::default()
        }
    }
}

/// A directory while the archive is read.
#[derive(Default)]
struct Building {
    attr: Option<Attr>,
    dirs: BTreeMap<OsString, Building>,
    leaves: BTreeMap<OsString, (Arc<dyn Node>, FileType)>,
}

impl Building {
    /// The directory at `parts`, made on the way.
    fn dir(&mut self, parts: &[&[u8]]) -> &mut Building {
        parts
            .iter()
            .fold(self, |d, p| d.dirs.entry(OsStr::from_bytes(p).into()).or_default())
    }

    fn finish(self, default: Attr) -> Arc<dyn Node> {
        let mut children = self.leaves;
        for (name, d) in self.dirs {
            children.insert(name, (d.finish(default), FileType::Directory));
        }
        Arc::new(Dir {
            attr: self.attr.unwrap_or(default),
            children,
        })
    }
}

fn components(path: &[u8]) -> Vec<&[u8]> {
    path.split(|&b| b == b'/')
        .filter(|p| !p.is_empty() && *p != b".")
        .collect()
}

/// Reads the archive's headers and builds the tree (data stays in the file).
fn read_tree(archive: File) -> io::Result<Arc<dyn Node>> {
    let archive = Arc::new(archive);
    let mut root = Building::default();
    let mut files: HashMap<Vec<u8>, Arc<dyn Node>> = HashMap::new();
    let mut at = 0u64;
    let mut block = [0u8; 512];
    loop {
        archive.read_exact_at(&mut block, at)?;
        let Some(h) = Header::parse(&block)? else { break };
        at += 512;
        let parts = components(&h.path);
        let Some((name, dirs)) = parts.split_last() else {
            at += h.size.div_ceil(512) * 512;
            continue;
        };
        let name = OsString::from_vec(name.to_vec());
        let key = parts.join(&b'/');
        match h.kind {
            b'0' | 0 | b'7' => {
                let node: Arc<dyn Node> = Arc::new(Member {
                    attr: h.attr(FileType::Regular, h.size),
                    archive: archive.clone(),
                    offset: at,
                });
                files.insert(key, node.clone());
                root.dir(dirs).leaves.insert(name, (node, FileType::Regular));
            }
            b'5' => root.dir(&parts).attr = Some(h.attr(FileType::Directory, 0)),
            b'2' => {
                let node = Arc::new(Link {
                    attr: h.attr(FileType::Symlink, h.link.len() as u64),
                    target: h.link.clone(),
                });
                root.dir(dirs).leaves.insert(name, (node, FileType::Symlink));
            }
            b'1' => match files.get(&components(&h.link).join(&b'/')) {
                // The same node under a second name: one inode to the kernel.
                Some(node) => {
                    root.dir(dirs).leaves.insert(name, (node.clone(), FileType::Regular));
                }
                None => eprintln!(
                    "tarview: {}: hard link to a missing member",
                    String::from_utf8_lossy(&h.path)
                ),
            },
            other => eprintln!(
                "tarview: {}: member type {:?} skipped",
                String::from_utf8_lossy(&h.path),
                other as char
            ),
        }
        at += h.size.div_ceil(512) * 512;
    }
    let default = Attr {
        mode: FileType::Directory.mode_bits() | 0o755,
        nlink: 2,
        ..Attr::default()
    };
    Ok(root.finish(default))
}

fn main() -> io::Result<()> {
    let mut args = std::env::args_os().skip(1);
    let (Some(archive), Some(mount_point)) = (args.next(), args.next()) else {
        eprintln!("usage: tarview ARCHIVE.tar MOUNTPOINT");
        std::process::exit(2);
    };
    let root = read_tree(File::open(&archive)?)?;
    let opts = MountOptions {
        ro: true,
        fsname: Some(archive.to_string_lossy().into_owned()),
        subtype: Some("tarview".into()),
        // The archive does not change under us: the kernel may keep it all.
        keep_cache: true,
        ..MountOptions::default()
    };
    serve(
        Arc::new(NodeFs::new(root)),
        mount_point.as_ref(),
        opts,
        SessionOptions::default(),
    )
}
