//! Nothing a request names may reach outside the source, and the daemon
//! never follows a symbolic link. A sentinel directory sits next to the
//! source; every test ends by checking that it was neither reached nor
//! changed.

mod passthrough_support;

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::{symlink, MetadataExt};
use std::path::{Path, PathBuf};

use passthrough_support::{root_req, Names, Plus, TempDir};
use shortfuse::{Errno, FileType, Filesystem, NewNode, NodeId, OpenFlags, RenameFlags, SetAttr, XattrFlags};
use shortfuse_fs::passthrough::PassthroughFs;

/// `base/outside/sentinel` beside `base/src`, with links in the source
/// pointing at it and elsewhere.
struct Setup {
    _base: TempDir,
    src: PathBuf,
    outside: PathBuf,
    sentinel_ino: u64,
    sentinel_ctime: (i64, i64),
}

impl Setup {
    fn new(tag: &str) -> Setup {
        let base = TempDir::new(tag);
        let src = base.path().join("src");
        let outside = base.path().join("outside");
        fs::create_dir(&src).unwrap();
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("sentinel"), b"secret").unwrap();
        fs::create_dir_all(src.join("a/b")).unwrap();
        symlink("/etc", src.join("etc")).unwrap();
        symlink("../../..", src.join("up3")).unwrap();
        symlink("../outside", src.join("out")).unwrap();
        symlink(&outside, src.join("abs_out")).unwrap();
        symlink("../outside/sentinel", src.join("to_sentinel")).unwrap();
        symlink("/etc/passwd", src.join("a/b/pw")).unwrap();
        symlink("../../../../outside", src.join("a/b/climb")).unwrap();
        let meta = fs::metadata(outside.join("sentinel")).unwrap();
        Setup {
            sentinel_ino: meta.ino(),
            sentinel_ctime: (meta.ctime(), meta.ctime_nsec()),
            _base: base,
            src,
            outside,
        }
    }

    fn fs(&self) -> PassthroughFs {
        PassthroughFs::new(&self.src).unwrap()
    }

    /// The outside world is as the setup left it.
    fn check_untouched(&self) {
        let names: Vec<_> = fs::read_dir(&self.outside)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            names,
            vec![OsStr::new("sentinel").to_owned()],
            "outside directory changed"
        );
        let meta = fs::metadata(self.outside.join("sentinel")).unwrap();
        assert_eq!(fs::read(self.outside.join("sentinel")).unwrap(), b"secret");
        assert_eq!(
            (meta.ctime(), meta.ctime_nsec()),
            self.sentinel_ctime,
            "sentinel inode changed"
        );
        assert_eq!(meta.nlink(), 1, "sentinel gained a hard link");
        let xattrs = std::process::Command::new("getfattr")
            .args(["-d", "-m", "-", "--absolute-names"])
            .arg(self.outside.join("sentinel"))
            .output()
            .expect("getfattr (package attr) must be installed");
        assert!(
            xattrs.stdout.is_empty(),
            "sentinel has xattrs: {:?}",
            String::from_utf8_lossy(&xattrs.stdout)
        );
    }
}

fn node(mode: u32) -> NewNode {
    NewNode {
        mode,
        umask: 0,
        rdev: 0,
    }
}

const BAD_NAMES: &[&str] = &["..", ".", "", "/etc", "a/b", "../outside", "../outside/sentinel", "/"];

