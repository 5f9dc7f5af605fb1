//! One TCP connection, used in both directions: calls out and their replies, requests in and
//! the replies to them, and the bulk frames of either.
//!
//! A reader task decodes frames and routes them; a writer task drains a bounded queue of
//! outgoing frames into a buffered socket and flushes when the queue runs dry, so many small
//! messages share one system call. Bulk payloads are read straight into registered memory and
//! written straight from it.
//!
//! Any framing error, a truncated stream, or a peer that stops reading closes the connection
//! with a logged reason, and fails every call waiting on it; other connections are untouched.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use proto::bulk::{BulkDataHead, BulkGetHead, BulkGrant, BulkPutHead};
use proto::frame::{encode_frame, FrameKind, Header, HEADER_LEN};
use proto::msg::{decode_body, encode_body};
use proto::{BulkDesc, FrameError, Nid, Opcode, RemoteError, StatusCode};
use tokio::io::{
    AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter,
};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::TcpConfig;
use crate::auth::session::{Opener, Sealer, TAG_LEN};
use crate::auth::{Role, Session};
use crate::error::{NetError, RegionError};
use crate::region::{RegionAccess, RegionTable};
use crate::service::{busy, BoxFuture, BulkPeer, Dispatcher, Incoming};
use crate::transport::{error_body, reply_result};

/// Buffer sizes for the reader and writer. Bulk payloads bypass both, so these only batch small
/// frames; they are kept small because every open connection holds two.
const IO_BUFFER: usize = 64 << 10;

pub(crate) enum Payload {
    Bytes(Bytes),
    Region(RegionAccess),
}

impl Payload {
    fn as_slice(&self) -> &[u8] {
        match self {
            Payload::Bytes(b) => b,
            Payload::Region(r) => r.as_slice(),
        }
    }
}

pub(crate) struct Outgoing {
    frame: Vec<u8>,
    payload: Option<Payload>,
}

struct Pending {
    reply: oneshot::Sender<Result<Vec<u8>, NetError>>,
    /// The memory the server may move bytes with while serving this call.
    bulk: Option<BulkGrant>,
    /// A bulk put for this call that failed on our side; it overrides the reply.
    bulk_error: Option<NetError>,
}

/// The data of a bulk get and its crc32c, already checked against the bytes.
type GetReply = oneshot::Sender<Result<(Vec<u8>, u32), NetError>>;

pub(crate) struct Conn {
    pub(crate) peer: Nid,
    /// Our end of the connection.
    local: Nid,
    cfg: Arc<TcpConfig>,
    out: mpsc::Sender<Outgoing>,
    pending: Mutex<HashMap<u64, Pending>>,
    gets: Mutex<HashMap<u64, GetReply>>,
    next_tag: AtomicU64,
    closed: AtomicBool,
    tasks: Mutex<Vec<AbortHandle>>,
    regions: Arc<RegionTable>,
    dispatcher: Option<Dispatcher>,
    /// When the connection started, and the last time a frame went either way (ms after it).
    born: Instant,
    active_ms: AtomicU64,
    /// Requests from the peer being served now: a connection serving one is not idle.
    serving: AtomicU64,
    /// Of those, long polls (which have slots of their own).
    polling: AtomicU64,
    /// The role the peer proved in the handshake (every peer is a server when authentication
    /// is off).
    role: Role,
    /// Every record carries an authentication tag: transport checksums add nothing.
    sealed: bool,
}

