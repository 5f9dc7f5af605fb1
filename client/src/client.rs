//! A connection to a lode filesystem: metadata through the MDS, paths resolved component by
//! component, and every call resent across a server's restart for a bounded time.

use proto::FsErrorKind;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use lnet::AnyNet;
use lnet::{call, DmaBuffer, Registered, Transport};
use proto::layout::{Layout, StripeCount};
use proto::md::*;
use proto::registry::{ListTargets, TargetInfo};
use proto::{Fid, Nid, Rpc};

use crate::caps::Caps;
use crate::error::{ClientError, Result};

/// The root directory's FID.
pub use proto::fid::ROOT;
/// Longest path accepted.
pub const MAX_PATH: usize = 4096;
/// Symlinks followed in one resolution before ELOOP.
pub const MAX_SYMLINKS: usize = 40;

/// How often a client holding files open pings the MDS, by default: well within the MDS's
/// recovery window and eviction time.
pub const PING_EVERY: Duration = Duration::from_secs(5);

/// Client settings.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// How long a call keeps being resent while its server is unreachable or restarting,
    /// before it fails.
    pub retry_for: Duration,
    /// The credentials calls are made with.
    pub creds: Creds,
    /// Reads and writes in flight at once to each target, over all of this client's files.
    pub window: usize,
    /// How long one attempt of a call may take before it is resent.
    pub attempt: Duration,
    /// While it holds files open, how often the client pings the MDS: to stay known (an MDS
    /// evicts a silent client's handles), and to see a restart and count its open files again.
    pub ping_every: Duration,
    /// The client's identity towards the servers (its requests, open handles and writes carry
    /// it); random when `None`. A simulation names its clients so that a seed replays exactly.
    pub id: Option<u128>,
    /// How connections authenticate. `None` finds the key as [`lnet::auth::client_security`]
    /// does (`$LODE_KEY`, then `/etc/lode/client.key`); without one, connecting fails.
    /// `Some(Security::Off)` turns authentication off, explicitly.
    pub security: Option<lnet::auth::Security>,
    /// The GPU device buffers belong to; `None` detects one on first use (CUDA where this
    /// build has it and the machine has libcuda, else none, which refuses device buffers).
    pub gpu: Option<crate::gpu::Gpu>,
    /// The staging ring of device reads and writes: chunk size and chunk count.
    pub staging_chunk: usize,
    pub staging_chunks: usize,
    /// How long a call to one copy of a mirrored file may go unanswered (its server down,
    /// restarting or hung) before the client turns to the other copies: a write marks that
    /// mirror stale, a read reads another mirror.
    pub mirror_failover: Duration,
    /// Commit-behind: the MDS answers changes once applied, before they are durable, and this
    /// client keeps each change until the MDS has committed it, to replay it after an MDS
    /// restart (a crash of the MDS alone, or of this client alone, loses nothing
    /// acknowledged; `sync` and `fsync` wait for the commit). Off, every change is answered
    /// once durable: for short-lived tools that would exit holding uncommitted changes.
    pub commit_behind: bool,
    /// Leases (with commit-behind): the MDS recalls what this client caches before another
    /// changes it, so lookups, getattr and readdir are answered from the cache meanwhile.
    pub leases: bool,
    /// Changes answered ahead (with leases): creates and unlinks in a directory this client
    /// holds whole, and alone, are answered at once and sent in batches behind
    /// ([`crate::pending`]). The MDS recalls a lease held alone before any other client reads
    /// the directory, and the client sends what it queued before acknowledging, so every
    /// other client sees the changes at once.
    pub ahead: bool,
    /// The job this client's requests work for, as servers count them (`lode jobstats`);
    /// found in the environment as `$LODE_JOBID_VAR` says ([`lnet::job`]). A task may run
    /// under another job with [`lnet::job::scope`].
    pub job: Option<proto::JobId>,
    /// Where this client counts its calls to the servers (the mount's metrics endpoint).
    pub calls: Option<Arc<lnet::metrics::CallMetrics>>,
    /// Where the client reads the time it stamps on files it creates ahead of the MDS; the
    /// system's clock when `None` (a simulation gives its virtual time, so that a seed
    /// replays exactly).
    pub clock: Option<Clock>,
}

/// A clock a client reads the time from (see [`ClientConfig::clock`]).
#[derive(Clone)]
pub struct Clock(pub Arc<dyn Fn() -> Time + Send + Sync>);

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Clock")
    }
}

impl Default for ClientConfig {
    fn default() -> Self {
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        ClientConfig {
            retry_for: Duration::from_secs(60),
            creds: Creds {
                uid,
                gid,
                groups: vec![],
            },
            window: 16,
            attempt: Duration::from_secs(10),
            ping_every: PING_EVERY,
            id: None,
            security: None,
            gpu: None,
            staging_chunk: 4 << 20,
            staging_chunks: 4,
            mirror_failover: Duration::from_secs(3),
            commit_behind: true,
            leases: true,
            ahead: true,
            job: lnet::job::from_env(),
            calls: None,
            clock: None,
        }
    }
}

impl Inner {
    /// The state of a new session with the MDS `mds` (MDT0's, the one the client connects
    /// to) through `net`, as client `id`.
    pub(crate) fn new(
        mds: Nid,
        net: AnyNet,
        cfg: ClientConfig,
        id: u128,
        start: fn(&Arc<Inner>),
    ) -> Inner {
        let cfg_staging = (cfg.staging_chunk, cfg.staging_chunks);
        Inner {
            mds,
            home: 0,
            start,
            top: std::sync::Weak::new(),
            others: Default::default(),
            opening: tokio::sync::Mutex::new(()),
            hooks: Default::default(),
            net,
            cfg,
            servers: Default::default(),
            listing_targets: Default::default(),
            windows: Default::default(),
            client_id: id,
            requests: Default::default(),
            handles: Default::default(),
            writes: Arc::new(crate::unstable::Writes::new(write_id(id))),
            opens: crate::opens::Opens::default(),
            gpu: Default::default(),
            staging: crate::gpu::staging::Staging::new(cfg_staging.0, cfg_staging.1),
            shunned: Default::default(),
            uncommitted: Default::default(),
            evictions_reported: AtomicU64::new(0),
            joined: Default::default(),
            kick: Arc::new(tokio::sync::Notify::new()),
            replaying: tokio::sync::Mutex::new(()),
            leases: Default::default(),
            pending: Default::default(),
            closings: Default::default(),
            grants: Default::default(),
            kept: Default::default(),
            statahead: Default::default(),
            mdts: Default::default(),
            stripes: Default::default(),
            crypt: Default::default(),
        }
    }

    /// The state of this client's session with MDT `mdt`'s MDS at `mds`: its own leases,
    /// queue, uncommitted changes and open handles, sharing the data path's state (targets,
    /// windows, writes, grants, staging) and the request numbers with `top`, MDT0's.
    pub(crate) fn session(top: &Arc<Inner>, mdt: u32, mds: Nid) -> Inner {
        Inner {
            mds,
            home: mdt,
            start: top.start,
            top: Arc::downgrade(top),
            others: Default::default(),
            opening: tokio::sync::Mutex::new(()),
            hooks: Default::default(),
            net: top.net.clone(),
            cfg: top.cfg.clone(),
            servers: top.servers.clone(),
            listing_targets: top.listing_targets.clone(),
            windows: top.windows.clone(),
            client_id: top.client_id,
            requests: top.requests.clone(),
            handles: top.handles.clone(),
            writes: top.writes.clone(),
            opens: crate::opens::Opens::default(),
            gpu: top.gpu.clone(),
            staging: top.staging.clone(),
            shunned: top.shunned.clone(),
            uncommitted: Default::default(),
            evictions_reported: AtomicU64::new(0),
            joined: Default::default(),
            kick: Arc::new(tokio::sync::Notify::new()),
            replaying: tokio::sync::Mutex::new(()),
            leases: Default::default(),
            pending: Default::default(),
            closings: Default::default(),
            grants: top.grants.clone(),
            kept: Default::default(),
            statahead: Default::default(),
            mdts: top.mdts.clone(),
            stripes: top.stripes.clone(),
            crypt: top.crypt.clone(),
        }
    }
}

impl Inner {
    /// The time on this client's clock ([`ClientConfig::clock`]).
    pub(crate) fn now(&self) -> Time {
        self.cfg.clock.as_ref().map_or_else(Time::now, |c| (c.0)())
    }
}

/// A client's session with one MDS: MDT0's, which the client connects to (and which holds
/// the others'), or another MDT's, opened when the client first meets one of its FIDs. Each
/// session joins its MDS apart, with its own leases, changes answered ahead, uncommitted
/// changes and open handles, replayed to that MDS alone after its restart (Lustre's one
/// import per MDT); what the data path keeps is shared.
pub(crate) struct Inner {
    pub(crate) mds: Nid,
    /// The MDT this session is with.
    pub(crate) home: u32,
    /// Starts a session's background work ([`crate::connect`]'s pinger, lease channel and
    /// flusher).
    start: fn(&Arc<Inner>),
    /// MDT0's session, from another MDT's (none in MDT0's own).
    top: std::sync::Weak<Inner>,
    /// In MDT0's session: the sessions with the other MDTs, by index.
    others: parking_lot::Mutex<std::collections::HashMap<u32, Arc<Inner>>>,
    /// In MDT0's session: held while a session with another MDT is opened.
    opening: tokio::sync::Mutex<()>,
    /// In MDT0's session: the hooks every session's leases call (a mount's), for sessions
    /// opened after they were set.
    hooks: parking_lot::Mutex<(Option<crate::lease::Hook>, Option<crate::lease::Barrier>)>,
    /// Where each target's storage server is, learnt from the MDS and kept: the data path
    /// asks the MDS again only for a target it has not seen.
    servers: Arc<parking_lot::Mutex<std::collections::HashMap<u32, Nid>>>,
    /// Held while the target list is read again: calls that all missed a target at once (a
    /// mount's first writes, hundreds of closes behind landing together) wait for one read
    /// instead of each asking the MDS.
    listing_targets: Arc<tokio::sync::Mutex<()>>,
    /// Each target's window: how many of this client's reads and writes may be in flight to
    /// it at once, over all files and calls (Lustre's RPCs in flight per target).
    windows: Arc<parking_lot::Mutex<std::collections::HashMap<u32, Arc<tokio::sync::Semaphore>>>>,
    pub(crate) net: AnyNet,
    pub(crate) cfg: ClientConfig,
    pub(crate) client_id: u128,
    /// Request numbers, one sequence over every session: a request's number names it to
    /// every MDS (a change across MDTs carries it from one to another).
    pub(crate) requests: Arc<crate::requests::Requests>,
    /// Open handles' numbers, one sequence over every session.
    handles: Arc<AtomicU64>,
    /// Unsynced writes per file, and the order of writes.
    pub(crate) writes: Arc<crate::unstable::Writes>,
    /// The handles this session holds open, counted at its MDS.
    pub(crate) opens: crate::opens::Opens,
    /// The GPU backend, chosen on first use.
    gpu: Arc<std::sync::OnceLock<crate::gpu::Gpu>>,
    /// Pinned host chunks device reads and writes stage through.
    pub(crate) staging: Arc<crate::gpu::staging::Staging>,
    /// Targets that did not answer a mirrored file's call, and when: reads prefer the other
    /// copies for [`SHUNNED_FOR`] instead of waiting on them again.
    shunned: Arc<parking_lot::Mutex<std::collections::HashMap<u32, Instant>>>,
    /// Changes answered before they were durable, until the MDS commits them.
    pub(crate) uncommitted: crate::replay::Uncommitted,
    /// Evictions [`Client::sync`] has reported.
    pub(crate) evictions_reported: AtomicU64,
    /// In the MDS's table of clients (commit-behind on).
    pub(crate) joined: std::sync::atomic::AtomicBool,
    /// Wakes the pinger at once (a call to the MDS found it restarting or recovering).
    pub(crate) kick: Arc<tokio::sync::Notify>,
    /// One replay at a time.
    replaying: tokio::sync::Mutex<()>,
    /// What the MDS's leases let this client answer itself.
    pub(crate) leases: crate::lease::Leases,
    /// Changes answered before they were sent, on their way in order.
    pub(crate) pending: crate::pending::Pending,
    /// Closes finishing behind their callers.
    pub(crate) closings: Arc<crate::closing::Closings>,
    /// The grants this client's opens were given, lent to reads begun before their open.
    pub(crate) grants: Arc<crate::caps::Grants>,
    /// Handles kept at the MDS past their close, for the next open of the same file.
    pub(crate) kept: crate::kept::Kept,
    /// Per leased directory, how many lookups in it had to ask the MDS since it was last
    /// read whole with attributes (see [`Client::statahead_due`]); `usize::MAX`: not to be
    /// read so.
    statahead: parking_lot::Mutex<crate::FastMap<Fid, usize>>,
    /// Where the other MDTs' MDSs serve, as MDT0 last listed them.
    mdts: Arc<parking_lot::Mutex<std::collections::HashMap<u32, Nid>>>,
    /// The layouts of the striped directories this client met ([`crate::striped`]).
    pub(crate) stripes:
        Arc<parking_lot::Mutex<crate::FastMap<Fid, Arc<proto::dirstripe::DirStripe>>>>,
    /// The keys this client holds and the policies of the directories it met.
    pub(crate) crypt: Arc<crate::crypt::Keys>,
}

