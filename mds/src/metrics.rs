//! What the MDS counts for its metrics endpoint, beside the RPC layer's counters
//! ([`lnet::metrics::ServiceMetrics`]): changes applied by kind, the journal's group commits
//! (their latency and how many records each carried), and, set at each scrape, the clients in
//! the table, the inodes in the namespace and the storage targets in service.

use std::sync::Arc;

use lnet::metrics::OpLabel;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

pub struct MdsMetrics {
    pub(crate) changes: Family<OpLabel, Counter>,
    pub(crate) commit_seconds: Histogram,
    pub(crate) group_records: Histogram,
    pub(crate) clients: Gauge,
    pub(crate) inodes: Gauge,
    pub(crate) targets: Gauge,
}

impl std::fmt::Debug for MdsMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MdsMetrics").finish_non_exhaustive()
    }
}

impl MdsMetrics {
    /// Counters registered in `registry` under `lode_mds_*`.
    pub fn register(registry: &mut Registry) -> Arc<MdsMetrics> {
        let m = MdsMetrics {
            changes: Family::default(),
            commit_seconds: Histogram::new(exponential_buckets(50e-6, 2.0, 16)),
            group_records: Histogram::new(exponential_buckets(1.0, 2.0, 14)),
            clients: Gauge::default(),
            inodes: Gauge::default(),
            targets: Gauge::default(),
        };
        let r = registry.sub_registry_with_prefix("lode_mds");
        r.register(
            "changes",
            "Namespace changes applied, by kind (create, unlink, rename, setattr...)",
            m.changes.clone(),
        );
        r.register(
            "journal_commit_seconds",
            "Time to append and flush one journal group",
            m.commit_seconds.clone(),
        );
        r.register(
            "journal_group_records",
            "Records carried by one journal group commit",
            m.group_records.clone(),
        );
        r.register(
            "clients",
            "Clients in the table of clients",
            m.clients.clone(),
        );
        r.register("inodes", "Inodes in the namespace", m.inodes.clone());
        r.register(
            "targets_in_service",
            "Storage targets new files may be placed on",
            m.targets.clone(),
        );
        Arc::new(m)
    }

    pub(crate) fn applied(&self, kind: &'static str) {
        self.changes.get_or_create(&OpLabel { op: kind }).inc();
    }
}
