//! The one table of the system calls the shim looks at: each number, the
//! [`Call`] its registers decode to, and from the same table the sets the
//! entry and the hook test numbers against ([`is_file_call`],
//! [`FILE_CALLS`], [`is_clone`]), so that no list of numbers can disagree
//! with what is decoded and served.
//!
//! Decoding copies registers into typed fields and allocates nothing: it
//! runs for every call that leaves the fast path. The kernel reads an
//! `int` argument (a descriptor, flags) from the low 32 bits of its
//! register, and so do the types here.

/// A descriptor argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fd(pub i32);

impl Fd {
    fn of(reg: i64) -> Fd {
        Fd(reg as i32)
    }
}

impl From<Fd> for i64 {
    fn from(fd: Fd) -> i64 {
        i64::from(fd.0)
    }
}

/// An address in the program's memory, as the program passed it: nothing
/// is read from it while decoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ptr(pub i64);

impl Ptr {
    pub fn is_null(self) -> bool {
        self.0 == 0
    }
}

/// The `AT_*` flags of a `*at` call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AtFlags(pub i32);

impl AtFlags {
    pub const NONE: AtFlags = AtFlags(0);
    pub const NOFOLLOW: AtFlags = AtFlags(libc::AT_SYMLINK_NOFOLLOW);

    fn of(reg: i64) -> AtFlags {
        AtFlags(reg as i32)
    }

    /// Whether a final symbolic link is followed (no AT_SYMLINK_NOFOLLOW).
    pub fn follow(self) -> bool {
        self.0 & libc::AT_SYMLINK_NOFOLLOW == 0
    }

    pub fn has(self, flag: i32) -> bool {
        self.0 & flag != 0
    }
}

/// A path argument with the directory it is relative to: the registers
/// they came from are kept, so that the call can be re-issued on the
/// kernel with a resolved path in their place ([`Regs::reissue`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathAt {
    /// `AT_FDCWD` for the calls without a directory argument.
    pub dirfd: i32,
    pub path: Ptr,
    path_reg: u8,
    dirfd_reg: Option<u8>,
}

impl PathAt {
    /// The path in register `path`, relative to the current directory.
    fn cwd(a: &[i64; 6], path: u8) -> PathAt {
        PathAt {
            dirfd: libc::AT_FDCWD,
            path: Ptr(a[usize::from(path)]),
            path_reg: path,
            dirfd_reg: None,
        }
    }

    /// The path in register `path`, relative to the descriptor in `dirfd`.
    fn at(a: &[i64; 6], dirfd: u8, path: u8) -> PathAt {
        PathAt {
            dirfd: a[usize::from(dirfd)] as i32,
            path: Ptr(a[usize::from(path)]),
            path_reg: path,
            dirfd_reg: Some(dirfd),
        }
    }
}

/// execve and execveat: the program (relative to `at.dirfd`), its
/// argument and environment vectors, and execveat's flags (none for
/// execve).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exec {
    pub at: PathAt,
    pub argv: Ptr,
    pub envp: Ptr,
    pub flags: AtFlags,
}

/// The registers of a call as the program made it.
#[derive(Clone, Copy, Debug)]
pub struct Regs {
    pub nr: i64,
    pub a: [i64; 6],
}

impl Regs {
    /// The registers with `path` (NUL-terminated, absolute) in place of the
    /// path argument `at`, and AT_FDCWD in place of its directory.
    pub fn with_path(self, at: PathAt, path: &[u8]) -> Regs {
        let mut a = self.a;
        a[usize::from(at.path_reg)] = path.as_ptr() as i64;
        if let Some(d) = at.dirfd_reg {
            a[usize::from(d)] = i64::from(libc::AT_FDCWD);
        }
        Regs { nr: self.nr, a }
    }
}

/// What readv/writev and their positioned forms do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Read,
    Write,
}