#[test]
fn malformed_names_are_refused_by_every_call() {
    let s = Setup::new("names");
    let fs = s.fs();
    let req = root_req();
    let a = fs.lookup(&req, NodeId::ROOT, OsStr::new("a")).unwrap().node;
    for bad in BAD_NAMES {
        let bad = OsStr::new(bad);
        for parent in [NodeId::ROOT, a] {
            assert_eq!(
                fs.lookup(&req, parent, bad).unwrap_err(),
                Errno::EINVAL,
                "lookup {bad:?}"
            );
            let c = fs.create(&req, parent, bad, &node(0o644), OpenFlags::RDWR);
            assert_eq!(c.map(|_| ()).unwrap_err(), Errno::EINVAL, "create {bad:?}");
            assert_eq!(fs.mkdir(&req, parent, bad, &node(0o755)).unwrap_err(), Errno::EINVAL);
            assert_eq!(
                fs.mknod(&req, parent, bad, &node(libc::S_IFIFO | 0o644)).unwrap_err(),
                Errno::EINVAL
            );
            assert_eq!(
                fs.symlink(&req, parent, bad, OsStr::new("x")).unwrap_err(),
                Errno::EINVAL
            );
            assert_eq!(fs.unlink(&req, parent, bad).unwrap_err(), Errno::EINVAL);
            assert_eq!(fs.rmdir(&req, parent, bad).unwrap_err(), Errno::EINVAL);
            assert_eq!(fs.link(&req, a, parent, bad).unwrap_err(), Errno::EINVAL);
            let r = fs.rename(&req, parent, bad, NodeId::ROOT, OsStr::new("z"), RenameFlags::default());
            assert_eq!(r.unwrap_err(), Errno::EINVAL, "rename from {bad:?}");
            let r = fs.rename(&req, NodeId::ROOT, OsStr::new("a"), parent, bad, RenameFlags::default());
            assert_eq!(r.unwrap_err(), Errno::EINVAL, "rename to {bad:?}");
        }
    }
    assert!(s.src.join("a").is_dir());
    s.check_untouched();
}

#[test]
fn symlinks_are_entries_never_parents() {
    let s = Setup::new("links");
    let fs = s.fs();
    let req = root_req();
    for link in ["etc", "up3", "out", "abs_out", "to_sentinel"] {
        let e = fs.lookup(&req, NodeId::ROOT, OsStr::new(link)).unwrap();
        assert_eq!(e.attr.file_type(), FileType::Symlink, "{link}");
        let l = e.node;
        let ln = fs.lookup(&req, l, OsStr::new("sentinel")).unwrap_err();
        assert!(
            ln == Errno::ENOTDIR || ln == Errno::ELOOP,
            "lookup through {link}: {ln:?}"
        );
        assert_eq!(fs.lookup(&req, l, OsStr::new("passwd")).unwrap_err(), Errno::ENOTDIR);
        assert_eq!(fs.open(&req, l, OpenFlags::RDONLY).unwrap_err(), Errno::ELOOP);
        assert_eq!(
            fs.open(&req, l, OpenFlags::WRONLY | OpenFlags::TRUNC).unwrap_err(),
            Errno::ELOOP
        );
        assert_eq!(fs.opendir(&req, l, OpenFlags::RDONLY).unwrap_err(), Errno::ENOTDIR);
        let c = fs.create(
            &req,
            l,
            OsStr::new("sentinel"),
            &node(0o644),
            OpenFlags::WRONLY | OpenFlags::TRUNC,
        );
        assert_eq!(c.map(|_| ()).unwrap_err(), Errno::ENOTDIR);
        assert_eq!(
            fs.mkdir(&req, l, OsStr::new("new"), &node(0o755)).unwrap_err(),
            Errno::ENOTDIR
        );
        assert_eq!(fs.unlink(&req, l, OsStr::new("sentinel")).unwrap_err(), Errno::ENOTDIR);
        assert_eq!(
            fs.symlink(&req, l, OsStr::new("x"), OsStr::new("y")).unwrap_err(),
            Errno::ENOTDIR
        );
        let r = fs.rename(
            &req,
            l,
            OsStr::new("sentinel"),
            NodeId::ROOT,
            OsStr::new("got"),
            RenameFlags::default(),
        );
        assert_eq!(r.unwrap_err(), Errno::ENOTDIR);
        let r = fs.rename(
            &req,
            NodeId::ROOT,
            OsStr::new("a"),
            l,
            OsStr::new("moved"),
            RenameFlags::default(),
        );
        assert_eq!(r.unwrap_err(), Errno::ENOTDIR);
        // Attribute changes on the node touch the link, never its target.
        let trunc = SetAttr {
            size: Some(0),
            ..SetAttr::default()
        };
        assert!(fs.setattr(&req, l, &trunc).is_err(), "truncate through {link}");
        let own = SetAttr {
            uid: Some(4242),
            ..SetAttr::default()
        };
        assert_eq!(fs.setattr(&req, l, &own).unwrap().uid, 4242);
        let _ = fs.setxattr(&req, l, OsStr::new("user.x"), b"1", XattrFlags::empty());
        let _ = fs.setxattr(&req, l, OsStr::new("trusted.x"), b"1", XattrFlags::empty());
        // The hard link is to the symlink itself.
        let hl = fs
            .link(&req, l, NodeId::ROOT, OsStr::new(&format!("hl_{link}")))
            .unwrap();
        assert_eq!(hl.attr.file_type(), FileType::Symlink);
    }
    assert_eq!(fs::metadata(s.outside.join("sentinel")).unwrap().uid(), 0);
    assert_ne!(
        fs::symlink_metadata(s.src.join("to_sentinel")).unwrap().ino(),
        s.sentinel_ino
    );
    s.check_untouched();
}

