//! `lode top`: a live view of the cluster. Per target: read and write bandwidth and
//! operations a second, space, and whether its server answers; the MDS's operations a second
//! by type; the busiest jobs (with the cluster key); servers down. Rates are the difference
//! of two snapshots' counters over the time between them. `--once` prints one frame as text,
//! for scripts; otherwise the frame is redrawn in the terminal until `q`.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use anyhow::{Context, Result};
use client::Client;
use proto::stats::{OpCount, ServerStatus};

use crate::monitor::{self, human, uptime, Snapshot};

/// Lines of each ranking shown.
pub const SHOWN: usize = 8;

fn ops_map(ops: &[OpCount]) -> HashMap<&str, u64> {
    ops.iter().map(|o| (o.op.as_str(), o.count)).collect()
}

/// Counts a second between two answers of one server: `(name, rate)`, highest first.
fn op_rates(old: &[OpCount], new: &[OpCount], secs: f64) -> Vec<(String, f64)> {
    let old = ops_map(old);
    let mut out: Vec<(String, f64)> = new
        .iter()
        .map(|o| {
            let before = old.get(o.op.as_str()).copied().unwrap_or(0);
            (o.op.clone(), o.count.saturating_sub(before) as f64 / secs)
        })
        .filter(|(_, r)| *r > 0.0)
        .collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out
}

fn status<'a>(s: &'a Snapshot, nid: &proto::Nid) -> Option<&'a ServerStatus> {
    s.servers.get(nid).and_then(|a| a.status.as_ref().ok())
}

/// One frame: the difference between `old` and `new`, as lines of text.
pub fn frame(old: &Snapshot, new: &Snapshot, jobs_allowed: bool) -> Vec<String> {
    let secs = new.at.duration_since(old.at).as_secs_f64().max(1e-3);
    let mut out = vec![];
    let mut down = vec![];
    match &new.mds.status {
        Ok(st) => {
            let j = st.service.journal.clone().unwrap_or_default();
            let total: f64 = old.mds.status.as_ref().map_or(0.0, |o| {
                (st.requests().saturating_sub(o.requests())) as f64 / secs
            });
            out.push(format!(
                "mds: up {}, {} clients, {} inodes, {:.0} req/s, journal at {} (committed {})",
                uptime(st.uptime_s),
                st.service.clients,
                st.service.inodes,
                total,
                j.applied,
                j.committed
            ));
        }
        Err(e) => down.push(format!("mds: {e}")),
    }
    out.push(String::new());
    out.push(format!(
        "{:>6} {:<22} {:>10} {:>10} {:>8} {:>8} {:>8} {:>8} {:>5}",
        "TARGET", "SERVER", "READ/s", "WRITE/s", "RD-OPS", "WR-OPS", "FREE", "SIZE", "USE%"
    ));
    for t in new.targets.as_ref().map(|v| v.as_slice()).unwrap_or(&[]) {
        let find = |s: &Snapshot| {
            status(s, &t.oss).and_then(|st| {
                st.service
                    .targets
                    .iter()
                    .find(|x| x.index == t.index)
                    .cloned()
            })
        };
        let (Some(now), true) = (find(new), t.up) else {
            out.push(format!(
                "{:>6} {:<22} {:>10}",
                t.index,
                t.oss.to_string(),
                "DOWN"
            ));
            continue;
        };
        let was = find(old).unwrap_or_default();
        let rate = |a: u64, b: u64| a.saturating_sub(b) as f64 / secs;
        let used = if now.total == 0 {
            0.0
        } else {
            100.0 * (now.total - now.free.min(now.total)) as f64 / now.total as f64
        };
        out.push(format!(
            "{:>6} {:<22} {:>10} {:>10} {:>8.0} {:>8.0} {:>8} {:>8} {:>4.0}%",
            t.index,
            t.oss.to_string(),
            human(rate(now.read_bytes, was.read_bytes)),
            human(rate(now.write_bytes, was.write_bytes)),
            rate(now.reads, was.reads),
            rate(now.writes, was.writes),
            human(now.free as f64),
            human(now.total as f64),
            used
        ));
    }
    if let Err(e) = &new.targets {
        down.push(format!("targets: {e}"));
    }
    for (nid, a) in &new.servers {
        if let Err(e) = &a.status {
            down.push(format!("oss {nid}: {e}"));
        }
    }
    out.push(String::new());
    out.push("MDS OPERATIONS/s".into());
    if let (Ok(o), Ok(n)) = (&old.mds.status, &new.mds.status) {
        let rates = op_rates(&o.ops, &n.ops, secs);
        if rates.is_empty() {
            out.push("  (idle)".into());
        }
        for (op, r) in rates.into_iter().take(SHOWN) {
            out.push(format!("  {op:<22} {r:>10.1}"));
        }
    }
    out.push(String::new());
    out.push("BUSIEST JOBS".into());
    if jobs_allowed {
        for (job, (reqs, rd, wr)) in job_rates(old, new, secs).into_iter().take(SHOWN) {
            out.push(format!(
                "  {job:<32} {reqs:>8.0} req/s {:>10}/s read {:>10}/s written",
                human(rd),
                human(wr)
            ));
        }
    } else {
        out.push("  (job statistics need the cluster key)".into());
    }
    out.push(String::new());
    if down.is_empty() {
        out.push("SERVERS DOWN: none".into());
    } else {
        out.push("SERVERS DOWN".into());
        out.extend(down.into_iter().map(|d| format!("  {d}")));
    }
    out
}

