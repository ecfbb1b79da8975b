//! The node layer mounted over /dev/fuse and over io_uring: a small
//! writable in-memory tree written on `Node` (create, write, truncate,
//! mkdir, rename within and across directories, unlink, rmdir) used through
//! std::fs, and `NodeFs::notify_content` / `notify_entry` reaching a kernel
//! that caches for an hour.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shortfuse::{
    read_slice, Attr, DirItem, Errno, FileType, MountOptions, NewNode, Node, NodeFs, RenameFlags, Request, SetAttr,
    Transport,
};

mod support;

const HOUR: Duration = Duration::from_secs(3600);

#[derive(Default)]
struct Dir {
    children: Mutex<BTreeMap<OsString, Arc<dyn Node>>>,
}

#[derive(Default)]
struct File {
    data: Mutex<Vec<u8>>,
}

impl Dir {
    fn add(&self, name: &OsStr, node: Arc<dyn Node>) -> shortfuse::Result<Arc<dyn Node>> {
        let mut c = self.children.lock().unwrap();
        if c.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        c.insert(name.to_os_string(), node.clone());
        Ok(node)
    }

    fn kind(node: &Arc<dyn Node>) -> FileType {
        let any: &dyn std::any::Any = &**node;
        if any.is::<Dir>() {
            FileType::Directory
        } else {
            FileType::Regular
        }
    }
}

impl Node for Dir {
    fn getattr(&self, _req: &Request) -> shortfuse::Result<Attr> {
        Ok(Attr::new(FileType::Directory, 0o755))
    }

    fn lookup(&self, _req: &Request, name: &OsStr) -> shortfuse::Result<Arc<dyn Node>> {
        self.children.lock().unwrap().get(name).cloned().ok_or(Errno::ENOENT)
    }

    fn readdir(&self, _req: &Request) -> shortfuse::Result<Vec<DirItem>> {
        let c = self.children.lock().unwrap();
        Ok(c.iter()
            .map(|(n, node)| DirItem::new(n.clone(), Dir::kind(node)))
            .collect())
    }

    fn create(&self, _req: &Request, name: &OsStr, _new: &NewNode) -> shortfuse::Result<Arc<dyn Node>> {
        self.add(name, Arc::new(File::default()))
    }

    fn mkdir(&self, _req: &Request, name: &OsStr, _new: &NewNode) -> shortfuse::Result<Arc<dyn Node>> {
        self.add(name, Arc::new(Dir::default()))
    }

    fn unlink(&self, _req: &Request, name: &OsStr) -> shortfuse::Result<()> {
        self.children
            .lock()
            .unwrap()
            .remove(name)
            .map(|_| ())
            .ok_or(Errno::ENOENT)
    }

    fn rmdir(&self, _req: &Request, name: &OsStr) -> shortfuse::Result<()> {
        let mut c = self.children.lock().unwrap();
        let dir = c.get(name).ok_or(Errno::ENOENT)?;
        let any: &dyn std::any::Any = &**dir;
        let dir = any.downcast_ref::<Dir>().ok_or(Errno::ENOTDIR)?;
        if !dir.children.lock().unwrap().is_empty() {
            return Err(Errno::ENOTEMPTY);
        }
        c.remove(name);
        Ok(())
    }

    fn rename(
        &self,
        _req: &Request,
        name: &OsStr,
        new_parent: &Arc<dyn Node>,
        new_name: &OsStr,
        _flags: RenameFlags,
    ) -> shortfuse::Result<()> {
        let any: &dyn std::any::Any = &**new_parent;
        let to = any.downcast_ref::<Dir>().ok_or(Errno::ENOTDIR)?;
        let node = self.children.lock().unwrap().remove(name).ok_or(Errno::ENOENT)?;
        to.children.lock().unwrap().insert(new_name.to_os_string(), node);
        Ok(())
    }
}

impl Node for File {
    fn getattr(&self, _req: &Request) -> shortfuse::Result<Attr> {
        let len = self.data.lock().unwrap().len() as u64;
        Ok(Attr::new(FileType::Regular, 0o644).with_size(len))
    }

    fn read(&self, _req: &Request, offset: u64, buf: &mut [u8]) -> shortfuse::Result<usize> {
        Ok(read_slice(&self.data.lock().unwrap(), offset, buf))
    }

    fn write(&self, _req: &Request, offset: u64, data: &[u8]) -> shortfuse::Result<usize> {
        let mut d = self.data.lock().unwrap();
        let end = offset as usize + data.len();
        if d.len() < end {
            d.resize(end, 0);
        }
        d[offset as usize..end].copy_from_slice(data);
        Ok(data.len())
    }

    fn setattr(&self, req: &Request, set: &SetAttr) -> shortfuse::Result<Attr> {
        if let Some(size) = set.size {
            self.data.lock().unwrap().resize(size as usize, 0);
        }
        self.getattr(req)
    }
}

