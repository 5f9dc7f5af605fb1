//! Object allocation: which targets a new file's stripes go to, and the objects they get.
//!
//! The MDS keeps a pool of precreated objects per target (as Lustre's precreate does), so
//! creating a file costs no round trip to a storage server. A maintenance task keeps the pools
//! topped up, destroys the objects of removed files (the durable destroy queue in the
//! namespace), and, the first time it sees a target after the MDS starts, destroys the objects
//! above the highest one any file knows about: those the previous run precreated and never gave
//! out.
//!
//! Targets are chosen round-robin among those up and not full; when free space is uneven (the
//! fullest target has less than 80% of the emptiest's free space), the emptiest are chosen
//! first, so space evens out.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use lnet::call;
use lnet::tcp::{TcpConfig, TcpEndpoint};
use lnet::{AnyNet, Transport};
use parking_lot::Mutex;
use proto::layout::{Component, Layout, StripeCount, StripeObject};
use proto::md::{Creds, Mutation};
use proto::ost::{OstDestroyAbove, OstDestroyMany, OstPrecreate, OstStatfs, MAX_DESTROY_MANY};
use proto::registry::{TargetInfo, TargetReport};
use proto::Nid;
use proto::{Fid, FsErrorKind};

use crate::namespace::NsError;
use crate::placement::{place_copy, Site};
use crate::registry::Registry;
use crate::store::{Change, Store};

/// Refill a pool when it falls below this many objects.
pub const LOW_WATER: usize = 512;
/// Objects asked for per refill.
pub const BATCH: u32 = 2048;
/// Objects destroyed per maintenance pass.
const DESTROY_BATCH: usize = 1024;
const RPC_DEADLINE: Duration = Duration::from_secs(10);
const PROBE_DEADLINE: Duration = Duration::from_secs(1);

fn no_space(what: impl Into<String>) -> NsError {
    NsError {
        kind: FsErrorKind::NoSpace,
        what: what.into(),
    }
}

pub struct Allocator {
    registry: Arc<Registry>,
    /// Files held open: their removed objects wait for the last close.
    pub open: Arc<crate::open::OpenFiles>,
    net: AnyNet,
    pools: Mutex<HashMap<u32, VecDeque<Fid>>>,
    /// Targets whose orphans have been cleaned up in this run.
    ready: Mutex<HashSet<u32>>,
    /// This MDS run (its instance), named in orphan cleanups.
    run: u64,
    /// The round-robin position of [`place`].
    next: Mutex<usize>,
    /// Until then, clients are counting their open files again after a start: nothing is
    /// destroyed.
    recovering_until: Instant,
    /// Clients silent for this long lose their open handles.
    evict_after: Duration,
    /// Clients replaying after a restart: orphans are not cleaned up (nor anything destroyed)
    /// until they are done, since objects of replayed creates are not named yet.
    replaying: std::sync::OnceLock<Arc<crate::recovery::Clients>>,
    /// The service's leases: recalled on the files released here.
    leases: std::sync::OnceLock<Arc<crate::lease::Leases>>,
    /// Targets whose cleanup their server refused, with why: kept out of service, and the
    /// refusal logged once per reason rather than at every pass.
    refused: Mutex<HashMap<u32, String>>,
    /// Per target, the highest object id this run gave a file: an orphan cleanup keeps it
    /// and every id below, whether or not the create that took it is applied yet.
    handed: Mutex<HashMap<u32, u32>>,
    /// Per target, moved on whenever its pool is dropped (a cleanup, a registration): a
    /// precreate answered after that brings ids a cleanup may have destroyed, and is not used.
    pool_epochs: Mutex<HashMap<u32, u64>>,
}

/// Whether new stripes may go to target `t`: up, cleaned up (`ready`), more than 1% free.
fn takes_stripes(ready: &HashSet<u32>, t: &TargetInfo) -> bool {
    t.up && ready.contains(&t.index) && t.free.saturating_mul(100) > t.total
}

impl Allocator {
    /// A storage server's other addresses: the allocator's calls to it use any that answers.
    pub fn peer_rails(&self, oss: &Nid, rails: &[Nid]) {
        self.net.set_peer_rails(oss, rails);
    }

    pub fn new(registry: Arc<Registry>) -> Arc<Allocator> {
        Self::with_net(registry, TcpEndpoint::client(TcpConfig::default()).into())
    }

