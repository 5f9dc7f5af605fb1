//! What a server's RPC layer counts, for its metrics endpoint: requests and their latency by
//! operation, errors by kind, requests answered `Busy`, requests being served, and bytes of
//! request and reply bodies. A server registers one [`ServiceMetrics`] and hands it to its
//! endpoint ([`crate::tcp::TcpConfig::metrics`]); a server without one counts nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use proto::{Opcode, RemoteError, StatusCode};

/// One operation.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabel {
    pub op: &'static str,
}

/// One operation failing one way.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabel {
    pub op: &'static str,
    pub kind: String,
}

/// Latency buckets: 10 µs to about 11 s, each 1.5 times the one before, fine enough to tell
/// a 1 MiB request's median from its p99 (a doubling bucket cannot tell 300 µs from 500 µs).
pub fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(10e-6, 1.5, 35))
}

/// One stage of a request's way through a client or a server (waiting for readahead, a write
/// in flight, the disk...).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabel {
    pub stage: &'static str,
}

/// The time requests spend in each stage, by stage: always on, one clock read and one
/// histogram observation per stage, so that a stall can be found in production.
pub type Stages = Family<StageLabel, Histogram, fn() -> Histogram>;

/// A family of stage histograms with [`latency_histogram`]'s buckets.
pub fn stages() -> Stages {
    Stages::new_with_constructor(latency_histogram)
}

/// Counts the time since `since` in `stage`.
pub fn observe_stage(stages: &Stages, stage: &'static str, since: std::time::Instant) {
    stages
        .get_or_create(&StageLabel { stage })
        .observe(since.elapsed().as_secs_f64());
}

type Latencies = Family<OpLabel, Histogram, fn() -> Histogram>;

/// The RPC layer's counters of one server.
pub struct ServiceMetrics {
    requests: Family<OpLabel, Counter>,
    latency: Latencies,
    errors: Family<ErrorLabel, Counter>,
    busy: Counter,
    serving: Gauge,
    connections: Gauge,
    bytes_in: Counter,
    bytes_out: Counter,
    /// Each operation's counter and histogram of the families, indexed as
    /// [`proto::msg::opcodes::ALL`] and found once: a family's lookup takes a lock and a hash
    /// on every request otherwise, and a family cannot be walked for the status answer.
    per_op: [std::sync::OnceLock<(Counter, Histogram)>; proto::msg::opcodes::ALL.len()],
    failed: AtomicU64,
}

impl std::fmt::Debug for ServiceMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceMetrics").finish_non_exhaustive()
    }
}

impl ServiceMetrics {
    /// Counters registered in `registry` under `lode_rpc_*`.
    pub fn register(registry: &mut Registry) -> Arc<ServiceMetrics> {
        let m = ServiceMetrics {
            requests: Family::default(),
            latency: Latencies::new_with_constructor(latency_histogram),
            errors: Family::default(),
            busy: Counter::default(),
            serving: Gauge::default(),
            connections: Gauge::default(),
            bytes_in: Counter::default(),
            bytes_out: Counter::default(),
            per_op: std::array::from_fn(|_| std::sync::OnceLock::new()),
            failed: AtomicU64::new(0),
        };
        let r = registry.sub_registry_with_prefix("lode_rpc");
        r.register(
            "requests",
            "Requests served, by operation",
            m.requests.clone(),
        );
        r.register(
            "latency_seconds",
            "Time from a request's admission to its reply, by operation",
            m.latency.clone(),
        );
        r.register(
            "errors",
            "Requests answered with an error, by operation and kind",
            m.errors.clone(),
        );
        r.register(
            "busy",
            "Requests refused with Busy because the queue was full",
            m.busy.clone(),
        );
        r.register(
            "serving",
            "Requests admitted and not yet answered (the queue's depth)",
            m.serving.clone(),
        );
        r.register(
            "connections",
            "Connections from clients and servers open now (every second)",
            m.connections.clone(),
        );
        r.register(
            "request_body_bytes",
            "Bytes of request bodies received (bulk data is counted by the service)",
            m.bytes_in.clone(),
        );
        r.register(
            "reply_body_bytes",
            "Bytes of reply bodies sent",
            m.bytes_out.clone(),
        );
        Arc::new(m)
    }

    pub(crate) fn admitted(&self, body: usize) {
        self.serving.inc();
        self.bytes_in.inc_by(body as u64);
    }

