//! The node-layer examples, built and mounted over /dev/fuse (as root):
//! `tarview` must show an archive made by tar(1) exactly as the directory it
//! was made from; `procstats` must generate its texts at each open and give
//! nodes back when the kernel forgets them.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

/// The examples of this target directory, built once.
fn examples() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("test executable path");
        let profile = exe.parent().and_then(Path::parent).expect("target/<profile>/deps");
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "-q", "-p", "shortfuse", "--examples", "--manifest-path"])
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
            .env("CARGO_TARGET_DIR", profile.parent().expect("target dir"));
        if profile.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        assert!(cmd.status().expect("cargo build --examples").success());
        profile.join("examples")
    })
}

fn mounted(mp: &Path) -> bool {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines().any(|l| l.split(' ').nth(4) == mp.to_str())
}

/// An example serving `mp`, stopped (and so unmounted) on drop.
struct Example {
    child: Child,
    dir: PathBuf,
    mp: PathBuf,
}

impl Example {
    fn start(name: &str, dir: PathBuf, args: &[&Path]) -> Example {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(unsafe { libc::geteuid() }, 0, "mounting needs root");
        let mp = dir.join("mnt");
        fs::create_dir_all(&mp).unwrap();
        let child = Command::new(examples().join(name)).args(args).arg(&mp).spawn().unwrap();
        let mut e = Example { child, dir, mp };
        let start = Instant::now();
        while !mounted(&e.mp) {
            if let Some(status) = e.child.try_wait().unwrap() {
                panic!("{name} exited before mounting: {status}");
            }
            assert!(start.elapsed() < Duration::from_secs(60), "{name} did not mount");
            thread::sleep(Duration::from_millis(10));
        }
        e
    }
}

impl Drop for Example {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        assert!(!mounted(&self.mp) || thread::panicking(), "still mounted after SIGTERM");
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("lib-examples-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

/// Everything under `root` that a reader sees: type, permissions, size,
/// content or link target, by path.
fn walk(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let m = fs::symlink_metadata(&p).unwrap();
            let perm = m.permissions().mode() & 0o7777;
            let what = if m.file_type().is_symlink() {
                format!("link {}", fs::read_link(&p).unwrap().display())
            } else if m.is_dir() {
                todo.push(p.clone());
                format!("dir {perm:o}")
            } else {
                let data = fs::read(&p).unwrap();
                assert_eq!(data.len() as u64, m.len(), "{rel}: size and content disagree");
                format!("file {perm:o} {} {:x}", m.len(), checksum(&data))
            };
            out.insert(rel, what);
        }
    }
    out
}

fn checksum(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf29ce484222325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    })
}

#[test]
fn tarview_shows_the_archive_as_its_source() {
    let dir = scratch("tar");
    let src = dir.join("src");
    fs::create_dir_all(src.join("dir/sub")).unwrap();
    fs::write(src.join("a.txt"), b"hello from the archive\n").unwrap();
    let big: Vec<u8> = (0..300_007u32).map(|i| (i.wrapping_mul(31) ^ (i >> 9)) as u8).collect();
    fs::write(src.join("dir/big.bin"), &big).unwrap();
    fs::write(src.join("dir/sub/empty"), b"").unwrap();
    fs::write(src.join("private"), b"secret").unwrap();
    fs::set_permissions(src.join("private"), fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::symlink("a.txt", src.join("link")).unwrap();
    fs::hard_link(src.join("a.txt"), src.join("dir/hard")).unwrap();
    let archive = dir.join("archive.tar");
    let out = Command::new("tar")
        .args(["--format=ustar", "-cf"])
        .arg(&archive)
        .arg("-C")
        .arg(&src)
        .arg(".")
        .output()
        .expect("tar(1)");
    assert!(out.status.success(), "tar: {}", String::from_utf8_lossy(&out.stderr));

    let e = Example::start("tarview", dir.clone(), &[&archive]);
    let want = walk(&src);
    assert!(want.len() >= 8, "{want:?}");
    assert_eq!(walk(&e.mp), want);
    // A hard link is one inode under two names; other files are not.
    let ino = |p: &str| fs::metadata(e.mp.join(p)).unwrap().ino();
    assert_eq!(ino("a.txt"), ino("dir/hard"));
    assert_ne!(ino("a.txt"), ino("private"));
    assert_eq!(fs::read(e.mp.join("dir/big.bin")).unwrap(), big);
    let err = fs::write(e.mp.join("a.txt"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS));
}

fn read_number(p: &Path) -> f64 {
    let text = fs::read_to_string(p).unwrap();
    text.trim()
        .parse()
        .unwrap_or_else(|_| panic!("{}: {text:?}", p.display()))
}

#[test]
fn procstats_generates_at_each_open_and_forgets() {
    let e = Example::start("procstats", scratch("proc"), &[]);
    let mut names: Vec<String> = fs::read_dir(&e.mp)
        .unwrap()
        .map(|d| d.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["memory", "nodes", "opens", "threads", "uptime"]);
    // Made at each open: two reads, two opens.
    let first = read_number(&e.mp.join("opens"));
    let second = read_number(&e.mp.join("opens"));
    assert_eq!(second, first + 1.0);
    assert!(read_number(&e.mp.join("uptime")) >= 0.0);
    let memory = fs::read_to_string(e.mp.join("memory")).unwrap();
    assert!(memory.contains("VmRSS:") && memory.contains("Threads:"), "{memory}");
    // Every thread of the daemon, by name: the session's signal thread is one.
    let threads: Vec<String> = fs::read_dir(e.mp.join("threads"))
        .unwrap()
        .map(|d| fs::read_to_string(d.unwrap().path()).unwrap())
        .collect();
    assert!(threads.len() >= 2, "{threads:?}");
    assert!(threads.iter().any(|t| t.starts_with("shortfuse-sig")), "{threads:?}");
    // Each thread file looked up is a node the kernel holds, until the
    // kernel drops its cached names and forgets them.
    let held = read_number(&e.mp.join("nodes"));
    assert!(
        held >= threads.len() as f64 + 2.0,
        "{held} nodes for {} threads",
        threads.len()
    );
    fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    let after = read_number(&e.mp.join("nodes"));
    assert!(after < held, "{after} nodes after the kernel forgot, {held} before");
}

#[test]
fn hello_on_the_trait_and_on_the_node_layer_serve_the_same_tree() {
    let day_ago = std::time::SystemTime::now() - Duration::from_secs(86400);
    for name in ["hello", "hello_nodes"] {
        let e = Example::start(name, scratch(name), &[]);
        let names: Vec<_> = fs::read_dir(&e.mp).unwrap().map(|d| d.unwrap().file_name()).collect();
        assert_eq!(names, ["hello"], "{name}");
        let file = e.mp.join("hello");
        assert_eq!(fs::read(&file).unwrap(), b"hello from shortfuse\n", "{name}");
        let m = fs::metadata(&file).unwrap();
        assert!(m.is_file() && m.permissions().mode() & 0o777 == 0o444, "{name}: {m:?}");
        let root = fs::metadata(&e.mp).unwrap();
        assert!(
            root.is_dir() && root.permissions().mode() & 0o777 == 0o755,
            "{name}: {root:?}"
        );
        // Attributes left to the defaults carry the time of the daemon, not 1970.
        assert!(m.modified().unwrap() > day_ago, "{name}: {:?}", m.modified());
        assert_eq!(m.uid(), 0, "{name}: owned by the daemon's user");
    }
}
