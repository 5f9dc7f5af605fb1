//! `lode bench --meta`: create, stat and unlink of many empty files by N clients through the
//! library, each client in its own directory, against the same by N threads in a local
//! directory, in one run. Two lode modes run in rotated order: commit-behind (changes answered
//! once applied, kept by the client until committed) and durable (each answer waits for the
//! journal's fsync: how every change was answered before commit-behind). Medians of the
//! rounds.

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use client::{Client, ClientConfig, OpenOptions};

/// Rates (operations per second) of one pass: create, stat, unlink.
type Rates = [f64; 3];

const OPS: [&str; 3] = ["create", "stat", "unlink"];

/// How the files are made: by lode with changes answered ahead, commit-behind or durable, or
/// in the local directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Behind,
    Durable,
    Local,
    Ahead,
}

impl Mode {
    /// In the order the first round runs them (later rounds rotate it).
    pub const ALL: [Mode; 4] = [Mode::Behind, Mode::Durable, Mode::Local, Mode::Ahead];
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            Mode::Behind => "behind",
            Mode::Durable => "durable",
            Mode::Local => "local",
            Mode::Ahead => "ahead",
        };
        f.write_str(name)
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs `clients` tasks, each doing `op(client index, file index)` for `per` files; the rate
/// over all of them. Each operation is made when its turn comes: made all at once up front,
/// their futures alone took hundreds of megabytes, and the kernel's zeroing of that memory
/// took more of the timed run than the creates.
async fn timed<F, Fut>(clients: usize, per: usize, op: F) -> Result<f64>
where
    F: Fn(usize, usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<()>> + Send + 'static,
{
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..clients {
        let op = op.clone();
        tasks.spawn(async move {
            for i in 0..per {
                op(c, i).await?;
            }
            Ok::<(), anyhow::Error>(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    Ok((clients * per) as f64 / start.elapsed().as_secs_f64())
}

/// Where the clients of a pass make their files.
#[derive(Clone, Copy)]
enum Spread {
    /// A directory each, client i's on MDT i mod N.
    Own(u32),
    /// One directory for all, striped over N MDTs.
    Shared(u32),
}

async fn lode_pass(
    cs: &[Client],
    dir: &str,
    per: usize,
    spread: Spread,
    keep: bool,
) -> Result<Rates> {
    match spread {
        Spread::Own(mdts) => {
            for (i, c) in cs.iter().enumerate() {
                let d = format!("{dir}/c{i}");
                if mdts > 1 {
                    c.mkdir_all(dir, 0o755).await?;
                    c.mkdir_on(&d, 0o755, i as u32 % mdts).await?;
                } else {
                    c.mkdir_all(&d, 0o755).await?;
                }
            }
        }
        Spread::Shared(n) => {
            let c = &cs[0];
            c.mkdir_all(dir, 0o755).await?;
            let shared = format!("{dir}/shared");
            if n > 1 {
                c.mkdir_striped(&shared, 0o755, n, None, proto::dirstripe::HashType::Fnv1a64)
                    .await?;
            } else {
                c.mkdir(&shared, 0o755).await?;
            }
        }
    }
    let cs: std::sync::Arc<[Client]> = cs.into();
    let dir: std::sync::Arc<str> = dir.into();
    let path = {
        let dir = dir.clone();
        move |c: usize, i: usize| match spread {
            Spread::Own(_) => format!("{dir}/c{c}/f{i:07}"),
            Spread::Shared(_) => format!("{dir}/shared/c{c}.f{i:07}"),
        }
    };
    let (c2, p2) = (cs.clone(), path.clone());
    let create = timed(cs.len(), per, move |c, i| {
        let (cs, path) = (&c2, &p2);
        let (cl, p) = (cs[c].clone(), path(c, i));
        async move {
            let f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&cl, &p)
                .await
                .with_context(|| format!("creating {p}"))?;
            f.close().await?;
            if i + 1 == per {
                // Timed until the MDS has every create (and close) this client answered ahead.
                cl.settle_ahead().await?;
            }
            Ok(())
        }
    })
    .await?;
    let (c2, p2) = (cs.clone(), path.clone());
    let stat = timed(cs.len(), per, move |c, i| {
        let (cs, path) = (&c2, &p2);
        let (cl, p) = (cs[c].clone(), path(c, i));
        async move {
            cl.stat(&p).await.with_context(|| format!("stat {p}"))?;
            Ok(())
        }
    })
    .await?;
    if keep {
        return Ok([create, stat, 0.0]);
    }
    let (c2, p2) = (cs.clone(), path.clone());
    let unlink = timed(cs.len(), per, move |c, i| {
        let (cs, path) = (&c2, &p2);
        let (cl, p) = (cs[c].clone(), path(c, i));
        async move {
            cl.unlink(&p).await.with_context(|| format!("unlink {p}"))?;
            if i + 1 == per {
                cl.settle_ahead().await?;
            }
            Ok(())
        }
    })
    .await?;
    match spread {
        Spread::Own(_) => {
            for (i, c) in cs.iter().enumerate() {
                c.rmdir(&format!("{dir}/c{i}")).await?;
            }
        }
        Spread::Shared(_) => cs[0].rmdir(&format!("{dir}/shared")).await?,
    }
    Ok([create, stat, unlink])
}

fn local_pass(dir: &Path, clients: usize, per: usize) -> Result<Rates> {
    let path = |c: usize, i: usize| dir.join(format!("c{c}")).join(format!("f{i:07}"));
    for c in 0..clients {
        std::fs::create_dir_all(dir.join(format!("c{c}")))?;
    }
    let run = |op: &(dyn Fn(&Path) -> std::io::Result<()> + Sync)| -> Result<f64> {
        let start = Instant::now();
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..clients)
                .map(|c| s.spawn(move || (0..per).try_for_each(|i| op(&path(c, i)))))
                .collect();
            hs.into_iter()
                .try_for_each(|h| h.join().expect("a bench thread panicked"))
        })?;
        Ok((clients * per) as f64 / start.elapsed().as_secs_f64())
    };
    let create = run(&|p| {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(p)
            .map(drop)
    })?;
    let stat = run(&|p| std::fs::metadata(p).map(drop))?;
    let unlink = run(&|p| std::fs::remove_file(p))?;
    for c in 0..clients {
        std::fs::remove_dir(dir.join(format!("c{c}")))?;
    }
    Ok([create, stat, unlink])
}

pub async fn run(mds: &str, cfg: ClientConfig, a: &crate::bench::BenchArgs) -> Result<()> {
    let (clients, files, rounds) = (a.clients, a.meta_files, a.rounds());
    let (run_modes, dir, local) = (&a.meta_modes, a.dir(), a.local_dir());
    if clients == 0 || files < clients || rounds == 0 {
        bail!("--clients, --files (at least one per client) and --rounds must be positive");
    }
    if run_modes.contains(&Mode::Local) && local.is_none() && a.meta_modes_given() {
        bail!("--meta-modes local needs --local-dir DIR, the local directory to run in");
    }
    let per = files / clients;
    let mdts = a.meta_mdts.max(1);
    let spread = match a.meta_dir_stripe {
        Some(n) => Spread::Shared(n.max(1)),
        None => Spread::Own(mdts),
    };
    let runs = |m: Mode| run_modes.contains(&m);
    // The clients of one mode; none for a mode not run.
    let connect = |mode: Mode, behind: bool, ahead: bool| {
        let cfg = ClientConfig {
            commit_behind: behind,
            ahead,
            ..cfg.clone()
        };
        let n = if runs(mode) { clients } else { 0 };
        async move {
            let mut cs = vec![];
            for _ in 0..n {
                cs.push(Client::connect_with(mds, cfg.clone()).await?);
            }
            Ok::<Vec<Client>, client::ClientError>(cs)
        }
    };
    let ahead = connect(Mode::Ahead, true, true).await?;
    let behind = connect(Mode::Behind, true, false).await?;
    let durable = connect(Mode::Durable, false, false).await?;
    if let Some(c) = ahead.iter().chain(&behind).chain(&durable).next() {
        c.mkdir_all(dir, 0o755).await?;
    }
    // mode -> per round rates
    let modes = ["lode commit-behind", "lode durable", "local", "lode ahead"];
    let mut results: Vec<Vec<Rates>> = vec![vec![]; modes.len()];
    for round in 0..rounds {
        for k in 0..modes.len() {
            let m = (k + round) % modes.len();
            if !runs(Mode::ALL[m]) {
                continue;
            }
            let r = match m {
                0 => {
                    lode_pass(
                        &behind,
                        &format!("{dir}/behind{round}"),
                        per,
                        spread,
                        a.meta_keep,
                    )
                    .await?
                }
                1 => {
                    lode_pass(
                        &durable,
                        &format!("{dir}/durable{round}"),
                        per,
                        spread,
                        a.meta_keep,
                    )
                    .await?
                }
                3 => {
                    lode_pass(
                        &ahead,
                        &format!("{dir}/ahead{round}"),
                        per,
                        spread,
                        a.meta_keep,
                    )
                    .await?
                }
                _ => match &local {
                    Some(d) => {
                        let d = d.join(format!("lode-meta-bench-{}-{round}", std::process::id()));
                        let r = local_pass(&d, clients, per)?;
                        let _ = std::fs::remove_dir(&d);
                        r
                    }
                    None => continue,
                },
            };
            eprintln!(
                "round {} {:20} create {:8.0}/s stat {:8.0}/s unlink {:8.0}/s",
                round + 1,
                modes[m],
                r[0],
                r[1],
                r[2]
            );
            results[m].push(r);
        }
    }
    for c in behind.iter().chain(&durable).chain(&ahead) {
        c.close().await?;
    }
    match spread {
        Spread::Own(mdts) => out!(
            "{} clients, {} files each, {} over {mdts} MDT{}, medians of {rounds} rounds",
            clients,
            per,
            if mdts > 1 { "directories" } else { "all" },
            if mdts > 1 { "s" } else { "" }
        ),
        Spread::Shared(n) => out!(
            "{clients} clients, {per} files each, in one directory striped over {n} MDT{}, \
             medians of {rounds} rounds",
            if n > 1 { "s" } else { "" }
        ),
    }
    out!(
        "{:8} {:>20} {:>14} {:>10} {:>12} {:>10} {:>10}",
        "op",
        "lode commit-behind",
        "lode durable",
        "local",
        "lode ahead",
        "behind/durable",
        "ahead/behind"
    );
    for (o, op) in OPS.iter().enumerate() {
        let med = |m: usize| {
            (!results[m].is_empty()).then(|| median(results[m].iter().map(|r| r[o]).collect()))
        };
        let rate = |m: usize| med(m).map_or("-".into(), |r| format!("{r:.0}/s"));
        let ratio = |x: usize, y: usize| match (med(x), med(y)) {
            (Some(x), Some(y)) => format!("{:.2}", x / y.max(1e-9)),
            _ => "-".into(),
        };
        out!(
            "{op:8} {:>20} {:>14} {:>10} {:>12} {:>10} {:>10}",
            rate(0),
            rate(1),
            rate(2),
            rate(3),
            ratio(0, 1),
            ratio(3, 0)
        );
    }
    Ok(())
}
