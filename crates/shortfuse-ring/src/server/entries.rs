//! The names and attributes an unmodified daemon gave, kept across
//! programs for the timeouts it gave them, as the kernel keeps dentries
//! and inode attributes for its mount.
//!
//! Each program under `shortfuse run` starts with an empty cache of its
//! own, so a second `ls -lR` would look every name up again where the
//! kernel answers from its dentries. The server keeps what LOOKUP
//! answered (name to node until the entry timeout, the node's attributes
//! until the attribute timeout), and when a departed program's lookups of
//! such a node would be forgotten, keeps them instead, as the kernel keeps
//! the lookup of a dentry it caches. A later program's READDIRPLUS whose
//! entries came without a node (sshfs, and every libfuse high-level file
//! system, lists names only) gets them filled in from here, each taking
//! one kept lookup, so the program caches them as LOOKUP answers and
//! sends no LOOKUP per name. Nothing is filled in past the daemon's
//! timeouts (the remaining time is what the program gets), nor for a name
//! the listing gives another type, nor after a change made through the
//! rings or an invalidation the daemon sent; kept lookups are forgotten
//! once every name of their node has timed out.
//!
//! What is kept is also published in a shared table (see
//! [`crate::name_table`]) that the programs of the daemon's own user read
//! their `stat`s from; every drop here takes it out of the table too,
//! before the change is answered or announced.

use shortfuse::sync::lock;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use shortfuse_abi as abi;
use zerocopy::{FromBytes, IntoBytes};

use crate::client::Notice;
use crate::name_table::{self, NameTable};

use super::{build_forgets, Shared};

/// How often kept lookups whose names timed out are given back.
const EXPIRY: Duration = Duration::from_millis(500);

/// Past this many names, those timed out are dropped, then all.
const MAX_NAMES: usize = 1 << 18;
/// The longest a timeout is taken at (a daemon's "forever").
const LONGEST: Duration = Duration::from_secs(24 * 3600);
/// How long a change keeps LOOKUP answers about what it touched from being
/// kept: the daemon's threads race, so an answer it gave before the change
/// may reach the server after the change was announced.
const SETTLE: Duration = Duration::from_secs(1);
/// Changes remembered for [`SETTLE`] at most; past that, all is taken as
/// changed.
const RECENT_MAX: usize = 1 << 16;

/// The server's cache of names and attributes (see the module doc); empty
/// and inert when not `enabled`.
pub(super) struct Entries {
    enabled: bool,
    inner: Mutex<Inner>,
    /// The shared table, written under `inner`'s lock (its one writer).
    table: Option<NameTable>,
}

#[derive(Default)]
struct Inner {
    /// (parent, name) -> the node LOOKUP answered.
    names: HashMap<(u64, Box<[u8]>), Name>,
    nodes: HashMap<u64, Node>,
    /// The sum of the nodes' `kept`.
    kept: u64,
    recent: Recent,
}

/// The changes of the last [`SETTLE`], by what they touched.
#[derive(Default)]
struct Recent {
    nodes: HashMap<u64, Instant>,
    names: HashMap<(u64, Box<[u8]>), Instant>,
    all: Option<Instant>,
}

impl Recent {
    fn note(&mut self, notice: Notice<'_>, gone: Option<u64>, now: Instant) {
        if self.nodes.len() + self.names.len() >= RECENT_MAX {
            let fresh = |t: &mut Instant| now.saturating_duration_since(*t) < SETTLE;
            self.nodes.retain(|_, t| fresh(t));
            self.names.retain(|_, t| fresh(t));
            if self.nodes.len() + self.names.len() >= RECENT_MAX {
                self.nodes.clear();
                self.names.clear();
                self.all = Some(now);
            }
        }
        match notice {
            Notice::Inode(node) => {
                self.nodes.insert(node, now);
            }
            Notice::Entry { parent, name } => {
                self.names.insert((parent, Box::from(name)), now);
                self.nodes.insert(parent, now);
                if let Some(n) = gone {
                    self.nodes.insert(n, now);
                }
            }
            Notice::All => self.all = Some(now),
        }
    }

