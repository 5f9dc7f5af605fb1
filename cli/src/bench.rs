//! `lode bench`: N files written then read sequentially by N tasks through the library, against
//! the same through the local disk (O_DIRECT) measured in the same run; and a checkpoint
//! (write a temporary file, fsync, rename it over the name) against the same on the local disk.
//! Rounds alternate the order; the report gives medians.

use std::fs::OpenOptions as LocalOpen;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use client::{Client, OpenOptions};
use indicatif::{ProgressBar, ProgressStyle};
use lnet::Registered;

#[derive(Args)]
pub struct BenchArgs {
    /// Files, each written and read by its own task.
    #[arg(long, default_value_t = 1)]
    files: usize,
    /// Size of each file (4G, 512M...).
    #[arg(long, default_value = "1G")]
    size: String,
    /// Stripes per file (-1: every target).
    #[arg(long, default_value = "-1")]
    stripe_count: i64,
    #[arg(long, default_value = "4M")]
    stripe_size: String,
    /// A local directory for the baseline (skipped if not given).
    #[arg(long)]
    local_dir: Option<PathBuf>,
    /// Also time a checkpoint of this size (write temp, fsync, rename).
    #[arg(long)]
    checkpoint: Option<String>,
    /// Rounds; the report gives medians.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// The lode directory to work in.
    #[arg(long, default_value = "/lode-bench")]
    dir: String,
    /// Also run with this many mirrors (the stripe count is per mirror), in the same rounds,
    /// and time the resync of one copy of each file.
    #[arg(long, default_value_t = 1)]
    mirrors: u16,
    /// Instead: create, stat and unlink of --meta-files empty files by --clients clients
    /// through the library, commit-behind against durable answers and the local directory.
    #[arg(long)]
    pub meta: bool,
    /// With --meta: clients, each with its own connection and directory.
    #[arg(long, default_value_t = 8)]
    pub clients: usize,
    /// With --meta: files over all clients.
    #[arg(long, default_value_t = 20_000)]
    pub meta_files: usize,
    /// With --meta: the modes to run, of ahead, behind, durable and local (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = crate::metabench::Mode::ALL)]
    pub meta_modes: Vec<crate::metabench::Mode>,
    /// With --meta: spread the clients' directories over this many MDTs (client i's on MDT
    /// i mod N, `lode mkdir -i`); changes on MDTs other than 0 are answered once durable.
    #[arg(long, default_value_t = 1)]
    pub meta_mdts: u32,
    /// With --meta: every client in one shared directory, striped over this many MDTs
    /// (`lode setdirstripe -c N`; 1: a plain directory), instead of one directory each.
    #[arg(long)]
    pub meta_dir_stripe: Option<u32>,
    /// With --meta: keep the files made (no removal phase), for a listing of them to be
    /// measured after.
    #[arg(long)]
    pub meta_keep: bool,
}

impl BenchArgs {
    pub fn rounds(&self) -> usize {
        self.rounds
    }
    pub fn dir(&self) -> &str {
        &self.dir
    }
    pub fn local_dir(&self) -> Option<PathBuf> {
        self.local_dir.clone()
    }
    /// Whether --meta-modes names modes of its own (the default runs local only with
    /// --local-dir).
    pub fn meta_modes_given(&self) -> bool {
        self.meta_modes[..] != crate::metabench::Mode::ALL[..]
    }
}

/// Bytes one write or read call moves, per stripe of the file: a file striped over four
/// targets moves four times as much per call, so each target sees what it would under a
/// one-stripe file (as a Lustre client's dirty and read-ahead limits are per target).
const CHUNK: u64 = 64 << 20;
/// Stripes beyond which a call grows no further (a file over every target of a large cluster).
const CHUNK_STRIPES: u64 = 8;
/// Calls in flight per file, so that one is always on the wire while the other completes.
const IN_FLIGHT: usize = 2;
/// The most memory the buffers of all files together take.
const MEMORY: u64 = 2 << 30;

/// The bytes one call moves: `CHUNK` per stripe (a stripe count of -1 means every target),
/// within `MEMORY` over all files, and never below one stripe unit.
async fn chunk_for(client: &Client, a: &BenchArgs, stripe_size: u64) -> Result<usize> {
    let stripes = match u64::try_from(a.stripe_count) {
        Ok(n) => n,
        Err(_) => u64::from(client.statfs().await?.targets_up),
    };
    let budget = MEMORY / (a.files * IN_FLIGHT) as u64;
    let chunk = (CHUNK * stripes.clamp(1, CHUNK_STRIPES))
        .min(budget)
        .max(stripe_size.max(1 << 20));
    Ok(usize::try_from(chunk)?)
}