#[test]
fn directory_listings_stay_inside() {
    let s = Setup::new("list");
    let fs = s.fs();
    let req = root_req();
    let dir = fs.opendir(&req, NodeId::ROOT, OpenFlags::RDONLY).unwrap().fh;
    let mut sink = Plus::new(100);
    fs.readdirplus(&req, NodeId::ROOT, dir, 0, &mut sink).unwrap();
    for (name, _, e) in &sink.got {
        if name == ".." || name == "." {
            // The source's parent is named but never handed out as a node.
            assert_eq!(e.node, NodeId(0));
        } else {
            assert!(s.src.join(name).symlink_metadata().is_ok(), "{name:?}");
        }
    }
    assert!(!sink.got.iter().any(|(n, _, _)| n == "sentinel"));
    fs.releasedir(&req, NodeId::ROOT, dir, OpenFlags::empty()).unwrap();

    let out = fs.lookup(&req, NodeId::ROOT, OsStr::new("out")).unwrap().node;
    assert_eq!(fs.opendir(&req, out, OpenFlags::RDONLY).unwrap_err(), Errno::ENOTDIR);
    let mut names = Names::new(10);
    assert!(fs
        .readdir(&req, out, shortfuse::FileHandle(dir.0), 0, &mut names)
        .is_err());
    assert!(names.got.is_empty());
    s.check_untouched();
}

#[test]
fn a_directory_swapped_for_a_symlink_keeps_its_inode() {
    let s = Setup::new("swap");
    let fs = s.fs();
    let req = root_req();
    let d = fs
        .mkdir(&req, NodeId::ROOT, OsStr::new("d"), &node(0o755))
        .unwrap()
        .node;
    // Someone with access to the source replaces `d` with a link outside.
    fs::rename(s.src.join("d"), s.src.join("d.moved")).unwrap();
    symlink("../outside", s.src.join("d")).unwrap();
    let c = fs.create(
        &req,
        d,
        OsStr::new("sentinel"),
        &node(0o644),
        OpenFlags::WRONLY | OpenFlags::TRUNC,
    );
    let c = c.unwrap();
    fs.write(&req, c.entry.node, c.opened.fh, b"overwritten?", &Default::default())
        .unwrap();
    assert_eq!(fs::read(s.src.join("d.moved/sentinel")).unwrap(), b"overwritten?");
    // A fresh lookup of `d` now gives the symlink, which is no parent.
    let l = fs.lookup(&req, NodeId::ROOT, OsStr::new("d")).unwrap();
    assert_eq!(l.attr.file_type(), FileType::Symlink);
    assert_eq!(
        fs.unlink(&req, l.node, OsStr::new("sentinel")).unwrap_err(),
        Errno::ENOTDIR
    );
    s.check_untouched();
}