    /// Whether a change touched `node` (a directory: a name in it, or the
    /// node itself) at `since` or later.
    fn changed_since(&self, node: u64, since: Instant) -> bool {
        self.all.is_some_and(|t| t >= since) || self.nodes.get(&node).is_some_and(|&t| t >= since)
    }

    /// Whether a change of the last [`SETTLE`] touched name `key` or `node`.
    fn touched(&self, key: &(u64, Box<[u8]>), node: u64, now: Instant) -> bool {
        let fresh = |t: &Instant| now.saturating_duration_since(*t) < SETTLE;
        self.all.as_ref().is_some_and(fresh)
            || self.nodes.get(&node).is_some_and(fresh)
            || self.names.get(key).is_some_and(fresh)
    }
}

struct Name {
    node: u64,
    generation: u64,
    until: Instant,
}

struct Node {
    attr: abi::fuse_attr,
    attr_until: Instant,
    /// The latest timeout of a name of the node (or of one since dropped).
    named_until: Instant,
    /// Lookups of departed programs the server holds for the node.
    kept: u64,
}

fn timeout(secs: u64, nsec: u32) -> Duration {
    Duration::from_secs(secs)
        .saturating_add(Duration::from_nanos(u64::from(nsec.min(999_999_999))))
        .min(LONGEST)
}

fn split(d: Duration) -> (u64, u32) {
    (d.as_secs(), d.subsec_nanos())
}

impl Entries {
    /// `share`: publish in the shared table too.
    pub(super) fn new(enabled: bool, share: bool) -> Entries {
        let table = (enabled && share)
            .then(|| {
                NameTable::new()
                    .inspect_err(|e| tracing::warn!("shortfuse ring: no shared name table: {e}"))
                    .ok()
            })
            .flatten();
        Entries {
            enabled,
            inner: Mutex::default(),
            table,
        }
    }

    /// The shared table's descriptor, for a client that may read it.
    pub(super) fn table(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.table.as_ref().map(NameTable::memfd)
    }

    pub(super) fn enabled(&self) -> bool {
        self.enabled
    }

    /// Whether what is kept is shared with the programs.
    pub(super) fn shares(&self) -> bool {
        self.table.is_some()
    }

    /// Learns the entries of READDIRPLUS `reply` of `parent` that the
    /// daemon gave with a node, as LOOKUP answers (a listing counts a
    /// lookup of each, as the kernel's `fuse_direntplus_link`): the `stat`
    /// of a listed name in another program then finds it shared.
    pub(super) fn learn_listing(&self, parent: u64, reply: &[u8], now: Instant) {
        const HEADER: usize = std::mem::size_of::<abi::fuse_out_header>();
        if !self.enabled || !shortfuse::answered_ok(reply) {
            return;
        }
        for (d, name) in abi::direntplus_entries(reply.get(HEADER..).unwrap_or(&[])) {
            if d.counts_as_lookup(name) {
                self.learn(parent, name, &d.entry_out, now);
            }
        }
    }

    /// Shares `records` (see [`crate::listings`]), the whole listing of
    /// directory `dir` whose first answer reached the server at `started`,
    /// until the earliest deadline of the directory's attributes and of its
    /// names held here (see `server::listings` for why), when the
    /// directory did not change since the settling time before `started`.
    pub(super) fn share_listing(&self, dir: u64, records: &[u8], started: Instant, now: Instant) {
        let Some(t) = &self.table else {
            return;
        };
        let g = lock(&self.inner);
        if g.recent
            .changed_since(dir, started.checked_sub(SETTLE).unwrap_or(started))
        {
            return;
        }
        let dir_until = g.nodes.get(&dir).map(|n| n.attr_until);
        let mut until = dir_until;
        let mut key = (dir, Box::<[u8]>::from(&b""[..]));
        for r in crate::listings::records(records) {
            if r.name == b"." || r.name == b".." {
                continue;
            }
            key.1 = Box::from(r.name);
            match g.names.get(&key) {
                Some(n) => until = Some(until.map_or(n.until, |u| u.min(n.until))),
                // A name nothing is known of: the directory's attributes
                // vouch for it, or nothing does.
                None if dir_until.is_some() => {}
                None => return,
            }
        }
        let Some(until) = until.filter(|&u| u > now) else {
            return;
        };
        let left = u64::try_from((until - now).as_nanos()).unwrap_or(u64::MAX);
        t.put_listing(dir, records, name_table::now_ns().saturating_add(left));
    }

