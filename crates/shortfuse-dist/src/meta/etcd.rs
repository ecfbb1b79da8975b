//! The metadata service on etcd: the operations of [`crate::meta::embedded::Meta`],
//! each one etcd transaction, so that many agents serve one name space.
//!
//! # Keys (under a prefix, `shortfuse/` by default)
//!
//! | key | value |
//! |---|---|
//! | `fs` | the file system's parameters: storage node id, block size |
//! | `next` | the next unreserved inode number (u64, big-endian) |
//! | `i/{ino:016x}` | a node: attributes and body (file, directory and its parent, symlink target) |
//! | `d/{dir:016x}/{name}` | a directory entry: inode number and type |
//! | `o/{ino:016x}` | marks an orphan (a file open somewhere that lost its last name) |
//! | `open/{ino:016x}/{holder}` | the file is open at `holder` (attached to the holder's etcd lease) |
//!
//! A directory's entries are one range read (readdir); an empty directory
//! is an empty range, which a transaction can compare (etcd compares every
//! key of a range, and an empty range as one absent key).
//!
//! # Transactions
//!
//! Every change reads what it needs at one revision (a snapshot), decides,
//! and commits with a compare on the `mod_revision` of every key it read
//! (0 for a key that was absent): if anything changed meanwhile the commit
//! fails and the change starts over. Changes are thus serializable, and
//! every read is linearizable, so a second agent sees a change as soon as
//! the first one answered it. Concurrent creates of one name: one commits,
//! the others see the entry on their retry and get `EEXIST`. A create
//! starts from its parent's record as this agent last saw it (the kernel
//! looked the new name up just before) instead of reading it again, so it
//! is one etcd request; the commit compares that record's revision as for
//! a read. A rename that
//! would move a directory below itself reads the new parent's ancestors,
//! so a concurrent rename of one of them fails its compare.
//!
//! Inode numbers: each agent reserves a batch from `next` (one transaction
//! per [`INO_BATCH`] creates), so creates on different agents do not
//! contend on one counter; numbers are never reused.
//!
//! # Open files and orphans
//!
//! Any key under `open/{ino:016x}/` means "open": a removal that takes a
//! file's last name keeps it as an orphan if, at the removal's snapshot,
//! there is one (and compares that the range is still non-empty), and frees
//! it otherwise (comparing that it is still empty); [`EtcdMeta::reap`]
//! frees an orphan only while the range is empty. So a close and a removal
//! racing on two agents can neither free an open file nor leak an orphan.
//! This agent publishes `open/{ino}/{agent lease:016x}` for the files its
//! clients hold open ([`EtcdMeta::open_file`]), attached to an etcd lease
//! it keeps alive: when the agent dies, its marks go with the lease, and
//! any agent's sweep ([`EtcdMeta::orphans`] then [`EtcdMeta::reap`]) frees
//! the orphans nobody holds any more. Orphans are ordinary nodes, so they
//! outlive an agent's restart.
//!
//! Durability: etcd answers a transaction once it is in the log of a
//! quorum, fsync'd, so [`EtcdMeta::sync`] has nothing left to do.

use shortfuse::sync::Unpoison;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, GetOptions, KvClient, PutOptions, Txn, TxnOp};
use serde::{Deserialize, Serialize};
use shortfuse::{Errno, Result};

use crate::meta::{apply_change, check_name, new_attr, Freed, ROOT_INO};
use crate::proto::{AttrChange, DirEntryInfo, Gfi, NewKind, NodeAttr, NodeInfo};

/// The key prefix of a file system when none is given.
pub const DEFAULT_PREFIX: &str = "shortfuse/";
/// Inode numbers an agent reserves at once.
pub const INO_BATCH: u64 = 256;
/// Attempts of one change before it gives up with `EIO` (each conflict
/// means another change committed: this many in a row is a livelock).
const ATTEMPTS: u32 = 200;
/// How long an etcd request may take before the operation fails with
/// `EIO` instead of hanging: a slow etcd delays operations, one that does
/// not answer for longer fails them. The lease manager waits as long (the
/// default lease TTL, see `crate::lease::etcd`, "A slow etcd").
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The parameters every agent of a file system shares; the first agent
/// writes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsParams {
    /// The storage node id in every [`Gfi`].
    pub node_id: u32,
    pub block_size: u32,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
