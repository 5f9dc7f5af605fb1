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
        Arc::new(m)
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
