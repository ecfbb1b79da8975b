//! distfs: a distributed file system with write-back caching and strong
//! consistency through per-file leases (DistFUSE, Li et al., 2025).
//!
//! Roles, one module each:
//! - [`lease`]: the lease manager (shared-read and exclusive-write leases
//!   per file, revocation, expiry, fencing);
//! - [`meta`]: name space and attributes, strongly consistent, persisted;
//! - [`blocks`]: file data in fixed-size blocks behind `object_store`;
//! - [`server`]: the three above in one process on TCP (the embedded mode);
//! - [`client`]: a [`shortfuse::Filesystem`] with a write-back block cache
//!   kept coherent by leases, or written through, or not kept coherent
//!   (the three consistency modes);
//! - [`check`]: the consistency checker that tells them apart.
//! - [`versions`]: the server's record of which blocks changed when, so
//!   that a client's cache outlives a lease that moves away and back.
//!
//! Files are named everywhere by their global identifier [`proto::Gfi`].
//!
//! Two deployments share these roles: the embedded one ([`server`], one
//! process on TCP) and the scale-out one (leases and metadata on etcd,
//! blocks on an S3-compatible store: `shortfuse dist up --etcd URL --s3 URL`);
//! [`lease::Leases`] and [`meta::Metadata`] are the interfaces the server
//! uses over either, each with an `embedded` and an `etcd` module.

#![deny(unsafe_code)]

pub mod blocks;
pub mod check;
pub mod client;
mod conn;
pub mod lease;
pub mod meta;
pub mod proto;
#[allow(unsafe_code)]
pub mod server;
pub mod versions;

use std::sync::Arc;

use shortfuse_fs::registry::{FsKind, Source};

/// distfs in the registry of file systems the command line builds.
pub static KIND: FsKind = FsKind {
    name: "dist",
    source: Source::Address("ADDR (host:port) of a `shortfuse dist up` server"),
    about: "distfs client: write-back cache kept strongly consistent by per-file leases",
    options: "consistency=lease|writethrough|weak, lease_hold=MS, direct_spell=MS, page_cache",
    kernel_permissions: true,
    // Not `network` for the cache: distfs caches in its client under
    // leases; pages kept in front of it would outlive a revoked lease.
    network: false,
    mirror: false,
    // Not built by the preload shim: its client runs a multi-threaded
    // runtime of its own inside the program.
    in_process: false,
    low_fds_free: false,
    mount_defaults: &[],
    build: |b| {
        let addr = b
            .source
            .ok_or_else(|| shortfuse_fs::registry::invalid("dist needs SOURCE: ADDR".into()))?;
        let cfg = client::ClientConfig::from_options(addr.to_string_lossy(), b.options)?;
        let fs = client::DistFs::new(cfg)
            .map_err(|e| std::io::Error::new(e.kind(), format!("dist {}: {e}", addr.display())))?;
        Ok(Arc::new(fs))
    },
};
