//! System calls the shim does not serve that are given a pointer into
//! page 0, where the trampoline lives (see `zpoline`): natively nothing is
//! mapped there and the kernel's copy from user memory fails with EFAULT;
//! under the shim the kernel would read the trampoline's bytes instead (a
//! `memfd_create(NULL, 0)` would name its file after them). The entry
//! hands these calls to the hook (`mark_slow_calls`), which answers EFAULT
//! for them as the kernel would, before they reach it.
//!
//! Only calls whose pointer is read before any other check can fail are
//! listed (a null pointer is EFAULT whoever asks), and only the arguments
//! that must point somewhere (a null `mount` source or type is allowed);
//! fcntl's lock commands too, whose `struct flock` comes first.
//! The calls the shim serves check their pointers themselves (`user`).

/// (system call, bit i set: argument i must point into mapped memory).
const MANDATORY: &[(i64, u8)] = &[
    (libc::SYS_memfd_create, 0b1),
    (libc::SYS_mq_open, 0b1),
    (libc::SYS_mq_unlink, 0b1),
    (libc::SYS_chroot, 0b1),
    (libc::SYS_mount, 0b10),
    (libc::SYS_add_key, 0b1),
    (libc::SYS_request_key, 0b1),
    (libc::SYS_uname, 0b1),
    (libc::SYS_sysinfo, 0b1),
    (libc::SYS_nanosleep, 0b1),
];

/// The numbers the entry must hand to the hook.
pub fn calls() -> impl Iterator<Item = i64> {
    MANDATORY.iter().map(|&(nr, _)| nr)
}

/// Whether call `nr` with arguments `a` names page 0 where it must name
/// memory: it then fails with EFAULT.
pub fn faults(nr: i64, a: &[i64; 6]) -> bool {
    let page = crate::zpoline::PAGE as i64;
    if nr == libc::SYS_fcntl {
        // A lock command reads (or fills) the `struct flock` its third
        // argument points to before anything else.
        let lock = [
            libc::F_GETLK,
            libc::F_SETLK,
            libc::F_SETLKW,
            libc::F_OFD_GETLK,
            libc::F_OFD_SETLK,
            libc::F_OFD_SETLKW,
        ];
        return lock.contains(&(a[1] as i32)) && (0..page).contains(&a[2]);
    }
    let Some(&(_, mask)) = MANDATORY.iter().find(|&&(n, _)| n == nr) else {
        return false;
    };
    (0..6).any(|i| mask & (1 << i) != 0 && (0..page).contains(&a[i]))
}