/// Where a vectored transfer starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offset {
    /// At the file offset, which moves.
    Current,
    /// At this offset (negative ones are refused), leaving the file's.
    At(i64),
}

/// Which extended-attribute operation, with its own arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XattrOp {
    Get {
        name: Ptr,
        value: Ptr,
        size: i64,
    },
    List {
        list: Ptr,
        size: i64,
    },
    Set {
        name: Ptr,
        value: Ptr,
        size: usize,
        flags: i32,
    },
    Remove {
        name: Ptr,
    },
}

/// What an extended-attribute call is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XattrOn {
    /// A path (the `l` forms do not follow a final symbolic link).
    Path { at: PathAt, follow: bool },
    /// A descriptor (the `f` forms).
    Fd(Fd),
}

/// How long a poll or select waits, as the program gave it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timeout {
    /// poll's milliseconds (negative: no limit).
    Millis(i32),
    /// ppoll's and pselect6's `struct timespec` (null: no limit).
    Spec(Ptr),
    /// select's `struct timeval` (null: no limit).
    Val(Ptr),
}

/// A decoded call. Variants that several numbers decode to say in their
/// fields what told the numbers apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    Read {
        fd: Fd,
        buf: Ptr,
        len: usize,
    },
    Write {
        fd: Fd,
        buf: Ptr,
        len: usize,
    },
    Pread {
        fd: Fd,
        buf: Ptr,
        len: usize,
        off: i64,
    },
    Pwrite {
        fd: Fd,
        buf: Ptr,
        len: usize,
        off: i64,
    },
    /// readv, writev, preadv, pwritev, preadv2, pwritev2.
    Vectored {
        fd: Fd,
        iov: Ptr,
        iovcnt: i64,
        dir: Direction,
        at: Offset,
    },
    Lseek {
        fd: Fd,
        off: i64,
        whence: i32,
    },
    Getdents {
        fd: Fd,
        buf: Ptr,
        len: usize,
    },
    Fstat {
        fd: Fd,
        out: Ptr,
    },
    Ftruncate {
        fd: Fd,
        len: i64,
    },
    Fsync {
        fd: Fd,
        data_only: bool,
    },
    Fchmod {
        fd: Fd,
        mode: u32,
    },
    Fchown {
        fd: Fd,
        uid: i64,
        gid: i64,
    },
    Fstatfs {
        fd: Fd,
        out: Ptr,
    },
    Fallocate {
        fd: Fd,
        mode: i32,
        off: i64,
        len: i64,
    },
    /// fadvise64, sync_file_range: advice the file system has no use for.
    Advise {
        fd: Fd,
    },
    Ioctl {
        fd: Fd,
    },
    Mmap {
        fd: Fd,
        flags: i32,
    },
    /// copy_file_range, sendfile, splice.
    Copy {
        out: Fd,
        input: Fd,
        len: usize,
        splice: bool,
    },
    Close {
        fd: Fd,
    },
    CloseRange {
        first: u32,
        last: u32,
        flags: u32,
    },
    Dup {
        fd: Fd,
    },
    /// dup2 (`flags` None: it has no third argument) and dup3.
    Dup3 {
        old: Fd,
        new: Fd,
        flags: Option<i32>,
    },
    Fcntl {
        fd: Fd,
        cmd: i32,
        arg: i64,
    },
    Flock {
        fd: Fd,
        op: i32,
    },
    Fchdir {
        fd: Fd,
    },
    Getcwd {
        buf: Ptr,
        len: usize,
    },
    Chdir {
        at: PathAt,
    },
    Umask {
        mask: u32,
    },
    /// open, creat, openat.
    Open {
        at: PathAt,
        flags: i32,
        mode: u32,
    },
    Openat2 {
        at: PathAt,
        how: Ptr,
        size: usize,
    },
    /// stat, lstat, newfstatat.
    Stat {
        at: PathAt,
        out: Ptr,
        flags: AtFlags,
    },
    Statx {
        at: PathAt,
        flags: AtFlags,
        out: Ptr,
    },
    /// access, faccessat, faccessat2.
    Access {
        at: PathAt,
        mode: i32,
        flags: AtFlags,
    },
    /// mkdir, mkdirat.
    Mkdir {
        at: PathAt,
        mode: u32,
    },
    /// mknod, mknodat.
    Mknod {
        at: PathAt,
        mode: u32,
        dev: u32,
    },
    /// unlink, rmdir (AT_REMOVEDIR), unlinkat.
    Unlink {
        at: PathAt,
        flags: i32,
    },
    /// readlink, readlinkat (the size is an `int`).
    Readlink {
        at: PathAt,
        buf: Ptr,
        len: i32,
    },
    Truncate {
        at: PathAt,
        len: i64,
    },
    /// chmod, fchmodat, fchmodat2.
    Chmod {
        at: PathAt,
        mode: u32,
        flags: AtFlags,
    },
    /// chown, lchown, fchownat.
    Chown {
        at: PathAt,
        uid: i64,
        gid: i64,
        flags: AtFlags,
    },
    /// utimensat (a null path is futimens).
    Utimensat {
        at: PathAt,
        times: Ptr,
        flags: AtFlags,
    },
    Statfs {
        at: PathAt,
        out: Ptr,
    },
    /// rename, renameat, renameat2.
    Rename {
        old: PathAt,
        new: PathAt,
        flags: u32,
    },
    /// link, linkat.
    Link {
        old: PathAt,
        new: PathAt,
        flags: i32,
    },
    /// symlink, symlinkat.
    Symlink {
        target: Ptr,
        at: PathAt,
    },
    InotifyAddWatch {
        inotify: Fd,
        at: PathAt,
        mask: u32,
    },
    Xattr {
        on: XattrOn,
        op: XattrOp,
    },
    Execve {
        exec: Exec,
    },
    Execveat {
        exec: Exec,
    },
    /// sendmsg, sendmmsg: they may pass descriptors of ours. `vlen`: the
    /// number of `mmsghdr` at `msgs` (sendmmsg), or None for one `msghdr`.
    Send {
        msgs: Ptr,
        vlen: Option<u32>,
    },
    /// bind, connect: a Unix socket's path may name a mount.
    Socket {
        fd: Fd,
        addr: Ptr,
        len: u32,
        bind: bool,
    },
    /// clone, fork, vfork (`flags` 0 for the last two).
    Clone {
        flags: i64,
    },
    /// recvmsg: what a FUSE daemon under `serve -- COMMAND` may receive
    /// /dev/fuse by (see `daemon`).
    Recv {
        msg: Ptr,
    },
    /// poll, ppoll: `mask` is ppoll's signal set (null: none given, and
    /// always for poll).
    Poll {
        fds: Ptr,
        n: u64,
        timeout: Timeout,
        mask: Ptr,
    },
    /// select, pselect6 (`mask`: pselect6's { sigset pointer, size }
    /// pair, null for select): the read, write and except sets.
    Select {
        n: i32,
        sets: [Ptr; 3],
        timeout: Timeout,
        mask: Ptr,
    },
    EpollCtl {
        ep: Fd,
        op: i32,
        fd: Fd,
        event: Ptr,
    },
}

