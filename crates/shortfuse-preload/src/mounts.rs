//! The mounts named by `SHORTFUSE_MOUNTS` (format:
//! [`shortfuse_vfs::spec`]), each a file system built in process behind a
//! [`Vfs`], and the current directory handed over by the image that exec'd
//! us (`SHORTFUSE_CWD`, see [`crate::calls`]).
#![allow(unsafe_code)]

use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use shortfuse::cache::CacheMode;
use shortfuse::mount::MountInfo;
use shortfuse::Stats;
use shortfuse_fs::registry::{FsKind, Host, LOCAL};
use shortfuse_vfs::spec::{parse_mounts, MountSpec};
use shortfuse_vfs::{
    Creds, FdTable, InProcess, Location, MapTap, Namespace, PageCache, Vfs, Walk, WalkFlags, MCACHE_NODES,
};

use crate::{sys, State};

/// `SHORTFUSE_MAPS=off`: the file systems' data maps are not used (nor
/// when a mount's page cache is on).
pub const MAPS_VAR: &str = "SHORTFUSE_MAPS";

/// `SHORTFUSE_NAMES=off`: the file systems' namespace maps are not used
/// (every path call walks the mount; for measuring what the maps are worth).
pub const NAMES_VAR: &str = "SHORTFUSE_NAMES";

/// The environment variable naming the current directory inside a mount
/// when the exec'ing image was in one.
pub const CWD_VAR: &str = "SHORTFUSE_CWD";

/// Set (to 1) by the shim of an image that execs with no descriptor of a
/// mount open across the exec: the new image skips the look at every
/// descriptor it has (/proc/self/fd, a readlink each) that adopting them
/// takes. Without it (the first image of `shortfuse run`, an exec from a
/// spawn's child) the image looks, as it always may.
pub const NOTHING_INHERITED_VAR: &str = "SHORTFUSE_NOTHING_INHERITED";
pub const NOTHING_INHERITED: &std::ffi::CStr = c"SHORTFUSE_NOTHING_INHERITED=1";

/// The file systems this build of the shim links beyond [`LOCAL`]: none in
/// the shim every process under `run` loads, sftp in the one `run` loads
/// for an sftp mount (naming it links its SSH stack, which every process
/// would relocate at start-up).
#[cfg(feature = "sftp")]
const LINKED: &[&FsKind] = &[&shortfuse_fs::registry::SFTP];
#[cfg(not(feature = "sftp"))]
const LINKED: &[&FsKind] = &[];

/// The file systems this shim can build in process.
fn served() -> impl Iterator<Item = &'static FsKind> {
    LOCAL.iter().chain(LINKED.iter().copied()).filter(|k| k.in_process)
}

/// The file system a spec names, when the shim builds it in process.
fn in_process_kind(spec: &MountSpec) -> Result<&'static FsKind, String> {
    served().find(|k| k.name == spec.fs).ok_or_else(|| {
        let known: Vec<&str> = served().map(|k| k.name).collect();
        format!(
            "file system {:?} is not served in process by this shim (these are: {}; `shortfuse run` loads the shim that serves its mounts)",
            spec.fs,
            known.join(", ")
        )
    })
}

/// Whether the daemon serving `mp` (normalised) keeps its files on another
/// machine, as its kernel mount tells (see [`is_remote`]). A daemon
/// without a kernel mount says nothing: not remote.
fn daemon_is_remote(mp: &[u8]) -> bool {
    let mp = Path::new(std::ffi::OsStr::from_bytes(mp));
    shortfuse::mount::fuse_mount_at(mp).is_ok_and(|m| m.as_ref().is_some_and(is_remote))
}

/// Whether the files of a FUSE mount live on another machine: a source of
/// the `host:path` form (sshfs's `me@host:/srv`, rclone's `remote:path`;
/// the rule coreutils' `df -l` goes by), or a file system known to keep
/// its files behind a network whatever its source says. Every read it
/// serves is then a round trip.
fn is_remote(m: &MountInfo) -> bool {
    const NETWORK_FUSE: &[&str] = &[
        "sshfs",
        "rclone",
        "s3fs",
        "gcsfuse",
        "mountpoint-s3",
        "goofys",
        "curlftpfs",
        "blobfuse2",
    ];
    let subtype = m.fstype.strip_prefix("fuse.").unwrap_or("");
    m.source.contains(':') || NETWORK_FUSE.contains(&subtype)
}

