//! `null`: NullFS from RFUSE (FAST '24). Every lookup below the root fails, create
//! succeeds at once without keeping anything: it measures the transport and
//! nothing else.

use std::ffi::OsStr;
use std::time::Duration;

use shortfuse::{
    Attr, Created, Entry, Errno, FileHandle, Filesystem, NewNode, NodeId, OpenFlags, Opened, Request, Result, Statfs,
    Timestamp,
};

/// The null file system.
#[derive(Default)]
pub struct NullFs {
    started: Timestamp,
}

/// Node id handed out for every created file; never looked up again.
const CREATED: NodeId = NodeId(2);

impl NullFs {
    pub fn new() -> NullFs {
        NullFs {
            started: Timestamp::now(),
        }
    }

    fn attr(&self, node: NodeId, mode: u32) -> Attr {
        Attr {
            ino: node.0,
            mode,
            nlink: if mode & libc::S_IFMT == libc::S_IFDIR { 2 } else { 1 },
            atime: self.started,
            mtime: self.started,
            ctime: self.started,
            blksize: 4096,
            ..Attr::default()
        }
    }
}

impl Filesystem for NullFs {
    fn lookup(&self, _req: &Request, _parent: NodeId, _name: &OsStr) -> Result<Entry> {
        Err(Errno::ENOENT)
    }

    fn getattr(&self, _req: &Request, node: NodeId, _fh: Option<FileHandle>) -> Result<Attr> {
        if node == NodeId::ROOT {
            Ok(self.attr(node, libc::S_IFDIR | 0o777))
        } else {
            Ok(self.attr(node, libc::S_IFREG | 0o666))
        }
    }

    fn create(
        &self,
        _req: &Request,
        _parent: NodeId,
        _name: &OsStr,
        new: &NewNode,
        _flags: OpenFlags,
    ) -> Result<Created> {
        // A zero TTL keeps the kernel from caching a name that does not exist.
        let mut entry = Entry::new(CREATED, self.attr(CREATED, libc::S_IFREG | (new.mode & 0o7777)));
        entry.ttl = Some(Duration::ZERO);
        Ok(Created {
            entry,
            opened: Opened::default(),
        })
    }

    fn read(&self, _req: &Request, _node: NodeId, _fh: FileHandle, _offset: u64, _buf: &mut [u8]) -> Result<usize> {
        Ok(0)
    }

    fn write(
        &self,
        _req: &Request,
        _node: NodeId,
        _fh: FileHandle,
        data: &[u8],
        _args: &shortfuse::WriteArgs,
    ) -> Result<usize> {
        Ok(data.len())
    }

    fn opendir(&self, _req: &Request, _node: NodeId, _flags: OpenFlags) -> Result<Opened> {
        Ok(Opened::default())
    }

    fn readdir(
        &self,
        _req: &Request,
        _node: NodeId,
        _fh: FileHandle,
        offset: u64,
        sink: &mut dyn shortfuse::DirSink,
    ) -> Result<()> {
        let dots: [(&str, u64); 2] = [(".", 1), ("..", 1)];
        for (i, (name, ino)) in dots.iter().enumerate().skip(offset as usize) {
            if !sink.add(*ino, i as u64 + 1, shortfuse::FileType::Directory, OsStr::new(name)) {
                break;
            }
        }
        Ok(())
    }

    fn statfs(&self, _req: &Request, _node: NodeId) -> Result<Statfs> {
        Ok(Statfs {
            bsize: 4096,
            frsize: 4096,
            namelen: 255,
            ..Statfs::default()
        })
    }
}
