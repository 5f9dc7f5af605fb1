//! `lode-copytool`: moves files between lode and S3 for the MDS's HSM queue (archive,
//! restore, import). Holds the cluster key; reads the S3 credentials from the standard AWS
//! environment variables or shared credentials file.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;

#[derive(Parser)]
#[command(
    name = "lode-copytool",
    about = "lode's HSM copytool: archives, restores and imports files between lode and S3"
)]
struct Args {
    /// The MDS (IP:PORT or a NID); default $LODE_MDS, else 127.0.0.1:9400.
    #[arg(long)]
    mds: Option<String>,
    /// The cluster key (a copytool's requests need it); default $LODE_KEY, else
    /// /etc/lode/client.key.
    #[arg(long, value_name = "FILE")]
    key: Option<PathBuf>,
    /// Connect without authentication (only to a cluster that runs without it).
    #[arg(long, conflicts_with = "key")]
    no_auth: bool,
    /// Actions carried out at once.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Ranged GETs in flight per restore, and parts in flight per upload.
    #[arg(long, default_value_t = 8)]
    streams: usize,
    /// Bytes per GET and per uploaded part (at least 5 MiB for uploads), e.g. 16M.
    #[arg(long, default_value = "16M")]
    part_size: String,
    /// Serve metrics (OpenMetrics text) at http://ADDR/metrics.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
}

fn main() -> anyhow::Result<()> {
    daemon::init_logging();
    let args = Args::parse();
    let part = proto::size::parse_size(&args.part_size)
        .map_err(|e| anyhow::anyhow!("--part-size {}: {e}", args.part_size))?;
    let mds = args
        .mds
        .or_else(|| std::env::var("LODE_MDS").ok())
        .unwrap_or_else(|| "127.0.0.1:9400".into());
    let security = lnet::auth::client_security(args.key.as_deref(), args.no_auth, false)
        .context("the key")?
        .admin();
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        let mut cfg = client::ClientConfig {
            security: Some(security),
            ..Default::default()
        };
        let mut registry = prometheus_client::registry::Registry::default();
        let counted = args.metrics.map(|_| {
            cfg.calls = Some(lnet::metrics::CallMetrics::register(&mut registry));
            copytool::CopytoolMetrics::register(&mut registry)
        });
        let _served = match args.metrics {
            Some(addr) => Some(
                daemon::metrics::MetricsServer::start(addr, std::sync::Arc::new(registry), None)
                    .await?,
            ),
            None => None,
        };
        let client = client::Client::connect_with(&mds, cfg)
            .await
            .with_context(|| format!("connecting to the MDS at {mds}"))?;
        let tool = copytool::Copytool::with_metrics(
            client.clone(),
            copytool::Config {
                workers: args.workers,
                streams: args.streams,
                part: part as usize,
            },
            counted,
        );
        tracing::info!(%mds, "copytool started");
        tokio::select! {
            _ = tool.run() => {}
            why = daemon::stop_requested() => {
                tracing::info!(signal = why?, "stopping");
            }
        }
        client.close().await.ok();
        Ok(())
    })
}
