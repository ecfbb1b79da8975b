//! The connection to the server: opened on first use, reopened after a
//! loss while leases are held, resuming the lease session (see the
//! module docs of [`super`], "Reconnection").

use shortfuse::sync::lock;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use shortfuse::{Errno, Result};

use super::config::RECONNECT_WAIT;
use super::Inner;
use crate::conn::{Conn, Event};
use crate::proto::{ClientId, Reply, Request as Req, NO_LEASE};

impl Inner {
    pub(super) fn conn(&self) -> Result<Arc<Conn>> {
        let mut slot = lock(&self.conn);
        if let Some(c) = slot.as_ref() {
            if !c.is_dead() {
                return Ok(c.clone());
            }
        }
        // A server that is down or restarting: wait for it, bounded, before
        // failing the call (as sftp's reconnect), saying so once.
        let lost = slot.is_some();
        let deadline = Instant::now() + RECONNECT_WAIT;
        let mut said = false;
        loop {
            match self.open_conn(&mut slot) {
                Ok(c) => {
                    if lost {
                        self.figures.reconnections.fetch_add(1, Ordering::Relaxed);
                    }
                    if lost || said {
                        tracing::info!(
                            "distfs: reconnected to the server at {} (session {:?})",
                            self.cfg.addr,
                            c.client
                        );
                    }
                    return Ok(c);
                }
                Err(e) if Instant::now() >= deadline => {
                    tracing::error!(
                        "distfs: the server at {} is unreachable ({e}) after {RECONNECT_WAIT:?}: the call fails with \
                         ENOTCONN (the next one tries again)",
                        self.cfg.addr
                    );
                    return Err(Errno::ENOTCONN);
                }
                Err(e) => {
                    if !said {
                        tracing::warn!(
                            "distfs: cannot reach the server at {} ({e}); retrying for up to {RECONNECT_WAIT:?}",
                            self.cfg.addr
                        );
                        said = true;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    }

    /// One attempt at a new connection (resuming the lease session), put in
    /// `slot`.
    pub(super) fn open_conn(&self, slot: &mut MutexGuard<'_, Option<Arc<Conn>>>) -> std::io::Result<Arc<Conn>> {
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        let me = self.me.clone();
        let resume = match self.session.load(Ordering::Acquire) {
            0 => None,
            c => Some(ClientId(c)),
        };
        let conn = Conn::open(
            &self.cfg.addr,
            &self.cfg.name,
            generation,
            resume,
            Box::new(move |ev| {
                let Some(inner) = me.upgrade() else { return };
                // Both may wait (for running I/O, for the server): never on
                // the reader thread, which must keep reading.
                let _ = match ev {
                    Event::Revoke { gfi, lease, step_down } => {
                        let revokers = inner.revokers.clone();
                        revokers.run(Box::new(move || inner.revoke(gfi, lease, step_down, generation)))
                    }
                    Event::Closed => {
                        tracing::warn!("distfs: connection to the server at {} lost", inner.cfg.addr);
                        std::thread::Builder::new()
                            .name("distfs-reconnect".into())
                            .spawn(move || inner.reconnect())
                            .map(|_| ())
                    }
                };
            }),
        )?;
        if resume.is_some() {
            // A new session's open files were closed with the old one, and
            // a server that restarted kept only the openers of orphans: tell
            // them again. One removed meanwhile is gone (ENOENT): nothing
            // to keep.
            let open: Vec<u64> = lock(&self.files)
                .iter()
                .filter(|(_, f)| *lock(&f.opens) > 0)
                .map(|(i, _)| *i)
                .collect();
            for ino in open {
                let _ = conn.call(Req::Open { ino });
            }
        }
        self.session.store(conn.client.0, Ordering::Release);
        let bs = self.block_size.load(Ordering::Acquire);
        if bs == 0 {
            self.block_size.store(conn.block_size, Ordering::Release);
        } else if bs != conn.block_size {
            return Err(std::io::Error::other(format!(
                "the server's block size changed from {bs} to {}",
                conn.block_size
            )));
        }
        **slot = Some(conn.clone());
        Ok(conn)
    }

    /// Sends `req`. A connection can die under a request without any
    /// fault of the server's (a heartbeat found the session expired and
    /// ended it): a request that only reads is then sent again on a new
    /// one; any other may have been applied, and fails.
    pub(super) fn call(&self, req: Req) -> Result<Reply> {
        let conn = self.conn()?;
        let again = req.reads_namespace().then(|| req.clone());
        match (conn.call(req), again) {
            (Err(Errno::ENOTCONN), Some(req)) if conn.is_dead() => self.conn()?.call(req),
            (r, _) => r,
        }
    }

    /// After a lost connection: while this client holds leases, reopens it
    /// (resuming the session) until it works or the leases are past saving.
    pub(super) fn reconnect(&self) {
        if self.reconnecting.swap(true, Ordering::AcqRel) {
            return;
        }
        let Some(ttl) = lock(&self.conn).as_ref().map(|c| c.ttl) else {
            self.reconnecting.store(false, Ordering::Release);
            return;
        };
        let until = Instant::now() + ttl;
        while Instant::now() < until {
            let holding = lock(&self.files).values().any(|f| {
                f.lease
                    .try_read()
                    .map(|g| g.mode.is_some() && g.id != NO_LEASE)
                    .unwrap_or(true)
            });
            if !holding || self.conn().is_ok() {
                break;
            }
            std::thread::sleep(ttl / 20);
        }
        self.reconnecting.store(false, Ordering::Release);
    }
}
