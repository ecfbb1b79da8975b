//! execve/execveat: what the new image keeps of this one's mounts.
//!
//! The new image loads the shim again (LD_PRELOAD and SHORTFUSE_MOUNTS are in
//! its environment) and builds its mounts afresh: a `mem` mount starts empty,
//! a passthrough mount sees its source. Before the kernel runs the exec:
//!
//! - A program path inside a mount is exec'd from the backing file of a
//!   passthrough mount (EACCES elsewhere: there is no file to map).
//! - A descriptor of a passthrough mount that survives exec (no FD_CLOEXEC)
//!   is handed over: its placeholder is replaced, at the same number, by a
//!   kernel descriptor of the backing file opened with the same status flags
//!   and moved to the same offset (descriptors sharing one open file share
//!   the new one too). This is what makes `cmd > /mnt/file` work in a shell.
//!   The new image then reaches that file through the kernel.
//! - A descriptor of a daemon's file (the rings) is already a kernel open
//!   file description of its own (see `shared`): it survives as any
//!   descriptor does and the new image adopts it at start-up. Descriptors
//!   of other mounts served in process stay placeholders (their reads and
//!   writes fail with EBADF): the new image has a file system of its own.
//! - A current directory inside a mount travels in `SHORTFUSE_CWD`.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::sync::Arc;

use shortfuse::{Errno, FileType};
use shortfuse_vfs::{OpenFile, Target, Vfs};

use super::reply::err;
use super::resolve::{mount_of, resolve, with_nul, Resolved};
use super::table::{Exec, Ptr};
use crate::mounts::{CWD_VAR, NOTHING_INHERITED, NOTHING_INHERITED_VAR};
use crate::sys::{fs, raw};
use crate::{state, user};

const AT_FDCWD: i64 = libc::AT_FDCWD as i64;

pub fn execve(e: Exec) -> Option<i64> {
    execve_script(e.at.path, e.argv, e.envp, 0)
}

/// How many `#!` interpreters on a mount one exec follows (the kernel's
/// own limit for interpreters that are scripts themselves).
const SCRIPT_DEPTH: u32 = 4;

/// [`execve`], `depth` interpreters deep.
fn execve_script(path_ptr: Ptr, argv_ptr: Ptr, envp_ptr: Ptr, depth: u32) -> Option<i64> {
    let (a0, a1, a2) = (path_ptr.0, argv_ptr.0, envp_ptr.0);
    // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
    let path = match unsafe { user::cstr(a0) } {
        Ok(p) => p,
        Err(e) => return Some(err(e)),
    };
    let prog = match program(AT_FDCWD, path, true) {
        Ok(p) => p,
        Err(e) => return Some(err(e)),
    };
    if let Some(argv) = script_on_mount(&prog, path, a1) {
        if let Prog::Copy(fd) = prog {
            fs::close(fd as i32);
        }
        if depth >= SCRIPT_DEPTH {
            return Some(err(Errno::ELOOP));
        }
        let (prog, args) = (Ptr(argv.pointers[0] as i64), Ptr(argv.pointers.as_ptr() as i64));
        return execve_script(prog, args, envp_ptr, depth + 1);
    }
    if let Some(r) = super::unserved::refuse(&prog, path, a1, a2, super::unserved::cwd_mount()) {
        if let Prog::Copy(fd) = prog {
            fs::close(fd as i32);
        }
        return Some(r);
    }
    if let Prog::Copy(fd) = prog {
        return Some(exec_copy(fd, a1, a2));
    }
    let (dirfd, prog) = prog.into_path();
    let prog_ptr = prog.as_ref().map_or(a0, |p| p.as_ptr() as i64);
    hand_over_descriptors();
    let env = environment(a2, nothing_inherited());
    let envp = env.as_ref().map_or(a2, |e| e.pointers.as_ptr() as i64);
    Some(if dirfd == AT_FDCWD && prog.is_none() {
        // SAFETY: the program's argv, envp and path, or a NUL-terminated path of ours alive across
        // the call: the kernel reads them as it would have.
        unsafe { raw(libc::SYS_execve, prog_ptr, a1, envp, 0, 0, 0) }
    } else {
        // SAFETY: the program's argv, envp and path, or a NUL-terminated path of ours alive across
        // the call: the kernel reads them as it would have.
        unsafe { raw(libc::SYS_execveat, dirfd, prog_ptr, a1, envp, 0, 0) }
    })
}

