//! What the mount counts, for its metrics endpoint (`lode mount --metrics ADDR`): the kernel's
//! requests by operation, bytes read and written through it (and read from its copies of
//! small files made through it), and, brought up to date at each
//! scrape, the files it holds open, the leases its client holds and the changes the MDS has
//! not committed yet. The client's calls to the servers are counted beside these
//! (`lnet::metrics::CallMetrics`).

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// One kind of kernel request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabel {
    pub op: &'static str,
}

/// How a handle's reads and writes go: past the kernel's page cache (`direct`: O_DIRECT, or
/// chosen by hybrid I/O) or through it (`page_cache`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IoLabel {
    pub io: &'static str,
}

/// An operation on a handle of one kind.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IoOpLabel {
    pub io: &'static str,
    pub op: &'static str,
}

fn io(direct: bool) -> &'static str {
    if direct {
        "direct"
    } else {
        "page_cache"
    }
}

/// The mount's counters.
pub struct MountMetrics {
    requests: Family<OpLabel, Counter>,
    errors: Family<OpLabel, Counter>,
    read_bytes: Counter,
    copy_read_bytes: Counter,
    written_bytes: Counter,
    open_files: Gauge,
    leases: Gauge,
    uncommitted: Gauge,
    stages: lnet::metrics::Stages,
    opens: Family<IoLabel, Counter>,
    io_bytes: Family<IoOpLabel, Counter>,
    /// Reads the mount's open files, leases held and uncommitted changes.
    state: std::sync::OnceLock<State>,
}

type State = Box<dyn Fn() -> (usize, usize, usize) + Send + Sync>;

impl std::fmt::Debug for MountMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MountMetrics").finish_non_exhaustive()
    }
}

impl MountMetrics {
    /// Counters registered in `registry` under `lode_mount_*`.
    pub fn register(registry: &mut Registry) -> Arc<MountMetrics> {
        let m = MountMetrics {
            requests: Family::default(),
            errors: Family::default(),
            read_bytes: Counter::default(),
            copy_read_bytes: Counter::default(),
            written_bytes: Counter::default(),
            open_files: Gauge::default(),
            leases: Gauge::default(),
            uncommitted: Gauge::default(),
            stages: lnet::metrics::stages(),
            opens: Family::default(),
            io_bytes: Family::default(),
            state: std::sync::OnceLock::new(),
        };
        let r = registry.sub_registry_with_prefix("lode_mount");
        r.register(
            "requests",
            "Requests from the kernel, by operation",
            m.requests.clone(),
        );
        r.register(
            "errors",
            "Reads and writes answered with an error, by operation",
            m.errors.clone(),
        );
        r.register(
            "read_bytes",
            "Bytes returned to reads",
            m.read_bytes.clone(),
        );
        r.register(
            "copy_read_bytes",
            "Bytes returned to reads from the mount's own copies of small files made through it",
            m.copy_read_bytes.clone(),
        );
        r.register(
            "written_bytes",
            "Bytes taken by writes",
            m.written_bytes.clone(),
        );
        r.register(
            "open_files",
            "Files held open through the mount",
            m.open_files.clone(),
        );
        r.register(
            "leases",
            "Leases the mount's client holds (lookups and attributes it answers itself)",
            m.leases.clone(),
        );
        r.register(
            "uncommitted_changes",
            "Changes the MDS answered and has not committed yet, kept for replay",
            m.uncommitted.clone(),
        );
        r.register(
            "opens",
            "Files opened, by how their reads and writes go: direct (past the page cache: \
             O_DIRECT, or chosen by hybrid I/O) or page_cache",
            m.opens.clone(),
        );
        r.register(
            "io_bytes",
            "Bytes read and written by the kernel's requests, by how the handle's I/O goes \
             (direct or page_cache; under the page cache these are the kernel's readahead and \
             write-through requests)",
            m.io_bytes.clone(),
        );
        r.register(
            "stage_seconds",
            "Time in each stage of the kernel's data requests: read and write (request to \
             reply), read_wait (for a readahead chunk to land), read_direct (a read outside a \
             stream), write_wait (for an earlier write to land: a full window or an overlap), \
             write_behind (a write in flight, issued to landed), fsync_settle (for the writes in \
             flight), fsync_commit (the storage servers' sync), flush",
            m.stages.clone(),
        );
        Arc::new(m)
    }

    /// A file opened, its I/O `direct` or through the page cache.
    pub(crate) fn opened(&self, direct: bool) {
        self.opens.get_or_create(&IoLabel { io: io(direct) }).inc();
    }

    /// `n` bytes of `op` (read, write) through a handle whose I/O is `direct` or cached.
    pub(crate) fn io_bytes(&self, op: &'static str, direct: bool, n: usize) {
        self.io_bytes
            .get_or_create(&IoOpLabel { io: io(direct), op })
            .inc_by(n as u64);
    }

    /// Counts the time since `since` in `stage` (see `lode_mount_stage_seconds`).
    pub(crate) fn stage(&self, stage: &'static str, since: std::time::Instant) {
        lnet::metrics::observe_stage(&self.stages, stage, since);
    }

    /// Where the gauges are read from: the mount being served.
    pub(crate) fn watch(&self, state: State) {
        let _ = self.state.set(state);
    }

    /// Brings the gauges up to date: run before each scrape.
    pub fn refresh(&self) {
        if let Some(state) = self.state.get() {
            let (open, leases, uncommitted) = state();
            self.open_files.set(open as i64);
            self.leases.set(leases as i64);
            self.uncommitted.set(uncommitted as i64);
        }
    }

    pub(crate) fn request(&self, op: &'static str) {
        self.requests.get_or_create(&OpLabel { op }).inc();
    }

    pub(crate) fn read(&self, r: &Result<usize, ()>) {
        match r {
            Ok(n) => {
                self.read_bytes.inc_by(*n as u64);
            }
            Err(()) => {
                self.errors.get_or_create(&OpLabel { op: "read" }).inc();
            }
        }
    }

    /// Bytes returned from the mount's copy of a small file made through it (counted in the
    /// bytes read as well).
    pub(crate) fn read_copy(&self, n: usize) {
        self.read_bytes.inc_by(n as u64);
        self.copy_read_bytes.inc_by(n as u64);
    }

    pub(crate) fn written(&self, r: &Result<usize, ()>) {
        match r {
            Ok(n) => {
                self.written_bytes.inc_by(*n as u64);
            }
            Err(()) => {
                self.errors.get_or_create(&OpLabel { op: "write" }).inc();
            }
        }
    }
}
