//! `hello.rs` on the node layer: the library keeps node ids, lookup counts
//! and directory offsets. Run: `cargo run --example hello_nodes -- /mnt/hello`.

use std::ffi::OsStr;
use std::sync::Arc;

use shortfuse::{
    read_slice, serve, Attr, DirItem, Errno, FileType, MountOptions, Node, NodeFs, Request, SessionOptions,
};

struct Root(Arc<Hello>);
struct Hello;

const TEXT: &[u8] = b"hello from shortfuse\n";

impl Node for Root {
    fn getattr(&self, _req: &Request) -> shortfuse::Result<Attr> {
        Ok(Attr::new(FileType::Directory, 0o755))
    }

    fn lookup(&self, _req: &Request, name: &OsStr) -> shortfuse::Result<Arc<dyn Node>> {
        match name.as_encoded_bytes() {
            b"hello" => Ok(self.0.clone()),
            _ => Err(Errno::ENOENT),
        }
    }

    fn readdir(&self, _req: &Request) -> shortfuse::Result<Vec<DirItem>> {
        Ok(vec![DirItem::new("hello", FileType::Regular)])
    }
}

impl Node for Hello {
    fn getattr(&self, _req: &Request) -> shortfuse::Result<Attr> {
        Ok(Attr::new(FileType::Regular, 0o444).with_size(TEXT.len() as u64))
    }

    fn read(&self, _req: &Request, offset: u64, buf: &mut [u8]) -> shortfuse::Result<usize> {
        Ok(read_slice(TEXT, offset, buf))
    }
}

fn main() -> std::io::Result<()> {
    let mount_point = std::env::args_os().nth(1).expect("usage: hello_nodes MOUNTPOINT");
    let fs = NodeFs::new(Arc::new(Root(Arc::new(Hello))));
    let opts = MountOptions {
        ro: true,
        ..MountOptions::default()
    };
    serve(Arc::new(fs), mount_point.as_ref(), opts, SessionOptions::default())
}
