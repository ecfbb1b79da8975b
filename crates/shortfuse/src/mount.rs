//! Mounting and unmounting a FUSE file system.
//!
//! As root, [`Mount::new`] opens /dev/fuse and calls mount(2) itself (type
//! `fuse.<subtype>`, data `fd=N,rootmode=40000,user_id=U,group_id=G,...`).
//! Otherwise it runs the set-user-id helper `fusermount3`, which mounts and
//! hands the /dev/fuse fd back over the `_FUSE_COMMFD` socket with
//! SCM_RIGHTS. Unmounting mirrors it: umount2(2) as root, `fusermount3 -u`
//! otherwise. A [`Mount`] unmounts (lazily) when dropped, unless it is gone
//! already.
//!
//! Paths are resolved without touching the mount point itself: on a FUSE
//! mount whose daemon died every stat of it fails with ENOTCONN, and that
//! is exactly the mount `shortfuse umount -l` must still be able to clean.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::options::MountOptions;
use crate::sys;

/// How to mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum MountMethod {
    /// mount(2) when running as root, fusermount3 otherwise.
    #[default]
    Auto,
    /// mount(2) and umount2(2); needs CAP_SYS_ADMIN.
    Syscall,
    /// The fusermount3 helper.
    Fusermount,
}

/// One line of /proc/self/mountinfo.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountInfo {
    /// `st_dev` of the mounted file system; for FUSE the minor number is the
    /// connection id under /sys/fs/fuse/connections.
    pub major: u32,
    /// Minor device number (the FUSE connection id).
    pub minor: u32,
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// File system type (`fuse.shortfuse-mem`).
    pub fstype: String,
    /// Source (`fsname`).
    pub source: String,
}

impl MountInfo {
    /// Whether this is a FUSE mount (`fuse`, `fuse.*`, `fuseblk`).
    pub fn is_fuse(&self) -> bool {
        self.fstype == "fuse" || self.fstype.starts_with("fuse.") || self.fstype == "fuseblk"
    }
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = u32::from(b[i + 1] - b'0') * 64 + u32::from(b[i + 2] - b'0') * 8 + u32::from(b[i + 3] - b'0');
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses mountinfo text; malformed lines are skipped.
pub(crate) fn parse_mountinfo(text: &str) -> Vec<MountInfo> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let left: Vec<&str> = left.split(' ').collect();
            let mut right = right.split(' ');
            let (major, minor) = left.get(2)?.split_once(':')?;
            Some(MountInfo {
                major: major.parse().ok()?,
                minor: minor.parse().ok()?,
                mount_point: PathBuf::from(unescape(left.get(4)?)),
                fstype: right.next()?.to_string(),
                source: unescape(right.next()?),
            })
        })
        .collect()
}

/// The current mounts of this process's mount namespace.
pub fn mounts() -> io::Result<Vec<MountInfo>> {
    Ok(parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo")?))
}

/// The topmost FUSE mount at `mount_point` (already canonical), if any.
pub fn fuse_mount_at(mount_point: &Path) -> io::Result<Option<MountInfo>> {
    Ok(mounts()?
        .into_iter()
        .rfind(|m| m.mount_point == mount_point)
        .filter(MountInfo::is_fuse))
}

/// The mount that holds `path` (canonical): the topmost of those mounted
/// on it or on its nearest ancestor that is a mount point.
pub fn mount_holding(path: &Path) -> io::Result<Option<MountInfo>> {
    let all = mounts()?;
    let deepest = all
        .iter()
        .filter(|m| path.starts_with(&m.mount_point))
        .map(|m| m.mount_point.components().count())
        .max();
    Ok(all
        .into_iter()
        .rfind(|m| path.starts_with(&m.mount_point) && Some(m.mount_point.components().count()) == deepest))
}

/// The absolute, symlink-free path of `path`, resolving only its parent: the
/// last component may be a dead FUSE mount that cannot be stat'ed.
pub fn canonical_mountpoint(path: &Path) -> io::Result<PathBuf> {
    let abs = std::path::absolute(path)?;
    match (abs.parent(), abs.file_name()) {
        (Some(parent), Some(name)) => match std::fs::canonicalize(parent) {
            Ok(p) => Ok(p.join(name)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("mount point {} does not exist", path.display()),
            )),
            Err(e) => Err(io::Error::new(e.kind(), format!("{}: {e}", parent.display()))),
        },
        // "/" or a path ending in "..": nothing special to protect.
        _ => std::fs::canonicalize(&abs),
    }
}

fn err(kind: io::ErrorKind, msg: String) -> io::Error {
    io::Error::new(kind, msg)
}

