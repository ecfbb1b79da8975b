//! The program's memory as the system calls hand it to us.
#![allow(unsafe_code)]

/// The NUL-terminated string at `p` (None for a null pointer).
pub fn cstr<'a>(p: i64) -> Option<&'a [u8]> {
    if p == 0 {
        return None;
    }
    // SAFETY: the program passed `p` as a path argument: the kernel would
    // read a NUL-terminated string there too. A bad pointer faults in the
    // program, as a bad pointer given to libc would.
    Some(unsafe { std::ffi::CStr::from_ptr(p as *const libc::c_char) }.to_bytes())
}

pub fn slice<'a>(p: i64, len: usize) -> &'a [u8] {
    if len == 0 || p == 0 {
        return &[];
    }
    // SAFETY: a buffer argument of `len` bytes, as the kernel would read it.
    unsafe { std::slice::from_raw_parts(p as *const u8, len) }
}

pub fn slice_mut<'a>(p: i64, len: usize) -> &'a mut [u8] {
    if len == 0 || p == 0 {
        return &mut [];
    }
    // SAFETY: a buffer argument of `len` bytes, as the kernel would write it.
    unsafe { std::slice::from_raw_parts_mut(p as *mut u8, len) }
}

/// Copies `v` to the program's `p`.
pub fn put<T: Copy>(p: i64, v: &T) {
    // SAFETY: `p` is the program's output struct of type T (stat, statx, ...).
    unsafe { std::ptr::write_unaligned(p as *mut T, *v) }
}

/// Copies the program's `T` at `p` (a struct flock, say).
pub fn get<T: Copy>(p: i64) -> T {
    // SAFETY: `p` is the program's input struct of type T, as the kernel
    // would read it; a bad pointer faults in the program.
    unsafe { std::ptr::read_unaligned(p as *const T) }
}

/// The `struct iovec` array at `p`.
pub fn iovecs<'a>(p: i64, n: i64) -> &'a [libc::iovec] {
    if p == 0 || n <= 0 {
        return &[];
    }
    // SAFETY: an iovec array argument of `n` entries.
    unsafe { std::slice::from_raw_parts(p as *const libc::iovec, n as usize) }
}

/// Appends the descriptors `msg` passes (SCM_RIGHTS) to `fds`.
pub fn passed_fds(msg: &libc::msghdr, fds: &mut Vec<i32>) {
    if msg.msg_control.is_null() || msg.msg_controllen < std::mem::size_of::<libc::cmsghdr>() {
        return;
    }
    // SAFETY: the program's control buffer of `msg_controllen` bytes, which
    // the kernel reads the same way; CMSG_NXTHDR stays within it.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let head = libc::CMSG_LEN(0) as usize;
                let data = libc::CMSG_DATA(c).cast::<i32>();
                let end = msg.msg_control as usize + msg.msg_controllen;
                let n = ((*c).cmsg_len.saturating_sub(head)).min(end.saturating_sub(data as usize))
                    / std::mem::size_of::<i32>();
                for i in 0..n {
                    fds.push(std::ptr::read_unaligned(data.add(i)));
                }
            }
            c = libc::CMSG_NXTHDR(msg, c);
        }
    }
}

/// A zeroed C struct (stat, statx, statfs).
pub fn zeroed<T: Copy>() -> T {
    // SAFETY: only used for plain C structs of integers, for which all-zero
    // bytes are a valid value.
    unsafe { std::mem::zeroed() }
}

/// The `i`th pointer of the NULL-terminated pointer array at `p` (argv, envp).
pub fn pointer_at(p: i64, i: usize) -> i64 {
    // SAFETY: `p` is the program's NULL-terminated array of pointers (an
    // execve argument, which the kernel would read the same way); callers
    // stop at the NULL.
    unsafe { std::ptr::read_unaligned((p as *const i64).add(i)) }
}