/// Execs the copy of a program held in memfd `fd`; closes it if the exec fails.
fn exec_copy(fd: i64, argv: i64, envp: i64) -> i64 {
    hand_over_descriptors();
    let env = environment(envp, nothing_inherited());
    let envp = env.as_ref().map_or(envp, |e| e.pointers.as_ptr() as i64);
    exec_memfd(fd, argv, envp)
}

/// execveat of memfd `fd` (environment ready); closes it if the exec fails.
fn exec_memfd(fd: i64, argv: i64, envp: i64) -> i64 {
    // SAFETY: the program's argv, envp and path, or a NUL-terminated path of ours alive across the
    // call: the kernel reads them as it would have.
    let r = unsafe {
        raw(
            libc::SYS_execveat,
            fd,
            c"".as_ptr() as i64,
            argv,
            envp,
            i64::from(libc::AT_EMPTY_PATH),
            0,
        )
    };
    fs::close(fd as i32);
    r
}

pub fn execveat(e: Exec) -> Option<i64> {
    let (dirfd_arg, argv, envp) = (i64::from(e.at.dirfd), e.argv.0, e.envp.0);
    // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
    let path = match unsafe { user::cstr(e.at.path.0) } {
        Ok(p) => p,
        Err(e) => return Some(err(e)),
    };
    let flags = e.flags.0;
    let (dirfd, prog) = if path.is_empty() {
        (dirfd_arg, None)
    } else {
        match program(dirfd_arg, path, e.flags.follow()) {
            Ok(p) => {
                if let Some(r) = super::unserved::refuse(&p, path, argv, envp, super::unserved::cwd_mount()) {
                    if let Prog::Copy(fd) = p {
                        fs::close(fd as i32);
                    }
                    return Some(r);
                }
                match p {
                    Prog::Copy(fd) => return Some(exec_copy(fd, argv, envp)),
                    p => p.into_path(),
                }
            }
            Err(e) => return Some(err(e)),
        }
    };
    let prog_ptr = prog.as_ref().map_or(e.at.path.0, |p| p.as_ptr() as i64);
    hand_over_descriptors();
    let env = environment(envp, nothing_inherited());
    let envp = env.as_ref().map_or(envp, |e| e.pointers.as_ptr() as i64);
    // SAFETY: the program's argv, envp and path, or a NUL-terminated path of ours alive across the
    // call: the kernel reads them as it would have.
    Some(unsafe { raw(libc::SYS_execveat, dirfd, prog_ptr, argv, envp, i64::from(flags), 0) })
}

/// The argument vector of a script's interpreter: the strings and the
/// NULL-terminated pointers to them (and to the program's own).
struct Argv {
    pointers: Vec<*const libc::c_char>,
    _own: Vec<CString>,
}

