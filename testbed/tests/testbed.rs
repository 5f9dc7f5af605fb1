//! The flow model against closed forms and published figures.

use testbed::{load, run_model, Report};

fn run(toml: &str) -> Vec<Report> {
    load(toml)
        .unwrap()
        .iter()
        .map(|p| run_model(p, |_, _| {}).unwrap())
        .collect()
}

fn close(got: f64, want: f64, within: f64) -> bool {
    (got - want).abs() <= want.abs() * within
}

#[test]
fn forty_targets_read_by_a_hundred_clients_give_each_1_6_gbs() {
    let r = &run(r#"
        [topology]
        clients = 100
        client_nic_gbs = 25
        oss = 10
        oss_nic_gbs = 50
        targets_per_oss = 4
        target_read_gbs = 4
        [workload]
        kind = "io"
        direction = "read"
        bytes_per_client = "16GB"
        [workload.layout]
        stripe_count = -1
        stripe_size = "4M"
    "#)[0];
    for rate in r.client_rates() {
        assert!(
            close(rate / 1e9, 1.6, 0.02),
            "a client got {} GB/s",
            rate / 1e9
        );
    }
    assert!(close(r.aggregate_rate() / 1e9, 160.0, 0.02));
    assert!(r.target_utilisation.iter().all(|u| *u > 0.97));
}

#[test]
fn a_1_4_tb_checkpoint_at_14_gbs_takes_100_s() {
    let r = &run(r#"
        [topology]
        clients = 100
        client_nic_gbs = 25
        oss = 7
        oss_nic_gbs = 25
        targets_per_oss = 2
        target_write_gbs = 1
        [workload]
        kind = "checkpoint"
        bytes_per_client = "14GB"
        [workload.layout]
        stripe_count = -1
    "#)[0];
    assert!(close(r.total, 1.4e12, 1e-9));
    assert!(close(r.aggregate_rate() / 1e9, 14.0, 0.02));
    assert!(close(r.makespan, 100.0, 0.02), "{} s", r.makespan);
}

#[test]
fn two_tb_every_10_s_needs_50_targets_of_4_gbs_and_40_are_too_few() {
    let r = run(r#"
        [topology]
        clients = 200
        client_nic_gbs = 25
        oss = 25
        oss_nic_gbs = 25
        targets_per_oss = 2
        target_write_gbs = 4
        [workload]
        kind = "checkpoint"
        bytes_per_client = "10GB"
        [workload.layout]
        stripe_count = -1
        [sweep]
        "topology.oss" = [25, 20]
    "#);
    assert!(
        close(r[0].makespan, 10.0, 0.02),
        "50 targets: {} s",
        r[0].makespan
    );
    assert!(close(r[0].aggregate_rate() / 1e9, 200.0, 0.02));
    assert!(
        r[1].makespan > 10.0 * 1.2,
        "40 targets: {} s",
        r[1].makespan
    );
    assert!(close(r[1].makespan, 12.5, 0.02));
}

#[test]
fn the_slowest_part_of_the_path_sets_the_rate() {
    // One client, one target: the NIC (2 GB/s) is slower than the target (4 GB/s).
    let base = r#"
        [topology]
        clients = 1
        client_nic_gbs = 2
        target_write_gbs = 4
        [workload]
        kind = "io"
        direction = "write"
        bytes_per_client = "10GB"
    "#;
    let r = &run(base)[0];
    assert!(close(r.makespan, 5.0, 0.01), "{}", r.makespan);
    // Two clients on one target share it: 2 GB/s each, 5 s.
    let r = &run(&base.replace("clients = 1", "clients = 2"))[0];
    assert!(close(r.makespan, 5.0, 0.01) && close(r.aggregate_rate(), 4e9, 0.01));
    // Four: the target holds them to 1 GB/s each.
    let r = &run(&base.replace("clients = 1", "clients = 4"))[0];
    assert!(close(r.makespan, 10.0, 0.01), "{}", r.makespan);
}

#[test]
fn an_oversubscribed_core_and_a_small_window_slow_a_run() {
    let full = r#"
        [topology]
        clients = 8
        client_nic_gbs = 10
        oss = 8
        oss_nic_gbs = 100
        targets_per_oss = 1
        target_read_gbs = 100
        [workload]
        kind = "io"
        direction = "read"
        bytes_per_client = "10GB"
        [workload.layout]
        stripe_count = 1
    "#;
    let a = &run(full)[0];
    assert!(close(a.aggregate_rate(), 80e9, 0.01));
    let b = &run(&full.replace(
        "targets_per_oss = 1",
        "targets_per_oss = 1\nfabric_oversubscription = 4",
    ))[0];
    assert!(close(b.aggregate_rate(), 20e9, 0.01));
    // 4 KiB requests, one in flight, 100 us of target time + 4 us of wire: ~39 MB/s.
    let c = &run(&full
        .replace("stripe_count = 1", "stripe_count = 1\n[workload.x]")
        .replace("[workload.x]", "")
        .replace(
            "bytes_per_client = \"10GB\"",
            "bytes_per_client = \"40MB\"\nrequest_size = 4096\nwindow = 1",
        ))[0];
    let per = 4096.0 / 104e-6;
    assert!(
        close(c.client_rates()[0], per, 0.02),
        "{}",
        c.client_rates()[0]
    );
}

#[test]
fn a_metadata_storm_is_held_by_the_mds_rate() {
    let r = &run(r#"
        [topology]
        clients = 10
        mds_ops_per_s = 10000
        [workload]
        kind = "metadata"
        files_per_client = 1000
        ops_per_file = 2
        window = 64
    "#)[0];
    assert_eq!(r.unit, "ops");
    assert!(close(r.makespan, 2.0, 0.01), "{}", r.makespan);
}

#[test]
fn an_epoch_reads_every_shard_once_and_a_sweep_expands() {
    let r = run(r#"
        [topology]
        clients = 4
        oss = 2
        targets_per_oss = 4
        [workload]
        kind = "epoch"
        dataset_bytes = "1G"
        shard_size = "64M"
        [workload.layout]
        stripe_size = "1M"
        [sweep]
        "workload.layout.stripe_count" = [1, 2, 8, -1]
    "#);
    assert_eq!(r.len(), 4);
    for x in &r {
        assert_eq!(x.total, (1u64 << 30) as f64);
        assert_eq!(x.target_amount.iter().sum::<f64>(), (1u64 << 30) as f64);
    }
    assert_eq!(r[0].value.as_deref(), Some("1"));
}

#[test]
fn targets_carved_from_one_disk_share_it() {
    let base = r#"
        [topology]
        clients = 4
        client_nic_gbs = 10
        oss = 1
        oss_nic_gbs = 100
        targets_per_oss = 4
        target_write_gbs = 2
        [workload]
        kind = "checkpoint"
        bytes_per_client = "4GB"
    "#;
    assert!(close(run(base)[0].aggregate_rate(), 8e9, 0.01));
    let shared = base.replace(
        "targets_per_oss = 4",
        "targets_per_oss = 4\noss_disk_gbs = 3",
    );
    assert!(close(run(&shared)[0].aggregate_rate(), 3e9, 0.01));
}

#[test]
fn random_io_is_held_by_the_targets_queue_depth_and_service_time() {
    // One target of 4 I/Os at a time, 500 us each plus a 64 KiB transfer at 1 GB/s:
    // 4 x 64 KiB per 565.5 us, 463.5 MB/s; sequential access gets the whole 1 GB/s.
    let base = r#"
        [topology]
        clients = 1
        client_nic_gbs = 10
        oss = 1
        oss_nic_gbs = 10
        targets_per_oss = 1
        target_read_gbs = 1
        target_io_latency_us = 500
        target_queue_depth = 4
        link_latency_us = 1
        [workload]
        kind = "io"
        direction = "read"
        access = "random"
        bytes_per_client = "1G"
        request_size = "64K"
        window = 64
        [workload.layout]
        stripe_count = 1
    "#;
    let want = 4.0 * 65536.0 / (500e-6 + 65536.0 / 1e9);
    assert!(close(run(base)[0].aggregate_rate(), want, 0.01));
    let seq = base.replace("access = \"random\"", "access = \"sequential\"");
    assert!(close(run(&seq)[0].aggregate_rate(), 1e9, 0.01));
}

/// Two mirrors: a checkpoint bound by the targets moves twice the bytes and takes twice as
/// long; a read bound by the targets spreads over both copies and takes as long as one copy.
#[test]
fn mirrors_double_what_writes_carry_and_reads_spread_over_the_copies() {
    let go = |kind: &str, mirrors: u16| {
        run(&format!(
            r#"
            [topology]
            clients = 8
            client_nic_gbs = 100
            oss = 8
            oss_nic_gbs = 100
            targets_per_oss = 1
            target_read_gbs = 1
            target_write_gbs = 1
            [workload]
            kind = "io"
            direction = "{kind}"
            bytes_per_client = "8GB"
            [workload.layout]
            stripe_count = -1
            stripe_size = "4M"
            mirrors = {mirrors}
            "#
        ))
        .remove(0)
    };
    let (w1, w2) = (go("write", 1), go("write", 2));
    let moved = |r: &Report| r.target_amount.iter().sum::<f64>();
    assert!(close(moved(&w2), 2.0 * moved(&w1), 0.01));
    assert!(
        close(w2.makespan, 2.0 * w1.makespan, 0.05),
        "{} vs {}",
        w2.makespan,
        w1.makespan
    );
    let (r1, r2) = (go("read", 1), go("read", 2));
    assert!(close(moved(&r2), moved(&r1), 0.01));
    assert!(
        close(r2.makespan, r1.makespan, 0.05),
        "{} vs {}",
        r2.makespan,
        r1.makespan
    );
    // Each copy on OSSes of its own: every target carries a share.
    assert!(w2.target_amount.iter().all(|b| *b > 0.0));
}

#[test]
fn a_directory_striped_over_mdts_spreads_its_storm_until_mdt0_walks_hold_it() {
    let storm = |stripe: u32, walk: f64| {
        run(&format!(
            r#"
            [topology]
            clients = 16
            mdts = 4
            mds_ops_per_s = 10000
            walk_ops = {walk}
            [workload]
            kind = "metadata"
            files_per_client = 1000
            ops_per_file = 2
            window = 64
            dir_stripe = {stripe}
        "#
        ))[0]
            .makespan
    };
    // 32,000 operations: 3.2 s on one MDS, a quarter of it over four.
    assert!(close(storm(1, 0.0), 3.2, 0.01), "{}", storm(1, 0.0));
    assert!(close(storm(4, 0.0), 0.8, 0.01), "{}", storm(4, 0.0));
    // Each operation costing MDT0 half an operation more for its walk: MDT0 does 0.75 of an
    // operation per operation over four shards, 1.5 on one.
    assert!(close(storm(4, 0.5), 2.4, 0.02), "{}", storm(4, 0.5));
    assert!(close(storm(1, 0.5), 4.8, 0.02), "{}", storm(1, 0.5));
}
