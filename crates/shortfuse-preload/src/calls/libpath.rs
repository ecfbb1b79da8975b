//! LD_LIBRARY_PATH entries that name directories of a mount.
//!
//! The dynamic loader looks for a program's libraries before the shim is
//! loaded, with the kernel's system calls: a directory of a mount is not
//! there for it. Relative entries (`LD_LIBRARY_PATH=.`) already work where
//! the mount has a backing directory, since the kernel's current directory
//! is then the backing one (`kernel_cwd_inside`). An absolute entry inside
//! such a mount gets the backing directory added right after it in the
//! environment exec hands the new image, and the value the program set is
//! kept in [`SAVED_VAR`]; the new image's shim puts it back ([`restore`])
//! once the loader is done, so the program sees its own value.

use crate::state;

/// The environment variable that carries the program's own value.
pub const SAVED_VAR: &str = "SHORTFUSE_LD_LIBRARY_PATH";

const NAME: &[u8] = b"LD_LIBRARY_PATH=";

/// For an environment string `LD_LIBRARY_PATH=...` with an absolute entry
/// in a mount with a backing directory: (the string for the loader, the
/// [`SAVED_VAR`] string keeping the program's value). `None`: no change.
pub fn for_loader(entry: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    let value = entry.strip_prefix(NAME)?;
    let st = state();
    let mut out = NAME.to_vec();
    let mut changed = false;
    let dirs: Vec<&[u8]> = value.split(|&b| b == b':').collect();
    for (i, dir) in dirs.iter().enumerate() {
        if i > 0 {
            out.push(b':');
        }
        out.extend_from_slice(dir);
        if !dir.starts_with(b"/") {
            continue;
        }
        let norm = shortfuse_vfs::normalize(dir);
        let Some((src, rest)) = st.mounts.iter().find_map(|m| Some((m.source()?, m.strip(&norm)?))) else {
            continue;
        };
        let mut backing = src.strip_suffix(b"/").unwrap_or(src).to_vec();
        if !rest.is_empty() {
            backing.push(b'/');
            backing.extend_from_slice(rest);
        }
        if dirs.get(i + 1) != Some(&backing.as_slice()) {
            out.push(b':');
            out.extend_from_slice(&backing);
            changed = true;
        }
    }
    if !changed {
        return None;
    }
    let mut saved = format!("{SAVED_VAR}=").into_bytes();
    saved.extend_from_slice(value);
    Some((out, saved))
}

/// Puts back the program's own LD_LIBRARY_PATH after the loader used the
/// one [`for_loader`] made (the loader keeps its copy for dlopen).
pub fn restore() {
    if let Some(v) = std::env::var_os(SAVED_VAR) {
        std::env::set_var("LD_LIBRARY_PATH", v);
        std::env::remove_var(SAVED_VAR);
    }
}
