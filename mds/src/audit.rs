//! The audit log: one JSON line per open, create, link, unlink, rename and attribute change,
//! with the time, the node and role the connection authenticated, the identity the MDS acted
//! for (after the nodemap), the file and its path. What an operator needs to see who read or
//! replaced the checkpoints.
//!
//! Lines go to the file as they happen (one write each, not synced: a crash may lose the last
//! lines, never the namespace's changes). Past `max_bytes` the file is rotated: `audit.log`
//! becomes `audit.log.1`, the older ones move up, and past `keep` the oldest goes. A failure
//! to write is logged (once per run of failures) and the operation goes ahead.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;

use parking_lot::Mutex;
use serde::Serialize;

/// Where and how much to keep.
#[derive(Clone, Debug)]
pub struct AuditConfig {
    pub path: PathBuf,
    /// Bytes past which the file is rotated.
    pub max_bytes: u64,
    /// Rotated files kept (`audit.log.1` .. `audit.log.N`).
    pub keep: u32,
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
}

/// The MDS's audit log.
pub struct Audit {
    cfg: AuditConfig,
    sink: Mutex<Sink>,
}

impl Audit {
    /// Opens (appending to) the log; its directory must exist.
    pub fn open(cfg: AuditConfig) -> std::io::Result<Audit> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&cfg.path)?;
        let written = file.metadata()?.len();
        Ok(Audit {
            cfg,
            sink: Mutex::new(Sink {
                file: Some(file),
                written,
                failing: false,
            }),
        })
    }

    /// Appends one record.
    pub fn record(&self, rec: &Record<'_>) {
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
                if sink.failing {
                    tracing::info!(path = %self.cfg.path.display(), "the audit log is written again");
                    sink.failing = false;
                }
            }
            Err(e) => self.failed(&mut sink, &e),
        }
    }

    fn failed(&self, sink: &mut Sink, e: &std::io::Error) {
        if !sink.failing {
            tracing::error!(path = %self.cfg.path.display(), error = %e, "writing the audit log failed; operations go on unaudited");
            sink.failing = true;
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
            path: path.clone(),
            max_bytes: 1000,
            keep: 2,
        })
        .unwrap();
        for i in 0..40 {
            audit.record(&rec(i));
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
}
