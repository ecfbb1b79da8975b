//! Whose rights a daemon's kernel mount serves, and so whether the kernel
//! must check permissions itself (`default_permissions`).
//!
//! A file system that leaves the checks to the kernel needs them whenever
//! its callers' rights can differ from what it grants. A mirror (the
//! passthrough) acts on its source with the daemon's own rights, so the
//! source's own checks already are the callers' when every caller has the
//! daemon's rights, and the kernel's check then only costs: with it, each
//! change of a directory (create, unlink, rename, mkdir) makes the kernel
//! ask the daemon for that directory's attributes again before its next
//! check, one more round trip per call.
//!
//! Every caller has the daemon's rights exactly when:
//! - the mount is not `allow_other`: the kernel then lets in only processes
//!   whose real, effective and saved user and group ids are the mounting
//!   ones (the daemon's real ids);
//! - the daemon runs as that user, unprivileged: effective ids equal to the
//!   real ones, not root, no effective capability. Such callers cannot
//!   point their file-system ids anywhere else (only a privileged process
//!   can), and whatever they lack that the daemon holds is no more than
//!   their own user already gives every process of theirs, the daemon
//!   included: a supplementary group a login session started later no
//!   longer has is the one difference, as on sshfs, which never asks the
//!   kernel to check.
//!
//! A daemon running as root keeps the kernel's check even without
//! `allow_other`: its callers are root's processes, but a root process may
//! have given up capabilities (a service's `CapabilityBoundingSet`, `capsh
//! --drop`, `setpriv`) or changed its file-system ids (`setfsuid`, as file
//! servers do), and a request carries neither its capabilities nor its
//! supplementary groups, so only the kernel can check such a caller.

use shortfuse_fs::registry::FsKind;

/// What `shortfuse mount --help` says of `default_permissions` on a mirror
/// (among the defaults of `shortfuse mount FS`).
pub const MIRROR_HELP: &str = "on unless the daemon runs as an unprivileged user and the mount is not \
     allow_other: the source checks every call with the daemon's rights, which are then every caller's \
     (the kernel lets in only that user's processes, and they cannot take other ids), so the kernel's \
     own check only costs a round trip (the directory's GETATTR) after each create, unlink, mkdir or \
     rename. As root it stays on: a root process may have dropped capabilities or changed its fsuid, \
     and a request carries neither. -o default_permissions turns it on in every case";

/// The ids and privilege of the process that serves the mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DaemonRights {
    pub uid: u32,
    pub euid: u32,
    pub gid: u32,
    pub egid: u32,
    /// Holds any effective capability (a capability set that cannot be
    /// read counts as one).
    pub capable: bool,
}

impl DaemonRights {
    /// This process's.
    pub fn of_this_process() -> DaemonRights {
        let (uid, gid) = crate::sys::real_ids();
        let (euid, egid) = crate::sys::effective_ids();
        DaemonRights {
            uid,
            euid,
            gid,
            egid,
            capable: crate::sys::effective_capabilities().is_none_or(|caps| caps != 0),
        }
    }

    /// Whether every process the kernel lets into a mount that is not
    /// `allow_other` has exactly these rights on files (see the module).
    fn are_every_callers(&self) -> bool {
        self.euid != 0 && self.uid == self.euid && self.gid == self.egid && !self.capable
    }
}

/// Whether a mount of `kind` served by a daemon with `daemon`'s rights must
/// carry `default_permissions`.
pub fn kernel_checks(kind: &FsKind, allow_other: bool, daemon: DaemonRights) -> bool {
    kind.kernel_permissions && !(kind.mirror && !allow_other && daemon.are_every_callers())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(name: &str) -> &'static FsKind {
        crate::filesystems::find(name).unwrap()
    }

    const USER: DaemonRights = DaemonRights {
        uid: 1000,
        euid: 1000,
        gid: 1000,
        egid: 1000,
        capable: false,
    };

    #[test]
    fn a_mirror_served_by_its_only_user_leaves_the_checks_to_the_source() {
        assert!(!kernel_checks(kind("passthrough"), false, USER));
    }

    #[test]
    fn the_kernel_checks_wherever_a_caller_can_have_other_rights_than_the_daemon() {
        let pt = kind("passthrough");
        assert!(kernel_checks(pt, true, USER), "allow_other: other users");
        let root = DaemonRights {
            uid: 0,
            euid: 0,
            gid: 0,
            egid: 0,
            capable: true,
        };
        assert!(
            kernel_checks(pt, false, root),
            "root's callers may lack its capabilities"
        );
        assert!(
            kernel_checks(pt, false, DaemonRights { capable: false, ..root }),
            "uid 0's callers may have changed their fsuid"
        );
        assert!(kernel_checks(pt, false, DaemonRights { capable: true, ..USER }));
        assert!(
            kernel_checks(pt, false, DaemonRights { euid: 0, ..USER }),
            "set-user-id root"
        );
        assert!(kernel_checks(pt, false, DaemonRights { euid: 1001, ..USER }));
        assert!(kernel_checks(pt, false, DaemonRights { egid: 1001, ..USER }));
    }

    #[test]
    fn file_systems_that_are_no_mirror_keep_their_choice() {
        for name in ["mem", "stripe", "pack", "dist"] {
            assert!(kernel_checks(kind(name), false, USER), "{name}");
        }
        for name in ["null", "sftp"] {
            assert!(!kernel_checks(kind(name), true, USER), "{name}");
        }
    }
}
