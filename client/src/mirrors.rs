//! Keeping mirrored files whole across the cluster: the healer that resyncs stale copies in
//! the background (the MDS runs one), and the rebuild of every copy a target held.
//!
//! Both work file by file through [`File::resync_limited`]: the MDS places the stale copy on
//! new objects, the bytes are copied from a copy in sync, compared, and the copy marked in
//! sync at an unchanged layout generation.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use proto::md::ScannedFile;
use proto::Fid;
use tokio::time::Instant;

use crate::client::Client;
use crate::error::{ClientError, Result};
use crate::file::OpenOptions;

/// How the healer works.
#[derive(Clone, Debug)]
pub struct HealConfig {
    /// Bytes a second the healer copies, at most, summed over its files (0: no limit).
    pub rate: u64,
    /// How long a stale copy waits for the targets it was on to come back before it is
    /// placed on other servers (its server may only be restarting; moving it costs a copy
    /// of the file either way, but other servers may be fuller or busier).
    pub move_after: Duration,
    /// Time between passes.
    pub every: Duration,
    /// The MDT whose files it heals (each `lode-mds` heals its own); `None`: every MDT, one
    /// after another, an MDT that does not answer left for the next pass.
    pub mdt: Option<u32>,
}

impl Default for HealConfig {
    fn default() -> Self {
        HealConfig {
            rate: 200 << 20,
            move_after: Duration::from_secs(600),
            every: Duration::from_secs(5),
            mdt: None,
        }
    }
}

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Files brought back in sync.
    pub resynced: usize,
    /// Bytes copied.
    pub bytes: u64,
    /// Files left stale for now: their targets are still down.
    pub waiting: usize,
    /// Files whose resync failed (tried again on a later pass).
    pub failed: usize,
}

/// Resyncs stale copies as their servers come back: a copy whose targets are all up again is
/// resynced at once (onto new objects, placed where the MDS chooses); one whose targets stay
/// down is moved to other servers after [`HealConfig::move_after`]. Files some client holds
/// open are left for a later pass. A file that fails waits longer each time, up to ten
/// minutes.
pub struct Healer {
    client: Client,
    cfg: HealConfig,
    /// When each stale file was first seen stale.
    seen: HashMap<Fid, Instant>,
    /// Files that failed: when to try again, and how many times they failed.
    backoff: HashMap<Fid, (Instant, u32)>,
}

/// A healer running in the background; dropping it stops the healer.
pub struct HealerTask(tokio::task::JoinHandle<()>);

impl Drop for HealerTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Healer {
    /// Starts the healer of the filesystem whose MDT0 is served at `mds`, reached through
    /// `net`, which must carry the server's own key (the healer acts as root and lists files
    /// by FID); it heals the files of [`HealConfig::mdt`]. It connects as a
    /// client that commits nothing behind (it is part of the MDS: when the MDS stops, so does
    /// the healer, and nothing it held is replayed), trying again every 5 s until the MDS
    /// answers, and then passes forever. `lode-mds` starts one; so does the in-process cluster
    /// when asked to. `client` is the rest of the client's settings (its id and clock, for a
    /// seeded simulation).
    pub fn spawn(
        net: lnet::AnyNet,
        mds: String,
        client: crate::ClientConfig,
        cfg: HealConfig,
    ) -> HealerTask {
        let ccfg = crate::ClientConfig {
            retry_for: Duration::from_secs(15),
            creds: proto::md::Creds::root(),
            commit_behind: false,
            ..client
        };
        HealerTask(tokio::spawn(async move {
            loop {
                match Client::connect_on(net.clone(), &mds, ccfg.clone()).await {
                    Ok(c) => {
                        tracing::info!(rate = cfg.rate, move_after = ?cfg.move_after, "resyncing stale mirrors in the background");
                        return Healer::new(c, cfg).run().await;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the mirror healer cannot reach its MDS; trying again");
                        tokio::time::sleep(Duration::from_secs(5)).await;
                    }
                }
            }
        }))
    }

    pub fn new(client: Client, cfg: HealConfig) -> Healer {
        Healer {
            client,
            cfg,
            seen: HashMap::new(),
            backoff: HashMap::new(),
        }
    }