enum Body {
    File,
    Dir { parent: u64 },
    Symlink(Vec<u8>),
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Rec {
    attr: NodeAttr,
    body: Body,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
struct Ent {
    ino: u64,
    /// `S_IFMT` bits, so that readdir needs no node reads.
    kind: u32,
}

fn enc<T: Serialize>(v: &T) -> Vec<u8> {
    // In-memory values of plain types: serializing cannot fail.
    bincode::serialize(v).unwrap_or_default()
}

fn dec<T: for<'de> Deserialize<'de>>(b: &[u8]) -> Result<T> {
    bincode::deserialize(b).map_err(|_| Errno::EIO)
}

/// The key layout (see the module doc).
#[derive(Clone)]
struct Keys {
    prefix: Vec<u8>,
}

impl Keys {
    fn key(&self, rest: &str) -> Vec<u8> {
        let mut k = self.prefix.clone();
        k.extend_from_slice(rest.as_bytes());
        k
    }
    fn fs(&self) -> Vec<u8> {
        self.key("fs")
    }
    fn next(&self) -> Vec<u8> {
        self.key("next")
    }
    fn inode(&self, ino: u64) -> Vec<u8> {
        self.key(&format!("i/{ino:016x}"))
    }
    fn inodes(&self) -> Vec<u8> {
        self.key("i/")
    }
    fn dir(&self, dir: u64) -> Vec<u8> {
        self.key(&format!("d/{dir:016x}/"))
    }
    fn entry(&self, dir: u64, name: &[u8]) -> Vec<u8> {
        let mut k = self.dir(dir);
        k.extend_from_slice(name);
        k
    }
    fn orphan(&self, ino: u64) -> Vec<u8> {
        self.key(&format!("o/{ino:016x}"))
    }
    fn orphans(&self) -> Vec<u8> {
        self.key("o/")
    }
    fn opens(&self, ino: u64) -> Vec<u8> {
        self.key(&format!("open/{ino:016x}/"))
    }
    fn open(&self, ino: u64, holder: i64) -> Vec<u8> {
        self.key(&format!("open/{ino:016x}/{holder:016x}"))
    }
}

/// What a create makes: a node of `kind` named `name` in `parent`.
pub struct Creation<'a> {
    pub parent: u64,
    pub name: &'a [u8],
    pub kind: NewKind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

/// Why one attempt of a change stopped.
enum Abort {
    /// The answer (an error the caller gets).
    Fail(Errno),
    /// What it read is gone (compacted): start over.
    Retry,
}

impl From<Errno> for Abort {
    fn from(e: Errno) -> Abort {
        Abort::Fail(e)
    }
}

type Step<T> = std::result::Result<T, Abort>;

fn etcd_err(e: etcd_client::Error) -> Abort {
    match &e {
        // A snapshot read below the compaction point: read again at the
        // newest revision.
        etcd_client::Error::GRpcStatus(s) if s.message().contains("compacted") => Abort::Retry,
        _ if gave_up(&e) => Abort::Retry,
        _ => Abort::Fail(Errno::EIO),
    }
}

/// Whether etcd gave up on a request it had queued: its own timeout (about
/// 7 s: 5 s and two election timeouts) ran out while it was slow or
/// stalled, or it had no leader. A read can simply be made again; a write
/// may or may not have been applied.
pub(crate) fn gave_up(e: &etcd_client::Error) -> bool {
    let etcd_client::Error::GRpcStatus(s) = e else {
        return false;
    };
    ["request timed out", "leader changed", "no leader", "too many requests"]
        .iter()
        .any(|m| s.message().contains(m))
}

/// Directory records as this agent last read or wrote them, with their
/// `mod_revision`: a create's first attempt starts from its parent's
/// instead of reading it (the kernel's LOOKUP of the new name read it just
/// before, and the agent's own last create in the directory wrote it), so a
/// create is one etcd request, not two. The commit compares that revision:
/// a record changed meanwhile (by another agent) costs a retry, never a
/// wrong answer.
#[derive(Default)]
struct Recent(Mutex<HashMap<Vec<u8>, Revised>>);

/// A value and the revision it was read or written at.
type Revised = (i64, Vec<u8>);

/// Records [`Recent`] keeps (a few hundred KiB); beyond, it starts over.
const RECENT_MAX: usize = 4096;

impl Recent {
    fn get(&self, key: &[u8]) -> Option<Revised> {
        self.0.lock().unpoison().get(key).cloned()
    }

    /// Keeps `key` as read or written at `rev` (`None`: gone), from now on
    /// with `keep`, otherwise only if it is kept already.
    fn note(&self, key: &[u8], rev: i64, value: Option<&[u8]>, keep: bool) {
        let mut m = self.0.lock().unpoison();
        match (value, m.get_mut(key)) {
            (None, _) => {
                m.remove(key);
            }
            (Some(v), Some(old)) => {
                if rev >= old.0 {
                    *old = (rev, v.to_vec());
                }
            }
            (Some(v), None) if keep => {
                if m.len() >= RECENT_MAX {
                    m.clear();
                }
                m.insert(key.to_vec(), (rev, v.to_vec()));
            }
            (Some(_), None) => {}
        }
    }
}

/// One attempt of a change: reads at one revision, remembers what it read,
/// buffers its writes, commits with compares on everything read.
struct Stm {
    kv: KvClient,
    recent: Arc<Recent>,
    rev: i64,
    /// Key -> mod_revision seen (0: absent).
    read: BTreeMap<Vec<u8>, i64>,
    /// The attempt's view: values read, then overwritten by its writes.
    view: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// Empty keys to put attached to an etcd lease (open marks).
    leased: Vec<(Vec<u8>, i64)>,
    compares: Vec<Compare>,
    /// Doing the change again after it was applied does no harm: a commit
    /// etcd gave up on (see [`gave_up`]) is tried again.
    idempotent: bool,
}

impl Stm {
    fn new(kv: KvClient, recent: Arc<Recent>) -> Stm {
        Stm {
            kv,
            recent,
            rev: 0,
            read: BTreeMap::new(),
            view: BTreeMap::new(),
            writes: BTreeMap::new(),
            leased: Vec::new(),
            compares: Vec::new(),
            idempotent: false,
        }
    }

    fn at(&self, opts: GetOptions) -> GetOptions {
        if self.rev > 0 {
            opts.with_revision(self.rev)
        } else {
            opts
        }
    }

    async fn get(&mut self, key: Vec<u8>) -> Step<Option<Vec<u8>>> {
        if let Some(v) = self.view.get(&key) {
            return Ok(v.clone());
        }
        let opts = self.at(GetOptions::new());
        let resp = self.kv.get(key.clone(), Some(opts)).await.map_err(etcd_err)?;
        if self.rev == 0 {
            self.rev = resp.header().map_or(0, |h| h.revision());
        }
        let kv = resp.kvs().first();
        self.read.insert(key.clone(), kv.map_or(0, |kv| kv.mod_revision()));
        self.recent.note(
            &key,
            kv.map_or(0, |kv| kv.mod_revision()),
            kv.map(|kv| kv.value()),
            false,
        );
        let v = kv.map(|kv| kv.value().to_vec());
        self.view.insert(key, v.clone());
        Ok(v)
    }

    /// Reads `keys` in one request (as [`Stm::get`] would one by one).
    async fn prefetch(&mut self, keys: Vec<Vec<u8>>) -> Step<()> {
        let keys: Vec<Vec<u8>> = keys.into_iter().filter(|k| !self.view.contains_key(k)).collect();
        let gets: Vec<TxnOp> = keys
            .iter()
            .map(|k| TxnOp::get(k.clone(), Some(self.at(GetOptions::new()))))
            .collect();
        let resp = self.kv.txn(Txn::new().and_then(gets)).await.map_err(etcd_err)?;
        if self.rev == 0 {
            self.rev = resp.header().map_or(0, |h| h.revision());
        }
        let answers = resp.op_responses();
        if answers.len() != keys.len() {
            return Err(Errno::EIO.into());
        }
        for (key, answer) in keys.into_iter().zip(answers) {
            let etcd_client::TxnOpResponse::Get(r) = answer else {
                return Err(Errno::EIO.into());
            };
            let kv = r.kvs().first();
            self.read.insert(key.clone(), kv.map_or(0, |kv| kv.mod_revision()));
            self.recent.note(
                &key,
                kv.map_or(0, |kv| kv.mod_revision()),
                kv.map(|kv| kv.value()),
                false,
            );
            self.view.insert(key, kv.map(|kv| kv.value().to_vec()));
        }
        Ok(())
    }

    /// Takes `key` as read at `rev` (0: absent) with `value`, without
    /// asking etcd: the commit compares that revision as for a read.
    fn assume(&mut self, key: Vec<u8>, rev: i64, value: Option<Vec<u8>>) {
        self.read.insert(key.clone(), rev);
        self.view.insert(key, value);
    }

    /// Keeps what this attempt read of `key` in [`Recent`].
    fn keep(&self, key: &[u8]) {
        if let (Some(&rev), Some(Some(v))) = (self.read.get(key), self.view.get(key)) {
            if rev > 0 && !self.writes.contains_key(key) {
                self.recent.note(key, rev, Some(v), true);
            }
        }
    }

    /// Whether any key starts with `prefix`; the commit then compares that
    /// this is still so.
    async fn any_under(&mut self, prefix: Vec<u8>) -> Step<bool> {
        let opts = self.at(GetOptions::new().with_prefix().with_count_only());
        let resp = self.kv.get(prefix.clone(), Some(opts)).await.map_err(etcd_err)?;
        if self.rev == 0 {
            self.rev = resp.header().map_or(0, |h| h.revision());
        }
        let any = resp.count() > 0;
        // Every key of the range is compared; an empty range compares as
        // one absent key (version 0).
        let op = if any { CompareOp::Greater } else { CompareOp::Equal };
        self.compares.push(Compare::version(prefix, op, 0).with_prefix());
        Ok(any)
    }

    /// Whether the entry `e` may go for a name that is (`dir`) or is not a
    /// directory: rmdir's and rename's rules (an empty directory for a
    /// directory, a non-directory for a non-directory).
    async fn may_replace(&mut self, keys: &Keys, e: &Ent, dir: bool) -> Step<()> {
        match (e.kind == libc::S_IFDIR, dir) {
            (true, true) if self.any_under(keys.dir(e.ino)).await? => Err(Errno::ENOTEMPTY.into()),
            (true, false) => Err(Errno::EISDIR.into()),
            (false, true) => Err(Errno::ENOTDIR.into()),
            _ => Ok(()),
        }
    }

    async fn rec(&mut self, keys: &Keys, ino: u64) -> Step<Rec> {
        match self.get(keys.inode(ino)).await? {
            Some(v) => Ok(dec(&v)?),
            None => Err(Errno::ENOENT.into()),
        }
    }

    async fn ent(&mut self, keys: &Keys, dir: u64, name: &[u8]) -> Step<Option<Ent>> {
        match self.get(keys.entry(dir, name)).await? {
            Some(v) => Ok(Some(dec(&v)?)),
            None => Ok(None),
        }
    }

    fn put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.view.insert(key.clone(), Some(value.clone()));
        self.writes.insert(key, Some(value));
    }

    fn delete(&mut self, key: Vec<u8>) {
        self.view.insert(key.clone(), None);
        self.writes.insert(key, None);
    }

    fn put_rec(&mut self, keys: &Keys, ino: u64, rec: &Rec) {
        self.put(keys.inode(ino), enc(rec));
    }

    /// Puts the empty `key` attached to etcd lease `lease`.
    fn put_leased(&mut self, key: Vec<u8>, lease: i64) {
        self.leased.push((key, lease));
    }

    /// Commits the writes if nothing read changed; `false`: try again.
    async fn commit(mut self) -> Step<bool> {
        if self.writes.is_empty() && self.leased.is_empty() {
            return Ok(true);
        }
        let mut when: Vec<Compare> = self
            .read
            .iter()
            .map(|(k, rev)| Compare::mod_revision(k.clone(), CompareOp::Equal, *rev))
            .collect();
        when.append(&mut self.compares);
        let writes = std::mem::take(&mut self.writes);
        let mut ops: Vec<TxnOp> = writes
            .iter()
            .map(|(k, v)| match v {
                Some(v) => TxnOp::put(k.clone(), v.clone(), None),
                None => TxnOp::delete(k.clone(), None),
            })
            .collect();
        for (k, lease) in self.leased.drain(..) {
            ops.push(TxnOp::put(k, Vec::new(), Some(PutOptions::new().with_lease(lease))));
        }
        let resp = match self.kv.txn(Txn::new().when(when).and_then(ops)).await {
            Ok(resp) => resp,
            Err(e) if gave_up(&e) && self.idempotent => return Err(Abort::Retry),
            // Applied or not: the caller cannot tell.
            Err(e) if gave_up(&e) => return Err(Abort::Fail(Errno::EIO)),
            Err(e) => return Err(etcd_err(e)),
        };
        if resp.succeeded() {
            // Every key the transaction wrote has its revision.
            let rev = resp.header().map_or(0, |h| h.revision());
            for (k, v) in &writes {
                self.recent.note(k, rev, v.as_deref(), false);
            }
        }
        Ok(resp.succeeded())
    }
}

/// A short, growing, jittered pause between attempts, so that agents that
/// conflicted do not meet again at once.
async fn backoff(attempt: u32) {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let cap = 200u64 << attempt.min(6);
    tokio::time::sleep(Duration::from_micros(u64::from(nanos) % cap)).await;
}

/// Runs `$body` (an expression over the attempt `$t` giving a `Step`)
/// until its commit succeeds, for at most [`REQUEST_TIMEOUT`] once it has
/// to try again.
macro_rules! transact {
    ($self:ident, $t:ident => $body:expr) => {{
        let mut attempt = 0u32;
        let started = tokio::time::Instant::now();
        loop {
            let mut $t = Stm::new($self.kv.clone(), $self.recent.clone());
            #[allow(clippy::redundant_closure_call)]
            let step = async { $body }.await;
            match step {
                Ok(v) => match $t.commit().await {
                    Ok(true) => break Ok(v),
                    Ok(false) | Err(Abort::Retry) => {}
                    Err(Abort::Fail(e)) => break Err(e),
                },
                Err(Abort::Retry) => {}
                Err(Abort::Fail(e)) => break Err(e),
            }
            attempt += 1;
            if attempt >= ATTEMPTS || started.elapsed() >= REQUEST_TIMEOUT {
                break Err(Errno::EIO);
            }
            backoff(attempt).await;
        }
    }};
}

/// Published open marks and the etcd lease they hang on.
struct Opens {
    lease: i64,
    published: HashSet<u64>,
    /// Marks being removed (a last close), not under the lock: an open of
    /// one of these files waits until the removal is done, then publishes
    /// again, so that the two cannot cross.
    closing: HashSet<u64>,
}

/// The metadata service of one agent over a shared etcd.
pub struct EtcdMeta {
    kv: KvClient,
    recent: Arc<Recent>,
    client: Client,
    keys: Keys,
    params: FsParams,
    /// Reserved inode numbers `[next, end)`.
    inos: Mutex<(u64, u64)>,
    /// Held across the etcd write that publishes a mark, so that a close
    /// and a new open of one file at this agent cannot cross. Not across
    /// the one that removes a mark ([`Opens::closing`]): a create (which
    /// takes it twice) would wait for the last file's close.
    opens: Arc<tokio::sync::Mutex<Opens>>,
    /// Told when a mark's removal is done.
    closed: tokio::sync::Notify,
    keeper: tokio::task::JoinHandle<()>,
}

impl Drop for EtcdMeta {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

/// Connects to etcd at `endpoints` with the request timeout the metadata
/// service uses.
pub async fn connect(endpoints: &[String]) -> io::Result<Client> {
    let opts = etcd_client::ConnectOptions::new()
        .with_timeout(REQUEST_TIMEOUT)
        .with_connect_timeout(REQUEST_TIMEOUT);
    Client::connect(endpoints, Some(opts))
        .await
        .map_err(|e| io::Error::other(format!("etcd {}: {e}", endpoints.join(","))))
}

fn io_err(what: &str, e: etcd_client::Error) -> io::Error {
    io::Error::other(format!("etcd: {what}: {e}"))
}

impl EtcdMeta {
    /// Opens the file system under `prefix` in etcd, creating it (root
    /// directory, `params`) if it is not there; an existing one keeps its
    /// own parameters ([`EtcdMeta::params`]). Open marks hang on an etcd
    /// lease of two `ttl`s that a background task (on the caller's runtime)
    /// keeps alive.
    pub async fn open(client: Client, prefix: &str, params: FsParams, ttl: Duration) -> io::Result<EtcdMeta> {
        let keys = Keys {
            prefix: prefix.as_bytes().to_vec(),
        };
        let mut kv = client.kv_client();
        let root = Rec {
            attr: new_attr(&NewKind::Dir, 0o755, 0, 0),
            body: Body::Dir { parent: ROOT_INO },
        };
        let init = Txn::new()
            .when([Compare::create_revision(keys.fs(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(keys.fs(), enc(&params), None),
                TxnOp::put(keys.inode(ROOT_INO), enc(&root), None),
                TxnOp::put(keys.next(), (ROOT_INO + 1).to_be_bytes().to_vec(), None),
            ]);
        kv.txn(init).await.map_err(|e| io_err("creating the file system", e))?;
        let got = kv.get(keys.fs(), None).await.map_err(|e| io_err("reading fs", e))?;
        let params: FsParams = got
            .kvs()
            .first()
            .and_then(|kv| bincode::deserialize(kv.value()).ok())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "etcd: unreadable file system parameters"))?;
        // Two TTLs: keep-alives every eighth of it leave the marks more
        // than a TTL to live, longer than a request waits for a slow etcd
        // (see `crate::lease::etcd`, "A slow etcd"), so an etcd that stalls
        // for less drops no mark (a removal would free an open file). A
        // dead agent's marks go two TTLs after it.
        let ttl_secs = (ttl.as_secs() * 2).max(2) as i64;
        let mut lc = client.lease_client();
        let lease = lc
            .grant(ttl_secs, None)
            .await
            .map_err(|e| io_err("granting the agent lease", e))?
            .id();
        let opens = Arc::new(tokio::sync::Mutex::new(Opens {
            lease,
            published: HashSet::new(),
            closing: HashSet::new(),
        }));
        let keeper = tokio::spawn(keep_alive(client.clone(), keys.clone(), opens.clone(), ttl_secs));
        Ok(EtcdMeta {
            kv,
            client,
            keys,
            params,
            recent: Arc::default(),
            inos: Mutex::new((0, 0)),
            opens,
            closed: tokio::sync::Notify::new(),
            keeper,
        })
    }

