//! One look at the whole cluster, for `lode top`, `lode health` and `lode jobstats`: the MDS's
//! status, its registry of targets, and the status of every storage server the registry
//! names, each asked at once and given a bounded time to answer.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use client::Client;
use proto::registry::TargetInfo;
use proto::stats::ServerStatus;
use proto::Nid;

/// How long one server has to answer before it counts as down: time enough for a server on
/// several addresses to be reached over its second after the first gives no connection
/// ([`lnet::tcp::rails::RAIL_CONNECT`]).
pub const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// One server's answer, or why there was none.
pub struct Answer {
    pub status: Result<ServerStatus, String>,
    /// This machine's clock, in ms since the epoch, half way through the call: what the
    /// server's clock should have read when it answered.
    pub local_mid_ms: u64,
}

impl Answer {
    /// How far the server's clock is ahead of this machine's, in ms.
    pub fn skew_ms(&self) -> Option<i64> {
        let s = self.status.as_ref().ok()?;
        Some(s.now_unix_ms as i64 - self.local_mid_ms as i64)
    }
}

/// What the cluster said at one moment.
pub struct Snapshot {
    pub at: Instant,
    pub mds: Answer,
    /// The registry of targets; an error when the MDS did not give it.
    pub targets: Result<Vec<TargetInfo>, String>,
    /// Each storage server the registry names.
    pub servers: BTreeMap<Nid, Answer>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

async fn ask(client: &Client, server: Option<&Nid>, jobs: bool) -> Answer {
    let before = now_ms();
    let status = client
        .server_status(server, jobs, ANSWER_WITHIN)
        .await
        .map_err(|e| e.to_string());
    let after = now_ms();
    Answer {
        status,
        local_mid_ms: before + (after - before) / 2,
    }
}

/// Asks every server at once; `jobs` asks for each job's work too.
pub async fn gather(client: &Client, jobs: bool) -> Snapshot {
    let at = Instant::now();
    let (mds, targets) = tokio::join!(ask(client, None, jobs), async {
        tokio::time::timeout(ANSWER_WITHIN, client.targets())
            .await
            .map_err(|_| "the MDS did not answer in time".to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
    });
    let mut nids: Vec<Nid> = targets
        .as_ref()
        .map(|ts| ts.iter().map(|t| t.oss.clone()).collect())
        .unwrap_or_default();
    nids.sort();
    nids.dedup();
    let answers =
        futures_util::future::join_all(nids.iter().map(|n| ask(client, Some(n), jobs))).await;
    Snapshot {
        at,
        mds,
        targets,
        servers: nids.into_iter().zip(answers).collect(),
    }
}

/// Whether this key may read job statistics (the cluster key's holders may).
pub async fn may_see_jobs(client: &Client) -> bool {
    match client.server_status(None, true, ANSWER_WITHIN).await {
        Ok(_) => true,
        Err(e) => !e.is(proto::FsErrorKind::NotPermitted),
    }
}

/// Bytes as `lfs df -h` prints them: 1024-based, one decimal below 10.
pub fn human(bytes: f64) -> String {
    const UNITS: [&str; 7] = ["B", "K", "M", "G", "T", "P", "E"];
    let mut v = bytes;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{v:.0}{}", UNITS[i])
    } else if v < 10.0 {
        format!("{v:.1}{}", UNITS[i])
    } else {
        format!("{v:.0}{}", UNITS[i])
    }
}

/// A duration in seconds as `1d2h`, `3h4m`, `5m6s` or `7s`.
pub fn uptime(s: u64) -> String {
    let (d, h, m) = (s / 86_400, s / 3600 % 24, s / 60 % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m{}s", s % 60),
        (0, _, _) => format!("{h}h{m}m"),
        _ => format!("{d}d{h}h"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_times_read_as_lfs_and_top_print_them() {
        assert_eq!(human(512.0), "512B");
        assert_eq!(human(1536.0), "1.5K");
        assert_eq!(human(40.0 * 1024.0 * 1024.0 * 1024.0), "40G");
        assert_eq!(uptime(7), "7s");
        assert_eq!(uptime(3725), "1h2m");
        assert_eq!(uptime(90_000), "1d1h");
    }
}
