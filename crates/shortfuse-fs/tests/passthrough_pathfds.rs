//! The inode descriptor budget (`-o path_fds=N`): with more inodes known
//! than the budget, descriptors are given up for file handles and reopened
//! on use, and every operation still reaches the right inode.

mod passthrough_support;

use std::ffi::OsStr;
use std::fs;

use passthrough_support::{root_req, TempDir};
use shortfuse::{Errno, Filesystem, NewNode, NodeId, OpenFlags, ReleaseArgs, WriteArgs};
use shortfuse_fs::passthrough::PassthroughFs;

const BUDGET: usize = 32;

fn with_budget(dir: &std::path::Path, n: usize) -> PassthroughFs {
    PassthroughFs::with_options(dir, &[("path_fds".to_string(), Some(n.to_string()))]).unwrap()
}

/// Creates `name` holding `data` and closes it; returns its node.
fn create(fs: &PassthroughFs, name: &str, data: &[u8]) -> NodeId {
    let req = root_req();
    let new = NewNode {
        mode: libc::S_IFREG | 0o644,
        umask: 0,
        rdev: 0,
    };
    let c = fs
        .create(&req, NodeId::ROOT, OsStr::new(name), &new, OpenFlags::RDWR)
        .unwrap();
    let args = WriteArgs {
        offset: 0,
        ..WriteArgs::default()
    };
    assert_eq!(
        fs.write(&req, c.entry.node, c.opened.fh, data, &args).unwrap(),
        data.len()
    );
    fs.release(&req, c.entry.node, c.opened.fh, &ReleaseArgs::default())
        .unwrap();
    c.entry.node
}

fn read_all(fs: &PassthroughFs, node: NodeId) -> Vec<u8> {
    let req = root_req();
    let o = fs.open(&req, node, OpenFlags::RDONLY).unwrap();
    let mut buf = vec![0u8; 4096];
    let n = fs.read(&req, node, o.fh, 0, &mut buf).unwrap();
    fs.release(&req, node, o.fh, &ReleaseArgs::default()).unwrap();
    buf.truncate(n);
    buf
}

#[test]
fn many_inodes_stay_within_the_budget_and_reach_the_right_file() {
    let tmp = TempDir::new("pathfds");
    let fs = with_budget(tmp.path(), BUDGET);
    assert_eq!(
        fs.path_fds().1,
        Some(BUDGET),
        "file handles must work on the test's source (ext4 or tmpfs, as root)"
    );
    let nodes: Vec<NodeId> = (0..20 * BUDGET)
        .map(|i| create(&fs, &format!("f{i}"), format!("content of f{i}").as_bytes()))
        .collect();
    let (open, _) = fs.path_fds();
    assert!(
        open <= BUDGET + 1,
        "{open} inode descriptors open with a budget of {BUDGET}"
    );
    let given_up = nodes.iter().filter(|&&n| !fs.holds_path_fd(n).unwrap()).count();
    assert!(
        given_up >= nodes.len() - BUDGET - 1,
        "only {given_up} descriptors given up"
    );

    // Every node still names its own file: attributes, data, a rename in the
    // source behind our back, and a lookup that refills the slot.
    let req = root_req();
    for (i, &node) in nodes.iter().enumerate() {
        let want = format!("content of f{i}");
        assert_eq!(fs.getattr(&req, node, None).unwrap().size, want.len() as u64, "f{i}");
        assert_eq!(read_all(&fs, node), want.as_bytes(), "f{i}");
    }
    let (open, _) = fs.path_fds();
    assert!(
        open <= BUDGET + 2,
        "reopened descriptors were not given up again: {open} open"
    );
    fs::rename(tmp.path().join("f7"), tmp.path().join("renamed")).unwrap();
    assert_eq!(read_all(&fs, nodes[7]), b"content of f7");
    let e = fs.lookup(&req, NodeId::ROOT, OsStr::new("renamed")).unwrap();
    assert_eq!(e.node, nodes[7], "a lookup of a known inode must give its node");
}

#[test]
fn open_inodes_keep_their_descriptor_and_unlinked_ones_are_stale() {
    let tmp = TempDir::new("pathfds-open");
    let fs = with_budget(tmp.path(), BUDGET);
    let req = root_req();
    let kept = create(&fs, "kept", b"kept");
    let o = fs.open(&req, kept, OpenFlags::RDONLY).unwrap();
    let gone = create(&fs, "gone", b"gone");
    for i in 0..10 * BUDGET {
        create(&fs, &format!("g{i}"), b"x");
    }
    assert!(
        fs.holds_path_fd(kept).unwrap(),
        "an inode with an open handle gave its descriptor up"
    );
    assert!(!fs.holds_path_fd(gone).unwrap(), "a cold inode kept its descriptor");
    fs::remove_file(tmp.path().join("gone")).unwrap();
    assert_eq!(fs.getattr(&req, gone, None).unwrap_err(), Errno::ESTALE);
    // The open one still works after its name is removed.
    fs::remove_file(tmp.path().join("kept")).unwrap();
    assert_eq!(fs.getattr(&req, kept, None).unwrap().nlink, 0);
    fs.release(&req, kept, o.fh, &ReleaseArgs::default()).unwrap();
}

#[test]
fn budget_option_is_checked() {
    let tmp = TempDir::new("pathfds-opt");
    for bad in ["0", "-1", "many"] {
        let err = PassthroughFs::with_options(tmp.path(), &[("path_fds".to_string(), Some(bad.to_string()))])
            .err()
            .expect("invalid path_fds accepted");
        assert!(err.to_string().contains(&format!("path_fds={bad}")), "{err}");
    }
    // Without the option the budget is half the descriptor limit.
    let fs = PassthroughFs::new(tmp.path()).unwrap();
    let (_, budget) = fs.path_fds();
    assert!(budget.is_some_and(|b| b >= 256), "default budget {budget:?}");
}