    pub fn params(&self) -> FsParams {
        self.params
    }

    pub fn node_id(&self) -> u32 {
        self.params.node_id
    }

    fn info(&self, ino: u64, attr: NodeAttr) -> NodeInfo {
        NodeInfo {
            gfi: Gfi {
                node: self.params.node_id,
                ino,
            },
            attr,
        }
    }

    /// Nothing to do: etcd made every answered change durable.
    pub fn sync(&self) -> Result<()> {
        Ok(())
    }

    async fn alloc_ino(&self) -> Result<u64> {
        {
            let mut r = self.inos.lock().unpoison();
            if r.0 < r.1 {
                r.0 += 1;
                return Ok(r.0 - 1);
            }
        }
        let keys = &self.keys;
        let first = transact!(self, t => {
            t.idempotent = true;
            let next = match t.get(keys.next()).await? {
                Some(v) => u64::from_be_bytes(v.try_into().map_err(|_| Errno::EIO)?),
                None => return Err(Errno::EIO.into()),
            };
            t.put(keys.next(), (next + INO_BATCH).to_be_bytes().to_vec());
            Ok::<_, Abort>(next)
        })?;
        let mut r = self.inos.lock().unpoison();
        // A concurrent refill may have won: either batch serves.
        *r = (first + 1, first + INO_BATCH);
        Ok(first)
    }