/// For a script whose `#!` interpreter lies on a mount (a virtual
/// environment's `bin/pip` names `MOUNT/venv/bin/python3`), which the
/// kernel cannot find: what the kernel would run, the interpreter with its
/// optional argument, the script's path as exec'd and the script's
/// arguments after `argv[0]`. `None` for anything else (the kernel reads
/// the `#!` line itself).
fn script_on_mount(prog: &Prog, path: &[u8], argv: i64) -> Option<Argv> {
    let mut head = [0u8; 256];
    let n = match prog {
        Prog::Copy(fd) => fs::pread(*fd as i32, &mut head, 0),
        Prog::Path(p) => {
            let flags = i64::from(libc::O_RDONLY | libc::O_CLOEXEC);
            let fd = fs::openat(libc::AT_FDCWD, p, flags as i32, 0);
            if fd < 0 {
                return None;
            }
            let n = fs::read(fd as i32, &mut head);
            fs::close(fd as i32);
            n
        }
        Prog::Keep(_) => return None,
    };
    let line = head.get(..usize::try_from(n).ok()?)?.strip_prefix(b"#!")?;
    let line = &line[..line.iter().position(|&b| b == b'\n')?];
    let blank = |b: &u8| *b == b' ' || *b == b'\t';
    let start = line.iter().position(|b| !blank(b))?;
    let line = &line[start..];
    let end = line.iter().position(blank).unwrap_or(line.len());
    let interp = &line[..end];
    if !interp.starts_with(b"/") || mount_of(&shortfuse_vfs::normalize(interp)).is_none() {
        return None;
    }
    // As Linux: the rest of the line, trimmed, is one argument.
    let rest = &line[end..];
    let rest = rest
        .iter()
        .position(|b| !blank(b))
        .map(|i| &rest[i..rest.iter().rposition(|b| !blank(b)).map_or(rest.len(), |j| j + 1)]);
    let mut own = vec![CString::new(interp).ok()?];
    if let Some(arg) = rest {
        own.push(CString::new(arg).ok()?);
    }
    own.push(CString::new(path).ok()?);
    let mut pointers: Vec<*const libc::c_char> = own.iter().map(|c| c.as_ptr()).collect();
    // A bad pointer: the kernel's exec of the script gives EFAULT.
    for i in 1.. {
        // SAFETY: a pointer argument of the call, into the program's memory, to a plain C type.
        let p = if argv == 0 {
            0
        } else {
            unsafe { user::pointer_at(argv, i) }.ok()?
        };
        if p == 0 {
            break;
        }
        pointers.push(p as *const libc::c_char);
    }
    pointers.push(std::ptr::null());
    Some(Argv { pointers, _own: own })
}

/// The program to exec.
pub(super) enum Prog {
    /// The caller's path, relative to this directory descriptor.
    Keep(i64),
    /// This absolute path (NUL-terminated) instead.
    Path(Vec<u8>),
    /// A memfd holding a copy of the program (a mount without a source).
    Copy(i64),
}

impl Prog {
    /// `(dirfd, None)` keeps the caller's path, `(AT_FDCWD, Some(abs))`
    /// replaces it.
    fn into_path(self) -> (i64, Option<Vec<u8>>) {
        match self {
            Prog::Keep(d) => (d, None),
            Prog::Path(p) => (AT_FDCWD, Some(p)),
            Prog::Copy(_) => (AT_FDCWD, None),
        }
    }
}

fn program(dirfd: i64, path: &[u8], follow: bool) -> Result<Prog, Errno> {
    match resolve(dirfd as i32, path, follow)? {
        Resolved::Kernel(None) => Ok(Prog::Keep(dirfd)),
        Resolved::Kernel(Some(p)) => Ok(Prog::Path(p)),
        Resolved::Ours(vfs, t) => {
            let (_, attr) = t.node.ok_or(Errno::ENOENT)?;
            if attr.file_type() != FileType::Regular {
                return Err(Errno::EACCES);
            }
            match vfs.source() {
                Some(src) => Ok(Prog::Path(backing_path(src, &t.path()))),
                None => copy_program(&vfs, &t, attr.mode).map(Prog::Copy),
            }
        }
    }
}

