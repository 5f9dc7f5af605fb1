//! The simulated fabric: an in-process network of named nodes (`node3@sim`), seeded and
//! deterministic.
//!
//! Every message crosses a directed link with its own latency, bandwidth (a link sends one
//! message at a time, so transfers queue behind each other), loss, duplication and reordering;
//! links can be cut one way or both ways; nodes can crash (their memory and the calls waiting
//! on them are lost) and restart as a new incarnation. All randomness comes from one seeded
//! generator and all time from tokio's clock, so under a paused single-threaded runtime the
//! same seed gives the same trace, event for event. Tokio's timers resolve to 1 ms, so a hop
//! with a delay lands on the next millisecond tick at or after its exact arrival time (the trace
//! records the exact time); a hop with no delay is delivered at once, without a timer.
//!
//! Bulk transfers follow RDMA's reliable-connection rules: they are not lost or duplicated, but
//! they fail on a cut link or a crashed peer, and the bytes are copied straight between the
//! server's buffer and the owner's registered region after the link's transfer time.

mod node;
mod trace;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use proto::Nid;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::time::Instant;

pub use node::SimEndpoint;
pub use trace::{Fate, TraceEvent};

use crate::error::NetError;
use crate::service::Service;

/// Longest latency a link may be given; a bound so that a typo cannot stall a run for a day.
pub const MAX_LATENCY: Duration = Duration::from_secs(60);
/// Most trace events kept; later events are counted but not stored.
pub const MAX_TRACE: usize = 1 << 20;

/// The behaviour of one direction of a link.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkParams {
    /// One-way propagation delay.
    pub latency: Duration,
    /// Bytes per second; 0 means unlimited.
    pub bandwidth: u64,
    /// Probability that a message is lost.
    pub loss: f64,
    /// Probability that a message is delivered twice.
    pub duplicate: f64,
    /// Probability that a message is held back by up to `reorder_window`, letting later ones
    /// overtake it.
    pub reorder: f64,
    pub reorder_window: Duration,
}

impl Default for LinkParams {
    /// A perfect link: no delay, unlimited bandwidth, no faults.
    fn default() -> Self {
        LinkParams {
            latency: Duration::ZERO,
            bandwidth: 0,
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_window: Duration::ZERO,
        }
    }
}

impl LinkParams {
    fn check(&self) -> Result<(), String> {
        let prob = |p: f64| (0.0..=1.0).contains(&p);
        if !(prob(self.loss) && prob(self.duplicate) && prob(self.reorder)) {
            return Err("probabilities must lie in [0, 1]".into());
        }
        if self.latency > MAX_LATENCY || self.reorder_window > MAX_LATENCY {
            return Err(format!("latency is limited to {MAX_LATENCY:?}"));
        }
        Ok(())
    }

    fn transfer_time(&self, bytes: u64) -> Duration {
        if self.bandwidth == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(
            (u128::from(bytes) * 1_000_000_000 / u128::from(self.bandwidth)) as u64,
        )
    }
}

type Link = (String, String);

/// Faults of bulk transfers, each drawn per transfer from the fabric's seeded generator.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BulkFaults {
    /// Probability that a transfer breaks off partway: a prefix of its bytes lands, and the
    /// server sees an error.
    pub break_off: f64,
    /// Probability that one byte of a put is changed on the way (a fault no transport
    /// checksum saw: only an end-to-end check can catch it).
    pub corrupt: f64,
}

/// What happens to one bulk transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BulkFault {
    /// Only the first `landed` bytes arrive.
    BreakOff { landed: usize },
    /// The byte at `at` arrives flipped.
    Corrupt { at: usize },
}

struct Slot {
    generation: u64,
    live: Option<Arc<node::NodeInner>>,
}

struct State {
    rng: ChaCha8Rng,
    start: Instant,
    nodes: BTreeMap<String, Slot>,
    default_link: LinkParams,
    links: HashMap<Link, LinkParams>,
    busy_until: HashMap<Link, Instant>,
    /// A node's NIC: bytes per second, and when its sending and receiving sides are next free.
    nics: HashMap<String, u64>,
    egress_free: HashMap<String, Instant>,
    ingress_free: HashMap<String, Instant>,
    cut: HashSet<Link>,
    /// Nodes whose device memory registrations fail (as `ibv_reg_dmabuf_mr` can).
    device_refused: HashSet<String>,
    bulk_faults: BulkFaults,
    trace: Vec<TraceEvent>,
    dropped_trace: u64,
}

