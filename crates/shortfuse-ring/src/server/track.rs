//! What each client holds (lookups, handles, the descriptions it anchored),
//! which nodes it may name, and giving it all back when it or one of its
//! processes goes.

use shortfuse::sync::lock;
use shortfuse::LookupCount;
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use shortfuse_abi::{self as abi, Operation};
use zerocopy::{FromBytes, IntoBytes};

use crate::proto::WatchMsg;

use super::{build, build_forgets, Conn, Shared};

/// What a client holds in the file system, to give back when it goes.
#[derive(Default)]
pub(super) struct Track {
    /// (fh, directory?) -> what the handle is open on, and who owns it.
    pub(super) handles: HashMap<(u64, bool), Handle>,
    /// node -> lookups handed out to this client and not forgotten (the
    /// client's share of the file system's count of the node).
    pub(super) lookups: HashMap<u64, LookupCount>,
    /// The anchored descriptions (by lock owner) this client anchored or
    /// claimed (see [`crate::proto::CLAIM_MAGIC`]): it may name their
    /// nodes.
    pub(super) described: std::collections::HashSet<u64>,
}

impl Conn {
    /// Whether every node `req` names is the root, one this client holds a
    /// lookup of, or one an open file description of its own holds (a
    /// program's descriptions outlive the connection that opened them, see
    /// [`crate::anchors`]). A malformed request passes: the dispatcher
    /// refuses it.
    pub(super) fn names_given_nodes(&self, shared: &Shared, req: &[u8], h: &abi::fuse_in_header) -> bool {
        let Ok(parsed) = abi::parse(req) else {
            return true;
        };
        let mut nodes = vec![h.nodeid];
        match &parsed.op {
            Operation::Link { arg, .. } => nodes.push(arg.oldnodeid),
            Operation::Rename { arg, .. } => nodes.push(arg.newdir),
            Operation::Rename2 { arg, .. } => nodes.push(arg.newdir),
            Operation::CopyFileRange { arg } => nodes.push(arg.nodeid_out),
            Operation::BatchForget { nodes: list, .. } => nodes.extend(list.iter().map(|f| f.nodeid)),
            _ => {}
        }
        let t = lock(&self.track);
        // 0 names no node (INIT, INTERRUPT).
        nodes.iter().all(|&n| n == 0 || self.given(shared, &t, n))
    }

    /// Whether this client may name `node`: the root (everybody's), one it
    /// holds a lookup of, or one an open file description it anchored or
    /// claimed holds (another client's descriptions are not its own).
    pub(super) fn given(&self, shared: &Shared, t: &Track, node: u64) -> bool {
        node == abi::FUSE_ROOT_ID
            || t.lookups.contains_key(&node)
            || shared.anchors.holds_node(node, |owner| t.described.contains(&owner))
    }

    /// The kernel node standing for FIFO or device node `node` (see
    /// [`nodes`]), for a client that may name it.
    pub(super) fn kernel_node(&self, shared: &Shared, node: u64) -> Result<OwnedFd, i32> {
        let given = self.peer.may_name_any_node(shared.owner) || self.given(shared, &lock(&self.track), node);
        if !given {
            return Err(libc::ESTALE);
        }
        let attr = self.attr_of(shared, node)?;
        shared.nodes.open(node, &attr)
    }

    /// Sends the file system request `opcode` on `node` with `parts`, as
    /// the daemon's own: the answer's body, or the errno.
    fn own_request(&self, shared: &Shared, opcode: u32, node: u64, parts: &[&[u8]]) -> Result<Vec<u8>, i32> {
        let (mut req, mut reply) = (Vec::new(), Vec::new());
        build(&mut req, opcode, u64::MAX, node, parts);
        self.handle(shared, &req, &mut reply);
        let (out, _) = abi::fuse_out_header::read_from_prefix(&reply).map_err(|_| libc::EIO)?;
        if out.error != 0 {
            return Err(-out.error);
        }
        Ok(reply.split_off(std::mem::size_of::<abi::fuse_out_header>()))
    }

