//! `-o symlinks=beneath`: symbolic link targets rewritten so that the
//! kernel, following them on the caller's behalf, stays inside the mount.

/// Components of a `/`-separated byte path, empty ones dropped.
fn components(path: &[u8]) -> impl Iterator<Item = &[u8]> {
    path.split(|&b| b == b'/').filter(|c| !c.is_empty())
}

/// Rewrites `target`, stored in a link whose directory is `dir` (its
/// components from the source root), into a relative path that resolves
/// inside the root, as if the root were `/` (like `chroot`):
///
/// - the target is resolved lexically from `dir` (or from the root when it
///   is absolute); `..` at the root stays at the root;
/// - the result climbs with `..` only as far as the deepest common ancestor
///   of `dir` and the resolved target (at most to the root), then descends
///   by names only.
///
/// Why this cannot escape: the climb goes through the real parents of the
/// link's own directory and stops at or below the root; the descent holds
/// no `.` or `..`; any symlink met on the way is itself rewritten the same
/// way when the kernel reads it.
///
/// Lexical resolution differs from the kernel's when a component of the
/// target is itself a symlink followed by `..` (`sym/..` is taken as
/// nothing); that is the price of a check that needs no file-system access.
pub fn beneath(dir: &[&[u8]], target: &[u8]) -> Vec<u8> {
    let mut resolved: Vec<&[u8]> = if target.first() == Some(&b'/') {
        Vec::new()
    } else {
        dir.to_vec()
    };
    for c in components(target) {
        match c {
            b"." => {}
            b".." => {
                resolved.pop();
            }
            name => resolved.push(name),
        }
    }
    let common = dir.iter().zip(&resolved).take_while(|(a, b)| a == b).count();
    let mut out = Vec::with_capacity(target.len() + 3 * (dir.len() - common));
    for _ in common..dir.len() {
        if !out.is_empty() {
            out.push(b'/');
        }
        out.extend_from_slice(b"..");
    }
    for c in &resolved[common..] {
        if !out.is_empty() {
            out.push(b'/');
        }
        out.extend_from_slice(c);
    }
    if out.is_empty() {
        out.push(b'.');
    }
    // Keep "must be a directory" (a trailing slash) when the path ends in a name.
    if target.ends_with(b"/") && resolved.len() > common {
        out.push(b'/');
    }
    out
}

/// The components of the directory that holds the link at `link_path`
/// (from `/proc/self/fd/N`), relative to the source root `root` (also from
/// `/proc`). `None` when the link is not below the root any more (unlinked:
/// the kernel appends " (deleted)"; or moved out of the source).
pub fn link_dir<'a>(root: &[u8], link_path: &'a [u8]) -> Option<Vec<&'a [u8]>> {
    let rest = if root == b"/" {
        link_path.strip_prefix(b"/")?
    } else {
        link_path.strip_prefix(root)?.strip_prefix(b"/")?
    };
    let mut parts: Vec<&[u8]> = components(rest).collect();
    parts.pop()?;
    Some(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rw(dir: &str, target: &str) -> String {
        let dir: Vec<&[u8]> = components(dir.as_bytes()).collect();
        String::from_utf8(beneath(&dir, target.as_bytes())).unwrap()
    }

    #[test]
    fn absolute_targets_become_relative_to_the_root() {
        assert_eq!(rw("", "/etc/passwd"), "etc/passwd");
        assert_eq!(rw("a/b", "/etc/passwd"), "../../etc/passwd");
        assert_eq!(rw("a/b", "/a/b/c"), "c");
        assert_eq!(rw("a/b", "/"), "../..");
        assert_eq!(rw("", "/"), ".");
    }

    #[test]
    fn climbing_is_clamped_at_the_root() {
        assert_eq!(rw("", "../../.."), ".");
        assert_eq!(rw("a", "../../../etc"), "../etc");
        assert_eq!(rw("a/b", "../x"), "../x");
        assert_eq!(rw("a/b", "./c/./d/"), "c/d/");
        assert_eq!(rw("a/b", "c/../../../../../d"), "../../d");
    }

    #[test]
    fn link_dir_strips_the_root() {
        assert_eq!(link_dir(b"/src", b"/src/a/b/l"), Some(vec![&b"a"[..], b"b"]));
        assert_eq!(link_dir(b"/src", b"/src/l"), Some(vec![]));
        assert_eq!(link_dir(b"/", b"/a/l"), Some(vec![&b"a"[..]]));
        assert_eq!(link_dir(b"/src", b"/srcx/l"), None);
        assert_eq!(link_dir(b"/src", b"/other/l"), None);
    }
}
