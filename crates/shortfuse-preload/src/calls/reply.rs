//! What a served call returns to the program: a value, or a negated errno.

use shortfuse::Errno;

pub fn err(e: Errno) -> i64 {
    -(e.raw() as i64)
}

pub fn res<T: Into<i64>>(r: Result<T, Errno>) -> i64 {
    match r {
        Ok(v) => v.into(),
        Err(e) => err(e),
    }
}

/// 0 for a call that returns nothing else.
pub fn done<T>(r: Result<T, Errno>) -> i64 {
    res(r.map(|_| 0i64))
}
