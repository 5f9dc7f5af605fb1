//! `lode health`: whether the cluster can serve, in one command for people and for
//! monitoring. Every server up and answering, every target in service with room, the MDS's
//! journal writing, and every server's clock close to this machine's (capabilities carry
//! times). One line per check, then a verdict; the exit status is 0 when all is well, 1 with
//! warnings and 2 with failures (the convention of monitoring plugins).

use std::fmt;

use client::Client;

use crate::monitor::{self, human, uptime, Snapshot};

/// Free space below which a target is a warning.
pub const SPACE_WARN: f64 = 0.10;
/// Free space at or below which a target takes no new files: a failure.
pub const SPACE_FAIL: f64 = 0.01;
/// Clock differences, in ms, past which a warning and a failure are given. Capabilities are
/// checked against the storage servers' clocks, and last a minute at the least.
pub const SKEW_WARN_MS: i64 = 2_000;
pub const SKEW_FAIL_MS: i64 = 60_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Ok,
    Warn,
    Fail,
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Level::Ok => "OK  ",
            Level::Warn => "WARN",
            Level::Fail => "FAIL",
        })
    }
}

/// The checks of one snapshot, in the order printed.
pub fn checks(s: &Snapshot) -> Vec<(Level, String)> {
    let mut out = vec![];
    let skew = |out: &mut Vec<(Level, String)>, who: &str, a: &monitor::Answer| {
        if let Some(ms) = a.skew_ms() {
            let level = match ms.abs() {
                d if d > SKEW_FAIL_MS => Level::Fail,
                d if d > SKEW_WARN_MS => Level::Warn,
                _ => return,
            };
            out.push((
                level,
                format!(
                    "{who}: clock differs from this machine's by {:.1}s",
                    ms as f64 / 1000.0
                ),
            ));
        }
    };
    match &s.mds.status {
        Ok(st) => {
            let j = st.service.journal.clone().unwrap_or_default();
            out.push((
                Level::Ok,
                format!(
                    "mds: up {}, {} clients, {} inodes, journal at {} (committed {})",
                    uptime(st.uptime_s),
                    st.service.clients,
                    st.service.inodes,
                    j.applied,
                    j.committed
                ),
            ));
            if j.failed {
                out.push((
                    Level::Fail,
                    "mds: a journal write failed; it takes no changes until restarted".into(),
                ));
            }
            skew(&mut out, "mds", &s.mds);
        }
        Err(e) => out.push((Level::Fail, format!("mds: not answering ({e})"))),
    }
    let targets = match &s.targets {
        Ok(t) => t,
        Err(e) => {
            out.push((
                Level::Fail,
                format!("targets: the MDS did not list them ({e})"),
            ));
            return out;
        }
    };
    if targets.is_empty() {
        out.push((Level::Fail, "targets: none registered".into()));
    }
    for (nid, a) in &s.servers {
        match &a.status {
            Ok(st) => {
                out.push((Level::Ok, format!("oss {nid}: up {}", uptime(st.uptime_s))));
                skew(&mut out, &format!("oss {nid}"), a);
            }
            Err(e) => out.push((Level::Fail, format!("oss {nid}: not answering ({e})"))),
        }
    }
    for t in targets {
        let name = format!("target {} on {}", t.index, t.oss);
        let served = s
            .servers
            .get(&t.oss)
            .and_then(|a| a.status.as_ref().ok())
            .and_then(|st| st.service.targets.iter().find(|x| x.index == t.index));
        if !t.up {
            out.push((
                Level::Fail,
                format!("{name}: out of service (no heartbeat)"),
            ));
            continue;
        }
        if let Some(e) = served.and_then(|x| x.error.as_ref()) {
            out.push((Level::Fail, format!("{name}: {e}")));
            continue;
        }
        let (total, free) = served.map_or((t.total, t.free), |x| (x.total, x.free));
        let ratio = if total == 0 {
            0.0
        } else {
            free as f64 / total as f64
        };
        let level = match ratio {
            r if r <= SPACE_FAIL => Level::Fail,
            r if r < SPACE_WARN => Level::Warn,
            _ => Level::Ok,
        };
        let space = format!(
            "{} free of {} ({:.0}%)",
            human(free as f64),
            human(total as f64),
            ratio * 100.0
        );
        if !t.takes_stripes && level != Level::Fail {
            // Up, but the MDS has not cleaned up its orphans in this run yet: new files
            // get no stripes there until it has.
            out.push((
                Level::Warn,
                format!("{name}: up, not taking new files yet (orphan cleanup), {space}"),
            ));
            continue;
        }
        out.push((level, format!("{name}: in service, {space}")));
    }
    out
}

/// Prints the checks and returns the exit status.
pub async fn run(client: Result<Client, String>, mds: &str) -> i32 {
    let checks = match client {
        Ok(c) => checks(&monitor::gather(&c, false).await),
        Err(e) => vec![(Level::Fail, format!("mds {mds}: not answering ({e})"))],
    };
    for (level, text) in &checks {
        out!("{level} {text}");
    }
    let worst = checks.iter().map(|c| c.0).max().unwrap_or(Level::Ok);
    let count = |l| checks.iter().filter(|c| c.0 == l).count();
    match worst {
        Level::Ok => out!("healthy"),
        Level::Warn => out!("degraded: {} warnings", count(Level::Warn)),
        Level::Fail => out!(
            "unhealthy: {} failures, {} warnings",
            count(Level::Fail),
            count(Level::Warn)
        ),
    }
    worst as i32
}