/// Declares the table: `NUMBER => Variant { field: expression of the
/// registers $a }`, in groups. Generates [`Call::decode`] and, per group,
/// the list of numbers and the test of one.
macro_rules! calls {
    ($a:ident;
     $(
         $(#[$gm:meta])* group $list:ident, $test:ident {
             $($nr:ident => $variant:ident $({ $($f:ident: $e:expr),* $(,)? })?,)*
         }
     )*) => {
        $(
            $(#[$gm])*
            pub const $list: &[i64] = &[$(libc::$nr),*];

            $(#[$gm])*
            #[inline]
            pub fn $test(nr: i64) -> bool {
                matches!(nr, $(libc::$nr)|*)
            }
        )*

        impl Call {
            /// The call the registers make; `None` for a number not in the table.
            #[inline]
            pub fn decode(nr: i64, $a: [i64; 6]) -> Option<Call> {
                #[allow(unused_variables)]
                let $a = &$a;
                Some(match nr {
                    $($(libc::$nr => Call::$variant $({ $($f: $e),* })?,)*)*
                    _ => return None,
                })
            }
        }
    };
}

calls! { a;
    /// The file calls: served on mounts, else sent on to the kernel.
    group FILE_CALLS, is_file_call {
        SYS_read => Read { fd: Fd::of(a[0]), buf: Ptr(a[1]), len: a[2] as usize },
        SYS_write => Write { fd: Fd::of(a[0]), buf: Ptr(a[1]), len: a[2] as usize },
        SYS_pread64 => Pread { fd: Fd::of(a[0]), buf: Ptr(a[1]), len: a[2] as usize, off: a[3] },
        SYS_pwrite64 => Pwrite { fd: Fd::of(a[0]), buf: Ptr(a[1]), len: a[2] as usize, off: a[3] },
        SYS_readv => Vectored {
            fd: Fd::of(a[0]), iov: Ptr(a[1]), iovcnt: a[2], dir: Direction::Read, at: Offset::Current,
        },
        SYS_writev => Vectored {
            fd: Fd::of(a[0]), iov: Ptr(a[1]), iovcnt: a[2], dir: Direction::Write, at: Offset::Current,
        },
        SYS_preadv => Vectored {
            fd: Fd::of(a[0]), iov: Ptr(a[1]), iovcnt: a[2], dir: Direction::Read, at: Offset::At(a[3]),
        },
        SYS_pwritev => Vectored {
            fd: Fd::of(a[0]), iov: Ptr(a[1]), iovcnt: a[2], dir: Direction::Write, at: Offset::At(a[3]),
        },
        // Offset -1 uses (and moves) the file offset.
        SYS_preadv2 => Vectored {
            fd: Fd::of(a[0]), iov: Ptr(a[1]), iovcnt: a[2], dir: Direction::Read,
            at: if a[3] == -1 { Offset::Current } else { Offset::At(a[3]) },
        },
        SYS_pwritev2 => Vectored {
            fd: Fd::of(a[0]), iov: Ptr(a[1]), iovcnt: a[2], dir: Direction::Write,
            at: if a[3] == -1 { Offset::Current } else { Offset::At(a[3]) },
        },
        SYS_lseek => Lseek { fd: Fd::of(a[0]), off: a[1], whence: a[2] as i32 },
        SYS_getdents64 => Getdents { fd: Fd::of(a[0]), buf: Ptr(a[1]), len: a[2] as usize },
        SYS_fstat => Fstat { fd: Fd::of(a[0]), out: Ptr(a[1]) },
        SYS_ftruncate => Ftruncate { fd: Fd::of(a[0]), len: a[1] },
        SYS_fsync => Fsync { fd: Fd::of(a[0]), data_only: false },
        SYS_fdatasync => Fsync { fd: Fd::of(a[0]), data_only: true },
        SYS_fchmod => Fchmod { fd: Fd::of(a[0]), mode: a[1] as u32 },
        SYS_fchown => Fchown { fd: Fd::of(a[0]), uid: a[1], gid: a[2] },
        SYS_fstatfs => Fstatfs { fd: Fd::of(a[0]), out: Ptr(a[1]) },
        SYS_fallocate => Fallocate { fd: Fd::of(a[0]), mode: a[1] as i32, off: a[2], len: a[3] },
        SYS_fadvise64 => Advise { fd: Fd::of(a[0]) },
        SYS_sync_file_range => Advise { fd: Fd::of(a[0]) },
        SYS_ioctl => Ioctl { fd: Fd::of(a[0]) },
        SYS_mmap => Mmap { fd: Fd::of(a[4]), flags: a[3] as i32 },
        SYS_copy_file_range => Copy { out: Fd::of(a[2]), input: Fd::of(a[0]), len: a[4] as usize, splice: false },
        SYS_sendfile => Copy { out: Fd::of(a[0]), input: Fd::of(a[1]), len: a[3] as usize, splice: false },
        SYS_splice => Copy { out: Fd::of(a[2]), input: Fd::of(a[0]), len: a[4] as usize, splice: true },
        SYS_close => Close { fd: Fd::of(a[0]) },
        SYS_close_range => CloseRange { first: a[0] as u32, last: a[1] as u32, flags: a[2] as u32 },
        SYS_dup => Dup { fd: Fd::of(a[0]) },
        SYS_dup2 => Dup3 { old: Fd::of(a[0]), new: Fd::of(a[1]), flags: None },
        SYS_dup3 => Dup3 { old: Fd::of(a[0]), new: Fd::of(a[1]), flags: Some(a[2] as i32) },
        SYS_fcntl => Fcntl { fd: Fd::of(a[0]), cmd: a[1] as i32, arg: a[2] },
        SYS_flock => Flock { fd: Fd::of(a[0]), op: a[1] as i32 },
        SYS_fchdir => Fchdir { fd: Fd::of(a[0]) },
        SYS_getcwd => Getcwd { buf: Ptr(a[0]), len: a[1] as usize },
        SYS_chdir => Chdir { at: PathAt::cwd(a, 0) },
        SYS_umask => Umask { mask: a[0] as u32 },
        SYS_open => Open { at: PathAt::cwd(a, 0), flags: a[1] as i32, mode: a[2] as u32 },
        SYS_creat => Open {
            at: PathAt::cwd(a, 0), flags: libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC, mode: a[1] as u32,
        },
        SYS_openat => Open { at: PathAt::at(a, 0, 1), flags: a[2] as i32, mode: a[3] as u32 },
        SYS_openat2 => Openat2 { at: PathAt::at(a, 0, 1), how: Ptr(a[2]), size: a[3] as usize },
        SYS_stat => Stat { at: PathAt::cwd(a, 0), out: Ptr(a[1]), flags: AtFlags::NONE },
        SYS_lstat => Stat { at: PathAt::cwd(a, 0), out: Ptr(a[1]), flags: AtFlags::NOFOLLOW },
        SYS_newfstatat => Stat { at: PathAt::at(a, 0, 1), out: Ptr(a[2]), flags: AtFlags::of(a[3]) },
        SYS_statx => Statx { at: PathAt::at(a, 0, 1), flags: AtFlags::of(a[2]), out: Ptr(a[4]) },
        SYS_access => Access { at: PathAt::cwd(a, 0), mode: a[1] as i32, flags: AtFlags::NONE },
        SYS_faccessat => Access { at: PathAt::at(a, 0, 1), mode: a[2] as i32, flags: AtFlags::NONE },
        SYS_faccessat2 => Access { at: PathAt::at(a, 0, 1), mode: a[2] as i32, flags: AtFlags::of(a[3]) },
        SYS_mkdir => Mkdir { at: PathAt::cwd(a, 0), mode: a[1] as u32 },
        SYS_mkdirat => Mkdir { at: PathAt::at(a, 0, 1), mode: a[2] as u32 },
        SYS_mknod => Mknod { at: PathAt::cwd(a, 0), mode: a[1] as u32, dev: a[2] as u32 },
        SYS_mknodat => Mknod { at: PathAt::at(a, 0, 1), mode: a[2] as u32, dev: a[3] as u32 },
        SYS_unlink => Unlink { at: PathAt::cwd(a, 0), flags: 0 },
        SYS_rmdir => Unlink { at: PathAt::cwd(a, 0), flags: libc::AT_REMOVEDIR },
        SYS_unlinkat => Unlink { at: PathAt::at(a, 0, 1), flags: a[2] as i32 },
        SYS_readlink => Readlink { at: PathAt::cwd(a, 0), buf: Ptr(a[1]), len: a[2] as i32 },
        SYS_readlinkat => Readlink { at: PathAt::at(a, 0, 1), buf: Ptr(a[2]), len: a[3] as i32 },
        SYS_truncate => Truncate { at: PathAt::cwd(a, 0), len: a[1] },
        SYS_chmod => Chmod { at: PathAt::cwd(a, 0), mode: a[1] as u32, flags: AtFlags::NONE },
        // fchmodat has no flags argument: its fourth register is whatever
        // the caller left there.
        SYS_fchmodat => Chmod { at: PathAt::at(a, 0, 1), mode: a[2] as u32, flags: AtFlags::NONE },
        SYS_fchmodat2 => Chmod { at: PathAt::at(a, 0, 1), mode: a[2] as u32, flags: AtFlags::of(a[3]) },
        SYS_chown => Chown { at: PathAt::cwd(a, 0), uid: a[1], gid: a[2], flags: AtFlags::NONE },
        SYS_lchown => Chown { at: PathAt::cwd(a, 0), uid: a[1], gid: a[2], flags: AtFlags::NOFOLLOW },
        SYS_fchownat => Chown { at: PathAt::at(a, 0, 1), uid: a[2], gid: a[3], flags: AtFlags::of(a[4]) },
        SYS_utimensat => Utimensat { at: PathAt::at(a, 0, 1), times: Ptr(a[2]), flags: AtFlags::of(a[3]) },
        SYS_statfs => Statfs { at: PathAt::cwd(a, 0), out: Ptr(a[1]) },
        SYS_rename => Rename { old: PathAt::cwd(a, 0), new: PathAt::cwd(a, 1), flags: 0 },
        SYS_renameat => Rename { old: PathAt::at(a, 0, 1), new: PathAt::at(a, 2, 3), flags: 0 },
        SYS_renameat2 => Rename { old: PathAt::at(a, 0, 1), new: PathAt::at(a, 2, 3), flags: a[4] as u32 },
        SYS_link => Link { old: PathAt::cwd(a, 0), new: PathAt::cwd(a, 1), flags: 0 },
        SYS_linkat => Link { old: PathAt::at(a, 0, 1), new: PathAt::at(a, 2, 3), flags: a[4] as i32 },
        SYS_symlink => Symlink { target: Ptr(a[0]), at: PathAt::cwd(a, 1) },
        SYS_symlinkat => Symlink { target: Ptr(a[0]), at: PathAt::at(a, 1, 2) },
        SYS_inotify_add_watch => InotifyAddWatch { inotify: Fd::of(a[0]), at: PathAt::cwd(a, 1), mask: a[2] as u32 },
        SYS_getxattr => Xattr { on: XattrOn::Path { at: PathAt::cwd(a, 0), follow: true }, op: xattr_get(a) },
        SYS_lgetxattr => Xattr { on: XattrOn::Path { at: PathAt::cwd(a, 0), follow: false }, op: xattr_get(a) },
        SYS_fgetxattr => Xattr { on: XattrOn::Fd(Fd::of(a[0])), op: xattr_get(a) },
        SYS_listxattr => Xattr { on: XattrOn::Path { at: PathAt::cwd(a, 0), follow: true }, op: xattr_list(a) },
        SYS_llistxattr => Xattr { on: XattrOn::Path { at: PathAt::cwd(a, 0), follow: false }, op: xattr_list(a) },
        SYS_flistxattr => Xattr { on: XattrOn::Fd(Fd::of(a[0])), op: xattr_list(a) },
        SYS_setxattr => Xattr { on: XattrOn::Path { at: PathAt::cwd(a, 0), follow: true }, op: xattr_set(a) },
        SYS_lsetxattr => Xattr { on: XattrOn::Path { at: PathAt::cwd(a, 0), follow: false }, op: xattr_set(a) },
        SYS_fsetxattr => Xattr { on: XattrOn::Fd(Fd::of(a[0])), op: xattr_set(a) },
        SYS_removexattr => Xattr {
            on: XattrOn::Path { at: PathAt::cwd(a, 0), follow: true }, op: XattrOp::Remove { name: Ptr(a[1]) },
        },
        SYS_lremovexattr => Xattr {
            on: XattrOn::Path { at: PathAt::cwd(a, 0), follow: false }, op: XattrOp::Remove { name: Ptr(a[1]) },
        },
        SYS_fremovexattr => Xattr { on: XattrOn::Fd(Fd::of(a[0])), op: XattrOp::Remove { name: Ptr(a[1]) } },
        SYS_execve => Execve {
            exec: Exec { at: PathAt::cwd(a, 0), argv: Ptr(a[1]), envp: Ptr(a[2]), flags: AtFlags::NONE },
        },
        SYS_execveat => Execveat {
            exec: Exec { at: PathAt::at(a, 0, 1), argv: Ptr(a[2]), envp: Ptr(a[3]), flags: AtFlags::of(a[4]) },
        },
        SYS_sendmsg => Send { msgs: Ptr(a[1]), vlen: None },
        SYS_sendmmsg => Send { msgs: Ptr(a[1]), vlen: Some(a[2] as u32) },
        SYS_bind => Socket { fd: Fd::of(a[0]), addr: Ptr(a[1]), len: a[2] as u32, bind: true },
        SYS_connect => Socket { fd: Fd::of(a[0]), addr: Ptr(a[1]), len: a[2] as u32, bind: false },
    }

    /// The calls after which another process may hold our descriptors:
    /// served before the entry runs them itself.
    #[cfg_attr(not(test), allow(dead_code))]
    group CLONE_CALLS, is_clone {
        SYS_clone => Clone { flags: a[0] },
        SYS_fork => Clone { flags: 0 },
        SYS_vfork => Clone { flags: 0 },
    }

    /// The calls daemon mode serves beyond the file calls (see `daemon`).
    group DAEMON_CALLS, is_daemon_call {
        SYS_recvmsg => Recv { msg: Ptr(a[1]) },
        SYS_poll => Poll { fds: Ptr(a[0]), n: a[1] as u64, timeout: Timeout::Millis(a[2] as i32), mask: Ptr(0) },
        SYS_ppoll => Poll { fds: Ptr(a[0]), n: a[1] as u64, timeout: Timeout::Spec(Ptr(a[2])), mask: Ptr(a[3]) },
        SYS_select => Select {
            n: a[0] as i32, sets: [Ptr(a[1]), Ptr(a[2]), Ptr(a[3])], timeout: Timeout::Val(Ptr(a[4])), mask: Ptr(0),
        },
        SYS_pselect6 => Select {
            n: a[0] as i32, sets: [Ptr(a[1]), Ptr(a[2]), Ptr(a[3])], timeout: Timeout::Spec(Ptr(a[4])), mask: Ptr(a[5]),
        },
        SYS_epoll_ctl => EpollCtl { ep: Fd::of(a[0]), op: a[1] as i32, fd: Fd::of(a[2]), event: Ptr(a[3]) },
    }
}

/// The calls the assembly entry runs itself once the hook has seen them
/// (`sys::shortfuse_special`): rt_sigreturn on its signal frame's stack,
/// the clone family, and clone3 (answered ENOSYS).
pub const ENTRY_CALLS: &[i64] = &[
    libc::SYS_rt_sigreturn,
    libc::SYS_clone,
    libc::SYS_fork,
    libc::SYS_vfork,
    libc::SYS_clone3,
];

#[inline]
pub fn is_entry_call(nr: i64) -> bool {
    is_clone(nr) || matches!(nr, libc::SYS_rt_sigreturn | libc::SYS_clone3)
}

/// The other calls the hook must see: rt_sigaction (to know whether the
/// program has signal handlers) and exit (a thread's hook stack goes with
/// it, see `sys`).
pub const HOOK_CALLS: &[i64] = &[libc::SYS_rt_sigaction, libc::SYS_exit];

fn xattr_get(a: &[i64; 6]) -> XattrOp {
    XattrOp::Get {
        name: Ptr(a[1]),
        value: Ptr(a[2]),
        size: a[3],
    }
}

fn xattr_list(a: &[i64; 6]) -> XattrOp {
    XattrOp::List {
        list: Ptr(a[1]),
        size: a[2],
    }
}

fn xattr_set(a: &[i64; 6]) -> XattrOp {
    XattrOp::Set {
        name: Ptr(a[1]),
        value: Ptr(a[2]),
        size: a[3] as usize,
        flags: a[4] as i32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_number_decodes_and_no_other() {
        for &nr in FILE_CALLS.iter().chain(CLONE_CALLS).chain(DAEMON_CALLS) {
            assert!(Call::decode(nr, [0; 6]).is_some(), "{nr}");
        }
        for nr in 0..512 {
            let listed = is_file_call(nr) || is_clone(nr) || is_daemon_call(nr);
            assert_eq!(Call::decode(nr, [0; 6]).is_some(), listed, "{nr}");
            assert_eq!(is_file_call(nr), FILE_CALLS.contains(&nr), "{nr}");
            assert_eq!(is_daemon_call(nr), DAEMON_CALLS.contains(&nr), "{nr}");
        }
        assert!(FILE_CALLS
            .iter()
            .all(|nr| !CLONE_CALLS.contains(nr) && !DAEMON_CALLS.contains(nr)));
        for nr in 0..512 {
            assert_eq!(is_entry_call(nr), ENTRY_CALLS.contains(&nr), "{nr}");
        }
        assert!(CLONE_CALLS.iter().all(|nr| ENTRY_CALLS.contains(nr)));
    }

    #[test]
    fn paths_are_reissued_in_their_own_registers() {
        let a = [5, 0x1000, 7, 0x2000, 0, 0];
        let Some(Call::Rename { old, new, .. }) = Call::decode(libc::SYS_renameat, a) else {
            panic!("renameat");
        };
        assert_eq!(
            (old.dirfd, old.path, new.dirfd, new.path),
            (5, Ptr(0x1000), 7, Ptr(0x2000))
        );
        let p = b"/x\0";
        let regs = Regs {
            nr: libc::SYS_renameat,
            a,
        }
        .with_path(new, p);
        let fdcwd = i64::from(libc::AT_FDCWD);
        assert_eq!(regs.a, [5, 0x1000, fdcwd, p.as_ptr() as i64, 0, 0]);
        // inotify_add_watch's first register is its inotify descriptor, not
        // a directory: it stays.
        let Some(Call::InotifyAddWatch { at, .. }) = Call::decode(libc::SYS_inotify_add_watch, a) else {
            panic!("inotify_add_watch");
        };
        assert_eq!(
            Regs {
                nr: libc::SYS_inotify_add_watch,
                a
            }
            .with_path(at, p)
            .a,
            [5, p.as_ptr() as i64, 7, 0x2000, 0, 0]
        );
    }

    #[test]
    fn int_arguments_are_the_low_32_bits() {
        let a = [(1 << 32) | 3, 0, 0, 0, 0, 0];
        assert_eq!(Call::decode(libc::SYS_close, a), Some(Call::Close { fd: Fd(3) }));
        let at = [(1 << 32) | i64::from(libc::AT_FDCWD as u32), 0x1000, 0, 0, 0, 0];
        let Some(Call::Open { at, .. }) = Call::decode(libc::SYS_openat, at) else {
            panic!("openat");
        };
        assert_eq!(at.dirfd, libc::AT_FDCWD);
    }
}
