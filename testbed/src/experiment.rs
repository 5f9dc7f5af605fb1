//! Experiments as files: a topology and a workload in TOML, swept over any parameter, turned
//! into flows with lode's own layout math and run through the flow model.
//!
//! ```toml
//! name = "read over 40 targets"
//! [topology]
//! clients = 100
//! client_nic_gbs = 25.0
//! oss = 10
//! oss_nic_gbs = 50.0
//! targets_per_oss = 4
//! target_read_gbs = 4.0
//! target_write_gbs = 4.0
//! [workload]
//! kind = "io"              # io | checkpoint | epoch | metadata
//! direction = "read"
//! bytes_per_client = "16GB"
//! [workload.layout]
//! stripe_count = -1
//! stripe_size = "4M"
//! [sweep]
//! "workload.layout.stripe_count" = [1, 4, 16, -1]
//! ```

use std::collections::BTreeMap;

use mds::placement::{place_copy, PlacementError, Site};
use proto::fid::OST_SEQ_BASE;
use proto::layout::{Component, Layout, StripeCount, StripeObject, EOF};
use proto::Fid;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use thiserror::Error;

use crate::flow::{self, Flow, Outcome, Resource};

#[derive(Debug, Error)]
pub enum ExperimentError {
    #[error("reading the experiment: {0}")]
    Toml(#[from] toml::de::Error),
    #[error("sweep parameter {0:?} names nothing in the experiment")]
    NoSuchParameter(String),
    #[error("the experiment is invalid: {0}")]
    Invalid(String),
}

type Result<T> = std::result::Result<T, ExperimentError>;

fn invalid(s: impl Into<String>) -> ExperimentError {
    ExperimentError::Invalid(s.into())
}

/// A size: a number of bytes, or text with a unit: K/M/G/T (and KiB...) are binary, KB/MB/GB/TB
/// decimal, EOF the end of a file.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "toml::Value", into = "u64")]
pub struct Size(pub u64);

impl From<Size> for u64 {
    fn from(s: Size) -> u64 {
        s.0
    }
}

impl TryFrom<toml::Value> for Size {
    type Error = String;
    fn try_from(v: toml::Value) -> std::result::Result<Size, String> {
        match v {
            toml::Value::Integer(n) if n >= 0 => Ok(Size(n as u64)),
            toml::Value::Float(f) if f >= 0.0 => Ok(Size(f as u64)),
            toml::Value::String(s) => parse_size(&s).map(Size),
            other => Err(format!("not a size: {other}")),
        }
    }
}

/// A size of an experiment: [`proto::size::parse_size`]'s units, or EOF (the end of a file).
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    if s.trim().eq_ignore_ascii_case("eof") {
        return Ok(EOF);
    }
    proto::size::parse_size(s).map_err(|e| e.to_string())
}

fn d_gbs() -> f64 {
    100.0
}
fn d_one() -> u32 {
    1
}
fn d_lat() -> f64 {
    2.0
}
fn d_io_lat() -> f64 {
    100.0
}
fn d_qd() -> u32 {
    64
}
fn d_ratio() -> f64 {
    1.0
}
fn d_mds() -> f64 {
    50_000.0
}
fn d_target() -> f64 {
    4.0
}

/// The machines and the network. Bandwidths in GB/s (10^9 bytes), latencies in microseconds.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    pub clients: u32,
    #[serde(default = "d_gbs")]
    pub client_nic_gbs: f64,
    #[serde(default = "d_one")]
    pub oss: u32,
    #[serde(default = "d_gbs")]
    pub oss_nic_gbs: f64,
    #[serde(default = "d_one")]
    pub targets_per_oss: u32,
    /// A device (or backplane) behind each OSS that all its targets share, in GB/s; none if
    /// absent. Several targets carved out of one disk, as on a test machine, share it.
    #[serde(default)]
    pub oss_disk_gbs: Option<f64>,
    #[serde(default = "d_target")]
    pub target_read_gbs: f64,
    #[serde(default = "d_target")]
    pub target_write_gbs: f64,
    /// Time a target takes for one I/O, and how many it works on at once.
    #[serde(default = "d_io_lat")]
    pub target_io_latency_us: f64,
    #[serde(default = "d_qd")]
    pub target_queue_depth: u32,
    /// One way, per hop.
    #[serde(default = "d_lat")]
    pub link_latency_us: f64,
    /// 1 for full bisection; 2 means the core carries half of what the clients' NICs can.
    #[serde(default = "d_ratio")]
    pub fabric_oversubscription: f64,
    /// Each MDS's rate: metadata operations a second.
    #[serde(default = "d_mds")]
    pub mds_ops_per_s: f64,
    /// Metadata servers, one MDT each (MDT0 holds the root).
    #[serde(default = "d_one")]
    pub mdts: u32,
    /// The work of a path walk from the root, in operations of MDT0, that every metadata
    /// operation costs there besides its own (a client without leases walks from the root at
    /// MDT0 for each path it names).
    #[serde(default)]
    pub walk_ops: f64,
}