    pub async fn lookup(&self, parent: u64, name: &[u8]) -> Result<NodeInfo> {
        let keys = &self.keys;
        transact!(self, t => {
            // The parent too: a miss (the kernel's lookup before a create)
            // costs one request.
            t.prefetch(vec![keys.entry(parent, name), keys.inode(parent)]).await?;
            let e = t.ent(keys, parent, name).await?;
            let Some(e) = e else {
                // Most often the kernel's look before a create.
                t.keep(&keys.inode(parent));
                // ENOTDIR when the parent is not a directory.
                dir_of(&t.rec(keys, parent).await?)?;
                return Err(Errno::ENOENT.into());
            };
            Ok::<_, Abort>(self.info(e.ino, t.rec(keys, e.ino).await?.attr))
        })
    }

    pub async fn getattr(&self, ino: u64) -> Result<NodeInfo> {
        let keys = &self.keys;
        transact!(self, t => Ok::<_, Abort>(self.info(ino, t.rec(keys, ino).await?.attr)))
    }

    /// Applies `change`; returns the new attributes and the old size.
    pub async fn setattr(&self, ino: u64, change: &AttrChange) -> Result<(NodeInfo, u64)> {
        let keys = &self.keys;
        transact!(self, t => {
            // Not with a size: the old size it returns tells what data to cut.
            t.idempotent = change.size.is_none();
            let mut rec = t.rec(keys, ino).await?;
            let old_size = rec.attr.size;
            if change.size.is_some() {
                match rec.body {
                    Body::File => {}
                    Body::Dir { .. } => return Err(Errno::EISDIR.into()),
                    Body::Symlink(_) => return Err(Errno::EINVAL.into()),
                }
            }
            apply_change(&mut rec.attr, change);
            t.put_rec(keys, ino, &rec);
            Ok::<_, Abort>((self.info(ino, rec.attr), old_size))
        })
    }

