//! Programs the shim will not be loaded into: statically linked ones (no
//! ELF interpreter, so LD_PRELOAD never applies) and those exec'd with an
//! environment that lost `LD_PRELOAD` or `SHORTFUSE_MOUNTS` (`env -i`).
//! The kernel alone serves their calls, so mount paths mean nothing to it:
//! such a program is refused (EACCES, with a line on stderr saying why)
//! when it would start with its current directory in a mount the kernel
//! cannot reach, or with an argument naming a path in a mount whose mount
//! point is not a kernel mount. (With its current directory in a
//! passthrough mount it runs, in the backing directory: see
//! `calls::kernel_cwd_inside`.)
#![allow(unsafe_code)]

use shortfuse::sync::Unpoison;
use std::sync::Arc;

use shortfuse_vfs::Vfs;

use super::exec::Prog;
use super::resolve::{mount_of, with_nul};
use crate::state;
use crate::sys::{fs, raw};
use crate::user;

/// The kernel's FUSE file systems (`statfs` f_type).
const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

/// Whether the kernel has a mount of its own at `vfs`'s mount point (a
/// `shortfuse serve` daemon mounted beside its rings).
pub fn kernel_mounted(vfs: &Vfs) -> bool {
    let mp = with_nul(vfs.mountpoint().to_vec());
    let mut buf = [0i64; 16];
    // SAFETY: a NUL-terminated path of ours and a buffer of ours as large
    // as the kernel's struct statfs.
    let r = unsafe {
        raw(
            libc::SYS_statfs,
            mp.as_ptr() as i64,
            buf.as_mut_ptr() as i64,
            0,
            0,
            0,
            0,
        )
    };
    r == 0 && buf[0] == FUSE_SUPER_MAGIC
}

/// The mount our current directory is in.
pub fn cwd_mount() -> Option<Arc<Vfs>> {
    let st = state();
    let cwd = st.cwd.lock().unpoison();
    cwd.as_ref().map(|(v, _)| v.clone())
}

/// EACCES (and a line on stderr) when the program `prog` (`path` as the
/// caller gave it), run with `argv` and `envp` from a current directory in
/// mount `cwd`, will not load the shim and would meet a mount it cannot
/// reach; None to go on with the exec.
pub fn refuse(prog: &Prog, path: &[u8], argv: i64, envp: i64, cwd: Option<Arc<Vfs>>) -> Option<i64> {
    let cwd_lost = cwd.filter(|v| v.source().is_none() && !kernel_mounted(v));
    let arg = arguments_in_mounts(argv);
    if cwd_lost.is_none() && arg.is_none() {
        return None;
    }
    let why = if !has_interpreter(prog, path)? {
        "is statically linked"
    } else if !environment_keeps_shim(envp) {
        "runs without LD_PRELOAD or SHORTFUSE_MOUNTS in its environment"
    } else {
        return None;
    };
    let what = match (&cwd_lost, &arg) {
        (Some(v), _) => format!(
            "its current directory is in the mount {}",
            String::from_utf8_lossy(v.mountpoint())
        ),
        (None, Some(a)) => format!("its argument {} is in a mount", String::from_utf8_lossy(a)),
        (None, None) => return None,
    };
    let msg = format!(
        "shortfuse: {}: refused: the program {why}, so the mounts cannot be served in it, and {what} that the \
         kernel cannot reach\n",
        String::from_utf8_lossy(path)
    );
    fs::write(2, msg.as_bytes());
    Some(-(libc::EACCES as i64))
}

/// The first argument (after the program's name) that is an absolute path
/// inside a mount whose mount point the kernel does not serve.
fn arguments_in_mounts(argv: i64) -> Option<Vec<u8>> {
    if argv == 0 {
        return None;
    }
    for i in 1.. {
        // SAFETY: a pointer argument of the call, into the program's memory, to a plain C type.
        let p = unsafe { user::pointer_at(argv, i) }.ok()?;
        if p == 0 {
            return None;
        }
        // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
        let Ok(a) = (unsafe { user::cstr(p) }) else { return None };
        if !a.starts_with(b"/") {
            continue;
        }
        let abs = shortfuse_vfs::normalize(a);
        if let Some((vfs, _)) = mount_of(&abs) {
            let vfs: Arc<Vfs> = vfs;
            if !kernel_mounted(&vfs) {
                return Some(a.to_vec());
            }
        }
    }
    None
}

/// Whether the environment still loads the shim with its mounts.
fn environment_keeps_shim(envp: i64) -> bool {
    let (mut preload, mut mounts) = (false, false);
    for i in 0.. {
        // SAFETY: a pointer argument of the call, into the program's memory, to a plain C type.
        let Ok(p) = (unsafe { user::pointer_at(envp, i) }) else {
            break;
        };
        if p == 0 {
            break;
        }
        // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
        let Ok(e) = (unsafe { user::cstr(p) }) else { break };
        if let Some(v) = e.strip_prefix(b"LD_PRELOAD=") {
            preload |= v
                .windows(b"libshortfuse_preload".len())
                .any(|w| w == b"libshortfuse_preload");
        }
        mounts |= e.starts_with(b"SHORTFUSE_MOUNTS=");
    }
    preload && mounts
}

/// Whether the program is an ELF file with an interpreter (PT_INTERP), or
/// something else the kernel runs through one (a script); None when it
/// cannot be read (the exec will say why).
fn has_interpreter(prog: &Prog, path: &[u8]) -> Option<bool> {
    let (fd, close) = match prog {
        Prog::Copy(fd) => (*fd, false),
        Prog::Keep(dirfd) => (open(*dirfd, with_nul(path.to_vec()))?, true),
        Prog::Path(p) => (open(libc::AT_FDCWD as i64, p.clone())?, true),
    };
    let r = !shortfuse_vfs::elf::is_static_elf(&mut |off, buf| pread(fd, buf, off));
    if close {
        fs::close(fd as i32);
    }
    Some(r)
}

fn open(dirfd: i64, path: Vec<u8>) -> Option<i64> {
    let fd = fs::openat(dirfd as i32, &path, libc::O_RDONLY | libc::O_CLOEXEC, 0);
    (fd >= 0).then_some(fd)
}

fn pread(fd: i64, buf: &mut [u8], off: u64) -> usize {
    let n = fs::pread(fd as i32, buf, off);
    n.max(0) as usize
}