    /// The attributes of `node`.
    fn attr_of(&self, shared: &Shared, node: u64) -> Result<abi::fuse_attr, i32> {
        let arg = abi::fuse_getattr_in {
            getattr_flags: 0,
            dummy: 0,
            fh: 0,
        };
        let body = self.own_request(shared, abi::FUSE_GETATTR, node, &[arg.as_bytes()])?;
        let (attr, _) = abi::fuse_attr_out::read_from_prefix(&body).map_err(|_| libc::EIO)?;
        Ok(attr.attr)
    }

    /// The names in directory `node`, with their nodes and `DT_*` types.
    fn names_of(&self, shared: &Shared, node: u64) -> Result<Vec<(Vec<u8>, u64, u32)>, i32> {
        let open = abi::fuse_open_in {
            flags: libc::O_RDONLY as u32,
            open_flags: 0,
        };
        let body = self.own_request(shared, abi::FUSE_OPENDIR, node, &[open.as_bytes()])?;
        let (o, _) = abi::fuse_open_out::read_from_prefix(&body).map_err(|_| libc::EIO)?;
        let mut listed = Vec::new();
        let mut offset = 0;
        let read = loop {
            let arg = abi::fuse_read_in {
                fh: o.fh,
                offset,
                size: 64 * 1024,
                read_flags: 0,
                lock_owner: 0,
                flags: 0,
                padding: 0,
            };
            let body = match self.own_request(shared, abi::FUSE_READDIR, node, &[arg.as_bytes()]) {
                Ok(b) => b,
                Err(e) => break Err(e),
            };
            if body.is_empty() {
                break Ok(());
            }
            let mut rest = &body[..];
            while let Ok((d, tail)) = abi::fuse_dirent::read_from_prefix(rest) {
                let Some(name) = tail.get(..d.namelen as usize) else {
                    break;
                };
                if name != b"." && name != b".." {
                    listed.push((name.to_vec(), d.typ));
                }
                offset = d.off;
                rest = rest.get(abi::fuse_dirent_size(d.namelen as usize)..).unwrap_or(&[]);
            }
        };
        let release = abi::fuse_release_in {
            fh: o.fh,
            flags: 0,
            release_flags: 0,
            lock_owner: 0,
        };
        let _ = self.own_request(shared, abi::FUSE_RELEASEDIR, node, &[release.as_bytes()]);
        read?;
        // Each name's node, given back at once: the daemon holds none.
        let mut names = Vec::with_capacity(listed.len());
        for (name, typ) in listed {
            let mut cname = name.clone();
            cname.push(0);
            let Ok(body) = self.own_request(shared, abi::FUSE_LOOKUP, node, &[&cname]) else {
                continue;
            };
            let Ok((e, _)) = abi::fuse_entry_out::read_from_prefix(&body) else {
                continue;
            };
            if e.nodeid != 0 {
                let forget = abi::fuse_forget_in { nlookup: 1 };
                let mut req = Vec::new();
                build(&mut req, abi::FUSE_FORGET, u64::MAX, e.nodeid, &[forget.as_bytes()]);
                self.handle(shared, &req, &mut Vec::new());
            }
            names.push((name, e.nodeid, typ));
        }
        Ok(names)
    }

    /// The mirror of `m.node` (named `name` in `m.parent`) for inotify
    /// watches (see `watches`), for a client that may name the node.
    pub(super) fn watch_node(&self, shared: &Shared, m: &WatchMsg, name: &[u8]) -> Result<OwnedFd, i32> {
        let given = self.peer.may_name_any_node(shared.owner) || self.given(shared, &lock(&self.track), m.node);
        if !given {
            return Err(libc::ESTALE);
        }
        let attr = self.attr_of(shared, m.node)?;
        let dir = attr.mode & libc::S_IFMT == libc::S_IFDIR;
        let at = (m.parent != 0).then(|| (m.parent, name.to_vec()));
        shared.watches.open(m.node, dir, at, || self.names_of(shared, m.node))
    }