pub(crate) struct FabricInner {
    state: Mutex<State>,
}

/// An in-process network. Cheap to clone; every clone is the same fabric.
#[derive(Clone)]
pub struct Fabric {
    inner: Arc<FabricInner>,
}

/// What the fabric decided for one message.
pub(crate) struct Route {
    pub(crate) arrivals: Vec<Instant>,
}

impl Fabric {
    /// A fabric whose every random choice follows `seed`.
    pub fn new(seed: u64) -> Fabric {
        Fabric {
            inner: Arc::new(FabricInner {
                state: Mutex::new(State {
                    rng: ChaCha8Rng::seed_from_u64(seed),
                    start: Instant::now(),
                    nodes: BTreeMap::new(),
                    default_link: LinkParams::default(),
                    links: HashMap::new(),
                    busy_until: HashMap::new(),
                    nics: HashMap::new(),
                    egress_free: HashMap::new(),
                    ingress_free: HashMap::new(),
                    cut: HashSet::new(),
                    device_refused: HashSet::new(),
                    bulk_faults: BulkFaults::default(),
                    trace: Vec::new(),
                    dropped_trace: 0,
                }),
            }),
        }
    }

    /// Makes device memory registrations on node `name` fail (or succeed again).
    pub fn refuse_device_registrations(&self, name: &str, refuse: bool) {
        let mut st = self.inner.state.lock();
        if refuse {
            st.device_refused.insert(name.to_owned());
        } else {
            st.device_refused.remove(name);
        }
    }

    /// Sets the faults of every later bulk transfer.
    pub fn set_bulk_faults(&self, faults: BulkFaults) -> Result<(), NetError> {
        let prob = |p: f64| (0.0..=1.0).contains(&p);
        if !(prob(faults.break_off) && prob(faults.corrupt)) {
            return Err(bad_param("probabilities must lie in [0, 1]".into()));
        }
        self.inner.state.lock().bulk_faults = faults;
        Ok(())
    }

    /// Sets the parameters of every link without its own.
    pub fn set_default_link(&self, params: LinkParams) -> Result<(), NetError> {
        params.check().map_err(bad_param)?;
        self.inner.state.lock().default_link = params;
        Ok(())
    }

    /// Sets the parameters of the link from `from` to `to` (one direction).
    pub fn set_link(&self, from: &str, to: &str, params: LinkParams) -> Result<(), NetError> {
        params.check().map_err(bad_param)?;
        self.inner
            .state
            .lock()
            .links
            .insert((from.to_owned(), to.to_owned()), params);
        Ok(())
    }

    /// Starts a node (or restarts a crashed one as a new incarnation), serving `service` if
    /// given. Its memory starts empty.
    /// Gives node `name` a NIC of `bandwidth` bytes per second in each direction (0: none),
    /// shared by everything it sends and everything it receives: a message queues for the
    /// sender's NIC and the link, then for the receiver's NIC; a busy receiver delays its
    /// arrival but not the sender's next message (the switch buffers it).
    pub fn set_nic(&self, name: &str, bandwidth: u64) {
        let mut st = self.inner.state.lock();
        if bandwidth == 0 {
            st.nics.remove(name);
        } else {
            st.nics.insert(name.to_owned(), bandwidth);
        }
    }

    pub fn start_node(
        &self,
        name: &str,
        service: Option<Arc<dyn Service>>,
    ) -> Result<SimEndpoint, NetError> {
        let nid = Nid::sim(name).map_err(|e| NetError::BadConfig(e.to_string()))?;
        let mut st = self.inner.state.lock();
        let salt = st.rng.gen();
        let slot = st.nodes.entry(name.to_owned()).or_insert(Slot {
            generation: 0,
            live: None,
        });
        if slot.live.is_some() {
            return Err(NetError::BadConfig(format!("{nid} is already running")));
        }
        slot.generation += 1;
        let node = node::NodeInner::new(nid, slot.generation, salt, service);
        slot.live = Some(node.clone());
        Ok(SimEndpoint::new(self.inner.clone(), node))
    }