impl Inner {
    pub(crate) fn client_id(&self) -> u128 {
        self.client_id
    }

    /// MDT0's session, from another's.
    pub(crate) fn top_session(&self) -> Option<Arc<Inner>> {
        self.top.upgrade()
    }

    /// In MDT0's session: the session with MDT `k`, if open.
    pub(crate) fn other(&self, k: u32) -> Option<Arc<Inner>> {
        self.others.lock().get(&k).cloned()
    }

    /// In MDT0's session: the session with the other MDT served at `peer`, if open.
    pub(crate) fn other_at(&self, peer: &Nid) -> Option<Arc<Inner>> {
        self.others
            .lock()
            .values()
            .find(|s| s.mds == *peer)
            .cloned()
    }

    /// In MDT0's session: the sessions with the other MDTs open now, by index.
    pub(crate) fn others_now(&self) -> Vec<Arc<Inner>> {
        let mut all: Vec<(u32, Arc<Inner>)> = self
            .others
            .lock()
            .iter()
            .map(|(k, s)| (*k, s.clone()))
            .collect();
        all.sort_by_key(|(k, _)| *k);
        all.into_iter().map(|(_, s)| s).collect()
    }

    /// In MDT0's session: held while a session is opened.
    pub(crate) fn opening(&self) -> &tokio::sync::Mutex<()> {
        &self.opening
    }

    /// In MDT0's session: takes in `session` with MDT `k`, opened and joined: it gets the
    /// hooks the others' leases call, and its background work starts.
    pub(crate) fn adopt(&self, k: u32, session: Arc<Inner>) {
        {
            let hooks = self.hooks.lock();
            if let Some(h) = &hooks.0 {
                session.leases.on_drop(h.clone());
            }
            if let Some(b) = &hooks.1 {
                session.leases.on_barrier(b.clone());
            }
        }
        (self.start)(&session);
        self.others.lock().insert(k, session);
    }

    /// The next open handle's number (one sequence over every session).
    pub(crate) fn next_handle(&self) -> u64 {
        self.handles.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// Lookups in a leased directory that must ask the MDS before it is read whole with its
/// entries' attributes ([`Client::statahead_due`]).
const STATAHEAD_AFTER: usize = 16;
/// In a directory of more entries than `STATAHEAD_AFTER` times this, one such lookup per this
/// many entries.
const STATAHEAD_PER: usize = 64;
/// Directories whose lookups are counted at once; past it the counts start again.
const STATAHEAD_DIRS: usize = 1024;

/// Requests to the MDS that do not wait for the changes queued before them: those recovery
/// and the queue itself are made of.
const NOT_AFTER_QUEUED: &[proto::Opcode] = &[
    proto::msg::opcodes::MDS_BATCH,
    proto::msg::opcodes::MDS_RESERVE,
    proto::msg::opcodes::MDS_PING,
    proto::msg::opcodes::MDS_CONNECT,
    proto::msg::opcodes::MDS_REPLAY,
    proto::msg::opcodes::MDS_REPLAY_DONE,
    proto::msg::opcodes::MDS_REOPEN,
    proto::msg::opcodes::MDS_LEASE_WAIT,
    proto::msg::opcodes::MDS_LEASE_ALONE,
];

/// How many times a request refused for its shard of a striped directory is routed again,
/// each after reading the layout ([`crate::striped`]), before the refusal is the answer (a
/// layout never changes, so once is the rule).
const REROUTES: usize = 3;

/// How long a target that did not answer is read from last.
pub const SHUNNED_FOR: Duration = Duration::from_secs(10);

/// A connection to one filesystem. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
    /// Who this handle acts as.
    pub(crate) creds: Creds,
}

/// Parses `IP:PORT` or a NID.
pub fn parse_nid(s: &str) -> Result<Nid> {
    Nid::parse_loose(s).map_err(|e| ClientError::fs(FsErrorKind::Invalid, e.to_string()))
}

impl Client {
    /// Pings the MDS; if it restarted, replays this client's uncommitted changes and counts
    /// again the files this client holds open.
    pub(crate) async fn ping(&self) -> Result<()> {
        let ping = MdsPing {
            client: self.inner.client_id,
        };
        let pong = self.rpc(&self.inner.mds.clone(), &ping).await?;
        self.inner
            .uncommitted
            .committed(pong.instance, pong.committed);
        if self.inner.opens.restarted(pong.instance) {
            let _one = self.inner.replaying.lock().await;
            if let Err(e) = self.recover().await {
                self.inner.opens.replay_failed();
                return Err(e);
            }
        }
        Ok(())
    }

    /// Joins the MDS's table of clients whose uncommitted changes it waits for after a
    /// restart; returns the MDS's instance (the run joined) and, while it recovers, the last
    /// change of the run before its journal kept.
    pub(crate) async fn join(&self) -> Result<(u64, u64)> {
        let r = MdsConnect {
            client: self.inner.client_id,
        };
        let c = self.rpc(&self.inner.mds.clone(), &r).await?;
        self.inner.uncommitted.committed(c.instance, c.committed);
        self.inner.joined.store(true, Ordering::SeqCst);
        Ok((c.instance, c.recovered))
    }

    /// After an MDS restart: connects again, replays every uncommitted change in order,
    /// counts open files again, and tells the MDS it is done.
    async fn recover(&self) -> Result<()> {
        // The new run granted none of the leases of the last.
        self.inner.leases.lose_all();
        let joined = self.inner.joined.load(Ordering::SeqCst);
        let mut instance = 0;
        if joined {
            let old_run = self.inner.uncommitted.run();
            let (run, recovered) = self.join().await?;
            instance = run;
            // Changes the restarted MDS's journal kept are not sent again (Lustre's
            // last_committed at reconnect): a client that was not told they committed would
            // spend its recovery window hearing so one by one.
            let mut tickets = self
                .inner
                .uncommitted
                .take_all(instance)
                .into_iter()
                .filter(|(t, _)| *t > recovered)
                .collect::<Vec<_>>()
                .into_iter();
            let (mut applied, mut refused) = (0u64, 0u64);
            let mut why_refused = String::new();
            while let Some((transno, ticket)) = tickets.next() {
                let r = MdsReplay {
                    client: self.inner.client_id,
                    transno,
                    ticket,
                    instance,
                };
                let answer = match self.rpc(&self.inner.mds.clone(), &r).await {
                    Ok(a) => a,
                    Err(e) => {
                        // Not known replayed (the MDS restarted again, or is out of reach):
                        // kept for the next recovery, with those after it.
                        self.inner
                            .uncommitted
                            .put_back(old_run, std::iter::once((transno, r.ticket)).chain(tickets));
                        return Err(e);
                    }
                };
                match answer.outcome {
                    ReplayOutcome::Applied => applied += 1,
                    ReplayOutcome::Committed => {}
                    ReplayOutcome::Refused(why) => {
                        refused += 1;
                        tracing::error!(transno, %why, "an acknowledged change could not be replayed: it is lost");
                        why_refused = why;
                    }
                }
            }
            if refused > 0 {
                self.inner.uncommitted.lost_in_replay(refused, &why_refused);
            }
            tracing::info!(
                applied,
                refused,
                "replayed uncommitted changes after an MDS restart"
            );
        }
        self.reopen_all().await?;
        if joined {
            // Changes answered ahead and not yet sent were answered under leases the restart
            // took away: the MDS takes them before anyone else's new change, once every
            // client's replays are over (the queue's sender sends them then), and this client
            // says it is done again once they are answered.
            let ahead = self.inner.pending.unanswered() > 0;
            let done = MdsReplayDone {
                client: self.inner.client_id,
                instance,
                ahead,
            };
            self.rpc(&self.inner.mds.clone(), &done).await?;
            if ahead {
                // Looked at on the clock, not woken by the answers: the lease channel wakes on
                // them too, and a seed of the simulator must see the two in one order.
                let upto = self.inner.pending.queued();
                self.inner.pending.hurry_to(upto);
                while !self.inner.pending.answered_past(upto) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                let done = MdsReplayDone {
                    ahead: false,
                    ..done
                };
                self.rpc(&self.inner.mds.clone(), &done).await?;
            }
        }
        Ok(())
    }

    /// Waits until the MDS has committed every change it applied so far (this client's and
    /// others'): what `fsync` of a file or directory and `sync` promise.
    pub async fn sync(&self) -> Result<()> {
        // Every MDT this client has met (one it has not holds nothing of its).
        for s in self.sessions() {
            s.sync_quiet().await?;
            s.evicted_since(&s.inner.evictions_reported)?;
        }
        Ok(())
    }

    /// As [`Client::sync`], of this session's MDS alone, leaving a loss to an eviction for
    /// the caller to report (a file's `fsync` reports it for its own handle, through its
    /// MDT's session).
    pub(crate) async fn sync_quiet(&self) -> Result<()> {
        self.after_closings().await;
        let r = self.rpc(&self.inner.mds.clone(), &MdsSync {}).await?;
        self.inner.uncommitted.served_in(r.instance, r.committed);
        // A replay under way holds the tickets it took: its outcome (a change it could not
        // replay is lost) is part of what this sync reports.
        drop(self.inner.replaying.lock().await);
        self.failed_ahead(None)
    }

    /// EIO if an eviction lost acknowledged changes since `seen` (which then moves on): each
    /// such loss is reported once to each who asks (a `sync`, each file's `fsync` and close).
    pub(crate) fn evicted_since(&self, seen: &AtomicU64) -> Result<()> {
        let (n, what) = self.inner.uncommitted.evictions();
        if seen.swap(n, Ordering::SeqCst) < n {
            return Err(ClientError::fs(FsErrorKind::Io, what));
        }
        Ok(())
    }

    /// Evictions that lost acknowledged changes so far (a file remembers it at its open).
    pub(crate) fn evictions(&self) -> u64 {
        self.inner.uncommitted.evictions().0
    }

    /// Waits until the MDS has committed everything it answered this client, and reports a
    /// change answered ahead in directory `dir` that then failed ([`crate::pending`]).
    pub async fn sync_dir(&self, dir: Fid) -> Result<()> {
        if !self.here(dir) {
            return Box::pin(self.at(dir).await?.sync_dir(dir)).await;
        }
        self.after_closings().await;
        let r = self.rpc(&self.inner.mds.clone(), &MdsSync {}).await?;
        self.inner.uncommitted.served_in(r.instance, r.committed);
        drop(self.inner.replaying.lock().await);
        self.evicted_since(&self.inner.evictions_reported)?;
        self.failed_ahead(Some(dir))
    }