    /// LOOKUP of `name` in `parent` answered `e` at `now`.
    pub(super) fn learn(&self, parent: u64, name: &[u8], e: &abi::fuse_entry_out, now: Instant) {
        if !self.enabled {
            return;
        }
        let mut g = lock(&self.inner);
        let key = (parent, Box::<[u8]>::from(name));
        if e.nodeid == 0 || g.recent.touched(&key, e.nodeid, now) {
            g.names.remove(&key);
            if let Some(t) = &self.table {
                t.clear_name(parent, name);
            }
            return;
        }
        if g.names.len() >= MAX_NAMES {
            g.names.retain(|_, n| n.until > now);
            if g.names.len() >= MAX_NAMES {
                g.names.clear();
            }
            // A node nothing is kept of is only there to start keeping.
            g.nodes.retain(|_, n| n.kept > 0);
        }
        let entry_for = timeout(e.entry_valid, e.entry_valid_nsec);
        let attr_for = timeout(e.attr_valid, e.attr_valid_nsec);
        if let Some(t) = &self.table {
            // Deadlines on the clock every process reads (`now` is close to it).
            let ns = name_table::now_ns();
            let deadline = |d: Duration| ns.saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
            t.put_attr(e.nodeid, &e.attr, deadline(attr_for));
            t.put_name(parent, name, e.nodeid, e.generation, deadline(entry_for));
        }
        let until = now + entry_for;
        let attr_until = now + attr_for;
        g.names.insert(
            key,
            Name {
                node: e.nodeid,
                generation: e.generation,
                until,
            },
        );
        let node = g.nodes.entry(e.nodeid).or_insert(Node {
            attr: e.attr,
            attr_until,
            named_until: until,
            kept: 0,
        });
        node.attr = e.attr;
        node.attr_until = attr_until;
        node.named_until = node.named_until.max(until);
    }

    /// A departed program's `n` lookups of `node`: how many to forget now
    /// (the rest are kept while a name of the node is fresh).
    pub(super) fn keep(&self, node: u64, n: u64, now: Instant) -> u64 {
        if !self.enabled || n == 0 {
            return n;
        }
        let mut g = lock(&self.inner);
        match g.nodes.get_mut(&node) {
            Some(k) if k.named_until > now => {
                k.kept += n;
                g.kept += n;
                0
            }
            _ => n,
        }
    }

