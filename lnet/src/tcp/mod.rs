//! The TCP backend: real sockets through tokio.
//!
//! An endpoint listens (if it serves) and keeps up to `conns_per_peer` connections to each peer
//! it calls, spreading calls over them; a connection that failed is replaced on the next call to
//! that peer. Accepted connections are capped at `max_connections`; at the cap, a new one takes
//! the place of the connection idle longest (if idle for `displace_idle`), or is closed at once
//! and logged. Accepted connections idle for `idle_timeout` are closed.
//!
//! Every connection opens with the handshake of [`crate::auth`] (bounded by
//! `handshake_timeout`); a peer that fails it gets a refusal and nothing else, logged once per
//! address. One address may hold at most `max_per_peer` accepted connections, and at most
//! `max_connections` handshakes may be under way (the oldest gives way to a new one).
//!
//! A server may listen on several addresses (one per interface), and a caller told a peer's
//! other addresses ([`Transport::set_peer_rails`]) spreads its calls over them and turns away
//! from one that fails ([`rails`]).

mod conn;

/// The key and offset in front of the bytes a request carries (see `conn::Eager`).
const EAGER_HEAD: usize = 16;
pub mod rails;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use proto::frame::encode_request_with;
use proto::{Nid, Opcode};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

use crate::auth::{Role, Security};
use crate::error::NetError;
use crate::region::RegionTable;
use crate::service::{BoxFuture, Dispatcher, Service, DEFAULT_QUEUE_SLOTS};
use crate::transport::{check_body, Transport};
use conn::Conn;
use rails::{Rails, RAIL_CONNECT, RAIL_DEAD};

/// Limits and timeouts of a TCP endpoint.
#[derive(Clone, Debug)]
pub struct TcpConfig {
    /// Connections kept to each peer we call. More than one lets bulk transfers to one peer use
    /// both cores of a small machine.
    pub conns_per_peer: usize,
    /// Requests a server holds at once before it answers `Busy`.
    pub queue_slots: usize,
    /// Frames queued for one connection's writer.
    pub send_queue: usize,
    /// How long a connection may refuse to take our bytes before it is closed.
    pub send_timeout: Duration,
    /// How long a server waits for the data of a bulk get.
    pub bulk_timeout: Duration,
    /// Accepted connections a server keeps at once. At the cap, a new connection takes the
    /// place of the one idle longest, if that one has been idle for `displace_idle`; otherwise
    /// it is refused.
    pub max_connections: usize,
    /// How long an accepted connection must have been idle to give its place to a new one.
    pub displace_idle: Duration,
    /// An accepted connection idle this long is closed (its peer reconnects when it calls
    /// again).
    pub idle_timeout: Duration,
    /// Accepted connections one address may hold; past it, that address's idlest connection
    /// gives way (as for `max_connections`) or the new one is refused.
    pub max_per_peer: usize,
    /// How long a peer has to finish the handshake.
    pub handshake_timeout: Duration,
    /// Authentication and frame protection.
    pub security: Security,
    /// Where a server counts its requests, for its metrics endpoint.
    pub metrics: Option<Arc<crate::metrics::ServiceMetrics>>,
    /// Where a caller counts its own calls (the mount's metrics endpoint).
    pub calls: Option<Arc<crate::metrics::CallMetrics>>,
    /// Where a server counts each job's work.
    pub jobs: Option<Arc<crate::jobstats::JobTable>>,
    /// The job this endpoint's requests work for, unless their task says otherwise
    /// ([`crate::job`]).
    pub job: Option<proto::JobId>,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            conns_per_peer: 2,
            queue_slots: DEFAULT_QUEUE_SLOTS,
            send_queue: 1024,
            send_timeout: Duration::from_secs(10),
            bulk_timeout: Duration::from_secs(30),
            max_connections: 4096,
            displace_idle: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(300),
            max_per_peer: 1024,
            handshake_timeout: Duration::from_secs(10),
            security: Security::Off,
            metrics: None,
            calls: None,
            jobs: None,
            job: None,
        }
    }
}