    /// Waits until the MDS has answered every change this client answered ahead so far
    /// ([`crate::pending`]), and reports the first that failed (not durable yet: see
    /// [`Client::sync`]).
    pub async fn settle_ahead(&self) -> Result<()> {
        for s in self.sessions() {
            s.inner.pending.settle().await;
            s.failed_ahead(None)?;
        }
        Ok(())
    }

    /// The first change answered ahead that failed since the last report, in `dir` (or of
    /// the file `dir`), or anywhere.
    pub(crate) fn failed_ahead(&self, dir: Option<Fid>) -> Result<()> {
        match self.inner.pending.take_errors(dir) {
            Some(f) => Err(ClientError::fs(f.kind, f.what)),
            None => Ok(()),
        }
    }

    /// The commit the queue's sender waits for when too much is uncommitted (it must not wait
    /// for the queue itself).
    pub(crate) async fn sync_committed(&self) -> Result<()> {
        let r = self
            .rpc_raw(&self.inner.mds.clone(), &MdsSync {}, None)
            .await?;
        self.inner.uncommitted.served_in(r.instance, r.committed);
        Ok(())
    }

    /// Changes this client holds that an MDS has not committed yet.
    pub fn uncommitted(&self) -> usize {
        self.sessions()
            .iter()
            .map(|s| s.inner.uncommitted.len())
            .sum()
    }

    /// Changes answered ahead that an MDS has not answered yet.
    pub fn unanswered(&self) -> u64 {
        self.sessions()
            .iter()
            .map(|s| s.inner.pending.unanswered())
            .sum()
    }

    /// Whether every change this client acknowledged is known committed: none answered ahead
    /// is still unanswered, and none answered is still uncommitted, at any MDT.
    pub fn all_committed(&self) -> bool {
        self.sessions()
            .iter()
            .all(|s| s.inner.pending.unanswered() == 0 && s.inner.uncommitted.len() == 0)
    }

    /// Leaves the filesystem cleanly: waits for every MDS to commit this client's changes
    /// and leaves their tables of clients (a restart then waits for nothing of this client).
    pub async fn close(&self) -> Result<()> {
        let sessions = self.sessions();
        // The other MDTs' sessions first, MDT0's last; each is left whatever another said.
        let mut first = Ok(());
        for s in sessions.iter().rev() {
            let left = s.close_session().await;
            if first.is_ok() {
                first = left;
            }
        }
        first
    }

    /// Leaves this session's MDS cleanly ([`Client::close`]).
    async fn close_session(&self) -> Result<()> {
        if !self.inner.joined.swap(false, Ordering::SeqCst) {
            return Ok(());
        }
        self.inner.leases.lose_all();
        self.close_kept(true);
        self.sync_quiet().await?;
        self.evicted_since(&self.inner.evictions_reported)?;
        let r = MdsDisconnect {
            client: self.inner.client_id,
        };
        self.rpc(&self.inner.mds.clone(), &r).await?;
        Ok(())
    }

    /// Counts again at the MDS every handle this client holds open.
    async fn reopen_all(&self) -> Result<()> {
        let held = self.inner.opens.replaying();
        tracing::info!(
            handles = held.len(),
            "the MDS restarted: counting open files again"
        );
        for chunk in held.chunks(MAX_REOPEN) {
            let handles = chunk
                .iter()
                .map(|&(h, fid)| (fid, self.handle(h)))
                .collect();
            let r = self
                .rpc(&self.inner.mds.clone(), &MdsReopen { handles })
                .await?;
            for fid in r.gone {
                tracing::warn!(%fid, "a file held open is gone from the MDS");
            }
        }
        Ok(())
    }

    /// This client's name for its handle `h`.
    pub(crate) fn handle(&self, h: u64) -> OpenHandle {
        OpenHandle {
            client: self.inner.client_id,
            handle: h,
        }
    }

    /// Remembers the open `handle` of `fid`, counted by the MDS since `replays` (from
    /// [`crate::opens::Opens::replays`] before the open was sent); counts it again if the MDS
    /// restarted and the client reopened its files meanwhile, without it.
    /// `replays` is from this session's count: a file of another MDT's (a create routed to
    /// a shard elsewhere) is counted again there, whatever happened meanwhile.
    pub(crate) async fn opened(&self, handle: OpenHandle, fid: Fid, replays: u64) -> Result<()> {
        if !self.here(fid) {
            let there = self.at(fid).await?;
            let replays = there.inner.opens.replays().wrapping_sub(1);
            return Box::pin(there.opened(handle, fid, replays)).await;
        }
        self.inner.opens.insert(handle.handle, fid);
        if self.inner.opens.replays() != replays {
            let r = MdsReopen {
                handles: vec![(fid, handle)],
            };
            self.rpc(&self.inner.mds.clone(), &r).await?;
        }
        Ok(())
    }

    /// Forgets the open `handle` of `fid` and tells the MDS.
    pub(crate) async fn close_handle(&self, handle: OpenHandle, fid: Fid) -> Result<()> {
        if !self.here(fid) {
            return Box::pin(self.at(fid).await?.close_handle(handle, fid)).await;
        }
        self.inner.opens.remove(handle.handle);
        self.rpc(&self.inner.mds.clone(), &MdsClose { fid, handle })
            .await?;
        Ok(())
    }