/// Builds one mount; `i` numbers it for its device number.
fn build_one(spec: &MountSpec, i: usize, creds: Creds, umask: u32) -> Result<Vfs, String> {
    let mut run = spec.run_options()?;
    // A device number no disk uses: major 0 is for anonymous devices.
    let dev = 0xf5_0000 + i as u64;
    if spec.is_daemon() {
        let mp = shortfuse_vfs::normalize(spec.mountpoint.as_bytes());
        // A daemon mirroring a host directory we can reach: the kernel's
        // view of the mount where a kernel path is needed (watches, sockets,
        // the programs and libraries the dynamic loader opens, the kernel's
        // current directory), as for passthrough in process.
        let (ring, source, names) = match told(&mp) {
            // What the exec'ing image (or `run`) was told: the connection
            // waits for the first need (see `shortfuse_vfs::Ring::lazy`).
            Some(told) => {
                let source = told.source_here().map(<[u8]>::to_vec);
                let names = source.as_ref().and_then(|_| told.namespace_map(creds.uid));
                let set_up = shortfuse_ring::Told {
                    source: told.source.filter(|_| source.is_some()),
                    names: told.names.filter(|_| names.is_some()),
                };
                let ring = shortfuse_vfs::Ring::lazy(&mp, set_up, crate::calls::spawn::may_connect);
                (ring, source, names)
            }
            None => {
                let early = Vfs::opening_requests(true, creds);
                let ring = shortfuse_vfs::Ring::connect_with(&mp, &early)
                    .map_err(|e| format!("mount {}: {e}", spec.mountpoint))?;
                let client = ring.client();
                let source = client.and_then(|c| c.source()).map(<[u8]>::to_vec);
                let names = ring.namespace_map();
                (ring, source, names)
            }
        };
        // A daemon mirroring a directory of this machine is local: only
        // another's kernel mount is worth reading the mount table for (a
        // read every image under the mount would pay at start-up).
        let mirrors = source.is_some();
        let vfs = Vfs::new(Box::new(ring), &mp, dev, creds).map_err(|e| format!("mount {}: {e}", spec.mountpoint))?;
        vfs.client().set_caller(crate::creds::current);
        vfs.set_umask(umask);
        vfs.set_read_only(run.ro);
        if let Some(src) = source {
            vfs.set_source(&src);
        }
        // The program's own page cache in front of the daemon, when asked
        // (`cache=on`) or, by default (`auto`), when the daemon's kernel
        // mount says its files are remote (sshfs): its data is then read
        // from memory here, kept across opens while the file's size and
        // mtime stay (close-to-open), fetched ahead in requests as large as
        // the rings carry. A local daemon (bindfs) is left without: the
        // kernel page cache already holds what it reads.
        let remote = run.cache.mode == CacheMode::Auto && !mirrors && daemon_is_remote(&mp);
        let cache = if run.cache.enabled(remote) {
            Some(PageCache::new(run.cache.config()?).map_err(|e| format!("mount {}: {e}", spec.mountpoint))?)
        } else {
            None
        };
        // With the page cache on, attributes are the cache's to answer.
        if let Some(cache) = cache {
            vfs.set_page_cache(cache);
        } else if std::env::var_os(NAMES_VAR).is_none_or(|v| v != "off") {
            if let Some((map, uid)) = names {
                vfs.set_namespace(Namespace::new(map, run.mount_options().entry_timeout, Some(uid)));
            }
        }
        return Ok(vfs);
    }
    let kind = in_process_kind(spec)?;
    // The passthrough holds inode descriptors up to half of RLIMIT_NOFILE.
    // In process the limit is the program's (built in process, the file
    // system leaves it as it is): the inode descriptors keep to a quarter.
    if kind.mirror {
        // Every process image caches names and attributes of its own, and
        // other processes of the program change the source behind it (make
        // checks the object a compiler process just wrote, and a name it
        // found missing before): without notifications, attributes and
        // negative entries are not cached (the file system answers from the
        // source, one fstat or lookup). Positive entries keep the default:
        // a name replaced by another process is seen after entry_timeout.
        // `-o attr_timeout=...` etc. still choose otherwise.
        for t in [&mut run.attr_timeout, &mut run.negative_timeout] {
            t.get_or_insert(std::time::Duration::ZERO);
        }
    }
    if kind.mirror && !run.fs.iter().any(|(k, _)| k == "path_fds") {
        let quarter = nofile().map_or(256, |l| (l[0] / 4).max(16));
        run.fs.push(("path_fds".into(), Some(quarter.to_string())));
    }
    let fs = kind
        .build(spec.source.as_deref().map(Path::new), &run.fs, Host::InProcess)
        .map_err(|e| e.to_string());
    // The maps the file system returns reach the VFS (DataMap fast path,
    // M-Cache, kernel-backed descriptors), unless SHORTFUSE_MAPS=off asks
    // for every read and write to go to the file system (to measure what
    // the maps are worth; fork, exec, locks and shared maps then fall back
    // to what placeholders can do).
    let fs = fs?;
    // A tree that is an image of a backing directory (passthrough): path
    // calls that only read go to the kernel beneath it (see `nsmap`), and
    // directories resolved there are kept as long as names are.
    let names = fs.namespace_map();
    // With the page cache on, the data must pass through it: the mount
    // gives up its maps (the Prefuse-SSHFS caching thesis: over local backing files that only
    // doubles the kernel's caching, which is why `auto` leaves it off).
    let cache = if run.cache.enabled(kind.network) {
        Some(PageCache::new(run.cache.config()?).map_err(|e| format!("mount {}: {e}", spec.mountpoint))?)
    } else {
        None
    };
    let (fs, maps) = if cache.is_some() || std::env::var_os(MAPS_VAR).is_some_and(|v| v == "off") {
        (fs, None)
    } else {
        let (fs, maps) = MapTap::wrap(fs, MCACHE_NODES);
        (fs, Some(maps))
    };
    let opts = run.mount_options();
    // With the page cache on, attributes are the cache's to answer.
    let names = names
        .filter(|_| cache.is_none() && std::env::var_os(NAMES_VAR).is_none_or(|v| v != "off"))
        .map(|map| Namespace::new(map, opts.entry_timeout, None));
    let backend = InProcess::new(fs, opts, Arc::new(Stats::untimed()));
    let mp = shortfuse_vfs::normalize(spec.mountpoint.as_bytes());
    let vfs = Vfs::new(Box::new(backend), &mp, dev, creds).map_err(|e| format!("mount {}: {e}", spec.mountpoint))?;
    vfs.client().set_caller(crate::creds::current);
    if let Some(maps) = maps {
        vfs.set_maps(maps);
    }
    if let Some(cache) = cache {
        vfs.set_page_cache(cache);
    }
    if let Some(names) = names {
        vfs.set_namespace(names);
    }
    vfs.set_umask(umask);
    vfs.set_read_only(run.ro);
    if kind.mirror {
        if let Some(src) = &spec.source {
            let abs = std::fs::canonicalize(src).map_err(|e| format!("passthrough {src}: {e}"))?;
            vfs.set_source(abs.as_os_str().as_encoded_bytes());
        }
    }
    Ok(vfs)
}