struct Inner {
    nid: Nid,
    cfg: Arc<TcpConfig>,
    regions: Arc<RegionTable>,
    dispatcher: Option<Dispatcher>,
    peers: Mutex<HashMap<SocketAddr, Arc<PeerConns>>>,
    /// Peers reached at several addresses, by their first.
    rails: Mutex<HashMap<SocketAddr, Arc<Rails>>>,
    /// This endpoint's addresses after the first, where it listens too.
    local_rails: Vec<Nid>,
    accepted: Mutex<Vec<Weak<Conn>>>,
    accept_tasks: Mutex<Vec<AbortHandle>>,
    /// Handshakes under way, oldest first.
    handshakes: Mutex<std::collections::VecDeque<AbortHandle>>,
    /// Addresses already logged as refused (bounded): a refusal is logged once.
    refused: Mutex<std::collections::HashSet<std::net::IpAddr>>,
    next_xid: AtomicU64,
}

/// The connections to one peer; each slot is reconnected under its own lock.
struct PeerConns {
    slots: Vec<tokio::sync::Mutex<Option<Arc<Conn>>>>,
    next: AtomicUsize,
}

/// A node on a TCP network.
#[derive(Clone)]
pub struct TcpEndpoint {
    inner: Arc<Inner>,
}

impl TcpEndpoint {
    /// Listens on `addr` and serves `service` there; also makes calls.
    pub async fn bind(
        addr: SocketAddr,
        service: Arc<dyn Service>,
        cfg: TcpConfig,
    ) -> Result<Self, NetError> {
        Self::bind_rails(&[addr], service, cfg).await
    }

    /// Listens on every address of `addrs` (one per interface: the rails of multi-rail) and
    /// serves `service` on all of them. The first names this endpoint; the others are its
    /// [`Transport::rails`], which peers are told.
    pub async fn bind_rails(
        addrs: &[SocketAddr],
        service: Arc<dyn Service>,
        cfg: TcpConfig,
    ) -> Result<Self, NetError> {
        if addrs.is_empty() || addrs.len() > rails::MAX_RAILS {
            return Err(NetError::BadConfig(format!(
                "a server listens on 1 to {} addresses, not {}",
                rails::MAX_RAILS,
                addrs.len()
            )));
        }
        let mut listeners = Vec::with_capacity(addrs.len());
        let mut locals = Vec::with_capacity(addrs.len());
        for addr in addrs {
            let listener = TcpListener::bind(addr).await?;
            locals.push(Nid::Tcp(listener.local_addr()?));
            listeners.push(listener);
        }
        let dispatcher = Dispatcher::new(service, cfg.queue_slots)
            .with_metrics(cfg.metrics.clone())
            .with_jobs(cfg.jobs.clone());
        let nid = locals.remove(0);
        let ep = Self::new(nid, locals, Some(dispatcher), cfg);
        for listener in listeners {
            let weak = Arc::downgrade(&ep.inner);
            let task = tokio::spawn(accept_loop(listener, weak));
            ep.inner.accept_tasks.lock().push(task.abort_handle());
        }
        tracing::info!(nid = %ep.inner.nid, rails = ?ep.inner.local_rails, "listening");
        Ok(ep)
    }

    /// An endpoint that only makes calls (and serves bulk transfers of its own memory).
    pub fn client(cfg: TcpConfig) -> Self {
        Self::new(
            Nid::Tcp(SocketAddr::from(([0, 0, 0, 0], 0))),
            vec![],
            None,
            cfg,
        )
    }

    fn new(
        nid: Nid,
        local_rails: Vec<Nid>,
        dispatcher: Option<Dispatcher>,
        cfg: TcpConfig,
    ) -> Self {
        TcpEndpoint {
            inner: Arc::new(Inner {
                nid,
                cfg: Arc::new(cfg),
                regions: RegionTable::random(),
                dispatcher,
                peers: Mutex::new(HashMap::new()),
                rails: Mutex::new(HashMap::new()),
                local_rails,
                accepted: Mutex::new(Vec::new()),
                accept_tasks: Mutex::new(Vec::new()),
                handshakes: Mutex::new(std::collections::VecDeque::new()),
                refused: Mutex::new(std::collections::HashSet::new()),
                next_xid: AtomicU64::new(1),
            }),
        }
    }

