//! Creates per second through the library: N new files, then the same N opened again with
//! O_CREAT|O_TRUNC (a checkpoint rewritten in place). `creates MDS N [DIR]`.

use std::time::Instant;

use client::{Client, OpenOptions};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let mds = args.get(1).map_or("127.0.0.1:9400", |s| s.as_str());
    let n: usize = args.get(2).map_or(Ok(2000), |s| s.parse())?;
    let dir = args
        .get(3)
        .cloned()
        .unwrap_or_else(|| format!("/creates-{}", std::process::id()));
    let c = Client::connect(mds).await?;
    c.mkdir(&dir, 0o755).await?;
    let open = OpenOptions::new().write(true).create(true).truncate(true);
    for (what, round) in [("new", 0), ("rewrite", 1)] {
        let t = Instant::now();
        for i in 0..n {
            let f = open.open(&c, &format!("{dir}/f{i}")).await?;
            f.close().await?;
        }
        let s = t.elapsed().as_secs_f64();
        println!(
            "{what} {:.0} per s ({n} files, round {round})",
            n as f64 / s
        );
    }
    Ok(())
}