impl Conn {
    /// Starts the reader and writer of a connected socket.
    pub(crate) fn start(
        stream: TcpStream,
        peer: Nid,
        cfg: Arc<TcpConfig>,
        regions: Arc<RegionTable>,
        dispatcher: Option<Dispatcher>,
        session: Session,
        role: Role,
    ) -> Arc<Conn> {
        let _ = stream.set_nodelay(true);
        let Session { sealer, opener, .. } = session;
        let sealed = sealer.is_some();
        let local = stream
            .local_addr()
            .map(Nid::Tcp)
            .unwrap_or_else(|_| Nid::Tcp(([0, 0, 0, 0], 0).into()));
        let (rd, wr) = stream.into_split();
        let (tx, rx) = mpsc::channel(cfg.send_queue);
        let conn = Arc::new(Conn {
            peer,
            local,
            cfg,
            out: tx,
            pending: Mutex::new(HashMap::new()),
            gets: Mutex::new(HashMap::new()),
            next_tag: AtomicU64::new(1),
            closed: AtomicBool::new(false),
            tasks: Mutex::new(Vec::new()),
            regions,
            dispatcher,
            born: Instant::now(),
            active_ms: AtomicU64::new(0),
            serving: AtomicU64::new(0),
            polling: AtomicU64::new(0),
            role,
            sealed,
        });
        let reader = {
            let conn = conn.clone();
            tokio::spawn(async move {
                let reason = match conn.clone().read_loop(rd, opener).await {
                    Ok(()) => "peer closed the connection".to_owned(),
                    Err(e) => e,
                };
                conn.close(&reason);
            })
        };
        let writer = {
            let conn = conn.clone();
            tokio::spawn(async move {
                if let Err(reason) = conn.write_loop(wr, rx, sealer).await {
                    conn.close(&reason);
                }
            })
        };
        let mut tasks = conn.tasks.lock();
        tasks.push(reader.abort_handle());
        tasks.push(writer.abort_handle());
        drop(tasks);
        // A close that raced with the spawns must still stop both tasks.
        if conn.is_closed() {
            conn.close("closed while starting");
        }
        conn
    }

