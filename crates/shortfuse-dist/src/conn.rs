//! The client's connection to the server: requests from any thread, each
//! answered through its own channel; revocations handed to a callback.
//!
//! A reader thread takes every frame off the socket; a heartbeat thread
//! renews the lease session every quarter TTL. The client keeps its own
//! clock on its leases: they count as valid only until one TTL after the
//! last renewal that the server acknowledged was *sent* (the server's
//! expiry is counted from when it received it, which is later), so the
//! client stops trusting its cache before the manager may give the lease to
//! someone else.
//!
//! Soft timeout (DistFUSE, 4.2): once no renewal has been acknowledged for
//! half a TTL ([`Conn::soft_expired`]), the manager may be unreachable; the
//! client keeps its leases until its own clock says they are gone, but
//! writes through meanwhile, so that little dirty data is left to lose if
//! it cannot renew in time.

use shortfuse::sync::lock;
use std::collections::HashMap;
use std::io::{self, BufReader, BufWriter, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use shortfuse::{Errno, Result};

use crate::proto::{self, ClientId, ClientMsg, Gfi, Reply, Request, ServerMsg, PROTOCOL_VERSION};

/// What the server (or its absence) tells the client unasked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The manager wants this lease back; with `step_down`, a write
    /// lease may stay as a read lease ([`ServerMsg::StepDown`]).
    Revoke { gfi: Gfi, lease: u64, step_down: bool },
    /// The connection is gone (server stopped, network cut, bad frame).
    Closed,
}

/// Called on the reader thread for each [`Event`]; must not block.
pub type EventHandler = Box<dyn Fn(Event) + Send + Sync>;

/// Slack subtracted from the lease TTL on the client's clock.
const CLOCK_MARGIN_DIV: u32 = 10;

pub struct Conn {
    /// Tells this connection's leases from those of an earlier one.
    pub generation: u64,
    pub client: ClientId,
    pub block_size: u32,
    pub ttl: Duration,
    writer: Mutex<BufWriter<TcpStream>>,
    socket: TcpStream,
    pending: Mutex<HashMap<u64, SyncSender<Reply>>>,
    next_id: AtomicU64,
    dead: AtomicBool,
    valid_until: Mutex<Instant>,
    /// When the last acknowledged renewal (or the hello) was sent.
    renewed: Mutex<Instant>,
    /// Test hook: stop renewing (a client cut off from the manager).
    frozen: AtomicBool,
    /// Test hook: the heartbeat's renewals count for nothing here.
    unconfirmed: AtomicBool,
}

