//! The system calls served on mounts. Each handler returns `None` to let
//! the original call reach the kernel unchanged, or `Some(result)`
//! (a value or a negated errno) when it served the call or re-issued it
//! with a resolved path.
//!
//! [`table`] decodes a call's registers once into a [`table::Call`]; the
//! modules below serve one family of calls each, and take their arguments
//! typed.

mod descriptors;
mod directories;
mod exec;
pub mod kernel;
mod lent;
pub mod libpath;
mod locks;
mod metadata;
mod open;
mod paths;
mod reply;
mod resolve;
pub mod shared;
mod sockets;
pub mod spare;
pub mod spawn;
pub mod special;
mod straight;
pub mod table;
mod unserved;
pub(crate) mod xattr;

pub use descriptors::{nested, OWN_FD_FLOOR};
pub(crate) use directories::{cwd_location, entered_mapped, inherited_mapped, kernel_cwd_inside, Here};
pub use metadata::{to_stat, to_statx, utime_times};
pub(crate) use resolve::{below_source, kind_of, magic_link, mount_of};
pub use straight::straight_to_kernel;
pub use table::is_file_call;

use table::{Call, Regs};

/// execve/execveat in a vfork child (posix_spawn, `system`, python's
/// subprocess): the child runs on a small stack of its own (posix_spawn's is
/// about 32 KiB, too little for the file system's code), may have closed the
/// file system's descriptors or moved others, and shares our memory and
/// thread state. So a path on a passthrough mount is exec'd from its source
/// (found lexically; the kernel follows symbolic links there), a program on
/// a mount without a source (mem, a daemon's) is copied to a memfd by code
/// running on a stack of its own (`sys::on_own_stack`), and descriptors are
/// not handed over (those of a daemon's files travel by themselves; see
/// `shared`).
pub fn vfork_exec(nr: i64, a: [i64; 6]) -> Option<i64> {
    match Call::decode(nr, a)? {
        Call::Execve { exec } | Call::Execveat { exec } => exec::vfork_exec(exec),
        _ => None,
    }
}

/// The other file calls of a vfork child: see `spawn`.
pub fn vfork_call(nr: i64, a: [i64; 6]) -> Option<i64> {
    spawn::call(Call::decode(nr, a)?)
}