/// What a daemon's welcome told about mount point `mp` (normalised), as
/// handed down in [`shortfuse_ring::TOLD_VAR`].
fn told(mp: &[u8]) -> Option<shortfuse_ring::Told> {
    let all = std::env::var(shortfuse_ring::TOLD_VAR).ok()?;
    shortfuse_ring::told_for(&all, mp)
}

/// RLIMIT_NOFILE (soft, hard).
fn nofile() -> Option<[u64; 2]> {
    let mut l = [0u64; 2];
    // SAFETY: a pair of rlimits of ours.
    let r = unsafe {
        sys::raw(
            libc::SYS_prlimit64,
            0,
            i64::from(libc::RLIMIT_NOFILE as i32),
            0,
            l.as_mut_ptr() as i64,
            0,
            0,
        )
    };
    (r == 0).then_some(l)
}

pub(crate) fn build(spec: &str) -> Result<State, String> {
    let creds = Creds {
        // SAFETY: no memory is passed.
        uid: unsafe { sys::raw(libc::SYS_geteuid, 0, 0, 0, 0, 0, 0) } as u32,
        // SAFETY: no memory is passed.
        gid: unsafe { sys::raw(libc::SYS_getegid, 0, 0, 0, 0, 0, 0) } as u32,
        pid: sys::process::getpid() as u32,
    };
    // SAFETY: no memory is passed.
    let umask = unsafe { sys::raw(libc::SYS_umask, 0o022, 0, 0, 0, 0, 0) };
    // SAFETY: no memory is passed.
    unsafe { sys::raw(libc::SYS_umask, umask, 0, 0, 0, 0, 0) };
    let specs = parse_mounts(spec)?;
    // A file system may open descriptors while it is built, before the
    // hook can move them out of the program's way (`calls::nested`): keep
    // the low numbers taken meanwhile. Those that keep the low numbers free
    // themselves (mem and null open none, passthrough places its own above
    // them, and so does a daemon's ring connection, told here) are spared
    // the fence's calls, and the kernel's growing and shrinking of the
    // descriptor table (a good part of what a short process pays for the
    // shim).
    shortfuse_ring::keep_descriptors_from(crate::calls::OWN_FD_FLOOR as i32);
    let fence = specs
        .iter()
        .any(|m| !m.is_daemon() && in_process_kind(m).ok().is_none_or(|k| !k.low_fds_free))
        .then(Fence::low_numbers);
    let mut mounts = Vec::new();
    for (i, m) in specs.iter().enumerate() {
        mounts.push(Arc::new(build_one(m, i, creds, umask as u32)?));
    }
    drop(fence);
    let host = std::env::current_dir()
        .map(|p| p.as_os_str().as_encoded_bytes().to_vec())
        .unwrap_or_else(|_| b"/".to_vec());
    let cwd = std::env::var_os(CWD_VAR).and_then(|c| inherited_cwd(&mounts, c.as_encoded_bytes()));
    let fds = FdTable::new();
    // Read and forgotten: the program's own execs must not pass it on
    // (the shim's set it anew, `calls::exec`).
    let inherits = std::env::var_os(NOTHING_INHERITED_VAR).is_none();
    std::env::remove_var(NOTHING_INHERITED_VAR);
    // Only a daemon's files have descriptions to adopt, and only a mount
    // with a backing directory backing files: spare the others the look at
    // every descriptor, and make it once for both.
    let shared = mounts.iter().any(|m| m.client().shared());
    let backed = mounts.iter().any(|m| m.source().is_some());
    if inherits && (shared || backed) {
        let inherited = descriptor_links();
        if shared {
            crate::calls::shared::adopt(&mounts, &fds, &inherited);
        }
        if backed {
            crate::calls::kernel::adopt(&mounts, &fds, &inherited);
        }
    }
    Ok(State {
        mounts,
        fds,
        cwd: Mutex::new(cwd),
        host_cwd: Mutex::new(host),
    })
}