    /// Records a write (after its blocks were stored): see
    /// [`crate::meta::embedded::Meta::extend`]. The size is compared in the
    /// transaction, so a concurrent extension by another agent is never
    /// undone.
    pub async fn extend(&self, ino: u64, min_size: u64, mtime: Option<(i64, u32)>) -> Result<NodeInfo> {
        let keys = &self.keys;
        transact!(self, t => {
            t.idempotent = true;
            let mut rec = t.rec(keys, ino).await?;
            if crate::meta::extend_attr(&mut rec.attr, min_size, mtime) {
                t.put_rec(keys, ino, &rec);
            }
            Ok::<_, Abort>(self.info(ino, rec.attr))
        })
    }

    pub async fn create(
        &self,
        parent: u64,
        name: &[u8],
        kind: NewKind,
        mode: u32,
        uid: u32,
        gid: u32,
    ) -> Result<NodeInfo> {
        self.create_new(Creation {
            parent,
            name,
            kind,
            mode,
            uid,
            gid,
        })
        .await
    }

    /// [`EtcdMeta::create`] of what the caller already holds as one.
    pub async fn create_new(&self, new: Creation<'_>) -> Result<NodeInfo> {
        check_name(new.name)?;
        let ino = self.alloc_ino().await?;
        self.create_node(ino, new, None).await
    }

    /// [`EtcdMeta::create`], open at this agent from the start: the mark
    /// is put by the creating transaction (no request of its own, and no
    /// removal can come between). `record(ino)` runs first: the opener's
    /// record at the lease manager, which [`EtcdMeta::reap`] asks (so a
    /// close of the new file by another client here keeps the mark); its
    /// caller undoes it if the creation fails.
    pub async fn create_open(&self, new: Creation<'_>, record: impl FnOnce(u64) -> Result<()>) -> Result<NodeInfo> {
        check_name(new.name)?;
        let ino = self.alloc_ino().await?;
        record(ino)?;
        let lease = self.opens.lock().await.lease;
        let info = self.create_node(ino, new, Some(lease)).await?;
        let mut opens = self.opens.lock().await;
        if opens.lease != lease {
            // The marks' lease was replaced meanwhile (etcd lost the old
            // one, and this mark with it, the keeper published the others
            // again): mark under the new one.
            let opts = PutOptions::new().with_lease(opens.lease);
            let key = self.keys.open(ino, opens.lease);
            self.kv
                .clone()
                .put(key, Vec::new(), Some(opts))
                .await
                .map_err(|_| Errno::EIO)?;
        }
        opens.published.insert(ino);
        Ok(info)
    }