    /// Stops accepting and closes every connection.
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }

    /// Accepted connections currently open.
    pub fn accepted_connections(&self) -> usize {
        let mut acc = self.inner.accepted.lock();
        acc.retain(|w| w.upgrade().is_some_and(|c| !c.is_closed()));
        acc.len()
    }

    /// A connection to `addr`: one already open, or a new one. With `dead_after`, a new
    /// connection whose sent bytes go unacknowledged that long is closed by the kernel
    /// (`TCP_USER_TIMEOUT`): for a rail of a peer with others, a dead link is found well
    /// before the call's deadline.
    async fn conn_to(
        &self,
        addr: SocketAddr,
        dead_after: Option<Duration>,
    ) -> Result<Arc<Conn>, NetError> {
        let peer = {
            let mut peers = self.inner.peers.lock();
            peers
                .entry(addr)
                .or_insert_with(|| {
                    Arc::new(PeerConns {
                        slots: (0..self.inner.cfg.conns_per_peer.max(1))
                            .map(|_| tokio::sync::Mutex::new(None))
                            .collect(),
                        next: AtomicUsize::new(0),
                    })
                })
                .clone()
        };
        let i = peer.next.fetch_add(1, Ordering::Relaxed) % peer.slots.len();
        let mut slot = peer.slots[i].lock().await;
        if let Some(c) = slot.as_ref().filter(|c| !c.is_closed()) {
            return Ok(c.clone());
        }
        let nid = Nid::Tcp(addr);
        let unreachable = |reason: String| NetError::Unreachable {
            peer: nid.clone(),
            reason,
        };
        let mut stream = TcpStream::connect(addr)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        if let Some(after) = dead_after {
            set_user_timeout(&stream, after);
        }
        let cfg = &self.inner.cfg;
        let session = crate::auth::initiate(&mut stream, &cfg.security, cfg.handshake_timeout)
            .await
            .map_err(|e| match e {
                // A refusal, or a server that cannot prove it holds the key, will not change
                // on a retry.
                crate::auth::AuthError::Refused(_) | crate::auth::AuthError::Handshake(_) => {
                    NetError::Refused {
                        peer: nid.clone(),
                        reason: e.to_string(),
                    }
                }
                crate::auth::AuthError::BadKey(_) => NetError::BadConfig(e.to_string()),
                other => unreachable(other.to_string()),
            })?;
        tracing::debug!(peer = %nid, slot = i, protection = ?session.protection, "connected");
        let conn = Conn::start(
            stream,
            nid,
            self.inner.cfg.clone(),
            self.inner.regions.clone(),
            None,
            session,
            Role::Server,
        );
        *slot = Some(conn.clone());
        Ok(conn)
    }
}

/// Sets `TCP_USER_TIMEOUT`: the kernel closes the connection once sent data has gone
/// unacknowledged for `after`. A failure leaves the default (the call's deadline still holds).
fn set_user_timeout(stream: &TcpStream, after: Duration) {
    use std::os::fd::AsRawFd;
    let ms = libc::c_uint::try_from(after.as_millis()).unwrap_or(libc::c_uint::MAX);
    // SAFETY: setsockopt on a socket this stream owns, with a c_uint option value.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_USER_TIMEOUT,
            (&ms as *const libc::c_uint).cast(),
            std::mem::size_of::<libc::c_uint>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "TCP_USER_TIMEOUT not set");
    }
}

async fn accept_loop(listener: TcpListener, ep: Weak<Inner>) {
    let sweep_every = match ep.upgrade() {
        Some(ep) => (ep.cfg.idle_timeout / 4).max(Duration::from_millis(10)),
        None => return,
    };
    let mut sweep = tokio::time::interval(sweep_every);
    // The gauge of open connections, for a server that counts.
    let mut count = tokio::time::interval(Duration::from_secs(1));
    count.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = sweep.tick() => {
                let Some(ep) = ep.upgrade() else { return };
                ep.close_idle();
                continue;
            }
            _ = count.tick() => {
                let Some(ep) = ep.upgrade() else { return };
                if let Some(m) = &ep.cfg.metrics {
                    let mut acc = ep.accepted.lock();
                    acc.retain(|w| w.upgrade().is_some_and(|c| !c.is_closed()));
                    m.connections(acc.len());
                }
                continue;
            }
        };
        let (stream, addr) = match accepted {
            Ok(s) => s,
            Err(e) => {
                // Running out of descriptors is transient; back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(ep) = ep.upgrade() else { return };
        let weak = Arc::downgrade(&ep);
        let task = tokio::spawn(handshake(stream, addr, weak));
        let mut pending = ep.handshakes.lock();
        pending.retain(|t| !t.is_finished());
        if pending.len() >= ep.cfg.max_connections {
            // Slow or silent handshakes cannot hold the door: the oldest gives way.
            if let Some(oldest) = pending.pop_front() {
                oldest.abort();
            }
        }
        pending.push_back(task.abort_handle());
    }
}