/// Checks that `mount_point` can take a new FUSE mount; returns it canonical.
fn check_mount_point(path: &Path) -> io::Result<PathBuf> {
    let mp = canonical_mountpoint(path)?;
    if let Some(m) = fuse_mount_at(&mp)? {
        return Err(err(
            io::ErrorKind::AlreadyExists,
            format!(
                "{} is already a FUSE mount ({} from {}); unmount it first with `shortfuse umount {}`",
                mp.display(),
                m.fstype,
                m.source,
                mp.display()
            ),
        ));
    }
    match std::fs::metadata(&mp) {
        Ok(md) if md.is_dir() => Ok(mp),
        Ok(_) => Err(err(
            io::ErrorKind::NotADirectory,
            format!("mount point {} is not a directory", mp.display()),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(err(
            io::ErrorKind::NotFound,
            format!("mount point {} does not exist", mp.display()),
        )),
        Err(e) => Err(err(e.kind(), format!("mount point {}: {e}", mp.display()))),
    }
}

/// Opens /dev/fuse read-write (std opens with O_CLOEXEC).
pub(crate) fn open_dev_fuse() -> io::Result<File> {
    File::options()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(|e| match e.kind() {
            io::ErrorKind::PermissionDenied => err(
                e.kind(),
                "no permission to open /dev/fuse: mount as root, or let fusermount3 mount".to_string(),
            ),
            io::ErrorKind::NotFound => err(
                e.kind(),
                "/dev/fuse does not exist: is the fuse module loaded?".to_string(),
            ),
            _ => err(e.kind(), format!("/dev/fuse: {e}")),
        })
}

/// A live FUSE mount. Dropping it unmounts lazily, unless it was unmounted
/// already (by [`Mount::unmount`], `shortfuse umount` or anybody else).
#[derive(Debug)]
pub struct Mount {
    mount_point: PathBuf,
    use_fusermount: bool,
    /// Device numbers of the new file system, to tell our mount from a later
    /// one at the same place.
    dev: Option<(u32, u32)>,
    /// The mount's never-reused id: device numbers of FUSE connections are
    /// reused at once, so a new mount at the same place, made right after
    /// ours went away, can carry our numbers (and our late `Drop` would
    /// unmount it).
    unique_id: Option<u64>,
    unmounted: bool,
}

impl Mount {
    /// Mounts a FUSE file system at `mount_point` and returns the mount and
    /// the connection's /dev/fuse fd. The kernel queues FUSE_INIT on the fd
    /// at once; nothing can use the mount until it is answered.
    pub fn new(mount_point: &Path, opts: &MountOptions, method: MountMethod) -> io::Result<(Mount, File)> {
        let mp = check_mount_point(mount_point)?;
        let use_fusermount = match method {
            MountMethod::Auto => sys::geteuid() != 0,
            MountMethod::Syscall => false,
            MountMethod::Fusermount => true,
        };
        let dev = if use_fusermount {
            fusermount_mount(&mp, opts)?
        } else {
            syscall_mount(&mp, opts)?
        };
        let ours = fuse_mount_at(&mp)?.map(|m| (m.major, m.minor));
        let unique_id = match sys::mount_unique_id(&mp) {
            Ok(Some((id, dev))) if Some(dev) == ours => Some(id),
            _ => None,
        };
        Ok((
            Mount {
                mount_point: mp,
                use_fusermount,
                dev: ours,
                unique_id,
                unmounted: false,
            },
            dev,
        ))
    }

    /// Where the file system is mounted.
    pub fn mount_point(&self) -> &Path {
        &self.mount_point
    }

    /// The FUSE connection id (the directory name under
    /// /sys/fs/fuse/connections).
    pub fn connection_id(&self) -> Option<u32> {
        self.dev.map(|(_, minor)| minor)
    }

    /// Whether our mount is still in the mount table.
    pub fn is_mounted(&self) -> bool {
        let Some((major, minor)) = self.dev else {
            return false;
        };
        let listed = mounts().is_ok_and(|ms| {
            ms.iter()
                .any(|m| m.major == major && m.minor == minor && m.mount_point == self.mount_point)
        });
        match self.unique_id {
            Some(id) if listed => {
                sys::mount_unique_id(&self.mount_point).is_ok_and(|now| now.map(|(i, _)| i) == Some(id))
            }
            _ => listed,
        }
    }

    /// Unmounts; `lazy` detaches even while files are open (MNT_DETACH).
    pub fn unmount(&mut self, lazy: bool) -> io::Result<()> {
        if self.unmounted {
            return Ok(());
        }
        unmount_path(&self.mount_point, lazy, self.use_fusermount)?;
        self.unmounted = true;
        Ok(())
    }

    /// Aborts the connection (/sys/fs/fuse/connections/N/abort): every
    /// pending and later request fails with ENOTCONN and the daemon's reads
    /// end with ENODEV. For a daemon that must stop while its lazily
    /// unmounted file system is still in use.
    pub fn abort(&self) -> io::Result<()> {
        let id = self
            .connection_id()
            .ok_or_else(|| err(io::ErrorKind::NotFound, "connection id unknown".to_string()))?;
        std::fs::write(format!("/sys/fs/fuse/connections/{id}/abort"), "1")
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if !self.unmounted && self.is_mounted() {
            if let Err(e) = self.unmount(true) {
                tracing::warn!("unmounting {}: {e}", self.mount_point.display());
            }
        }
    }
}

fn syscall_mount(mp: &Path, opts: &MountOptions) -> io::Result<File> {
    let dev = open_dev_fuse()?;
    let mut data = format!(
        "fd={},rootmode=40000,user_id={},group_id={}",
        dev.as_raw_fd(),
        sys::getuid(),
        sys::getgid()
    );
    if opts.allow_other {
        data.push_str(",allow_other");
    }
    if opts.default_permissions {
        data.push_str(",default_permissions");
    }
    if let Some(n) = opts.max_read {
        data.push_str(&format!(",max_read={n}"));
    }
    let mut flags: u64 = 0;
    for (on, flag) in [
        (opts.ro, libc::MS_RDONLY),
        (opts.nosuid, libc::MS_NOSUID),
        (opts.nodev, libc::MS_NODEV),
        (opts.noexec, libc::MS_NOEXEC),
        (opts.noatime, libc::MS_NOATIME),
    ] {
        if on {
            flags |= flag;
        }
    }
    let fstype = match &opts.subtype {
        Some(s) => format!("fuse.{s}"),
        None => "fuse".to_string(),
    };
    let source = opts
        .fsname
        .as_deref()
        .or(opts.subtype.as_deref())
        .unwrap_or("shortfuse");
    sys::mount(OsStr::new(source), mp, &fstype, flags, &data).map_err(|e| match e.raw_os_error() {
        Some(libc::EPERM) => err(
            io::ErrorKind::PermissionDenied,
            format!("no permission to mount on {}: mount(2) needs root", mp.display()),
        ),
        _ => err(e.kind(), format!("mount {} on {}: {e}", fstype, mp.display())),
    })?;
    Ok(dev)
}

fn find_fusermount() -> io::Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/bin")])
        .map(|d| d.join("fusermount3"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            err(
                io::ErrorKind::NotFound,
                "fusermount3 not found: install fuse3 (apt-get install fuse3), or mount as root".to_string(),
            )
        })
}

fn fusermount_mount(mp: &Path, opts: &MountOptions) -> io::Result<File> {
    let helper = find_fusermount()?;
    let (ours, theirs) = UnixStream::pair()?;
    let mut cmd = Command::new(&helper);
    cmd.arg("-o")
        .arg(opts.fusermount_options())
        .arg("--")
        .arg(mp)
        .env("_FUSE_COMMFD", theirs.as_raw_fd().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    sys::inherit_fd(&mut cmd, theirs.as_raw_fd());
    let child = cmd
        .spawn()
        .map_err(|e| err(e.kind(), format!("running {}: {e}", helper.display())))?;
    drop(theirs);
    // fusermount3 sends the fd and exits; the fd waits in the socket buffer.
    let out = child.wait_with_output()?;
    let fd = sys::recv_fd(&ours)?;
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    match fd {
        Some(fd) if out.status.success() => Ok(File::from(fd)),
        _ => Err(err(
            io::ErrorKind::Other,
            format!(
                "fusermount3 could not mount {}: {}",
                mp.display(),
                if stderr.is_empty() {
                    out.status.to_string()
                } else {
                    stderr
                }
            ),
        )),
    }
}

fn unmount_path(mp: &Path, lazy: bool, use_fusermount: bool) -> io::Result<()> {
    if use_fusermount {
        let helper = find_fusermount()?;
        let mut cmd = Command::new(&helper);
        cmd.arg("-u");
        if lazy {
            cmd.arg("-z");
        }
        let out = cmd
            .arg("--")
            .arg(mp)
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .output()?;
        if out.status.success() {
            return Ok(());
        }
        let msg = String::from_utf8_lossy(&out.stderr).trim().to_string();
        let kind = if msg.contains("busy") {
            io::ErrorKind::ResourceBusy
        } else {
            io::ErrorKind::Other
        };
        return Err(err(kind, format!("fusermount3 -u {}: {msg}", mp.display())));
    }
    let flags = libc::UMOUNT_NOFOLLOW | if lazy { libc::MNT_DETACH } else { 0 };
    // A file closed just before stays pinned until the kernel's
    // asynchronous RELEASE completes: give that a bounded moment before
    // calling the mount busy.
    let mut result = sys::umount2(mp, flags);
    for _ in 0..20 {
        match &result {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                std::thread::sleep(std::time::Duration::from_millis(25));
                result = sys::umount2(mp, flags);
            }
            _ => break,
        }
    }
    result.map_err(|e| match e.raw_os_error() {
        Some(libc::EBUSY) => err(
            io::ErrorKind::ResourceBusy,
            format!(
                "{} is busy; `shortfuse umount -l` detaches it now and frees it when the last user leaves",
                mp.display()
            ),
        ),
        Some(libc::EPERM) => err(
            io::ErrorKind::PermissionDenied,
            format!("no permission to unmount {}", mp.display()),
        ),
        Some(libc::EINVAL) => err(
            io::ErrorKind::InvalidInput,
            format!("{} is not a mount point", mp.display()),
        ),
        _ => err(e.kind(), format!("unmount {}: {e}", mp.display())),
    })
}

/// Unmounts the FUSE file system at `mount_point` (what `shortfuse umount`
/// does). Refuses anything that is not a FUSE mount. Works when the daemon
/// is gone: a dead mount is detached like any other.
pub fn unmount(mount_point: &Path, lazy: bool) -> io::Result<()> {
    let mp = canonical_mountpoint(mount_point)?;
    match mounts()?.into_iter().rfind(|m| m.mount_point == mp) {
        None => Err(err(
            io::ErrorKind::InvalidInput,
            format!("{} is not mounted", mp.display()),
        )),
        Some(m) if !m.is_fuse() => Err(err(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is not a FUSE mount (it is {}); not unmounting it",
                mp.display(),
                m.fstype
            ),
        )),
        Some(_) => unmount_path(&mp, lazy, sys::geteuid() != 0),
    }
}

