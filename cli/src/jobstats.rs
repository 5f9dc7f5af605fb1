//! `lode jobstats`: each job's work on every server, printed as Lustre's
//! `lctl get_param *.job_stats` prints it (one YAML document per server, after its
//! `name.job_stats=` line). Servers give job statistics only to the cluster key's holders.

use anyhow::{bail, Result};
use client::Client;
use proto::stats::{JobStat, ServerStatus};

use crate::monitor;

/// A YAML scalar for a job id: plain when it is safe so, else double-quoted.
fn scalar(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-/@+".contains(&b))
        && !s.starts_with(['-', '.', '@']);
    if plain {
        s.to_string()
    } else {
        format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
    }
}

/// One server's table, as `lctl get_param` prints one parameter.
pub fn render(name: &str, jobs: &[&JobStat]) -> String {
    let mut out = format!("{name}.job_stats=\njob_stats:");
    if jobs.is_empty() {
        out.push_str(" []");
    }
    out.push('\n');
    for j in jobs {
        out.push_str(&format!("- {:<16} {}\n", "job_id:", scalar(j.job.as_str())));
        let mut field =
            |k: &str, v: String| out.push_str(&format!("  {:<16} {v}\n", format!("{k}:")));
        field("snapshot_time", j.last_unix_s.to_string());
        field("start_time", j.start_unix_s.to_string());
        for op in &j.ops {
            field(
                &op.op,
                format!("{{ samples: {:>9}, unit: reqs }}", op.count),
            );
        }
        field(
            "read_bytes",
            format!("{{ unit: bytes, sum: {:>15} }}", j.read_bytes),
        );
        field(
            "write_bytes",
            format!("{{ unit: bytes, sum: {:>15} }}", j.write_bytes),
        );
    }
    out
}

/// Prints every server's table, or only `only`'s entries.
pub async fn run(client: &Client, only: Option<&str>) -> Result<()> {
    if !monitor::may_see_jobs(client).await {
        bail!("jobstats: job statistics are for administrators (run with the cluster key)");
    }
    let snap = monitor::gather(client, true).await;
    let mut servers: Vec<(String, &monitor::Answer)> = vec![("mds".into(), &snap.mds)];
    servers.extend(
        snap.servers
            .iter()
            .map(|(nid, a)| (format!("oss.{nid}"), a)),
    );
    let mut failed = 0;
    for (name, a) in servers {
        match &a.status {
            Ok(st) => {
                let jobs = selected(st, only);
                out!("{}", render(&name, &jobs).trim_end());
            }
            Err(e) => {
                eprintln!("lode: jobstats: {name}: {e}");
                failed += 1;
            }
        }
    }
    if failed > 0 {
        bail!("jobstats: {failed} servers did not answer");
    }
    Ok(())
}

fn selected<'a>(st: &'a ServerStatus, only: Option<&str>) -> Vec<&'a JobStat> {
    st.jobs
        .iter()
        .filter(|j| only.is_none_or(|o| j.job.as_str() == o))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::stats::OpCount;
    use proto::JobId;

    #[test]
    fn tables_read_as_lctl_prints_them() {
        let j = JobStat {
            job: JobId::new("train:7").unwrap(),
            start_unix_s: 10,
            last_unix_s: 20,
            ops: vec![OpCount {
                op: "ost_write".into(),
                count: 3,
            }],
            read_bytes: 0,
            write_bytes: 3 << 20,
        };
        let text = render("oss.10.0.0.2:9500@tcp", &[&j]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "oss.10.0.0.2:9500@tcp.job_stats=");
        assert_eq!(lines[1], "job_stats:");
        assert_eq!(lines[2], "- job_id:          \"train:7\"");
        assert_eq!(lines[3], "  snapshot_time:   20");
        assert_eq!(
            lines[5],
            "  ost_write:       { samples:         3, unit: reqs }"
        );
        assert!(lines[7].ends_with("sum:         3145728 }"), "{}", lines[7]);
        assert_eq!(render("mds", &[]), "mds.job_stats=\njob_stats: []\n");
        assert_eq!(scalar("dd.0"), "dd.0");
    }
}
