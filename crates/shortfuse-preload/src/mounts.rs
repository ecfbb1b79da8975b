//! The mounts named by `SHORTFUSE_MOUNTS`, each a file system built in
//! process behind a [`Vfs`].

use std::path::Path;
use std::sync::{Arc, Mutex};

use shortfuse::{Filesystem, MountOptions, Stats};
use shortfuse_vfs::{Creds, FdTable, InProcess, Vfs};

use crate::{sys, State};

fn build_fs(spec: &str) -> Result<Arc<dyn Filesystem>, String> {
    let (name, source) = match spec.split_once(':') {
        Some((n, s)) => (n, Some(s)),
        None => (spec, None),
    };
    match (name, source) {
        ("mem", None) => Ok(Arc::new(shortfuse_fs::mem::MemFs::new())),
        ("passthrough", Some(src)) => shortfuse_fs::passthrough::PassthroughFs::new(Path::new(src))
            .map(|fs| Arc::new(fs) as Arc<dyn Filesystem>)
            .map_err(|e| format!("passthrough {src}: {e}")),
        ("passthrough", None) => Err("passthrough needs a source: passthrough:/dir".into()),
        _ => Err(format!("unknown file system {spec:?} (mem, passthrough:SOURCE)")),
    }
}

pub(crate) fn build(spec: &str) -> Result<State, String> {
    let mut mounts = Vec::new();
    let creds = Creds {
        uid: sys::raw(libc::SYS_geteuid, 0, 0, 0, 0, 0, 0) as u32,
        gid: sys::raw(libc::SYS_getegid, 0, 0, 0, 0, 0, 0) as u32,
        pid: sys::raw(libc::SYS_getpid, 0, 0, 0, 0, 0, 0) as u32,
    };
    let umask = sys::raw(libc::SYS_umask, 0o022, 0, 0, 0, 0, 0);
    sys::raw(libc::SYS_umask, umask, 0, 0, 0, 0, 0);
    for (i, m) in spec.split(';').filter(|s| !s.is_empty()).enumerate() {
        let (mp, fs) = m
            .split_once('=')
            .ok_or_else(|| format!("mount {m:?}: expected MOUNTPOINT=FS"))?;
        if !mp.starts_with('/') {
            return Err(format!("mount point {mp:?} is not absolute"));
        }
        let fs = build_fs(fs)?;
        let backend = InProcess::new(fs, MountOptions::default(), Arc::new(Stats::new()));
        // A device number no disk uses: major 0 is for anonymous devices.
        let dev = 0xf5_0000 + i as u64;
        let vfs = Vfs::new(Box::new(backend), &shortfuse_vfs::normalize(mp.as_bytes()), dev, creds)
            .map_err(|e| format!("mount {mp}: {e}"))?;
        vfs.set_umask(umask as u32);
        mounts.push(Arc::new(vfs));
    }
    let cwd = std::env::current_dir()
        .map(|p| p.as_os_str().as_encoded_bytes().to_vec())
        .unwrap_or_else(|_| b"/".to_vec());
    Ok(State {
        mounts,
        fds: FdTable::new(),
        cwd: Mutex::new(None),
        host_cwd: Mutex::new(cwd),
    })
}