    /// Creates node `ino`; with `mark`, open at this agent (see
    /// [`EtcdMeta::create_open`]) under that marks lease.
    async fn create_node(&self, ino: u64, new: Creation<'_>, mark: Option<i64>) -> Result<NodeInfo> {
        let Creation {
            parent,
            name,
            kind,
            mode,
            uid,
            gid,
        } = new;
        let attr = new_attr(&kind, mode, uid, gid);
        let body = match &kind {
            NewKind::Node { .. } => Body::File,
            NewKind::Dir => Body::Dir { parent },
            NewKind::Symlink { target } => Body::Symlink(target.clone()),
        };
        let keys = &self.keys;
        // The first attempt only (see `Recent`).
        let mut recent = self.recent.get(&keys.inode(parent));
        transact!(self, t => {
            match recent.take() {
                // The name was absent, or the commit's compare fails.
                Some((rev, p)) => {
                    t.assume(keys.inode(parent), rev, Some(p));
                    t.assume(keys.entry(parent, name), 0, None);
                }
                None => t.prefetch(vec![keys.inode(parent), keys.entry(parent, name)]).await?,
            }
            t.keep(&keys.inode(parent));
            t.idempotent = true;
            let mut p = t.rec(keys, parent).await?;
            dir_of(&p)?;
            let attr = crate::meta::in_dir(attr, &p.attr);
            let rec = Rec { attr, body: body.clone() };
            match t.ent(keys, parent, name).await? {
                // This very create, applied before etcd gave up on it.
                Some(e) if e.ino == ino => return Ok(self.info(ino, attr)),
                Some(_) => return Err(Errno::EEXIST.into()),
                None => {}
            }
            let ent = Ent { ino, kind: attr.mode & libc::S_IFMT };
            t.put(keys.entry(parent, name), enc(&ent));
            t.put_rec(keys, ino, &rec);
            if let Some(lease) = mark {
                t.put_leased(keys.open(ino, lease), lease);
            }
            touch(&mut p.attr, attr.ctime, i32::from(matches!(kind, NewKind::Dir)));
            t.put_rec(keys, parent, &p);
            Ok::<_, Abort>(self.info(ino, attr))
        })
    }

    /// Drops one link of `ino` in `t`: frees it at zero unless it is open
    /// somewhere (then it is an orphan).
    async fn unlink_node(&self, t: &mut Stm, ino: u64, now: (i64, u32), freed: &mut Freed) -> Step<()> {
        let keys = &self.keys;
        let mut rec = t.rec(keys, ino).await?;
        if let Body::Dir { .. } = rec.body {
            t.delete(keys.inode(ino));
            freed.0.push(ino);
            return Ok(());
        }
        rec.attr.nlink = rec.attr.nlink.saturating_sub(1);
        rec.attr.ctime = now;
        if rec.attr.nlink == 0 && !t.any_under(keys.opens(ino)).await? {
            t.delete(keys.inode(ino));
            freed.0.push(ino);
        } else {
            if rec.attr.nlink == 0 {
                t.put(keys.orphan(ino), Vec::new());
            }
            t.put_rec(keys, ino, &rec);
        }
        Ok(())
    }

    /// Removes a name (`rmdir` when `dir`). A file that loses its last name
    /// while open at any agent stays as an orphan.
    pub async fn remove(&self, parent: u64, name: &[u8], dir: bool) -> Result<Freed> {
        let keys = &self.keys;
        transact!(self, t => {
            t.prefetch(vec![keys.entry(parent, name), keys.inode(parent)]).await?;
            let Some(e) = t.ent(keys, parent, name).await? else {
                dir_of(&t.rec(keys, parent).await?)?;
                return Err(Errno::ENOENT.into());
            };
            let is_dir = e.kind == libc::S_IFDIR;
            t.may_replace(keys, &e, dir).await?;
            let now = crate::meta::now();
            let mut p = t.rec(keys, parent).await?;
            touch(&mut p.attr, now, -i32::from(is_dir));
            t.put_rec(keys, parent, &p);
            t.delete(keys.entry(parent, name));
            let mut freed = Freed::default();
            self.unlink_node(&mut t, e.ino, now, &mut freed).await?;
            Ok::<_, Abort>(freed)
        })
    }

    /// Is `ino` `ancestor` or below it? Reads the chain of parents (so
    /// the commit compares them).
    async fn is_below(&self, t: &mut Stm, mut ino: u64, ancestor: u64) -> Step<bool> {
        loop {
            if ino == ancestor {
                return Ok(true);
            }
            match t.rec(&self.keys, ino).await?.body {
                Body::Dir { parent } if parent != ino => ino = parent,
                _ => return Ok(false),
            }
        }
    }