/// Each job's requests, bytes read and bytes written a second, summed over every server,
/// busiest first.
fn job_rates(old: &Snapshot, new: &Snapshot, secs: f64) -> Vec<(String, (f64, f64, f64))> {
    let answers = |s: &Snapshot| {
        let mut v: Vec<(String, ServerStatus)> = vec![];
        if let Ok(st) = &s.mds.status {
            v.push(("mds".into(), st.clone()));
        }
        for (nid, a) in &s.servers {
            if let Ok(st) = &a.status {
                v.push((nid.to_string(), st.clone()));
            }
        }
        v
    };
    let before: HashMap<(String, String), (u64, u64, u64)> = answers(old)
        .into_iter()
        .flat_map(|(server, st)| {
            st.jobs.into_iter().map(move |j| {
                (
                    (server.clone(), j.job.to_string()),
                    (j.requests(), j.read_bytes, j.write_bytes),
                )
            })
        })
        .collect();
    let mut sum: BTreeMap<String, (f64, f64, f64)> = BTreeMap::new();
    for (server, st) in answers(new) {
        for j in st.jobs {
            let was = before
                .get(&(server.clone(), j.job.to_string()))
                .copied()
                .unwrap_or((0, 0, 0));
            let e = sum.entry(j.job.to_string()).or_default();
            e.0 += j.requests().saturating_sub(was.0) as f64 / secs;
            e.1 += j.read_bytes.saturating_sub(was.1) as f64 / secs;
            e.2 += j.write_bytes.saturating_sub(was.2) as f64 / secs;
        }
    }
    let mut v: Vec<_> = sum.into_iter().filter(|(_, r)| r.0 > 0.0).collect();
    v.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0).then_with(|| a.0.cmp(&b.0)));
    v
}

/// Prints one frame taken over `interval`.
pub async fn once(client: &Client, interval: Duration) -> Result<()> {
    let jobs = monitor::may_see_jobs(client).await;
    let old = monitor::gather(client, jobs).await;
    tokio::time::sleep(interval).await;
    let new = monitor::gather(client, jobs).await;
    for line in frame(&old, &new, jobs) {
        out!("{line}");
    }
    Ok(())
}

/// Redraws the frame every `interval` until `q`, Esc or Ctrl-C.
pub async fn live(client: &Client, interval: Duration) -> Result<()> {
    use ratatui::crossterm::event::{self, Event, KeyCode, KeyModifiers};
    use ratatui::style::{Modifier, Style};
    use ratatui::text::{Line, Span};
    use ratatui::widgets::{Block, Paragraph};

    let jobs = monitor::may_see_jobs(client).await;
    let mut terminal = ratatui::try_init().context("starting the terminal view")?;
    let mut old = monitor::gather(client, jobs).await;
    let result = async {
        loop {
            let wait_until = std::time::Instant::now() + interval;
            while std::time::Instant::now() < wait_until {
                if event::poll(Duration::from_millis(100))? {
                    if let Event::Key(k) = event::read()? {
                        let ctrl_c = k.code == KeyCode::Char('c')
                            && k.modifiers.contains(KeyModifiers::CONTROL);
                        if matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) || ctrl_c {
                            return Ok(());
                        }
                    }
                }
            }
            let new = monitor::gather(client, jobs).await;
            let lines: Vec<Line> = frame(&old, &new, jobs)
                .into_iter()
                .map(|l| {
                    let heading = !l.starts_with(' ')
                        && l.chars().any(|c| c.is_ascii_uppercase())
                        && l.chars().filter(|c| c.is_ascii_lowercase()).count() == 0;
                    if heading {
                        Line::from(Span::styled(
                            l,
                            Style::default().add_modifier(Modifier::BOLD),
                        ))
                    } else {
                        Line::from(l)
                    }
                })
                .collect();
            terminal.draw(|f| {
                let block = Block::bordered().title(format!(
                    " lode top: {} (every {:.0?}; q quits) ",
                    client.mds(),
                    interval
                ));
                f.render_widget(Paragraph::new(lines).block(block), f.area());
            })?;
            old = new;
        }
    }
    .await;
    ratatui::restore();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_differences_over_time_busiest_first() {
        let op = |op: &str, count| OpCount {
            op: op.into(),
            count,
        };
        let old = [op("mds_getattr", 100), op("mds_reint", 10)];
        let new = [
            op("mds_getattr", 300),
            op("mds_reint", 50),
            op("mds_open", 4),
        ];
        assert_eq!(
            op_rates(&old, &new, 2.0),
            vec![
                ("mds_getattr".to_string(), 100.0),
                ("mds_reint".to_string(), 20.0),
                ("mds_open".to_string(), 2.0)
            ]
        );
    }
}
