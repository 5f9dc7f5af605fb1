//! What a copytool counts, for its metrics endpoint (`lode-copytool --metrics ADDR`): actions
//! carried out and failed by kind, bytes moved each way, actions running now, and names
//! imported. The client's calls to lode's servers are counted beside these
//! (`lnet::metrics::CallMetrics`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// One kind of work: `archive`, `restore`, `import`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

/// The copytool's counters.
#[derive(Default)]
pub struct CopytoolMetrics {
    done: Family<KindLabel, Counter>,
    failed: Family<KindLabel, Counter>,
    bytes: Family<KindLabel, Counter>,
    running: Family<KindLabel, Gauge>,
    names: Counter,
}

impl CopytoolMetrics {
    /// Counters registered in `registry`.
    pub fn register(registry: &mut Registry) -> std::sync::Arc<CopytoolMetrics> {
        let m = CopytoolMetrics::default();
        registry.register(
            "lode_copytool_actions_done",
            "Actions carried out, by kind",
            m.done.clone(),
        );
        registry.register(
            "lode_copytool_actions_failed",
            "Actions that failed (tried again or given up by the MDS), by kind",
            m.failed.clone(),
        );
        registry.register(
            "lode_copytool_bytes",
            "Bytes moved: uploaded by archives, fetched by restores",
            m.bytes.clone(),
        );
        registry.register(
            "lode_copytool_running",
            "Actions under way now, by kind",
            m.running.clone(),
        );
        registry.register(
            "lode_copytool_imported_names",
            "Names an import made or brought up to date",
            m.names.clone(),
        );
        std::sync::Arc::new(m)
    }

    pub(crate) fn started(&self, kind: &'static str) {
        self.running.get_or_create(&KindLabel { kind }).inc();
    }

    pub(crate) fn ended(&self, kind: &'static str, bytes: Option<u64>) {
        let k = KindLabel { kind };
        self.running.get_or_create(&k).dec();
        match bytes {
            Some(n) => {
                self.done.get_or_create(&k).inc();
                self.bytes.get_or_create(&k).inc_by(n);
            }
            None => {
                self.failed.get_or_create(&k).inc();
            }
        }
    }

    pub(crate) fn imported(&self, names: u64) {
        self.names.inc_by(names);
    }
}