#[test]
fn a_symlink_in_place_of_a_new_file_is_not_followed() {
    let s = Setup::new("create");
    let fs = s.fs();
    let req = root_req();
    // `create` without O_EXCL on a name that is (now) a symlink: O_NOFOLLOW.
    let c = fs.create(
        &req,
        NodeId::ROOT,
        OsStr::new("to_sentinel"),
        &node(0o644),
        OpenFlags::WRONLY | OpenFlags::TRUNC,
    );
    assert_eq!(c.map(|_| ()).unwrap_err(), Errno::ELOOP);
    assert_eq!(
        fs.mkdir(&req, NodeId::ROOT, OsStr::new("out"), &node(0o755))
            .unwrap_err(),
        Errno::EEXIST
    );
    // Removing or renaming the link acts on the link.
    fs.rename(
        &req,
        NodeId::ROOT,
        OsStr::new("out"),
        NodeId::ROOT,
        OsStr::new("out2"),
        RenameFlags::default(),
    )
    .unwrap();
    fs.unlink(&req, NodeId::ROOT, OsStr::new("to_sentinel")).unwrap();
    assert!(s.src.join("out2").symlink_metadata().unwrap().file_type().is_symlink());
    s.check_untouched();
}

fn readlink_beneath(src: &Path, parent: &[&str], name: &str) -> Vec<u8> {
    let opts = vec![("symlinks".to_string(), Some("beneath".to_string()))];
    let fs = PassthroughFs::with_options(src, &opts).unwrap();
    let req = root_req();
    let mut dir = NodeId::ROOT;
    for p in parent {
        dir = fs.lookup(&req, dir, OsStr::new(p)).unwrap().node;
    }
    let l = fs.lookup(&req, dir, OsStr::new(name)).unwrap().node;
    fs.readlink(&req, l).unwrap()
}

/// Resolves `target` lexically from `dir` (components below the mount
/// root), failing if it ever climbs above the root.
fn stays_inside(dir: &[&str], target: &[u8]) -> bool {
    let target = std::str::from_utf8(target).unwrap();
    if target.starts_with('/') {
        return false;
    }
    let mut depth = dir.len() as i64;
    for c in target.split('/').filter(|c| !c.is_empty()) {
        match c {
            "." => {}
            ".." => depth -= 1,
            _ => depth += 1,
        }
        if depth < 0 {
            return false;
        }
    }
    true
}

#[test]
fn readlink_beneath_rewrites_targets_inside_the_mount() {
    let s = Setup::new("beneath");
    assert_eq!(readlink_beneath(&s.src, &[], "etc"), b"etc");
    assert_eq!(readlink_beneath(&s.src, &[], "up3"), b".");
    assert_eq!(readlink_beneath(&s.src, &[], "out"), b"outside");
    assert_eq!(readlink_beneath(&s.src, &[], "to_sentinel"), b"outside/sentinel");
    assert_eq!(readlink_beneath(&s.src, &["a", "b"], "pw"), b"../../etc/passwd");
    assert_eq!(readlink_beneath(&s.src, &["a", "b"], "climb"), b"../../outside");
    let abs = readlink_beneath(&s.src, &[], "abs_out");
    assert!(stays_inside(&[], &abs), "{:?}", String::from_utf8_lossy(&abs));
    for (dir, name) in [
        (&[][..], "etc"),
        (&[][..], "up3"),
        (&["a", "b"][..], "pw"),
        (&["a", "b"][..], "climb"),
    ] {
        let t = readlink_beneath(&s.src, dir, name);
        assert!(stays_inside(dir, &t), "{name}: {:?}", String::from_utf8_lossy(&t));
    }
    // Raw mode returns the stored target.
    let fs = s.fs();
    let l = fs.lookup(&root_req(), NodeId::ROOT, OsStr::new("up3")).unwrap().node;
    assert_eq!(fs.readlink(&root_req(), l).unwrap(), b"../../..");
    s.check_untouched();
}
