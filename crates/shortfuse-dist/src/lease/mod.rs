//! The lease manager as the server uses it: embedded ([`LeaseManager`],
//! state in memory and a local file) or on etcd ([`EtcdLeases`], state
//! shared by every agent of a scale-out file system). One enum rather than
//! a trait: the etcd side is async, the embedded one is not, and the
//! server's few call sites await either.

pub mod embedded;
pub mod etcd;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use shortfuse::Result;

use crate::proto::{ClientId, Gfi, LeaseMode, ServerMsg, NO_LEASE};
use embedded::LeaseManager;
use etcd::EtcdLeases;
use tokio::sync::mpsc;

/// Where revocations for a session go (its connection's writer).
pub type RevokeSender = mpsc::UnboundedSender<ServerMsg>;

/// Whether ending a session through the connection whose revocations go to
/// `ending` (or unconditionally: `None`) ends the session that now sends
/// them to `current`: a session resumed on a newer connection outlives the
/// old one.
pub(crate) fn ends_session(current: &RevokeSender, ending: Option<&RevokeSender>) -> bool {
    ending.is_none_or(|r| current.same_channel(r))
}

pub enum Leases {
    Local(Arc<LeaseManager>),
    Etcd(Arc<EtcdLeases>),
}

/// Running I/O under a lease (see [`LeaseManager::begin_io`]).
pub enum IoGuard {
    Local(#[allow(dead_code)] embedded::IoGuard),
    Etcd(#[allow(dead_code)] etcd::IoGuard),
}

impl Leases {
    pub fn ttl(&self) -> Duration {
        match self {
            Leases::Local(m) => m.ttl(),
            Leases::Etcd(m) => m.ttl(),
        }
    }

    pub async fn open_session(&self, revokes: RevokeSender) -> Result<ClientId> {
        match self {
            Leases::Local(m) => m.open_session(revokes),
            Leases::Etcd(m) => m.open_session(revokes).await,
        }
    }

    pub async fn resume(&self, client: ClientId, revokes: RevokeSender) -> Result<ClientId> {
        match self {
            Leases::Local(m) => m.resume(client, revokes),
            Leases::Etcd(m) => m.resume(client, revokes).await,
        }
    }

    pub fn resend_revocations(&self, client: ClientId) {
        match self {
            Leases::Local(m) => m.resend_revocations(client),
            Leases::Etcd(m) => m.resend_revocations(client),
        }
    }

    pub async fn renew(&self, client: ClientId) -> Result<()> {
        match self {
            Leases::Local(m) => m.renew(client),
            Leases::Etcd(m) => m.renew(client).await,
        }
    }

    pub async fn end_connection(&self, client: ClientId, revokes: &RevokeSender) {
        match self {
            Leases::Local(m) => m.end_connection(client, revokes),
            Leases::Etcd(m) => m.end_connection(client, revokes).await,
        }
    }

    pub async fn acquire(&self, client: ClientId, gfi: Gfi, mode: LeaseMode) -> Result<u64> {
        match self {
            Leases::Local(m) => m.acquire(client, gfi, mode).await,
            Leases::Etcd(m) => m.acquire(client, gfi, mode).await,
        }
    }

    pub async fn release(&self, client: ClientId, gfi: Gfi, lease: u64) {
        match self {
            Leases::Local(m) => m.release(client, gfi, lease),
            Leases::Etcd(m) => m.release(client, gfi, lease).await,
        }
    }

    /// See [`LeaseManager::step_down`]. The etcd manager never asks a
    /// writer to step down (it revokes), so there a step-down changes
    /// nothing: the write lease stays, which covers reading.
    pub async fn step_down(&self, client: ClientId, gfi: Gfi, lease: u64) {
        match self {
            Leases::Local(m) => m.step_down(client, gfi, lease),
            Leases::Etcd(_) => {}
        }
    }

    pub async fn begin_io(&self, client: ClientId, gfi: Gfi, lease: u64, write: bool) -> Result<IoGuard> {
        Ok(match self {
            Leases::Local(m) => IoGuard::Local(m.begin_io(client, gfi, lease, write)?),
            Leases::Etcd(m) => IoGuard::Etcd(m.begin_io(client, gfi, lease, write).await?),
        })
    }

    /// [`Leases::begin_io`], or nothing for unleased I/O ([`NO_LEASE`]).
    pub async fn begin_io_unless_unleased(
        &self,
        client: ClientId,
        gfi: Gfi,
        lease: u64,
        write: bool,
    ) -> Result<Option<IoGuard>> {
        if lease == NO_LEASE {
            return Ok(None);
        }
        self.begin_io(client, gfi, lease, write).await.map(Some)
    }

    pub fn open_file(&self, client: ClientId, gfi: Gfi) -> Result<()> {
        match self {
            Leases::Local(m) => m.open_file(client, gfi),
            Leases::Etcd(m) => m.open_file(client, gfi),
        }
    }

    pub async fn close_file(&self, client: ClientId, gfi: Gfi) -> Result<bool> {
        match self {
            Leases::Local(m) => Ok(m.close_file(client, gfi)),
            Leases::Etcd(m) => Ok(m.close_file(client, gfi)),
        }
    }

    /// Whether a client of this server holds `gfi` open; the embedded
    /// manager also keeps its openers across restarts from now on (it is
    /// about to be an orphan). On etcd, other agents' opens are the
    /// metadata service's open marks.
    pub fn pin_if_open(&self, gfi: Gfi) -> Result<bool> {
        match self {
            Leases::Local(m) => m.pin_if_open(gfi),
            Leases::Etcd(m) => Ok(m.is_open(gfi)),
        }
    }

    /// Whether a client of this server holds `gfi` open.
    pub fn is_open(&self, gfi: Gfi) -> bool {
        match self {
            Leases::Local(m) => m.is_open(gfi),
            Leases::Etcd(m) => m.is_open(gfi),
        }
    }

    pub fn take_closed(&self) -> Vec<Gfi> {
        match self {
            Leases::Local(m) => m.take_closed(),
            Leases::Etcd(m) => m.take_closed(),
        }
    }

    pub async fn sweep(&self) {
        match self {
            Leases::Local(m) => m.sweep(),
            Leases::Etcd(m) => m.sweep().await,
        }
    }

    pub fn freeze(&self) {
        match self {
            Leases::Local(m) => m.freeze(),
            Leases::Etcd(m) => m.freeze(),
        }
    }

    /// The holders of `gfi` and the mode (for tests and diagnostics).
    pub async fn holders(&self, gfi: Gfi) -> Result<(Option<LeaseMode>, HashSet<ClientId>)> {
        match self {
            Leases::Local(m) => Ok(m.holders(gfi)),
            Leases::Etcd(m) => m.holders(gfi).await,
        }
    }
}
