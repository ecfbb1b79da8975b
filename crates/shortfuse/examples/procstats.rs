//! Generated content, as /proc does it, on the node layer
//! ([`shortfuse::node`]): files whose text is made when they are opened,
//! describing the daemon itself, and a directory whose names come and go
//! (one file per thread of the daemon).
//! Run: `cargo run --example procstats -- /mnt/stats` (as root), then
//! `cat /mnt/stats/*` or `head /mnt/stats/threads/*`.
//!
//! - `uptime`: seconds since the daemon started
//! - `opens`: how many files were opened (this one included)
//! - `nodes`: nodes the kernel holds (the node layer's count)
//! - `memory`: the daemon's resident memory and threads, from /proc/self/status
//! - `threads/TID`: the name of each thread of the daemon
//!
//! Each file is generated once per open and read from that snapshot, so a
//! reader sees one consistent text; sizes are unknown in advance, so files
//! report size 0 (as in /proc) and are opened with direct I/O, which makes
//! the kernel ask for the data whatever the size says.

use std::ffi::OsStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Instant;

use shortfuse::{
    read_slice, serve, Attr, DirItem, Errno, FileType, FopenFlags, Handle, MountOptions, Node, NodeFs, Open, OpenFlags,
    Request, SessionOptions,
};

/// What the files describe.
struct Daemon {
    started: Instant,
    opens: AtomicU64,
    fs: OnceLock<Weak<NodeFs>>,
}

type Generate = Box<dyn Fn(&Daemon) -> Vec<u8> + Send + Sync>;

/// A file whose text `generate` makes at each open.
struct Generated {
    daemon: Arc<Daemon>,
    generate: Generate,
}

/// One open's snapshot of the text.
struct Snapshot(Vec<u8>);

impl Handle for Snapshot {
    fn read(&self, _req: &Request, offset: u64, buf: &mut [u8]) -> shortfuse::Result<usize> {
        Ok(read_slice(&self.0, offset, buf))
    }
}

fn file_attr() -> Attr {
    Attr {
        mode: FileType::Regular.mode_bits() | 0o444,
        nlink: 1,
        ..Attr::default()
    }
}

impl Node for Generated {
    fn getattr(&self, _req: &Request) -> shortfuse::Result<Attr> {
        Ok(file_attr())
    }

    fn open(&self, _req: &Request, _flags: OpenFlags) -> shortfuse::Result<Open> {
        self.daemon.opens.fetch_add(1, Ordering::Relaxed);
        Ok(Open {
            handle: Some(Box::new(Snapshot((self.generate)(&self.daemon)))),
            flags: FopenFlags {
                direct_io: true,
                ..FopenFlags::default()
            },
        })
    }
}

fn dir_attr() -> Attr {
    Attr {
        mode: FileType::Directory.mode_bits() | 0o555,
        nlink: 2,
        ..Attr::default()
    }
}

/// The root: a fixed set of generated files and `threads`.
struct Root {
    files: Vec<(&'static str, Arc<dyn Node>)>,
    threads: Arc<dyn Node>,
}

impl Node for Root {
    fn getattr(&self, _req: &Request) -> shortfuse::Result<Attr> {
        Ok(dir_attr())
    }

    fn lookup(&self, _req: &Request, name: &OsStr) -> shortfuse::Result<Arc<dyn Node>> {
        if name == "threads" {
            return Ok(self.threads.clone());
        }
        let found = self.files.iter().find(|(n, _)| name == *n);
        found.map(|(_, node)| node.clone()).ok_or(Errno::ENOENT)
    }

    fn readdir(&self, _req: &Request) -> shortfuse::Result<Vec<DirItem>> {
        let mut items: Vec<DirItem> = self
            .files
            .iter()
            .map(|(n, _)| DirItem::new(n, FileType::Regular))
            .collect();
        items.push(DirItem::new("threads", FileType::Directory));
        Ok(items)
    }
}

/// `threads/`: one name per thread alive now. Each lookup makes a new
/// node, which the node layer drops when the kernel forgets it.
struct Threads;

fn tids() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect()
}

/// A thread's name (`/proc/self/task/TID/comm`), read at each open.
struct ThreadName(String);

impl Node for ThreadName {
    fn getattr(&self, _req: &Request) -> shortfuse::Result<Attr> {
        Ok(file_attr())
    }

    fn open(&self, _req: &Request, _flags: OpenFlags) -> shortfuse::Result<Open> {
        // The thread may have ended since the lookup.
        let comm = std::fs::read(format!("/proc/self/task/{}/comm", self.0)).map_err(|_| Errno::ENOENT)?;
        Ok(Open {
            handle: Some(Box::new(Snapshot(comm))),
            flags: FopenFlags {
                direct_io: true,
                ..FopenFlags::default()
            },
        })
    }
}

impl Node for Threads {
    fn getattr(&self, _req: &Request) -> shortfuse::Result<Attr> {
        Ok(dir_attr())
    }

    fn lookup(&self, _req: &Request, name: &OsStr) -> shortfuse::Result<Arc<dyn Node>> {
        let name = name.to_str().ok_or(Errno::ENOENT)?;
        if !tids().iter().any(|t| t == name) {
            return Err(Errno::ENOENT);
        }
        Ok(Arc::new(ThreadName(name.to_string())))
    }

    fn readdir(&self, _req: &Request) -> shortfuse::Result<Vec<DirItem>> {
        Ok(tids().into_iter().map(|t| DirItem::new(t, FileType::Regular)).collect())
    }
}

/// The lines of /proc/self/status that say how big the daemon is.
fn memory(_: &Daemon) -> Vec<u8> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let mut out = String::new();
    for line in status.lines() {
        if ["VmRSS:", "VmHWM:", "Threads:"].iter().any(|k| line.starts_with(k)) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out.into_bytes()
}

fn main() -> std::io::Result<()> {
    let mount_point = std::env::args_os().nth(1).expect("usage: procstats MOUNTPOINT");
    let daemon = Arc::new(Daemon {
        started: Instant::now(),
        opens: AtomicU64::new(0),
        fs: OnceLock::new(),
    });
    let generated = |generate: Generate| -> Arc<dyn Node> {
        Arc::new(Generated {
            daemon: daemon.clone(),
            generate,
        })
    };
    let root = Root {
        files: vec![
            (
                "uptime",
                generated(Box::new(|d| {
                    format!("{:.3}\n", d.started.elapsed().as_secs_f64()).into_bytes()
                })),
            ),
            (
                "opens",
                generated(Box::new(|d| {
                    format!("{}\n", d.opens.load(Ordering::Relaxed)).into_bytes()
                })),
            ),
            (
                "nodes",
                generated(Box::new(|d| {
                    let known = d.fs.get().and_then(Weak::upgrade).map_or(0, |fs| fs.known());
                    format!("{known}\n").into_bytes()
                })),
            ),
            ("memory", generated(Box::new(memory))),
        ],
        threads: Arc::new(Threads),
    };
    let fs = Arc::new(NodeFs::new(Arc::new(root)));
    let _ = daemon.fs.set(Arc::downgrade(&fs));
    let opts = MountOptions {
        ro: true,
        fsname: Some("procstats".into()),
        subtype: Some("procstats".into()),
        ..MountOptions::default()
    };
    serve(fs, mount_point.as_ref(), opts, SessionOptions::default())
}
