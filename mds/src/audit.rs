//! The audit log: one JSON line per open, create, link, unlink, rename and attribute change,
//! and per read or write of data the MDS keeps itself (Data-on-MDT), with the time, the node
//! and role the connection authenticated, the identity the MDS acted for (after the nodemap),
//! the file and the path the MDS resolved. What an operator needs to see who read or replaced
//! the checkpoints.
//!
//! Lines go to the file as they happen, and the file is synced every `sync_every` (a second by
//! default): a crash loses at most that much of the trail, never the namespace's changes. Past
//! `max_bytes` the file is rotated: `audit.log` becomes `audit.log.1`, the older ones move up,
//! and past `keep` the oldest goes.
//!
//! When the log cannot be written (a full or failing disk), the MDS stops accepting what it
//! audits: by default the changes (reads go on), or everything with
//! [`AuditFailure::RefuseAll`]. It tries again at every sync and says in the log when it
//! writes again.
//!
//! Each client node may write `per_node_rate` lines a second (a burst of twice that): past it
//! the node's lines are counted, not written, and a line says how many went unwritten. One
//! node flooding the log cannot rotate other nodes' trail out.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::Serialize;

/// What the MDS does while its audit log cannot be written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AuditFailure {
    /// Changes are refused (EIO); opens and reads go on (unaudited).
    #[default]
    RefuseChanges,
    /// Every audited operation is refused, opens and reads too.
    RefuseAll,
}

impl std::str::FromStr for AuditFailure {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "refuse-changes" => Ok(AuditFailure::RefuseChanges),
            "refuse-all" => Ok(AuditFailure::RefuseAll),
            other => Err(format!(
                "{other:?}: the audit log's failure mode is refuse-changes or refuse-all"
            )),
        }
    }
}

/// Where and how much to keep.
#[derive(Clone, Debug)]
pub struct AuditConfig {
    pub path: PathBuf,
    /// Bytes past which the file is rotated.
    pub max_bytes: u64,
    /// Rotated files kept (`audit.log.1` .. `audit.log.N`).
    pub keep: u32,
    /// How often the file is synced.
    pub sync_every: Duration,
    /// What is refused while the log cannot be written.
    pub on_failure: AuditFailure,
    /// Lines a second one client node may write (a burst of twice that).
    pub per_node_rate: u32,
}

impl AuditConfig {
    /// A log at `path` with the defaults: 64 MiB files, 8 kept, synced every second, changes
    /// refused while it cannot be written, 500 lines a second per node.
    pub fn new(path: impl Into<PathBuf>) -> AuditConfig {
        AuditConfig {
            path: path.into(),
            max_bytes: 64 << 20,
            keep: 8,
            sync_every: Duration::from_secs(1),
            on_failure: AuditFailure::default(),
            per_node_rate: 500,
        }
    }
}

/// Nodes whose rate is followed at once; past it, those with a full allowance are forgotten.
const NODES: usize = 4096;

/// One node's allowance of lines.
struct Bucket {
    tokens: f64,
    last: Instant,
    /// Lines not written since the last that was.
    dropped: u64,
}

/// One audited operation.
#[derive(Debug, Serialize)]
pub struct Record<'a> {
    /// Seconds since the epoch, with microseconds.
    pub time: f64,
    pub op: &'a str,
    /// The node as the connection saw it, and the role it authenticated as.
    pub node: String,
    pub role: &'a str,
    /// The identity the MDS acted for, after the nodemap.
    pub uid: u32,
    pub gid: u32,
    /// The file (for an open, a setattr), or the entry created, removed or moved.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// A rename's new path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// What was asked: an open's access, a setattr's attributes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// "ok", or the error's kind.
    pub result: String,
}

struct Sink {
    file: Option<File>,
    written: u64,
    failing: bool,
    /// Written since the last sync.
    dirty: bool,
}

