//! mount(8) and /etc/fstab: `shortfuse` run as `mount.fuse.shortfuse-NAME`.
//!
//! For an fstab line `SOURCE MOUNTPOINT fuse.shortfuse-NAME OPTIONS 0 0` (the
//! type a shortfuse mount shows in /proc/mounts), util-linux's mount, and
//! through it systemd's mount units, run `/sbin/mount.fuse.shortfuse-NAME
//! SOURCE MOUNTPOINT [-sfnv] [-N NS] -o OPTIONS [-t TYPE]`, as for sshfs's
//! `mount.fuse.sshfs`. `shortfuse install-helpers` makes those names links
//! to this binary, which serves as the helper when its name says so.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::filesystems;

/// The helper names, `mount.fuse.` and the type.
const PREFIX: &str = "mount.fuse.shortfuse-";

/// Options that mean something to mount(8), fstab or systemd and nothing
/// to the daemon, dropped before the mount: automounting (`auto`,
/// `noauto`), ordering and failure handling (`_netdev`, `nofail`,
/// `x-systemd.*` and every other `x-`), who may mount (`user`, `users`,
/// `owner`, `group`, `nouser`), `defaults`, `comment=`, and libfuse options
/// whose effect shortfuse has anyway or does not offer: `auto_unmount`
/// (a shortfuse daemon unmounts when stopped; a killed one is cleaned up by
/// `shortfuse umount`), `nonempty` (FUSE 3 mounts over non-empty
/// directories), the atime variants other than `noatime`, and `sync`/`async`.
pub const IGNORED: &[&str] = &[
    "defaults",
    "auto",
    "noauto",
    "_netdev",
    "nofail",
    "user",
    "users",
    "nouser",
    "owner",
    "group",
    "auto_unmount",
    "nonempty",
    "relatime",
    "strictatime",
    "nodiratime",
    "lazytime",
    "sync",
    "async",
];

fn ignored(opt: &str) -> bool {
    let key = opt.split('=').next().unwrap_or(opt);
    IGNORED.contains(&key) || key.starts_with("x-") || key == "comment"
}

/// The file system a helper name serves, when this binary runs as one.
pub fn fs_of_program(argv0: &Path) -> Option<String> {
    let name = argv0.file_name()?.to_str()?;
    name.strip_prefix(PREFIX).map(str::to_string)
}

/// What the helper's command line asks.
#[derive(Debug, PartialEq, Eq)]
struct HelperArgs {
    source: String,
    mountpoint: PathBuf,
    /// Kept for the daemon, in order.
    options: Vec<String>,
    /// `-f`: mount(8)'s fake mode, do everything but mount.
    fake: bool,
}

fn parse(args: &[OsString]) -> io::Result<HelperArgs> {
    let usage = || {
        filesystems::invalid(format!(
            "usage (as run by mount(8)): {PREFIX}NAME SOURCE MOUNTPOINT [-sfnv] [-o OPTIONS] [-t TYPE]"
        ))
    };
    let mut positional = Vec::new();
    let mut options = Vec::new();
    let mut fake = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        match s.as_ref() {
            // Their values: options, the type (known from our name), the
            // namespace mount(8) already entered for us.
            "-o" => options.extend(
                it.next()
                    .ok_or_else(usage)?
                    .to_string_lossy()
                    .split(',')
                    .filter(|o| !o.is_empty() && !ignored(o))
                    .map(str::to_string),
            ),
            "-t" | "-N" => {
                it.next().ok_or_else(usage)?;
            }
            flags if flags.starts_with('-') && flags.len() > 1 => {
                for c in flags[1..].chars() {
                    match c {
                        'f' => fake = true,
                        // sloppy, no mtab, verbose: nothing to do.
                        's' | 'n' | 'v' => {}
                        _ => return Err(usage()),
                    }
                }
            }
            _ => positional.push(a.clone()),
        }
    }
    let [source, mountpoint] = <[OsString; 2]>::try_from(positional).map_err(|_| usage())?;
    Ok(HelperArgs {
        source: source.to_string_lossy().into_owned(),
        mountpoint: PathBuf::from(mountpoint),
        options,
        fake,
    })
}

/// Runs as mount(8)'s helper for file system `fs`: mounts SOURCE on
/// MOUNTPOINT in the background and returns once the mount is live, as
/// `shortfuse mount` does.
pub fn main(fs: &str, args: &[OsString]) -> ExitCode {
    let result = parse(args).and_then(|a| {
        crate::logging::init(crate::logging::asks_debug(&a.options));
        let kind = filesystems::all()
            .find(|k| k.name == fs)
            .ok_or_else(|| filesystems::invalid(format!("no bundled file system is called {fs:?}")))?;
        if a.fake {
            return Ok(());
        }
        if kind.source.describe().is_some() {
            let paths = [PathBuf::from(&a.source), a.mountpoint];
            return crate::mount(fs, &paths, &a.options, false, shortfuse::Transport::Dev, None);
        }
        // fstab's first field is required; for a file system without a
        // source (`mem`, `null`, `none`...) it is only the name shown in
        // /proc/mounts.
        let options: Vec<String> = std::iter::once(format!("fsname={}", a.source))
            .chain(a.options)
            .collect();
        crate::mount(fs, &[a.mountpoint], &options, false, shortfuse::Transport::Dev, None)
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{PREFIX}{fs}: {e}");
            // mount(8)'s "mount failure".
            ExitCode::from(32)
        }
    }
}

/// `shortfuse install-helpers`: links `DIR/mount.fuse.shortfuse-NAME` to
/// this binary for every bundled file system, replacing older links of
/// those names (and nothing else).
pub fn install(dir: &Path) -> io::Result<()> {
    let me = std::env::current_exe()?.canonicalize()?;
    for kind in filesystems::all() {
        let link = dir.join(format!("{PREFIX}{}", kind.name));
        match std::fs::symlink_metadata(&link) {
            Ok(m) if m.file_type().is_symlink() => std::fs::remove_file(&link)?,
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} exists and is not a link; not replaced", link.display()),
                ))
            }
            Err(_) => {}
        }
        std::os::unix::fs::symlink(&me, &link)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", link.display())))?;
        println!("{} -> {}", link.display(), me.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<OsString> {
        s.split(' ').map(OsString::from).collect()
    }

    #[test]
    fn mount_8_command_lines() {
        let a = parse(&args(
            "/srv/d /mnt/d -n -o rw,defaults,nofail,noauto,_netdev,x-systemd.automount,user,kernel_cache,ro -t fuse.shortfuse-passthrough",
        ))
        .unwrap();
        assert_eq!(a.source, "/srv/d");
        assert_eq!(a.mountpoint, PathBuf::from("/mnt/d"));
        assert_eq!(a.options, ["rw", "kernel_cache", "ro"]);
        assert!(!a.fake);
        assert!(parse(&args("a b -sfv -o port=22")).unwrap().fake);
        assert!(parse(&args("a -o x")).is_err());
        assert!(parse(&args("a b -q")).is_err());
        assert_eq!(
            fs_of_program(Path::new("/sbin/mount.fuse.shortfuse-sftp")).as_deref(),
            Some("sftp")
        );
        assert_eq!(fs_of_program(Path::new("/usr/bin/shortfuse")), None);
    }
}