/// Every descriptor this image has, with what /proc/self/fd names it
/// (the one reading the directory left out).
fn descriptor_links() -> Vec<(i32, Vec<u8>)> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    let numbers: Vec<i32> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    numbers
        .into_iter()
        .filter_map(|fd| {
            let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
            Some((fd, link.into_os_string().into_encoded_bytes()))
        })
        .collect()
}

/// The mount directory the exec'ing image was in, pinned as our current
/// directory; `None` (the kernel's current directory) when it is gone.
fn inherited_cwd(mounts: &[Arc<Vfs>], path: &[u8]) -> Option<(Arc<Vfs>, crate::calls::Here)> {
    let path = shortfuse_vfs::normalize(path);
    let vfs = mounts.iter().find(|m| m.strip(&path).is_some())?;
    let rest = vfs.strip(&path)?.to_vec();
    if let Some(here) = crate::calls::inherited_mapped(vfs, &rest) {
        return Some((vfs.clone(), here));
    }
    let Ok(Walk::Inside(t)) = vfs.walk(
        &Location::root(),
        &rest,
        WalkFlags {
            attrs_only: false,
            follow: true,
            create: false,
        },
        0,
    ) else {
        return None;
    };
    let loc = vfs.chdir(&t).ok()?;
    vfs.pin_location(&loc);
    crate::calls::kernel_cwd_inside(vfs, &loc);
    Some((vfs.clone(), crate::calls::Here::Walked(loc)))
}

