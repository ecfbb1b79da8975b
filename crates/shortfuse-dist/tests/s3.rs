//! Blocks in a real S3 server (shortfuse-s3, s3s-fs over a directory, on a
//! loopback port in this process): the block store's operations, a
//! client's fsync as completed PUTs, and what an unreachable or misnamed
//! store does.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use shortfuse::{Errno, Filesystem};
use shortfuse_dist::blocks::BlockStore;
use shortfuse_dist::proto::Gfi;
use shortfuse_dist::server::{DistServer, ServerConfig};
use shortfuse_s3::{S3Config, S3Server};
use support::{client, create, lookup, pattern, read, write, FH, REQ};

const BUCKET: &str = "distfs";

struct S3 {
    server: S3Server,
    root: PathBuf,
}

impl S3 {
    fn start(root: &Path) -> S3 {
        let server = S3Server::start(S3Config {
            root: root.to_path_buf(),
            listen: "127.0.0.1:0".parse().unwrap(),
            buckets: vec![BUCKET.into()],
            credentials: Some(("key".into(), "secret".into())),
        })
        .unwrap();
        S3 {
            server,
            root: root.to_path_buf(),
        }
    }

    fn url(&self) -> String {
        format!("http://key:secret@{}/{BUCKET}", self.server.addr())
    }

    /// The object as the S3 server keeps it on disk.
    fn object(&self, gfi: Gfi, index: u64) -> Option<Vec<u8>> {
        std::fs::read(self.root.join(BUCKET).join(format!("{}/{}/{index}", gfi.node, gfi.ino))).ok()
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn block_store_on_s3() {
    let dir = tempfile::tempdir().unwrap();
    let s3 = S3::start(dir.path());
    let rt = rt();
    let s = BlockStore::s3(&s3.url(), 8).unwrap();
    rt.block_on(s.probe()).unwrap();
    let f = Gfi { node: 1, ino: 2 };
    rt.block_on(s.put(f, vec![(0, b"abcdefgh".to_vec()), (2, b"xyz".to_vec())], true))
        .unwrap();
    // A completed put is in the server's store, not in a cache of ours.
    assert_eq!(s3.object(f, 0).as_deref(), Some(&b"abcdefgh"[..]));
    assert_eq!(s3.object(f, 2).as_deref(), Some(&b"xyz"[..]));
    assert_eq!(
        rt.block_on(s.get(f, 0, 3)).unwrap(),
        vec![Some(b"abcdefgh".to_vec()), None, Some(b"xyz".to_vec())]
    );
    assert_eq!(rt.block_on(s.put(f, vec![(0, vec![0; 9])], false)), Err(Errno::EINVAL));
    rt.block_on(s.truncate(f, 19, 5)).unwrap();
    assert_eq!(
        rt.block_on(s.get(f, 0, 3)).unwrap(),
        vec![Some(b"abcde".to_vec()), None, None]
    );
    assert_eq!(s3.object(f, 2), None);
    // Another file's blocks are not touched by removing this one.
    let g = Gfi { node: 1, ino: 20 };
    rt.block_on(s.put(g, vec![(0, b"other".to_vec())], false)).unwrap();
    rt.block_on(s.remove_file(f)).unwrap();
    assert_eq!(rt.block_on(s.get(f, 0, 1)).unwrap(), vec![None]);
    assert_eq!(rt.block_on(s.get(g, 0, 1)).unwrap(), vec![Some(b"other".to_vec())]);
}

#[test]
fn a_store_that_cannot_serve_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let s3 = S3::start(dir.path());
    let addr = s3.server.addr();
    let rt = rt();
    let probe = |url: &str| {
        rt.block_on(BlockStore::s3(url, 4096).unwrap().probe())
            .unwrap_err()
            .to_string()
    };
    assert!(probe(&format!("http://key:wrong@{addr}/{BUCKET}")).contains("403"));
    assert!(probe(&format!("http://{addr}/{BUCKET}")).contains("403"), "unsigned");
    assert!(probe(&format!("http://key:secret@{addr}/nosuchbucket")).contains("NoSuchBucket"));
    for bad in ["ftp://h/b", "http://h", "http://h/b/c", "http://h/b?x=1", "not a url"] {
        let e = BlockStore::s3(bad, 4096).err().unwrap();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{bad}");
    }
    // The password is not shown.
    let e = BlockStore::s3("http://key:hidden@h/b/c", 4096)
        .err()
        .unwrap()
        .to_string();
    assert!(!e.contains("hidden") && e.contains("key:***@h"), "{e}");
    // A server that is gone fails within the retry budget, not object_store's minutes.
    drop(s3);
    let start = Instant::now();
    assert!(!probe(&format!("http://key:secret@{addr}/{BUCKET}")).is_empty());
    assert!(start.elapsed() < Duration::from_secs(20), "{:?}", start.elapsed());
}

fn dist_server(data: &Path, s3: &S3) -> DistServer {
    let mut cfg = ServerConfig::new(data.to_path_buf(), "127.0.0.1:0".parse().unwrap());
    cfg.block_size = 4096;
    cfg.s3 = Some(s3.url());
    DistServer::start(cfg).unwrap()
}

#[test]
fn fsync_is_completed_puts_and_another_client_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let s3 = S3::start(&dir.path().join("s3"));
    let s = dist_server(&dir.path().join("data"), &s3);
    assert!(!dir.path().join("data/blocks").exists(), "blocks go to S3 only");
    let a = client(&s);
    let node = create(&a, "f");
    let data = pattern(3, 10_000);
    write(&a, node, 0, &data);
    let gfi = a.gfi(node).unwrap();
    // Write-back: the bytes are in a's cache, not in S3.
    assert_eq!(s3.object(gfi, 0), None);
    a.fsync(&REQ, node, FH, false).unwrap();
    let stored: Vec<u8> = (0..3).flat_map(|i| s3.object(gfi, i).unwrap()).collect();
    assert_eq!(stored, data);
    let b = client(&s);
    assert_eq!(read(&b, lookup(&b, "f"), 0, 20_000), data);
}

#[test]
fn unreachable_storage_fails_the_fsync_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let s3 = S3::start(&dir.path().join("s3"));
    let s = dist_server(&dir.path().join("data"), &s3);
    let a = client(&s);
    let node = create(&a, "f");
    write(&a, node, 0, b"never stored");
    drop(s3);
    let start = Instant::now();
    assert_eq!(a.fsync(&REQ, node, FH, false), Err(Errno::EIO));
    assert!(start.elapsed() < Duration::from_secs(30), "{:?}", start.elapsed());
}
