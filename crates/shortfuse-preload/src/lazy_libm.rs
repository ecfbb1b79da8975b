//! The two functions of libm the shim's dependencies call (`pow` in an
//! async runtime's statistics, `log2` in big-number formatting), bound to
//! libm when first called instead of libm being loaded into every process
//! started under `shortfuse run`. The link maps `pow` and `log2` here (a
//! linker script named libm.so, see build.rs); any other libm function a
//! dependency comes to use still loads libm as before. The shim's own
//! paths call neither.
#![allow(unsafe_code)]

use core::sync::atomic::{AtomicPtr, Ordering};
use std::ffi::{c_void, CStr};

type Binary = extern "C" fn(f64, f64) -> f64;
type Unary = extern "C" fn(f64) -> f64;

static POW: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
static LOG2: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());

/// libm's `name`, from the program's libm when it has one, else from a
/// libm loaded now; kept in `slot`. Aborts when there is none: the caller
/// has no way to fail.
fn resolve(slot: &AtomicPtr<c_void>, name: &CStr) -> *mut c_void {
    let f = slot.load(Ordering::Acquire);
    if !f.is_null() {
        return f;
    }
    // SAFETY: dlopen and dlsym of a NUL-terminated library and symbol name.
    let f = unsafe {
        let lib = libc::dlopen(c"libm.so.6".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if lib.is_null() {
            core::ptr::null_mut()
        } else {
            libc::dlsym(lib, name.as_ptr())
        }
    };
    if f.is_null() {
        std::process::abort();
    }
    slot.store(f, Ordering::Release);
    f
}

#[no_mangle]
pub extern "C" fn shortfuse_libm_pow(x: f64, y: f64) -> f64 {
    // SAFETY: libm's pow has this signature.
    let f: Binary = unsafe { core::mem::transmute::<*mut c_void, Binary>(resolve(&POW, c"pow")) };
    f(x, y)
}

#[no_mangle]
pub extern "C" fn shortfuse_libm_log2(x: f64) -> f64 {
    // SAFETY: libm's log2 has this signature.
    let f: Unary = unsafe { core::mem::transmute::<*mut c_void, Unary>(resolve(&LOG2, c"log2")) };
    f(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pow_and_log2_are_libms() {
        assert_eq!(shortfuse_libm_pow(2.0, 10.0), 1024.0);
        assert_eq!(shortfuse_libm_pow(9.0, 0.5), 3.0);
        assert_eq!(shortfuse_libm_log2(1024.0), 10.0);
        assert!(shortfuse_libm_log2(-1.0).is_nan());
    }
}
