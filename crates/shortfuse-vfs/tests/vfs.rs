//! The VFS against `MemFs`: path resolution, caches and lookup counting,
//! open-file semantics. Path cases are run on a real directory too and the
//! results (value or errno) must be the same.

use std::ffi::CString;
use std::sync::Arc;
use std::time::Duration;

use shortfuse::{Errno, FileType, MountOptions, Stats};
use shortfuse_abi as abi;
use shortfuse_fs::mem::MemFs;
use shortfuse_fs::null::NullFs;
use shortfuse_vfs::*;

const MP: &[u8] = b"/mnt/x";

struct Fx {
    vfs: Arc<Vfs>,
    mem: Arc<MemFs>,
    stats: Arc<Stats>,
    fds: FdTable,
}

fn fixture(opts: MountOptions) -> Fx {
    let mem = Arc::new(MemFs::new());
    let stats = Arc::new(Stats::new());
    let backend = InProcess::new(mem.clone(), opts, stats.clone());
    let vfs = Vfs::new(Box::new(backend), MP, 0x5f5f, Creds::default()).expect("vfs");
    vfs.set_umask(0o022);
    Fx {
        vfs: Arc::new(vfs),
        mem,
        stats,
        fds: FdTable::new(),
    }
}

fn fx() -> Fx {
    fixture(MountOptions::default())
}

fn count(stats: &Stats, opcode: u32) -> u64 {
    stats
        .snapshot()
        .ops
        .iter()
        .find(|o| o.opcode == Some(opcode))
        .map_or(0, |o| o.count)
}

impl Fx {
    fn walk_from(&self, start: &Location, path: &str, follow: bool) -> Result<Walk, Errno> {
        self.vfs.walk(
            start,
            path.as_bytes(),
            WalkFlags {
                attrs_only: false,
                follow,
                create: false,
            },
            0,
        )
    }

    fn target(&self, path: &str, follow: bool) -> Result<Target, Errno> {
        match self.walk_from(&Location::root(), path, follow)? {
            Walk::Inside(t) => Ok(t),
            Walk::Outside { path, .. } => panic!("{path:?} left the mount"),
        }
    }

    fn open(&self, path: &str, flags: i32, mode: u32) -> Result<Arc<OpenFile>, Errno> {
        let follow =
            flags & libc::O_NOFOLLOW == 0 && flags & (libc::O_CREAT | libc::O_EXCL) != libc::O_CREAT | libc::O_EXCL;
        let t = self.target(path, follow)?;
        self.vfs.open(&t, flags, mode)
    }

    fn write_file(&self, path: &str, data: &[u8]) {
        let f = self
            .open(path, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, 0o644)
            .expect("create");
        assert_eq!(f.write(data), Ok(data.len()));
    }

    fn read_file(&self, path: &str) -> Vec<u8> {
        let f = self.open(path, libc::O_RDONLY, 0).expect("open");
        let mut buf = vec![0u8; 1 << 16];
        let n = f.read(&mut buf).expect("read");
        buf.truncate(n);
        buf
    }

    fn mkdir(&self, path: &str) -> Result<(), Errno> {
        self.vfs.mkdir(&self.target(path, false)?, 0o755).map(|_| ())
    }

    fn symlink(&self, target: &str, path: &str) -> Result<(), Errno> {
        self.vfs
            .symlink(target.as_bytes(), &self.target(path, false)?)
            .map(|_| ())
    }
}

// ----- the same operations on a real directory and through the VFS -----