    /// Renames (flags: `RENAME_NOREPLACE`, `RENAME_EXCHANGE`); a replaced
    /// file open at any agent stays as an orphan.
    pub async fn rename(
        &self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        flags: u32,
    ) -> Result<Freed> {
        check_name(new_name)?;
        if flags & !(libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE) != 0 {
            return Err(Errno::EINVAL);
        }
        let keys = &self.keys;
        transact!(self, t => {
            let Some(src) = t.ent(keys, parent, name).await? else {
                dir_of(&t.rec(keys, parent).await?)?;
                return Err(Errno::ENOENT.into());
            };
            dir_of(&t.rec(keys, new_parent).await?)?;
            let dst = t.ent(keys, new_parent, new_name).await?;
            if flags & libc::RENAME_NOREPLACE != 0 && dst.is_some() {
                return Err(Errno::EEXIST.into());
            }
            let src_dir = src.kind == libc::S_IFDIR;
            if src_dir && self.is_below(&mut t, new_parent, src.ino).await? {
                return Err(Errno::EINVAL.into());
            }
            let now = crate::meta::now();
            let mut freed = Freed::default();
            if flags & libc::RENAME_EXCHANGE != 0 {
                let dst = dst.ok_or(Errno::ENOENT)?;
                let dst_dir = dst.kind == libc::S_IFDIR;
                if dst_dir && self.is_below(&mut t, parent, dst.ino).await? {
                    return Err(Errno::EINVAL.into());
                }
                t.put(keys.entry(parent, name), enc(&dst));
                t.put(keys.entry(new_parent, new_name), enc(&src));
                for (ino, p) in [(src.ino, new_parent), (dst.ino, parent)] {
                    let mut rec = t.rec(keys, ino).await?;
                    if let Body::Dir { parent } = &mut rec.body {
                        *parent = p;
                    }
                    rec.attr.ctime = now;
                    t.put_rec(keys, ino, &rec);
                }
                let (sd, dd) = (i32::from(src_dir), i32::from(dst_dir));
                self.touch_dir(&mut t, parent, now, dd - sd).await?;
                self.touch_dir(&mut t, new_parent, now, sd - dd).await?;
                return Ok(freed);
            }
            if dst.is_some_and(|d| d.ino == src.ino) {
                return Ok(freed);
            }
            let mut replaced_dir = false;
            if let Some(d) = dst {
                replaced_dir = d.kind == libc::S_IFDIR;
                t.may_replace(keys, &d, src_dir).await?;
                self.unlink_node(&mut t, d.ino, now, &mut freed).await?;
            }
            t.delete(keys.entry(parent, name));
            t.put(keys.entry(new_parent, new_name), enc(&src));
            let mut rec = t.rec(keys, src.ino).await?;
            if let Body::Dir { parent } = &mut rec.body {
                *parent = new_parent;
            }
            rec.attr.ctime = now;
            t.put_rec(keys, src.ino, &rec);
            let sd = i32::from(src_dir);
            self.touch_dir(&mut t, parent, now, -sd).await?;
            self.touch_dir(&mut t, new_parent, now, sd - i32::from(replaced_dir)).await?;
            Ok::<_, Abort>(freed)
        })
    }

    async fn touch_dir(&self, t: &mut Stm, dir: u64, now: (i64, u32), nlink_delta: i32) -> Step<()> {
        let mut rec = t.rec(&self.keys, dir).await?;
        touch(&mut rec.attr, now, nlink_delta);
        t.put_rec(&self.keys, dir, &rec);
        Ok(())
    }

    pub async fn link(&self, ino: u64, new_parent: u64, new_name: &[u8]) -> Result<NodeInfo> {
        check_name(new_name)?;
        let keys = &self.keys;
        transact!(self, t => {
            let mut rec = t.rec(keys, ino).await?;
            if let Body::Dir { .. } = rec.body {
                return Err(Errno::EPERM.into());
            }
            // An orphan gets no name back (linkat(2) of an unlinked file
            // fails so, O_TMPFILE aside).
            if rec.attr.nlink == 0 {
                return Err(Errno::ENOENT.into());
            }
            dir_of(&t.rec(keys, new_parent).await?)?;
            if t.ent(keys, new_parent, new_name).await?.is_some() {
                return Err(Errno::EEXIST.into());
            }
            let now = crate::meta::now();
            let ent = Ent { ino, kind: rec.attr.mode & libc::S_IFMT };
            t.put(keys.entry(new_parent, new_name), enc(&ent));
            rec.attr.nlink += 1;
            rec.attr.ctime = now;
            t.put_rec(keys, ino, &rec);
            self.touch_dir(&mut t, new_parent, now, 0).await?;
            Ok::<_, Abort>(self.info(ino, rec.attr))
        })
    }

    pub async fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        let keys = &self.keys;
        transact!(self, t => match t.rec(keys, ino).await?.body {
            Body::Symlink(target) => Ok(target),
            _ => Err(Abort::Fail(Errno::EINVAL)),
        })
    }

    /// Every entry of directory `ino`, "." and ".." first (one range read).
    pub async fn readdir(&self, ino: u64) -> Result<Vec<DirEntryInfo>> {
        let keys = &self.keys;
        transact!(self, t => {
            let parent = dir_of(&t.rec(keys, ino).await?)?;
            let prefix = keys.dir(ino);
            let opts = t.at(GetOptions::new().with_prefix());
            let resp = t.kv.get(prefix.clone(), Some(opts)).await.map_err(etcd_err)?;
            let mut out = vec![
                DirEntryInfo { name: b".".to_vec(), ino, kind: libc::S_IFDIR },
                DirEntryInfo { name: b"..".to_vec(), ino: parent, kind: libc::S_IFDIR },
            ];
            for kv in resp.kvs() {
                let e: Ent = dec(kv.value())?;
                out.push(DirEntryInfo { name: kv.key()[prefix.len()..].to_vec(), ino: e.ino, kind: e.kind });
            }
            Ok::<_, Abort>(out)
        })
    }

    /// Number of inodes.
    pub async fn count(&self) -> Result<u64> {
        let opts = GetOptions::new().with_prefix().with_count_only();
        let resp = self
            .kv
            .clone()
            .get(self.keys.inodes(), Some(opts))
            .await
            .map_err(|_| Errno::EIO)?;
        Ok(resp.count().max(0) as u64)
    }