/// Authenticates an accepted connection, then admits it under the connection limits.
async fn handshake(mut stream: TcpStream, addr: SocketAddr, ep: Weak<Inner>) {
    let (cfg, security) = match ep.upgrade() {
        Some(ep) => (ep.cfg.clone(), ep.cfg.security.clone()),
        None => return,
    };
    let outcome = crate::auth::accept(&mut stream, &security, cfg.handshake_timeout).await;
    let Some(ep) = ep.upgrade() else { return };
    let (session, role) = match outcome {
        Ok(ok) => ok,
        Err(e) => {
            let mut refused = ep.refused.lock();
            if refused.len() >= 4096 {
                refused.clear();
            }
            if refused.insert(addr.ip()) {
                tracing::warn!(peer = %addr, error = %e, "connection refused (logged once per address)");
            } else {
                tracing::debug!(peer = %addr, error = %e, "connection refused");
            }
            return;
        }
    };
    let mut accepted = ep.accepted.lock();
    accepted.retain(|w| w.upgrade().is_some_and(|c| !c.is_closed()));
    let same_peer = |c: &Arc<Conn>| matches!(&c.peer, Nid::Tcp(a) if a.ip() == addr.ip());
    let from_peer = accepted
        .iter()
        .filter(|w| w.upgrade().is_some_and(|c| same_peer(&c)))
        .count();
    let full = if from_peer >= cfg.max_per_peer {
        Some(true)
    } else if accepted.len() >= cfg.max_connections {
        Some(false)
    } else {
        None
    };
    if let Some(per_peer) = full {
        // The connection idle longest (of this peer, when the peer is at its own limit) makes
        // room, if it has been idle long enough: idle sockets cannot lock real clients out.
        let idlest = accepted
            .iter()
            .enumerate()
            .filter_map(|(i, w)| w.upgrade().map(|c| (i, c.idle_for(), c)))
            .filter(|(_, _, c)| !per_peer || same_peer(c))
            .max_by_key(|(_, idle, _)| *idle)
            .filter(|(_, idle, _)| *idle >= cfg.displace_idle);
        match idlest {
            Some((i, idle, c)) => {
                tracing::debug!(peer = %c.peer, idle_ms = idle.as_millis() as u64, "closing the idlest connection to make room");
                c.close("idle, and its place was needed");
                accepted.swap_remove(i);
            }
            None => {
                let limit = if per_peer {
                    cfg.max_per_peer
                } else {
                    cfg.max_connections
                };
                tracing::warn!(%addr, limit, per_peer, "connection refused: too many connections, none idle");
                return;
            }
        }
    }
    let conn = Conn::start(
        stream,
        Nid::Tcp(addr),
        cfg,
        ep.regions.clone(),
        ep.dispatcher.clone(),
        session,
        role,
    );
    accepted.push(Arc::downgrade(&conn));
}

/// Removes a call's reply slot however the call ends (reply, error or deadline).
struct PendingGuard {
    conn: Arc<Conn>,
    xid: u64,
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        self.conn.forget_reply(self.xid);
    }
}

impl Transport for TcpEndpoint {
    fn seals_payloads(&self) -> bool {
        !matches!(self.inner.cfg.security, crate::auth::Security::Off)
    }

    fn nid(&self) -> Nid {
        self.inner.nid.clone()
    }

    fn regions(&self) -> &Arc<RegionTable> {
        &self.inner.regions
    }