/// See `calls::vfork_exec`.
pub fn vfork_exec(e: Exec) -> Option<i64> {
    let dirfd = i64::from(e.at.dirfd);
    // The kernel's answer to a bad path (the child must not fault in our memory).
    // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
    let path = match unsafe { user::cstr(e.at.path.0) } {
        Ok(p) => p,
        Err(e) => return Some(err(e)),
    };
    let (argv, envp, flags) = (e.argv.0, e.envp.0, i64::from(e.flags.0));
    let abs = super::spawn::absolute(dirfd, path)?;
    // What the kernel will run, when it can be read here: a program of a
    // mount without a source is copied below, and never static in practice.
    let kernel_prog = match mount_of(&abs) {
        None => Some(with_nul(abs.clone())),
        Some((vfs, rest)) => vfs.source().map(|src| backing_path(src, &super::spawn::slash(rest))),
    };
    if let Some(p) = kernel_prog {
        let cwd = super::spawn::mount_cwd().and_then(|c| mount_of(&c).map(|(v, _)| v));
        if let Some(r) = super::unserved::refuse(&Prog::Path(p), path, argv, envp, cwd) {
            return Some(r);
        }
    }
    // The file actions of a spawn may have put a mount descriptor anywhere
    // (a copy of one of ours, or a file it opened): the new image looks for
    // them, unless there is none to copy and it opened none (a shell's or
    // make's command, which then starts without reading /proc/self/fd).
    let nothing = state().fds.is_empty() && !super::spawn::opened_on_mount() && !may_hold_unseen();
    let env = environment(envp, nothing);
    let envp = env.as_ref().map_or(envp, |e| e.pointers.as_ptr() as i64);
    // `p` is NUL-terminated.
    // SAFETY: the program's argv, envp and path, or a NUL-terminated path of ours alive across the
    // call: the kernel reads them as it would have.
    let exec_path = |p: &[u8]| unsafe { raw(libc::SYS_execveat, AT_FDCWD, p.as_ptr() as i64, argv, envp, flags, 0) };
    let Some((vfs, rest)) = mount_of(&abs).map(|(v, r)| (v, r.to_vec())) else {
        if path.starts_with(b"/") || super::spawn::mount_cwd().is_none() {
            // The kernel finds it as it is (the environment may still
            // have changed: the sites handed down, at least), through the
            // call the program made.
            let plain = dirfd == AT_FDCWD && flags == 0;
            return env.is_some().then(|| {
                // SAFETY: the program's argv, envp and path, or a NUL-terminated path of ours alive
                // across the call: the kernel reads them as it would have.
                unsafe {
                    if plain {
                        raw(libc::SYS_execve, e.at.path.0, argv, envp, 0, 0, 0)
                    } else {
                        raw(libc::SYS_execveat, dirfd, e.at.path.0, argv, envp, flags, 0)
                    }
                }
            });
        }
        // Relative to a directory in a mount: the kernel's current
        // directory is not there.
        return Some(exec_path(&with_nul(abs)));
    };
    if let Some(src) = vfs.source() {
        let rest = if rest.is_empty() { b"/".to_vec() } else { rest };
        return Some(exec_path(&backing_path(src, &rest)));
    }
    // A mount without a source (mem, a daemon's): the program is copied to
    // a memfd, which takes the file system's code, too much for the child's
    // small stack; it runs on a stack of its own. Every call it makes goes
    // to the kernel (or the daemon) as this child's do, and what it
    // allocates is freed before the exec. Descriptors are not handed over:
    // the child may have moved them (posix_spawn's file actions).
    let follow = flags as i32 & libc::AT_SYMLINK_NOFOLLOW == 0;
    let abs = with_nul(abs);
    let abs = &abs[..abs.len() - 1];
    let mut got = None;
    crate::sys::on_own_stack(&mut || got = Some(program(AT_FDCWD, abs, follow)));
    match got? {
        Ok(Prog::Copy(fd)) => Some(exec_memfd(fd, argv, envp)),
        // A symbolic link out of the mount (a virtual environment's python).
        // SAFETY: the program's argv, envp and path, or a NUL-terminated path of ours alive across
        // the call: the kernel reads them as it would have.
        Ok(Prog::Path(p)) => {
            Some(unsafe { raw(libc::SYS_execveat, AT_FDCWD, p.as_ptr() as i64, argv, envp, flags, 0) })
        }
        Ok(Prog::Keep(_)) => None,
        Err(e) => Some(err(e)),
    }
}