    /// Crashes a node: it stops answering, its registered memory is gone, calls it was making
    /// fail, and calls waiting on it fail as a reset connection would.
    pub fn crash(&self, name: &str) {
        let mut st = self.inner.state.lock();
        let Some(node) = st.nodes.get_mut(name).and_then(|s| s.live.take()) else {
            return;
        };
        let now = st.start.elapsed();
        record(&mut st, TraceEvent::crash(now, name));
        let others: Vec<_> = st.nodes.values().filter_map(|s| s.live.clone()).collect();
        drop(st);
        node.crashed();
        for other in others {
            other.peer_crashed(name);
        }
    }

    /// The incarnation of `name` running now, if it is.
    pub fn generation(&self, name: &str) -> Option<u64> {
        let st = self.inner.state.lock();
        let slot = st.nodes.get(name)?;
        slot.live.as_ref().map(|_| slot.generation)
    }

    /// Whether `name` is running.
    pub fn is_up(&self, name: &str) -> bool {
        self.inner
            .state
            .lock()
            .nodes
            .get(name)
            .is_some_and(|s| s.live.is_some())
    }

    /// Drops every message from `from` to `to` until healed (a one-way partition).
    pub fn cut_oneway(&self, from: &str, to: &str) {
        self.inner
            .state
            .lock()
            .cut
            .insert((from.to_owned(), to.to_owned()));
    }

    /// Drops every message between `a` and `b`, both ways.
    pub fn partition(&self, a: &str, b: &str) {
        self.cut_oneway(a, b);
        self.cut_oneway(b, a);
    }

    /// Restores every cut link.
    pub fn heal(&self) {
        self.inner.state.lock().cut.clear();
    }

    /// Everything the fabric decided so far, in order.
    pub fn trace(&self) -> Vec<TraceEvent> {
        self.inner.state.lock().trace.clone()
    }
}

fn bad_param(reason: String) -> NetError {
    NetError::BadConfig(format!("link: {reason}"))
}

fn record(st: &mut State, ev: TraceEvent) {
    if st.trace.len() < MAX_TRACE {
        st.trace.push(ev);
    } else {
        st.dropped_trace += 1;
    }
}

impl FabricInner {
    /// The live incarnation of `name`, if any.
    pub(crate) fn live(&self, name: &str) -> Option<Arc<node::NodeInner>> {
        self.state
            .lock()
            .nodes
            .get(name)
            .and_then(|s| s.live.clone())
    }

    fn is_current(st: &State, node: &node::NodeInner) -> bool {
        st.nodes
            .get(node.name())
            .is_some_and(|s| s.generation == node.generation() && s.live.is_some())
    }

    /// Refuses a message the sender would learn about at once: a crashed sender, or a
    /// destination that is not running (a reset connection).
    fn admit(st: &State, from: &node::NodeInner, to: &str) -> Result<Link, (Fate, NetError)> {
        if !Self::is_current(st, from) {
            let peer = from.nid().clone();
            return Err((Fate::SenderDown, NetError::NodeDown { peer }));
        }
        if st.nodes.get(to).is_none_or(|s| s.live.is_none()) {
            let peer = Nid::Sim(to.to_owned());
            return Err((Fate::Down, NetError::NodeDown { peer }));
        }
        Ok((from.name().to_owned(), to.to_owned()))
    }

    /// Queues `bytes` on `link` behind what it is already sending; returns when the last byte
    /// has left, and the link's parameters.
    fn occupy(st: &mut State, link: Link, bytes: u64, now: Instant) -> (Instant, LinkParams) {
        let params = st.links.get(&link).unwrap_or(&st.default_link).clone();
        let (from, to) = (link.0.clone(), link.1.clone());
        let nic_time = |bw: Option<u64>| {
            bw.map_or(Duration::ZERO, |b| {
                Duration::from_nanos((u128::from(bytes) * 1_000_000_000 / u128::from(b)) as u64)
            })
        };
        let (out_nic, in_nic) = (st.nics.get(&from).copied(), st.nics.get(&to).copied());
        // Out through the sender's NIC and the link, queued behind what they already carry...
        let mut depart = st.busy_until.get(&link).copied().unwrap_or(now).max(now);
        if out_nic.is_some() {
            depart = depart.max(st.egress_free.get(&from).copied().unwrap_or(now));
        }
        let out = depart + params.transfer_time(bytes).max(nic_time(out_nic));
        st.busy_until.insert(link, out);
        if out_nic.is_some() {
            st.egress_free.insert(from, out);
        }
        // ...and in through the receiver's NIC, which takes one message at a time: a busy
        // receiver delays the arrival, not the sender (the switch holds the bytes).
        let mut sent = out;
        if in_nic.is_some() {
            let free = st.ingress_free.get(&to).copied().unwrap_or(now);
            sent = out.max(free + nic_time(in_nic));
            st.ingress_free.insert(to, sent);
        }
        (sent, params)
    }

