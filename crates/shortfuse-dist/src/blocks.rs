//! Block storage: file data in fixed-size blocks, one object per block,
//! behind the `object_store` crate.
//!
//! Objects are named `{node}/{ino}/{index}` after the file's [`Gfi`]. A
//! block holds up to `block_size` bytes; a missing object is a hole (reads
//! as zeros), and a short last block ends where the file's data ends. The
//! store is any [`ObjectStore`]: the embedded server uses the local file
//! system under the data directory, and an S3-compatible store
//! ([`BlockStore::s3`]) is a different constructor, nothing else. The local
//! store does not fsync its writes, so [`BlockStore::put`] with `sync` does
//! it for that store; in S3 a block is durable once its PUT has completed,
//! so a client's fsync (its blocks put, then synced) means completed PUTs.
//!
//! Puts to the local store overwrite the block's file in place rather than
//! through `object_store`'s write-to-temporary-then-rename: on ext4 a
//! rename over an existing file starts writing the new one out at once
//! (`auto_da_alloc`), which cost milliseconds per block on a busy disk,
//! on every write-through and every write-back. In place, an unsynced
//! block torn by a machine crash can mix old and new bytes, as an
//! overwrite in a local file does; fsync'd blocks are whole.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::{self, StreamExt, TryStreamExt};
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjPath;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, PutPayload, RetryConfig};
use shortfuse::{Errno, Result};

use crate::proto::Gfi;

/// How many object requests run at once for one batch.
const PARALLEL: usize = 16;
/// Local blocks per request read or written on the server's own thread:
/// a few page-cache reads or writes take microseconds, less than handing
/// them to a blocking thread and back (which a lease move waits for, once
/// to write back the holder's blocks and once to read the next holder's).
const INLINE_BLOCKS: usize = 4;
/// How long an S3 request may keep failing (retried with backoff) before
/// the client gets EIO: a store that is down must not hang its writes for
/// object_store's default three minutes, longer than any lease.
const S3_RETRY_FOR: Duration = Duration::from_secs(4);
/// Connecting to an S3 server that does not answer (partitioned) gives up
/// after this, within [`S3_RETRY_FOR`].
const S3_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// One S3 request (a block is at most 16 MiB) fails after this.
const S3_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

pub struct BlockStore {
    store: Arc<dyn ObjectStore>,
    /// Set for the local store: where its objects are, to fsync them.
    local: Option<Arc<LocalFileSystem>>,
    block_size: u32,
}

fn store_err(e: object_store::Error) -> Errno {
    match e {
        object_store::Error::NotFound { .. } => Errno::ENOENT,
        _ => Errno::EIO,
    }
}

fn invalid(msg: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, msg)
}

/// `url` without its password, to be shown.
pub fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => url.to_string(),
    }
}

/// The S3 store that a `--s3` URL names: `http[s]://[KEY:SECRET@]HOST[:PORT]/BUCKET`,
/// path-style requests to that endpoint.
fn s3_store(url: &str) -> std::io::Result<object_store::aws::AmazonS3> {
    let bad = |why: &str| invalid(format!("S3 URL {}: {why}", redact(url)));
    let u = url::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
    if !matches!(u.scheme(), "http" | "https") || u.host_str().is_none() {
        return Err(bad("expected http[s]://[KEY:SECRET@]HOST[:PORT]/BUCKET"));
    }
    let bucket = match u
        .path_segments()
        .map(|p| p.filter(|s| !s.is_empty()).collect::<Vec<_>>())
    {
        Some(segs) if segs.len() == 1 => segs[0].to_string(),
        _ => return Err(bad("the path must be the bucket name, one segment")),
    };
    if u.query().is_some() || u.fragment().is_some() {
        return Err(bad("no query or fragment is understood"));
    }
    let decode = |s: &str| percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned();
    let retry = RetryConfig {
        backoff: BackoffConfig::default(),
        max_retries: 10,
        retry_timeout: S3_RETRY_FOR,
    };
    let mut b = AmazonS3Builder::from_env()
        .with_endpoint(u.origin().ascii_serialization())
        .with_bucket_name(bucket)
        .with_virtual_hosted_style_request(false)
        .with_retry(retry)
        // Whole client options: they replace those from the environment.
        .with_client_options(
            ClientOptions::new()
                .with_allow_http(u.scheme() == "http")
                .with_connect_timeout(S3_CONNECT_TIMEOUT)
                .with_timeout(S3_REQUEST_TIMEOUT),
        );
    if !u.username().is_empty() {
        b = b
            .with_access_key_id(decode(u.username()))
            .with_secret_access_key(decode(u.password().unwrap_or("")));
    } else if std::env::var_os("AWS_ACCESS_KEY_ID").is_none() {
        // Without keys object_store would ask a cloud metadata service for
        // some; a server without authentication takes unsigned requests.
        b = b.with_skip_signature(true);
    }
    b.build().map_err(|e| bad(&e.to_string()))
}