    pub(crate) fn answered(
        &self,
        op: Opcode,
        out: &Result<Vec<u8>, RemoteError>,
        took: std::time::Duration,
    ) {
        self.serving.dec();
        let label = OpLabel { op: op.name() };
        match op.index() {
            Some(i) => {
                let (requests, latency) = self.per_op[i].get_or_init(|| {
                    (
                        self.requests.get_or_create(&label).clone(),
                        self.latency.get_or_create(&label).clone(),
                    )
                });
                requests.inc();
                latency.observe(took.as_secs_f64());
            }
            None => {
                self.requests.get_or_create(&label).inc();
                self.latency
                    .get_or_create(&label)
                    .observe(took.as_secs_f64());
            }
        }
        match out {
            Ok(body) => {
                self.bytes_out.inc_by(body.len() as u64);
            }
            Err(e) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                self.errors
                    .get_or_create(&ErrorLabel {
                        op: label.op,
                        kind: kind_name(&e.code),
                    })
                    .inc();
            }
        }
    }

    pub(crate) fn connections(&self, open: usize) {
        self.connections.set(open as i64);
    }

    pub(crate) fn refused_busy(&self) {
        self.busy.inc();
    }

    /// Requests served by operation (those served at least once), errors, `Busy` answers and
    /// requests being served, for the server's status answer.
    pub fn counts(&self) -> (Vec<proto::stats::OpCount>, u64, u64, u64) {
        let ops = proto::msg::opcodes::ALL
            .iter()
            .zip(&self.per_op)
            .map(|(op, c)| (op, c.get().map_or(0, |(n, _)| n.get())))
            .filter(|(_, n)| *n > 0)
            .map(|(op, count)| proto::stats::OpCount {
                op: op.name().to_owned(),
                count,
            })
            .collect();
        (
            ops,
            self.failed.load(Ordering::Relaxed),
            self.busy.get(),
            self.serving.get().max(0) as u64,
        )
    }
}

/// What a caller (a client, the mount) counts of its own calls: calls and their latency by
/// operation, and failures by operation and kind, under `lode_client_*`.
pub struct CallMetrics {
    calls: Family<OpLabel, Counter>,
    latency: Latencies,
    errors: Family<ErrorLabel, Counter>,
    in_flight: Gauge,
}

impl std::fmt::Debug for CallMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallMetrics").finish_non_exhaustive()
    }
}

impl CallMetrics {
    pub fn register(registry: &mut Registry) -> Arc<CallMetrics> {
        let m = CallMetrics {
            calls: Family::default(),
            latency: Latencies::new_with_constructor(latency_histogram),
            errors: Family::default(),
            in_flight: Gauge::default(),
        };
        let r = registry.sub_registry_with_prefix("lode_client");
        r.register(
            "calls",
            "Calls made to servers, by operation",
            m.calls.clone(),
        );
        r.register(
            "call_latency_seconds",
            "Time from sending a call to its answer, by operation (resends are calls of their own)",
            m.latency.clone(),
        );
        r.register(
            "call_errors",
            "Calls that failed, by operation and kind (timeout, unreachable, busy, or the server's error)",
            m.errors.clone(),
        );
        r.register(
            "calls_in_flight",
            "Calls sent and not yet answered",
            m.in_flight.clone(),
        );
        Arc::new(m)
    }

    /// A call is sent: counted in flight until the guard returned goes (answered, or the
    /// call abandoned by its caller).
    pub(crate) fn sent(&self) -> InFlight<'_> {
        self.in_flight.inc();
        InFlight {
            m: self,
            start: std::time::Instant::now(),
        }
    }
}

/// One call in flight, for [`CallMetrics`].
pub(crate) struct InFlight<'a> {
    m: &'a CallMetrics,
    start: std::time::Instant,
}

impl InFlight<'_> {
    pub(crate) fn answered(self, op: Opcode, out: &Result<Vec<u8>, crate::NetError>) {
        let m = self.m;
        let label = OpLabel { op: op.name() };
        m.calls.get_or_create(&label).inc();
        m.latency
            .get_or_create(&label)
            .observe(self.start.elapsed().as_secs_f64());
        if let Err(e) = out {
            m.errors
                .get_or_create(&ErrorLabel {
                    op: label.op,
                    kind: net_kind(e),
                })
                .inc();
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.m.in_flight.dec();
    }
}

/// A failed call's kind as a label value.
fn net_kind(e: &crate::NetError) -> String {
    use crate::NetError as E;
    match e {
        E::Timeout { .. } => "timeout".into(),
        E::Busy { .. } => "busy".into(),
        E::Unreachable { .. } | E::NodeDown { .. } => "unreachable".into(),
        E::Closed { .. } => "closed".into(),
        E::Refused { .. } => "refused".into(),
        E::Remote { err, .. } => kind_name(&err.code),
        E::Frame { .. } => "bad_frame".into(),
        _ => "other".into(),
    }
}

/// An error's kind as a label value: "busy", "not_found", "fs_access"...
fn kind_name(code: &StatusCode) -> String {
    let debug = format!("{code:?}");
    let mut out = String::with_capacity(debug.len() + 4);
    for (i, c) in debug.chars().filter(|c| c.is_alphanumeric()).enumerate() {
        if c.is_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_kinds_read_as_labels() {
        assert_eq!(kind_name(&StatusCode::NotFound), "not_found");
        assert_eq!(kind_name(&StatusCode::Busy), "busy");
    }
}