impl Conn {
    /// Connects, opens a lease session (or resumes session `resume`, see
    /// [`Request::Hello`]) and starts the reader and heartbeat threads.
    pub fn open(
        addr: &str,
        name: &str,
        generation: u64,
        resume: Option<ClientId>,
        on_event: EventHandler,
    ) -> io::Result<Arc<Conn>> {
        let sockaddr = addr
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("{addr}: no address")))?;
        let socket = TcpStream::connect_timeout(&sockaddr, Duration::from_secs(5))?;
        socket.set_nodelay(true)?;
        let mut reader = BufReader::new(socket.try_clone()?);
        let mut writer = BufWriter::new(socket.try_clone()?);
        let sent = Instant::now();
        proto::write_frame(
            &mut writer,
            &ClientMsg {
                id: 0,
                req: Request::Hello {
                    version: PROTOCOL_VERSION,
                    name: name.to_string(),
                    resume,
                },
            },
        )?;
        writer.flush()?;
        socket.set_read_timeout(Some(Duration::from_secs(10)))?;
        let welcome: ServerMsg = proto::read_frame(&mut reader)?;
        socket.set_read_timeout(None)?;
        let (client, block_size, ttl) = match welcome {
            ServerMsg::Reply {
                reply:
                    Reply::Welcome {
                        client,
                        block_size,
                        lease_ttl_ms,
                        ..
                    },
                ..
            } => (client, block_size, Duration::from_millis(lease_ttl_ms)),
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{addr}: not a distfs server of protocol {PROTOCOL_VERSION} ({other:?})"),
                ))
            }
        };
        let conn = Arc::new(Conn {
            generation,
            client,
            block_size,
            ttl,
            writer: Mutex::new(writer),
            socket,
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            dead: AtomicBool::new(false),
            valid_until: Mutex::new(sent + ttl - ttl / CLOCK_MARGIN_DIV),
            renewed: Mutex::new(sent),
            frozen: AtomicBool::new(false),
            unconfirmed: AtomicBool::new(false),
        });
        let weak = Arc::downgrade(&conn);
        std::thread::Builder::new()
            .name("distfs-reader".into())
            .spawn(move || read_loop(weak, reader, on_event))?;
        let weak = Arc::downgrade(&conn);
        std::thread::Builder::new()
            .name("distfs-heartbeat".into())
            .spawn(move || heartbeat_loop(weak))?;
        Ok(conn)
    }

    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Whether leases of this connection may still be trusted.
    pub fn leases_valid(&self) -> bool {
        !self.is_dead() && Instant::now() < *lock(&self.valid_until)
    }

    /// When this connection's leases stop counting on the client's clock.
    pub fn valid_until(&self) -> Instant {
        *lock(&self.valid_until)
    }

    /// Whether no renewal was acknowledged for half a TTL: writes go
    /// through (see the module docs).
    pub fn soft_expired(&self) -> bool {
        lock(&self.renewed).elapsed() >= self.ttl / 2
    }

    /// Test hook: stop heartbeats and ignore revocations, as if the
    /// manager were unreachable.
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::Release);
    }

    /// Test hook: the heartbeat goes on renewing the session on the
    /// server, but its confirmations count for nothing here, as when an
    /// agent refuses renewals while its etcd is slow: this client's clock
    /// runs out unless it renews by itself ([`Conn::renew`]).
    pub fn ignore_heartbeats(&self) {
        self.unconfirmed.store(true, Ordering::Release);
    }

    /// Ends the connection (and the leases of its session).
    pub fn kill(&self) {
        self.dead.store(true, Ordering::Release);
        let _ = self.socket.shutdown(Shutdown::Both);
        // Dropping the senders wakes every waiter with an error.
        lock(&self.pending).clear();
    }

    /// Renews the lease session now (the heartbeat does every quarter TTL):
    /// on `Ok` this connection's leases count for one more TTL from when
    /// the renewal was sent. `ETIMEDOUT` when it was not confirmed in time
    /// (an agent refuses while its etcd is too slow to vouch for the
    /// session: a missed renewal, the clock runs on), `ESTALE` when the
    /// session is gone (the connection is ended), `ENOTCONN` when frozen.
    pub fn renew(&self) -> Result<()> {
        if self.frozen.load(Ordering::Acquire) {
            return Err(Errno::ENOTCONN);
        }
        let sent = Instant::now();
        match self.call_timeout(Request::Heartbeat, self.ttl / 4) {
            Ok(_) => {
                // Renewals may overlap (heartbeat and I/O threads): the
                // clock only moves forward.
                let mut until = lock(&self.valid_until);
                *until = (*until).max(sent + self.ttl - self.ttl / CLOCK_MARGIN_DIV);
                let mut renewed = lock(&self.renewed);
                *renewed = (*renewed).max(sent);
                Ok(())
            }
            Err(Errno::ESTALE) => {
                self.kill();
                Err(Errno::ESTALE)
            }
            Err(e) => Err(e),
        }
    }

    /// Sends `req` and waits for its reply (at most `timeout`).
    pub fn call_timeout(&self, req: Request, timeout: Duration) -> Result<Reply> {
        if self.is_dead() {
            return Err(Errno::ENOTCONN);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = sync_channel(1);
        lock(&self.pending).insert(id, tx);
        if let Err(e) = self.write(id, req) {
            lock(&self.pending).remove(&id);
            return Err(e);
        }
        match rx.recv_timeout(timeout) {
            Ok(Reply::Err(e)) => Err(Errno::from_raw(e)),
            Ok(r) => Ok(r),
            Err(RecvTimeoutError::Timeout) => {
                lock(&self.pending).remove(&id);
                Err(Errno::ETIMEDOUT)
            }
            Err(RecvTimeoutError::Disconnected) => Err(Errno::ENOTCONN),
        }
    }

    /// Sends `req` without waiting for its reply (which is dropped when it
    /// comes): for requests whose outcome changes nothing here.
    pub fn send(&self, req: Request) -> Result<()> {
        if self.is_dead() {
            return Err(Errno::ENOTCONN);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.write(id, req)
    }

    /// Writes request `id`; a connection that cannot take it is ended.
    fn write(&self, id: u64, req: Request) -> Result<()> {
        let frame = proto::encode(&ClientMsg { id, req }).map_err(|_| Errno::EINVAL)?;
        let mut w = lock(&self.writer);
        if w.write_all(&frame).and_then(|()| w.flush()).is_err() {
            drop(w);
            self.kill();
            return Err(Errno::ENOTCONN);
        }
        Ok(())
    }

    /// Sends `req` with the default timeout: long enough for a lease
    /// request that waits for a dead holder to expire.
    pub fn call(&self, req: Request) -> Result<Reply> {
        self.call_timeout(req, self.ttl * 3 + Duration::from_secs(5))
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.kill();
    }
}

fn read_loop(conn: Weak<Conn>, mut reader: BufReader<TcpStream>, on_event: EventHandler) {
    loop {
        let msg: io::Result<ServerMsg> = proto::read_frame(&mut reader);
        let Some(c) = conn.upgrade() else { return };
        match msg {
            Ok(ServerMsg::Reply { id, reply }) => {
                if let Some(tx) = lock(&c.pending).remove(&id) {
                    let _ = tx.send(reply);
                }
            }
            Ok(ServerMsg::Revoke { gfi, lease }) => {
                if !c.frozen.load(Ordering::Acquire) {
                    on_event(Event::Revoke {
                        gfi,
                        lease,
                        step_down: false,
                    })
                }
            }
            Ok(ServerMsg::StepDown { gfi, lease }) => {
                if !c.frozen.load(Ordering::Acquire) {
                    on_event(Event::Revoke {
                        gfi,
                        lease,
                        step_down: true,
                    })
                }
            }
            Err(_) => {
                c.kill();
                drop(c);
                // Also when a failed write killed it first: the handler
                // decides whether a new connection is needed.
                on_event(Event::Closed);
                return;
            }
        }
    }
}

fn heartbeat_loop(conn: Weak<Conn>) {
    loop {
        let Some(c) = conn.upgrade() else { return };
        if c.is_dead() {
            return;
        }
        let period = c.ttl / 4;
        let started = Instant::now();
        if c.unconfirmed.load(Ordering::Acquire) {
            let _ = c.call_timeout(Request::Heartbeat, period);
        } else if c.renew() == Err(Errno::ESTALE) {
            // The session is gone on the server: nothing of it is valid.
            return;
        }
        drop(c);
        // Every quarter TTL, also when the server took a while to answer
        // (an agent that waited for etcd); one that did not answer at all
        // is given a pause (its queued renewals would only be refused).
        let took = started.elapsed();
        std::thread::sleep(if took >= period { period } else { period - took });
    }
}