    /// A frame went one way or the other now.
    fn active(&self) {
        let ms = self.born.elapsed().as_millis() as u64;
        self.active_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// How long no frame has gone either way and no request has been served.
    pub(crate) fn idle_for(&self) -> Duration {
        if self.serving.load(Ordering::Relaxed) > 0 {
            return Duration::ZERO;
        }
        let last = Duration::from_millis(self.active_ms.load(Ordering::Relaxed));
        self.born.elapsed().saturating_sub(last)
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Closes the connection once, logging why, and fails everything waiting on it.
    pub(crate) fn close(&self, reason: &str) {
        let first = !self.closed.swap(true, Ordering::AcqRel);
        if first {
            // Ordinary ends are quiet; anything else is worth an operator's attention.
            let ordinary = matches!(
                reason,
                "peer closed the connection" | "endpoint shut down" | "idle timeout"
            );
            if ordinary {
                tracing::debug!(peer = %self.peer, reason, "connection closed");
            } else {
                tracing::info!(peer = %self.peer, reason, "connection closed");
            }
        }
        for t in self.tasks.lock().drain(..) {
            t.abort();
        }
        let closed = || NetError::Closed {
            peer: self.peer.clone(),
            reason: reason.to_owned(),
        };
        for (_, p) in self.pending.lock().drain() {
            let _ = p.reply.send(Err(closed()));
        }
        for (_, g) in self.gets.lock().drain() {
            let _ = g.send(Err(closed()));
        }
    }

    /// Queues a frame, waiting at most `send_timeout` for room: a peer that does not drain its
    /// socket for that long is cut off rather than allowed to pin our memory.
    pub(crate) async fn send(
        &self,
        frame: Vec<u8>,
        payload: Option<Payload>,
    ) -> Result<(), NetError> {
        let closed = |reason: &str| NetError::Closed {
            peer: self.peer.clone(),
            reason: reason.to_owned(),
        };
        if self.is_closed() {
            return Err(closed("already closed"));
        }
        match tokio::time::timeout(
            self.cfg.send_timeout,
            self.out.send(Outgoing { frame, payload }),
        )
        .await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(closed("writer gone")),
            Err(_) => {
                let reason = "peer stopped reading (send queue full)";
                self.close(reason);
                Err(closed(reason))
            }
        }
    }

    /// Whether the call `xid` lets its server move `len` bytes at `offset` of region `key`
    /// (`write`: into our memory).
    fn granted(&self, xid: u64, key: u64, offset: u64, len: u64, write: bool) -> bool {
        self.pending
            .lock()
            .get(&xid)
            .and_then(|p| p.bulk)
            .is_some_and(|g| g.covers(key, offset, len, write))
    }

    /// Registers a call awaiting the reply with `xid`.
    pub(crate) fn expect_reply(
        &self,
        xid: u64,
        bulk: Option<BulkGrant>,
    ) -> oneshot::Receiver<Result<Vec<u8>, NetError>> {
        let (tx, rx) = oneshot::channel();
        self.pending.lock().insert(
            xid,
            Pending {
                reply: tx,
                bulk,
                bulk_error: None,
            },
        );
        if self.is_closed() {
            self.close("already closed");
        }
        rx
    }

    pub(crate) fn forget_reply(&self, xid: u64) {
        self.pending.lock().remove(&xid);
    }

    async fn write_loop(
        &self,
        wr: tokio::net::tcp::OwnedWriteHalf,
        mut rx: mpsc::Receiver<Outgoing>,
        mut sealer: Option<Sealer>,
    ) -> Result<(), String> {
        let mut w = BufWriter::with_capacity(IO_BUFFER, wr);
        let sealing = |e: crate::auth::AuthError| format!("sealing a record: {e}");
        while let Some(first) = rx.recv().await {
            let mut next = Some(first);
            while let Some(mut msg) = next {
                match &mut sealer {
                    Some(s) => {
                        let tag = s.seal_frame(&mut msg.frame).map_err(sealing)?;
                        self.write_timed(&mut w, &msg.frame).await?;
                        self.write_timed(&mut w, &tag).await?;
                    }
                    None => self.write_timed(&mut w, &msg.frame).await?,
                }
                // A payload record (and its tag) exists only when the header announces bytes.
                if let Some(p) = msg.payload.as_ref().filter(|p| !p.as_slice().is_empty()) {
                    match &mut sealer {
                        Some(s) => {
                            let (sealed, tag) = s.seal_payload(p.as_slice()).map_err(sealing)?;
                            let bytes = sealed.as_deref().unwrap_or(p.as_slice());
                            self.write_timed(&mut w, bytes).await?;
                            self.write_timed(&mut w, &tag).await?;
                        }
                        None => self.write_timed(&mut w, p.as_slice()).await?,
                    }
                }
                next = rx.try_recv().ok();
            }
            tokio::time::timeout(self.cfg.send_timeout, w.flush())
                .await
                .map_err(|_| "peer stopped reading (write timed out)".to_owned())?
                .map_err(|e| format!("write failed: {e}"))?;
            self.active();
        }
        Ok(())
    }

    async fn write_timed<W: AsyncWrite + Unpin>(
        &self,
        w: &mut W,
        bytes: &[u8],
    ) -> Result<(), String> {
        tokio::time::timeout(self.cfg.send_timeout, w.write_all(bytes))
            .await
            .map_err(|_| "peer stopped reading (write timed out)".to_owned())?
            .map_err(|e| format!("write failed: {e}"))
    }

    async fn read_loop(
        self: Arc<Self>,
        rd: tokio::net::tcp::OwnedReadHalf,
        opener: Option<Opener>,
    ) -> Result<(), String> {
        let mut rd = BufReader::with_capacity(IO_BUFFER, rd);
        let mut guard = Guard(opener);
        let mut head = [0u8; HEADER_LEN];
        loop {
            // A clean end of stream is only allowed between frames.
            if rd
                .fill_buf()
                .await
                .map_err(|e| format!("read failed: {e}"))?
                .is_empty()
            {
                return Ok(());
            }
            read_exact(&mut rd, &mut head).await?;
            let header = Header::decode(&head).map_err(|e| format!("bad frame: {e}"))?;
            let body = guard
                .frame(&mut rd, &head, header.body_len as usize)
                .await?;
            header
                .verify(&body)
                .map_err(|e| format!("bad frame: {e}"))?;
            self.active();
            match header.kind {
                FrameKind::Request => {
                    // The bytes of the call's bulk range, sent with it (see `TcpBulk::get`).
                    let eager = if header.bulk_len > 0 {
                        let mut data = read_new(&mut rd, header.bulk_len as usize).await?;
                        guard.check(&mut rd, &mut data).await?;
                        Some(Eager::parse(data)?)
                    } else {
                        None
                    };
                    self.on_request(header, body, eager).await
                }
                FrameKind::Reply => self.on_reply(header, body),
                FrameKind::BulkPut => self.on_bulk_put(&mut rd, &mut guard, header, &body).await?,
                FrameKind::BulkGet => self.on_bulk_get(header, &body).await?,
                FrameKind::BulkData => {
                    self.on_bulk_data(&mut rd, &mut guard, header, &body)
                        .await?
                }
            }
        }
    }

    async fn on_request(self: &Arc<Self>, header: Header, body: Vec<u8>, eager: Option<Eager>) {
        let (xid, opcode) = (header.xid, header.opcode);
        let (job, body) = match proto::frame::request_job(&header, body) {
            Ok(v) => v,
            Err(e) => {
                let err = RemoteError::new(StatusCode::BadRequest, e.to_string());
                let _ = self.send_reply(xid, opcode, Err(err)).await;
                return;
            }
        };
        let Some(dispatcher) = &self.dispatcher else {
            let err = RemoteError::new(StatusCode::NoService, "this node serves no requests");
            let _ = self.send_reply(xid, opcode, Err(err)).await;
            return;
        };
        // One client connection holds its share of the shared slots at most, where the
        // service bounds it: others find one free, however many requests it sends (long
        // polls have slots of their own).
        let share = dispatcher.per_connection();
        let polls = crate::service::is_long_poll(opcode);
        let shared = || {
            self.serving
                .load(Ordering::Relaxed)
                .saturating_sub(self.polling.load(Ordering::Relaxed))
        };
        if self.role == Role::Client && !polls && share.is_some_and(|n| shared() >= n as u64) {
            dispatcher.refused_busy();
            let _ = self.send_reply(xid, opcode, Err(busy())).await;
            return;
        }
        let Some(admitted) = dispatcher.admit(opcode, self.role) else {
            let _ = self.send_reply(xid, opcode, Err(busy())).await;
            return;
        };
        let conn = self.clone();
        conn.serving.fetch_add(1, Ordering::Relaxed);
        if polls {
            conn.polling.fetch_add(1, Ordering::Relaxed);
        }
        tokio::spawn(async move {
            let req = Incoming {
                role: conn.role,
                from: conn.peer.clone(),
                to: conn.local.clone(),
                opcode,
                xid,
                job,
                body,
            };
            let bulk: Arc<dyn BulkPeer> = Arc::new(TcpBulk {
                conn: conn.clone(),
                xid,
                opcode,
                eager: Mutex::new(eager),
            });
            let out = admitted.run(req, bulk).await;
            if let Err(e) = conn.send_reply(xid, opcode, out).await {
                tracing::debug!(error = %e, "reply not sent");
            }
            conn.active();
            if polls {
                conn.polling.fetch_sub(1, Ordering::Relaxed);
            }
            conn.serving.fetch_sub(1, Ordering::Relaxed);
        });
    }

    async fn send_reply(
        &self,
        xid: u64,
        opcode: Opcode,
        out: Result<Vec<u8>, RemoteError>,
    ) -> Result<(), NetError> {
        let mut header = Header::new(FrameKind::Reply, opcode, xid);
        let body = match out {
            Ok(body) => body,
            Err(err) => {
                header.error = true;
                error_body(&err)
            }
        };
        self.send(encode_frame(header, &body), None).await
    }

    fn on_reply(&self, header: Header, body: Vec<u8>) {
        let Some(p) = self.pending.lock().remove(&header.xid) else {
            tracing::debug!(peer = %self.peer, xid = header.xid, "reply to a call no longer waiting");
            return;
        };
        let result = match p.bulk_error {
            Some(e) => Err(e),
            None => reply_result(&self.peer, header.error, body),
        };
        let _ = p.reply.send(result);
    }

    /// A server writes into our memory: the payload goes straight into the registered region.
    async fn on_bulk_put<R: AsyncRead + Unpin>(
        &self,
        rd: &mut R,
        guard: &mut Guard,
        header: Header,
        body: &[u8],
    ) -> Result<(), String> {
        let head: BulkPutHead = decode_body(body).map_err(|e| format!("bad bulk put: {e}"))?;
        let len = u64::from(header.bulk_len);
        let access = if self.granted(header.xid, head.key, head.offset, len, true) {
            self.regions.access(head.key, head.offset, len, true)
        } else {
            Err(RegionError::NotGranted {
                key: head.key,
                offset: head.offset,
                len,
            })
        };
        let outcome = match access {
            Ok(mut access) => {
                let dst = access.as_mut_slice().unwrap_or_default();
                guard.payload(rd, dst).await?;
                // A sealed payload passed its tag, which no corruption survives: the crc32c
                // would only check the same thing again.
                let actual = if self.sealed {
                    head.crc32c
                } else {
                    crc32c::crc32c(dst)
                };
                if actual == head.crc32c {
                    Ok(())
                } else {
                    Err(NetError::Checksum {
                        expected: head.crc32c,
                        actual,
                    })
                }
            }
            Err(e) => {
                guard.discard(rd, len).await?;
                Err(NetError::Region(e))
            }
        };
        if let Err(e) = outcome {
            match self.pending.lock().get_mut(&header.xid) {
                Some(p) => {
                    // A region let go of while its call was still out (a readahead chunk
                    // dropped when its reader closed the file) is ours, not the peer's doing.
                    if matches!(e, NetError::Region(RegionError::UnknownKey { .. })) {
                        tracing::debug!(peer = %self.peer, xid = header.xid, error = %e, "bulk put for a region already let go of");
                    } else {
                        tracing::warn!(peer = %self.peer, xid = header.xid, error = %e, "bulk put refused");
                    }
                    p.bulk_error.get_or_insert(e);
                }
                // The caller gave up on the call (a deadline, or a read begun early that was
                // not needed): its bytes arriving late are expected, not the peer's fault.
                None => {
                    tracing::debug!(peer = %self.peer, xid = header.xid, "bulk put for a call no longer waiting, dropped")
                }
            }
        }
        Ok(())
    }

    /// A server pulls from our memory: the payload is written straight from the region.
    async fn on_bulk_get(&self, header: Header, body: &[u8]) -> Result<(), String> {
        let BulkGetHead { call, desc } =
            decode_body(body).map_err(|e| format!("bad bulk get: {e}"))?;
        let mut reply = Header::new(FrameKind::BulkData, header.opcode, header.xid);
        let len = u64::from(desc.len);
        let access = if self.granted(call, desc.key, desc.offset, len, false) {
            self.regions.access(desc.key, desc.offset, len, false)
        } else {
            Err(RegionError::NotGranted {
                key: desc.key,
                offset: desc.offset,
                len,
            })
        };
        let (head, payload) = match access {
            Ok(access) => {
                // On a sealed connection the payload's tag covers every byte the crc32c
                // would: one is computed only where the descriptor has none to pass on.
                let crc = desc.crc32c.unwrap_or_else(|| {
                    if self.sealed {
                        0
                    } else {
                        crc32c::crc32c(access.as_slice())
                    }
                });
                reply.bulk_len = desc.len;
                (
                    BulkDataHead { result: Ok(crc) },
                    Some(Payload::Region(access)),
                )
            }
            Err(e) => (
                BulkDataHead {
                    result: Err(RemoteError::new(StatusCode::Bulk, e.to_string())),
                },
                None,
            ),
        };
        let body = encode_body(&head).map_err(|e| e.to_string())?;
        // A send that fails has closed the connection; the reader stops on its next read.
        let _ = self.send(encode_frame(reply, &body), payload).await;
        Ok(())
    }

    /// The payload answering one of our bulk gets.
    async fn on_bulk_data<R: AsyncRead + Unpin>(
        &self,
        rd: &mut R,
        guard: &mut Guard,
        header: Header,
        body: &[u8],
    ) -> Result<(), String> {
        let head: BulkDataHead = decode_body(body).map_err(|e| format!("bad bulk data: {e}"))?;
        let waiter = self.gets.lock().remove(&header.xid);
        let Some(waiter) = waiter else {
            tracing::debug!(peer = %self.peer, tag = header.xid, "bulk data for a transfer no longer waiting");
            return guard.discard(rd, u64::from(header.bulk_len)).await;
        };
        let result = match head.result {
            Ok(crc) => {
                let mut data = read_new(rd, header.bulk_len as usize).await?;
                guard.check(rd, &mut data).await?;
                // A sealed payload passed its tag, which no corruption survives.
                let actual = if self.sealed {
                    crc
                } else {
                    crc32c::crc32c(&data)
                };
                if actual == crc {
                    Ok((data, crc))
                } else {
                    Err(NetError::Checksum {
                        expected: crc,
                        actual,
                    })
                }
            }
            Err(err) => {
                guard.discard(rd, u64::from(header.bulk_len)).await?;
                Err(NetError::Remote {
                    peer: self.peer.clone(),
                    err,
                })
            }
        };
        let _ = waiter.send(result);
        Ok(())
    }
}

/// The receiving side's record checks: every frame and payload is read with its tag and
/// checked before it is used (a payload lands in registered memory first, and a failed check
/// fails its transfer and closes the connection).
struct Guard(Option<Opener>);

impl Guard {
    /// Reads a frame's body (and its tag) after `head`, checks it and returns the body.
    async fn frame<R: AsyncRead + Unpin>(
        &mut self,
        rd: &mut R,
        head: &[u8; HEADER_LEN],
        body_len: usize,
    ) -> Result<Vec<u8>, String> {
        let Some(opener) = &mut self.0 else {
            let mut body = vec![0u8; body_len];
            read_exact(rd, &mut body).await?;
            return Ok(body);
        };
        let mut frame = vec![0u8; HEADER_LEN + body_len];
        frame[..HEADER_LEN].copy_from_slice(head);
        read_exact(rd, &mut frame[HEADER_LEN..]).await?;
        let mut tag = [0u8; TAG_LEN];
        read_exact(rd, &mut tag).await?;
        opener
            .open_frame(&mut frame, &tag)
            .map_err(|e| format!("frame rejected: {e}"))?;
        frame.drain(..HEADER_LEN);
        Ok(frame)
    }

