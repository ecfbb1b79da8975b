//! A read-only file system with one file, `/hello`.
//! Run: `cargo run --example hello -- /mnt/hello` (as root), then `cat /mnt/hello/hello`.

use std::ffi::OsStr;
use std::sync::Arc;

use shortfuse::session::{serve, SessionOptions};
use shortfuse::{Attr, DirSink, Entry, Errno, FileHandle, FileType, Filesystem, MountOptions, NodeId, Request};

const TEXT: &[u8] = b"hello from shortfuse\n";
const FILE: NodeId = NodeId(2);

struct Hello;

fn attr(node: NodeId) -> Attr {
    let (mode, size, nlink) = match node {
        NodeId::ROOT => (libc::S_IFDIR | 0o755, 0, 2),
        _ => (libc::S_IFREG | 0o444, TEXT.len() as u64, 1),
    };
    Attr {
        ino: node.0,
        mode,
        size,
        nlink,
        blksize: 4096,
        ..Attr::default()
    }
}

impl Filesystem for Hello {
    fn lookup(&self, _req: &Request, parent: NodeId, name: &OsStr) -> shortfuse::Result<Entry> {
        match (parent, name.as_encoded_bytes()) {
            (NodeId::ROOT, b"hello") => Ok(Entry::new(FILE, attr(FILE))),
            _ => Err(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, node: NodeId, _fh: Option<FileHandle>) -> shortfuse::Result<Attr> {
        Ok(attr(node))
    }

    fn read(
        &self,
        _req: &Request,
        _node: NodeId,
        _fh: FileHandle,
        off: u64,
        buf: &mut [u8],
    ) -> shortfuse::Result<usize> {
        let rest = TEXT.get(off as usize..).unwrap_or_default();
        let n = rest.len().min(buf.len());
        buf[..n].copy_from_slice(&rest[..n]);
        Ok(n)
    }

    fn readdir(
        &self,
        _req: &Request,
        _node: NodeId,
        _fh: FileHandle,
        offset: u64,
        sink: &mut dyn DirSink,
    ) -> shortfuse::Result<()> {
        let entries = [
            (1, FileType::Directory, "."),
            (1, FileType::Directory, ".."),
            (2, FileType::Regular, "hello"),
        ];
        for (i, (ino, typ, name)) in entries.iter().enumerate().skip(offset as usize) {
            if !sink.add(*ino, i as u64 + 1, *typ, OsStr::new(name)) {
                break;
            }
        }
        Ok(())
    }
}

fn main() -> std::io::Result<()> {
    let mount_point = std::env::args_os().nth(1).expect("usage: hello MOUNTPOINT");
    let opts = MountOptions {
        ro: true,
        ..MountOptions::default()
    };
    serve(Arc::new(Hello), mount_point.as_ref(), opts, SessionOptions::default())
}