/// One path operation; paths are relative to the tree's root.
#[derive(Clone, Copy, Debug)]
enum Op {
    Stat(&'static str),
    Lstat(&'static str),
    Open(&'static str, i32),
    Mkdir(&'static str),
    Unlink(&'static str),
    Rmdir(&'static str),
    Rename(&'static str, &'static str),
    Readlink(&'static str),
    Symlink(&'static str, &'static str),
    Link(&'static str, &'static str),
    Truncate(&'static str, u64),
}

/// What both sides are compared on: file type and size, or the errno.
type Outcome = Result<(u32, u64), i32>;

fn native(root: &str, op: Op) -> Outcome {
    let p = |s: &str| CString::new(format!("{root}/{s}")).unwrap();
    fn check(r: i32) -> Result<(), i32> {
        if r < 0 {
            Err(std::io::Error::last_os_error().raw_os_error().unwrap())
        } else {
            Ok(())
        }
    }
    // SAFETY: plain system calls on NUL-terminated paths and a zeroed stat.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        let stat_of = |st: &libc::stat| {
            (
                st.st_mode & libc::S_IFMT,
                if st.st_mode & libc::S_IFMT == libc::S_IFREG {
                    st.st_size as u64
                } else {
                    0
                },
            )
        };
        match op {
            Op::Stat(a) => check(libc::stat(p(a).as_ptr(), &mut st)).map(|_| stat_of(&st)),
            Op::Lstat(a) => check(libc::lstat(p(a).as_ptr(), &mut st)).map(|_| stat_of(&st)),
            Op::Open(a, flags) => {
                let fd = libc::open(p(a).as_ptr(), flags, 0o644);
                check(fd)?;
                let r = check(libc::fstat(fd, &mut st)).map(|_| stat_of(&st));
                libc::close(fd);
                r
            }
            Op::Mkdir(a) => check(libc::mkdir(p(a).as_ptr(), 0o755)).map(|_| (0, 0)),
            Op::Unlink(a) => check(libc::unlink(p(a).as_ptr())).map(|_| (0, 0)),
            Op::Rmdir(a) => check(libc::rmdir(p(a).as_ptr())).map(|_| (0, 0)),
            Op::Rename(a, b) => check(libc::rename(p(a).as_ptr(), p(b).as_ptr())).map(|_| (0, 0)),
            Op::Readlink(a) => {
                let mut buf = [0u8; 256];
                let n = libc::readlink(p(a).as_ptr(), buf.as_mut_ptr().cast(), buf.len()) as i32;
                check(n).map(|_| (0, n as u64))
            }
            Op::Symlink(t, a) => check(libc::symlink(CString::new(t).unwrap().as_ptr(), p(a).as_ptr())).map(|_| (0, 0)),
            Op::Link(a, b) => check(libc::link(p(a).as_ptr(), p(b).as_ptr())).map(|_| (0, 0)),
            Op::Truncate(a, n) => check(libc::truncate(p(a).as_ptr(), n as i64)).map(|_| (0, 0)),
        }
    }
}

fn through_vfs(fx: &Fx, op: Op) -> Outcome {
    let attr_of = |a: shortfuse::Attr| {
        let t = a.mode & libc::S_IFMT;
        (t, if t == libc::S_IFREG { a.size } else { 0 })
    };
    let e = |r: Errno| r.raw();
    let run = || -> Result<(u32, u64), Errno> {
        match op {
            Op::Stat(a) => fx.vfs.stat(&fx.target(a, true)?).map(attr_of),
            Op::Lstat(a) => fx.vfs.stat(&fx.target(a, false)?).map(attr_of),
            Op::Open(a, flags) => {
                let f = fx.open(a, flags, 0o644)?;
                f.stat().map(attr_of)
            }
            Op::Mkdir(a) => fx.vfs.mkdir(&fx.target(a, false)?, 0o755).map(|_| (0, 0)),
            Op::Unlink(a) => fx.vfs.unlink(&fx.target(a, false)?).map(|_| (0, 0)),
            Op::Rmdir(a) => fx.vfs.rmdir(&fx.target(a, false)?).map(|_| (0, 0)),
            Op::Rename(a, b) => {
                let old = fx.target(a, false)?;
                let new = fx.target(b, false)?;
                fx.vfs.rename(&old, &new, 0).map(|_| (0, 0))
            }
            Op::Readlink(a) => fx.vfs.readlink(&fx.target(a, false)?).map(|t| (0, t.len() as u64)),
            Op::Symlink(t, a) => fx.vfs.symlink(t.as_bytes(), &fx.target(a, false)?).map(|_| (0, 0)),
            Op::Link(a, b) => {
                let old = fx.target(a, false)?;
                let new = fx.target(b, false)?;
                fx.vfs.link(&old, &new).map(|_| (0, 0))
            }
            Op::Truncate(a, n) => fx.vfs.truncate(&fx.target(a, true)?, n).map(|_| (0, 0)),
        }
    };
    run().map_err(e)
}

/// The tree both sides start from.
const SETUP: &[Op] = &[
    Op::Mkdir("a"),
    Op::Mkdir("a/sub"),
    Op::Mkdir("empty"),
    Op::Open("a/f", libc::O_CREAT | libc::O_WRONLY),
    Op::Symlink("a/f", "lf"),
    Op::Symlink("a", "ld"),
    Op::Symlink("../a/f", "a/sub/up"),
    Op::Symlink("nowhere", "dangling"),
    Op::Symlink("loop2", "loop1"),
    Op::Symlink("loop1", "loop2"),
    Op::Symlink("lf", "lf2"),
];

const CASES: &[Op] = &[
    Op::Stat("a"),
    Op::Stat("a/"),
    Op::Stat("a/."),
    Op::Stat("a/.."),
    Op::Stat("a/sub/../f"),
    Op::Stat("a/f"),
    Op::Stat("a/f/"),
    Op::Stat("a/f/x"),
    Op::Stat("a/f/."),
    Op::Stat("missing"),
    Op::Stat("missing/x"),
    Op::Stat("lf"),
    Op::Lstat("lf"),
    Op::Stat("lf/"),
    Op::Lstat("ld"),
    Op::Lstat("ld/"),
    Op::Stat("ld/f"),
    Op::Stat("a/sub/up"),
    Op::Stat("lf2"),
    Op::Stat("dangling"),
    Op::Lstat("dangling"),
    Op::Stat("loop1"),
    Op::Lstat("loop1"),
    Op::Stat("loop1/x"),
    Op::Open("a/f", libc::O_RDONLY),
    Op::Open("a/f", libc::O_RDONLY | libc::O_DIRECTORY),
    Op::Open("a", libc::O_RDONLY | libc::O_DIRECTORY),
    Op::Open("a", libc::O_WRONLY),
    Op::Open("a", libc::O_RDWR),
    Op::Open("a", libc::O_RDONLY | libc::O_CREAT),
    Op::Open("lf", libc::O_RDONLY | libc::O_NOFOLLOW),
    Op::Open("ld", libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_DIRECTORY),
    Op::Open("ld/", libc::O_RDONLY),
    Op::Open("a/f", libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY),
    Op::Open("lf", libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY),
    Op::Open("dangling", libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY),
    Op::Open("dangling", libc::O_CREAT | libc::O_WRONLY),
    Op::Stat("nowhere"),
    Op::Open("newfile/", libc::O_CREAT | libc::O_WRONLY),
    Op::Open("missing", libc::O_RDONLY),
    Op::Open("missing/x", libc::O_CREAT | libc::O_WRONLY),
    Op::Open("loop1", libc::O_RDONLY),
    Op::Open("a/f", libc::O_RDWR | libc::O_TRUNC),
    Op::Mkdir("a"),
    Op::Mkdir("a/"),
    Op::Mkdir("a/."),
    Op::Mkdir("new/"),
    Op::Mkdir("lf"),
    Op::Mkdir("dangling"),
    Op::Mkdir("a/f/x"),
    Op::Unlink("a"),
    Op::Unlink("a/"),
    Op::Unlink("a/f/"),
    Op::Unlink("missing"),
    Op::Unlink("ld"),
    Op::Rmdir("a"),
    Op::Rmdir("a/."),
    Op::Rmdir("a/.."),
    Op::Rmdir("a/f"),
    Op::Rmdir("ld"),
    Op::Rmdir("missing"),
    Op::Rmdir("new/"),
    Op::Rename("missing", "x"),
    Op::Rename("a", "a/sub/in"),
    Op::Rename("a/f", "empty"),
    Op::Rename("empty", "lf"),
    Op::Rename("a/f/", "g"),
    Op::Rename("a/.", "z"),
    Op::Rename("empty", "a"),
    Op::Rename("a/f", "a/f"),
    Op::Rename("lf", "lf3"),
    Op::Stat("lf3"),
    Op::Rename("empty", "e2/"),
    Op::Stat("e2"),
    Op::Readlink("lf3"),
    Op::Readlink("a"),
    Op::Readlink("missing"),
    Op::Symlink("x", "a"),
    Op::Symlink("x", "lf2"),
    Op::Symlink("x", "s1/"),
    Op::Link("a/f", "hard"),
    Op::Stat("hard"),
    Op::Link("a", "hard2"),
    Op::Link("a/f", "hard"),
    Op::Link("missing", "hard3"),
    Op::Link("lf2", "hl"),
    Op::Lstat("hl"),
    Op::Truncate("a/f", 100),
    Op::Stat("hard"),
    Op::Truncate("a", 0),
    Op::Truncate("missing", 0),
    Op::Unlink("hard"),
    Op::Stat("a/f"),
];

// Test set-up of the same shape recurs from test to test below: kept apart
// so each test reads on its own.
#[test]
fn path_operations_match_a_real_directory() {
    let dir = std::env::temp_dir().join(format!("sfvfs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let root = dir.to_str().unwrap().to_string();
    let fx = fx();
    for &op in SETUP {
        assert_eq!(native(&root, op).map(|_| ()), Ok(()), "native setup {op:?}");
        assert_eq!(through_vfs(&fx, op).map(|_| ()), Ok(()), "vfs setup {op:?}");
    }
    let mut bad = Vec::new();
    for &op in CASES {
        let n = native(&root, op);
        let v = through_vfs(&fx, op);
        if n != v {
            bad.push(format!("{op:?}: native {n:?}, vfs {v:?}"));
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(bad.is_empty(), "differences:\n{}", bad.join("\n"));
}

// ----- walking out of the mount -----

#[test]
fn dotdot_above_the_root_hands_back_a_host_path() {
    let fx = fx();
    fx.mkdir("d").unwrap();
    fx.mkdir("d/e").unwrap();
    let e = fx.target("d/e", false).unwrap().location().unwrap();
    assert_eq!(fx.vfs.host_path(&e), b"/mnt/x/d/e");
    assert_eq!(
        fx.walk_from(&e, "../../../etc/passwd", true),
        Ok(Walk::Outside {
            path: b"/mnt/etc/passwd".to_vec(),
            links: 0
        })
    );
    assert_eq!(
        fx.walk_from(&Location::root(), "..", true),
        Ok(Walk::Outside {
            path: b"/mnt".to_vec(),
            links: 0
        })
    );
    // ".." inside stays inside.
    match fx.walk_from(&e, "..", true).unwrap() {
        Walk::Inside(t) => assert_eq!(fx.vfs.host_path(&t.location().unwrap()), b"/mnt/x/d"),
        w => panic!("{w:?}"),
    }
}

#[test]
fn absolute_symlinks_stay_inside_or_leave() {
    let fx = fx();
    fx.mkdir("d").unwrap();
    fx.write_file("d/f", b"data");
    fx.symlink("/mnt/x/d", "in").unwrap();
    fx.symlink("/etc", "out").unwrap();
    fx.symlink("/mnt/x", "top").unwrap();
    let t = fx.target("in/f", true).unwrap();
    assert_eq!(t.node.unwrap().1.size, 4);
    assert_eq!(t.links, 1);
    assert_eq!(
        fx.walk_from(&Location::root(), "out/passwd", true),
        Ok(Walk::Outside {
            path: b"/etc/passwd".to_vec(),
            links: 1
        })
    );
    let t = fx.target("top", true).unwrap();
    assert_eq!(t.node.unwrap().0, shortfuse::NodeId::ROOT);
    // The mount point's own name is a prefix only on a component boundary.
    assert_eq!(fx.vfs.strip(b"/mnt/xy"), None);
    assert_eq!(fx.vfs.strip(b"/mnt/x"), Some(&b""[..]));
    assert_eq!(fx.vfs.strip(b"/mnt/x/a/b"), Some(&b"a/b"[..]));
}

#[test]
fn forty_links_resolve_and_forty_one_loop() {
    let fx = fx();
    fx.write_file("l0", b"end");
    for i in 1..=41 {
        fx.symlink(&format!("l{}", i - 1), &format!("l{i}")).unwrap();
    }
    let t = fx.target("l40", true).unwrap();
    assert_eq!(t.links, 40);
    assert_eq!(t.node.unwrap().1.size, 3);
    assert_eq!(fx.target("l41", true), Err(Errno::ELOOP));
    // Links already followed before a hand-over count too.
    assert_eq!(
        fx.vfs.walk(
            &Location::root(),
            b"l1",
            WalkFlags {
                attrs_only: false,
                follow: true,
                create: false
            },
            40
        ),
        Err(Errno::ELOOP)
    );
}

#[test]
fn relative_walks_start_from_the_given_directory() {
    let fx = fx();
    fx.mkdir("d").unwrap();
    fx.write_file("d/f", b"12345");
    let d = fx.target("d", false).unwrap().location().unwrap();
    match fx.walk_from(&d, "f", true).unwrap() {
        Walk::Inside(t) => assert_eq!(t.node.unwrap().1.size, 5),
        w => panic!("{w:?}"),
    }
    match fx.walk_from(&d, "./../d//f", true).unwrap() {
        Walk::Inside(t) => assert_eq!(t.node.unwrap().1.size, 5),
        w => panic!("{w:?}"),
    }
    // A leading '/' restarts from the mount's root.
    match fx.walk_from(&d, "/d/f", true).unwrap() {
        Walk::Inside(t) => assert_eq!(t.dir.path(), b"/d"),
        w => panic!("{w:?}"),
    }
    let long = "a/".repeat(2100);
    assert_eq!(fx.walk_from(&d, &long, true), Err(Errno::ENAMETOOLONG));
    assert_eq!(fx.walk_from(&d, &"n".repeat(256), true), Err(Errno::ENAMETOOLONG));
}

// ----- caches -----

fn timeouts(entry: u64, attr: u64, negative: u64) -> MountOptions {
    MountOptions {
        entry_timeout: Duration::from_secs(entry),
        attr_timeout: Duration::from_secs(attr),
        negative_timeout: Duration::from_secs(negative),
        ..MountOptions::default()
    }
}

#[test]
fn entries_and_attributes_are_cached_for_their_timeouts() {
    let fx = fixture(timeouts(60, 60, 0));
    fx.mkdir("d").unwrap();
    fx.write_file("d/f", b"x");
    let (l, g) = (count(&fx.stats, abi::FUSE_LOOKUP), count(&fx.stats, abi::FUSE_GETATTR));
    for _ in 0..5 {
        fx.vfs.stat(&fx.target("d/f", true).unwrap()).unwrap();
    }
    assert_eq!(count(&fx.stats, abi::FUSE_LOOKUP), l);
    // The create made the attributes of d stale, the write those of f:
    // each asked for once, then cached.
    assert_eq!(count(&fx.stats, abi::FUSE_GETATTR), g + 2);

    let fx = fixture(timeouts(0, 0, 0));
    fx.mkdir("d").unwrap();
    fx.write_file("d/f", b"x");
    let (l, g) = (count(&fx.stats, abi::FUSE_LOOKUP), count(&fx.stats, abi::FUSE_GETATTR));
    for _ in 0..5 {
        fx.vfs.stat(&fx.target("d/f", true).unwrap()).unwrap();
    }
    assert_eq!(count(&fx.stats, abi::FUSE_LOOKUP), l + 10);
    assert_eq!(count(&fx.stats, abi::FUSE_GETATTR), g);
}

/// What `path` (from the root, following links) names inside the mount.
fn inside(vfs: &Vfs, path: &[u8], create: bool) -> Target {
    match vfs
        .walk(
            &Location::root(),
            path,
            WalkFlags {
                attrs_only: false,
                follow: true,
                create,
            },
            0,
        )
        .unwrap()
    {
        Walk::Inside(t) => t,
        Walk::Outside { .. } => panic!("left the mount"),
    }
}

/// Another process image on the same file system, caching nothing.
fn other_image(fx: &Fx) -> Arc<Vfs> {
    let backend = InProcess::new(fx.mem.clone(), timeouts(0, 0, 0), Arc::new(Stats::new()));
    Arc::new(Vfs::new(Box::new(backend), MP, 0x5f5f, Creds::default()).unwrap())
}

#[test]
fn a_name_replaced_behind_a_cached_entry_is_looked_up_again() {
    // Entries cached, attributes not: how passthrough runs in process.
    let fx = fixture(timeouts(60, 0, 0));
    fx.write_file("o", b"old");
    let (old, _) = fx.target("o", true).unwrap().node.unwrap();
    // Another process image on the same file system replaces the file, as
    // an assembler or a linker does with its output (unlink, then create).
    let other = other_image(&fx);
    let t = inside(&other, b"o", false);
    other.unlink(&t).unwrap();
    let t = inside(&other, b"o", false);
    let f = other.open(&t, libc::O_WRONLY | libc::O_CREAT, 0o644).unwrap();
    assert_eq!(f.write(b"newer"), Ok(5));
    // The cached name led to an inode with no names left: not what `o` is.
    let (node, attr) = fx.target("o", true).unwrap().node.unwrap();
    assert_ne!(node, old);
    assert_eq!((attr.size, attr.nlink), (5, 1));
    assert_eq!(fx.read_file("o"), b"newer");
}

#[test]
fn an_open_that_creates_takes_a_file_created_meanwhile_elsewhere() {
    // A negative entry cached for a minute; another image creates the name.
    let fx = fixture(timeouts(60, 60, 60));
    let t = fx.target("late", true).unwrap();
    assert_eq!(t.node, None);
    let other = other_image(&fx);
    let ot = inside(&other, b"late", false);
    let f = other.open(&ot, libc::O_WRONLY | libc::O_CREAT, 0o644).unwrap();
    assert_eq!(f.write(b"first"), Ok(5));
    // O_CREAT without O_EXCL opens what is there (CREATE said EEXIST).
    let f = fx.vfs.open(&t, libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(f.read(&mut buf), Ok(5));
    assert_eq!(&buf[..5], b"first");
    // With O_EXCL it is an error, as it should be.
    assert_eq!(
        fx.vfs
            .open(&t, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, 0o644)
            .err(),
        Some(Errno::EEXIST)
    );
}

#[test]
fn expired_entries_are_looked_up_again() {
    let opts = MountOptions {
        entry_timeout: Duration::from_millis(50),
        attr_timeout: Duration::from_millis(50),
        ..MountOptions::default()
    };
    let fx = fixture(opts);
    fx.write_file("f", b"x");
    let l = count(&fx.stats, abi::FUSE_LOOKUP);
    fx.target("f", true).unwrap();
    assert_eq!(count(&fx.stats, abi::FUSE_LOOKUP), l);
    std::thread::sleep(Duration::from_millis(80));
    fx.target("f", true).unwrap();
    assert_eq!(count(&fx.stats, abi::FUSE_LOOKUP), l + 1);
}

#[test]
fn negative_entries_are_cached_and_replaced_by_creation() {
    let fx = fixture(timeouts(60, 60, 60));
    let l = count(&fx.stats, abi::FUSE_LOOKUP);
    for _ in 0..3 {
        assert_eq!(fx.target("nope", true).unwrap().node, None);
    }
    assert_eq!(count(&fx.stats, abi::FUSE_LOOKUP), l + 1);
    fx.write_file("nope", b"now");
    assert_eq!(fx.target("nope", true).unwrap().node.unwrap().1.size, 3);
    fx.vfs.unlink(&fx.target("nope", false).unwrap()).unwrap();
    assert_eq!(fx.target("nope", true).unwrap().node, None);

    // Without a negative timeout every miss asks again.
    let fx = fixture(timeouts(60, 60, 0));
    let l = count(&fx.stats, abi::FUSE_LOOKUP);
    for _ in 0..3 {
        assert_eq!(fx.target("nope", true).unwrap().node, None);
    }
    assert_eq!(count(&fx.stats, abi::FUSE_LOOKUP), l + 3);
}

#[test]
fn lookups_are_given_back_with_forget() {
    let fx = fixture(timeouts(60, 60, 0));
    fx.mkdir("d").unwrap();
    for i in 0..10 {
        fx.write_file(&format!("d/f{i}"), b"x");
    }
    assert_eq!(fx.mem.inode_count(), 12);
    for i in 0..10 {
        fx.vfs.unlink(&fx.target(&format!("d/f{i}"), false).unwrap()).unwrap();
    }
    // Unlinked and forgotten: the file system could free them.
    assert_eq!(fx.mem.inode_count(), 2);
    let d = fx.target("d", false).unwrap().node.unwrap().0;
    assert_eq!(fx.vfs.nlookup(d), Some(1));
    fx.vfs.drop_caches();
    assert_eq!(fx.vfs.cache_counts(), (0, 1));
    assert!(count(&fx.stats, abi::FUSE_FORGET) >= 11);
    // Found again after the caches are gone.
    fx.vfs.rmdir(&fx.target("d", false).unwrap()).unwrap();
    fx.vfs.drop_caches();
    assert_eq!(fx.mem.inode_count(), 1);
}

#[test]
fn zero_timeouts_forget_on_sweep_and_uses_pin_nodes() {
    let fx = fixture(timeouts(0, 0, 0));
    fx.mkdir("d").unwrap();
    let d = fx.target("d", false).unwrap().location().unwrap();
    fx.vfs.pin_location(&d);
    fx.vfs.drop_caches();
    // The pinned directory is still known and usable.
    fx.write_file("d/f", b"abc");
    match fx.walk_from(&d, "f", true).unwrap() {
        Walk::Inside(t) => assert_eq!(t.node.unwrap().1.size, 3),
        w => panic!("{w:?}"),
    }
    fx.vfs.unpin_location(&d);
    fx.vfs.drop_caches();
    assert_eq!(fx.vfs.cache_counts(), (0, 1));
}

// ----- open files -----

#[test]
fn dup_shares_offset_and_flags_but_not_cloexec() {
    let fx = fx();
    fx.write_file("f", b"0123456789");
    let f = fx.open("f", libc::O_RDWR, 0).unwrap();
    fx.fds.insert(3, f, false);
    fx.fds.dup(3, 4, true).unwrap();
    let mut b = [0u8; 4];
    assert_eq!(fx.fds.get(3).unwrap().read(&mut b), Ok(4));
    assert_eq!(&b, b"0123");
    assert_eq!(fx.fds.get(4).unwrap().read(&mut b), Ok(4));
    assert_eq!(&b, b"4567");
    assert_eq!(fx.fds.get(3).unwrap().lseek(0, libc::SEEK_CUR), Ok(8));
    assert_eq!(fx.fds.cloexec(3), Some(false));
    assert_eq!(fx.fds.cloexec(4), Some(true));
    fx.fds.get(4).unwrap().set_flags(libc::O_APPEND);
    assert_ne!(fx.fds.get(3).unwrap().flags() & libc::O_APPEND, 0);
    // Access mode cannot change with F_SETFL.
    assert_eq!(fx.fds.get(3).unwrap().flags() & libc::O_ACCMODE, libc::O_RDWR);
    assert_eq!(fx.fds.get(3).unwrap().write(b"AB"), Ok(2));
    assert_eq!(fx.read_file("f"), b"0123456789AB");
    assert_eq!(fx.fds.get(4).unwrap().lseek(0, libc::SEEK_CUR), Ok(12));
    // A separate open has its own offset.
    let g = fx.open("f", libc::O_RDONLY, 0).unwrap();
    assert_eq!(g.lseek(0, libc::SEEK_CUR), Ok(0));
    assert!(fx.fds.contains(3) && fx.fds.contains(4) && !fx.fds.contains(5));
    assert_eq!(fx.fds.dup(5, 6, false).err(), Some(Errno::EBADF));
}

#[test]
fn release_waits_for_the_last_descriptor() {
    let fx = fixture(timeouts(60, 60, 0));
    fx.write_file("f", b"data");
    fx.fds.insert(10, fx.open("f", libc::O_RDONLY, 0).unwrap(), false);
    fx.fds.dup(10, 11, false).unwrap();
    fx.vfs.unlink(&fx.target("f", false).unwrap()).unwrap();
    let r = count(&fx.stats, abi::FUSE_RELEASE);
    assert_eq!(fx.fds.close(10, 1), Some(Ok(())));
    assert_eq!(count(&fx.stats, abi::FUSE_RELEASE), r);
    // Still readable through the other descriptor after unlink.
    let mut b = [0u8; 8];
    assert_eq!(fx.fds.get(11).unwrap().pread(&mut b, 0), Ok(4));
    assert_eq!(fx.mem.inode_count(), 2);
    assert_eq!(fx.fds.close(11, 1), Some(Ok(())));
    assert_eq!(count(&fx.stats, abi::FUSE_RELEASE), r + 1);
    assert_eq!(fx.mem.inode_count(), 1);
    assert_eq!(fx.fds.close(11, 1), None);
    assert!(!fx.fds.contains(11));
}

#[test]
fn close_range_and_cloexec_list() {
    let fx = fx();
    fx.write_file("f", b"");
    for fd in 20..30 {
        fx.fds.insert(fd, fx.open("f", libc::O_RDONLY, 0).unwrap(), fd % 2 == 0);
    }
    let mut cx = fx.fds.cloexec_fds();
    cx.sort();
    assert_eq!(cx, vec![20, 22, 24, 26, 28]);
    fx.fds.set_cloexec(21, true).unwrap();
    assert_eq!(fx.fds.cloexec(21), Some(true));
    fx.fds.close_range(22, 27, 1);
    let left: Vec<i32> = fx.fds.fds().into_iter().map(|(fd, _)| fd).collect();
    assert_eq!(left, vec![20, 21, 28, 29]);
    assert_eq!(fx.fds.set_cloexec(23, true), Err(Errno::EBADF));
}

#[test]
fn access_modes_are_enforced_per_description() {
    let fx = fx();
    fx.write_file("f", b"abc");
    let r = fx.open("f", libc::O_RDONLY, 0).unwrap();
    assert_eq!(r.write(b"x"), Err(Errno::EBADF));
    assert_eq!(r.truncate(0), Err(Errno::EINVAL));
    let w = fx.open("f", libc::O_WRONLY, 0).unwrap();
    let mut b = [0u8; 3];
    assert_eq!(w.read(&mut b), Err(Errno::EBADF));
    let p = fx.open("f", libc::O_PATH, 0).unwrap();
    assert_eq!(p.read(&mut b), Err(Errno::EBADF));
    assert_eq!(p.stat().unwrap().size, 3);
    let d = fx.open("", libc::O_RDONLY | libc::O_DIRECTORY, 0).unwrap();
    assert_eq!(d.read(&mut b), Err(Errno::EISDIR));
    assert_eq!(fx.open("f", libc::O_ACCMODE, 0).err(), Some(Errno::EINVAL));
}

#[test]
fn append_truncate_and_seek() {
    let fx = fx();
    fx.write_file("f", b"hello");
    let a = fx.open("f", libc::O_WRONLY | libc::O_APPEND, 0).unwrap();
    assert_eq!(a.lseek(0, libc::SEEK_SET), Ok(0));
    assert_eq!(a.write(b" world"), Ok(6));
    assert_eq!(a.lseek(0, libc::SEEK_CUR), Ok(11));
    // pwrite with O_APPEND appends (Linux).
    assert_eq!(a.pwrite(b"!", 0), Ok(1));
    assert_eq!(fx.read_file("f"), b"hello world!");
    let t = fx.open("f", libc::O_RDWR | libc::O_TRUNC, 0).unwrap();
    assert_eq!(t.stat().unwrap().size, 0);
    assert_eq!(t.pwrite(b"xy", 10), Ok(2));
    assert_eq!(t.lseek(0, libc::SEEK_END), Ok(12));
    assert_eq!(t.lseek(-20, libc::SEEK_CUR), Err(Errno::EINVAL));
    assert_eq!(t.lseek(0, 99), Err(Errno::EINVAL));
    // Holes are whole blocks, as on ext4: the one block holds data.
    assert_eq!(t.lseek(0, libc::SEEK_DATA), Ok(0));
    assert_eq!(t.lseek(0, libc::SEEK_HOLE), Ok(12));
    assert_eq!(t.lseek(12, libc::SEEK_DATA), Err(Errno::ENXIO));
    let mut b = [0xffu8; 12];
    assert_eq!(t.pread(&mut b, 0), Ok(12));
    assert_eq!(&b[..10], &[0u8; 10]);
    t.truncate(3).unwrap();
    assert_eq!(t.stat().unwrap().size, 3);
    assert_eq!(t.fsync(false), Ok(()));
}

#[test]
fn large_transfers_are_split_at_max_io() {
    let fx = fx();
    let data: Vec<u8> = (0..3 * 1024 * 1024 + 17).map(|i| (i * 7 % 251) as u8).collect();
    let w = fx.open("big", libc::O_CREAT | libc::O_WRONLY, 0o600).unwrap();
    let writes = count(&fx.stats, abi::FUSE_WRITE);
    assert_eq!(w.write(&data), Ok(data.len()));
    let max = fx.vfs.init_out().max_io as usize;
    assert_eq!(
        count(&fx.stats, abi::FUSE_WRITE),
        writes + data.len().div_ceil(max) as u64
    );
    let r = fx.open("big", libc::O_RDONLY, 0).unwrap();
    let mut back = vec![0u8; data.len() + 100];
    assert_eq!(r.read(&mut back), Ok(data.len()));
    assert!(back[..data.len()] == data[..]);
    assert_eq!(r.read(&mut back), Ok(0));
}

/// Parses linux_dirent64 records into (name, type).
fn dirents(buf: &[u8]) -> Vec<(String, u8)> {
    let mut out = Vec::new();
    let mut p = buf;
    while !p.is_empty() {
        let reclen = u16::from_ne_bytes([p[16], p[17]]) as usize;
        assert_eq!(reclen % 8, 0);
        let name = &p[19..reclen];
        let end = name.iter().position(|&b| b == 0).unwrap();
        out.push((String::from_utf8(name[..end].to_vec()).unwrap(), p[18]));
        p = &p[reclen..];
    }
    out
}

#[test]
fn getdents64_lists_everything_across_small_buffers() {
    let fx = fx();
    fx.mkdir("d").unwrap();
    let mut want = vec![(".".to_string(), libc::DT_DIR), ("..".to_string(), libc::DT_DIR)];
    for i in 0..50 {
        let name = format!("file-with-a-longish-name-{i}");
        fx.write_file(&format!("d/{name}"), b"");
        want.push((name, libc::DT_REG));
    }
    fx.mkdir("d/sub").unwrap();
    want.push(("sub".to_string(), libc::DT_DIR));
    fx.symlink("x", "d/ln").unwrap();
    want.push(("ln".to_string(), libc::DT_LNK));
    let d = fx.open("d", libc::O_RDONLY | libc::O_DIRECTORY, 0).unwrap();
    for size in [100usize, 4096] {
        let mut got = Vec::new();
        let mut buf = vec![0u8; size];
        d.lseek(0, libc::SEEK_SET).unwrap();
        loop {
            let n = d.getdents64(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            got.extend(dirents(&buf[..n]));
        }
        let mut got_sorted = got.clone();
        got_sorted.sort();
        let mut want_sorted = want.clone();
        want_sorted.sort();
        assert_eq!(got_sorted, want_sorted, "buffer of {size}");
    }
    let mut tiny = [0u8; 16];
    d.lseek(0, libc::SEEK_SET).unwrap();
    assert_eq!(d.getdents64(&mut tiny), Err(Errno::EINVAL));
    let f = fx.open("d/sub", libc::O_RDONLY, 0).unwrap();
    let mut buf = [0u8; 4096];
    let n = f.getdents64(&mut buf).unwrap();
    let mut names: Vec<String> = dirents(&buf[..n]).into_iter().map(|e| e.0).collect();
    names.sort();
    assert_eq!(names, vec![".", ".."]);
    assert_eq!(f.getdents64(&mut buf), Ok(0));
    let file = fx.open("d/file-with-a-longish-name-0", libc::O_RDONLY, 0).unwrap();
    assert_eq!(file.getdents64(&mut [0u8; 4096]), Err(Errno::ENOTDIR));
}

#[test]
fn umask_and_setattr() {
    let fx = fx();
    fx.vfs.set_umask(0o077);
    let f = fx.open("f", libc::O_CREAT | libc::O_RDWR, 0o666).unwrap();
    assert_eq!(f.stat().unwrap().mode & 0o777, 0o600);
    fx.mkdir("d").unwrap();
    assert_eq!(
        fx.vfs.stat(&fx.target("d", false).unwrap()).unwrap().mode & 0o777,
        0o700
    );
    let a = f
        .setattr(&shortfuse::SetAttr {
            mode: Some(0o640),
            mtime: Some(shortfuse::SetTime::At(shortfuse::Timestamp { sec: 1000, nsec: 5 })),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(a.mode & 0o7777, 0o640);
    assert_eq!(a.mtime.sec, 1000);
    // The cache holds the new attributes.
    assert_eq!(
        fx.vfs.stat(&fx.target("f", true).unwrap()).unwrap().mode & 0o7777,
        0o640
    );
    let t = fx.target("f", true).unwrap();
    assert_eq!(fx.vfs.access(&t, libc::R_OK | libc::W_OK), Ok(()));
    assert_eq!(fx.vfs.access(&t, 64), Err(Errno::EINVAL));
    assert_eq!(t.node.unwrap().1.file_type(), FileType::Regular);
    let st = fx.vfs.statfs(shortfuse::NodeId::ROOT).unwrap();
    assert!(st.bsize > 0);
    assert_eq!(fx.vfs.chdir(&t), Err(Errno::ENOTDIR));
    let loc = fx.vfs.chdir(&fx.target("d", false).unwrap()).unwrap();
    assert_eq!(loc.path(), b"/d");
}

#[test]
fn an_entry_looked_up_again_after_expiry_stays_usable() {
    let opts = MountOptions {
        entry_timeout: Duration::from_millis(30),
        attr_timeout: Duration::from_millis(30),
        ..MountOptions::default()
    };
    let fx = fixture(opts);
    fx.vfs.mkdir(&fx.target("d", false).unwrap(), 0o755).unwrap();
    fx.write_file("d/f", b"kept");
    std::thread::sleep(Duration::from_millis(60));
    // The second LOOKUP of "d" hands out the same node: replacing the
    // expired entry must not forget it (the file system would then answer
    // ESTALE for "d" from then on).
    assert_eq!(fx.read_file("d/f"), b"kept");
    let Some((node, _)) = fx.target("d", false).unwrap().node else {
        panic!("d vanished");
    };
    assert_eq!(fx.vfs.nlookup(node), Some(2));
    fx.write_file("d/g", b"new");
    assert_eq!(fx.read_file("d/g"), b"new");
}

#[test]
fn a_read_only_mount_refuses_changes_after_the_other_checks() {
    let fx = fx();
    fx.write_file("f", b"data");
    fx.vfs.mkdir(&fx.target("d", false).unwrap(), 0o755).unwrap();
    fx.vfs.set_read_only(true);
    let t = |p: &str| fx.target(p, false).unwrap();
    assert_eq!(fx.read_file("f"), b"data");
    assert_eq!(fx.open("f", libc::O_WRONLY, 0).err(), Some(Errno::EROFS));
    assert_eq!(
        fx.open("f", libc::O_RDONLY | libc::O_TRUNC, 0).err(),
        Some(Errno::EROFS)
    );
    assert_eq!(
        fx.open("g", libc::O_CREAT | libc::O_WRONLY, 0o644).err(),
        Some(Errno::EROFS)
    );
    assert_eq!(fx.vfs.mkdir(&t("e"), 0o755).err(), Some(Errno::EROFS));
    assert_eq!(fx.vfs.mkdir(&t("d"), 0o755).err(), Some(Errno::EEXIST));
    assert_eq!(fx.vfs.unlink(&t("missing")).err(), Some(Errno::ENOENT));
    assert_eq!(fx.vfs.unlink(&t("f")).err(), Some(Errno::EROFS));
    assert_eq!(fx.vfs.rmdir(&t("d")).err(), Some(Errno::EROFS));
    assert_eq!(fx.vfs.rename(&t("f"), &t("h"), 0).err(), Some(Errno::EROFS));
    assert_eq!(fx.vfs.symlink(b"f", &t("l")).err(), Some(Errno::EROFS));
    assert_eq!(fx.vfs.truncate(&t("f"), 0).err(), Some(Errno::EROFS));
    assert_eq!(fx.vfs.access(&t("f"), libc::W_OK).err(), Some(Errno::EROFS));
    assert_eq!(fx.vfs.access(&t("f"), libc::R_OK), Ok(()));
    fx.vfs.set_read_only(false);
    assert_eq!(fx.vfs.unlink(&t("f")), Ok(()));
}

#[test]
fn rename_flags_and_mkdir_modes_as_the_kernel_checks_them() {
    let fx = fx();
    fx.write_file("a", b"1");
    fx.write_file("b", b"2");
    let t = |p: &str| fx.target(p, false).unwrap();
    let both = libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE;
    assert_eq!(fx.vfs.rename(&t("a"), &t("b"), both).err(), Some(Errno::EINVAL));
    assert_eq!(fx.vfs.rename(&t("a"), &t("b"), 1 << 7).err(), Some(Errno::EINVAL));
    assert_eq!(fx.vfs.rename(&t("a"), &t("b"), libc::RENAME_EXCHANGE), Ok(()));
    assert_eq!(fx.read_file("a"), b"2");
    // mkdir keeps the permission bits and the sticky bit, never set-id bits.
    let a = fx.vfs.mkdir(&t("d"), 0o6777).unwrap();
    assert_eq!(a.mode & 0o7777, 0o755);
    let a = fx.vfs.mkdir(&t("s"), 0o1777).unwrap();
    assert_eq!(a.mode & 0o7777, 0o1755);
}

#[test]
fn open_files_remember_their_path_and_offset() {
    let fx = fx();
    fx.vfs.mkdir(&fx.target("d", false).unwrap(), 0o755).unwrap();
    fx.write_file("d/f", b"0123456789");
    assert_eq!(fx.target("d/f", true).unwrap().path(), b"/d/f");
    assert_eq!(fx.target("d/..", true).unwrap().path(), b"/");
    let f = fx.open("d/./f", libc::O_RDONLY, 0).unwrap();
    assert_eq!(f.path(), b"/d/f");
    let mut buf = [0u8; 4];
    assert_eq!(f.read(&mut buf), Ok(4));
    assert_eq!(f.offset(), 4);
    let d = fx.open("d", libc::O_RDONLY | libc::O_DIRECTORY, 0).unwrap();
    assert_eq!(d.path(), b"/d");
}

#[test]
fn no_flush_for_opens_the_file_system_marks_noflush() {
    let dir = std::env::temp_dir().join(format!("sfvfs-noflush-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("f"), b"x").unwrap();
    let fs = Arc::new(shortfuse_fs::passthrough::PassthroughFs::new(&dir).unwrap());
    let stats = Arc::new(Stats::new());
    let backend = InProcess::new(fs, MountOptions::default(), stats.clone());
    let vfs = Arc::new(Vfs::new(Box::new(backend), MP, 0x5f5f, Creds::default()).unwrap());
    let fds = FdTable::new();
    let t = inside(&vfs, b"f", false);
    // passthrough answers read-only opens with FOPEN_NOFLUSH, and write
    // opens too when the source is a local file system (the temporary
    // directory here), whose close reports nothing.
    let r = vfs.open(&t, libc::O_RDONLY, 0).unwrap();
    assert!(!r.needs_flush());
    fds.insert(10, r, false);
    assert_eq!(fds.close(10, 1), Some(Ok(())));
    let w = vfs.open(&t, libc::O_WRONLY, 0).unwrap();
    assert!(!w.needs_flush());
    fds.insert(11, w, false);
    assert_eq!(fds.close(11, 1), Some(Ok(())));
    assert_eq!(count(&stats, abi::FUSE_FLUSH), 0);
    std::fs::remove_dir_all(&dir).unwrap();
    // mem marks no open NOFLUSH: the close of its write open sends FLUSH.
    let mem = fx();
    mem.write_file("g", b"y");
    let t = mem.target("g", true).unwrap();
    let w = mem.vfs.open(&t, libc::O_WRONLY, 0).unwrap();
    assert!(w.needs_flush());
    mem.fds.insert(12, w, false);
    assert_eq!(mem.fds.close(12, 1), Some(Ok(())));
    assert_eq!(count(&mem.stats, abi::FUSE_FLUSH), 1);
}

#[test]
fn flush_answered_enosys_is_not_sent_again() {
    let stats = Arc::new(Stats::new());
    let backend = InProcess::new(Arc::new(NullFs::new()), MountOptions::default(), stats.clone());
    let vfs = Arc::new(Vfs::new(Box::new(backend), MP, 0x5f5f, Creds::default()).unwrap());
    let null = Fx {
        vfs,
        mem: Arc::new(MemFs::new()),
        stats,
        fds: FdTable::new(),
    };
    // null leaves FLUSH to the default (ENOSYS); mem answers it.
    for (fx, answers) in [(&null, false), (&fx(), true)] {
        for i in 0..3u64 {
            // null forgets the name: each of these opens creates it again.
            let f = fx.open("f", libc::O_CREAT | libc::O_WRONLY, 0o644).unwrap();
            assert_eq!(f.needs_flush(), answers || i == 0, "open {i}");
            fx.fds.insert(10, f, false);
            assert_eq!(fx.fds.close(10, 1), Some(Ok(())));
            let want = if answers { i + 1 } else { 1 };
            assert_eq!(count(&fx.stats, abi::FUSE_FLUSH), want, "close {i}");
        }
    }
}

#[test]
fn a_create_of_an_unknown_name_asks_once_and_never_replaces() {
    let fx = fx();
    let walk = |path: &[u8], create: bool| inside(&fx.vfs, path, create);
    // A new name: CREATE alone, no LOOKUP.
    let t = walk(b"new", true);
    assert!(t.unasked && t.node.is_none());
    let lookups = count(&fx.stats, abi::FUSE_LOOKUP);
    let f = fx.vfs.open(&t, libc::O_WRONLY | libc::O_CREAT, 0o600).unwrap();
    assert_eq!(f.write(b"one"), Ok(3));
    assert_eq!(count(&fx.stats, abi::FUSE_LOOKUP), lookups);
    assert_eq!(count(&fx.stats, abi::FUSE_CREATE), 1);
    // Now cached: the walk knows it, and O_CREAT opens it.
    let t = walk(b"new", true);
    assert!(!t.unasked && t.node.is_some());

    // A name another image made (not in this cache): creating fails and
    // leaves the file alone; the walk without the flag finds it.
    let other = other_image(&fx);
    let ot = inside(&other, b"theirs", false);
    let g = other.open(&ot, libc::O_WRONLY | libc::O_CREAT, 0o644).unwrap();
    assert_eq!(g.write(b"kept"), Ok(4));
    let t = walk(b"theirs", true);
    assert!(t.unasked);
    assert_eq!(
        fx.vfs.open(&t, libc::O_RDWR | libc::O_CREAT, 0o644).err(),
        Some(Errno::EEXIST)
    );
    let t = walk(b"theirs", false);
    let f = fx.vfs.open(&t, libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(f.read(&mut buf), Ok(4));
    assert_eq!(&buf[..4], b"kept");

    // Without the flag (every other caller), the name is looked up.
    let t = walk(b"absent", false);
    assert!(!t.unasked && t.node.is_none());
}