    /// Reads a payload straight into `dst`, then its tag, and checks it.
    async fn payload<R: AsyncRead + Unpin>(
        &mut self,
        rd: &mut R,
        dst: &mut [u8],
    ) -> Result<(), String> {
        read_exact(rd, dst).await?;
        self.check(rd, dst).await
    }

    /// Reads the tag of a payload already read into `data`, and checks it.
    async fn check<R: AsyncRead + Unpin>(
        &mut self,
        rd: &mut R,
        data: &mut [u8],
    ) -> Result<(), String> {
        let Some(opener) = self.0.as_mut().filter(|_| !data.is_empty()) else {
            return Ok(());
        };
        let mut tag = [0u8; TAG_LEN];
        read_exact(rd, &mut tag).await?;
        opener
            .open_payload(data, &tag)
            .map_err(|e| format!("payload rejected: {e}"))
    }

    /// Reads and drops a payload nobody waits for (still checked: the stream must stay whole).
    async fn discard<R: AsyncRead + Unpin>(&mut self, rd: &mut R, len: u64) -> Result<(), String> {
        if self.0.is_none() || len == 0 {
            return discard(rd, len).await;
        }
        let mut data = read_new(rd, len as usize).await?;
        self.check(rd, &mut data).await
    }
}

async fn read_exact<R: AsyncRead + Unpin>(rd: &mut R, buf: &mut [u8]) -> Result<(), String> {
    match rd.read_exact(buf).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            Err("stream truncated mid-frame".to_owned())
        }
        Err(e) => Err(format!("read failed: {e}")),
    }
}