    /// An allocator that reaches the storage servers through `net`.
    pub fn with_net(registry: Arc<Registry>, net: AnyNet) -> Arc<Allocator> {
        Arc::new(Allocator {
            registry,
            open: Arc::new(crate::open::OpenFiles::default()),
            net,
            pools: Mutex::new(HashMap::new()),
            ready: Mutex::new(HashSet::new()),
            run: rand::random(),
            next: Mutex::new(0),
            recovering_until: Instant::now(),
            evict_after: crate::server::EVICT_AFTER,
            replaying: std::sync::OnceLock::new(),
            leases: std::sync::OnceLock::new(),
            refused: Mutex::new(HashMap::new()),
            handed: Mutex::new(HashMap::new()),
            pool_epochs: Mutex::new(HashMap::new()),
        })
    }

    /// Names this MDS run `instance` in its orphan cleanups. Only before the allocator is
    /// shared.
    pub fn in_run(mut self: Arc<Self>, instance: u64) -> Arc<Self> {
        Arc::get_mut(&mut self)
            .expect("the allocator is not shared yet")
            .run = instance;
        self
    }

    /// Gives clients `window` from now to count their open files again, and evicts those
    /// silent for `evict_after`. Only before the allocator is shared.
    pub fn recovering(mut self: Arc<Self>, window: Duration, evict_after: Duration) -> Arc<Self> {
        let a = Arc::get_mut(&mut self).expect("the allocator is not shared yet");
        a.recovering_until = Instant::now() + window;
        a.evict_after = evict_after;
        self
    }

    /// Whether clients may still be counting their open files again after a start, or
    /// replaying their uncommitted changes.
    pub fn recovering_now(&self) -> bool {
        Instant::now() < self.recovering_until || self.replaying_now()
    }

    /// Whether clients are replaying their uncommitted changes after a start.
    fn replaying_now(&self) -> bool {
        self.replaying.get().is_some_and(|c| c.replaying())
    }

    /// Holds back orphan cleanup while `clients` recover.
    pub fn wait_for_replays(&self, clients: Arc<crate::recovery::Clients>) {
        let _ = self.replaying.set(clients);
    }

    /// The leases to recall on what maintenance removes (the service's).
    pub fn recall_through(&self, leases: Arc<crate::lease::Leases>) {
        let _ = self.leases.set(leases);
    }

