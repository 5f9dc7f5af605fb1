//! Joining a filesystem, and the session's work in the background while the client lives:
//! the pinger (MDS restarts noticed, open files counted again), the lease channel (recalls
//! as they come), and the flusher that sends changes answered ahead in batches.
//!
//! Above the session's state ([`crate::client`], [`crate::pending`], [`crate::opens`]),
//! which never call up into it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use lnet::tcp::{TcpConfig, TcpEndpoint};
use lnet::{call, AnyNet, Transport};
use proto::md::*;
use proto::{FsErrorKind, Nid, StatusCode};

use crate::client::{after_closings, Client, ClientConfig, Inner};
use crate::error::{ClientError, Result};
use crate::pending::{Failed, Outcome, Queued, LINGER, LINGER_BATCH};

impl Client {
    /// Connects to the filesystem whose MDS is at `mds` (IP:PORT or a NID; several,
    /// comma-separated, for an MDS on several interfaces: the first names it).
    pub async fn connect(mds: &str) -> Result<Client> {
        Self::connect_with(mds, ClientConfig::default()).await
    }

    pub async fn connect_with(mds: &str, cfg: ClientConfig) -> Result<Client> {
        let security = match &cfg.security {
            Some(s) => s.clone(),
            None => lnet::auth::client_security(None, false, false)?,
        };
        let tcp = TcpConfig {
            security,
            job: cfg.job.clone(),
            calls: cfg.calls.clone(),
            ..TcpConfig::default()
        };
        Self::connect_on(TcpEndpoint::client(tcp).into(), mds, cfg).await
    }

    /// Connects through `net`: a TCP endpoint, or a node of the simulated fabric.
    pub async fn connect_on(net: AnyNet, mds: &str, cfg: ClientConfig) -> Result<Client> {
        let creds = cfg.creds.clone();
        let id: u128 = cfg.id.unwrap_or_else(rand::random);
        let (mds, rails) = Nid::parse_rails(mds)
            .map_err(|e| ClientError::fs(FsErrorKind::Invalid, e.to_string()))?;
        net.set_peer_rails(&mds, &rails);
        let client = Client {
            inner: Arc::new(Inner::new(mds, net, cfg, id, start)),
            creds,
        };
        client.ping().await?;
        if client.inner.cfg.commit_behind {
            client.join().await?;
        }
        start(&client.inner);
        Ok(client)
    }
}

/// Starts a session's background work: its pinger, and with leases its lease channel and
/// the flusher of its queue. Each session's tasks hold it weakly, and end with it.
fn start(inner: &Arc<Inner>) {
    let every = inner.cfg.ping_every;
    tokio::spawn(pinger(Arc::downgrade(inner), every));
    if inner.cfg.commit_behind && inner.cfg.leases {
        tokio::spawn(lease_channel(Arc::downgrade(inner)));
        tokio::spawn(flusher(Arc::downgrade(inner)));
    }
}