    pub(crate) fn route(
        &self,
        from: &node::NodeInner,
        to: &str,
        kind: &'static str,
        xid: u64,
        bytes: u64,
    ) -> Result<Route, NetError> {
        let mut st = self.state.lock();
        let now = Instant::now();
        let mut ev = TraceEvent::message(st.start.elapsed(), from.name(), to, kind, xid, bytes);
        let link = match Self::admit(&st, from, to) {
            Ok(link) => link,
            Err((fate, err)) => {
                ev.fate = fate;
                record(&mut st, ev);
                return Err(err);
            }
        };
        // Draw every random number up front, in a fixed order, so that one decision never
        // shifts the draws of the next.
        let (lost, dup, held, hold, dup_gap): (f64, f64, f64, f64, f64) = (
            st.rng.gen(),
            st.rng.gen(),
            st.rng.gen(),
            st.rng.gen(),
            st.rng.gen(),
        );
        let params = st.links.get(&link).unwrap_or(&st.default_link);
        let fate = if st.cut.contains(&link) {
            Some(Fate::Partitioned)
        } else if lost < params.loss {
            Some(Fate::Lost)
        } else {
            None
        };
        if let Some(fate) = fate {
            ev.fate = fate;
            record(&mut st, ev);
            return Ok(Route { arrivals: vec![] });
        }
        let (sent, params) = Self::occupy(&mut st, link, bytes, now);
        let mut arrive = sent + params.latency;
        if held < params.reorder {
            arrive += params.reorder_window.mul_f64(hold);
        }
        let mut arrivals = vec![arrive];
        if dup < params.duplicate {
            let gap = params
                .latency
                .max(Duration::from_micros(1))
                .mul_f64(1.0 + dup_gap);
            arrivals.push(arrive + gap);
        }
        ev.fate = Fate::Delivered {
            after: arrivals.iter().map(|a| a.duration_since(now)).collect(),
        };
        record(&mut st, ev);
        Ok(Route { arrivals })
    }

    pub(crate) fn device_refused(&self, name: &str) -> bool {
        self.state.lock().device_refused.contains(name)
    }

    /// Draws the fault, if any, of a bulk transfer of `bytes`.
    pub(crate) fn bulk_fault(&self, bytes: usize) -> Option<BulkFault> {
        let mut st = self.state.lock();
        let f = st.bulk_faults;
        if bytes == 0 || (f.break_off == 0.0 && f.corrupt == 0.0) {
            return None;
        }
        if st.rng.gen_bool(f.break_off) {
            return Some(BulkFault::BreakOff {
                landed: st.rng.gen_range(0..bytes),
            });
        }
        if st.rng.gen_bool(f.corrupt) {
            return Some(BulkFault::Corrupt {
                at: st.rng.gen_range(0..bytes),
            });
        }
        None
    }

    /// Like `route` for a bulk transfer: reliable, so never lost or duplicated, but refused on
    /// a cut link. Returns when the last byte lands.
    pub(crate) fn route_bulk(
        &self,
        from: &node::NodeInner,
        to: &str,
        kind: &'static str,
        xid: u64,
        bytes: u64,
    ) -> Result<Instant, NetError> {
        let mut st = self.state.lock();
        let now = Instant::now();
        let mut ev = TraceEvent::message(st.start.elapsed(), from.name(), to, kind, xid, bytes);
        let outcome = match Self::admit(&st, from, to) {
            Err((fate, err)) => Err((fate, err)),
            Ok(link) if st.cut.contains(&link) => Err((
                Fate::Partitioned,
                NetError::Unreachable {
                    peer: Nid::Sim(to.to_owned()),
                    reason: "link is cut".into(),
                },
            )),
            Ok(link) => {
                let (sent, params) = Self::occupy(&mut st, link, bytes, now);
                Ok(sent + params.latency)
            }
        };
        ev.fate = match &outcome {
            Ok(arrive) => Fate::Delivered {
                after: vec![arrive.duration_since(now)],
            },
            Err((fate, _)) => fate.clone(),
        };
        record(&mut st, ev);
        outcome.map_err(|(_, err)| err)
    }
}