    /// Records handles and lookups handed out to this client, and their
    /// return; returns the process to watch when it got a file handle.
    pub(super) fn track(&self, r: &abi::Request<'_>, ok: bool, reply: &[u8], pid: u32) -> Option<u32> {
        let body = reply.get(16..).unwrap_or(&[]);
        let entry = || abi::fuse_entry_out::read_from_prefix(body).ok().map(|(e, _)| e);
        let mut t = lock(&self.track);
        match &r.op {
            Operation::Forget { arg } => t.forget(r.header.nodeid, arg.nlookup),
            Operation::BatchForget { nodes, .. } => {
                for f in nodes.iter() {
                    t.forget(f.nodeid, f.nlookup);
                }
            }
            _ if !ok => {}
            Operation::Open { .. } | Operation::Opendir { .. } => {
                if let Ok((o, _)) = abi::fuse_open_out::read_from_prefix(body) {
                    let dir = matches!(r.op, Operation::Opendir { .. });
                    let pid = if dir { 0 } else { pid };
                    t.handles.insert(
                        (o.fh, dir),
                        Handle {
                            node: r.header.nodeid,
                            pid,
                        },
                    );
                    return (!dir).then_some(pid);
                }
            }
            Operation::Create { .. } => {
                if let Some(e) = entry().filter(|e| e.nodeid != 0) {
                    t.lookups.entry(e.nodeid).or_default().add(1);
                    let rest = body.get(std::mem::size_of::<abi::fuse_entry_out>()..).unwrap_or(&[]);
                    if let Ok((o, _)) = abi::fuse_open_out::read_from_prefix(rest) {
                        t.handles.insert((o.fh, false), Handle { node: e.nodeid, pid });
                        return Some(pid);
                    }
                }
            }
            Operation::Lookup { .. }
            | Operation::Mknod { .. }
            | Operation::Mkdir { .. }
            | Operation::Symlink { .. }
            | Operation::Link { .. } => {
                if let Some(e) = entry().filter(|e| e.nodeid != 0) {
                    t.lookups.entry(e.nodeid).or_default().add(1);
                }
            }
            Operation::Readdirplus { .. } => {
                for (d, name) in abi::direntplus_entries(body) {
                    if d.counts_as_lookup(name) {
                        t.lookups.entry(d.entry_out.nodeid).or_default().add(1);
                    }
                }
            }
            _ => {}
        }
        None
    }

    /// Gives back what a departed client held: RELEASE/RELEASEDIR for its
    /// open handles, one BATCH_FORGET for its lookups.
    pub(super) fn reclaim(&self, shared: &Shared) {
        let t = std::mem::take(&mut *lock(&self.track));
        let now = std::time::Instant::now();
        let mut req = Vec::new();
        let mut reply = Vec::new();
        let mut unique = u64::MAX;
        for ((fh, dir), h) in t.handles {
            self.release_for(shared, &mut req, &mut reply, unique, fh, dir, h.node);
            unique -= 1;
        }
        let forgets: Vec<abi::fuse_forget_one> = t
            .lookups
            .into_iter()
            .map(|(nodeid, n)| abi::fuse_forget_one {
                nodeid,
                nlookup: shared.entries.keep(nodeid, shared.keep_lookups(nodeid, n.get()), now),
            })
            .filter(|f| f.nlookup > 0)
            .collect();
        build_forgets(&mut req, unique, &forgets, |req| {
            self.handle(shared, req, &mut reply);
        });
    }

