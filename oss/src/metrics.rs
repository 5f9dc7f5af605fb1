//! What a storage server counts for its metrics endpoint, beside the RPC layer's counters
//! ([`lnet::metrics::ServiceMetrics`]): bytes and operations read and written per target, and,
//! set at each scrape, each target's space and objects.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::target::Target;

/// One storage target, by index.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TargetLabel {
    pub target: u32,
}

/// One target's reads or writes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TargetOpLabel {
    pub target: u32,
    pub op: &'static str,
}

/// Objects are counted by walking a target's directories: at most this often.
pub const OBJECT_COUNT_EVERY: Duration = Duration::from_secs(30);

pub struct OssMetrics {
    read_bytes: Family<TargetLabel, Counter>,
    write_bytes: Family<TargetLabel, Counter>,
    reads: Family<TargetLabel, Counter>,
    writes: Family<TargetLabel, Counter>,
    space_total: Family<TargetLabel, Gauge>,
    space_free: Family<TargetLabel, Gauge>,
    objects: Family<TargetLabel, Gauge>,
    buffered: Family<TargetOpLabel, Gauge>,
    stages: lnet::metrics::Stages,
    counted: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for OssMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OssMetrics").finish_non_exhaustive()
    }
}

impl OssMetrics {
    /// Counters registered in `registry` under `lode_oss_*`.
    pub fn register(registry: &mut Registry) -> Arc<OssMetrics> {
        let m = OssMetrics {
            read_bytes: Family::default(),
            write_bytes: Family::default(),
            reads: Family::default(),
            writes: Family::default(),
            space_total: Family::default(),
            space_free: Family::default(),
            objects: Family::default(),
            buffered: Family::default(),
            stages: lnet::metrics::stages(),
            counted: Mutex::new(None),
        };
        let r = registry.sub_registry_with_prefix("lode_oss");
        r.register(
            "read_bytes",
            "Bytes read from a target and sent",
            m.read_bytes.clone(),
        );
        r.register(
            "write_bytes",
            "Bytes received and written to a target",
            m.write_bytes.clone(),
        );
        r.register("reads", "Reads served by a target", m.reads.clone());
        r.register("writes", "Writes applied by a target", m.writes.clone());
        r.register(
            "space_total_bytes",
            "Size of a target's filesystem",
            m.space_total.clone(),
        );
        r.register(
            "space_free_bytes",
            "Space left on a target's filesystem",
            m.space_free.clone(),
        );
        r.register(
            "objects",
            "Objects on a target (counted at most every 30 s)",
            m.objects.clone(),
        );
        r.register(
            "streams_buffered",
            "1 where a target's large reads (op=read) or writes (op=write) go through the page \
             cache, 0 where they go direct (measured per device, or set with --io)",
            m.buffered.clone(),
        );
        r.register(
            "stage_seconds",
            "Time in each stage of a data request on this server: bulk_get (the client's bytes \
             pulled over the network), write_disk (written, checksums and all), read_disk (read \
             and verified), bulk_put (the bytes pushed to the client), sync",
            m.stages.clone(),
        );
        Arc::new(m)
    }

    /// Counts the time since `since` in `stage` (see `lode_oss_stage_seconds`).
    pub(crate) fn stage(&self, stage: &'static str, since: Instant) {
        lnet::metrics::observe_stage(&self.stages, stage, since);
    }

    pub(crate) fn read(&self, target: u32, bytes: u64) {
        let t = TargetLabel { target };
        self.reads.get_or_create(&t).inc();
        self.read_bytes.get_or_create(&t).inc_by(bytes);
    }

    pub(crate) fn written(&self, target: u32, bytes: u64) {
        let t = TargetLabel { target };
        self.writes.get_or_create(&t).inc();
        self.write_bytes.get_or_create(&t).inc_by(bytes);
    }

    /// A target's bytes read and written, and its reads and writes, so far.
    pub fn counts(&self, target: u32) -> (u64, u64, u64, u64) {
        let t = TargetLabel { target };
        (
            self.read_bytes.get_or_create(&t).get(),
            self.write_bytes.get_or_create(&t).get(),
            self.reads.get_or_create(&t).get(),
            self.writes.get_or_create(&t).get(),
        )
    }

    /// Sets the gauges from the targets (before a scrape).
    pub fn refresh(&self, targets: &[Arc<Target>]) {
        let count = {
            let mut last = self.counted.lock();
            let due = last.is_none_or(|t| t.elapsed() >= OBJECT_COUNT_EVERY);
            if due {
                *last = Some(Instant::now());
            }
            due
        };
        for t in targets {
            let label = TargetLabel { target: t.index() };
            let io = t.io();
            for (op, limit) in [("read", io.cache_max_read), ("write", io.cache_max_write)] {
                self.buffered
                    .get_or_create(&TargetOpLabel {
                        target: t.index(),
                        op,
                    })
                    .set(i64::from(limit == u64::MAX));
            }
            match t.space() {
                Ok(s) => {
                    self.space_total.get_or_create(&label).set(s.total as i64);
                    self.space_free.get_or_create(&label).set(s.free as i64);
                }
                Err(e) => tracing::warn!(target = t.index(), error = %e, "statfs for metrics"),
            }
            if count {
                match t.objects() {
                    Ok(o) => {
                        self.objects.get_or_create(&label).set(o.len() as i64);
                    }
                    Err(e) => tracing::warn!(target = t.index(), error = %e, "counting objects"),
                }
            }
        }
    }
}
