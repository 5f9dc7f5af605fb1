//! Clients that keep their uncommitted changes, and the recovery that replays them after a
//! restart (Lustre's recovery, with the MDS's table of clients as its `last_rcvd`).
//!
//! A change made with `behind` is answered before it is durable; the client keeps a sealed
//! ticket of it until the MDS's committed transaction number passes it. Clients that do so
//! join a durable table first ([`proto::md::MdsConnect`]). After a restart, while the table
//! holds clients, the MDS recovers before it serves anything else: each client connects again,
//! replays its tickets in transaction order and says it is done. Replays of all clients are
//! applied in one global order, the order they were first applied in: a replay waits until
//! every transaction before it has been replayed, or is known to be lost (every client still
//! expected is either done or waiting with a later one: the missing ones belonged to a client
//! that did not come back, or were the MDS's own bookkeeping). A client not back when the
//! window closes is evicted: its uncommitted changes are lost, nothing else is.
//!
//! ```text
//! clients file:  "LODECLI\0" (8) | crc32c(body) u32 | body = postcard Vec<u128>
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use proto::md::ReplayOutcome;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::disk::MetaDisk;
use crate::journal::Ticket;
use crate::store::{Store, StoreError};

const MAGIC: [u8; 8] = *b"LODECLI\0";
const FILE: &str = "clients";
/// Most clients in the table; past it, connects are refused (the table is read at every
/// restart and waited for).
pub const MAX_CLIENTS: usize = 1 << 16;