    /// RELEASE (or RELEASEDIR) of handle `fh` on `node` on behalf of the
    /// client, which can no longer send it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn release_for(
        &self,
        shared: &Shared,
        req: &mut Vec<u8>,
        reply: &mut Vec<u8>,
        unique: u64,
        fh: u64,
        dir: bool,
        node: u64,
    ) {
        let arg = abi::fuse_release_in {
            fh,
            flags: 0,
            release_flags: 0,
            lock_owner: 0,
        };
        let op = if dir { abi::FUSE_RELEASEDIR } else { abi::FUSE_RELEASE };
        build(req, op, unique, node, &[arg.as_bytes()]);
        self.handle(shared, req, reply);
    }

    /// Gives back the file handles process `pid` opened through this
    /// connection and never gave to a description (see [`Handle`]).
    pub(super) fn release_pid(&self, shared: &Shared, pid: u32) {
        let mine: Vec<((u64, bool), Handle)> = {
            let mut t = lock(&self.track);
            let keys: Vec<(u64, bool)> = t
                .handles
                .iter()
                .filter(|(_, h)| h.pid == pid && pid != 0)
                .map(|(k, _)| *k)
                .collect();
            keys.into_iter()
                .filter_map(|k| t.handles.remove(&k).map(|h| (k, h)))
                .collect()
        };
        let (mut req, mut reply) = (Vec::new(), Vec::new());
        for (i, ((fh, dir), h)) in mine.into_iter().enumerate() {
            self.release_for(shared, &mut req, &mut reply, u64::MAX - i as u64, fh, dir, h.node);
        }
    }

    /// Takes a RELEASE or RELEASEDIR out of the client's handles before it
    /// goes to the file system: false (answer it, but do not pass it on)
    /// for a handle the client does not own, or that another process of
    /// the connection opened: one given to a description already (a
    /// forked child closing its copy), or garbage.
    pub(super) fn releasing(&self, req: &[u8], node: u64, pid: u32, dir: bool) -> bool {
        let body = req.get(std::mem::size_of::<abi::fuse_in_header>()..).unwrap_or(&[]);
        let Ok((arg, _)) = abi::fuse_release_in::read_from_prefix(body) else {
            return false;
        };
        let mut t = lock(&self.track);
        match t.handles.get(&(arg.fh, dir)) {
            Some(h) if h.node == node && (h.pid == 0 || h.pid == pid) => {
                t.handles.remove(&(arg.fh, dir));
                true
            }
            _ => false,
        }
    }
}

/// An open handle a connection owns: released when the connection ends,
/// and a file's handle (not yet given to its description, see
/// [`crate::anchors`]) also when the process that opened it ends: the
/// connection is shared by the processes forked from its owner, and the
/// shim gives every description to the daemon before another process can
/// hold it, so until then it is that one process's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Handle {
    pub(super) node: u64,
    /// The opening process (0 for directories: theirs stay the
    /// connection's, whichever of its processes closes them).
    pub(super) pid: u32,
}

impl Track {
    pub(super) fn forget(&mut self, node: u64, n: u64) {
        if self.lookups.get_mut(&node).is_some_and(|c| c.forget(n)) {
            self.lookups.remove(&node);
        }
    }
}

impl Shared {
    /// Process `pid` of some client ended: its POSIX locks go, and so do the
    /// file handles it opened and kept to itself.
    pub(super) fn process_ended(&self, pid: u32) {
        self.locks.release_owner(crate::locks::POSIX_OWNER | u64::from(pid));
        let clients: Vec<Arc<Conn>> = lock(&self.clients).clone();
        for c in clients {
            c.release_pid(self, pid);
        }
    }
}

/// Opcodes whose requests change what clients hold or cache.
pub(super) fn tracked(opcode: u32) -> bool {
    matches!(
        opcode,
        abi::FUSE_LOOKUP
            | abi::FUSE_READDIRPLUS
            | abi::FUSE_FORGET
            | abi::FUSE_BATCH_FORGET
            | abi::FUSE_OPEN
            | abi::FUSE_OPENDIR
    ) || abi::changes_file_system(opcode)
}