/// A memfd with the bytes of a program on a mount without a backing file,
/// for the kernel to exec. Its mode carries the file's permission bits, so
/// the kernel's own execute check applies. ELF programs get a close-on-exec
/// memfd; a script must not (the kernel hands its interpreter
/// `/dev/fd/N`, which the interpreter opens after the exec), and so keeps
/// that descriptor open in the new image.
fn copy_program(vfs: &Arc<Vfs>, t: &Target, mode: u32) -> Result<i64, Errno> {
    let f = vfs.open(t, libc::O_RDONLY, 0)?;
    let mut head = [0u8; 4];
    let n = f.pread(&mut head, 0)?;
    let elf = n == 4 && head == *b"\x7fELF";
    let flags = if elf { libc::MFD_CLOEXEC } else { 0 };
    let fd = copy_to_memfd(&f, c"shortfuse-exec", flags)?;
    fs::fchmod(fd as i32, mode & 0o7777);
    Ok(fd)
}

/// A new memfd (`name`, memfd_create `flags`) holding the bytes of `f`,
/// at offset 0.
pub(super) fn copy_to_memfd(f: &OpenFile, name: &std::ffi::CStr, flags: u32) -> Result<i64, Errno> {
    let fd = fs::memfd_create(name, flags);
    if fd < 0 {
        return Err(Errno::from_raw(-fd as i32));
    }
    let fail = |e: Errno| {
        fs::close(fd as i32);
        Err(e)
    };
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0u64;
    loop {
        let got = match f.pread(&mut buf, off) {
            Ok(0) => break,
            Ok(g) => g,
            Err(e) => return fail(e),
        };
        let mut done = 0;
        while done < got {
            // SAFETY: a slice of our own buffer, with its length.
            let w = unsafe {
                raw(
                    libc::SYS_pwrite64,
                    fd,
                    buf[done..].as_ptr() as i64,
                    (got - done) as i64,
                    (off + done as u64) as i64,
                    0,
                    0,
                )
            };
            if w <= 0 {
                return fail(Errno::EIO);
            }
            done += w as usize;
        }
        off += got as u64;
    }
    Ok(fd)
}

/// `src` + `rel` (which starts with '/'), NUL-terminated.
pub(super) fn backing_path(src: &[u8], rel: &[u8]) -> Vec<u8> {
    let mut p = src.to_vec();
    if rel != b"/" {
        if p.ends_with(b"/") {
            p.pop();
        }
        p.extend_from_slice(rel);
    }
    p.push(0);
    p
}

/// Replaces the placeholders of passthrough descriptors that survive exec
/// with kernel descriptors of their backing files.
fn hand_over_descriptors() {
    super::spare::freed();
    let st = state();
    let mut done: Vec<(Arc<OpenFile>, i64)> = Vec::new();
    for (fd, cloexec) in st.fds.fds() {
        if cloexec {
            continue;
        }
        let Some(f) = st.fds.get(fd) else { continue };
        if f.kernel_backed() || f.vfs().client().shared() {
            // Already the backing file's own descriptor, or a daemon's
            // description, which the new image adopts (see `shared`).
            continue;
        }
        if let Some((_, kfd)) = done.iter().find(|(g, _)| Arc::ptr_eq(g, &f)) {
            fs::dup3(*kfd as i32, fd, 0);
            continue;
        }
        let Some(src) = f.vfs().source() else { continue };
        let path = backing_path(src, f.path());
        let flags = f.flags() & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_CLOEXEC);
        let kfd = fs::openat(libc::AT_FDCWD, &path, flags, 0);
        if kfd < 0 {
            continue;
        }
        if f.file_type() == FileType::Regular && !f.is_path_only() {
            fs::lseek(kfd as i32, f.offset() as i64, libc::SEEK_SET);
        }
        fs::dup3(kfd as i32, fd, 0);
        done.push((f, kfd));
    }
    for (_, kfd) in done {
        fs::close(kfd as i32);
    }
}

