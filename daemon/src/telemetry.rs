//! What a server counts, set up one way for every server: the RPC layer's counters and the
//! table of jobs in one registry, the flags that turn them off, and the metrics endpoint that
//! shows the registry when an address is given.
//!
//! Counting is on by default: a server's status answer (`lode top`, `lode health`) reads the
//! same counters. Turning it off is explicit, for measuring what it costs.

use std::net::SocketAddr;
use std::sync::Arc;

use lnet::jobstats::JobTable;
use lnet::metrics::ServiceMetrics;
use lnet::Attach;
use prometheus_client::registry::Registry;

use crate::metrics::{MetricsError, MetricsServer, Refresh};

/// The flags `lode-mds` and `lode-oss` share for what they count.
#[derive(clap::Args, Debug, Default)]
pub struct StatsArgs {
    /// Serve Prometheus metrics at http://ADDR/metrics [default: off].
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
    /// Count nothing: no metrics, no job statistics, no counts in `lode top`.
    #[arg(long)]
    pub no_stats: bool,
    /// Keep no job statistics.
    #[arg(long)]
    pub no_job_stats: bool,
}

/// What a server counts, as flags over its configuration file decide.
pub struct Telemetry {
    pub registry: Registry,
    pub rpc: Option<Arc<ServiceMetrics>>,
    pub jobs: Option<Arc<JobTable>>,
    /// Where the metrics endpoint listens, when it does.
    pub endpoint: Option<SocketAddr>,
}

impl StatsArgs {
    /// The flags over a configuration file's `metrics`, `stats` and `job_stats`.
    pub fn telemetry(
        &self,
        file_metrics: Option<SocketAddr>,
        file_stats: Option<bool>,
        file_job_stats: Option<bool>,
    ) -> Telemetry {
        let counting = !self.no_stats && file_stats != Some(false);
        let jobs = counting && !self.no_job_stats && file_job_stats != Some(false);
        if !counting {
            tracing::warn!("counting is off: no metrics, job statistics or counts for lode top");
        } else if !jobs {
            tracing::warn!("job statistics are off");
        }
        let mut registry = Registry::default();
        Telemetry {
            rpc: counting.then(|| ServiceMetrics::register(&mut registry)),
            jobs: jobs.then(|| Arc::new(JobTable::default())),
            registry,
            endpoint: self.metrics.or(file_metrics),
        }
    }
}

impl Telemetry {
    /// Whether the server counts at all (services register their own counters only then).
    pub fn counting(&self) -> bool {
        self.rpc.is_some()
    }

    /// Has the endpoint of `attach` count into these counters.
    pub fn attach(&self, attach: &mut Attach) {
        if let Attach::Tcp { cfg, .. } = attach {
            cfg.metrics = self.rpc.clone();
            cfg.jobs = self.jobs.clone();
        }
    }

    /// Serves the registry when an address was given; the server is stopped when dropped.
    pub async fn serve(
        self,
        refresh: Option<Refresh>,
    ) -> Result<Option<MetricsServer>, MetricsError> {
        let Some(addr) = self.endpoint else {
            return Ok(None);
        };
        if self.rpc.is_none() {
            tracing::warn!(%addr, "the metrics endpoint serves nothing: counting is off");
        }
        Ok(Some(
            MetricsServer::start(addr, Arc::new(self.registry), refresh).await?,
        ))
    }
}

/// Reads a server's TOML configuration file, or the defaults when there is none. An unknown
/// key is an error where the type says so (`deny_unknown_fields`).
pub fn load_config<T: serde::de::DeserializeOwned + Default>(
    path: Option<&std::path::Path>,
) -> Result<T, ConfigError> {
    let Some(path) = path else {
        return Ok(T::default());
    };
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    toml::from_str(&text).map_err(|source| ConfigError::Parse {
        path: path.to_path_buf(),
        source,
    })
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {}: {source}", path.display())]
    Read {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("parsing {}: {source}", path.display())]
    Parse {
        path: std::path::PathBuf,
        source: toml::de::Error,
    },
}