#[derive(Debug, thiserror::Error)]
pub enum ClientsError {
    #[error("the clients file: {0}")]
    Io(#[from] std::io::Error),
    #[error("the clients file is damaged: {0}")]
    Damaged(String),
    #[error("the MDS already serves {MAX_CLIENTS} clients that keep uncommitted changes")]
    Full,
}

/// The durable table of clients, and the recovery in progress.
pub struct Clients {
    /// Inode numbers set aside for clients' asynchronous creates.
    pub reserved: crate::reserve::Reservations,
    disk: Arc<dyn MetaDisk>,
    state: Mutex<State>,
    /// Held while a client's join or leave writes the table.
    saving: Mutex<()>,
    /// Moves on at every change of the recovery's state; replays waiting for their turn
    /// watch it.
    changed: watch::Sender<u64>,
    store: Arc<Store>,
}

struct State {
    table: BTreeSet<u128>,
    /// When each client of the table was last heard from (since this start).
    seen: HashMap<u128, Instant>,
    started: Instant,
    recovery: Option<Recovery>,
}

struct Recovery {
    /// The table as it was at the start: the clients that may hold uncommitted changes.
    expected: BTreeSet<u128>,
    done: HashSet<u128>,
    /// Clients done replaying that still hold changes they answered ahead and had not sent:
    /// once every replay is over, only their batches are served, until each says it is done
    /// again (or the window closes).
    flushing: HashSet<u128>,
    /// Replays waiting for their turn: transaction number -> client.
    waiting: BTreeMap<u64, u128>,
    /// The transaction being applied again now.
    applying: Option<u64>,
    /// The next transaction in the order of first application.
    next: u64,
    /// Transactions up to this one were committed before the restart.
    committed: u64,
    ends: Instant,
    replayed: u64,
    refused: u64,
    lost: u64,
    /// Clients the window closed on.
    evicted: Vec<u128>,
    /// What each replay in this recovery came to, for resends.
    outcomes: HashMap<u64, ReplayOutcome>,
    /// Why the journal took no replay: this run can apply nothing more, so every replay
    /// after it fails (the clients keep their changes for the next run) and recovery does
    /// not end.
    failed: Option<String>,
}

impl Recovery {
    /// Every expected client replayed all it had, and no replay is waiting or being applied.
    fn replays_over(&self) -> bool {
        self.applying.is_none()
            && self.waiting.is_empty()
            && self.expected.iter().all(|c| self.done.contains(c))
    }
}

fn load(disk: &dyn MetaDisk) -> Result<BTreeSet<u128>, ClientsError> {
    let Some(raw) = disk.read(FILE)? else {
        return Ok(BTreeSet::new());
    };
    if raw.len() < 12 || raw[..8] != MAGIC {
        return Err(ClientsError::Damaged("no header".into()));
    }
    let crc = u32::from_le_bytes([raw[8], raw[9], raw[10], raw[11]]);
    if crc32c::crc32c(&raw[12..]) != crc {
        return Err(ClientsError::Damaged("checksum mismatch".into()));
    }
    let list: Vec<u128> =
        postcard::from_bytes(&raw[12..]).map_err(|e| ClientsError::Damaged(e.to_string()))?;
    Ok(list.into_iter().collect())
}

fn save(disk: &dyn MetaDisk, table: &BTreeSet<u128>) -> Result<(), ClientsError> {
    let list: Vec<u128> = table.iter().copied().collect();
    let body = postcard::to_allocvec(&list).map_err(|e| ClientsError::Damaged(e.to_string()))?;
    let mut out = Vec::with_capacity(12 + body.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    out.extend_from_slice(&body);
    disk.replace(FILE, &out)?;
    Ok(())
}

impl Clients {
    /// The table kept on `disk`; a recovery of `window` starts when it names clients.
    pub fn open(
        disk: Arc<dyn MetaDisk>,
        store: Arc<Store>,
        window: Duration,
    ) -> Result<Arc<Clients>, ClientsError> {
        let table = load(&*disk)?;
        let now = Instant::now();
        let recovery = (!table.is_empty()).then(|| {
            let committed = store.committed();
            tracing::info!(
                clients = table.len(),
                committed,
                window_s = window.as_secs_f64(),
                "recovering: waiting for clients to replay their uncommitted changes"
            );
            Recovery {
                expected: table.clone(),
                done: HashSet::new(),
                flushing: HashSet::new(),
                waiting: BTreeMap::new(),
                applying: None,
                next: committed + 1,
                committed,
                ends: now + window,
                replayed: 0,
                refused: 0,
                lost: 0,
                evicted: vec![],
                outcomes: HashMap::new(),
                failed: None,
            }
        });
        if recovery.is_none() {
            // New inodes are numbered past every number the last run may have given out.
            store.skip_given_out();
        }
        let (changed, _) = watch::channel(0);
        let reserved = crate::reserve::Reservations::open(disk.clone())?;
        Ok(Arc::new(Clients {
            reserved,
            disk,
            saving: Mutex::new(()),
            state: Mutex::new(State {
                table,
                seen: HashMap::new(),
                started: now,
                recovery,
            }),
            changed,
            store,
        }))
    }

    /// Whether the MDS is recovering (serving only connects, replays, reopens and pings).
    pub fn recovering(&self) -> bool {
        self.state.lock().recovery.is_some()
    }

    /// The clients in the table.
    pub fn count(&self) -> usize {
        self.state.lock().table.len()
    }

    /// Whether `client` is in the table.
    pub fn holds(&self, client: u128) -> bool {
        self.state.lock().table.contains(&client)
    }

    /// `client` was heard from.
    pub fn seen(&self, client: u128) {
        let mut s = self.state.lock();
        if s.table.contains(&client) {
            s.seen.insert(client, Instant::now());
        }
    }

    /// `client` joins the table (durably) or, after a restart, comes back; whether the MDS is
    /// recovering. The table is written outside the lock the MDS's requests take (a join
    /// costs others nothing), one change at a time; a change made meanwhile by the MDS itself
    /// (an eviction) is in the table written, and the new client is in the table before the
    /// write starts, so every table written holds it.
    pub fn connect(&self, client: u128) -> Result<bool, ClientsError> {
        let _one = self.saving.lock();
        let table = {
            let mut s = self.state.lock();
            s.seen.insert(client, Instant::now());
            if s.table.contains(&client) {
                return Ok(s.recovery.is_some());
            }
            if s.table.len() >= MAX_CLIENTS {
                s.seen.remove(&client);
                return Err(ClientsError::Full);
            }
            s.table.insert(client);
            s.table.clone()
        };
        if let Err(e) = save(&*self.disk, &table) {
            let mut s = self.state.lock();
            s.table.remove(&client);
            s.seen.remove(&client);
            return Err(e);
        }
        Ok(self.state.lock().recovery.is_some())
    }

    /// `client` leaves the table: it holds nothing uncommitted.
    pub fn disconnect(&self, client: u128) -> Result<(), ClientsError> {
        let _one = self.saving.lock();
        let table = {
            let mut s = self.state.lock();
            let left = s.table.remove(&client).then(|| s.table.clone());
            s.seen.remove(&client);
            if let Some(r) = s.recovery.as_mut() {
                r.done.insert(client);
            }
            self.advance(&mut s);
            left
        };
        // A table that still names it costs a recovery window's wait at most; one that
        // lacked a client holding changes would lose them.
        if let Some(table) = table {
            save(&*self.disk, &table)?;
        }
        Ok(())
    }

    /// While recovering: the last transaction committed before the restart.
    pub fn recovered(&self) -> Option<u64> {
        self.state.lock().recovery.as_ref().map(|r| r.committed)
    }

    /// `client` has replayed all it held.
    /// `client` replayed all it had; with `ahead`, it still holds changes it answered ahead,
    /// to be taken before anyone else's ([`Clients::may_flush`]), and says so again without
    /// `ahead` once they are answered.
    pub fn replay_done(&self, client: u128, ahead: bool) {
        let mut s = self.state.lock();
        if let Some(r) = s.recovery.as_mut() {
            r.done.insert(client);
            if ahead {
                r.flushing.insert(client);
            } else {
                r.flushing.remove(&client);
            }
            r.ends = r.ends.max(Instant::now() + Duration::from_secs(2));
        }
        self.advance(&mut s);
    }

    /// Whether every replay of this recovery is over (the clients' changes answered ahead may
    /// still be coming): orphans can be cleaned up, for one.
    pub fn replaying(&self) -> bool {
        self.state
            .lock()
            .recovery
            .as_ref()
            .is_some_and(|r| !r.replays_over())
    }

    /// Whether a batch of `client`'s may be served now: outside recovery, or once every
    /// replay is over when `client` said it holds changes answered ahead (they go before
    /// anyone else's new change). Keeps the window open while they come.
    pub fn may_flush(&self, client: u128) -> bool {
        let mut s = self.state.lock();
        let Some(r) = s.recovery.as_mut() else {
            return true;
        };
        let ok = r.replays_over() && r.flushing.contains(&client);
        if ok {
            r.ends = r.ends.max(Instant::now() + Duration::from_secs(2));
        }
        ok
    }

    /// Replays `ticket`, first applied as transaction `transno`, in its turn. An error says
    /// the change was neither applied nor refused: the journal cannot take changes in this
    /// run (a full or failing disk), and the client keeps it for the next.
    pub async fn replay(
        &self,
        client: u128,
        transno: u64,
        ticket: Ticket,
    ) -> Result<ReplayOutcome, String> {
        let mut rx = self.changed.subscribe();
        loop {
            {
                let mut s = self.state.lock();
                let Some(r) = s.recovery.as_mut() else {
                    return Ok(ReplayOutcome::Refused(
                        "recovery is over: the change was lost with the MDS's restart".into(),
                    ));
                };
                if transno <= r.committed {
                    return Ok(ReplayOutcome::Committed);
                }
                // A resend of a replay (its first attempt waited past the client's time):
                // answered as the first.
                if let Some(done) = r.outcomes.get(&transno) {
                    return Ok(done.clone());
                }
                if let Some(why) = &r.failed {
                    r.waiting.remove(&transno);
                    return Err(why.clone());
                }
                if r.applying == Some(transno) {
                    // Its first attempt is being applied: wait for its outcome.
                    rx.mark_unchanged();
                } else if transno < r.next {
                    r.waiting.remove(&transno);
                    r.refused += 1;
                    return Ok(ReplayOutcome::Refused(format!(
                        "transaction {transno} came after recovery had passed it"
                    )));
                } else {
                    r.waiting.insert(transno, client);
                    self.advance(&mut s);
                    let r = s
                        .recovery
                        .as_mut()
                        .expect("advance ends recovery only when idle");
                    if r.next == transno && r.applying.is_none() {
                        r.waiting.remove(&transno);
                        r.applying = Some(transno);
                        break;
                    }
                    rx.mark_unchanged();
                }
            }
            // Woken by any change; the deadline is watched by `watch`.
            let _ = tokio::time::timeout(Duration::from_secs(1), rx.changed()).await;
        }
        let out = match self.store.replay(ticket).await {
            Ok(_) => ReplayOutcome::Applied,
            Err(StoreError::Namespace(e)) => ReplayOutcome::Refused(e.to_string()),
            Err(e) => {
                // Not this change's fault: no replay can be applied in this run.
                let why = format!("the MDS cannot replay changes now: {e}");
                tracing::error!(transno, error = %e, "a replay found the journal failed; clients keep their changes for the next run");
                let mut s = self.state.lock();
                if let Some(r) = s.recovery.as_mut() {
                    r.applying = None;
                    r.failed = Some(why.clone());
                }
                self.changed.send_modify(|n| *n += 1);
                return Err(why);
            }
        };
        let mut s = self.state.lock();
        if let Some(r) = s.recovery.as_mut() {
            r.applying = None;
            r.next = transno + 1;
            r.outcomes.insert(transno, out.clone());
            match out {
                ReplayOutcome::Applied => r.replayed += 1,
                _ => r.refused += 1,
            }
            // Progress keeps the window open for the rest.
            r.ends = r.ends.max(Instant::now() + Duration::from_secs(2));
        }
        // The next in line, and resends of this one, go on.
        self.changed.send_modify(|n| *n += 1);
        self.advance(&mut s);
        Ok(out)
    }

    /// Moves recovery on: past transactions no client still expected can replay, and to its
    /// end when every expected client is done.
    /// Replays waiting are told only when it moved on: a waiter that calls it again finding
    /// nothing new wakes no one (two resends of one replay would otherwise wake each other
    /// for ever).
    fn advance(&self, s: &mut State) {
        let Some(r) = s.recovery.as_mut() else {
            return;
        };
        if r.applying.is_some() || r.waiting.contains_key(&r.next) || r.failed.is_some() {
            return;
        }
        let waits = |c: &u128| r.waiting.values().any(|w| w == c);
        if !r.expected.iter().all(|c| r.done.contains(c) || waits(c)) {
            return;
        }
        if let Some((&t, _)) = r.waiting.first_key_value() {
            if t > r.next {
                r.lost += t - r.next;
                r.next = t;
                self.changed.send_modify(|n| *n += 1);
            }
            return;
        }
        if !r.flushing.is_empty() {
            // Replays over: the changes clients answered ahead come next, alone.
            return;
        }
        self.end(s);
        self.changed.send_modify(|n| *n += 1);
    }

    fn end(&self, s: &mut State) {
        let Some(r) = s.recovery.take() else { return };
        // No replay needs the numbers below the mark any more.
        self.store.skip_given_out();
        let evicted = r.evicted;
        tracing::info!(
            replayed = r.replayed,
            refused = r.refused,
            lost = r.lost,
            evicted = evicted.len(),
            "recovery done"
        );
        if !evicted.is_empty() {
            let mut table = s.table.clone();
            for c in &evicted {
                tracing::warn!(
                    client = format!("{c:032x}"),
                    "evicted: did not come back to replay"
                );
                table.remove(c);
                s.seen.remove(c);
            }
            match self.save_evicted(&table) {
                Ok(()) => s.table = table,
                Err(e) => tracing::error!(error = %e, "cannot save the table of clients"),
            }
        }
        self.changed.send_modify(|n| *n += 1);
    }

    /// Writes the table after evictions (under the state's lock). While a join or leave is
    /// writing it, that write (or the next) carries the eviction instead: a table on disk
    /// that still names an evicted client costs a recovery window's wait at most.
    fn save_evicted(&self, table: &BTreeSet<u128>) -> Result<(), ClientsError> {
        match self.saving.try_lock() {
            Some(_one) => save(&*self.disk, table),
            None => Ok(()),
        }
    }

    /// Closes the window: clients still expected that are neither done nor replaying are
    /// evicted. Outside recovery, clients silent for `evict_after` leave the table.
    pub fn tick(&self, evict_after: Duration) {
        let mut s = self.state.lock();
        let now = Instant::now();
        if let Some(r) = s.recovery.as_mut() {
            if now >= r.ends && r.applying.is_none() {
                let gone: Vec<u128> = r
                    .expected
                    .iter()
                    .filter(|c| !r.done.contains(c) && !r.waiting.values().any(|w| w == *c))
                    .copied()
                    .collect();
                for c in gone {
                    r.expected.remove(&c);
                    r.evicted.push(c);
                }
                if r.replays_over() && !r.flushing.is_empty() {
                    tracing::warn!(
                        clients = r.flushing.len(),
                        "recovery window closed before clients sent the changes they answered ahead: they go with everyone else's"
                    );
                    r.flushing.clear();
                }
                self.advance(&mut s);
            }
            return;
        }
        let since = |c: &u128| s.seen.get(c).copied().unwrap_or(s.started);
        let silent: Vec<u128> = s
            .table
            .iter()
            .filter(|c| now.duration_since(since(c)) > evict_after)
            .copied()
            .collect();
        if silent.is_empty() {
            return;
        }
        let mut table = s.table.clone();
        for c in &silent {
            tracing::warn!(
                client = format!("{c:032x}"),
                "evicted from the table of clients: silent"
            );
            table.remove(c);
        }
        match self.save_evicted(&table) {
            Ok(()) => {
                s.table = table;
                for c in silent {
                    s.seen.remove(&c);
                }
            }
            Err(e) => tracing::error!(error = %e, "cannot save the table of clients"),
        }
    }

    /// Runs [`Clients::tick`] every half second.
    pub async fn watch(self: Arc<Self>, evict_after: Duration) {
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            self.tick(evict_after);
        }
    }
}
