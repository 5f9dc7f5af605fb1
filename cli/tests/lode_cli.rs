//! The `lode` command's own behaviour, without a cluster. (Building this test also builds the
//! binary the cross-crate tests run.)

use std::process::Command;

fn lode(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_lode"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn help_names_every_command() {
    let (ok, out) = lode(&["--help"]);
    assert!(ok);
    for cmd in [
        "cluster",
        "setstripe",
        "getstripe",
        "df",
        "ls",
        "cat",
        "cp",
        "mkdir",
        "rm",
        "mv",
        "stat",
        "bench",
        "mount",
        "umount",
        "sim",
    ] {
        assert!(out.contains(cmd), "{cmd} missing from:\n{out}");
    }
}

#[test]
fn cluster_status_of_an_unused_directory_says_so() {
    let dir = std::env::temp_dir().join(format!("lode-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ok, out) = lode(&["cluster", "status", "--dir", dir.to_str().unwrap()]);
    assert!(ok, "{out}");
    assert!(out.contains("no cluster has run"), "{out}");
    let (ok, out) = lode(&["cluster", "down", "--dir", dir.to_str().unwrap()]);
    assert!(ok && out.contains("0 processes stopped"), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_mount_options_are_refused_by_name() {
    let (ok, out) = lode(&[
        "--mds",
        "127.0.0.1:1",
        "mount",
        "--daemon",
        "/tmp",
        "-o",
        "bogus",
    ]);
    assert!(!ok);
    assert!(out.contains("unknown mount option \"bogus\""), "{out}");
    let (ok, out) = lode(&[
        "--mds",
        "127.0.0.1:1",
        "mount",
        "--daemon",
        "/nonexistent-mountpoint",
    ]);
    assert!(!ok && out.contains("not a directory"), "{out}");
}

/// The aggregate rate of each run in a `lode sim run` output directory.
fn rates(dir: &std::path::Path) -> Vec<f64> {
    let csv = std::fs::read_to_string(dir.join("runs.csv")).unwrap();
    csv.lines()
        .skip(1)
        .map(|l| l.split(',').nth(6).unwrap().parse().unwrap())
        .collect()
}

/// The bytes each target moved in run `i`, smallest first (which target holds which stripe
/// depends on where the MDS's round-robin stood; the spread over targets does not).
fn target_bytes(dir: &std::path::Path, i: usize) -> Vec<u64> {
    let csv = std::fs::read_to_string(dir.join(format!("targets-{i}.csv"))).unwrap();
    let mut v: Vec<u64> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(1).unwrap().parse::<f64>().unwrap() as u64)
        .collect();
    v.sort_unstable();
    v
}

/// The total moved by each run in a `lode sim run` output directory.
fn totals(dir: &std::path::Path) -> Vec<f64> {
    let csv = std::fs::read_to_string(dir.join("runs.csv")).unwrap();
    csv.lines()
        .skip(1)
        .map(|l| l.split(',').nth(4).unwrap().parse().unwrap())
        .collect()
}

/// `lode sim run EXP --mode MODE --out OUT`: the aggregate rate of each run.
fn sim(exp: &std::path::Path, mode: &str, out: &std::path::Path) -> Vec<f64> {
    let (ok, text) = lode(&[
        "sim",
        "run",
        exp.to_str().unwrap(),
        "--mode",
        mode,
        // A debug build moves little: a slow run keeps the code's own cost out of the figures.
        "--budget-mbs",
        "16",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{text}");
    rates(out)
}

const TINY: &str = r#"
        name = "two clients, two targets"
        [topology]
        clients = 2
        client_nic_gbs = 2
        oss = 2
        oss_nic_gbs = 4
        targets_per_oss = 1
        target_write_gbs = 0.5
        [workload]
        kind = "checkpoint"
        bytes_per_client = "16M"
        request_size = "1M"
        [workload.layout]
        stripe_size = "1M"
        [sweep]
        "workload.layout.stripe_count" = [1, -1]
        "#;

/// Runs `exp` (written to a fresh directory as `name`) in both modes: (model, real) outputs.
fn both_modes(tag: &str, exp: &str) -> (std::path::PathBuf, Vec<f64>, Vec<f64>) {
    let dir = std::env::temp_dir().join(format!("lode-sim-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("exp.toml");
    std::fs::write(&file, exp).unwrap();
    let (m, r) = (
        sim(&file, "model", &dir.join("model")),
        sim(&file, "real", &dir.join("real")),
    );
    (dir, m, r)
}

fn agree_within(m: &[f64], r: &[f64], within: f64) {
    assert_eq!(m.len(), r.len());
    for (a, b) in m.iter().zip(r) {
        assert!(
            (a - b).abs() / a < within,
            "model {m:?} against real code {r:?}"
        );
    }
}

#[test]
fn the_testbed_runs_an_experiment_in_both_modes_and_they_place_the_same_bytes() {
    let (dir, m, _) = both_modes("tiny", TINY);
    let (model, real) = (dir.join("model"), dir.join("real"));
    assert_eq!(m.len(), 2);
    // Two targets of 0.5 GB/s, each client on its own or both striped over both: 1 GB/s.
    assert!(
        (m[0] - 1e9).abs() < 1e7 && (m[1] - 1e9).abs() < 1e7,
        "model {m:?}"
    );
    // What moved, and where, does not depend on this machine's speed: the same bytes, on
    // targets chosen by the same placement policy.
    assert_eq!(totals(&model), totals(&real));
    for i in 0..2 {
        assert_eq!(target_bytes(&model, i), target_bytes(&real, i), "run {i}");
    }
    assert!(model.join("runs.csv").exists() && real.join("clients-1.csv").exists());
    // A metadata storm is for the model only, and says so.
    let bad = dir.join("meta.toml");
    std::fs::write(
        &bad,
        "[topology]\nclients = 1\n[workload]\nkind = \"metadata\"\nfiles_per_client = 10\n",
    )
    .unwrap();
    let (ok, out) = lode(&["sim", "run", bad.to_str().unwrap(), "--mode", "real"]);
    assert!(!ok && out.contains("data workloads"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two targets of 4 I/Os at a time, 500 us each: 64 KiB requests at random offsets reach
/// 4 x 64 KiB / (500 us + the transfer) per target, far below their 1 GB/s.
const RANDOM: &str = r#"
        [topology]
        clients = 2
        client_nic_gbs = 4
        oss = 2
        oss_nic_gbs = 4
        targets_per_oss = 1
        target_read_gbs = 1
        target_io_latency_us = 500
        target_queue_depth = 4
        [workload]
        kind = "io"
        direction = "read"
        access = "random"
        bytes_per_client = "8M"
        request_size = "64K"
        window = 16
        [workload.layout]
        stripe_size = "1M"
        [sweep]
        "workload.layout.stripe_count" = [1, -1]
        "#;

#[test]
fn random_reads_are_modelled_as_held_by_the_targets_queues() {
    let (dir, m, _) = both_modes("random", RANDOM);
    let (model, real) = (dir.join("model"), dir.join("real"));
    let per_target = 4.0 * 65536.0 / (500e-6 + 65536.0 / 1e9);
    // (Less the run's start: an open and a first I/O, 3% of this short run.)
    for rate in &m {
        assert!((rate - 2.0 * per_target).abs() / rate < 0.05, "model {m:?}");
    }
    assert_eq!(totals(&model), totals(&real));
    let _ = std::fs::remove_dir_all(&dir);
}

// The real-code mode's timings depend on how fast this machine runs real code: these
// comparisons are benchmarks, out of the default run
// (`cargo nextest run -p lode-cli --run-ignored only`).

#[test]
#[ignore = "timing: compares wall-clock throughput with the model"]
fn timing_real_code_throughput_agrees_with_the_model() {
    let (dir, m, r) = both_modes("tiny-timing", TINY);
    agree_within(&m, &r, 0.10);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "timing: compares wall-clock throughput with the model"]
fn timing_random_reads_in_the_real_code_are_held_by_the_targets_queues_as_modelled() {
    let (dir, m, r) = both_modes("random-timing", RANDOM);
    agree_within(&m, &r, 0.10);
    let _ = std::fs::remove_dir_all(&dir);
}