impl Topology {
    pub fn targets(&self) -> u32 {
        self.oss * self.targets_per_oss
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComponentSpec {
    /// Where the component ends ("EOF" for the last).
    pub end: Size,
    pub stripe_count: i64,
    #[serde(default)]
    pub stripe_size: Option<Size>,
}

fn d_stripe_size() -> Size {
    Size(4 << 20)
}

/// A file's layout: one RAID0 component, or progressive components.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayoutSpec {
    #[serde(default = "d_count")]
    pub stripe_count: i64,
    #[serde(default = "d_stripe_size")]
    pub stripe_size: Size,
    /// The first target of every file; by default file i starts at target i × stripe_count
    /// (i, when files cover every target) modulo the targets, as the MDS places them.
    #[serde(default)]
    pub stripe_offset: Option<u32>,
    #[serde(default)]
    pub components: Vec<ComponentSpec>,
    /// Copies of every file (mirrors, each on OSSes holding no other copy): writes carry
    /// every copy, reads spread their stripe units over the copies.
    #[serde(default = "d_mirrors")]
    pub mirrors: u16,
}

fn d_count() -> i64 {
    1
}

fn d_mirrors() -> u16 {
    1
}

impl Default for LayoutSpec {
    fn default() -> Self {
        LayoutSpec {
            stripe_count: 1,
            stripe_size: d_stripe_size(),
            stripe_offset: None,
            components: vec![],
            mirrors: 1,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Every client reads or writes `bytes_per_client`.
    Io,
    /// Every client writes `bytes_per_client` at once.
    Checkpoint,
    /// The shards of a dataset, each read by one client (shard i by client i mod clients).
    Epoch,
    /// Every client creates and stats `files_per_client` small files.
    Metadata,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    Read,
    Write,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pattern {
    FilePerProcess,
    SharedFile,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    Sequential,
    Random,
}

fn d_req() -> Size {
    Size(4 << 20)
}
fn d_window() -> u32 {
    8
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    pub kind: Kind,
    #[serde(default)]
    pub direction: Option<Direction>,
    #[serde(default)]
    pub pattern: Option<Pattern>,
    #[serde(default)]
    pub access: Option<Access>,
    #[serde(default)]
    pub bytes_per_client: Option<Size>,
    /// One I/O's size, and how many each client keeps in flight.
    #[serde(default = "d_req")]
    pub request_size: Size,
    #[serde(default = "d_window")]
    pub window: u32,
    #[serde(default)]
    pub dataset_bytes: Option<Size>,
    #[serde(default)]
    pub shard_size: Option<Size>,
    #[serde(default)]
    pub files_per_client: Option<u64>,
    /// Metadata operations per file (create, stat...).
    #[serde(default)]
    pub ops_per_file: Option<u64>,
    /// Metadata: every client's files in one directory striped over this many MDTs (names
    /// spread evenly by their hash); without it, all on MDT0.
    #[serde(default)]
    pub dir_stripe: Option<u32>,
    #[serde(default)]
    pub layout: LayoutSpec,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Experiment {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub topology: Topology,
    pub workload: Workload,
    /// Parameter (dotted path) to the values it takes; at most one.
    #[serde(default)]
    pub sweep: BTreeMap<String, Vec<toml::Value>>,
}

/// One point of a sweep: the experiment with the swept parameter set.
#[derive(Clone, Debug)]
pub struct Point {
    pub parameter: Option<String>,
    pub value: Option<toml::Value>,
    pub experiment: Experiment,
}

/// Parses an experiment and expands its sweep.
pub fn load(text: &str) -> Result<Vec<Point>> {
    let raw: toml::Value = toml::from_str(text)?;
    let base: Experiment = raw.clone().try_into()?;
    if base.sweep.len() > 1 {
        return Err(invalid("sweep one parameter at a time"));
    }
    let Some((param, values)) = base.sweep.iter().next() else {
        return Ok(vec![Point {
            parameter: None,
            value: None,
            experiment: base,
        }]);
    };
    let mut points = vec![];
    for v in values {
        let mut x = raw.clone();
        set_path(&mut x, param, v.clone())?;
        points.push(Point {
            parameter: Some(param.clone()),
            value: Some(v.clone()),
            experiment: x.try_into()?,
        });
    }
    Ok(points)
}

fn set_path(root: &mut toml::Value, path: &str, v: toml::Value) -> Result<()> {
    let mut at = root;
    let parts: Vec<&str> = path.split('.').collect();
    for (i, p) in parts.iter().enumerate() {
        let table = at
            .as_table_mut()
            .ok_or_else(|| ExperimentError::NoSuchParameter(path.into()))?;
        if i + 1 == parts.len() {
            // Known fields may be absent (defaults); any name the schema takes is accepted by
            // deserialisation afterwards, which refuses unknown ones.
            table.insert(p.to_string(), v);
            return Ok(());
        }
        at = table
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(Default::default()));
    }
    Err(ExperimentError::NoSuchParameter(path.into()))
}

/// What one run of the model gives.
#[derive(Clone, Debug)]
pub struct Report {
    pub name: String,
    pub parameter: Option<String>,
    pub value: Option<String>,
    /// Bytes (operations for metadata) moved in all, and by when.
    pub total: f64,
    pub makespan: f64,
    /// Per client: amount and when its last flow ended.
    pub client_amount: Vec<f64>,
    pub client_finish: Vec<f64>,
    /// Per target: amount carried and its utilisation over the run.
    pub target_amount: Vec<f64>,
    pub target_utilisation: Vec<f64>,
    pub timeline: Vec<(f64, f64)>,
    pub unit: &'static str,
    pub flows: usize,
    pub events: u64,
}

impl Report {
    pub fn aggregate_rate(&self) -> f64 {
        self.total / self.makespan.max(1e-12)
    }
    pub fn client_rates(&self) -> Vec<f64> {
        self.client_amount
            .iter()
            .zip(&self.client_finish)
            .map(|(a, f)| if *f > 0.0 { a / f } else { 0.0 })
            .collect()
    }
}

/// The layout a file asks the MDS for: its components, without objects (a stripe count above
/// the targets stays as asked; the MDS takes what there is).
pub fn template(spec: &LayoutSpec) -> Result<Layout> {
    let count = |n: i64| -> Result<StripeCount> {
        match n {
            -1 => Ok(StripeCount::All),
            n if n > 0 && n <= u32::MAX as i64 => Ok(StripeCount::Count(n as u32)),
            n => Err(invalid(format!("stripe_count {n}"))),
        }
    };
    let mut comps = vec![];
    if spec.components.is_empty() {
        let mut c = Component::raid0(count(spec.stripe_count)?, spec.stripe_size.0);
        c.stripe_offset = spec.stripe_offset;
        comps.push(c);
    } else {
        let mut start = 0;
        for c in &spec.components {
            let mut x = Component::raid0(
                count(c.stripe_count)?,
                c.stripe_size.unwrap_or(spec.stripe_size).0,
            );
            x.start = start;
            x.end = c.end.0;
            start = c.end.0;
            comps.push(x);
        }
    }
    let one = Layout::new(comps).map_err(|e| invalid(e.to_string()))?;
    if spec.mirrors > 1 {
        return one
            .with_mirrors(spec.mirrors)
            .map_err(|e| invalid(e.to_string()));
    }
    Ok(one)
}

/// A file's layout instantiated over `targets` equal targets (target k on OSS k mod `oss`),
/// each component placed by the MDS's own policy ([`place_copy`]: the round-robin position
/// `cursor`, which moves on as the MDS's does, and the mirror spread: a copy only on OSSes that
/// hold no other copy, a copy over every target taking its share of the OSSes left).
pub fn layout_of(spec: &LayoutSpec, targets: u32, oss: u32, cursor: &mut usize) -> Result<Layout> {
    let mut comps = template(spec)?.components;
    let copies = comps.iter().map(|c| c.mirror + 1).max().unwrap_or(1);
    let sites: Vec<Site<u32>> = (0..targets)
        .map(|index| Site {
            index,
            server: index % oss.max(1),
            free: 1,
        })
        .collect();
    let mut used: Vec<HashSet<u32>> = vec![HashSet::new(); usize::from(copies)];
    for c in &mut comps {
        let avoid: HashSet<u32> = used
            .iter()
            .enumerate()
            .filter(|(m, _)| *m != usize::from(c.mirror))
            .flat_map(|(_, s)| s.iter().copied())
            .collect();
        let copies_left = (copies - c.mirror).max(1);
        let chosen = place_copy(&sites, c, &avoid, &HashSet::new(), copies_left, cursor).map_err(
            |e| match e {
                PlacementError::NoSpareServer | PlacementError::NoTargets => {
                    invalid(format!("{copies} mirrors need {copies} OSSes or more"))
                }
                e => invalid(e.to_string()),
            },
        )?;
        if chosen.is_empty() && c.stripe_count != StripeCount::Mdt {
            return Err(invalid(format!(
                "{copies} mirrors need {copies} OSSes or more"
            )));
        }
        used[usize::from(c.mirror)].extend(chosen.iter().map(|t| t % oss.max(1)));
        if let StripeCount::Count(_) = c.stripe_count {
            c.stripe_count = StripeCount::Count(chosen.len() as u32);
        }
        c.objects = chosen
            .into_iter()
            .map(|target| StripeObject {
                target,
                fid: Fid::new(OST_SEQ_BASE + u64::from(target), 1, 0),
            })
            .collect();
    }
    Layout::new(comps).map_err(|e| invalid(e.to_string()))
}

/// The model's resources, and where each kind starts in the list.
struct Resources {
    list: Vec<Resource>,
    client0: usize,
    oss0: usize,
    /// The OSS's shared devices, if the topology gives them.
    disk0: Option<usize>,
    target0: usize,
    /// The fabric's core, if oversubscribed.
    core: Option<usize>,
    /// MDT k's MDS is `mds + k`.
    mds: usize,
}

const GB: f64 = 1e9;
const US: f64 = 1e-6;

/// Client NICs, OSS NICs, shared devices, targets, the core if oversubscribed, and the MDS.
fn resources(t: &Topology, direction: Direction, access: Access, q: f64) -> Resources {
    let mut list = vec![];
    let add = |list: &mut Vec<Resource>, name: String, capacity: f64| {
        list.push(Resource { name, capacity });
        list.len() - 1
    };
    let client0 = list.len();
    for i in 0..t.clients {
        add(&mut list, format!("client{i}"), t.client_nic_gbs * GB);
    }
    let oss0 = list.len();
    for i in 0..t.oss {
        add(&mut list, format!("oss{i}"), t.oss_nic_gbs * GB);
    }
    let disk0 = t.oss_disk_gbs.map(|d| {
        let first = list.len();
        for i in 0..t.oss {
            add(&mut list, format!("disk{i}"), d * GB);
        }
        first
    });
    let target0 = list.len();
    let io_lat = t.target_io_latency_us * US;
    let bw = match direction {
        Direction::Read => t.target_read_gbs,
        Direction::Write => t.target_write_gbs,
    } * GB;
    // Random I/O: a target works on queue_depth I/Os at once, each taking io_latency and its
    // transfer.
    let iops_bw = match access {
        Access::Random => f64::from(t.target_queue_depth) * q / (io_lat + q / bw).max(1e-12),
        Access::Sequential => f64::INFINITY,
    };
    for i in 0..t.targets() {
        add(&mut list, format!("target{i}"), bw.min(iops_bw));
    }
    let core = (t.fabric_oversubscription > 1.0).then(|| {
        let core = f64::from(t.clients) * t.client_nic_gbs * GB / t.fabric_oversubscription;
        add(&mut list, "core".into(), core)
    });
    let mds = add(&mut list, "mds".into(), t.mds_ops_per_s);
    for k in 1..t.mdts.max(1) {
        add(&mut list, format!("mds{k}"), t.mds_ops_per_s);
    }
    Resources {
        list,
        client0,
        oss0,
        disk0,
        target0,
        core,
        mds,
    }
}

/// The bytes each client moves to or from each target, its files placed as the MDS would
/// place them, created in order.
fn bytes_per_client(
    t: &Topology,
    w: &Workload,
    direction: Direction,
) -> Result<Vec<BTreeMap<u32, u64>>> {
    // A write carries every copy; a read takes each stripe unit from one copy, the units
    // spread evenly over the copies (each copy's share counted as 1/N of its bytes).
    let file_bytes = |l: &Layout, offset: u64, len: u64, out: &mut BTreeMap<u32, u64>| {
        let n = l.mirror_count();
        if n <= 1 {
            return l.bytes_per_target(offset, len, out);
        }
        for m in 0..n {
            let mut one = BTreeMap::new();
            l.mirror(m).bytes_per_target(offset, len, &mut one);
            for (target, b) in one {
                *out.entry(target).or_default() += match direction {
                    Direction::Write => b,
                    Direction::Read => b / u64::from(n),
                };
            }
        }
    };
    let targets = t.targets();
    let mut per_client: Vec<BTreeMap<u32, u64>> = vec![BTreeMap::new(); t.clients as usize];
    if w.kind == Kind::Epoch {
        let total = w
            .dataset_bytes
            .ok_or_else(|| invalid("an epoch needs dataset_bytes"))?
            .0;
        let shard = w
            .shard_size
            .ok_or_else(|| invalid("an epoch needs shard_size"))?
            .0
            .max(1);
        let mut cursor = 0;
        for s in 0..total.div_ceil(shard) {
            let l = layout_of(&w.layout, targets, t.oss, &mut cursor)?;
            let len = shard.min(total - s * shard);
            let c = (s % u64::from(t.clients)) as usize;
            file_bytes(&l, 0, len, &mut per_client[c]);
        }
        return Ok(per_client);
    }
    let b = w
        .bytes_per_client
        .ok_or_else(|| invalid("the workload needs bytes_per_client"))?
        .0;
    let mut cursor = 0;
    let shared = layout_of(&w.layout, targets, t.oss, &mut cursor)?;
    let mut cursor = 0;
    for (i, m) in per_client.iter_mut().enumerate() {
        match w.pattern.unwrap_or(Pattern::FilePerProcess) {
            Pattern::FilePerProcess => {
                file_bytes(&layout_of(&w.layout, targets, t.oss, &mut cursor)?, 0, b, m)
            }
            Pattern::SharedFile => file_bytes(&shared, i as u64 * b, b, m),
        }
    }
    Ok(per_client)
}

/// One flow per client and target it moves bytes to or from, through every resource on the
/// way, capped by the client's window over the round trip and the target's I/O time.
fn data_flows(
    t: &Topology,
    w: &Workload,
    r: &Resources,
    per_client: &[BTreeMap<u32, u64>],
    q: f64,
) -> (Vec<Flow>, Vec<usize>) {
    let rtt = 2.0 * t.link_latency_us * US;
    let io_lat = t.target_io_latency_us * US;
    let (mut flows, mut owner) = (vec![], vec![]);
    for (c, m) in per_client.iter().enumerate() {
        let streams = m.len().max(1) as f64;
        for (&target, &bytes) in m.iter().filter(|(_, b)| **b > 0) {
            let oss = (target % t.oss) as usize;
            let mut path = vec![r.client0 + c, r.oss0 + oss, r.target0 + target as usize];
            path.extend(r.disk0.map(|d| d + oss));
            path.extend(r.core);
            // The client's window spread over its streams; each request waits a round trip
            // and the target's I/O time.
            let in_flight = (f64::from(w.window.max(1)) / streams).max(1.0);
            flows.push(Flow {
                resources: path,
                amount: bytes as f64,
                start: 0.0,
                // Open at the MDS, then the first request's round trip.
                latency: 2.0 * rtt + io_lat,
                cap: in_flight * q / (rtt + io_lat).max(1e-12),
            });
            owner.push(c);
        }
    }
    (flows, owner)
}

/// The owners of flows that are a client's work at MDT0 for its walks: `WALK + client`.
const WALK: usize = 1 << 40;

/// Flows of metadata calls per client: one to each MDT its directory is striped over, and its
/// walks from the root at MDT0.
fn metadata_flows(t: &Topology, w: &Workload, r: &Resources) -> Result<(Vec<Flow>, Vec<usize>)> {
    let rtt = 2.0 * t.link_latency_us * US;
    let files = w
        .files_per_client
        .ok_or_else(|| invalid("metadata needs files_per_client"))?;
    let ops = (files * w.ops_per_file.unwrap_or(2)) as f64;
    let shards = w.dir_stripe.unwrap_or(1).max(1);
    if shards > t.mdts.max(1) {
        return Err(invalid(format!(
            "a directory striped over {shards} MDTs, but the topology has {}",
            t.mdts.max(1)
        )));
    }
    // One call waits a round trip; `window` of them in flight, spread over the shards as
    // the names are.
    let cap = f64::from(w.window.max(1)) / rtt.max(1e-12);
    let mut flows = vec![];
    let mut owner = vec![];
    for c in 0..t.clients as usize {
        for k in 0..shards as usize {
            flows.push(Flow {
                resources: vec![r.mds + k],
                amount: ops / f64::from(shards),
                start: 0.0,
                latency: rtt,
                cap: cap / f64::from(shards),
            });
            owner.push(c);
        }
        if t.walk_ops > 0.0 {
            // The walks at MDT0, paced with the client's calls (their amount is MDT0's work,
            // not operations of the client's: counted apart).
            flows.push(Flow {
                resources: vec![r.mds],
                amount: ops * t.walk_ops,
                start: 0.0,
                latency: rtt,
                cap: cap * t.walk_ops,
            });
            owner.push(WALK + c);
        }
    }
    Ok((flows, owner))
}

/// Turns one point of an experiment into resources and flows, runs the model, and reports.
pub fn run_model(point: &Point, progress: impl FnMut(usize, usize)) -> Result<Report> {
    let x = &point.experiment;
    let (t, w) = (&x.topology, &x.workload);
    if t.clients == 0 || t.oss == 0 || t.targets_per_oss == 0 {
        return Err(invalid(
            "clients, oss and targets_per_oss must be at least 1",
        ));
    }
    let direction = match w.kind {
        Kind::Checkpoint => Direction::Write,
        Kind::Epoch => Direction::Read,
        _ => w.direction.unwrap_or(Direction::Read),
    };
    let q = w.request_size.0.max(1) as f64;
    let r = resources(t, direction, w.access.unwrap_or(Access::Sequential), q);
    let (flows, owner) = if w.kind == Kind::Metadata {
        metadata_flows(t, w, &r)?
    } else {
        data_flows(t, w, &r, &bytes_per_client(t, w, direction)?, q)
    };
    let out: Outcome = flow::run(&r.list, &flows, progress);
    let mut client_amount = vec![0.0; t.clients as usize];
    let mut client_finish = vec![0.0f64; t.clients as usize];
    for (i, f) in flows.iter().enumerate() {
        // A client's walks at MDT0 hold it up until they are done, but are MDT0's work, not
        // operations of the client's.
        let (c, own) = match owner[i].checked_sub(WALK) {
            Some(c) => (c, false),
            None => (owner[i], true),
        };
        if own {
            client_amount[c] += f.amount;
        }
        client_finish[c] = client_finish[c].max(out.finish[i]);
    }
    let makespan = out.makespan;
    let targets = r.target0..r.target0 + t.targets() as usize;
    Ok(Report {
        name: x.name.clone(),
        parameter: point.parameter.clone(),
        value: point.value.as_ref().map(|v| v.to_string()),
        total: client_amount.iter().sum(),
        makespan,
        client_amount,
        client_finish,
        target_amount: targets.clone().map(|k| out.carried[k]).collect(),
        target_utilisation: targets
            .map(|k| out.carried[k] / (r.list[k].capacity * makespan).max(1e-12))
            .collect(),
        timeline: out.timeline,
        unit: if w.kind == Kind::Metadata { "ops" } else { "B" },
        flows: flows.len(),
        events: out.events,
    })
}
