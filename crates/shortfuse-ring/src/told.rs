//! What a daemon's welcome tells a process that it needs before its first
//! request: the source directory the file system mirrors and whether the
//! namespace map was granted. A process that connected hands it to the
//! images it execs (`shortfuse run` to the first), which then set their
//! mount up from it without connecting: a process that never makes a
//! request never costs the daemon a connection (a thread per queue, a
//! region of several megabytes, the handshake), and one that makes its
//! first later connects then.
//!
//! An image re-checks what it was told as the daemon's client does: the
//! source must be the same directory (device and inode) at that path for
//! it, and it opens the namespace map's root itself from that path, with
//! its own permissions, so it can reach nothing the daemon would not have
//! granted it. The daemon grants the map to its own user only, so only an
//! image whose effective user is that user makes one.

use std::os::fd::AsFd;
use std::sync::Arc;

use crate::sys;

/// What a welcome told about one mount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Told {
    /// The directory the daemon's file system mirrors, as this process
    /// found it: path, device and inode numbers.
    pub source: Option<(Vec<u8>, u64, u64)>,
    /// The namespace map, granted (its root being the source directory):
    /// whether mounts below the root are left out, and the only fsuid it
    /// serves.
    pub names: Option<(bool, u32)>,
}

impl Told {
    /// The source directory's path, when this process finds the same
    /// directory there.
    pub fn source_here(&self) -> Option<&[u8]> {
        let (path, dev, ino) = self.source.as_ref()?;
        sys::same_dir(path, *dev, *ino).then_some(path.as_slice())
    }

    /// The namespace map for a process whose effective user is `euid`, its
    /// root opened here from the source path and placed where the client's
    /// own descriptors go (see [`crate::keep_descriptors_from`]); `None`
    /// when it was not granted, is not for this user, or the path no longer
    /// leads to the same directory.
    pub fn namespace_map(&self, euid: u32) -> Option<(shortfuse::NamespaceMap, u32)> {
        let (no_xdev, uid) = self.names?;
        let (path, dev, ino) = self.source.as_ref()?;
        if uid != euid {
            return None;
        }
        let root = crate::client::kept(sys::open_dir(path).ok()?);
        (sys::dir_id(root.as_fd()) == Some((*dev, *ino))).then(|| {
            let map = shortfuse::NamespaceMap {
                root: Arc::new(root),
                no_xdev,
            };
            (map, uid)
        })
    }

    /// Whether a daemon that says this now serves a mount `set_up` from
    /// what another welcome told: the same source directory, and a
    /// namespace map granted as the mount uses it. (A map not granted now
    /// is one for another user: the process left the daemon's, and its
    /// calls no longer use the map.)
    pub fn agrees_with(&self, set_up: &Told) -> bool {
        let same_map = match (self.names, set_up.names) {
            (Some(now), Some(then)) => now == then,
            _ => true,
        };
        self.source == set_up.source && same_map
    }

    /// One mount's entry of [`encode`]: `hex(path),dev,ino,granted,no_xdev,uid`
    /// (an empty path: no source).
    fn to_field(&self) -> String {
        let (path, dev, ino) = self
            .source
            .as_ref()
            .map_or((&[][..], 0, 0), |(p, d, i)| (&p[..], *d, *i));
        let (granted, no_xdev, uid) = self.names.map_or((0, 0, 0), |(x, u)| (1, u8::from(x), u));
        format!("{},{dev},{ino},{granted},{no_xdev},{uid}", hex(path))
    }

    fn from_field(s: &str) -> Option<Told> {
        let f: Vec<&str> = s.split(',').collect();
        let [path, dev, ino, granted, no_xdev, uid] = f[..] else {
            return None;
        };
        let path = unhex(path)?;
        let source = (!path.is_empty()).then(|| Some((path, dev.parse().ok()?, ino.parse().ok()?)));
        let names = match granted {
            "0" => None,
            "1" => Some((no_xdev == "1", uid.parse().ok()?)),
            _ => return None,
        };
        Some(Told {
            source: source.flatten(),
            names,
        })
        .filter(|t| t.names.is_none() || t.source.is_some())
    }
}

/// The environment variable carrying what the welcomes told, by mount
/// point (see [`encode`]).
pub const TOLD_VAR: &str = "SHORTFUSE_RING_TOLD";

/// `hex(mountpoint)=` and a [`Told`] for each mount, separated by `;`
/// (hexadecimal: a path may hold any byte but NUL).
pub fn encode(told: &[(Vec<u8>, Told)]) -> String {
    let items: Vec<String> = told
        .iter()
        .map(|(mp, t)| format!("{}={}", hex(mp), t.to_field()))
        .collect();
    items.join(";")
}

/// What [`encode`] wrote about mount point `mp` (normalised as it was
/// there); `None` when it says nothing of it, or nothing that makes sense.
pub fn decode_for(s: &str, mp: &[u8]) -> Option<Told> {
    s.split(';').find_map(|item| {
        let (m, t) = item.split_once('=')?;
        (unhex(m)? == mp).then(|| Told::from_field(t))?
    })
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_was_told_travels_by_mount_point() {
        let a = Told {
            source: Some((b"/srv/a;b=c,d".to_vec(), 2049, 77)),
            names: Some((true, 1000)),
        };
        let b = Told {
            source: None,
            names: None,
        };
        let s = encode(&[(b"/mnt/a".to_vec(), a.clone()), (b"/mnt/b".to_vec(), b.clone())]);
        assert_eq!(decode_for(&s, b"/mnt/a"), Some(a));
        assert_eq!(decode_for(&s, b"/mnt/b"), Some(b));
        assert_eq!(decode_for(&s, b"/mnt/c"), None);
        // A map without a source, or garbage, says nothing.
        assert_eq!(decode_for(&format!("{}=,0,0,1,0,5", hex(b"/m")), b"/m"), None);
        assert_eq!(decode_for("zz=1,2", b"/m"), None);
    }
}