/// Used by the session: a clone of `master` for one more worker.
pub(crate) fn clone_dev_fd(master: &File) -> io::Result<File> {
    let new = open_dev_fuse()?;
    sys::fuse_dev_clone(new.as_fd(), master.as_fd()).map_err(|e| err(e.kind(), format!("FUSE_DEV_IOC_CLONE: {e}")))?;
    Ok(new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines() {
        let text = "22 1 0:21 / /proc rw,nosuid - proc proc rw\n\
                    90 29 0:52 / /tmp/my\\040mnt rw,nosuid,nodev shared:1 - fuse.mem src\\040x rw,user_id=0\n\
                    garbage line\n";
        let m = parse_mountinfo(text);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].fstype, "proc");
        assert!(!m[0].is_fuse());
        assert_eq!(m[1].mount_point, Path::new("/tmp/my mnt"));
        assert_eq!((m[1].major, m[1].minor), (0, 52));
        assert_eq!(m[1].source, "src x");
        assert!(m[1].is_fuse());
    }

    #[test]
    fn canonical_paths_do_not_stat_the_last_component() {
        let dir = std::env::temp_dir().join(format!("shortfuse-canon-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("real")).unwrap();
        let link = dir.join("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(dir.join("real"), &link).unwrap();
        let canon_dir = std::fs::canonicalize(&dir).unwrap();
        // The parent is resolved, the missing last component is kept.
        assert_eq!(
            canonical_mountpoint(&link.join("missing")).unwrap(),
            canon_dir.join("real/missing")
        );
        let e = canonical_mountpoint(&dir.join("nope/x")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("does not exist"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn mount_point_checks() {
        let dir = std::env::temp_dir().join(format!("shortfuse-mpcheck-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("file");
        std::fs::write(&file, b"x").unwrap();
        let e = check_mount_point(&file).unwrap_err();
        assert!(e.to_string().contains("is not a directory"), "{e}");
        let e = check_mount_point(&dir.join("missing")).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
        assert_eq!(check_mount_point(&dir).unwrap(), std::fs::canonicalize(&dir).unwrap());
        let e = unmount(&dir, false).unwrap_err();
        assert!(e.to_string().contains("is not mounted"), "{e}");
        let e = unmount(Path::new("/"), false).unwrap_err();
        assert!(e.to_string().contains("not a FUSE mount"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