struct Mounted {
    m: support::Mounted,
    root: Arc<Dir>,
    fs: Arc<NodeFs>,
}

impl Mounted {
    fn new(tag: &str, transport: Transport) -> Mounted {
        let root = Arc::new(Dir::default());
        let fs = Arc::new(NodeFs::new(root.clone()));
        let opts = MountOptions {
            attr_timeout: HOUR,
            entry_timeout: HOUR,
            negative_timeout: HOUR,
            keep_cache: true,
            transport,
            ..MountOptions::default()
        };
        let m = support::Mounted::new(&format!("node-{tag}"), fs.clone(), opts);
        Mounted { m, root, fs }
    }
}

fn names(p: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(p)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

fn everything(m: &Mounted) {
    let mp = &m.m.mp;
    // Writes through the mount.
    fs::write(mp.join("a"), b"first").unwrap();
    assert_eq!(fs::read(mp.join("a")).unwrap(), b"first");
    // `>` on an existing file: O_TRUNC comes with the open.
    fs::write(mp.join("a"), b"2nd").unwrap();
    assert_eq!(fs::read(mp.join("a")).unwrap(), b"2nd");
    fs::write(mp.join("a"), b"first").unwrap();
    fs::create_dir(mp.join("d")).unwrap();
    fs::create_dir(mp.join("d/e")).unwrap();
    fs::write(mp.join("d/e/b"), b"nested").unwrap();
    assert_eq!(names(mp), ["a", "d"]);
    assert!(fs::metadata(mp.join("d")).unwrap().is_dir());
    assert_eq!(
        fs::create_dir(mp.join("d")).unwrap_err().raw_os_error(),
        Some(libc::EEXIST)
    );
    // Truncate (setattr), rename within and across directories.
    fs::OpenOptions::new()
        .write(true)
        .open(mp.join("a"))
        .unwrap()
        .set_len(2)
        .unwrap();
    assert_eq!(fs::read(mp.join("a")).unwrap(), b"fi");
    fs::rename(mp.join("a"), mp.join("d/moved")).unwrap();
    assert_eq!(names(mp), ["d"]);
    assert_eq!(fs::read(mp.join("d/moved")).unwrap(), b"fi");
    fs::rename(mp.join("d/e/b"), mp.join("d/e/c")).unwrap();
    assert_eq!(names(&mp.join("d/e")), ["c"]);
    assert_eq!(
        fs::remove_dir(mp.join("d/e")).unwrap_err().raw_os_error(),
        Some(libc::ENOTEMPTY)
    );
    fs::remove_file(mp.join("d/e/c")).unwrap();
    fs::remove_dir(mp.join("d/e")).unwrap();
    assert!(!mp.join("d/e").exists());
    // st_ino is the node id: distinct per node, stable per name.
    use std::os::unix::fs::MetadataExt;
    let ino = fs::metadata(mp.join("d/moved")).unwrap().ino();
    assert_eq!(fs::metadata(mp.join("d/moved")).unwrap().ino(), ino);
    assert_ne!(fs::metadata(mp.join("d")).unwrap().ino(), ino);

    // Changes behind the kernel's back, told through the node layer.
    let d = m.root.lookup(&req(), OsStr::new("d")).unwrap();
    let moved = {
        let any: &dyn std::any::Any = &*d;
        any.downcast_ref::<Dir>()
            .unwrap()
            .lookup(&req(), OsStr::new("moved"))
            .unwrap()
    };
    let file = {
        let any: &dyn std::any::Any = &*moved;
        any.downcast_ref::<File>().unwrap()
    };
    *file.data.lock().unwrap() = b"ZZ".to_vec();
    assert_eq!(fs::read(mp.join("d/moved")).unwrap(), b"fi", "the kernel did not cache");
    m.fs.notify_content(&moved).unwrap();
    assert_eq!(fs::read(mp.join("d/moved")).unwrap(), b"ZZ");
    assert!(!mp.join("late").exists());
    m.root.add(OsStr::new("late"), Arc::new(File::default())).unwrap();
    assert!(!mp.join("late").exists(), "the kernel did not cache the missing name");
    let root: Arc<dyn Node> = m.root.clone();
    m.fs.notify_entry(&root, OsStr::new("late")).unwrap();
    assert!(mp.join("late").exists());
}

fn req() -> Request {
    Request {
        unique: 0,
        uid: 0,
        gid: 0,
        pid: 0,
    }
}

// Test set-up of the same shape as notify_mount.rs (one test per kernel
// transport): kept apart so each test reads on its own.
#[test]
fn a_writable_node_tree_over_dev() {
    let m = Mounted::new("dev", Transport::Dev);
    everything(&m);
}

#[test]
fn a_writable_node_tree_over_uring() {
    let m = Mounted::new("uring", Transport::Uring);
    everything(&m);
    assert!(m.m.served_over(Transport::Uring) > 0, "nothing travelled over io_uring");
}