/// A rewritten environment: the pointers (NULL-terminated) and the
/// strings we own.
struct Env {
    pointers: Vec<*const libc::c_char>,
    _own: Vec<CString>,
}

/// The longest environment string exec takes (MAX_ARG_STRLEN: 32 pages).
const ARG_MAX: usize = 32 * 4096;

/// Whether no descriptor of a mount survives the exec (each is
/// close-on-exec, or there is none): the new image then need not look
/// for any ([`NOTHING_INHERITED_VAR`]).
fn nothing_inherited() -> bool {
    !may_hold_unseen() && state().fds.fds().iter().all(|&(_, cloexec)| cloexec)
}

/// Whether this process may hold descriptions of a daemon's files that our
/// table does not know: one passed to it over a Unix socket (recvmsg is
/// not intercepted outside a FUSE daemon) is known only to the image that
/// adopts it at start-up, so with a daemon's mount the new image must look.
fn may_hold_unseen() -> bool {
    state().mounts.iter().any(|m| m.client().shared())
}

/// The environment for the new image with `SHORTFUSE_CWD` set to our
/// current directory inside a mount, or removed when we are not in one,
/// LD_LIBRARY_PATH made fit for the dynamic loader (`libpath`),
/// [`NOTHING_INHERITED_VAR`] set when `nothing` says so (removed
/// otherwise), and the system-call sites this image knows handed down
/// (`known_sites`) when the new image loads the shim. `None`: the program's
/// own environment needs no change.
fn environment(envp: i64, nothing: bool) -> Option<Env> {
    let cwd = super::spawn::mount_cwd();
    let prefix = format!("{CWD_VAR}=");
    let saved = format!("{}=", super::libpath::SAVED_VAR);
    let marker = format!("{NOTHING_INHERITED_VAR}=");
    let sites = format!("{}=", crate::known_sites::VAR);
    let mut pointers = Vec::new();
    let mut own = Vec::new();
    let mut had = false;
    let mut preloads = false;
    if envp != 0 {
        let mut i = 0;
        loop {
            // A bad array or string is left for the kernel's exec to refuse.
            // SAFETY: a pointer argument of the call, into the program's memory, to a plain C type.
            let Ok(p) = (unsafe { user::pointer_at(envp, i) }) else {
                return None;
            };
            if p == 0 {
                break;
            }
            i += 1;
            // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
            let s = unsafe { user::cstr_max(p, ARG_MAX) }.unwrap_or_default();
            if [&prefix, &saved, &marker, &sites]
                .iter()
                .any(|v| s.starts_with(v.as_bytes()))
            {
                had = true;
                continue;
            }
            preloads |= s.starts_with(b"LD_PRELOAD=");
            if let Some((for_loader, keep)) = super::libpath::for_loader(s) {
                if let (Ok(a), Ok(b)) = (CString::new(for_loader), CString::new(keep)) {
                    own.push(a);
                    own.push(b);
                    continue;
                }
            }
            pointers.push(p as *const libc::c_char);
        }
    }
    if preloads {
        if let Some(c) =
            crate::known_sites::for_exec().and_then(|v| CString::new([sites.into_bytes(), v].concat()).ok())
        {
            own.push(c);
        }
    }
    if cwd.is_none() && !had && own.is_empty() && !nothing {
        return None;
    }
    if let Some(c) = cwd.and_then(|cwd| {
        let mut s = prefix.into_bytes();
        s.extend_from_slice(&cwd);
        CString::new(s).ok()
    }) {
        own.push(c);
    }
    pointers.extend(own.iter().map(|c| c.as_ptr()));
    if nothing {
        pointers.push(NOTHING_INHERITED.as_ptr());
    }
    pointers.push(std::ptr::null());
    Some(Env { pointers, _own: own })
}