    /// Every orphan (files kept with no name), of every agent.
    pub async fn orphans(&self) -> Result<Vec<u64>> {
        let prefix = self.keys.orphans();
        let opts = GetOptions::new().with_prefix().with_keys_only();
        let resp = self
            .kv
            .clone()
            .get(prefix.clone(), Some(opts))
            .await
            .map_err(|_| Errno::EIO)?;
        let mut v = Vec::new();
        for kv in resp.kvs() {
            let hex = std::str::from_utf8(&kv.key()[prefix.len()..]).map_err(|_| Errno::EIO)?;
            v.push(u64::from_str_radix(hex, 16).map_err(|_| Errno::EIO)?);
        }
        Ok(v)
    }

    /// Marks `ino` open at this agent (before its opener is answered: a
    /// removal at any agent from then on keeps it as an orphan); `ENOENT`
    /// when it is gone. One transaction: the mark is put only if the node
    /// is there.
    pub async fn open_file(&self, ino: u64) -> Result<()> {
        let mut opens = loop {
            // Before looking: a removal done meanwhile wakes it.
            let done = self.closed.notified();
            let opens = self.opens.lock().await;
            if !opens.closing.contains(&ino) {
                break opens;
            }
            drop(opens);
            done.await;
        };
        // Marked here: it cannot have been freed.
        if opens.published.contains(&ino) {
            return Ok(());
        }
        let opts = PutOptions::new().with_lease(opens.lease);
        let txn = Txn::new()
            .when([Compare::version(self.keys.inode(ino), CompareOp::Greater, 0)])
            .and_then([TxnOp::put(self.keys.open(ino, opens.lease), Vec::new(), Some(opts))]);
        let resp = self.kv.clone().txn(txn).await.map_err(|_| Errno::EIO)?;
        if !resp.succeeded() {
            return Err(Errno::ENOENT);
        }
        opens.published.insert(ino);
        Ok(())
    }

    /// Unless `is_open()` (this agent's clients, asked under the marks'
    /// lock), drops this agent's open mark of `ino`, then frees `ino` if it
    /// is an orphan nobody holds open anywhere. Returns whether it did: the
    /// caller removes the data.
    pub async fn reap(&self, ino: u64, is_open: impl FnOnce() -> bool) -> Result<bool> {
        let keys = &self.keys;
        let lease = {
            let mut opens = self.opens.lock().await;
            if is_open() {
                return Ok(false);
            }
            match opens.published.remove(&ino) {
                true => {
                    opens.closing.insert(ino);
                    Some(opens.lease)
                }
                false => None,
            }
        };
        if let Some(lease) = lease {
            // The mark goes either way; whether `ino` is an orphan (a file
            // that lost its last name while open has the orphan key) comes
            // with it, so a plain close costs one request.
            let mark = || TxnOp::delete(keys.open(ino, lease), None);
            let txn = Txn::new()
                .when([Compare::version(keys.orphan(ino), CompareOp::Equal, 0)])
                .and_then([mark()])
                .or_else([mark()]);
            let resp = self.kv.clone().txn(txn).await;
            {
                let mut opens = self.opens.lock().await;
                opens.closing.remove(&ino);
                if resp.is_err() {
                    // Maybe still there: the next close removes it.
                    opens.published.insert(ino);
                }
            }
            self.closed.notify_waiters();
            if resp.map_err(|_| Errno::EIO)?.succeeded() {
                return Ok(false);
            }
        }
        transact!(self, t => {
            t.idempotent = true;
            let rec = match t.get(keys.inode(ino)).await? {
                Some(v) => dec::<Rec>(&v)?,
                None => return Ok(false),
            };
            if rec.attr.nlink != 0 || matches!(rec.body, Body::Dir { .. }) || t.any_under(keys.opens(ino)).await? {
                return Ok(false);
            }
            t.delete(keys.inode(ino));
            t.delete(keys.orphan(ino));
            Ok::<_, Abort>(true)
        })
    }

    /// The etcd client (shared with the other services of the agent).
    pub fn client(&self) -> &Client {
        &self.client
    }
}

/// A directory's parent, or `ENOTDIR`.
fn dir_of(rec: &Rec) -> Result<u64> {
    match rec.body {
        Body::Dir { parent } => Ok(parent),
        _ => Err(Errno::ENOTDIR),
    }
}

fn touch(attr: &mut NodeAttr, now: (i64, u32), nlink_delta: i32) {
    attr.mtime = now;
    attr.ctime = now;
    attr.nlink = attr.nlink.saturating_add_signed(nlink_delta);
}

/// Keeps the agent lease alive; if it was lost (etcd unreachable longer
/// than its TTL), takes a new one and publishes the open marks again.
async fn keep_alive(client: Client, keys: Keys, opens: Arc<tokio::sync::Mutex<Opens>>, ttl_secs: i64) {
    let every = Duration::from_millis(ttl_secs as u64 * 1000 / 8);
    let mut lc = client.lease_client();
    let mut kv = client.kv_client();
    loop {
        tokio::time::sleep(every).await;
        let lease = opens.lock().await.lease;
        match lc.keep_alive(lease).await {
            Ok(_) => continue,
            // Expired: etcd dropped the marks with it.
            Err(etcd_client::Error::LeaseKeepAliveError(_)) => {}
            // etcd unreachable: try again next round.
            Err(_) => continue,
        }
        let Ok(granted) = lc.grant(ttl_secs, None).await else {
            continue;
        };
        let mut o = opens.lock().await;
        o.lease = granted.id();
        let marks: Vec<u64> = o.published.iter().copied().collect();
        for ino in marks {
            let opts = PutOptions::new().with_lease(o.lease);
            if kv.put(keys.open(ino, o.lease), Vec::new(), Some(opts)).await.is_err() {
                // Not published after all: the next open publishes again.
                o.published.remove(&ino);
            }
        }
    }
}