fn fsync_path(path: PathBuf) -> std::io::Result<()> {
    std::fs::File::open(&path)?.sync_all()?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Writes `data` as the whole content of file `path`, in place.
fn overwrite(path: &std::path::Path, data: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let open = || {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
    };
    let f = match open() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            open()?
        }
        r => r?,
    };
    f.write_all_at(data, 0)?;
    // Shorter than before (a truncation shortened the block): cut the
    // rest. Never to zero length from a longer one, which ext4 would
    // treat as a replacement and flush.
    if f.metadata()?.len() > data.len() as u64 {
        f.set_len(data.len() as u64)?;
    }
    Ok(())
}

impl BlockStore {
    /// Blocks as files under `dir`.
    pub fn local(dir: &std::path::Path, block_size: u32) -> std::io::Result<BlockStore> {
        std::fs::create_dir_all(dir)?;
        let local = Arc::new(
            LocalFileSystem::new_with_prefix(dir)
                .map_err(|e| std::io::Error::other(format!("block store {}: {e}", dir.display())))?
                .with_automatic_cleanup(true),
        );
        Ok(BlockStore {
            store: local.clone(),
            local: Some(local),
            block_size,
        })
    }

    /// Blocks in any object store (S3, GCS, memory, ...).
    pub fn new(store: Arc<dyn ObjectStore>, block_size: u32) -> BlockStore {
        BlockStore {
            store,
            local: None,
            block_size,
        }
    }

    /// Blocks in the S3 bucket that `url` names
    /// (`http[s]://[KEY:SECRET@]HOST[:PORT]/BUCKET`; credentials from the URL,
    /// else from `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`, else none:
    /// unsigned requests). Nothing is sent yet: [`BlockStore::probe`] checks
    /// that the bucket answers.
    pub fn s3(url: &str, block_size: u32) -> std::io::Result<BlockStore> {
        Ok(BlockStore::new(Arc::new(s3_store(url)?), block_size))
    }

    /// Lists a prefix that is never written: a store that is unreachable,
    /// refuses our credentials or has no such bucket fails here, at start,
    /// rather than at the first write. (A HEAD would not tell a missing
    /// bucket from a missing object.)
    pub async fn probe(&self) -> std::io::Result<()> {
        self.store
            .list_with_delimiter(Some(&ObjPath::from("distfs-probe")))
            .await
            .map(drop)
            .map_err(|e| std::io::Error::other(format!("block store: {e}")))
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    fn path(gfi: Gfi, index: u64) -> ObjPath {
        ObjPath::from(format!("{}/{}/{index}", gfi.node, gfi.ino))
    }

    fn prefix(gfi: Gfi) -> ObjPath {
        ObjPath::from(format!("{}/{}", gfi.node, gfi.ino))
    }

    /// Reads `count` blocks from `first`; `None` for a hole.
    pub async fn get(&self, gfi: Gfi, first: u64, count: u32) -> Result<Vec<Option<Vec<u8>>>> {
        if let Some(local) = self.local.as_ref().filter(|_| count as usize <= INLINE_BLOCKS) {
            return (first..first + u64::from(count))
                .map(|i| {
                    let p = local.path_to_filesystem(&Self::path(gfi, i)).map_err(store_err)?;
                    match std::fs::read(p) {
                        Ok(data) => Ok(Some(data)),
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                        Err(e) => Err(Errno::from(e)),
                    }
                })
                .collect();
        }
        stream::iter(first..first + u64::from(count))
            .map(|i| async move {
                match self.store.get(&Self::path(gfi, i)).await {
                    Ok(r) => Ok(Some(r.bytes().await.map_err(store_err)?.to_vec())),
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Err(e) => Err(store_err(e)),
                }
            })
            .buffered(PARALLEL)
            .try_collect()
            .await
    }

    /// Writes blocks (each at most one block long); with `sync` they are
    /// durable when this returns.
    pub async fn put(&self, gfi: Gfi, blocks: Vec<(u64, Vec<u8>)>, sync: bool) -> Result<()> {
        let indexes: Vec<u64> = blocks.iter().map(|(i, _)| *i).collect();
        self.put_blocks(gfi, blocks).await?;
        if sync {
            self.sync(gfi, &indexes).await?;
        }
        Ok(())
    }

    /// Makes blocks written earlier durable (missing ones are skipped: a
    /// truncation removed them).
    pub async fn sync(&self, gfi: Gfi, indexes: &[u64]) -> Result<()> {
        let Some(local) = &self.local else { return Ok(()) };
        let paths = indexes
            .iter()
            .map(|i| local.path_to_filesystem(&Self::path(gfi, *i)).map_err(store_err))
            .collect::<Result<Vec<_>>>()?;
        tokio::task::spawn_blocking(move || {
            paths.into_iter().try_for_each(|p| match fsync_path(p) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                r => r,
            })
        })
        .await
        .map_err(|_| Errno::EIO)?
        .map_err(Errno::from)
    }