/// The MDS's audit log.
pub struct Audit {
    cfg: AuditConfig,
    sink: Mutex<Sink>,
    nodes: Mutex<HashMap<IpAddr, Bucket>>,
    /// Whether the log cannot be written now (read without the sink's lock).
    failing: std::sync::atomic::AtomicBool,
}

impl Audit {
    /// Opens (appending to) the log; its directory must exist. A thread syncs it every
    /// `sync_every` for as long as the log is held.
    pub fn open(cfg: AuditConfig) -> std::io::Result<Arc<Audit>> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&cfg.path)?;
        let written = file.metadata()?.len();
        let every = cfg.sync_every.max(Duration::from_millis(10));
        let audit = Arc::new(Audit {
            cfg,
            sink: Mutex::new(Sink {
                file: Some(file),
                written,
                failing: false,
                dirty: false,
            }),
            nodes: Mutex::new(HashMap::new()),
            failing: Default::default(),
        });
        let weak: Weak<Audit> = Arc::downgrade(&audit);
        std::thread::Builder::new()
            .name("lode-audit-sync".into())
            .spawn(move || loop {
                std::thread::sleep(every);
                match weak.upgrade() {
                    Some(a) => a.tick(),
                    None => return,
                }
            })?;
        Ok(audit)
    }

    /// Whether an operation must be refused now because it cannot be recorded: a change
    /// (`change`) while the log fails, or anything under [`AuditFailure::RefuseAll`].
    pub fn refuses(&self, change: bool) -> bool {
        self.failing.load(std::sync::atomic::Ordering::Relaxed)
            && (change || self.cfg.on_failure == AuditFailure::RefuseAll)
    }

    /// Appends one record from `node` (a client node's address: its lines are rate-limited;
    /// `None` for servers).
    pub fn record(&self, node: Option<IpAddr>, rec: &Record<'_>) {
        if let Some(ip) = node {
            let dropped = {
                let mut nodes = self.nodes.lock();
                match self.allow(&mut nodes, ip) {
                    None => return,
                    Some(d) => d,
                }
            };
            if dropped > 0 {
                self.suppressed(ip, rec.node.clone(), dropped);
            }
        }
        self.write(rec);
    }

    /// Takes one line of `ip`'s allowance: `None` when it has none (the line is counted), or
    /// the lines dropped before this one.
    fn allow(&self, nodes: &mut HashMap<IpAddr, Bucket>, ip: IpAddr) -> Option<u64> {
        let rate = f64::from(self.cfg.per_node_rate.max(1));
        let burst = 2.0 * rate;
        let now = Instant::now();
        if !nodes.contains_key(&ip) && nodes.len() >= NODES {
            nodes.retain(|_, b| {
                b.dropped > 0 || b.tokens + now.duration_since(b.last).as_secs_f64() * rate < burst
            });
            if nodes.len() >= NODES {
                // Every node is busy: the one heard from least recently is forgotten.
                if let Some(old) = nodes.iter().min_by_key(|(_, b)| b.last).map(|(i, _)| *i) {
                    nodes.remove(&old);
                }
            }
        }
        let b = nodes.entry(ip).or_insert(Bucket {
            tokens: burst,
            last: now,
            dropped: 0,
        });
        b.tokens = (b.tokens + now.duration_since(b.last).as_secs_f64() * rate).min(burst);
        b.last = now;
        if b.tokens < 1.0 {
            b.dropped += 1;
            return None;
        }
        b.tokens -= 1.0;
        Some(std::mem::take(&mut b.dropped))
    }

    /// The line saying how many of a node's lines went unwritten.
    fn suppressed(&self, ip: IpAddr, node: String, dropped: u64) {
        self.write(&Record {
            time: now(),
            op: "suppressed",
            node,
            role: "client",
            uid: 0,
            gid: 0,
            fid: None,
            path: None,
            to: None,
            detail: Some(format!(
                "{dropped} lines of {ip} not written: past {} lines a second",
                self.cfg.per_node_rate
            )),
            result: "dropped".into(),
        });
    }

    fn write(&self, rec: &Record<'_>) {
        let mut line = match serde_json::to_vec(rec) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "an audit record could not be encoded");
                return;
            }
        };
        line.push(b'\n');
        let mut sink = self.sink.lock();
        if sink.written + line.len() as u64 > self.cfg.max_bytes && sink.written > 0 {
            if let Err(e) = self.rotate(&mut sink) {
                self.failed(&mut sink, &e);
            }
        }
        let wrote = match sink.file.as_mut() {
            Some(f) => f.write_all(&line),
            None => Err(std::io::Error::other("no audit file open")),
        };
        match wrote {
            Ok(()) => {
                sink.written += line.len() as u64;
                sink.dirty = true;
            }
            Err(e) => self.failed(&mut sink, &e),
        }
    }

    /// Syncs what was written; while the log fails, tries it again (and says so in it when it
    /// works). Each node's lines not written are counted in a line of their own.
    pub fn tick(&self) {
        let owed: Vec<(IpAddr, u64)> = {
            let mut nodes = self.nodes.lock();
            nodes
                .iter_mut()
                .filter(|(_, b)| b.dropped > 0)
                .map(|(ip, b)| (*ip, std::mem::take(&mut b.dropped)))
                .collect()
        };
        for (ip, n) in owed {
            self.suppressed(ip, ip.to_string(), n);
        }
        let mut sink = self.sink.lock();
        if sink.failing {
            let again = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.cfg.path)
                .and_then(|mut f| {
                    let line = serde_json::json!({
                        "time": now(),
                        "op": "audit",
                        "detail": "the audit log is written again after failures",
                        "result": "ok",
                    });
                    f.write_all(format!("{line}\n").as_bytes())?;
                    f.sync_data()?;
                    let len = f.metadata()?.len();
                    Ok((f, len))
                });
            if let Ok((f, len)) = again {
                tracing::info!(path = %self.cfg.path.display(), "the audit log is written again");
                sink.file = Some(f);
                sink.written = len;
                sink.failing = false;
                sink.dirty = false;
                self.failing
                    .store(false, std::sync::atomic::Ordering::Relaxed);
            }
            return;
        }
        if !sink.dirty {
            return;
        }
        let synced = match sink.file.as_ref() {
            Some(f) => f.sync_data(),
            None => Err(std::io::Error::other("no audit file open")),
        };
        match synced {
            Ok(()) => sink.dirty = false,
            Err(e) => self.failed(&mut sink, &e),
        }
    }

    fn failed(&self, sink: &mut Sink, e: &std::io::Error) {
        if !sink.failing {
            let refused = match self.cfg.on_failure {
                AuditFailure::RefuseChanges => "changes are refused",
                AuditFailure::RefuseAll => "every audited operation is refused",
            };
            tracing::error!(path = %self.cfg.path.display(), error = %e, "writing the audit log failed; {refused} until it is written again");
            sink.failing = true;
            self.failing
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn rotated(&self, n: u32) -> PathBuf {
        let mut p = self.cfg.path.clone().into_os_string();
        p.push(format!(".{n}"));
        PathBuf::from(p)
    }

    fn rotate(&self, sink: &mut Sink) -> std::io::Result<()> {
        sink.file = None;
        if self.cfg.keep == 0 {
            std::fs::remove_file(&self.cfg.path)?;
        } else {
            let _ = std::fs::remove_file(self.rotated(self.cfg.keep));
            for n in (1..self.cfg.keep).rev() {
                let from = self.rotated(n);
                if from.exists() {
                    std::fs::rename(&from, self.rotated(n + 1))?;
                }
            }
            std::fs::rename(&self.cfg.path, self.rotated(1))?;
        }
        sink.file = Some(
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.cfg.path)?,
        );
        sink.written = 0;
        Ok(())
    }
}

