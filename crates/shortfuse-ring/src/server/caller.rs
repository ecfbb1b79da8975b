//! Who asks: the credentials each request carries, checked against what
//! the client's process could hold, and taken on by the worker thread
//! while the file system serves it.
//!
//! The shim stamps every request with its thread's current fsuid and fsgid
//! (the header's uid and gid) and supplementary groups (the
//! FUSE_EXT_GROUPS extension), as the kernel does for /dev/fuse. The
//! header is written by the client, so the daemon believes it only as far
//! as the client's process could have those credentials: a client that
//! connected as root may act as anybody (root can become anybody); any
//! other may claim only the user ids (real, effective, saved, file
//! system) and the groups (those ids' and its supplementary groups) it
//! had when it connected, for a process can give up credentials but never
//! gain them (exec of a set-user-ID program connects anew). Anything else
//! is refused with EPERM.
//!
//! A daemon running as root whose file system works on the host's files
//! (passthrough) acts with the caller's credentials: the worker thread
//! takes the caller's fsuid, fsgid and groups for the request, so the
//! kernel checks every permission on the source as it would for the
//! caller, with its groups, and the caller owns what it creates.

use std::os::fd::BorrowedFd;

use crate::sys;
use shortfuse_abi as abi;

/// What a client's process may claim to be.
pub struct Peer {
    /// Connected as root: may claim anything.
    root: bool,
    uids: Vec<u32>,
    gids: Vec<u32>,
}

impl Peer {
    /// The process at the other end of `sock`, now.
    pub fn of(sock: BorrowedFd<'_>) -> std::io::Result<Peer> {
        let (pid, uid, gid) = sys::peer_creds(sock)?;
        let mut uids = vec![uid];
        let mut gids = vec![gid];
        if uid != 0 {
            // Every id of the process (a set-user-ID program holds two).
            let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
            for line in status.lines() {
                let ids = |rest: &str| -> Vec<u32> { rest.split_whitespace().filter_map(|v| v.parse().ok()).collect() };
                if let Some(rest) = line.strip_prefix("Uid:") {
                    uids.extend(ids(rest));
                } else if let Some(rest) = line.strip_prefix("Gid:").or_else(|| line.strip_prefix("Groups:")) {
                    gids.extend(ids(rest));
                }
            }
        }
        Ok(Peer {
            root: uid == 0,
            uids,
            gids,
        })
    }

    /// The user id the process connected with.
    pub fn uid(&self) -> u32 {
        self.uids[0]
    }

    /// The group id the process connected with.
    pub fn gid(&self) -> u32 {
        self.gids[0]
    }

    /// Whether the process connected as root (it may claim any ids).
    pub fn is_root(&self) -> bool {
        self.root
    }

    /// Whether the process may name any node: root (it can become
    /// anybody) or the daemon's own user `owner` (it could read the
    /// daemon's memory). Others name only the nodes they were given.
    pub fn may_name_any_node(&self, owner: u32) -> bool {
        self.root || self.uid() == owner
    }

    /// Whether the process could hold `who`'s credentials.
    pub fn may_be(&self, who: &Who<'_>) -> bool {
        self.root
            || (self.uids.contains(&who.uid)
                && self.gids.contains(&who.gid)
                && who.groups().all(|g| self.gids.contains(&g)))
    }
}

/// The credentials a request carries.
pub struct Who<'a> {
    pub uid: u32,
    pub gid: u32,
    /// The FUSE_EXT_GROUPS extension's group ids (native-endian u32s).
    groups: &'a [u8],
}

impl<'a> Who<'a> {
    /// Reads them from a request: its header and its extensions. None for
    /// malformed extensions (the dispatcher refuses the request anyway).
    pub fn of(req: &'a [u8], h: &abi::fuse_in_header) -> Option<Who<'a>> {
        let extlen = usize::from(h.total_extlen) * 8;
        let len = (h.len as usize).min(req.len());
        let hdr = std::mem::size_of::<abi::fuse_in_header>();
        if len < hdr + extlen {
            return None;
        }
        let groups = abi::supp_groups(&req[len - extlen..len])?;
        Some(Who {
            uid: h.uid,
            gid: h.gid,
            groups,
        })
    }

    pub fn groups(&self) -> impl Iterator<Item = u32> + '_ {
        self.groups
            .chunks_exact(4)
            .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// While alive, the worker thread acts with a caller's credentials; its
/// own come back on drop.
pub struct Acting {
    /// The thread's own fsuid, fsgid and groups, to take back.
    own: Option<(u32, u32, Vec<u32>)>,
}

impl Acting {
    /// Takes `who`'s credentials when `impersonate` and the caller is not
    /// root; Err(EPERM) when the kernel refused them.
    pub fn start(who: &Who<'_>, impersonate: bool) -> Result<Acting, i32> {
        if !impersonate || who.uid == 0 {
            return Ok(Acting { own: None });
        }
        let uid = sys::fsuid();
        let gid = sys::fsgid();
        let own = (uid, gid, sys::thread_groups());
        let groups: Vec<u32> = who.groups().collect();
        let acting = Acting { own: Some(own) };
        if !sys::set_thread_creds(who.uid, who.gid, &groups) {
            return Err(libc::EPERM);
        }
        Ok(acting)
    }
}

impl Drop for Acting {
    fn drop(&mut self) {
        if let Some((uid, gid, groups)) = self.own.take() {
            // Back to root first: setgroups and setfsgid need the
            // capabilities a non-zero fsuid does not drop, but in this
            // order nothing depends on that.
            sys::set_fsuid(uid);
            sys::set_thread_creds(uid, gid, &groups);
        }
    }
}
