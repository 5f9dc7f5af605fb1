//! Runs the seeded whole-cluster simulator over many seeds:
//! `cargo run --release -p lode-cluster --example simulate -- [FIRST_SEED] [SEEDS] [OPERATIONS]`
//! (defaults 0, 1000, 60). A failing seed is printed; run it alone to replay it, with `RUST_LOG`
//! set to see what the servers and clients log.

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("numbers: FIRST_SEED SEEDS OPERATIONS"))
        .collect();
    let first = args.first().copied().unwrap_or(0);
    let seeds = args.get(1).copied().unwrap_or(1000);
    let ops = args.get(2).copied().unwrap_or(60) as usize;
    if std::env::var_os("RUST_LOG").is_some() {
        // What the servers and clients log, for a seed run alone.
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    // One thread and a virtual clock: a seed runs as fast as the CPU allows, and its tasks
    // interleave the same way each time.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime");
    let (mut operations, mut faults, mut failed) = (0, 0, vec![]);
    let start = std::time::Instant::now();
    for seed in first..first + seeds {
        match rt.block_on(cluster::simulate::run(seed, ops)) {
            Ok(r) => {
                if seeds == 1 {
                    println!("{r:?}");
                }
                operations += r.operations;
                faults += r.faults;
            }
            Err(e) => {
                eprintln!("FAILED {e}");
                failed.push(seed);
            }
        }
    }
    println!(
        "{seeds} seeds from {first}: {operations} operations, {faults} faults, {} failed {failed:?} in {:.0?}",
        failed.len(),
        start.elapsed()
    );
    if !failed.is_empty() {
        std::process::exit(1);
    }
}