    /// The window of `target`: a read or write to it holds one permit while in flight.
    pub(crate) fn window(&self, target: u32) -> Arc<tokio::sync::Semaphore> {
        let n = self.inner.cfg.window.max(1);
        self.inner
            .windows
            .lock()
            .entry(target)
            .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(n)))
            .clone()
    }

    /// Whether new files can be striped over `want` targets now: the targets are up and the
    /// MDS's allocator has taken each of them into service (after a start, it first cleans up
    /// each target's orphans), as the MDS's target list says. Makes nothing in the namespace.
    pub async fn can_stripe_over(&self, want: u32) -> Result<bool> {
        let taking = self
            .targets()
            .await?
            .iter()
            .filter(|t| t.takes_stripes)
            .count();
        Ok(taking >= want as usize)
    }

    /// A handle on the connection `inner`, acting as its configured user.
    pub(crate) fn from_inner(inner: Arc<Inner>) -> Client {
        let creds = inner.cfg.creds.clone();
        Client { inner, creds }
    }

    /// The credentials this handle's calls carry.
    pub fn creds(&self) -> &Creds {
        &self.creds
    }

    /// The same connection, acting as another user (a mount serving many users).
    pub fn as_user(&self, creds: Creds) -> Client {
        Client {
            inner: self.inner.clone(),
            creds,
        }
    }

    /// Notes that `target` did not answer a call in time.
    pub(crate) fn shun(&self, target: u32) {
        self.inner.shunned.lock().insert(target, Instant::now());
    }

    /// Whether `target` failed to answer within [`SHUNNED_FOR`]; forgets older failures.
    pub(crate) fn shunned(&self, target: u32) -> bool {
        let mut s = self.inner.shunned.lock();
        match s.get(&target) {
            Some(t) if t.elapsed() < SHUNNED_FOR => true,
            Some(_) => {
                s.remove(&target);
                false
            }
            None => false,
        }
    }

    /// Sends `req` to `peer`, resending while the peer is unreachable, restarting or busy, for
    /// at most `retry_for`.
    pub(crate) async fn rpc<R: Rpc + Clone>(&self, peer: &Nid, req: &R) -> Result<R::Reply> {
        self.rpc_within(peer, req, None).await
    }

    /// As [`Client::rpc`], but giving up after `limit` when one is given (each attempt and the
    /// resends together): a mirrored file's call turns to another copy instead of waiting.
    pub(crate) async fn rpc_within<R: Rpc + Clone>(
        &self,
        peer: &Nid,
        req: &R,
        limit: Option<Duration>,
    ) -> Result<R::Reply> {
        if !NOT_AFTER_QUEUED.contains(&R::OPCODE) {
            // After the changes answered ahead of it to that MDS, in order.
            if *peer == self.inner.mds {
                self.inner.pending.settle().await;
            } else if let Some(there) = self.session_of_peer(peer) {
                there.inner.pending.settle().await;
            }
        }
        self.rpc_raw(peer, req, limit).await
    }

    /// As [`Client::rpc_within`], not waiting for the changes queued before it.
    pub(crate) async fn rpc_raw<R: Rpc + Clone>(
        &self,
        peer: &Nid,
        req: &R,
        limit: Option<Duration>,
    ) -> Result<R::Reply> {
        let start = Instant::now();
        let mut pause = Duration::from_millis(20);
        let retry_for = limit.unwrap_or(self.inner.cfg.retry_for);
        let attempt = limit.map_or(self.inner.cfg.attempt, |l| l.min(self.inner.cfg.attempt));
        loop {
            match call(&self.inner.net, peer, req, attempt).await {
                Ok(r) => return Ok(r),
                Err(e) if e.is_retryable() && start.elapsed() < retry_for => {
                    tracing::debug!(%peer, error = %e, "resending");
                    // Restarting or recovering: the pinger of its session sees a restart
                    // and replays, and counts the open files there again.
                    if let Some(there) = self.session_of_peer(peer) {
                        there.inner.kick.notify_one();
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Carries out a namespace change as this handle's user; resends never apply it twice.
    pub async fn reint(&self, mutation: Mutation) -> Result<Option<Inode>> {
        Ok(self.reint_with(mutation, None).await?.inode)
    }

    /// A mutation that also counts an open of the file it returns (create and open in one
    /// round trip).
    pub(crate) async fn reint_with(
        &self,
        mutation: Mutation,
        open: Option<OpenHandle>,
    ) -> Result<MdsReintReply> {
        self.reint_if(mutation, open, None).await
    }

    /// A mutation applied only while the file's size generation is `size_gen` (a `GrowSize`
    /// from a writer, see [`MdsReint::size_gen`]).
    pub(crate) async fn reint_if(
        &self,
        mutation: Mutation,
        open: Option<OpenHandle>,
        size_gen: Option<u64>,
    ) -> Result<MdsReintReply> {
        let names = crate::crypt::name_dirs(&mutation);
        if names.is_empty() {
            return self.reint_stored(mutation, open, size_gen).await;
        }
        let stored = self.stored_mutation(mutation.clone()).await?;
        let clear = stored == mutation;
        match self.reint_stored(stored, open, size_gen).await {
            // A directory believed clear was encrypted since (by another client): its policy
            // is asked for again, and the names encrypted.
            Err(e) if clear && e.is(FsErrorKind::NoKey) => {
                self.forget_policies(&names);
                let stored = self.stored_mutation(mutation).await?;
                self.reint_stored(stored, open, size_gen).await
            }
            other => other,
        }
    }

    /// As [`Client::reint_if`], `mutation`'s names as the MDS keeps them.
    async fn reint_stored(
        &self,
        mutation: Mutation,
        open: Option<OpenHandle>,
        size_gen: Option<u64>,
    ) -> Result<MdsReintReply> {
        let dirs = Self::dirs_of(&mutation);
        if dirs.is_empty() {
            return self.reint_routed(mutation, open, size_gen).await;
        }
        // A change of names in a striped directory goes to the shard each name lives in;
        // refused there for the wrong shard (a layout not known yet), the layouts are read
        // and it goes again.
        let mut tries = 0;
        loop {
            let routed = self.route(mutation.clone());
            match self.reint_routed(routed, open, size_gen).await {
                Err(e) if e.is(FsErrorKind::WrongShard) && tries < REROUTES => {
                    tries += 1;
                    for d in &dirs {
                        self.reread_stripe(*d).await?;
                    }
                }
                other => return other,
            }
        }
    }

    /// As [`Client::reint_if`], `mutation` naming shards already.
    async fn reint_routed(
        &self,
        mutation: Mutation,
        open: Option<OpenHandle>,
        size_gen: Option<u64>,
    ) -> Result<MdsReintReply> {
        let home = home_of(&mutation)?;
        if !self.here(home) {
            let there = self.at(home).await?;
            return Box::pin(there.reint_routed(mutation, open, size_gen)).await;
        }
        let req = self.next_req();
        let behind = self.inner.joined.load(Ordering::Relaxed);
        if behind && self.inner.uncommitted.full() {
            self.sync_committed().await?; // back-pressure: the MDS commits before more is kept
        }
        if through_names(&mutation) {
            // A file closed behind is seen through its directory by what this changes.
            self.after_closings().await;
        } else if let Mutation::Setattr { fid, .. } = &mutation {
            self.after_closing(*fid).await;
        }
        let leases = &self.inner.leases;
        let peer = self.inner.mds.clone();
        let r = MdsReint {
            creds: self.creds.clone(),
            mutation,
            req: Some(req),
            acked: self.inner.requests.replied_below(),
            open,
            size_gen,
            behind,
            lease: leases.live(),
            time: None,
        };
        let stamp = leases.stamp();
        let sent = self.rpc(&peer, &r).await;
        // Answered or given up on: never sent again.
        self.inner.requests.settle(req.seq);
        let mut reply = sent?;
        if let Some(i) = &reply.inode {
            self.learn_policy(i);
        }
        let pending = &self.inner.pending;
        leases.learn_change(stamp, &r.mutation, &reply, &|f| pending.settled(f, 0));
        let ticket = std::mem::take(&mut reply.ticket);
        self.inner
            .uncommitted
            .keep(reply.instance, reply.transno, ticket, reply.committed);
        Ok(reply)
    }

    /// The next request number of this client.
    pub(crate) fn next_req(&self) -> ReqId {
        ReqId {
            client: self.inner.client_id,
            seq: self.inner.requests.take(),
        }
    }

    /// Creates the regular file `name` in `parent` without waiting for the MDS, when this
    /// client's leases tell it the outcome (see [`crate::pending`]): the file as it will be,
    /// and the MDS's answer to come. `None` when the create must be sent and waited for. With
    /// `open`, the MDS counts that open of the file.
    pub async fn create_ahead(
        &self,
        parent: Fid,
        name: &[u8],
        mode: u32,
        open: Option<OpenHandle>,
    ) -> Option<Result<(Inode, crate::pending::Sent)>> {
        // Answered ahead only where the directory's policy is known (and, in an encrypted
        // one, its key held: the name is encrypted here, before anything is answered).
        let policy = self.known_policy(parent)?;
        let parent = self.shard_for(parent, name);
        if !self.here(parent) {
            let there = match self.at(parent).await {
                Ok(s) => s,
                Err(e) => return Some(Err(e)),
            };
            return Box::pin(there.create_ahead(parent, name, mode, open)).await;
        }
        let stored;
        let name = match &policy {
            None => name,
            Some(p) => {
                stored = self.new_name_under(p, parent, name)?;
                &stored[..]
            }
        };
        let inner = &self.inner;
        if !inner.joined.load(Ordering::Relaxed) || !inner.cfg.leases || !inner.cfg.ahead {
            return None;
        }
        let may = || {
            inner
                .leases
                .may_create(parent, name, &self.creds, |_, _| ())
        };
        if may().is_none() {
            // The first create in a directory held without its listing: read it once.
            if inner.leases.wants_listing(parent) {
                let _ = self.readdir_pages(parent, false).await;
            }
            self.hold_alone(parent).await;
            may()?;
        }
        let (fid, _gate) = loop {
            inner.pending.room().await;
            let reserve = || async {
                let r = MdsReserve {
                    client: inner.client_id(),
                    count: crate::pending::RESERVE,
                };
                let got = self.rpc(&inner.mds.clone(), &r).await?;
                Ok((
                    got.first.seq,
                    got.first.oid,
                    got.first.oid.saturating_add(got.count),
                ))
            };
            if let Err(e) = inner.pending.fids_at_hand(reserve).await {
                return Some(Err(e));
            }
            // Taken and queued under the gate at once (see `Pending::fids_at_hand`).
            let gate = inner.pending.gate.lock();
            if let Some(fid) = inner.pending.take_fid() {
                break (fid, gate);
            }
        };
        // Checked again: a recall may have come while the FID was fetched.
        let now = inner.now();
        let inode = inner
            .leases
            .may_create(parent, name, &self.creds, |dir, who| {
                new_inode(fid, Kind::File, mode, b"", None, dir, &who, now)
            })?;
        // The file as made here must be under the policy its directory was known by (its
        // contents are encrypted by it before the MDS answers).
        if proto::crypt::Policy::of_inode(&inode) != policy {
            return None;
        }
        inner.leases.created_here(parent, name, &inode);
        let r = MdsReint {
            creds: self.creds.clone(),
            mutation: Mutation::CreateAt {
                fid,
                parent,
                name: name.to_vec(),
                kind: Kind::File,
                mode: mode & PERM_MASK,
                target: vec![],
                layout: None,
            },
            req: Some(self.next_req()),
            acked: 0,
            open,
            size_gen: None,
            behind: true,
            lease: true,
            time: Some(now),
        };
        let named = Some((parent, name.to_vec()));
        let sent = inner.pending.push(BatchOp::Reint(r), named, Some(fid));
        Some(Ok((inode, sent)))
    }

    /// Removes the file or symlink `name` from `parent` without waiting for the MDS, when this
    /// client's leases tell it the outcome (see [`crate::pending`]). False when the unlink must
    /// be sent and waited for.
    pub async fn unlink_ahead(&self, parent: Fid, name: &[u8]) -> bool {
        if self.known_policy(parent).is_none() {
            return false;
        }
        let parent = self.shard_for(parent, name);
        if !self.here(parent) {
            let Ok(there) = self.at(parent).await else {
                return false;
            };
            return Box::pin(there.unlink_ahead(parent, name)).await;
        }
        let Some(Ok(stored)) = self.stored_name_known(parent, name) else {
            return false;
        };
        let name = &stored[..];
        let inner = &self.inner;
        if !inner.joined.load(Ordering::Relaxed) || !inner.cfg.leases || !inner.cfg.ahead {
            return false;
        }
        if inner.leases.may_unlink(parent, name, &self.creds).is_none() {
            self.hold_alone(parent).await;
            // A file made here whose create is still on its way: the create's answer brings
            // the file's lease, sooner than an unlink sent alone behind it would be answered.
            if let Some(seq) = inner
                .leases
                .entry_fid(parent, name)
                .and_then(|f| inner.pending.touching(f))
            {
                inner.pending.settle_to(seq).await;
            }
            if inner.leases.may_unlink(parent, name, &self.creds).is_none() {
                return false;
            }
        }
        if let Some(victim) = inner.leases.may_unlink(parent, name, &self.creds) {
            // Its objects stay until its last writes landed.
            self.after_closing(victim.fid).await;
        }
        inner.pending.room().await;
        let _gate = inner.pending.gate.lock();
        let Some(victim) = inner.leases.may_unlink(parent, name, &self.creds) else {
            return false;
        };
        inner.leases.unlinked_here(parent, name, victim.fid);
        let r = MdsReint {
            creds: self.creds.clone(),
            mutation: Mutation::Unlink {
                parent,
                name: name.to_vec(),
                dir: false,
            },
            req: Some(self.next_req()),
            acked: 0,
            open: None,
            size_gen: None,
            behind: true,
            lease: false,
            time: None,
        };
        let named = Some((parent, name.to_vec()));
        inner
            .pending
            .push(BatchOp::Reint(r), named, Some(victim.fid));
        true
    }

    /// Asks the MDS to let this client hold `dir`'s lease alone, so that changes there may be
    /// answered ahead while every other client still sees them at once (see
    /// [`proto::md::MdsLeaseAlone`]); not asked again a moment after a refusal.
    async fn hold_alone(&self, dir: Fid) {
        let leases = &self.inner.leases;
        if !self.here(dir) || !leases.may_ask_alone(dir) {
            return;
        }
        let recalls = leases.recalls();
        let r = MdsLeaseAlone {
            client: self.inner.client_id,
            dir,
        };
        let granted = self
            .rpc(&self.inner.mds.clone(), &r)
            .await
            .is_ok_and(|a| a.granted);
        leases.learn_alone(recalls, dir, granted);
    }

    /// Closes at the MDS the handles kept past their close ([`crate::kept`]) that are of no
    /// use any more, or all of them.
    pub(crate) fn close_kept(&self, all: bool) {
        let gone = self.inner.kept.sweep(&self.inner.leases, all);
        self.close_unkept(gone);
    }

    /// Closes kept handles taken out of use, without waiting.
    pub(crate) fn close_unkept(&self, gone: impl IntoIterator<Item = (Fid, crate::kept::Entry)>) {
        for (fid, e) in gone {
            self.inner.opens.remove(e.handle.handle);
            self.close_ahead(e.handle, fid, None);
        }
    }

    /// Handles kept at the MDS past their close now.
    pub fn kept_opens(&self) -> usize {
        self.sessions().iter().map(|s| s.inner.kept.len()).sum()
    }

    /// Closes an open counted at the MDS without waiting for the answer (nothing was done
    /// through it that the close must report).
    pub(crate) fn close_ahead(
        &self,
        handle: OpenHandle,
        fid: Fid,
        sent: Option<&crate::pending::Sent>,
    ) {
        if !self.here(fid) {
            if let Some(there) = self.at_now(fid) {
                return there.close_ahead(handle, fid, sent);
            }
            // Opened through a session that is gone (the client is closing): sent alone.
            let c = self.clone();
            tokio::spawn(async move {
                if let Err(e) = c.close_handle(handle, fid).await {
                    tracing::warn!(%fid, error = %e, "a close on another MDT failed");
                }
            });
            return;
        }
        if sent.is_some_and(|s| self.inner.pending.drop_open(s.seq())) {
            return;
        }
        self.inner
            .pending
            .push(BatchOp::Close(MdsClose { fid, handle }), None, None);
    }

    /// Registers memory so that reads can land in it directly (see [`crate::File::read_into`]).
    pub fn register<B: DmaBuffer>(&self, buf: B) -> Result<Registered<B>> {
        Ok(self.inner.net.register(buf)?)
    }

    /// The GPU backend device buffers belong to (detected on first use unless configured).
    pub fn gpu(&self) -> Arc<dyn crate::gpu::GpuBackend> {
        self.inner
            .gpu
            .get_or_init(|| {
                self.inner
                    .cfg
                    .gpu
                    .clone()
                    .unwrap_or_else(crate::gpu::Gpu::detect)
            })
            .0
            .clone()
    }

    /// Bytes device reads and writes passed through pinned host memory, since connecting.
    pub fn staged_bytes(&self) -> u64 {
        self.inner
            .staging
            .bytes
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The entry `name` of the directory `parent`: from the cache while leased.
    /// The entry `name` of `parent` if the lease cache answers for it now (found or absent),
    /// without waiting: `None` when only the MDS can tell.
    pub fn lookup_cached(&self, parent: Fid, name: &[u8]) -> Option<Result<Inode>> {
        if !self.here(parent) {
            return self.at_now(parent)?.lookup_cached(parent, name);
        }
        let name = match self.stored_name_known(parent, name)? {
            Ok(n) => n,
            Err(e) => return Some(Err(e)),
        };
        let hit = self.inner.leases.lookup(parent, &name, &self.creds)?;
        match &hit {
            Ok(i) if self.inner.closings.busy(i.fid) => None,
            _ => Some(hit),
        }
    }

    /// Whether this client's caller may open directory `dir` to list it, if the lease cache
    /// can tell now, without waiting.
    pub fn may_list_cached(&self, dir: Fid) -> Option<Result<()>> {
        if !self.here(dir) {
            return self.at_now(dir)?.may_list_cached(dir);
        }
        self.inner.leases.may_list(dir, &self.creds)
    }

    /// An inode's attributes if the lease cache holds them now, without waiting.
    pub fn getattr_cached(&self, fid: Fid) -> Option<Inode> {
        if !self.here(fid) {
            return self.at_now(fid)?.getattr_cached(fid);
        }
        if self.inner.closings.busy(fid) || self.inner.pending.touching(fid).is_some() {
            return None;
        }
        self.inner.leases.getattr_posix(fid)
    }

    /// Waits until no close of `fid` is finishing behind its caller ([`crate::closing`]).
    pub async fn after_closing(&self, fid: Fid) {
        if !self.here(fid) {
            if let Some(there) = self.at_now(fid) {
                Box::pin(there.after_closing(fid)).await;
            }
            return;
        }
        if self.inner.closings.busy(fid) {
            // A close behind lets its create go with the next batch; now someone waits.
            self.inner.pending.hurry_queued();
        }
        self.inner.closings.file(fid).await;
    }

    /// As [`Client::after_closing`], for a caller nobody waits on (a mount's release): the
    /// create the close waits for goes with the next batch, as it would have.
    pub async fn after_closing_unhurried(&self, fid: Fid) {
        if !self.here(fid) {
            if let Some(there) = self.at_now(fid) {
                Box::pin(there.after_closing_unhurried(fid)).await;
            }
            return;
        }
        self.inner.closings.file(fid).await;
    }

    /// Waits until every close begun behind its caller so far has finished
    /// ([`crate::closing`]).
    pub async fn after_closings(&self) {
        for s in self.sessions() {
            after_closings(&s.inner).await;
        }
    }

    pub async fn lookup(&self, parent: Fid, name: &[u8]) -> Result<Inode> {
        self.lookup_as(parent, name, true).await
    }

    /// As [`Client::lookup`]; without `whole`, a directory of another MDT comes as far as a
    /// walk through it needs (its FID), without asking its MDT for its attributes.
    async fn lookup_as(&self, parent: Fid, name: &[u8], whole: bool) -> Result<Inode> {
        let name = &self.stored_name(parent, name).await?;
        let mut tries = 0;
        loop {
            let shard = self.shard_for(parent, name);
            match self.lookup_routed(shard, name, whole).await {
                Err(e) if e.is(FsErrorKind::WrongShard) && tries < REROUTES => {
                    tries += 1;
                    self.reread_stripe(parent).await?;
                }
                Ok(i) => {
                    self.learn_stripe(&i);
                    return Ok(i);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// As [`Client::lookup_as`], `parent` the shard `name` lives in.
    async fn lookup_routed(&self, parent: Fid, name: &[u8], whole: bool) -> Result<Inode> {
        if !self.here(parent) {
            let there = self.at(parent).await?;
            return Box::pin(there.lookup_routed(parent, name, whole)).await;
        }
        let leases = &self.inner.leases;
        if let Some(hit) = leases.lookup(parent, name, &self.creds) {
            match &hit {
                // Its size is on its way (the cache marked it stale meanwhile).
                Ok(i) if self.inner.closings.busy(i.fid) => self.after_closing(i.fid).await,
                // A change of this client's own to it is queued (the size a close published
                // behind): the attributes cached may be from before it; its answer follows.
                Ok(i) if self.inner.pending.touching(i.fid).is_some() => {}
                _ => return hit,
            }
        }
        // An entry this client made whose change is still queued (a create answered ahead):
        // the change's answer brings its attributes, sooner than a lookup queued behind it.
        if let Some(seq) = leases
            .entry_fid(parent, name)
            .and_then(|f| self.inner.pending.touching(f))
        {
            self.inner.pending.settle_to(seq).await;
            if let Some(hit) = leases.lookup(parent, name, &self.creds) {
                match &hit {
                    Ok(i) if self.inner.closings.busy(i.fid) => self.after_closing(i.fid).await,
                    _ => return hit,
                }
            }
        }
        let live = leases.live();
        if live && !leases.held_dir(parent) {
            // The first miss in a directory: lease it, and read it whole if it is small, so
            // that the next lookups in it (found or not) are answered here.
            self.prime(parent).await;
            if let Some(hit) = leases.lookup(parent, name, &self.creds) {
                return hit;
            }
        }
        if let Some(entries) = leases.unlisted(parent, name) {
            if self.statahead_due(parent, entries) {
                // Names looked up one after another in a directory held without its
                // entries' attributes (a data loader opening the files of a manifest, `stat`
                // of each): read them all in one pass, leased, as Lustre's statahead does,
                // and answer this lookup and the next from them. A directory that could not
                // be read so (too large to hold, not leased whole, not readable by the
                // caller) is not tried again.
                let read = self
                    .readdir_upto(parent, true, crate::lease::MAX_LISTING)
                    .await;
                if let Ok(Some(_)) = read {
                    if let Some(hit) = leases.lookup(parent, name, &self.creds) {
                        return hit;
                    }
                }
                self.inner.statahead.lock().insert(parent, usize::MAX);
            }
        }
        // The MDS may hold a file closed behind without the size its close will publish.
        self.after_closings().await;
        let stamp = leases.stamp();
        let parent_held = leases.held_dir(parent);
        let r = MdsLookup {
            creds: self.creds.clone(),
            parent,
            name: name.to_vec(),
            lease: live.then_some(self.inner.client_id),
        };
        match self.rpc(&self.inner.mds.clone(), &r).await {
            Ok(a) => {
                leases.learn_lookup(stamp, parent, name, &a.inode, a.leased);
                let striped = a.inode.xattrs.contains_key(proto::dirstripe::LMV_XATTR);
                if (!a.leased || striped) && parent_held {
                    leases.learn_passing_dir(stamp, parent, name, &a.inode, striped);
                }
                // A directory of another MDT met in a walk is leased there at once (its
                // session's getattr), as a lookup here leases one of this MDT's: changes in it
                // may then be answered ahead.
                let elsewhere = a.inode.kind == Kind::Dir && !self.here(a.inode.fid);
                if !(whole || (live && elsewhere)) {
                    return Ok(a.inode);
                }
                self.fresh_if_elsewhere(parent, a.inode).await
            }
            Err(e) => {
                if e.is(FsErrorKind::NotFound) {
                    leases.learn_absent(stamp, parent, name);
                }
                Err(e)
            }
        }
    }

    /// Counts a lookup in the leased directory `dir` (of `entries` names where its listing is
    /// held, else 0) that must ask the MDS; true once such lookups are enough to pay for reading the whole
    /// directory with attributes: [`STATAHEAD_AFTER`] of them, or one for every
    /// [`STATAHEAD_PER`] entries in a larger directory, so that reading it stays a small part
    /// of what the lookups would cost. The count starts again after.
    fn statahead_due(&self, dir: Fid, entries: usize) -> bool {
        let mut counts = self.inner.statahead.lock();
        if counts.len() >= STATAHEAD_DIRS && !counts.contains_key(&dir) {
            counts.clear();
        }
        let n = counts.entry(dir).or_default();
        if *n == usize::MAX {
            return false;
        }
        *n += 1;
        if *n < STATAHEAD_AFTER.max(entries / STATAHEAD_PER) {
            return false;
        }
        counts.remove(&dir);
        true
    }

    /// `inode`, found in directory `dir`: when another MDT holds it (a remote directory), its
    /// attributes as that MDT has them (the directory's own MDT keeps only those it was made
    /// with).
    async fn fresh_if_elsewhere(&self, dir: Fid, inode: Inode) -> Result<Inode> {
        if proto::fid::mdt_of(inode.fid) == proto::fid::mdt_of(dir) {
            return Ok(inode);
        }
        self.getattr(inode.fid).await
    }

    /// Leases the directory `dir` and, when it is small, reads it whole under the lease.
    async fn prime(&self, dir: Fid) {
        let leases = &self.inner.leases;
        let Ok(d) = self.getattr(dir).await else {
            return;
        };
        if d.kind != Kind::Dir || !leases.held_dir(dir) {
            return;
        }
        let _ = self.readdir_pages(dir, false).await;
    }

    /// An inode's attributes: from the cache while leased.
    pub async fn getattr(&self, fid: Fid) -> Result<Inode> {
        if !self.here(fid) {
            return Box::pin(self.at(fid).await?.getattr(fid)).await;
        }
        self.after_closing(fid).await;
        let leases = &self.inner.leases;
        if let Some(seq) = self.inner.pending.touching(fid) {
            // Moved on by a change of this client's own still queued (a create answered
            // ahead in the directory, the size a close published behind): its answer brings
            // the attributes it left; those cached may be from before it.
            self.inner.pending.settle_to(seq).await;
        }
        if let Some(i) = leases.getattr(fid) {
            return Ok(i);
        }
        let stamp = leases.stamp();
        let r = MdsGetattr {
            fid,
            creds: self.creds().clone(),
            lease: leases.live().then_some(self.inner.client_id),
        };
        let a = self.rpc(&self.inner.mds.clone(), &r).await?;
        leases.learn_attr(stamp, &a.inode, a.leased);
        self.learn_stripe(&a.inode);
        Ok(a.inode)
    }

    /// The attributes of directory `dir` while changes of this client's own in it are still
    /// queued (creates and unlinks answered ahead), without waiting for their answers: those
    /// last learnt under the lease held now, with this client's time now as the directory's
    /// mtime and ctime (the MDS stamps the queued creates with their own times, no later). Its
    /// kind, mode and owners are the MDS's (own changes in a directory leave them); its times
    /// and link count are the MDS's only once the queue is answered. `None` where nothing of
    /// this client's is queued in `dir`, or its lease or attributes are not held.
    pub fn dir_attr_ahead(&self, dir: Fid) -> Option<Inode> {
        if !self.here(dir) {
            return self.at_now(dir)?.dir_attr_ahead(dir);
        }
        self.inner.pending.touching(dir)?;
        let mut i = self.inner.leases.dir_attr_held(dir)?;
        let now = self.inner.now();
        let later = |t: Time| {
            if (now.sec, now.nsec) > (t.sec, t.nsec) {
                now
            } else {
                t
            }
        };
        i.mtime = later(i.mtime);
        i.ctime = later(i.ctime);
        Some(i)
    }

    /// Whether `fid`'s attributes are answered from the cache now (a mount gives the kernel a
    /// long timeout for them, and hears when they are dropped).
    pub fn leased_attr(&self, fid: Fid) -> bool {
        self.at_now(fid)
            .is_some_and(|s| s.inner.leases.holds_attr(fid))
    }

    /// Whether the lease on `fid`'s attributes is held, even where this client's own changes
    /// moved them since (another client's change would have recalled it first).
    pub fn holds_lease(&self, fid: Fid) -> bool {
        self.at_now(fid).is_some_and(|s| s.inner.leases.holds(fid))
    }

    /// Whether root on this node is root at the MDS too (not squashed or mapped), as the
    /// MDS last said: root's supplementary groups then decide nothing. False without leases.
    pub fn root_stays_root(&self) -> bool {
        self.top().is_ok_and(|t| t.inner.leases.root_stays_root())
    }

    /// Whether the entry `name` of `parent` (found or absent) is answered from the cache now.
    pub fn leased_name(&self, parent: Fid, name: &[u8]) -> bool {
        let Some(Ok(name)) = self.stored_name_known(parent, name) else {
            return false;
        };
        self.at_now(parent)
            .is_some_and(|s| s.inner.leases.holds_name(parent, &name))
    }

    /// Calls `f` for every lease dropped (a mount drops the kernel's copy), at every MDT.
    /// Once.
    pub fn on_lease_dropped(&self, f: impl Fn(crate::lease::Dropped) + Send + Sync + 'static) {
        let f: crate::lease::Hook = Arc::new(f);
        if let Ok(top) = self.top() {
            top.inner.hooks.lock().0.get_or_insert(f.clone());
        }
        for s in self.sessions() {
            s.inner.leases.on_drop(f.clone());
        }
    }

    /// Recalls are acknowledged once `f`'s receiver resolves, or after a short while, at
    /// every MDT.
    pub fn on_lease_barrier(
        &self,
        f: impl Fn() -> tokio::sync::oneshot::Receiver<()> + Send + Sync + 'static,
    ) {
        let f: crate::lease::Barrier = Arc::new(f);
        if let Ok(top) = self.top() {
            top.inner.hooks.lock().1.get_or_insert(f.clone());
        }
        for s in self.sessions() {
            s.inner.leases.on_barrier(f.clone());
        }
    }

    /// How many recalls or losses of leases this client has seen, at every MDT: an answer
    /// given to someone else (the kernel) as leased before it moved on may have been dropped
    /// meanwhile.
    pub fn lease_recalls(&self) -> u64 {
        self.sessions()
            .iter()
            .map(|s| s.inner.leases.recalls())
            .sum()
    }

    /// Leases this client holds now, at every MDT.
    pub fn leases_held(&self) -> usize {
        self.sessions().iter().map(|s| s.inner.leases.len()).sum()
    }

    /// Splits an absolute path into its components.
    fn components(path: &str) -> Result<Vec<&[u8]>> {
        if !path.starts_with('/') {
            return Err(ClientError::fs(
                FsErrorKind::Invalid,
                format!("{path:?} is not an absolute path"),
            ));
        }
        if path.len() > MAX_PATH {
            return Err(ClientError::fs(
                FsErrorKind::NameTooLong,
                format!("a path is at most {MAX_PATH} bytes"),
            ));
        }
        Ok(path
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .map(str::as_bytes)
            .collect())
    }

    /// Resolves `path`; the last component's symlink is followed if `follow`.
    pub async fn resolve(&self, path: &str, follow: bool) -> Result<Inode> {
        self.resolve_as(path, follow, false).await
    }

    /// As [`Client::resolve`]; with `walk`, the inode found serves only to walk on (a
    /// directory's times may lag this client's own changes in it).
    async fn resolve_as(&self, path: &str, follow: bool, walk: bool) -> Result<Inode> {
        let mut todo: Vec<Vec<u8>> = Self::components(path)?
            .into_iter()
            .rev()
            .map(<[u8]>::to_vec)
            .collect();
        // The directories walked so far; each with its inode once looked up (the root's is
        // fetched only if the path ends there, saving a round trip on every other path).
        let mut stack: Vec<(Fid, Option<Inode>)> = vec![(ROOT, None)];
        let mut links = 0;
        while let Some(name) = todo.pop() {
            let dir = stack.last().map_or(ROOT, |(fid, _)| *fid);
            if name == b".." {
                if stack.len() > 1 {
                    stack.pop();
                }
                continue;
            }
            // A name the lease cache answers costs no round trip; otherwise (without leases)
            // the names up to the next `..` go in one.
            let passing = walk || !todo.is_empty();
            // In an encrypted directory the names are kept encrypted: looked up one by one,
            // each under its directory's key.
            let encrypted = self.dir_policy(dir).await?.is_some();
            let kept = match encrypted {
                true => self.stored_name(dir, &name).await?,
                false => name.clone(),
            };
            let cached = self.at_now(dir).and_then(|s| {
                let striped = |f: Fid| self.known_stripe(f).is_some();
                s.inner
                    .leases
                    .lookup_with(dir, &kept, &self.creds, passing, &striped)
            });
            // With leases, a miss is looked up alone: the answer (and the directory, read
            // whole the first time) is cached for the next walk.
            let one_by_one = self.inner.leases.live() || encrypted;
            let mut names = vec![name];
            while cached.is_none()
                && !one_by_one
                && names.len() < MAX_PATH_NAMES
                && todo.last().is_some_and(|n| n != b"..")
            {
                names.push(todo.pop().expect("checked"));
            }
            let walked = if let Some(hit) = cached {
                vec![hit?]
            } else if names.len() == 1 {
                vec![self.lookup_as(dir, &names[0], !passing).await?]
            } else {
                // The walk stops at a directory of another MDT, and at a striped one; the
                // names after it are walked there, from the shard the first lives in (the
                // layout read again when the MDS says it was not known right).
                let mut tries = 0;
                let mut got = loop {
                    let from = self.shard_for(dir, &names[0]);
                    let r = MdsLookupPath {
                        creds: self.creds.clone(),
                        dir: from,
                        names: names.iter().cloned().map(Name).collect(),
                    };
                    match self.rpc(&self.mds_for(from).await?, &r).await {
                        Err(e) if e.is(FsErrorKind::WrongShard) && tries < REROUTES => {
                            tries += 1;
                            self.reread_stripe(dir).await?;
                        }
                        other => break other?.inodes,
                    }
                };
                // Only where the path ends is a directory of another MDT wanted whole.
                if got.len() == names.len() && todo.is_empty() && !walk {
                    if let Some(last) = got.pop() {
                        let at = got.last().map_or(dir, |i| i.fid);
                        got.push(self.fresh_if_elsewhere(at, last).await?);
                    }
                }
                got
            };
            if walked.is_empty() || walked.len() > names.len() {
                return Err(ClientError::fs(
                    FsErrorKind::Io,
                    "the MDS answered a path lookup with more names than asked",
                ));
            }
            for i in &walked {
                self.learn_stripe(i);
            }
            // Names after a symlink were not walked: back on the list, in order.
            for n in names[walked.len()..].iter().rev() {
                todo.push(n.clone());
            }
            // Only the last inode walked can be a symlink: the MDS stops after one.
            let mut walked = walked;
            let inode = walked.pop().expect("not empty");
            stack.extend(walked.into_iter().map(|i| (i.fid, Some(i))));
            if inode.kind == Kind::Symlink && (follow || !todo.is_empty()) {
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(ClientError::fs(
                        FsErrorKind::Loop,
                        format!("too many symlinks in {path:?}"),
                    ));
                }
                let target = String::from_utf8_lossy(&self.link_target(&inode)?).into_owned();
                if target.starts_with('/') {
                    stack.truncate(1);
                }
                for c in target
                    .split('/')
                    .filter(|c| !c.is_empty() && *c != ".")
                    .rev()
                {
                    todo.push(c.as_bytes().to_vec());
                }
                continue;
            }
            stack.push((inode.fid, Some(inode)));
        }
        match stack.pop() {
            Some((_, Some(inode))) => Ok(inode),
            Some((fid, None)) => self.getattr(fid).await,
            None => self.getattr(ROOT).await,
        }
    }

    /// The directory holding `path`'s last component, and that component.
    pub(crate) async fn parent_of<'p>(&self, path: &'p str) -> Result<(Inode, &'p [u8])> {
        let comps = Self::components(path)?;
        let Some((last, _)) = comps.split_last() else {
            return Err(ClientError::fs(
                FsErrorKind::Invalid,
                "the root has no parent",
            ));
        };
        let cut = path.trim_end_matches('/').len() - last.len();
        let parent = self.resolve_as(&path[..cut.max(1)], true, true).await?;
        if parent.kind != Kind::Dir {
            return Err(ClientError::fs(
                FsErrorKind::NotDir,
                format!("{} is not a directory", &path[..cut]),
            ));
        }
        Ok((parent, last))
    }

    /// `stat`: follows a final symlink.
    pub async fn stat(&self, path: &str) -> Result<Inode> {
        let i = self.resolve(path, true).await?;
        self.whole(i).await
    }

    /// `lstat`: does not follow a final symlink.
    pub async fn lstat(&self, path: &str) -> Result<Inode> {
        let i = self.resolve(path, false).await?;
        self.whole(i).await
    }

    /// `i` with its xattrs, layout and target, where the cache gave only the POSIX attributes
    /// a listing brought.
    async fn whole(&self, i: Inode) -> Result<Inode> {
        if self
            .at_now(i.fid)
            .is_some_and(|s| s.inner.leases.is_bare(i.fid))
        {
            return self.getattr(i.fid).await;
        }
        Ok(i)
    }

    async fn create_node(
        &self,
        path: &str,
        kind: Kind,
        mode: u32,
        target: &[u8],
        layout: Option<Layout>,
    ) -> Result<Inode> {
        let (parent, name) = self.parent_of(path).await?;
        let m = Mutation::Create {
            parent: parent.fid,
            name: name.to_vec(),
            kind,
            mode,
            exclusive: true,
            target: target.to_vec(),
            layout,
        };
        self.reint(m)
            .await?
            .ok_or_else(|| ClientError::fs(FsErrorKind::Io, "no inode in the reply"))
    }

    pub async fn mkdir(&self, path: &str, mode: u32) -> Result<Inode> {
        self.create_node(path, Kind::Dir, mode, b"", None).await
    }

    /// `lfs mkdir -i MDT`: the directory on metadata target `mdt` (its entries, and what is
    /// made in it, go there), named in its parent wherever that is.
    pub async fn mkdir_on(&self, path: &str, mode: u32, mdt: u32) -> Result<Inode> {
        let (parent, name) = self.parent_of(path).await?;
        let m = Mutation::MkdirOn {
            parent: parent.fid,
            name: name.to_vec(),
            mode,
            mdt,
        };
        let made = self
            .reint(m)
            .await?
            .ok_or_else(|| ClientError::fs(FsErrorKind::Io, "no inode in the reply"))?;
        self.fresh_if_elsewhere(parent.fid, made).await
    }

    /// `mkdir -p`.
    pub async fn mkdir_all(&self, path: &str, mode: u32) -> Result<()> {
        let mut at = String::new();
        for c in Self::components(path)? {
            at.push('/');
            at.push_str(&String::from_utf8_lossy(c));
            match self.mkdir(&at, mode).await {
                Ok(_) => {}
                Err(e) if e.is(FsErrorKind::Exists) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    pub async fn symlink(&self, target: &str, path: &str) -> Result<Inode> {
        self.create_node(path, Kind::Symlink, 0o777, target.as_bytes(), None)
            .await
    }

    pub async fn readlink(&self, path: &str) -> Result<String> {
        let i = self.lstat(path).await?;
        if i.kind != Kind::Symlink {
            return Err(ClientError::fs(
                FsErrorKind::Invalid,
                format!("{path} is not a symlink"),
            ));
        }
        Ok(String::from_utf8_lossy(&self.link_target(&i)?).into_owned())
    }

    pub async fn link(&self, existing: &str, new: &str) -> Result<Inode> {
        let target = self.lstat(existing).await?;
        let (parent, name) = self.parent_of(new).await?;
        let m = Mutation::Link {
            fid: target.fid,
            parent: parent.fid,
            name: name.to_vec(),
        };
        self.reint(m)
            .await?
            .ok_or_else(|| ClientError::fs(FsErrorKind::Io, "no inode in the reply"))
    }

    /// Gives file `fid` the name `new` (a hard link by FID): also the one way to name a file
    /// made with no name ([`crate::At::Unnamed`]) while it is open.
    pub async fn link_fid(&self, fid: Fid, new: &str) -> Result<Inode> {
        let (parent, name) = self.parent_of(new).await?;
        let m = Mutation::Link {
            fid,
            parent: parent.fid,
            name: name.to_vec(),
        };
        self.reint(m)
            .await?
            .ok_or_else(|| ClientError::fs(FsErrorKind::Io, "no inode in the reply"))
    }

    async fn remove(&self, path: &str, dir: bool) -> Result<()> {
        let (parent, name) = self.parent_of(path).await?;
        if !dir && self.unlink_ahead(parent.fid, name).await {
            return Ok(());
        }
        self.reint(Mutation::Unlink {
            parent: parent.fid,
            name: name.to_vec(),
            dir,
        })
        .await?;
        Ok(())
    }

    pub async fn unlink(&self, path: &str) -> Result<()> {
        self.remove(path, false).await
    }

    pub async fn rmdir(&self, path: &str) -> Result<()> {
        self.remove(path, true).await
    }

    /// Atomic rename (with RENAME_NOREPLACE / RENAME_EXCHANGE through `flags`).
    pub async fn rename_with(&self, from: &str, to: &str, flags: RenameFlags) -> Result<()> {
        let (p1, n1) = self.parent_of(from).await?;
        let (p2, n2) = self.parent_of(to).await?;
        self.reint(Mutation::Rename {
            parent: p1.fid,
            name: n1.to_vec(),
            new_parent: p2.fid,
            new_name: n2.to_vec(),
            flags,
        })
        .await?;
        Ok(())
    }

    pub async fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.rename_with(from, to, RenameFlags::default()).await
    }

    pub async fn setattr(&self, path: &str, attr: SetAttr) -> Result<Inode> {
        let i = self.resolve(path, true).await?;
        self.reint(Mutation::Setattr { fid: i.fid, attr })
            .await?
            .ok_or_else(|| ClientError::fs(FsErrorKind::Io, "no inode in the reply"))
    }

    /// Every entry of a directory.
    pub async fn readdir(&self, path: &str) -> Result<Vec<DirEntry>> {
        let dir = self.resolve(path, true).await?;
        self.readdir_fid(dir.fid).await
    }

    /// Every entry of the directory `dir`.
    pub async fn readdir_fid(&self, dir: Fid) -> Result<Vec<DirEntry>> {
        let mut entries = self.readdir_pages(dir, false).await?.0;
        self.shown_entries(dir, &mut entries).await?;
        Ok(entries)
    }

    /// The entries of `dir` with each one's attributes (without layout, xattrs or symlink
    /// target), in one round trip per page as readdirplus needs.
    pub async fn readdir_plus(&self, dir: Fid) -> Result<Vec<(DirEntry, Inode)>> {
        let (entries, attrs) = self.readdir_plus_apart(dir).await?;
        Ok(entries.into_iter().zip(attrs).collect())
    }

    /// As [`Client::readdir_plus`], the entries and their attributes in two lists of the same
    /// length (for a caller building a listing of its own without a copy between).
    pub async fn readdir_plus_apart(&self, dir: Fid) -> Result<(Vec<DirEntry>, Vec<Inode>)> {
        let (mut entries, attrs) = self.readdir_pages(dir, true).await?;
        self.shown_entries(dir, &mut entries).await?;
        Ok((entries, attrs))
    }

    async fn readdir_pages(&self, dir: Fid, plus: bool) -> Result<(Vec<DirEntry>, Vec<Inode>)> {
        self.readdir_upto(dir, plus, usize::MAX)
            .await?
            .ok_or_else(|| ClientError::fs(FsErrorKind::Io, "a listing without end"))
    }

    /// As [`Client::readdir_plus_apart`], handing each page of entries and their attributes
    /// to `page` as it comes rather than the whole listing at its end, so that a caller can
    /// serve the first entries of a long directory while the rest is read. The pages show
    /// the sizes closes finishing behind publish, as a whole listing does.
    pub async fn readdir_plus_paged(
        &self,
        dir: Fid,
        mut page: impl FnMut(Vec<DirEntry>, Vec<Inode>) + Send,
    ) -> Result<()> {
        if self.dir_policy(dir).await?.is_some() {
            // An encrypted directory's names are decrypted before they are handed on.
            let (entries, attrs) = self.readdir_plus_apart(dir).await?;
            page(entries, attrs);
            return Ok(());
        }
        self.list_pages(dir, true, usize::MAX, &mut page).await?;
        Ok(())
    }

    /// As [`Client::readdir_pages`], giving up (`None`) once the directory has more than
    /// `limit` entries.
    async fn readdir_upto(
        &self,
        dir: Fid,
        plus: bool,
        limit: usize,
    ) -> Result<Option<(Vec<DirEntry>, Vec<Inode>)>> {
        // The pages as they came, joined once at the end: a listing of hundreds of thousands
        // of entries grown page by page would be copied again at every doubling.
        let mut pages: Vec<(Vec<DirEntry>, Vec<Inode>)> = vec![];
        if !self
            .list_pages(dir, plus, limit, &mut |e, a| pages.push((e, a)))
            .await?
        {
            return Ok(None);
        }
        let listed = pages.iter().map(|p| p.0.len()).sum();
        let mut entries = Vec::with_capacity(listed);
        let mut attrs = Vec::with_capacity(if plus { listed } else { 0 });
        for (e, a) in pages {
            entries.extend(e);
            attrs.extend(a);
        }
        Ok(Some((entries, attrs)))
    }

    /// The listing of `dir` from the lease cache, or read from the MDS page by page, each
    /// page handed to `page` as it comes; `false` once past `limit` entries (the pages past
    /// it unread).
    async fn list_pages(
        &self,
        dir: Fid,
        plus: bool,
        limit: usize,
        page: &mut (dyn FnMut(Vec<DirEntry>, Vec<Inode>) + Send),
    ) -> Result<bool> {
        let mut tries = 0;
        loop {
            if let Some(stripe) = self.known_stripe(dir) {
                // A striped directory: its shards one after another, each in name order (a
                // name is in one shard only, so none comes twice).
                let mut listed = 0usize;
                for shard in &stripe.shards {
                    let room = limit.saturating_sub(listed);
                    let mut counted = |e: Vec<DirEntry>, a: Vec<Inode>| {
                        listed += e.len();
                        page(e, a)
                    };
                    if !Box::pin(self.list_shard_pages(*shard, plus, room, &mut counted)).await? {
                        return Ok(false);
                    }
                }
                return Ok(true);
            }
            match self.list_shard_pages(dir, plus, limit, page).await {
                Err(e) if e.is(FsErrorKind::WrongShard) && tries < REROUTES => {
                    tries += 1;
                    self.reread_stripe(dir).await?;
                }
                other => return other,
            }
        }
    }

    /// As [`Client::list_pages`], of one directory's own entries (a shard's, or a directory
    /// not striped).
    async fn list_shard_pages(
        &self,
        dir: Fid,
        plus: bool,
        limit: usize,
        page: &mut (dyn FnMut(Vec<DirEntry>, Vec<Inode>) + Send),
    ) -> Result<bool> {
        if !self.here(dir) {
            let there = self.at(dir).await?;
            return Box::pin(there.list_shard_pages(dir, plus, limit, page)).await;
        }
        // A listing shows the sizes closes finishing behind will publish: those of the files
        // made in this directory are waited for first. A file closing behind under another
        // name (a hard link made while it was open) shows up among a page's entries: then
        // every close is waited for and the page read again.
        if self.inner.closings.any_in(dir) {
            self.inner.pending.hurry_queued();
        }
        self.inner.closings.dir(dir).await;
        let leases = &self.inner.leases;
        while let Some(hit) = leases.listing(dir, &self.creds, plus) {
            let (entries, attrs) = hit?;
            if self.inner.closings.any_busy(entries.iter().map(|e| e.fid)) {
                self.after_closings().await;
                continue;
            }
            if entries.len() > limit {
                return Ok(false);
            }
            attrs.iter().for_each(|i| self.learn_policy(i));
            page(entries, attrs);
            return Ok(true);
        }
        let stamp = leases.stamp();
        let lease = leases.live().then_some(self.inner.client_id);
        let mds = self.inner.mds.clone();
        // Copies of the pages for the lease cache, while they are leased.
        let mut kept: Vec<(Vec<DirEntry>, Vec<Inode>)> = vec![];
        let mut listed = 0;
        let mut after = vec![];
        let mut leased = true;
        // The leases pages brought, given back if the listing is not kept: the MDS grants
        // none with the pages of a directory longer than the cache keeps.
        let mut granted: Vec<Fid> = vec![];
        loop {
            // As many entries a page as the MDS fits in half the largest body (with
            // attributes, about 2,400 of short names), so a long directory is read in few
            // round trips; while leases come, no more than the cache keeps of a listing.
            let room = crate::lease::MAX_LISTING.saturating_sub(listed);
            let max = if leased && room > 0 {
                MAX_READDIR.min(room as u32)
            } else {
                MAX_READDIR
            };
            // Every page says who reads it, leases or not: the MDS recalls a directory held
            // alone from any other reader first (what was answered ahead there comes first),
            // and only this client's own pages leave it held. It grants no leases with the
            // pages of a directory longer than the cache keeps.
            let r = MdsReaddir {
                creds: self.creds.clone(),
                dir,
                after: after.clone(),
                max,
                plus,
                lease,
            };
            let mut got = match self.rpc(&mds, &r).await {
                Ok(p) => p,
                Err(e) => {
                    leases.give_back(&granted);
                    return Err(e);
                }
            };
            // A directory of another MDT listed here: its attributes as that MDT has them.
            for a in got.attrs.iter_mut() {
                if proto::fid::mdt_of(a.fid) != proto::fid::mdt_of(dir) {
                    if let Ok(i) = self.getattr(a.fid).await {
                        *a = i;
                    }
                }
            }
            if lease.is_some() && got.leased {
                if granted.is_empty() {
                    granted.push(dir);
                }
                granted.extend(got.attrs.iter().map(|a| a.fid));
            }
            if plus && got.attrs.len() != got.entries.len() {
                leases.give_back(&granted);
                return Err(ClientError::fs(
                    FsErrorKind::Io,
                    "a readdirplus page lost attributes",
                ));
            }
            if self
                .inner
                .closings
                .any_busy(got.entries.iter().map(|e| e.fid))
            {
                self.after_closings().await;
                continue;
            }
            leased &= lease.is_some()
                && got.leased
                && listed + got.entries.len() <= crate::lease::MAX_LISTING;
            if let Some(last) = got.entries.last() {
                after = last.name.clone();
            }
            listed += got.entries.len();
            if listed > limit {
                leases.give_back(&granted);
                return Ok(false);
            }
            if leased {
                kept.push((got.entries.clone(), got.attrs.clone()));
            } else {
                kept.clear();
            }
            got.attrs.iter().for_each(|i| self.learn_policy(i));
            page(got.entries, got.attrs);
            if got.end {
                if leased {
                    let mut entries = Vec::with_capacity(listed);
                    let mut attrs = Vec::with_capacity(if plus { listed } else { 0 });
                    for (e, a) in kept {
                        entries.extend(e);
                        attrs.extend(a);
                    }
                    leases.learn_listing(stamp, dir, &entries, &attrs);
                } else {
                    leases.give_back(&granted);
                }
                return Ok(true);
            }
        }
    }

    pub async fn statfs(&self) -> Result<FsStats> {
        self.rpc(&self.inner.mds.clone(), &MdsStatfs {}).await
    }

    /// The MDS holding `fid`: the MDT its FID names (MDT0's, the MDS this client connected
    /// to, for its own FIDs and any FID no MDT numbers), its session opened.
    pub(crate) async fn mds_for(&self, fid: Fid) -> Result<Nid> {
        Ok(self.at(fid).await?.inner.mds.clone())
    }

    /// Where MDT `k`'s MDS serves, from MDT0's list (read again when `k` is not in it).
    pub(crate) async fn mdt_nid(&self, k: u32) -> Result<Nid> {
        if let Some(n) = self.inner.mdts.lock().get(&k) {
            return Ok(n.clone());
        }
        let listed = self.mdts().await?;
        let mut known = self.inner.mdts.lock();
        for m in listed {
            known.insert(m.index, m.nid);
        }
        known.get(&k).cloned().ok_or_else(|| {
            ClientError::fs(
                FsErrorKind::Stale,
                format!("MDT{k} is not among the filesystem's MDTs"),
            )
        })
    }

    /// The filesystem's other MDTs, as MDT0 (the MDS this client connected to) knows them.
    pub async fn mdts(&self) -> Result<Vec<proto::registry::MdtInfo>> {
        let top = self.top()?;
        Ok(top
            .rpc(&top.inner.mds.clone(), &proto::registry::ListMdts {})
            .await?
            .mdts)
    }

    /// What MDT `mdt` (MDT0's answer is [`Client::statfs`]'s), served at `nid`, holds: its
    /// inodes and its device's space. One attempt: a down MDT is an error, not a wait.
    pub async fn mdt_statfs(&self, mdt: &proto::registry::MdtInfo) -> Result<FsStats> {
        let limit = self.inner.cfg.attempt.min(Duration::from_secs(5));
        let s = self.rpc_raw(&mdt.nid, &MdsStatfs {}, Some(limit)).await?;
        if s.mdt != mdt.index {
            return Err(ClientError::fs(
                FsErrorKind::Stale,
                format!("{} serves MDT{}, not MDT{}", mdt.nid, s.mdt, mdt.index),
            ));
        }
        Ok(s)
    }

    /// Every mirrored file the MDSs find with a stale mirror (`stale`) and/or an object on
    /// `target`, MDT by MDT, each in FID order. An MDT that does not answer is an error: the
    /// list would miss its files.
    pub async fn mirror_scan(&self, stale: bool, target: Option<u32>) -> Result<Vec<ScannedFile>> {
        let mut out = self.mirror_scan_mdt(0, stale, target).await?;
        for m in self.mdts().await? {
            if m.index != 0 {
                out.extend(self.mirror_scan_mdt(m.index, stale, target).await?);
            }
        }
        Ok(out)
    }

    /// As [`Client::mirror_scan`], the files of MDT `mdt` alone, a page at a time.
    pub async fn mirror_scan_mdt(
        &self,
        mdt: u32,
        stale: bool,
        target: Option<u32>,
    ) -> Result<Vec<ScannedFile>> {
        let nid = match mdt {
            0 => self.inner.mds.clone(),
            k => self.mdt_nid(k).await?,
        };
        let mut out = vec![];
        let mut after = None;
        loop {
            let page = self
                .rpc(
                    &nid,
                    &MdsMirrorScan {
                        after,
                        max: MAX_MIRROR_SCAN,
                        stale,
                        target,
                    },
                )
                .await?;
            after = page.files.last().map(|f| f.fid);
            out.extend(page.files);
            if page.end || after.is_none() {
                return Ok(out);
            }
        }
    }

    /// The storage server of each of `targets`.
    pub(crate) async fn servers_of(
        &self,
        targets: &std::collections::HashSet<u32>,
    ) -> Result<std::collections::HashMap<u32, Nid>> {
        let known = |map: &std::collections::HashMap<u32, Nid>| {
            targets
                .iter()
                .map(|t| map.get(t).map(|n| (*t, n.clone())))
                .collect::<Option<_>>()
        };
        if let Some(found) = known(&self.inner.servers.lock()) {
            return Ok(found);
        }
        let _one = self.inner.listing_targets.lock().await;
        if let Some(found) = known(&self.inner.servers.lock()) {
            return Ok(found); // read meanwhile
        }
        let fresh: std::collections::HashMap<u32, Nid> = self
            .targets()
            .await?
            .into_iter()
            .map(|t| (t.index, t.oss))
            .collect();
        let found = known(&fresh);
        *self.inner.servers.lock() = fresh;
        found.ok_or_else(|| {
            ClientError::fs(FsErrorKind::Io, "a target of this file is not registered")
        })
    }

    /// The capability to send with a request on `object` of the file `caps` is for: `None`
    /// when the servers check none (authentication off), else one fresh enough, renewed first
    /// if needed by sending the file's open again (which counts once).
    async fn object_capability(
        &self,
        caps: &Caps,
        target: u32,
        object: Fid,
    ) -> Result<Option<proto::capa::Capability>> {
        if let Some(c) = caps.fresh(target, object) {
            return Ok(c);
        }
        let _one = caps.renewing().lock().await;
        if let Some(c) = caps.fresh(target, object) {
            return Ok(c);
        }
        if !caps.renewable() {
            return Err(ClientError::fs(
                FsErrorKind::AccessDenied,
                format!("a borrowed capability for {} is too old", caps.fid()),
            ));
        }
        let mds = self.mds_for(caps.fid()).await?;
        let opened = self
            .rpc(
                &mds,
                &MdsOpen {
                    fid: caps.fid(),
                    handle: caps.handle(),
                    creds: caps.creds().clone(),
                    path: None,
                    lease: None,
                },
            )
            .await?;
        self.inner
            .grants
            .remember(caps.fid(), caps.creds(), &opened.grant);
        caps.set(opened.grant);
        caps.fresh(target, object).ok_or_else(|| {
            ClientError::fs(
                FsErrorKind::AccessDenied,
                format!(
                    "the MDS granted no access to object {object} of {}",
                    caps.fid()
                ),
            )
        })
    }

    /// Sends the object request `make` builds around the capability for `object` (see
    /// [`Caps`]), giving up on the server after `limit` when one is given. A storage server
    /// refusing it (EACCES: expired on the way, clocks apart, the objects changed) gets it
    /// once more with a renewed grant; the server refuses before doing anything, so the
    /// resend is safe.
    pub(crate) async fn object_rpc<R: Rpc + Clone>(
        &self,
        caps: &Caps,
        peer: &Nid,
        target: u32,
        object: Fid,
        make: impl Fn(Option<proto::capa::Capability>) -> R,
        limit: Option<std::time::Duration>,
    ) -> Result<R::Reply> {
        let capa = self.object_capability(caps, target, object).await?;
        match self.rpc_within(peer, &make(capa), limit).await {
            Err(e) if capa.is_some() && e.is(FsErrorKind::AccessDenied) => {
                caps.expire();
                let capa = self.object_capability(caps, target, object).await?;
                self.rpc_within(peer, &make(capa), limit).await
            }
            other => other,
        }
    }

    /// The MDS this client talks to.
    pub fn mds(&self) -> &Nid {
        &self.inner.mds
    }

    /// What a server (the MDS, or the storage server at `server`) says of itself: its clock,
    /// what it has served, its targets or its journal, and with `jobs` each job's work (for
    /// administrators: refused without the cluster key). Gives up after `limit`.
    pub async fn server_status(
        &self,
        server: Option<&Nid>,
        jobs: bool,
        limit: Duration,
    ) -> Result<proto::stats::ServerStatus> {
        let peer = server.unwrap_or(&self.inner.mds).clone();
        self.rpc_within(&peer, &proto::stats::ServerStats { jobs }, Some(limit))
            .await
    }

    /// Every registered target (for `lode df`, among others). Their servers' other addresses are taken in on the way:
    /// calls to a server go over any of its addresses that answers.
    pub async fn targets(&self) -> Result<Vec<TargetInfo>> {
        let targets = self
            .rpc(&self.inner.mds.clone(), &ListTargets {})
            .await?
            .targets;
        for t in &targets {
            self.inner.net.set_peer_rails(&t.oss, &t.rails);
        }
        Ok(targets)
    }

    /// Sets the layout of a directory (its default for new entries) or of an empty file; a
    /// missing path is created as an empty file with that layout.
    pub async fn setstripe(&self, path: &str, layout: Layout) -> Result<Inode> {
        layout.validate()?;
        match self.resolve(path, true).await {
            Ok(i) => self
                .reint(Mutation::SetLayout { fid: i.fid, layout })
                .await?
                .ok_or_else(|| ClientError::fs(FsErrorKind::Io, "no inode in the reply")),
            Err(e) if e.is(FsErrorKind::NotFound) => {
                self.create_node(path, Kind::File, 0o644, b"", Some(layout))
                    .await
            }
            Err(e) => Err(e),
        }
    }

    /// The layout of a file, or a directory's default.
    pub async fn getstripe(&self, path: &str) -> Result<Option<Layout>> {
        let i = self.resolve(path, true).await?;
        Ok(self.whole(i).await?.layout)
    }
}

/// Waits until every close begun behind its caller so far has finished, sending the creates
/// they wait for at once (a close behind lets its create go with the next batch).
pub(crate) async fn after_closings(inner: &Inner) {
    if inner.closings.any() {
        inner.pending.hurry_queued();
    }
    inner.closings.all().await;
}

/// Whether `m` changes what a directory shows of files in it (a file closed behind is then
/// waited for: see [`crate::closing`]).
fn through_names(m: &Mutation) -> bool {
    matches!(
        m,
        Mutation::Link { .. } | Mutation::Unlink { .. } | Mutation::Rename { .. }
    )
}

/// A RAID0 layout over `count` stripes (`None`: all targets) of `size` bytes.
pub fn raid0(count: Option<u32>, size: u64) -> Result<Layout> {
    let c = match count {
        None => StripeCount::All,
        Some(n) => StripeCount::Count(n),
    };
    Ok(Layout::new(vec![proto::layout::Component::raid0(c, size)])?)
}

/// The 64-bit id a client's writes are ordered under at the storage servers, from its 128-bit
/// id: the halves folded with the high one turned half-way round. Ids numbered under one
/// prefix (as the simulator numbers its clients: the seed, then a count) fold to distinct ids,
/// none of them 0 while both stay below 2^32; a plain xor of the halves folds the count equal
/// to the prefix to 0, which the order then reads as 1, another client's.
fn write_id(id: u128) -> u64 {
    (id as u64) ^ ((id >> 64) as u64).rotate_left(32)
}

/// The inode whose MDT a change goes to: the directory of a change of entries, the inode
/// otherwise. A change across two MDTs goes to the one that coordinates it.
fn home_of(m: &Mutation) -> Result<Fid> {
    Ok(match m {
        Mutation::Create { parent, .. }
        | Mutation::CreateAt { parent, .. }
        | Mutation::CreateUnnamed { parent, .. }
        | Mutation::Unlink { parent, .. }
        | Mutation::MkdirOn { parent, .. }
        | Mutation::MkdirStriped { parent, .. }
        | Mutation::MkdirForRemote { parent, .. }
        | Mutation::LinkRemoteDir { parent, .. } => *parent,
        // A rename between two MDTs goes to the source's, which moves the name there.
        Mutation::Rename { parent, .. } => *parent,
        // A link goes to its file's MDT, which names the file on another MDT's directory.
        Mutation::Link { fid, .. } => *fid,
        Mutation::Setattr { fid, .. }
        | Mutation::SetXattr { fid, .. }
        | Mutation::SetXattrIf { fid, .. }
        | Mutation::RemoveXattr { fid, .. }
        | Mutation::GrowSize { fid, .. }
        | Mutation::SetLayout { fid, .. }
        | Mutation::MirrorState { fid, .. }
        | Mutation::PlaceMirror { fid, .. }
        | Mutation::WriteMdt { fid, .. }
        | Mutation::RmdirRemote { fid }
        | Mutation::SetDirStripe { fid, .. }
        | Mutation::FreezeShard { fid, .. }
        | Mutation::RmdirShard { fid }
        | Mutation::HsmSet { fid, .. }
        | Mutation::HsmReimport { fid, .. } => *fid,
        Mutation::HsmImport { parent, .. } => *parent,
        Mutation::MakeShard { shard, .. } => shard.master,
        Mutation::MoveOut { moving } => moving.parent,
        Mutation::LinkIn { parent, .. }
        | Mutation::MoveDone { parent, .. }
        | Mutation::MoveAbort { parent, .. } => *parent,
        Mutation::DropLink { fid }
        | Mutation::Dropped { fid }
        | Mutation::LinkDone { fid, .. }
        | Mutation::LinkAbort { fid, .. } => *fid,
        Mutation::LinkOut { linking } => linking.fid,
        Mutation::PlaceOut { parent, .. }
        | Mutation::PlaceDone { parent, .. }
        | Mutation::PlaceAbort { parent, .. } => *parent,
        Mutation::Reparent { dir, .. } => *dir,
        Mutation::Destroyed { .. }
        | Mutation::RenameLock { .. }
        | Mutation::HsmLinks { .. }
        | Mutation::SkipInodes { .. }
        | Mutation::ReserveInodes { .. }
        | Mutation::Released { .. } => ROOT,
    })
}