type Buffers = Vec<Arc<Registered<Vec<u8>>>>;

/// One file's registered buffers, made before the clock starts (as fio and IOR do): the run
/// times the transfer, not the allocation of its memory.
fn buffers(client: &Client, chunk: usize) -> Result<Buffers> {
    (0..IN_FLIGHT)
        .map(|_| {
            client
                .register(vec![0x5au8; chunk])
                .map(Arc::new)
                .map_err(Into::into)
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn bar(total: u64, what: &str) -> ProgressBar {
    let b = ProgressBar::new(total);
    b.set_style(
        ProgressStyle::with_template("{msg:24} {bar:30} {bytes}/{total_bytes} {bytes_per_sec}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    b.set_message(what.to_owned());
    b
}

/// lode against the local baseline in rotated rounds (long by design: a script of timed steps).
pub async fn run(client: Client, a: BenchArgs) -> Result<()> {
    let size = crate::parse_size(&a.size)?;
    let stripe_size = crate::parse_size(&a.stripe_size)?;
    if a.files == 0 || size == 0 || a.rounds == 0 {
        bail!("--files, --size and --rounds must be positive");
    }
    client.mkdir_all(&a.dir, 0o755).await?;
    let total = size * a.files as u64;
    let (mut lw, mut lr, mut ow, mut or, mut lc, mut oc) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    let (mut mw, mut mr, mut ms) = (vec![], vec![], vec![]);
    for round in 0..a.rounds {
        let local_first = round % 2 == 0;
        for lode_turn in [!local_first, local_first] {
            if lode_turn {
                // Mirrored and unmirrored in rotated order too.
                let mut copies = vec![1];
                if a.mirrors > 1 {
                    copies.insert(round % 2, a.mirrors);
                }
                for n in copies {
                    let (w, r, s) = lode_round(&client, &a, size, stripe_size, round, n).await?;
                    if n == 1 {
                        ow.push(w);
                        or.push(r);
                    } else {
                        mw.push(w);
                        mr.push(r);
                        ms.extend(s);
                    }
                }
                if let Some(c) = &a.checkpoint {
                    oc.push(
                        lode_checkpoint(&client, &a, crate::parse_size(c)?, stripe_size).await?,
                    );
                }
            } else if let Some(d) = &a.local_dir {
                let (w, r) = local_round(d, a.files, size).await?;
                lw.push(w);
                lr.push(r);
                if let Some(c) = &a.checkpoint {
                    lc.push(local_checkpoint(d, crate::parse_size(c)?).await?);
                }
            }
        }
    }
    out!(
        "lode bench: {} file(s) of {} (stripe count {}, stripe size {}), {} rounds, medians",
        a.files,
        crate::human(size),
        a.stripe_count,
        crate::human(stripe_size),
        a.rounds
    );
    let gbs = |secs: &[f64]| median(secs.iter().map(|s| total as f64 / s / 1e9).collect());
    out!("  {:<28} {:>10} {:>10}", "", "write GB/s", "read GB/s");
    if !lw.is_empty() {
        out!(
            "  {:<28} {:>10.2} {:>10.2}",
            "local disk (O_DIRECT)",
            gbs(&lw),
            gbs(&lr)
        );
    }
    out!(
        "  {:<28} {:>10.2} {:>10.2}",
        "lode (library)",
        gbs(&ow),
        gbs(&or)
    );
    if !lw.is_empty() {
        out!(
            "  {:<28} {:>10.2} {:>10.2}",
            "ratio lode / local",
            gbs(&ow) / gbs(&lw),
            gbs(&or) / gbs(&lr)
        );
    }
    if !mw.is_empty() {
        out!(
            "  {:<28} {:>10.2} {:>10.2}",
            format!("lode, {} mirrors", a.mirrors),
            gbs(&mw),
            gbs(&mr)
        );
        out!(
            "  {:<28} {:>10.2} {:>10.2}",
            "ratio mirrored / unmirrored",
            gbs(&mw) / gbs(&ow),
            gbs(&mr) / gbs(&or)
        );
        out!(
            "  resync of one copy: {:.2} GB/s (median over {} files)",
            median(
                ms.iter()
                    .map(|(bytes, secs)| *bytes as f64 / secs / 1e9)
                    .collect()
            ),
            ms.len()
        );
    }
    if !oc.is_empty() {
        out!(
            "  checkpoint of {}: lode {:.2} s",
            a.checkpoint.as_deref().unwrap_or(""),
            median(oc.clone())
        );
        if !lc.is_empty() {
            out!(
                "  checkpoint of {}: local {:.2} s (lode / local = {:.2})",
                a.checkpoint.as_deref().unwrap_or(""),
                median(lc.clone()),
                median(oc) / median(lc)
            );
        }
    }
    Ok(())
}

fn options(a: &BenchArgs, stripe_size: u64, mirrors: u16) -> Result<OpenOptions> {
    let o = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .stripe_size(stripe_size);
    if mirrors > 1 {
        let count = u32::try_from(a.stripe_count).ok();
        return Ok(o.layout(client::raid0(count, stripe_size)?.with_mirrors(mirrors)?));
    }
    Ok(if a.stripe_count < 0 {
        o.stripe_all()
    } else {
        o.stripe_count(a.stripe_count as u32)
    })
}

/// Writes `size` bytes from registered buffers (the servers pull straight from them), one
/// call per buffer in flight so that one is always on the wire.
async fn write_file(
    client: &Client,
    path: &str,
    opts: &OpenOptions,
    size: u64,
    buffers: &Buffers,
    b: &ProgressBar,
) -> Result<()> {
    let f = Arc::new(
        opts.open(client, path)
            .await
            .with_context(|| format!("creating {path}"))?,
    );
    let chunk = buffers[0].len();
    let mut inflight: std::collections::VecDeque<
        tokio::task::JoinHandle<Result<u64, client::ClientError>>,
    > = Default::default();
    let mut at = 0;
    let mut turn = 0;
    while at < size {
        if inflight.len() == buffers.len() {
            let done = inflight.pop_front().context("a write in flight")?;
            b.inc(done.await??);
        }
        let n = (size - at).min(chunk);
        let (f, buf) = (f.clone(), buffers[turn % buffers.len()].clone());
        inflight.push_back(tokio::spawn(async move {
            f.write_from(at, buf, 0, n).await.map(|_| n)
        }));
        at += n;
        turn += 1;
    }
    for t in inflight {
        b.inc(t.await??);
    }
    f.fsync().await?;
    Arc::try_unwrap(f)
        .map_err(|_| anyhow::anyhow!("a write still holds the file"))?
        .close()
        .await?;
    Ok(())
}

/// Reads a file straight into registered memory (the storage servers put the bytes there),
/// as many calls in flight as writes have, so no target waits between calls.
async fn read_file(
    client: &Client,
    path: &str,
    size: u64,
    regions: &Buffers,
    b: &ProgressBar,
) -> Result<()> {
    let f = Arc::new(OpenOptions::new().open(client, path).await?);
    let chunk = regions[0].len();
    let mut inflight: std::collections::VecDeque<
        tokio::task::JoinHandle<Result<(u64, usize), client::ClientError>>,
    > = Default::default();
    let (mut at, mut turn) = (0u64, 0usize);
    let settle = |r: (u64, usize)| -> Result<()> {
        let (from, n) = r;
        let want = (size - from).min(chunk);
        if (n as u64) < want {
            bail!("{path} is short: {} of {size}", from + n as u64);
        }
        b.inc(n as u64);
        Ok(())
    };
    while at < size {
        if inflight.len() == regions.len() {
            settle(inflight.pop_front().context("a read in flight")?.await??)?;
        }
        let n = (size - at).min(chunk);
        let (f, region) = (f.clone(), regions[turn % regions.len()].clone());
        inflight.push_back(tokio::spawn(async move {
            f.read_into(at, &region, 0, n).await.map(|got| (at, got))
        }));
        at += n;
        turn += 1;
    }
    for t in inflight {
        settle(t.await??)?;
    }
    Ok(())
}

async fn lode_round(
    client: &Client,
    a: &BenchArgs,
    size: u64,
    stripe_size: u64,
    round: usize,
    mirrors: u16,
) -> Result<(f64, f64, Vec<(u64, f64)>)> {
    let opts = options(a, stripe_size, mirrors)?;
    let paths: Vec<String> = (0..a.files)
        .map(|i| format!("{}/r{round}-m{mirrors}-f{i}", a.dir))
        .collect();
    let chunk = chunk_for(client, a, stripe_size).await?;
    let memory: Vec<Arc<Buffers>> = (0..a.files)
        .map(|_| buffers(client, chunk).map(Arc::new))
        .collect::<Result<_>>()?;
    let b = bar(size * a.files as u64, "lode write");
    let t0 = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (p, m) in paths.iter().cloned().zip(&memory) {
        let (c, o, b, m) = (client.clone(), opts.clone(), b.clone(), m.clone());
        tasks.spawn(async move { write_file(&c, &p, &o, size, &m, &b).await });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    let w = t0.elapsed().as_secs_f64();
    b.finish_and_clear();
    let b = bar(size * a.files as u64, "lode read");
    let t0 = Instant::now();
    for (p, m) in paths.iter().cloned().zip(&memory) {
        let (c, b, m) = (client.clone(), b.clone(), m.clone());
        tasks.spawn(async move { read_file(&c, &p, size, &m, &b).await });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    let r = t0.elapsed().as_secs_f64();
    b.finish_and_clear();
    // A mirrored file's last copy marked stale, then resynced (placed anew and copied).
    let mut resyncs = vec![];
    if mirrors > 1 {
        for p in &paths {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .open(client, p)
                .await?;
            f.mark_mirror_stale(mirrors - 1, "resync benchmark").await?;
            let t0 = Instant::now();
            let n = f.resync(|_, _| {}).await?;
            resyncs.push((n, t0.elapsed().as_secs_f64()));
            f.close().await?;
        }
    }
    for p in paths {
        client.unlink(&p).await?;
    }
    Ok((w, r, resyncs))
}

async fn lode_checkpoint(
    client: &Client,
    a: &BenchArgs,
    size: u64,
    stripe_size: u64,
) -> Result<f64> {
    let memory = buffers(client, chunk_for(client, a, stripe_size).await?)?;
    let b = bar(size, "lode checkpoint");
    let (tmp, name) = (format!("{}/ckpt.tmp", a.dir), format!("{}/ckpt", a.dir));
    let t0 = Instant::now();
    write_file(
        client,
        &tmp,
        &options(a, stripe_size, 1)?,
        size,
        &memory,
        &b,
    )
    .await?;
    client.rename(&tmp, &name).await?;
    let secs = t0.elapsed().as_secs_f64();
    b.finish_and_clear();
    Ok(secs)
}

/// An aligned slice of `len` bytes inside `v`, for O_DIRECT.
fn aligned(v: &mut Vec<u8>, len: usize) -> &mut [u8] {
    v.resize(len + 4096, 0x5a);
    let off = v.as_ptr().align_offset(4096);
    &mut v[off..off + len]
}

async fn local_round(dir: &Path, files: usize, size: u64) -> Result<(f64, f64)> {
    std::fs::create_dir_all(dir)?;
    let paths: Vec<PathBuf> = (0..files)
        .map(|i| dir.join(format!("lode-bench-local-{i}")))
        .collect();
    let run = |write: bool, paths: Vec<PathBuf>| async move {
        // Buffers filled before the clock starts, as lode's are.
        let memory: Vec<Vec<u8>> = paths
            .iter()
            .map(|_| {
                let mut v = vec![];
                aligned(&mut v, CHUNK as usize);
                v
            })
            .collect();
        let t0 = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for (p, mut v) in paths.into_iter().zip(memory) {
            tasks.spawn_blocking(move || -> Result<()> {
                let f = LocalOpen::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(write)
                    .custom_flags(libc::O_DIRECT)
                    .open(&p)?;
                let buf = aligned(&mut v, CHUNK as usize);
                let mut at = 0;
                while at < size {
                    let n = ((size - at).min(CHUNK) as usize).div_ceil(4096) * 4096;
                    if write {
                        f.write_all_at(&buf[..n], at)?;
                    } else {
                        f.read_exact_at(&mut buf[..n], at)?;
                    }
                    at += n as u64;
                }
                if write {
                    f.sync_all()?;
                }
                Ok(())
            });
        }
        while let Some(r) = tasks.join_next().await {
            r??;
        }
        anyhow::Ok(t0.elapsed().as_secs_f64())
    };
    let w = run(true, paths.clone()).await?;
    let r = run(false, paths.clone()).await?;
    for p in paths {
        let _ = std::fs::remove_file(p);
    }
    Ok((w, r))
}

async fn local_checkpoint(dir: &Path, size: u64) -> Result<f64> {
    let (tmp, name) = (dir.join("lode-bench-ckpt.tmp"), dir.join("lode-bench-ckpt"));
    let data = vec![0x5au8; CHUNK as usize];
    let t0 = Instant::now();
    let (t2, n2) = (tmp.clone(), name.clone());
    tokio::task::spawn_blocking(move || -> Result<()> {
        use std::io::Write;
        let mut f = std::fs::File::create(&t2)?;
        let mut at = 0;
        while at < size {
            let n = (size - at).min(CHUNK) as usize;
            f.write_all(&data[..n])?;
            at += n as u64;
        }
        f.sync_all()?;
        std::fs::rename(&t2, &n2)?;
        Ok(())
    })
    .await??;
    let secs = t0.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(name);
    Ok(secs)
}
