//! Watching a running cluster: job statistics attribute a known workload to the job that did
//! it, and only to holders of the cluster key; `lode top --once` and `lode health` show every
//! target, then show a storage server stopped.

use std::process::Command;

use lode_tests::{bin, client_key_file, cluster_key_file, mds_of, oss_of, scratch};

/// Runs `lode` against `mds` with `key` and extra environment; status, stdout, stderr.
fn lode(
    mds: &str,
    key: &std::path::Path,
    env: &[(&str, &str)],
    args: &[&str],
) -> (i32, String, String) {
    let out = Command::new(bin("lode"))
        .args(args)
        .env("LODE_MDS", mds)
        .env("LODE_KEY", key)
        .env_remove("LODE_JOBID")
        .env_remove("LODE_JOBID_VAR")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The `sum:` of `field` in `job`'s entry of every table of a `lode jobstats` output, and
/// how many tables listed the job.
fn job_sum(text: &str, job: &str, field: &str) -> (u64, usize) {
    let (mut sum, mut seen, mut inside) = (0, 0, false);
    for line in text.lines() {
        if let Some(id) = line.strip_prefix("- job_id:") {
            inside = id.trim() == job;
            seen += usize::from(inside);
        } else if !line.starts_with(' ') {
            inside = false;
        } else if inside && line.trim_start().starts_with(&format!("{field}:")) {
            let n = line.rsplit_once("sum:").unwrap().1;
            sum += n
                .trim()
                .trim_end_matches('}')
                .trim()
                .parse::<u64>()
                .unwrap();
        }
    }
    (sum, seen)
}

#[test]
fn job_statistics_name_the_job_that_did_the_work_and_top_and_health_see_a_server_stop() {
    let root = scratch("monitoring");
    let mds = mds_of(&root);
    let a = oss_of(&root.join("oss-a"), &mds.nid);
    let b = oss_of(&root.join("oss-b"), &mds.nid);
    let m = mds.nid.to_string();
    let m = m.trim_end_matches("@tcp");
    let (client, admin) = (client_key_file(), cluster_key_file());

    // Both targets in service before anything is measured.
    // The targets share this host's disk: when it has less than a tenth free, health rightly
    // warns of their space, and that alone is no fault of the cluster.
    let healthy = |h: &(i32, String, String)| {
        let warnings: Vec<&str> = h.1.lines().filter(|l| l.starts_with("WARN")).collect();
        let space_only = !warnings.is_empty()
            && warnings
                .iter()
                .all(|l| l.contains("in service") && l.contains(" free of "))
            && !h.1.lines().any(|l| l.starts_with("FAIL"));
        (h.0 == 0 && h.1.lines().last() == Some("healthy"))
            || (h.0 == 1
                && space_only
                && h.1.lines().last()
                    == Some(format!("degraded: {} warnings", warnings.len()).as_str()))
    };
    let mut health = (0, String::new(), String::new());
    for _ in 0..100 {
        health = lode(m, &client, &[], &["health"]);
        if healthy(&health) && health.1.matches("in service").count() == 2 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(healthy(&health), "health: {}{}", health.1, health.2);
    assert!(health.1.starts_with("OK   mds: up"), "{}", health.1);
    // And both taken into service by the MDS's allocator: a new file gets a stripe on each.
    let mut striped = false;
    for i in 0..100 {
        let probe = format!("/probe{i}");
        assert_eq!(
            lode(m, &client, &[], &["setstripe", "-c", "2", &probe]).0,
            0
        );
        let (_, out, _) = lode(m, &client, &[], &["getstripe", &probe]);
        if out.contains("lmm_stripe_count:  2") {
            striped = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        striped,
        "the allocator never took both targets into service"
    );

    // A known workload under two jobs: one writes a file striped over both targets, the
    // other (named through the variable the operator chose) reads it three times.
    let data: Vec<u8> = (0..3_000_000u32)
        .map(|i| b'a' + (i * 7 % 26) as u8)
        .collect();
    let local = root.join("shard.bin");
    std::fs::write(&local, &data).unwrap();
    let writer = [("LODE_JOBID", "ckpt.1")];
    assert_eq!(lode(m, &client, &writer, &["mkdir", "/d"]).0, 0);
    assert_eq!(
        lode(
            m,
            &client,
            &writer,
            &["setstripe", "-c", "2", "-S", "1M", "/d"]
        )
        .0,
        0
    );
    let local_arg = format!("local:{}", local.display());
    let cp = lode(m, &client, &writer, &["cp", &local_arg, "/d/shard.bin"]);
    assert_eq!(cp.0, 0, "{}", cp.2);
    let reader = [("LODE_JOBID_VAR", "SLURM_JOB_ID"), ("SLURM_JOB_ID", "4242")];
    for _ in 0..3 {
        let (code, out, err) = lode(m, &client, &reader, &["cat", "/d/shard.bin"]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(out.as_bytes(), &data[..]);
    }

    // Only the cluster key's holders see job statistics.
    let (code, out, err) = lode(m, &client, &[], &["jobstats"]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(
        err.trim(),
        "lode: jobstats: job statistics are for administrators (run with the cluster key)"
    );
    let (code, out, err) = lode(m, &admin, &[], &["jobstats"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.matches(".job_stats=\njob_stats:").count(), 3, "{out}");
    assert!(out.starts_with("mds.job_stats=\n"), "{out}");
    let n = data.len() as u64;
    assert_eq!(job_sum(&out, "ckpt.1", "write_bytes").0, n, "{out}");
    assert_eq!(job_sum(&out, "ckpt.1", "read_bytes").0, 0, "{out}");
    assert_eq!(job_sum(&out, "4242", "read_bytes").0, 3 * n, "{out}");
    assert_eq!(job_sum(&out, "4242", "write_bytes").0, 0, "{out}");
    // Each job is in the MDS's table and in both storage servers' (the file spans both).
    assert_eq!(job_sum(&out, "ckpt.1", "write_bytes").1, 3, "{out}");
    assert_eq!(job_sum(&out, "4242", "read_bytes").1, 3, "{out}");
    let only = lode(m, &admin, &[], &["jobstats", "--job", "4242"]).1;
    assert!(!only.contains("ckpt.1") && only.contains("4242"), "{only}");

    // One frame of top, while the reader works.
    let top = std::thread::scope(|s| {
        let busy = s.spawn(|| {
            for _ in 0..4 {
                lode(m, &client, &reader, &["cat", "/d/shard.bin"]);
            }
        });
        let top = lode(m, &admin, &[], &["top", "--once", "--interval", "1.5"]);
        busy.join().unwrap();
        top
    });
    assert_eq!(top.0, 0, "{}", top.2);
    let frame = top.1;
    for heading in [
        "TARGET",
        "MDS OPERATIONS/s",
        "BUSIEST JOBS",
        "SERVERS DOWN: none",
    ] {
        assert!(frame.contains(heading), "{heading} in\n{frame}");
    }
    for nid in [&a.nid, &b.nid] {
        assert!(frame.contains(&nid.to_string()), "{nid} in\n{frame}");
    }
    assert!(
        frame.contains("  4242 "),
        "the reader among the busiest jobs:\n{frame}"
    );

    // A storage server stops: health fails and names it, top shows it down.
    let gone = b.nid.to_string();
    b.terminate();
    let (code, out, _) = lode(m, &client, &[], &["health"]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains(&format!("FAIL oss {gone}: not answering")),
        "{out}"
    );
    assert!(
        out.lines().last().unwrap().starts_with("unhealthy: "),
        "{out}"
    );
    assert!(out.contains(&format!("OK   oss {}: up", a.nid)), "{out}");
    let (code, frame, err) = lode(m, &client, &[], &["top", "--once", "--interval", "0.2"]);
    assert_eq!(code, 0, "{err}");
    let down_target = frame
        .lines()
        .find(|l| l.contains(&gone) && l.trim_end().ends_with("DOWN"));
    assert!(
        down_target.is_some(),
        "{gone}'s target shown down:\n{frame}"
    );
    assert!(
        frame.contains(&format!("SERVERS DOWN\n  oss {gone}: ")),
        "{frame}"
    );
    assert!(
        frame.contains("(job statistics need the cluster key)"),
        "{frame}"
    );
    drop(a);
    drop(mds);
    let _ = std::fs::remove_dir_all(&root);
}