    /// Fills in, in READDIRPLUS `reply` of directory `parent`, the entries
    /// that came without a node and whose name and attributes are fresh
    /// here with a lookup kept: each such entry is then one lookup the
    /// program holds. Returns how many were filled in.
    pub(super) fn fill(&self, parent: u64, reply: &mut [u8], now: Instant) -> usize {
        const HEADER: usize = std::mem::size_of::<abi::fuse_out_header>();
        if !self.enabled || !shortfuse::answered_ok(reply) {
            return 0;
        }
        let mut g = lock(&self.inner);
        if g.kept == 0 {
            return 0;
        }
        let Inner { names, nodes, kept, .. } = &mut *g;
        let mut filled = 0;
        let mut at = HEADER;
        while let Ok((d, _)) = abi::fuse_direntplus::read_from_prefix(&reply[at..]) {
            let start = at + abi::FUSE_NAME_OFFSET_DIRENTPLUS;
            let Some(name) = reply.get(start..start + d.dirent.namelen as usize) else {
                break;
            };
            let next = at + abi::fuse_direntplus_size(d.dirent.namelen as usize);
            if d.entry_out.nodeid == 0 && name != b"." && name != b".." {
                let key = (parent, Box::<[u8]>::from(name));
                let found = names.get(&key).filter(|n| n.until > now).and_then(|n| {
                    let node = nodes.get_mut(&n.node)?;
                    let same_type = d.dirent.typ == 0 || d.dirent.typ == (node.attr.mode & libc::S_IFMT) >> 12;
                    (node.kept > 0 && node.attr_until > now && same_type).then_some((n, node))
                });
                if let Some((n, node)) = found {
                    node.kept -= 1;
                    *kept -= 1;
                    let (entry_valid, entry_valid_nsec) = split(n.until - now);
                    let (attr_valid, attr_valid_nsec) = split(node.attr_until - now);
                    let e = abi::fuse_entry_out {
                        nodeid: n.node,
                        generation: n.generation,
                        entry_valid,
                        attr_valid,
                        entry_valid_nsec,
                        attr_valid_nsec,
                        attr: node.attr,
                    };
                    reply[at..at + std::mem::size_of::<abi::fuse_entry_out>()].copy_from_slice(e.as_bytes());
                    filled += 1;
                }
            }
            if next > reply.len() {
                break;
            }
            at = next;
        }
        filled
    }

    /// Drops what `notice` says changed (through the rings, or the daemon
    /// said so).
    pub(super) fn invalidate(&self, notice: Notice<'_>, now: Instant) {
        if !self.enabled {
            return;
        }
        let mut g = lock(&self.inner);
        match notice {
            Notice::Inode(node) => {
                g.recent.note(notice, None, now);
                if let Some(t) = &self.table {
                    t.clear_attr(node);
                    // A directory's own invalidation: its entries too.
                    t.clear_listing(node);
                }
                if let Some(n) = g.nodes.get_mut(&node) {
                    n.attr_until = now;
                }
            }
            Notice::Entry { parent, name } => {
                let gone = g.names.remove(&(parent, Box::<[u8]>::from(name)));
                g.recent.note(notice, gone.as_ref().map(|n| n.node), now);
                if let Some(t) = &self.table {
                    // The directory's times and links changed with its name,
                    // and the node's links and ctime.
                    t.clear_name(parent, name);
                    t.clear_attr(parent);
                    t.clear_listing(parent);
                    if let Some(n) = gone {
                        t.clear_attr(n.node);
                    }
                }
            }
            Notice::All => {
                g.recent.note(notice, None, now);
                if let Some(t) = &self.table {
                    t.clear();
                }
                g.names.clear();
                for n in g.nodes.values_mut() {
                    n.attr_until = now;
                }
            }
        }
    }

    /// Drops the names timed out by `now` and the nodes none of whose names
    /// is fresh; returns the lookups kept of those nodes, to be forgotten.
    pub(super) fn expire(&self, now: Instant) -> Vec<abi::fuse_forget_one> {
        if !self.enabled {
            return Vec::new();
        }
        let mut g = lock(&self.inner);
        g.names.retain(|_, n| n.until > now);
        let mut forgets = Vec::new();
        let Inner { nodes, kept, .. } = &mut *g;
        nodes.retain(|&nodeid, n| {
            if n.named_until > now {
                return true;
            }
            if n.kept > 0 {
                *kept -= n.kept;
                forgets.push(abi::fuse_forget_one {
                    nodeid,
                    nlookup: n.kept,
                });
            }
            false
        });
        forgets
    }

    /// Whether anything is held here (names, or lookups to give back).
    pub(super) fn any(&self) -> bool {
        self.enabled && !lock(&self.inner).nodes.is_empty()
    }
}

impl Shared {
    /// Fills in the nodes of READDIRPLUS reply `reply` to `req` that this
    /// server can (see [`Entries::fill`]), before the program has it and
    /// before its books count them; learns the nodes the daemon gave, and
    /// gathers the listing to share (see `listings`).
    pub(super) fn fill_listing(&self, req: &[u8], reply: &mut [u8]) {
        match abi::parse_header(req) {
            Ok(h) if h.opcode == abi::FUSE_READDIRPLUS => {
                let now = Instant::now();
                self.entries.learn_listing(h.nodeid, reply, now);
                self.entries.fill(h.nodeid, reply, now);
                self.gather_listing(req, reply);
            }
            _ => {}
        }
    }