    async fn put_blocks(&self, gfi: Gfi, blocks: Vec<(u64, Vec<u8>)>) -> Result<()> {
        if blocks.iter().any(|(_, b)| b.len() > self.block_size as usize) {
            return Err(Errno::EINVAL);
        }
        if let Some(local) = &self.local {
            let files = blocks
                .into_iter()
                .map(|(i, data)| Ok((local.path_to_filesystem(&Self::path(gfi, i)).map_err(store_err)?, data)))
                .collect::<Result<Vec<_>>>()?;
            let inline = files.len() <= INLINE_BLOCKS;
            let write = move || files.into_iter().try_for_each(|(p, d)| overwrite(&p, &d));
            if inline {
                return write().map_err(Errno::from);
            }
            return tokio::task::spawn_blocking(write)
                .await
                .map_err(|_| Errno::EIO)?
                .map_err(Errno::from);
        }
        stream::iter(blocks)
            .map(|(i, data)| async move {
                self.store
                    .put(&Self::path(gfi, i), PutPayload::from(Bytes::from(data)))
                    .await
                    .map_err(store_err)
            })
            .buffer_unordered(PARALLEL)
            .try_collect::<Vec<_>>()
            .await?;
        Ok(())
    }

    /// Cuts the file's data at `size`: blocks past it go, the last one is
    /// shortened, so that growing the file again reads zeros.
    pub async fn truncate(&self, gfi: Gfi, old_size: u64, size: u64) -> Result<()> {
        if size >= old_size {
            return Ok(());
        }
        let bs = u64::from(self.block_size);
        let keep = size.div_ceil(bs);
        let old_blocks = old_size.div_ceil(bs);
        stream::iter(keep..old_blocks)
            .map(|i| async move {
                match self.store.delete(&Self::path(gfi, i)).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                    Err(e) => Err(store_err(e)),
                }
            })
            .buffer_unordered(PARALLEL)
            .try_collect::<Vec<_>>()
            .await?;
        let tail = (size % bs) as usize;
        if tail != 0 {
            let last = size / bs;
            if let Some(Some(mut data)) = self.get(gfi, last, 1).await?.pop() {
                if data.len() > tail {
                    data.truncate(tail);
                    self.put(gfi, vec![(last, data)], false).await?;
                }
            }
        }
        Ok(())
    }

    /// Deletes every block of a file that no longer exists.
    pub async fn remove_file(&self, gfi: Gfi) -> Result<()> {
        let paths: Vec<ObjPath> = self
            .store
            .list(Some(&Self::prefix(gfi)))
            .map_ok(|m| m.location)
            .try_collect()
            .await
            .map_err(store_err)?;
        for p in paths {
            match self.store.delete(&p).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(store_err(e)),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn blocks_holes_truncate_remove() {
        let dir = tempfile::tempdir().unwrap();
        let s = BlockStore::local(dir.path(), 8).unwrap();
        let f = Gfi { node: 1, ino: 2 };
        s.put(f, vec![(0, b"abcdefgh".to_vec()), (2, b"xyz".to_vec())], true)
            .await
            .unwrap();
        assert_eq!(
            s.get(f, 0, 3).await.unwrap(),
            vec![Some(b"abcdefgh".to_vec()), None, Some(b"xyz".to_vec())]
        );
        assert_eq!(s.put(f, vec![(0, vec![0; 9])], false).await, Err(Errno::EINVAL));
        s.truncate(f, 19, 5).await.unwrap();
        assert_eq!(s.get(f, 0, 3).await.unwrap(), vec![Some(b"abcde".to_vec()), None, None]);
        s.remove_file(f).await.unwrap();
        assert_eq!(s.get(f, 0, 1).await.unwrap(), vec![None]);
    }

    #[tokio::test]
    async fn few_blocks_on_the_calling_thread_and_many_elsewhere_agree() {
        let dir = tempfile::tempdir().unwrap();
        let s = BlockStore::local(dir.path(), 8).unwrap();
        let f = Gfi { node: 1, ino: 3 };
        let n = 2 * INLINE_BLOCKS as u64 + 1;
        // Many at once (a blocking thread), with holes.
        let many: Vec<(u64, Vec<u8>)> = (0..n).filter(|i| i % 3 != 1).map(|i| (i, vec![i as u8; 8])).collect();
        s.put(f, many, false).await.unwrap();
        // A few at once (inline), one of them shorter than before.
        s.put(f, vec![(0, b"ab".to_vec()), (1, b"new".to_vec())], false)
            .await
            .unwrap();
        let want: Vec<Option<Vec<u8>>> = (0..n)
            .map(|i| match i {
                0 => Some(b"ab".to_vec()),
                1 => Some(b"new".to_vec()),
                i if i % 3 == 1 => None,
                i => Some(vec![i as u8; 8]),
            })
            .collect();
        assert_eq!(s.get(f, 0, n as u32).await.unwrap(), want);
        let mut one_by_one = Vec::new();
        for i in 0..n {
            one_by_one.extend(s.get(f, i, 1).await.unwrap());
        }
        assert_eq!(one_by_one, want);
    }
}
