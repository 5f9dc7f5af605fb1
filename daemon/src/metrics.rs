//! The metrics endpoint of a lode process: its registry as OpenMetrics text (what Prometheus
//! scrapes) over plain HTTP, on an address the operator chooses (`metrics = "ADDR"` in the
//! config, or `--metrics ADDR`).
//!
//! The endpoint answers `GET /metrics` and nothing else; it shows counts, never file names or
//! data, and is off unless asked for. Bind it to an address only the monitoring network reaches.
//! At most [`MAX_SCRAPES`] scrapes are answered at once, and a request must arrive within
//! [`REQUEST_TIMEOUT`] in [`MAX_REQUEST`] bytes or less: a slow or hostile peer costs one
//! connection, never the server.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::AbortHandle;

/// Scrapes answered at once.
pub const MAX_SCRAPES: usize = 16;
/// Longest request head read.
pub const MAX_REQUEST: usize = 8 << 10;
/// How long a peer has to send its request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// What Prometheus is told the body is.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Brings gauges up to date (space, connections) just before a scrape is encoded.
pub type Refresh = Arc<dyn Fn() + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("cannot serve metrics on {addr}: {source}")]
    Bind { addr: SocketAddr, source: io::Error },
}

/// A metrics endpoint being served; stops when dropped.
pub struct MetricsServer {
    addr: SocketAddr,
    task: AbortHandle,
}

impl MetricsServer {
    /// Serves `registry` on `addr`; `refresh` runs before every scrape.
    pub async fn start(
        addr: SocketAddr,
        registry: Arc<Registry>,
        refresh: Option<Refresh>,
    ) -> Result<MetricsServer, MetricsError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| MetricsError::Bind { addr, source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| MetricsError::Bind { addr, source })?;
        let task = tokio::spawn(accept(listener, registry, refresh)).abort_handle();
        tracing::info!(%addr, "serving metrics at http://{addr}/metrics");
        Ok(MetricsServer { addr, task })
    }

    /// The address bound (with the port chosen, when 0 was asked for).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The registry as OpenMetrics text.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail; a metric that cannot encode itself is a bug.
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, registry) {
        tracing::error!(error = %e, "encoding metrics");
    }
    out
}

async fn accept(listener: TcpListener, registry: Arc<Registry>, refresh: Option<Refresh>) {
    let slots = Arc::new(Semaphore::new(MAX_SCRAPES));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "accepting a metrics connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            drop(stream); // too many scrapes at once: this one is closed unanswered
            continue;
        };
        let (registry, refresh) = (registry.clone(), refresh.clone());
        tokio::spawn(async move {
            let _slot = slot;
            if let Err(e) = answer(stream, &registry, refresh.as_deref()).await {
                tracing::debug!(%peer, error = %e, "metrics request");
            }
        });
    }
}

/// Reads one request head and answers it; the connection is closed after.
async fn answer(
    mut stream: TcpStream,
    registry: &Registry,
    refresh: Option<&(dyn Fn() + Send + Sync)>,
) -> io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    let read = async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            if head.len() >= MAX_REQUEST {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "request too long",
                ));
            }
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok(())
    };
    tokio::time::timeout(REQUEST_TIMEOUT, read)
        .await
        .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut words = line.split(|&b| b == b' ');
    let (method, path) = (
        words.next().unwrap_or_default(),
        words.next().unwrap_or_default(),
    );
    let path = path.split(|&b| b == b'?').next().unwrap_or_default();
    let (status, kind, body) = match (method, path) {
        (b"GET" | b"HEAD", b"/metrics") => {
            if let Some(f) = refresh {
                f();
            }
            ("200 OK", CONTENT_TYPE, encode(registry))
        }
        (b"GET" | b"HEAD", _) => (
            "404 Not Found",
            "text/plain",
            "metrics are at /metrics\n".to_owned(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "only GET\n".to_owned(),
        ),
    };
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if method != b"HEAD" {
        out.extend_from_slice(body.as_bytes());
    }
    stream.write_all(&out).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;

    async fn get(addr: SocketAddr, request: &str) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(request.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn a_scrape_gets_the_registry_after_a_refresh_and_other_paths_do_not() {
        let mut registry = Registry::default();
        let c = Counter::<u64>::default();
        registry.register("lode_things", "Things done", c.clone());
        let refreshed = Counter::<u64>::default();
        let r = refreshed.clone();
        let server = MetricsServer::start(
            "127.0.0.1:0".parse().unwrap(),
            Arc::new(registry),
            Some(Arc::new(move || {
                r.inc();
            })),
        )
        .await
        .unwrap();
        c.inc_by(3);
        let out = get(server.addr(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        assert!(out.contains("\nlode_things_total 3\n"), "{out}");
        assert!(out.ends_with("# EOF\n"), "{out}");
        assert_eq!(refreshed.get(), 1);
        let out = get(server.addr(), "GET /other HTTP/1.1\r\n\r\n").await;
        assert!(out.starts_with("HTTP/1.1 404"), "{out}");
        let out = get(server.addr(), "POST /metrics HTTP/1.1\r\n\r\n").await;
        assert!(out.starts_with("HTTP/1.1 405"), "{out}");
        assert_eq!(refreshed.get(), 1, "only a scrape refreshes");
    }

    #[tokio::test]
    async fn a_request_that_never_ends_is_cut_off() {
        let server = MetricsServer::start(
            "127.0.0.1:0".parse().unwrap(),
            Arc::new(Registry::default()),
            None,
        )
        .await
        .unwrap();
        let mut s = TcpStream::connect(server.addr()).await.unwrap();
        let junk = vec![b'a'; MAX_REQUEST + 2048];
        let _ = s.write_all(&junk).await;
        let mut out = vec![];
        let n = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
        assert!(
            matches!(n, Ok(Ok(0)) | Ok(Err(_))),
            "the connection is closed"
        );
    }
}