/// Serves a file call, or a clone-family call before the entry runs it.
pub fn dispatch(nr: i64, a: [i64; 6]) -> Option<i64> {
    let call = Call::decode(nr, a)?;
    let regs = Regs { nr, a };
    // The calls on a FUSE daemon's own /dev/fuse descriptor (see `daemon`).
    if crate::daemon::on() {
        if let Some(r) = crate::daemon::call(&call, regs) {
            return Some(r);
        }
    }
    // Where a daemon's descriptions may reach another process (see `shared`).
    match call {
        Call::Clone { flags } => {
            spawn::before_vfork(nr, flags);
            shared::before_clone(nr, flags);
            return Some(0);
        }
        Call::Send { .. } => {
            shared::sent(&call);
            return None;
        }
        Call::Execve { .. } | Call::Execveat { .. } => shared::anchor_all(),
        Call::Socket { fd, addr, len, bind } => return sockets::call(fd, addr, len, bind),
        _ => {}
    }
    // Beneath a namespace-mapped mount, the kernel's own calls (see `nsmap`).
    if let Some(r) = crate::nsmap::call(&call) {
        return Some(r);
    }
    if let Some(r) = kernel::call(&call, regs) {
        return r;
    }
    match call {
        Call::Read { fd, buf, len } => descriptors::read(fd, buf, len),
        Call::Write { fd, buf, len } => descriptors::write(fd, buf, len),
        Call::Pread { fd, buf, len, off } => descriptors::pread(fd, buf, len, off),
        Call::Pwrite { fd, buf, len, off } => descriptors::pwrite(fd, buf, len, off),
        Call::Vectored {
            fd,
            iov,
            iovcnt,
            dir,
            at,
        } => descriptors::vectored(fd, iov, iovcnt, dir, at),
        Call::Lseek { fd, off, whence } => descriptors::lseek(fd, off, whence),
        Call::Ftruncate { fd, len } => descriptors::ftruncate(fd, len),
        Call::Fsync { fd, data_only } => descriptors::fsync(fd, data_only),
        Call::Fallocate { fd, mode, off, len } => descriptors::fallocate(fd, mode, off, len),
        Call::Advise { fd } => descriptors::advise(fd),
        Call::Ioctl { fd } => descriptors::ioctl(regs, fd),
        Call::Mmap { fd, flags } => descriptors::mmap(regs, fd, flags),
        Call::Copy { out, input, .. } => descriptors::copy(regs, out, input),
        Call::Close { fd } => descriptors::close(fd),
        Call::CloseRange { first, last, flags } => descriptors::close_range(first, last, flags),
        Call::Dup { fd } => descriptors::dup(fd),
        Call::Dup3 { old, new, flags } => descriptors::dup3(old, new, flags),
        Call::Fcntl { fd, cmd, arg } => descriptors::fcntl(fd, cmd, arg),
        Call::Flock { fd, op } => descriptors::flock(fd, op),
        Call::Getdents { fd, buf, len } => directories::getdents(fd, buf, len),
        Call::Fchdir { fd } => directories::fchdir(fd),
        Call::Getcwd { buf, len } => directories::getcwd(buf, len),
        Call::Chdir { at } => directories::chdir(at.path),
        Call::Fstat { fd, out } => metadata::fstat(fd, out),
        Call::Stat { at, out, flags } => metadata::stat(regs, at, out, flags),
        Call::Statx { at, flags, out } => metadata::statx(regs, at, flags, out),
        Call::Fchmod { fd, mode } => metadata::fchmod(fd, mode),
        Call::Chmod { at, mode, flags } => metadata::chmod(regs, at, mode, flags),
        Call::Fchown { fd, uid, gid } => metadata::fchown(fd, uid, gid),
        Call::Chown { at, uid, gid, flags } => metadata::chown(regs, at, uid, gid, flags),
        Call::Utimensat { at, times, flags } => metadata::utimensat(regs, at, times, flags),
        Call::Statfs { at, out } => metadata::statfs(regs, at, out),
        Call::Fstatfs { fd, out } => metadata::fstatfs(fd, out),
        Call::Open { at, flags, mode } => open::open(regs, at, flags, mode),
        Call::Openat2 { at, how, size } => open::openat2(regs, at, how, size),
        Call::Access { at, mode, flags } => paths::access(regs, at, mode, flags),
        Call::Mkdir { at, mode } => paths::mkdir(regs, at, mode),
        Call::Mknod { at, mode, dev } => paths::mknod(regs, at, mode, dev),
        Call::Unlink { at, flags } => paths::unlink(regs, at, flags),
        Call::Readlink { at, buf, len } => paths::readlink(regs, at, buf, len),
        Call::Truncate { at, len } => paths::truncate(regs, at, len),
        Call::Rename { old, new, flags } => paths::rename(old, new, flags),
        Call::Link { old, new, flags } => paths::link(old, new, flags),
        Call::Symlink { target, at } => paths::symlink(regs, target, at),
        Call::InotifyAddWatch { inotify, at, mask } => paths::inotify_add_watch(regs, inotify, at, mask),
        Call::Umask { mask } => paths::umask(mask),
        Call::Xattr { on, op } => xattr::call(regs, on, op),
        Call::Execve { exec } => exec::execve(exec),
        Call::Execveat { exec } => exec::execveat(exec),
        Call::Clone { .. } | Call::Send { .. } | Call::Socket { .. } => None,
        // A daemon's own (see `crate::daemon`).
        Call::Recv { .. } | Call::Poll { .. } | Call::Select { .. } | Call::EpollCtl { .. } => None,
    }
}