/// Reads `len` bytes into a new buffer, without first zeroing it.
async fn read_new<R: AsyncRead + Unpin>(rd: &mut R, len: usize) -> Result<Vec<u8>, String> {
    let mut buf = Vec::with_capacity(len);
    while buf.len() < len {
        let mut limited = (&mut *rd).take((len - buf.len()) as u64);
        match limited.read_buf(&mut buf).await {
            Ok(0) => return Err("stream truncated mid-frame".to_owned()),
            Ok(_) => {}
            Err(e) => return Err(format!("read failed: {e}")),
        }
    }
    Ok(buf)
}

async fn discard<R: AsyncRead + Unpin>(rd: &mut R, len: u64) -> Result<(), String> {
    let copied = tokio::io::copy(&mut rd.take(len), &mut tokio::io::sink())
        .await
        .map_err(|e| format!("read failed: {e}"))?;
    if copied < len {
        return Err("stream truncated mid-frame".to_owned());
    }
    Ok(())
}

/// The server's bulk channel to the peer of one request, over the request's connection.
struct TcpBulk {
    conn: Arc<Conn>,
    xid: u64,
    opcode: Opcode,
    /// The bytes of the call's bulk range that came with the request, if it was small.
    eager: Mutex<Option<Eager>>,
}

/// Bytes a request carried of its bulk range: the region's key and the range's offset (8
/// bytes each, little-endian), then the bytes.
struct Eager {
    key: u64,
    offset: u64,
    data: Vec<u8>,
}

