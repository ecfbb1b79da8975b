//! `shortfuse mount sftp` through the binary on /dev/fuse (needs root),
//! against a real sshd, with data verification on both sides.

mod sftp_support;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use sftp_support::Sshd;

/// The `shortfuse` binary of this build, built first when missing (a test
/// of one crate does not build another crate's binaries).
fn binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/<test> -> target/<profile>/shortfuse
    let profile_dir = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
    let bin = profile_dir.join("shortfuse");
    let target_dir = profile_dir.parent().unwrap();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "-q", "-p", "shortfuse-cli", "--bin", "shortfuse"])
        .env("CARGO_TARGET_DIR", target_dir)
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if profile_dir.file_name().is_some_and(|p| p == "release") {
        cmd.arg("--release");
    }
    let out = cmd.output().expect("running cargo build for the shortfuse binary");
    assert!(
        out.status.success(),
        "building the shortfuse binary failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(bin.exists(), "{} missing after cargo build", bin.display());
    bin
}

fn is_mounted(path: &Path) -> bool {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = path.to_str().unwrap().replace(' ', "\\040");
    text.lines().any(|l| l.split(' ').nth(4) == Some(want.as_str()))
}

struct Mount {
    bin: PathBuf,
    mp: PathBuf,
}

impl Drop for Mount {
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while is_mounted(&self.mp) && Instant::now() < deadline {
            let _ = Command::new(&self.bin).args(["umount", "-l"]).arg(&self.mp).output();
        }
        let _ = std::fs::remove_dir(&self.mp);
    }
}

fn run(bin: &Path, args: &[&str]) -> Output {
    Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running shortfuse")
}

#[test]
fn mount_sftp_through_the_cli() {
    // SAFETY: geteuid cannot fail and touches no memory.
    assert_eq!(unsafe { libc::geteuid() }, 0, "mounted tests need root");
    let s = Sshd::start();
    let bin = binary();
    let mp = s.dir.join("mnt");
    std::fs::create_dir_all(&mp).unwrap();
    let mount = Mount { bin: bin.clone(), mp };
    let mp = mount.mp.to_str().unwrap();
    let known_hosts = s.dir.join("known_hosts");
    let opts = format!(
        "port={},identity={},UserKnownHostsFile={},reconnect",
        s.port,
        s.dir.join("client_key").display(),
        known_hosts.display()
    );
    // Errors show at mount time: a wrong port.
    let out = run(
        &bin,
        &["mount", "sftp", &s.target(), mp, "-o", &format!("{opts},port=1")],
    );
    assert!(!out.status.success(), "mount to port 1 succeeded");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot connect"),
        "{out:?}"
    );
    assert!(!is_mounted(&mount.mount_path()));

    let out = run(&bin, &["mount", "sftp", &s.target(), mp, "-o", &opts]);
    assert!(
        out.status.success(),
        "mount failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(is_mounted(&mount.mount_path()));
    let m = mount.mount_path();

    // Written through the mount, read on the server, and back.
    let data: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::create_dir(m.join("dir")).unwrap();
    std::fs::write(m.join("dir/f"), &data).unwrap();
    assert!(
        std::fs::read(s.data.join("dir/f")).unwrap() == data,
        "server copy differs"
    );
    assert!(
        std::fs::read(m.join("dir/f")).unwrap() == data,
        "read through the mount differs"
    );
    // A change made on the server shows after reopening (no caching here).
    let mut changed = data.clone();
    changed[1_000_000..1_000_010].copy_from_slice(b"0123456789");
    std::fs::write(s.data.join("dir/f"), &changed).unwrap();
    let f = std::fs::File::open(m.join("dir/f")).unwrap();
    let mut buf = [0u8; 10];
    f.read_exact_at(&mut buf, 1_000_000).unwrap();
    assert_eq!(&buf, b"0123456789");
    drop(f);
    // Names: rename, symlink, listing, removal.
    std::fs::rename(m.join("dir/f"), m.join("dir/g")).unwrap();
    std::os::unix::fs::symlink("g", m.join("dir/l")).unwrap();
    assert_eq!(std::fs::read_link(s.data.join("dir/l")).unwrap(), Path::new("g"));
    let mut names: Vec<_> = std::fs::read_dir(m.join("dir"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["g", "l"]);
    assert_eq!(std::fs::metadata(m.join("dir/l")).unwrap().len(), data.len() as u64);
    std::fs::remove_file(m.join("dir/l")).unwrap();
    std::fs::remove_file(m.join("dir/g")).unwrap();
    std::fs::remove_dir(m.join("dir")).unwrap();
    assert!(!s.data.join("dir").exists());

    let out = run(&bin, &["umount", mp]);
    assert!(out.status.success(), "umount: {}", String::from_utf8_lossy(&out.stderr));
    assert!(!is_mounted(&m));
}

impl Mount {
    fn mount_path(&self) -> PathBuf {
        self.mp.clone()
    }
}