    fn call_raw<'a>(
        &'a self,
        peer: &'a Nid,
        opcode: Opcode,
        body: Vec<u8>,
        bulk: Option<proto::bulk::BulkGrant>,
        deadline: Duration,
    ) -> BoxFuture<'a, Result<Vec<u8>, NetError>> {
        Box::pin(async move {
            let Nid::Tcp(addr) = peer else {
                return Err(NetError::WrongNetwork {
                    nid: peer.clone(),
                    want: "tcp",
                });
            };
            check_body(peer, &body)?;
            let job = crate::job::current(self.inner.cfg.job.as_ref());
            let frame = Request {
                opcode,
                job: job.as_ref(),
                body: &body,
            };
            let counted = self.inner.cfg.calls.as_ref().map(|m| m.sent());
            let rails = self.inner.rails.lock().get(addr).cloned();
            let out = match rails {
                None => {
                    let attempt = async {
                        let conn = self.conn_to(*addr, None).await?;
                        self.exchange(&conn, peer, frame, bulk).await
                    };
                    match tokio::time::timeout(deadline, attempt).await {
                        Ok(r) => r,
                        Err(_) => Err(NetError::Timeout {
                            peer: peer.clone(),
                            after: deadline,
                        }),
                    }
                }
                Some(rails) => self.call_rails(&rails, peer, frame, bulk, deadline).await,
            };
            if let Some(c) = counted {
                c.answered(opcode, &out);
            }
            out
        })
    }

    fn rails(&self) -> Vec<Nid> {
        self.inner.local_rails.clone()
    }

    fn set_peer_rails(&self, peer: &Nid, rails: &[Nid]) {
        let Nid::Tcp(first) = peer else { return };
        let mut addrs = vec![*first];
        addrs.extend(rails.iter().filter_map(|n| match n {
            Nid::Tcp(a) => Some(*a),
            _ => None,
        }));
        let mut table = self.inner.rails.lock();
        if addrs.len() == 1 {
            table.remove(first);
            return;
        }
        let fresh = Rails::new(&addrs);
        if table.get(first).is_some_and(|r| r.addrs() == fresh.addrs()) {
            return; // the same rails: keep what is known of their health
        }
        tracing::debug!(%peer, rails = ?fresh.addrs(), "peer has several addresses");
        table.insert(*first, Arc::new(fresh));
    }
}

/// What one call sends, framed anew (with its own xid) for each connection it goes out on.
#[derive(Clone, Copy)]
struct Request<'a> {
    opcode: Opcode,
    job: Option<&'a proto::JobId>,
    body: &'a [u8],
}

impl TcpEndpoint {
    /// Sends one request frame on `conn` and waits for its reply.
    async fn exchange(
        &self,
        conn: &Arc<Conn>,
        peer: &Nid,
        req: Request<'_>,
        bulk: Option<proto::bulk::BulkGrant>,
    ) -> Result<Vec<u8>, NetError> {
        let xid = self.inner.next_xid.fetch_add(1, Ordering::Relaxed);
        // The few bytes a server would pull at once go with the request (short I/O): a round
        // trip fewer for a small write. They follow the range's key and offset, and the server
        // takes them for a get of exactly that range.
        let eager = bulk
            .filter(|g| {
                !g.server_writes && g.len > 0 && g.len + EAGER_HEAD as u32 <= proto::MAX_EAGER
            })
            .and_then(|g| {
                let access = self
                    .inner
                    .regions
                    .access(g.key, g.offset, u64::from(g.len), false)
                    .ok()?;
                let mut p = Vec::with_capacity(EAGER_HEAD + g.len as usize);
                p.extend_from_slice(&g.key.to_le_bytes());
                p.extend_from_slice(&g.offset.to_le_bytes());
                p.extend_from_slice(access.as_slice());
                Some(bytes::Bytes::from(p))
            });
        let len = eager.as_ref().map_or(0, |p| p.len() as u32);
        let frame = encode_request_with(req.opcode, xid, req.job, req.body, len);
        let reply = conn.expect_reply(xid, bulk);
        let _guard = PendingGuard {
            conn: conn.clone(),
            xid,
        };
        conn.send(frame, eager.map(conn::Payload::Bytes)).await?;
        reply.await.map_err(|_| NetError::Closed {
            peer: peer.clone(),
            reason: "connection dropped the call".into(),
        })?
    }