impl Eager {
    fn parse(mut raw: Vec<u8>) -> Result<Eager, String> {
        if raw.len() < super::EAGER_HEAD {
            return Err("bad frame: a request's payload is shorter than its head".into());
        }
        let word = |i: usize| u64::from_le_bytes(raw[i..i + 8].try_into().unwrap_or_default());
        let (key, offset) = (word(0), word(8));
        raw.drain(..super::EAGER_HEAD);
        Ok(Eager {
            key,
            offset,
            data: raw,
        })
    }
}

fn length_mismatch(desc: &BulkDesc, got: usize) -> NetError {
    NetError::BulkLength {
        expected: desc.len,
        got,
    }
}

impl BulkPeer for TcpBulk {
    fn sealed(&self) -> bool {
        self.conn.sealed
    }

    fn put(&self, desc: &BulkDesc, data: Bytes) -> BoxFuture<'static, Result<(), NetError>> {
        let conn = self.conn.clone();
        let (xid, opcode, desc) = (self.xid, self.opcode, desc.clone());
        Box::pin(async move {
            if data.len() != desc.len as usize {
                return Err(length_mismatch(&desc, data.len()));
            }
            let head = BulkPutHead {
                key: desc.key,
                offset: desc.offset,
                crc32c: if conn.sealed {
                    0
                } else {
                    crc32c::crc32c(&data)
                },
            };
            let body = encode_body(&head).map_err(|err| NetError::Frame {
                peer: conn.peer.clone(),
                err,
            })?;
            let mut header = Header::new(FrameKind::BulkPut, opcode, xid);
            header.bulk_len = desc.len;
            conn.send(encode_frame(header, &body), Some(Payload::Bytes(data)))
                .await
        })
    }

    fn get(&self, desc: &BulkDesc) -> BoxFuture<'static, Result<Vec<u8>, NetError>> {
        let conn = self.conn.clone();
        let (xid, opcode, desc) = (self.xid, self.opcode, desc.clone());
        let eager = self.eager.lock().take();
        Box::pin(async move {
            if desc.len > proto::MAX_BULK {
                return Err(NetError::Frame {
                    peer: conn.peer.clone(),
                    err: FrameError::BulkTooLarge { len: desc.len },
                });
            }
            // Bytes that came with the request are used for a get of exactly their range,
            // once. They passed the record's tag on a sealed connection; on a plain one the
            // descriptor's crc32c is their only check, so without one they are asked for again
            // as usual.
            let eager = eager.filter(|e| {
                e.key == desc.key && e.offset == desc.offset && e.data.len() == desc.len as usize
            });
            if let Some(Eager { data, .. }) = eager {
                match desc.crc32c {
                    Some(expected) => {
                        let actual = crc32c::crc32c(&data);
                        if actual != expected {
                            return Err(NetError::Checksum { expected, actual });
                        }
                        return Ok(data);
                    }
                    None if conn.sealed => return Ok(data),
                    None => {}
                }
            }
            let tag = conn.next_tag.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = oneshot::channel();
            conn.gets.lock().insert(tag, tx);
            let body = encode_body(&BulkGetHead {
                call: xid,
                desc: desc.clone(),
            })
            .map_err(|err| NetError::Frame {
                peer: conn.peer.clone(),
                err,
            })?;
            let sent = conn
                .send(
                    encode_frame(Header::new(FrameKind::BulkGet, opcode, tag), &body),
                    None,
                )
                .await;
            let result = match sent {
                Ok(()) => match tokio::time::timeout(conn.cfg.bulk_timeout, rx).await {
                    Ok(Ok(r)) => r,
                    Ok(Err(_)) => Err(NetError::Closed {
                        peer: conn.peer.clone(),
                        reason: "bulk get abandoned".into(),
                    }),
                    Err(_) => Err(NetError::Timeout {
                        peer: conn.peer.clone(),
                        after: conn.cfg.bulk_timeout,
                    }),
                },
                Err(e) => Err(e),
            };
            conn.gets.lock().remove(&tag);
            let (data, crc) = result?;
            if data.len() != desc.len as usize {
                return Err(length_mismatch(&desc, data.len()));
            }
            // The bytes hash to `crc`; the owner's descriptor says what they should hash to.
            if let Some(expected) = desc.crc32c.filter(|&e| e != crc) {
                return Err(NetError::Checksum {
                    expected,
                    actual: crc,
                });
            }
            Ok(data)
        })
    }
}