/// Every free descriptor below [`crate::calls::OWN_FD_FLOOR`], held by
/// duplicates of one /dev/null descriptor until dropped.
struct Fence(Vec<i64>);

impl Fence {
    fn low_numbers() -> Fence {
        let floor = crate::calls::OWN_FD_FLOOR;
        let null = b"/dev/null\0";
        let flags = i64::from(libc::O_PATH | libc::O_CLOEXEC);
        let fd = sys::fs::openat(libc::AT_FDCWD, null, flags as i32, 0);
        let mut held = Vec::new();
        if fd < 0 {
            return Fence(held);
        }
        held.push(fd);
        // The kernel hands out the lowest free number: `fd` is it, and
        // every number below is taken.
        if fd + 1 < floor {
            fill_by_passing(fd as i32, floor - fd - 1, &mut held);
        }
        // What passing left free (none, unless it failed or a limit cut
        // it short), one number a call; the last call finds one at or
        // above the floor and ends it.
        while held.len() <= floor as usize {
            let d = sys::fs::fcntl_int(fd as i32, libc::F_DUPFD_CLOEXEC, 0);
            if d >= 0 {
                held.push(d);
            }
            if !(0..floor).contains(&d) {
                break;
            }
        }
        Fence(held)
    }
}

/// Takes up to `n` free numbers with copies of `fd` in a handful of
/// system calls instead of one each: the copies are sent over a socket
/// pair in one message and received in one, and the kernel installs the
/// received descriptors at the lowest free numbers (the pair's own two
/// numbers are held too).
fn fill_by_passing(fd: i32, n: i64, held: &mut Vec<i64>) {
    let mut pair = [-1i32; 2];
    if sys::fs::socketpair_dgram(&mut pair) != 0 {
        return;
    }
    held.extend(pair.map(i64::from));
    let copies = vec![fd; n.clamp(0, 253) as usize];
    let mut got = [0i32; 253];
    if !copies.is_empty() && sys::fs::send_fds(pair[0], &copies) > 0 {
        let k = sys::fs::recv_fds(pair[1], &mut got);
        held.extend(got[..k.max(0) as usize].iter().map(|&d| i64::from(d)));
    }
}

impl Drop for Fence {
    fn drop(&mut self) {
        // The numbers are mostly one run (3 to 99): one close_range a run
        // instead of a close each (a hundred system calls at every start).
        self.0.sort_unstable();
        let mut i = 0;
        while i < self.0.len() {
            let mut j = i;
            while j + 1 < self.0.len() && self.0[j + 1] == self.0[j] + 1 {
                j += 1;
            }
            let (first, last) = (self.0[i], self.0[j]);
            if sys::fs::close_range(first as u32, last as u32, 0) != 0 {
                for fd in first..=last {
                    sys::fs::close(fd as i32);
                }
            }
            i = j + 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(fstype: &str, source: &str) -> MountInfo {
        MountInfo {
            major: 0,
            minor: 1,
            mount_point: "/m".into(),
            fstype: fstype.into(),
            source: source.into(),
        }
    }

    #[test]
    fn remote_mounts_by_source_or_type() {
        assert!(is_remote(&mount("fuse.sshfs", "me@host:/srv")));
        assert!(is_remote(&mount("fuse.rclone", "drive:photos")));
        assert!(is_remote(&mount("fuse.s3fs", "s3fs")));
        assert!(!is_remote(&mount("fuse.bindfs", "/srv/data")));
        assert!(!is_remote(&mount("fuse.squashfuse", "/images/a.sqfs")));
        assert!(!is_remote(&mount("fuse", "shortfuse-passthrough")));
    }
}