    /// A call to a peer with several addresses. A rail that does not connect within
    /// [`RAIL_CONNECT`] is set aside and the next is tried, since nothing was sent over it; a
    /// rail that took the request and then failed (no reply in time, a dropped connection) is
    /// set aside and its connections closed, and the call fails as it would on one address:
    /// the caller resends, and the resend goes over another rail.
    async fn call_rails(
        &self,
        rails: &Rails,
        peer: &Nid,
        frame: Request<'_>,
        bulk: Option<proto::bulk::BulkGrant>,
        deadline: Duration,
    ) -> Result<Vec<u8>, NetError> {
        let start = tokio::time::Instant::now();
        let timeout = || NetError::Timeout {
            peer: peer.clone(),
            after: deadline,
        };
        let mut last = None;
        for rail in rails.order(std::time::Instant::now()) {
            let left = deadline.saturating_sub(start.elapsed());
            if left.is_zero() {
                break;
            }
            let conn = match tokio::time::timeout(
                left.min(RAIL_CONNECT),
                self.conn_to(rail, Some(RAIL_DEAD)),
            )
            .await
            {
                Ok(Ok(c)) => c,
                Ok(Err(e)) if !e.is_retryable() => return Err(e),
                failed => {
                    let reason = match failed {
                        Ok(Err(e)) => e.to_string(),
                        _ => format!("no connection within {RAIL_CONNECT:?}"),
                    };
                    if rails.failed(rail, std::time::Instant::now()) {
                        tracing::warn!(%peer, %rail, %reason, "rail down; using the others");
                    }
                    last = Some(NetError::Unreachable {
                        peer: peer.clone(),
                        reason: format!("every address failed; {rail}: {reason}"),
                    });
                    continue;
                }
            };
            let left = deadline.saturating_sub(start.elapsed());
            let outcome = tokio::time::timeout(left, self.exchange(&conn, peer, frame, bulk))
                .await
                .unwrap_or_else(|_| Err(timeout()));
            match &outcome {
                Ok(_) => {
                    if rails.worked(rail) {
                        tracing::info!(%peer, %rail, "rail back");
                    }
                }
                Err(e @ (NetError::Timeout { .. } | NetError::Closed { .. })) => {
                    if rails.failed(rail, std::time::Instant::now()) {
                        tracing::warn!(%peer, %rail, error = %e, "rail failed; calls go to the others");
                    }
                    self.inner.close_peer(rail, "its rail failed");
                }
                Err(_) => {}
            }
            return outcome;
        }
        Err(last.unwrap_or_else(timeout))
    }
}

impl Inner {
    /// Closes the accepted connections idle past the idle timeout.
    fn close_idle(&self) {
        let mut accepted = self.accepted.lock();
        accepted.retain(|w| match w.upgrade() {
            Some(c) if c.is_closed() => false,
            Some(c) if c.idle_for() >= self.cfg.idle_timeout => {
                c.close("idle timeout");
                false
            }
            Some(_) => true,
            None => false,
        });
    }

    /// Closes the connections to one address (calls on them fail and are resent).
    fn close_peer(&self, addr: SocketAddr, why: &str) {
        let Some(peer) = self.peers.lock().get(&addr).cloned() else {
            return;
        };
        for slot in &peer.slots {
            if let Some(c) = slot.try_lock().ok().and_then(|mut s| s.take()) {
                c.close(why);
            }
        }
    }

    fn shutdown(&self) {
        for t in self.accept_tasks.lock().drain(..) {
            t.abort();
        }
        for t in self.handshakes.lock().drain(..) {
            t.abort();
        }
        for c in self.accepted.lock().drain(..).filter_map(|w| w.upgrade()) {
            c.close("endpoint shut down");
        }
        let peers: Vec<_> = self.peers.lock().drain().map(|(_, p)| p).collect();
        for slot in peers.iter().flat_map(|p| &p.slots) {
            // A slot locked right now belongs to a call in progress, which owns the outcome.
            if let Some(c) = slot.try_lock().ok().and_then(|mut s| s.take()) {
                c.close("endpoint shut down");
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown();
    }
}
