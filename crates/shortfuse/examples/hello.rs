//! A read-only file system with one file, `/hello`.
//! Run: `cargo run --example hello -- /mnt/hello` (as root), then `cat /mnt/hello/hello`.

use std::ffi::OsStr;
use std::sync::Arc;

use shortfuse::{
    serve, Attr, DirSink, Entry, Errno, FileHandle, FileType, Filesystem, MountOptions, NodeId, Request, SessionOptions,
};

const TEXT: &[u8] = b"hello from shortfuse\n";
const FILE: NodeId = NodeId(2);

struct Hello;

fn attr(node: NodeId) -> Attr {
    let attr = match node {
        NodeId::ROOT => Attr::new(FileType::Directory, 0o755),
        _ => Attr::new(FileType::Regular, 0o444).with_size(TEXT.len() as u64),
    };
    Attr { ino: node.0, ..attr }
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
        Ok(shortfuse::read_slice(TEXT, off, buf))
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