    /// Targets new stripes may go to, among `known` (the registry's list, taken once for a
    /// whole layout).
    fn eligible_in<'a>(&self, known: &'a [TargetInfo]) -> Vec<&'a TargetInfo> {
        let ready = self.ready.lock();
        known.iter().filter(|t| takes_stripes(&ready, t)).collect()
    }

    /// Marks which of `list` (the registry's) take new stripes now, for those who ask.
    pub fn mark_takes_stripes(&self, list: &mut [TargetInfo]) {
        let ready = self.ready.lock();
        for t in list {
            t.takes_stripes = takes_stripes(&ready, t);
        }
    }

    /// Whether any target can take new stripes.
    /// The endpoint this MDS calls other servers through (storage servers, other MDSs).
    pub fn net(&self) -> &AnyNet {
        &self.net
    }

    /// The MDT this server holds: its objects are precreated in its own sequence on each
    /// target.
    pub fn mdt(&self) -> u32 {
        self.registry.filesystem().mdt
    }

    pub fn has_targets(&self) -> bool {
        self.has_targets_in(&self.registry.list())
    }

    /// The same, among `known` (the registry's list).
    pub fn has_targets_in(&self, known: &[TargetInfo]) -> bool {
        let ready = self.ready.lock();
        known.iter().any(|t| takes_stripes(&ready, t))
    }

    /// The targets of `c`'s stripes, on none of the servers in `avoid` (those holding another
    /// mirror of the file). A mirror over every target (`-c -1`) takes its share of the servers
    /// left: `copies_left` mirrors, this one included, still need theirs.
    fn choose(
        &self,
        known: &[TargetInfo],
        c: &Component,
        avoid: &HashSet<Nid>,
        exclude: &HashSet<u32>,
        copies_left: u16,
    ) -> Result<Vec<u32>, NsError> {
        let sites: Vec<Site<Nid>> = self
            .eligible_in(known)
            .into_iter()
            .map(|t| Site {
                index: t.index,
                server: t.oss.clone(),
                free: t.free,
            })
            .collect();
        place_copy(
            &sites,
            c,
            avoid,
            exclude,
            copies_left,
            &mut self.next.lock(),
        )
        .map_err(|e| no_space(e.to_string()))
    }

    async fn refill(&self, target: u32) -> Result<(), NsError> {
        let oss = self
            .registry
            .list()
            .into_iter()
            .find(|t| t.index == target)
            .map(|t| t.oss)
            .ok_or_else(|| no_space(format!("target {target} is unknown")))?;
        let epoch = self.pool_epochs.lock().get(&target).copied();
        let r = call(
            &self.net,
            &oss,
            &OstPrecreate {
                target,
                count: BATCH,
                mdt: self.mdt(),
            },
            RPC_DEADLINE,
        )
        .await
        .map_err(|e| no_space(format!("precreating on target {target}: {e}")))?;
        let seq = proto::fid::object_seq(target, self.mdt());
        if r.first.seq != seq
            || r.count == 0
            || r.count > BATCH
            || r.first.oid.checked_add(r.count - 1).is_none()
        {
            return Err(no_space(format!(
                "target {target}'s server answered a precreate with {} objects from {}, not of this MDT's sequence {seq:#x}",
                r.count, r.first
            )));
        }
        let mut pools = self.pools.lock();
        if self.pool_epochs.lock().get(&target).copied() != epoch {
            return Ok(());
        }
        let pool = pools.entry(target).or_default();
        pool.extend((0..r.count).map(|i| Fid::new(r.first.seq, r.first.oid + i, 0)));
        Ok(())
    }

    async fn take(&self, target: u32) -> Result<Fid, NsError> {
        for _ in 0..2 {
            if let Some(f) = self
                .pools
                .lock()
                .get_mut(&target)
                .and_then(VecDeque::pop_front)
            {
                {
                    let mut handed = self.handed.lock();
                    let h = handed.entry(target).or_default();
                    *h = (*h).max(f.oid);
                }
                // Checked after the id counts as handed: a cleanup that begins after this check
                // keeps it, and one that began before took the target out of service first
                // (its server registered again), so the id goes unused.
                if !self.ready.lock().contains(&target) {
                    return Err(NsError {
                        kind: FsErrorKind::WouldBlock,
                        what: format!(
                            "target {target} is being checked after its server registered again"
                        ),
                    });
                }
                return Ok(f);
            }
            self.refill(target).await?;
        }
        Err(no_space(format!("target {target} gave no objects")))
    }

    /// Gives every component of `template` its objects, using none of the targets in
    /// `exclude`.
    pub async fn instantiate_excluding(
        &self,
        template: &Layout,
        exclude: &HashSet<u32>,
    ) -> Result<Layout, NsError> {
        // One look at the registry for the whole layout (targets up, their servers).
        self.instantiate_among(template, exclude, &self.registry.list())
            .await
    }

    /// The same, among `known` (the registry's list, as the caller took it).
    pub async fn instantiate_among(
        &self,
        template: &Layout,
        exclude: &HashSet<u32>,
        known: &[TargetInfo],
    ) -> Result<Layout, NsError> {
        let mut out = template.clone();
        let mut taken: Vec<StripeObject> = vec![];
        let copies = out.mirror_count();
        // The servers each mirror's stripes are on: no server holds two copies of a byte.
        let mut servers_of: Vec<HashSet<Nid>> = vec![HashSet::new(); usize::from(copies)];
        // The copies the file has already, wherever their components sit in the template: a
        // mirror placed anew avoids all of their servers.
        for c in out.components.iter().filter(|c| c.is_instantiated()) {
            servers_of[usize::from(c.mirror)].extend(c.objects.iter().filter_map(|o| {
                known
                    .iter()
                    .find(|t| t.index == o.target)
                    .map(|t| t.oss.clone())
            }));
        }
        for c in &mut out.components {
            // With one copy there is no other mirror's server to avoid.
            let avoid: HashSet<Nid> = if copies > 1 {
                servers_of
                    .iter()
                    .enumerate()
                    .filter(|(m, _)| *m != usize::from(c.mirror))
                    .flat_map(|(_, s)| s.iter().cloned())
                    .collect()
            } else {
                HashSet::new()
            };
            if c.is_instantiated() {
                // A mirror the file already has (extending it keeps the old copies).
                continue;
            }
            let result = async {
                let mut objects = vec![];
                // This mirror and the later ones still to be placed each need servers.
                let copies_left = (c.mirror..copies)
                    .filter(|m| {
                        template
                            .components
                            .iter()
                            .any(|x| x.mirror == *m && !x.is_instantiated())
                    })
                    .count() as u16;
                for target in self.choose(known, c, &avoid, exclude, copies_left.max(1))? {
                    objects.push(StripeObject {
                        target,
                        fid: self.take(target).await?,
                    });
                }
                Ok::<_, NsError>(objects)
            }
            .await;
            match result {
                Ok(objects) if copies <= 1 => {
                    taken.extend(&objects);
                    c.stripe_count = StripeCount::Count(objects.len() as u32);
                    c.objects = objects;
                }
                Ok(objects) => {
                    servers_of[usize::from(c.mirror)].extend(objects.iter().filter_map(|o| {
                        known
                            .iter()
                            .find(|t| t.index == o.target)
                            .map(|t| t.oss.clone())
                    }));
                    taken.extend(&objects);
                    c.stripe_count = StripeCount::Count(objects.len() as u32);
                    c.objects = objects;
                }
                Err(e) => {
                    self.give_back(&taken);
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    /// Storage server targets that registered (again): each is cleaned up again before it
    /// takes new stripes, as at this MDS's start. Its server may have restarted on another
    /// copy of it (restored, rolled back), and the objects precreated for the pool may be
    /// gone; the cleanup checks LAST_ID against the namespace and refills the pool.
    pub fn registered(&self, targets: &[u32]) {
        let mut ready = self.ready.lock();
        for t in targets {
            ready.remove(t);
            self.drop_pool(*t);
        }
    }

    /// Forgets the ids precreated for `target`'s pool, and any a precreate under way brings.
    fn drop_pool(&self, target: u32) {
        let mut pools = self.pools.lock();
        pools.remove(&target);
        *self.pool_epochs.lock().entry(target).or_default() += 1;
    }

    /// Returns unused objects to their pools.
    pub fn give_back(&self, objects: &[StripeObject]) {
        let mut pools = self.pools.lock();
        for o in objects {
            pools.entry(o.target).or_default().push_front(o.fid);
        }
    }

    /// One maintenance pass: probe silent targets, clean up new ones, top up pools, destroy
    /// removed objects.
    pub async fn maintain(&self, store: &Store) {
        self.probe_silent().await;
        let up: Vec<TargetInfo> = self.registry.list().into_iter().filter(|t| t.up).collect();
        let (ready, new): (Vec<&TargetInfo>, Vec<&TargetInfo>) = {
            let ready = self.ready.lock();
            up.iter().partition(|t| ready.contains(&t.index))
        };
        // Replayed creates will name objects above the namespace's highest.
        if !new.is_empty() && !self.replaying_now() {
            // At once: a target slow to answer holds up no other's.
            futures_util::future::join_all(new.into_iter().map(|t| self.clean_up(store, t))).await;
        }
        for t in ready {
            let low = self
                .pools
                .lock()
                .get(&t.index)
                .is_none_or(|p| p.len() < LOW_WATER);
            if low {
                if let Err(e) = self.refill(t.index).await {
                    tracing::warn!(target = t.index, error = %e, "precreate failed");
                }
            }
        }
        self.destroy_removed(store).await;
    }

    /// Destroys `t`'s orphans (objects above the namespace's highest on it, precreated by an
    /// earlier run), then takes it into service. A target answers one cleanup at a time, and
    /// a second one from this run only after the first is done, as a no-op (`run`): so passes
    /// may overlap (the timer's, and those creates start while no target is in service), a
    /// cleanup whose answer is late is sent again at the next pass, and any answer means the
    /// orphans are gone.
    async fn clean_up(&self, store: &Store, t: &TargetInfo) {
        let keep = store
            .read(|ns| ns.highest_object(t.index, self.mdt()))
            .max(self.handed.lock().get(&t.index).copied().unwrap_or(0));
        // Ids in the pool, and any a precreate under way brings, are above `keep`: the
        // cleanup destroys them.
        self.drop_pool(t.index);
        let req = OstDestroyAbove {
            target: t.index,
            mdt: self.mdt(),
            keep_up_to: keep,
            run: self.run,
            fs: self.registry.filesystem().uuid,
        };
        match call(&self.net, &t.oss, &req, RPC_DEADLINE).await {
            Ok(r) => {
                if r.destroyed > 0 {
                    tracing::info!(
                        target = t.index,
                        destroyed = r.destroyed,
                        "destroyed orphan objects"
                    );
                }
                if self.refused.lock().remove(&t.index).is_some() {
                    tracing::info!(
                        target = t.index,
                        "the target's server accepts its cleanup now"
                    );
                }
                self.ready.lock().insert(t.index);
            }
            // The server refuses to destroy what the namespace may still need (too many
            // objects, a rolled-back LAST_ID, another filesystem): the target stays out of
            // service until an operator says otherwise, and nothing is destroyed.
            Err(lnet::NetError::Remote { err: e, .. }) if e.code == proto::StatusCode::Refused => {
                let mut refused = self.refused.lock();
                if refused.get(&t.index) != Some(&e.message) {
                    tracing::error!(
                        target = t.index,
                        oss = %t.oss,
                        reason = %e.message,
                        "the target's server refused its orphan cleanup: it takes no new files"
                    );
                    refused.insert(t.index, e.message);
                }
            }
            Err(e) => {
                tracing::warn!(target = t.index, error = %e, "orphan cleanup failed; will retry")
            }
        }
    }

    /// Asks targets not heard from lately whether they are up (after an MDS restart, before
    /// their next heartbeat), and records the answer as a heartbeat.
    async fn probe_silent(&self) {
        for t in self.registry.list().into_iter().filter(|t| !t.up) {
            let probe = call(
                &self.net,
                &t.oss,
                &OstStatfs { target: t.index },
                PROBE_DEADLINE,
            )
            .await;
            if let Ok(space) = probe {
                let report = TargetReport {
                    index: Some(t.index),
                    uuid: t.uuid,
                    fs: None,
                    total: space.total,
                    free: space.free,
                };
                self.registry.heartbeat(&t.oss, &t.rails, &[report]);
            }
        }
    }

    async fn destroy_removed(&self, store: &Store) {
        if self.recovering_now() {
            return;
        }
        for client in self.open.evict(self.evict_after) {
            tracing::warn!(
                client = %format_args!("{client:032x}"),
                silent_s = self.evict_after.as_secs(),
                "evicted a silent client: its open files may be destroyed"
            );
        }
        let released = store.releasable(DESTROY_BATCH, |f| self.open.is_open(f));
        if !released.is_empty() {
            let n = released.len();
            // Whoever still holds their attributes drops them first, as for any change.
            let _recall = match self.leases.get() {
                Some(l) => Some(l.recall(&released, None).await),
                None => None,
            };
            match store
                .apply(Change::new(
                    Mutation::Released { fids: released },
                    Creds::root(),
                ))
                .await
            {
                Ok(_) => tracing::debug!(files = n, "released removed files' bytes on the MDS"),
                Err(e) => tracing::warn!(error = %e, "cannot record released files"),
            }
        }
        let doomed = store
            .doomed(DESTROY_BATCH, |owner| self.open.is_open(owner))
            .await;
        if doomed.is_empty() {
            return;
        }
        let servers: HashMap<u32, proto::Nid> = self
            .registry
            .list()
            .into_iter()
            .filter(|t| t.up)
            .map(|t| (t.index, t.oss))
            .collect();
        // In target order: the simulator replays a seed only if calls go out in the same order.
        let mut by_target: std::collections::BTreeMap<u32, Vec<StripeObject>> = Default::default();
        for o in doomed {
            if servers.contains_key(&o.target) {
                by_target.entry(o.target).or_default().push(o);
            }
        }
        let mut done = vec![];
        for (target, objects) in by_target {
            let oss = &servers[&target];
            for chunk in objects.chunks(MAX_DESTROY_MANY) {
                let r = OstDestroyMany {
                    target,
                    fids: chunk.iter().map(|o| o.fid).collect(),
                };
                match call(&self.net, oss, &r, RPC_DEADLINE).await {
                    // Objects not there were destroyed before (a destroy answered too late).
                    Ok(_) => done.extend_from_slice(chunk),
                    Err(e) => {
                        tracing::debug!(target, objects = chunk.len(), error = %e, "destroy failed; will retry")
                    }
                }
            }
        }
        if !done.is_empty() {
            let n = done.len();
            if let Err(e) = store
                .apply(Change::new(
                    Mutation::Destroyed { objects: done },
                    Creds::root(),
                ))
                .await
            {
                tracing::warn!(error = %e, "cannot record destroyed objects");
            } else {
                tracing::debug!(objects = n, "destroyed objects of removed files");
            }
        }
    }

    /// Runs maintenance every `every` until the process ends.
    pub async fn run(self: Arc<Self>, store: Arc<Store>, every: Duration) {
        loop {
            self.maintain(&store).await;
            tokio::time::sleep(every).await;
        }
    }
}