    /// Gives the daemon back the lookups kept of nodes whose names all
    /// timed out.
    fn give_back_expired(&self) {
        let Some(f) = &self.forward else {
            return;
        };
        let forgets = self.entries.expire(Instant::now());
        let (mut req, mut reply) = (Vec::new(), Vec::new());
        build_forgets(&mut req, 0, &forgets, |req| {
            f.forward(req, &mut reply);
        });
    }
}

/// Gives back, every [`EXPIRY`], the kept lookups whose names timed out,
/// until the server stops (or is dropped).
pub(super) fn expiry(shared: std::sync::Weak<Shared>) {
    loop {
        std::thread::sleep(EXPIRY);
        let Some(s) = shared.upgrade() else {
            return;
        };
        if s.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        if s.entries.any() {
            s.give_back_expired();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(node: u64, secs: u64, mode: u32) -> abi::fuse_entry_out {
        abi::fuse_entry_out {
            nodeid: node,
            generation: 1,
            entry_valid: secs,
            attr_valid: secs,
            entry_valid_nsec: 0,
            attr_valid_nsec: 0,
            attr: abi::fuse_attr {
                ino: node,
                mode,
                ..Default::default()
            },
        }
    }

    /// A READDIRPLUS reply listing `names` without nodes, as sshfs does.
    fn listing(names: &[(&[u8], u32)]) -> Vec<u8> {
        super::super::listings::tests::typed_reply(names, 0)
    }

    fn nodes_of(reply: &[u8]) -> Vec<u64> {
        abi::direntplus_entries(&reply[16..])
            .map(|(d, _)| d.entry_out.nodeid)
            .collect()
    }

    const FILE: u32 = libc::S_IFREG | 0o644;

    #[test]
    fn a_listing_gets_the_nodes_of_fresh_names_with_a_kept_lookup() {
        let e = Entries::new(true, false);
        let now = Instant::now();
        e.learn(1, b"a", &entry(7, 5, FILE), now);
        e.learn(1, b"b", &entry(8, 5, FILE), now);
        // Only a's lookup was left by a departed program.
        assert_eq!(e.keep(7, 2, now), 0);
        assert_eq!(e.keep(99, 3, now), 3);
        let mut reply = listing(&[(b".", 4), (b"a", 8), (b"b", 8), (b"c", 8)]);
        assert_eq!(e.fill(1, &mut reply, now + Duration::from_secs(1)), 1);
        assert_eq!(nodes_of(&reply), vec![0, 7, 0, 0]);
        let (d, _) = abi::direntplus_entries(&reply[16..]).nth(1).unwrap();
        assert_eq!(d.entry_out.entry_valid, 4, "the time left, not the whole timeout");
        assert_eq!(d.entry_out.attr.mode, FILE);
        // The second kept lookup, then none.
        let mut again = listing(&[(b"a", 8)]);
        assert_eq!(e.fill(1, &mut again, now), 1);
        let mut third = listing(&[(b"a", 8)]);
        assert_eq!(e.fill(1, &mut third, now), 0);
    }

    #[test]
    fn nothing_is_filled_in_past_a_timeout_a_change_or_for_another_type() {
        let e = Entries::new(true, false);
        let now = Instant::now();
        e.learn(1, b"a", &entry(7, 5, FILE), now);
        e.keep(7, 10, now);
        assert_eq!(e.fill(1, &mut listing(&[(b"a", 8)]), now + Duration::from_secs(6)), 0);
        assert_eq!(e.fill(1, &mut listing(&[(b"a", 4)]), now), 0, "listed as a directory");
        e.invalidate(Notice::Inode(7), now);
        assert_eq!(e.fill(1, &mut listing(&[(b"a", 8)]), now), 0);
        e.learn(1, b"a", &entry(7, 5, FILE), now);
        e.invalidate(Notice::Entry { parent: 1, name: b"a" }, now);
        assert_eq!(e.fill(1, &mut listing(&[(b"a", 8)]), now), 0);
    }

    #[test]
    fn what_is_learned_is_shared_until_a_change_takes_it_out() {
        let e = Entries::new(true, true);
        let v = name_table::NameView::map(e.table().unwrap()).unwrap();
        let now = Instant::now();
        let shared = |parent, name: &[u8]| v.name(parent, name).and_then(|f| Some((f.node, v.attr(f.node)?.mode)));
        e.learn(1, b"d", &entry(5, 60, libc::S_IFDIR | 0o755), now);
        e.learn(5, b"a", &entry(7, 60, FILE), now);
        e.learn(5, b"b", &entry(8, 60, FILE), now);
        assert_eq!(shared(5, b"a"), Some((7, FILE)));
        e.invalidate(Notice::Inode(7), now);
        assert_eq!(shared(5, b"a"), None, "the attributes changed");
        assert_eq!(v.name(5, b"a").map(|f| f.node), Some(7), "not the name");
        // A name's change takes out the name, the node's and the
        // directory's attributes, nothing else.
        e.invalidate(Notice::Entry { parent: 5, name: b"b" }, now);
        assert_eq!(
            (v.name(5, b"b"), v.attr(8).is_some(), v.attr(5).is_some()),
            (None, false, false)
        );
        assert_eq!(v.name(1, b"d").map(|f| f.node), Some(5));
        e.learn(5, b"a", &entry(7, 60, FILE), now);
        e.invalidate(Notice::All, now);
        assert_eq!((shared(5, b"a"), v.name(1, b"d")), (None, None));
        // A negative answer takes the name out too.
        let later = now + SETTLE;
        e.learn(5, b"a", &entry(7, 60, FILE), later);
        assert_eq!(shared(5, b"a"), Some((7, FILE)));
        e.learn(5, b"a", &entry(0, 60, 0), later);
        assert_eq!(v.name(5, b"a"), None);
    }

    #[test]
    fn an_answer_that_reaches_the_server_just_after_a_change_is_not_kept() {
        let e = Entries::new(true, true);
        let v = name_table::NameView::map(e.table().unwrap()).unwrap();
        let now = Instant::now();
        e.invalidate(Notice::Inode(7), now);
        e.invalidate(Notice::Entry { parent: 5, name: b"b" }, now);
        // Answers the daemon gave before those changes.
        e.learn(5, b"a", &entry(7, 60, FILE), now);
        e.learn(5, b"b", &entry(8, 60, FILE), now);
        e.learn(1, b"d", &entry(5, 60, libc::S_IFDIR | 0o755), now);
        assert_eq!((v.name(5, b"a"), v.name(5, b"b"), v.name(1, b"d")), (None, None, None));
        e.keep(7, 1, now);
        assert_eq!(e.fill(5, &mut listing(&[(b"a", 8)]), now), 0);
        // Once the change has settled, answers are kept again.
        let later = now + SETTLE;
        e.learn(5, b"a", &entry(7, 60, FILE), later);
        assert_eq!(v.name(5, b"a").map(|f| f.node), Some(7));
    }

    #[test]
    fn kept_lookups_are_given_back_once_their_names_time_out() {
        let e = Entries::new(true, false);
        let now = Instant::now();
        e.learn(1, b"a", &entry(7, 5, FILE), now);
        e.learn(2, b"a2", &entry(7, 9, FILE), now);
        e.keep(7, 3, now);
        assert!(e.expire(now + Duration::from_secs(6)).is_empty(), "a2 is still fresh");
        let gone = e.expire(now + Duration::from_secs(10));
        assert_eq!(
            gone.iter().map(|f| (f.nodeid, f.nlookup)).collect::<Vec<_>>(),
            vec![(7, 3)]
        );
        assert!(!e.any());
    }
}
