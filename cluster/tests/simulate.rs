//! The seeded whole-cluster simulator over a range of seeds (`LODE_SIM_SEEDS`, default 5;
//! `cargo run --release -p lode-cluster --example simulate` runs thousands).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_acknowledged_is_lost_under_random_faults() {
    let seeds: u64 = std::env::var("LODE_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let mut failures = vec![];
    for seed in 0..seeds {
        if let Err(e) = cluster::simulate::run(seed, 30).await {
            failures.push(e.to_string());
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
