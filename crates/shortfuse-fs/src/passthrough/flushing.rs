//! Whether a write-back mount needs FLUSH at all.
//!
//! Under `writeback_cache` the kernel ignores `FOPEN_NOFLUSH` and sends a
//! FLUSH on every `close(2)`, read-only or not, and waits for it: one more
//! round trip than a default mount's open+close. It writes the file's dirty
//! pages back before it looks at whether FLUSH is wanted, so the data reach
//! the daemon at close either way; what FLUSH adds here is only the close
//! of a duplicate, which reports a source's deferred write errors (NFS).
//! Where no file of the mount can have such errors, answering the first
//! FLUSH with ENOSYS makes the kernel send none again.

use std::os::fd::BorrowedFd;

use super::sys;

/// True when no file served from `root` reports anything at close: the
/// source is a local file system (see [`sys::close_reports_nothing`]) and
/// nothing is mounted beneath it, or the mount does not cross into what is
/// (`one_file_system`). Anything unreadable counts as "may report".
pub fn close_reports_nothing_beneath(root: BorrowedFd<'_>, one_file_system: bool) -> bool {
    if !sys::close_reports_nothing(root) {
        return false;
    }
    if one_file_system {
        return true;
    }
    let Ok(path) = sys::readlink_path(sys::ProcPath::new(root).as_cstr()) else {
        return false;
    };
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    !has_mount_beneath(&mountinfo, &path)
}

/// Whether a mount point in `mountinfo` (the text of /proc/self/mountinfo)
/// lies strictly beneath `dir`.
fn has_mount_beneath(mountinfo: &str, dir: &[u8]) -> bool {
    // mountinfo writes these four bytes as octal escapes.
    let mut prefix = Vec::with_capacity(dir.len() + 1);
    for &b in dir {
        match b {
            b' ' | b'\t' | b'\n' | b'\\' => prefix.extend_from_slice(format!("\\{b:03o}").as_bytes()),
            _ => prefix.push(b),
        }
    }
    if !prefix.ends_with(b"/") {
        prefix.push(b'/');
    }
    mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .any(|point| point.len() > prefix.len() && point.as_bytes().starts_with(&prefix))
}

#[cfg(test)]
mod tests {
    use super::has_mount_beneath;

    const INFO: &str = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
40 22 0:35 / /srv/data/nfs rw,relatime shared:20 - nfs4 host:/x rw
41 22 0:36 / /srv/my\\040dir/sub rw,relatime shared:21 - tmpfs tmpfs rw
";

    #[test]
    fn a_mount_point_below_the_source_is_found() {
        assert!(has_mount_beneath(INFO, b"/srv/data"));
        assert!(has_mount_beneath(INFO, b"/srv"));
        assert!(has_mount_beneath(INFO, b"/srv/my dir"));
    }

    #[test]
    fn the_source_itself_and_its_neighbours_are_not_beneath() {
        assert!(!has_mount_beneath(INFO, b"/srv/data/nfs"));
        assert!(!has_mount_beneath(INFO, b"/srv/dat"));
        assert!(!has_mount_beneath(INFO, b"/srv/other"));
    }
}