/// Pings the MDS every `every` while the client holds files open, until the client is gone.
pub(crate) async fn pinger(inner: Weak<Inner>, every: Duration) {
    loop {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let kicked = {
            let kick = strong.kick.clone();
            drop(strong);
            // In this order when both are ready (never at random: a seed of the simulator
            // replays exactly).
            tokio::select! {
                biased;
                _ = tokio::time::sleep(every) => false,
                _ = kick.notified() => true,
            }
        };
        let Some(inner) = inner.upgrade() else {
            return;
        };
        // A client that keeps uncommitted changes pings always: to learn how far the MDS has
        // committed, and to replay at once after a restart.
        if inner.opens.is_empty() && !inner.joined.load(std::sync::atomic::Ordering::Relaxed) {
            continue;
        }
        if kicked {
            // Kicks come from every resend of a call: at most one ping per 50 ms.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let client = Client::from_inner(inner);
        client.close_kept(false);
        if let Err(e) = client.ping().await {
            tracing::warn!(mdt = client.inner.home, error = %e, "cannot ping the MDS");
        }
    }
}

/// Keeps the lease channel open while the client lives and is joined: one wait at a time,
/// held by the MDS until a recall comes or its hold passes; each answer applies the recalls
/// and renews the leases, and the next wait acknowledges them.
async fn lease_channel(inner: std::sync::Weak<Inner>) {
    let hold = Duration::from_millis(proto::md::LEASE_TERM_MS);
    loop {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        if !strong.joined.load(Ordering::SeqCst) {
            return;
        }
        let (nr, acked, epoch, cancel) = strong.leases.next_wait();
        if !cancel.is_empty() {
            // A lease given back lets other clients in: closes behind finish first.
            after_closings(&strong).await;
            strong.pending.settle_to(strong.closings.published()).await;
        }
        let req = MdsLeaseWait {
            client: strong.client_id,
            acked,
            epoch,
            nr,
            cancel,
        };
        let (net, mds) = (strong.net.clone(), strong.mds.clone());
        let gave_back = strong.leases.gave_back();
        drop(strong);
        let sent = Instant::now();
        let out = {
            // A wait that gives nothing back is held by the MDS; leases the cache's bound
            // gives back meanwhile leave at once with a new one (which the MDS answers at
            // once). The held one is let go: its answer's recalls come again in the next.
            let held = req.cancel.is_empty();
            let answer = call(&net, &mds, &req, hold);
            tokio::pin!(answer);
            tokio::select! {
                biased;
                out = &mut answer => Some(out),
                _ = gave_back.notified(), if held => None,
            }
        };
        drop(net);
        let Some(out) = out else {
            continue;
        };
        let Some(strong) = inner.upgrade() else {
            return;
        };
        match out {
            Ok(r) => {
                let (dropped, upto) = {
                    let _gate = strong.pending.gate.lock();
                    // Every change queued, when every lease is lost; otherwise those that
                    // touch what is recalled (another directory's wait for no one here).
                    let upto = if strong.leases.loses_all(&r) {
                        strong.pending.queued()
                    } else {
                        strong.pending.last_touching(&r.fids)
                    };
                    (strong.leases.answered(nr, sent, &r), upto)
                };
                if dropped {
                    // What this client answered ahead, and closed behind, reaches the MDS
                    // before the recall is acknowledged: the change that recalled sees it.
                    after_closings(&strong).await;
                    let upto = upto.max(strong.closings.published());
                    strong.pending.settle_to(upto).await;
                    strong.leases.barrier().await;
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "lease wait failed");
                drop(strong);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Sends the queue in batches while the client lives: one batch on its way at a time, holding
/// whatever was queued while the last one was out. A short queue nobody waits on lingers for
/// [`LINGER`] first.
pub(crate) async fn flusher(inner: std::sync::Weak<Inner>) {
    let mut lingered = false;
    loop {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let hurry = strong.pending.hurry.clone();
        let wait = hurry.wake.notified();
        let batch: Option<Vec<Queued>> = {
            let mut q = strong.pending.queue.lock();
            let waited_on = q
                .front()
                .is_some_and(|f| hurry.upto.load(Ordering::SeqCst) >= f.seq);
            if !q.is_empty() && q.len() < LINGER_BATCH && !waited_on && !lingered {
                None
            } else {
                let n = q.len().min(MAX_BATCH);
                Some(q.drain(..n).collect())
            }
        };
        let Some(batch) = batch else {
            drop(strong);
            lingered = true;
            let _ = tokio::time::timeout(LINGER, wait).await;
            continue;
        };
        lingered = false;
        if batch.is_empty() {
            drop(strong);
            // Woken by a push, or checks now and then whether the client is gone.
            let _ = tokio::time::timeout(std::time::Duration::from_secs(1), wait).await;
            continue;
        }
        strong.pending.room.notify_waiters();
        let client = crate::Client::from_inner(strong.clone());
        send(&client, &strong, batch).await;
    }
}

async fn send(client: &crate::Client, inner: &Inner, mut batch: Vec<Queued>) {
    if inner.uncommitted.full() {
        let _ = client.sync_committed().await; // back-pressure: the MDS commits first
    }
    let stamp = inner.leases.stamp();
    let last = batch.last().map_or(0, |q| q.seq);
    let mds = inner.mds.clone();
    // A failure in the filesystem's terms, as a call sent alone would have seen it.
    let failed = |err: proto::RemoteError| {
        let e = ClientError::from(lnet::NetError::Remote {
            peer: mds.clone(),
            err,
        });
        Err((e.kind(), e.to_string()))
    };
    // The MDS stops a batch at a change it refuses for now (Busy: no storage target in
    // service yet, after its restart); that change and the rest are sent again, in order, as
    // a call sent alone would be. They were answered here already: failing them would lose
    // them.
    let (start, mut pause) = (tokio::time::Instant::now(), Duration::from_millis(20));
    let mut results: Vec<Outcome> = Vec::with_capacity(batch.len());
    while results.len() < batch.len() {
        let rest = &batch[results.len()..];
        // What this client had replies below, as it stands when the batch goes.
        let acked = inner.requests.replied_below();
        let req = MdsBatch {
            ops: rest
                .iter()
                .map(|q| match &q.op {
                    BatchOp::Reint(r) => BatchOp::Reint(MdsReint { acked, ..r.clone() }),
                    other => other.clone(),
                })
                .collect(),
        };
        match client.rpc(&mds, &req).await {
            Ok(r) if r.results.len() == rest.len() => {
                let retry = start.elapsed() < inner.cfg.retry_for;
                for r in r.results {
                    results.push(match r {
                        BatchResult::Reint(reply) => Ok(reply),
                        // A close answers nothing anyone waits for.
                        BatchResult::Closed => {
                            Err((FsErrorKind::Io, "a close, not a change".to_owned()))
                        }
                        BatchResult::Failed(e) if e.code == StatusCode::Busy && retry => break,
                        BatchResult::Failed(e) => failed(e),
                    });
                }
                if results.len() < batch.len() {
                    tracing::debug!(
                        left = batch.len() - results.len(),
                        "resending changes refused for now"
                    );
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
            }
            Ok(_) => results.extend(
                rest.iter()
                    .map(|_| Err((FsErrorKind::Io, "the MDS answered a batch short".to_owned()))),
            ),
            Err(e) => results.extend(rest.iter().map(|_| Err((e.kind(), e.to_string())))),
        }
    }
    for q in &batch {
        if let BatchOp::Reint(MdsReint { req: Some(r), .. }) = &q.op {
            // Answered or given up on: never sent again.
            inner.requests.settle(r.seq);
        }
    }
    for (q, out) in batch.iter_mut().zip(results) {
        let out = match (&q.op, out) {
            (BatchOp::Close(_), _) => continue,
            (BatchOp::Reint(r), Ok(mut reply)) => {
                inner.leases.learn_change(stamp, &r.mutation, &reply, &|f| {
                    inner.pending.settled(f, last)
                });
                let ticket = std::mem::take(&mut reply.ticket);
                inner
                    .uncommitted
                    .keep(reply.instance, reply.transno, ticket, reply.committed);
                Ok(reply)
            }
            (BatchOp::Reint(_), Err((kind, what))) => {
                if let Some((dir, name)) = &q.named {
                    inner.leases.undo(*dir, name);
                }
                if !q.quiet {
                    inner.pending.failed(Failed {
                        dir: q.named.as_ref().map(|(d, _)| *d),
                        fid: q.fid,
                        kind,
                        what: what.clone(),
                    });
                }
                Err((kind, what))
            }
        };
        if let Some(tx) = q.done.take() {
            let _ = tx.send(Some(out));
        }
    }
    inner.pending.touching.lock().retain(|_, seq| *seq > last);
    inner.pending.answered.send_replace(last);
}