/// The time now, for a record.
pub fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(i: u32) -> Record<'static> {
        Record {
            time: 1.5,
            op: "open",
            node: "10.0.0.1:1000".into(),
            role: "client",
            uid: i,
            gid: 7,
            fid: Some("[0x200000400:0x1:0x0]".into()),
            path: Some("/ckpt/model.pt".into()),
            to: None,
            detail: Some("read".into()),
            result: "ok".into(),
        }
    }

    #[test]
    fn records_are_json_lines_and_the_log_rotates_by_size() {
        let dir = std::env::temp_dir().join(format!("lode-audit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("audit.log");
        let audit = Audit::open(AuditConfig {
            max_bytes: 1000,
            keep: 2,
            ..AuditConfig::new(&path)
        })
        .unwrap();
        for i in 0..40 {
            audit.record(None, &rec(i));
        }
        let current = std::fs::read_to_string(&path).unwrap();
        assert!(current.len() <= 1000);
        let last: serde_json::Value =
            serde_json::from_str(current.lines().last().unwrap()).unwrap();
        assert_eq!(last["uid"], 39);
        assert_eq!(last["path"], "/ckpt/model.pt");
        assert!(last.get("to").is_none());
        assert!(dir.join("audit.log.1").exists() && dir.join("audit.log.2").exists());
        assert!(!dir.join("audit.log.3").exists());
        let first_kept: serde_json::Value = serde_json::from_str(
            std::fs::read_to_string(dir.join("audit.log.2"))
                .unwrap()
                .lines()
                .next()
                .unwrap(),
        )
        .unwrap();
        assert!(first_kept["uid"].as_u64().unwrap() > 0, "the oldest went");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn one_node_past_its_rate_is_counted_not_written_and_others_are_written() {
        let dir = std::env::temp_dir().join(format!("lode-audit-rate-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("audit.log");
        let audit = Audit::open(AuditConfig {
            per_node_rate: 10,
            sync_every: Duration::from_secs(3600),
            ..AuditConfig::new(&path)
        })
        .unwrap();
        let flooder: IpAddr = "10.0.0.66".parse().unwrap();
        let other: IpAddr = "10.0.0.7".parse().unwrap();
        for i in 0..1000 {
            audit.record(Some(flooder), &rec(i));
        }
        audit.record(Some(other), &rec(5000));
        audit.tick();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let written = lines
            .iter()
            .filter(|l| l["op"] == "open" && l["uid"] != 5000)
            .count();
        assert!(
            (20..=22).contains(&written),
            "a burst of twice the rate: {written}"
        );
        assert!(
            lines.iter().any(|l| l["uid"] == 5000),
            "the other node's line"
        );
        let dropped: u64 = lines
            .iter()
            .filter(|l| l["op"] == "suppressed")
            .map(|l| {
                l["detail"]
                    .as_str()
                    .unwrap()
                    .split(' ')
                    .next()
                    .unwrap()
                    .parse::<u64>()
                    .unwrap()
            })
            .sum();
        assert_eq!(
            dropped as usize + written,
            1000,
            "every line written or counted"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_log_that_cannot_be_written_refuses_changes_until_it_can() {
        let dir = std::env::temp_dir().join(format!("lode-audit-fail-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("audit.log");
        let audit = Audit::open(AuditConfig {
            sync_every: Duration::from_secs(3600),
            ..AuditConfig::new(&path)
        })
        .unwrap();
        assert!(!audit.refuses(true));
        // The file is gone under it and cannot be written (as on a failing disk).
        audit.sink.lock().file = None;
        audit.record(None, &rec(1));
        assert!(audit.refuses(true), "changes refused");
        assert!(!audit.refuses(false), "reads go on by default");
        audit.tick();
        assert!(!audit.refuses(true), "written again");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("written again"), "{text}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
