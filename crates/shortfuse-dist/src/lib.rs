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
//! [`lease::LeaseManager`] and [`meta::Meta`] are the interfaces both
//! implement.

#![deny(unsafe_code)]

pub mod blocks;
pub mod check;
pub mod client;
mod conn;
pub mod etcdmeta;
pub mod lease;
pub mod lease_backend;
pub mod lease_etcd;
pub mod meta;
pub mod metadata;
pub mod proto;
#[allow(unsafe_code)]
pub mod server;
pub mod testutil;
pub mod versions;
