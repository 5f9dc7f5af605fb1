//! `lst`: the network self-test, after LNet's `lst`. It serves the self-test service, pings a
//! server, and benchmarks the network against raw baselines measured in the same run.

mod bench;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use lnet::selftest::SelfTest;
use lnet::tcp::{TcpConfig, TcpEndpoint};
use lnet::{call, Transport};
use proto::msg::Ping;
use proto::Nid;

#[derive(Parser)]
#[command(name = "lst", about = "lode network self-test: serve, ping, benchmark")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve the self-test service over TCP until interrupted.
    Serve {
        #[arg(long, default_value = "127.0.0.1:9400")]
        listen: SocketAddr,
        /// The cluster key to authenticate peers with.
        #[arg(long)]
        key: Option<std::path::PathBuf>,
        /// Serve without authentication.
        #[arg(long, conflicts_with = "key")]
        no_auth: bool,
    },
    /// Ping a self-test server and print round-trip times.
    Ping {
        /// The server's NID, e.g. 127.0.0.1:9400@tcp.
        nid: Nid,
        #[arg(long, short, default_value_t = 4)]
        count: u32,
        /// The key to authenticate with (default $LODE_KEY).
        #[arg(long)]
        key: Option<std::path::PathBuf>,
        /// Ping a server that runs without authentication.
        #[arg(long, conflicts_with = "key")]
        no_auth: bool,
    },
    /// Benchmark RPC and bulk transfer against raw sockets and memcpy. Without --peer it starts
    /// its own server on loopback.
    Bench(bench::BenchArgs),
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LODE_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(async move {
        match cli.cmd {
            Cmd::Serve {
                listen,
                key,
                no_auth,
            } => {
                let security = lnet::auth::server_security(key.as_deref(), no_auth, false)?;
                serve(listen, security).await
            }
            Cmd::Ping {
                nid,
                count,
                key,
                no_auth,
            } => {
                let security = lnet::auth::client_security(key.as_deref(), no_auth, false)?;
                ping(nid, count, security).await
            }
            Cmd::Bench(args) => bench::run(args).await,
        }
    })
}

async fn serve(listen: SocketAddr, security: lnet::auth::Security) -> Result<()> {
    let cfg = TcpConfig {
        security,
        ..TcpConfig::default()
    };
    let ep = TcpEndpoint::bind(listen, SelfTest::new(), cfg)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    println!("serving the self-test service at {}", ep.nid());
    tokio::signal::ctrl_c().await?;
    ep.shutdown();
    Ok(())
}

async fn ping(nid: Nid, count: u32, security: lnet::auth::Security) -> Result<()> {
    let ep = TcpEndpoint::client(TcpConfig {
        security,
        ..TcpConfig::default()
    });
    for i in 0..count {
        let t0 = Instant::now();
        let pong = call(
            &ep,
            &nid,
            &Ping {
                nonce: u64::from(i),
            },
            Duration::from_secs(5),
        )
        .await
        .with_context(|| format!("ping {nid}"))?;
        println!(
            "reply from {}: seq={} time={:?}",
            pong.nid,
            pong.nonce,
            t0.elapsed()
        );
    }
    Ok(())
}