    /// Passes forever, `every` apart; errors are logged, never fatal.
    pub async fn run(mut self) {
        loop {
            match self.pass().await {
                Ok(r) if r != PassReport::default() => tracing::info!(
                    resynced = r.resynced,
                    bytes = r.bytes,
                    waiting = r.waiting,
                    failed = r.failed,
                    "mirror healer pass"
                ),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "mirror healer pass failed"),
            }
            tokio::time::sleep(self.cfg.every).await;
        }
    }

    /// One pass over every file with a stale copy.
    pub async fn pass(&mut self) -> Result<PassReport> {
        let files = match self.cfg.mdt {
            Some(k) => self.client.mirror_scan_mdt(k, true, None).await?,
            None => {
                let mut files = self.client.mirror_scan_mdt(0, true, None).await?;
                for m in self.client.mdts().await? {
                    if m.index == 0 {
                        continue;
                    }
                    match self.client.mirror_scan_mdt(m.index, true, None).await {
                        Ok(more) => files.extend(more),
                        Err(e) => {
                            tracing::warn!(mdt = m.index, error = %e, "mirror healer: MDT not scanned this pass")
                        }
                    }
                }
                files
            }
        };
        let now = Instant::now();
        let stale: HashSet<Fid> = files.iter().map(|f| f.fid).collect();
        self.seen.retain(|f, _| stale.contains(f));
        self.backoff.retain(|f, _| stale.contains(f));
        let up: HashSet<u32> = self
            .client
            .targets()
            .await?
            .into_iter()
            .filter(|t| t.up)
            .map(|t| t.index)
            .collect();
        let mut report = PassReport::default();
        for f in files {
            let first = *self.seen.entry(f.fid).or_insert(now);
            if self.backoff.get(&f.fid).is_some_and(|(at, _)| now < *at) {
                report.waiting += 1;
                continue;
            }
            // A file in use is left to its users (a resync racing a writer could miss its
            // writes) and taken up on a later pass.
            if f.open {
                report.waiting += 1;
                continue;
            }
            let back = f.stale_targets.iter().all(|t| up.contains(t));
            if !back && now.duration_since(first) < self.cfg.move_after {
                report.waiting += 1;
                continue;
            }
            let rate = (self.cfg.rate > 0).then_some(self.cfg.rate);
            match resync_fid(&self.client, &f, rate).await {
                Ok(n) => {
                    tracing::info!(fid = %f.fid, bytes = n, moved = !back, "resynced a stale mirror");
                    report.resynced += 1;
                    report.bytes += n;
                    self.backoff.remove(&f.fid);
                }
                Err(e) => {
                    let tries = self.backoff.get(&f.fid).map_or(0, |b| b.1) + 1;
                    let wait =
                        Duration::from_secs(5u64 << tries.min(7)).min(Duration::from_secs(600));
                    tracing::warn!(fid = %f.fid, error = %e, retry_in = ?wait, "resync failed");
                    self.backoff.insert(f.fid, (Instant::now() + wait, tries));
                    report.failed += 1;
                }
            }
        }
        Ok(report)
    }
}

/// Opens `f` for writing and resyncs its stale copies.
async fn resync_fid(client: &Client, f: &ScannedFile, rate: Option<u64>) -> Result<u64> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(client, f.fid)
        .await?;
    let r = file.resync_limited(|_, _| {}, rate).await;
    let closed = file.close().await;
    let n = r?;
    closed?;
    Ok(n)
}

/// What a rebuild did.
#[derive(Debug, Default)]
pub struct RebuildReport {
    /// Mirrored files with a copy on the target.
    pub files: usize,
    /// Of those, the files whose copies there now live elsewhere.
    pub rebuilt: usize,
    pub bytes: u64,
    /// Files that could not be rebuilt, with why (no other copy in sync, no servers to place
    /// the copy on, a server failing meanwhile).
    pub failed: Vec<(Fid, ClientError)>,
}

/// Moves every mirror with an object on `target` to other targets, copying it from a copy in
/// sync: for a target that was wiped, replaced or is to be retired. Each such mirror is marked
/// stale first (the MDS refuses for a file's last copy in sync, which is reported), then
/// resynced onto objects placed anywhere but on `target`. `progress(done, total, file)` is
/// told the bytes copied so far over all files. Unmirrored files on the target are not
/// listed: they have no other copy.
pub async fn rebuild_target(
    client: &Client,
    target: u32,
    mut progress: impl FnMut(u64, u64, Fid),
) -> Result<RebuildReport> {
    let files = client.mirror_scan(false, Some(target)).await?;
    let total: u64 = files
        .iter()
        .map(|f| f.size * f.on_target.len() as u64)
        .sum();
    let mut report = RebuildReport {
        files: files.len(),
        ..Default::default()
    };
    let mut base = 0;
    for f in files {
        let r = async {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(client, f.fid)
                .await?;
            let r = async {
                for &m in &f.on_target {
                    file.mark_mirror_stale(m, &format!("target {target} is being rebuilt"))
                        .await?;
                }
                file.resync_avoiding(
                    |done, _| progress(base + done, total, f.fid),
                    None,
                    &[target],
                )
                .await
            }
            .await;
            let closed = file.close().await;
            let n = r?;
            closed?;
            Ok::<_, ClientError>(n)
        }
        .await;
        base += f.size * f.on_target.len() as u64;
        match r {
            Ok(n) => {
                report.rebuilt += 1;
                report.bytes += n;
            }
            Err(e) => report.failed.push((f.fid, e)),
        }
    }
    Ok(report)
}
