//! The copytool (Lustre's `lhsmtool_posix`, for S3): takes archive, restore and import work
//! from the MDS's HSM queue and moves the bytes between lode and the object store.
//!
//! - An **archive** opens the file for reading, uploads it (in parts past one part's size)
//!   and reports the object's ETag with the size and modification time it read, holding its
//!   open until the MDS took the report: the MDS marks the file archived only if nothing else
//!   opened it meanwhile.
//! - A **restore** opens the released file as it is, has the MDS place new objects for its
//!   copy, fetches the object with parallel ranged GETs (each conditional on the archived
//!   ETag, each checking the object's size) into them, reports how far the bytes landed as they land (readers read them at
//!   once), cuts and syncs the objects, and reports the layout generation it filled: the
//!   MDS then marks the copy in sync.
//! - An **import** lists a link's prefix and names every object in the linked directory
//!   (making its directories), released, with the object's size and time.
//!
//! Several copytools may run (on any client node); each action is held by one until it stops
//! reporting. The S3 credentials come from the standard AWS environment variables, else the
//! shared credentials file (`AWS_SHARED_CREDENTIALS_FILE`, `~/.aws/credentials`, profile
//! `AWS_PROFILE` or `default`); they are never sent to lode.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use client::file::OpenOptions;
use client::Client;
use futures_util::{StreamExt, TryStreamExt};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{GetOptions, ObjectStore, PutPayload, WriteMultipart};
use proto::hsm::{ActionKind, Failure, Finished, Imported, Link, Work, MAX_IMPORT};
use proto::md::{Creds, Time};

pub mod metrics;
pub use metrics::CopytoolMetrics;

/// How the copytool works.
#[derive(Clone, Debug)]
pub struct Config {
    /// Actions carried out at once.
    pub workers: usize,
    /// Ranged GETs in flight per restore, and parts in flight per upload.
    pub streams: usize,
    /// Bytes per GET and per uploaded part (S3's parts are 5 MiB at least).
    pub part: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            workers: 4,
            streams: 8,
            part: 16 << 20,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("S3: {0}")]
    S3(#[from] object_store::Error),
    #[error("lode: {0}")]
    Lode(#[from] client::error::ClientError),
    #[error("{0}")]
    Changed(String),
}

impl CopyError {
    /// Whether trying again cannot help: the object is gone or changed, the bucket is
    /// missing, or the credentials are refused.
    fn permanent(&self) -> bool {
        matches!(
            self,
            CopyError::S3(
                object_store::Error::NotFound { .. }
                    | object_store::Error::Precondition { .. }
                    | object_store::Error::PermissionDenied { .. }
                    | object_store::Error::Unauthenticated { .. },
            ) | CopyError::Changed(_)
        )
    }

    fn failure(&self) -> Failure {
        Failure {
            error: self.to_string(),
            permanent: self.permanent(),
        }
    }
}

type Result<T> = std::result::Result<T, CopyError>;

/// The access key of the shared credentials file's profile, if the environment has none.
fn shared_credentials() -> Option<(String, String, Option<String>)> {
    let file = std::env::var_os("AWS_SHARED_CREDENTIALS_FILE")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".aws/credentials"))
        })?;
    let text = std::fs::read_to_string(file).ok()?;
    let profile = std::env::var("AWS_PROFILE").unwrap_or_else(|_| "default".into());
    let mut inside = false;
    let mut kv: HashMap<String, String> = HashMap::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') && line.ends_with(']') {
            inside = line[1..line.len() - 1].trim() == profile;
            continue;
        }
        if let (true, Some((k, v))) = (inside, line.split_once('=')) {
            kv.insert(k.trim().to_string(), v.trim().to_string());
        }
    }
    Some((
        kv.remove("aws_access_key_id")?,
        kv.remove("aws_secret_access_key")?,
        kv.remove("aws_session_token"),
    ))
}

/// The object store of `link`: its bucket at its endpoint and region, with this node's
/// credentials.
pub fn store_for(link: &Link) -> Result<Arc<dyn ObjectStore>> {
    let mut b = AmazonS3Builder::from_env().with_bucket_name(&link.bucket);
    if std::env::var_os("AWS_ACCESS_KEY_ID").is_none() {
        if let Some((id, secret, token)) = shared_credentials() {
            b = b.with_access_key_id(id).with_secret_access_key(secret);
            if let Some(t) = token {
                b = b.with_token(t);
            }
        }
    }
    if let Some(e) = &link.endpoint {
        b = b
            .with_endpoint(e)
            .with_allow_http(e.starts_with("http://"))
            .with_virtual_hosted_style_request(false);
    }
    let region = link
        .region
        .clone()
        .or_else(|| std::env::var("AWS_REGION").ok())
        .or_else(|| std::env::var("AWS_DEFAULT_REGION").ok())
        .unwrap_or_else(|| "us-east-1".into());
    Ok(Arc::new(b.with_region(region).build()?))
}

/// One copytool on one connection.
pub struct Copytool {
    client: Client,
    cfg: Config,
    id: u128,
    stores: stores::Stores,
    metrics: Option<Arc<CopytoolMetrics>>,
}

mod stores {
    use super::*;

    /// A link as it was when its store was made, and the store.
    type Made = (Link, Arc<dyn ObjectStore>);

    /// The object stores met, one per link.
    #[derive(Default)]
    pub struct Stores(std::sync::Mutex<HashMap<u32, Made>>);

    impl Stores {
        pub fn of(&self, link: &Link) -> Result<Arc<dyn ObjectStore>> {
            let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((l, s)) = m.get(&link.id) {
                if l == link {
                    return Ok(s.clone());
                }
            }
            let s = store_for(link)?;
            m.insert(link.id, (link.clone(), s.clone()));
            Ok(s)
        }
    }
}

impl Copytool {
    pub fn new(client: Client, cfg: Config) -> Arc<Copytool> {
        Self::with_metrics(client, cfg, None)
    }

    /// As [`Copytool::new`], counting its work in `metrics`.
    pub fn with_metrics(
        client: Client,
        cfg: Config,
        metrics: Option<Arc<CopytoolMetrics>>,
    ) -> Arc<Copytool> {
        Arc::new(Copytool {
            client,
            cfg,
            id: rand::random(),
            stores: Default::default(),
            metrics,
        })
    }

    /// Takes and carries out work until dropped.
    pub async fn run(self: Arc<Self>) {
        let imports = tokio::spawn(self.clone().imports());
        let slots = Arc::new(tokio::sync::Semaphore::new(self.cfg.workers.max(1)));
        loop {
            let free = slots.available_permits().max(1) as u32;
            let permit = match slots.clone().acquire_owned().await {
                Ok(p) => p,
                Err(_) => break,
            };
            let work = match self.client.hsm_take(self.id, free).await {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!(error = %e, "could not take work from the MDS");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            drop(permit);
            for w in work {
                let me = self.clone();
                let permit = slots.clone().acquire_owned().await;
                tokio::spawn(async move {
                    let _permit = permit;
                    me.carry_out(w).await;
                });
            }
        }
        imports.abort();
    }

    async fn carry_out(&self, w: Work) {
        let started = std::time::Instant::now();
        let key = w.key.clone();
        let kind = match w.kind {
            ActionKind::Archive => "archive",
            ActionKind::Restore => "restore",
        };
        if let Some(m) = &self.metrics {
            m.started(kind);
        }
        let result = match w.kind {
            ActionKind::Archive => self.archive(&w).await,
            ActionKind::Restore => self.restore(&w).await.map(|f| (f, None)),
        };
        if let Some(m) = &self.metrics {
            m.ended(kind, result.as_ref().ok().map(|(f, _)| f.size));
        }
        let (report, file) = match result {
            Ok((f, file)) => {
                tracing::info!(fid = %w.fid, %key, kind = ?w.kind, bytes = f.size, secs = started.elapsed().as_secs_f64(), "done");
                (Ok(f), file)
            }
            Err(e) => {
                tracing::warn!(fid = %w.fid, %key, kind = ?w.kind, error = %e, "failed");
                (Err(e.failure()), None)
            }
        };
        if let Err(e) = self.client.hsm_done(self.id, &w, report).await {
            tracing::warn!(fid = %w.fid, error = %e, "the MDS did not take the report");
        }
        if let Some(f) = file {
            let _ = f.close().await;
        }
    }

    /// Uploads the file; the open it read through comes back too (closed once the MDS
    /// took the report).
    async fn archive(&self, w: &Work) -> Result<(Finished, Option<client::file::File>)> {
        let store = self.stores.of(&w.link)?;
        let f = OpenOptions::new()
            .read(true)
            .open(&self.client, w.fid)
            .await?;
        let inode = f.inode();
        let (size, mtime) = (inode.size, inode.mtime);
        let path = Path::from(w.key.as_str());
        let part = self.cfg.part.max(5 << 20) as u64;
        let etag = if size <= part {
            let mut buf = vec![0u8; size as usize];
            let mut at = 0;
            while at < size {
                let n = f.read_at(at, &mut buf[at as usize..]).await?;
                if n == 0 {
                    return Err(CopyError::Changed(format!(
                        "{}: the file ended at {at} of {size} bytes",
                        w.fid
                    )));
                }
                at += n as u64;
            }
            store.put(&path, PutPayload::from(buf)).await?.e_tag
        } else {
            let upload = store.put_multipart(&path).await?;
            let mut out = WriteMultipart::new_with_chunk_size(upload, part as usize);
            let mut at = 0;
            while at < size {
                let n = part.min(size - at) as usize;
                let chunk = f.read_chunk(at, n).await?;
                if chunk.is_empty() {
                    out.abort().await.ok();
                    return Err(CopyError::Changed(format!(
                        "{}: the file ended at {at} of {size} bytes",
                        w.fid
                    )));
                }
                at += chunk.len() as u64;
                out.wait_for_capacity(self.cfg.streams.max(1)).await?;
                out.write(&chunk);
            }
            out.finish().await?.e_tag
        };
        let etag = etag.unwrap_or_default();
        let handle = f.open_handle();
        Ok((
            Finished {
                etag,
                size,
                mtime,
                handle,
                generation: 0,
            },
            Some(f),
        ))
    }

    /// Fetches the object back into new objects of the file's copy 0.
    async fn restore(&self, w: &Work) -> Result<Finished> {
        let store = self.stores.of(&w.link)?;
        let path = Path::from(w.key.as_str());
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .as_is(true)
            .open(&self.client, w.fid)
            .await?;
        tracing::debug!(fid = %w.fid, "opened");
        let mut result = self.fill(&f, &store, &path, w).await;
        if let Err(CopyError::Lode(e)) = &result {
            // The objects it had (placed for an earlier attempt, perhaps) could not be written:
            // new ones, once.
            tracing::info!(fid = %w.fid, error = %e, "placing the copy anew");
            if f.place_copy(0).await.is_ok() {
                result = self.fill(&f, &store, &path, w).await;
            }
        }
        let _ = f.close().await;
        result
    }

    async fn fill(
        &self,
        f: &client::file::File,
        store: &Arc<dyn ObjectStore>,
        path: &Path,
        w: &Work,
    ) -> Result<Finished> {
        let started = std::time::Instant::now();
        // The MDS placed the copy's objects as it queued the restore; placed anew when that
        // failed, or when they could not be written (a server gone: see `restore`).
        let generation = match f.copy_placed(0) {
            Some(g) => g,
            None => f.place_copy(0).await?,
        };
        tracing::debug!(fid = %w.fid, ms = started.elapsed().as_secs_f64() * 1e3, "placed");
        let part = self.cfg.part.max(1 << 20) as u64;
        let size = w.size;
        let etag = (!w.etag.is_empty()).then(|| w.etag.clone());
        // Every GET is conditional on the archived ETag and checks the object's size: the
        // object must be the one archived, whole.
        let get = |range: Option<std::ops::Range<u64>>| {
            let etag = etag.clone();
            async move {
                let opts = GetOptions {
                    range: range.map(Into::into),
                    if_match: etag.clone(),
                    ..Default::default()
                };
                let r = store.get_opts(path, opts).await.map_err(|e| match e {
                    object_store::Error::Precondition { .. } => CopyError::Changed(format!(
                        "{}: the object changed since it was archived (its ETag is no longer {})",
                        w.key,
                        etag.as_deref().unwrap_or("")
                    )),
                    e => e.into(),
                })?;
                if r.meta.size != size {
                    return Err(CopyError::Changed(format!(
                        "{}: the object holds {} bytes, not the archived {size}",
                        w.key, r.meta.size
                    )));
                }
                Ok::<_, CopyError>(r.bytes().await?)
            }
        };
        if size == 0 {
            get(None).await?;
        }
        let pieces = (0..size).step_by(part as usize).map(|at| {
            let n = part.min(size - at);
            let get = &get;
            async move {
                let bytes = get(Some(at..at + n)).await?;
                if bytes.len() as u64 != n {
                    return Err(CopyError::Changed(format!(
                        "{}: {} bytes at {at}, {n} asked",
                        w.key,
                        bytes.len()
                    )));
                }
                f.write_copy(0, at, bytes.to_vec()).await?;
                Ok::<_, CopyError>(at + n)
            }
        });
        // In order: each end reported is the end of every byte before it.
        let mut landed = futures_util::stream::iter(pieces).buffered(self.cfg.streams.max(1));
        let mut told = std::time::Instant::now();
        while let Some(end) = landed.try_next().await? {
            if told.elapsed() >= Duration::from_millis(50) || end == size {
                tracing::debug!(fid = %w.fid, end, ms = started.elapsed().as_secs_f64() * 1e3, "landed");
                self.client.hsm_progress(self.id, w, end).await?;
                told = std::time::Instant::now();
            }
        }
        drop(landed);
        f.finish_copy(0, size).await?;
        tracing::debug!(fid = %w.fid, ms = started.elapsed().as_secs_f64() * 1e3, "synced");
        Ok(Finished {
            etag: w.etag.clone(),
            size,
            mtime: Time::default(),
            handle: f.open_handle(),
            generation,
        })
    }

    /// Takes and carries out imports until dropped.
    async fn imports(self: Arc<Self>) {
        loop {
            let link = match self.client.hsm_take_import(self.id).await {
                Ok(Some(w)) => w.link,
                Ok(None) => {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not take an import from the MDS");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            let started = std::time::Instant::now();
            if let Some(m) = &self.metrics {
                m.started("import");
            }
            let result = self.import(&link).await;
            if let Some(m) = &self.metrics {
                m.ended("import", result.as_ref().ok().map(|_| 0));
                if let Ok(n) = &result {
                    m.imported(*n);
                }
            }
            let report = match &result {
                Ok(n) => {
                    tracing::info!(dir = %link.path, archive = %link.url(), names = n, secs = started.elapsed().as_secs_f64(), "imported");
                    Ok(*n)
                }
                Err(e) => {
                    tracing::warn!(dir = %link.path, error = %e, "import failed");
                    Err(e.to_string())
                }
            };
            if let Err(e) = self.client.hsm_import_done(self.id, link.id, report).await {
                tracing::warn!(error = %e, "the MDS did not take the import's report");
            }
        }
    }

    /// Names every object under `link`'s prefix; how many names were made.
    pub async fn import(&self, link: &Link) -> Result<u64> {
        let store = self.stores.of(link)?;
        let prefix = (!link.prefix.is_empty()).then(|| Path::from(link.prefix.as_str()));
        let top = self.client.stat(&link.path).await?;
        let owner = self.client.as_user(Creds {
            uid: top.uid,
            gid: top.gid,
            groups: vec![],
        });
        let mut made_dirs: HashSet<String> = HashSet::new();
        let mut batches: HashMap<String, Vec<Imported>> = HashMap::new();
        let mut made = 0u64;
        let mut seen: HashSet<String> = HashSet::new();
        let mut listed = store.list(prefix.as_ref());
        while let Some(meta) = listed.next().await {
            let meta = meta?;
            let key = meta.location.as_ref().to_string();
            if link.import.deleted {
                seen.insert(key.clone());
            }
            let rel = match &prefix {
                Some(p) => match key.strip_prefix(p.as_ref()) {
                    Some(r) => r.trim_start_matches('/').to_string(),
                    None => continue,
                },
                None => key.clone(),
            };
            let Some((dir, name)) = split(&rel) else {
                continue;
            };
            let valid = proto::rules::check_name(name.as_bytes()).is_ok()
                && dir
                    .split('/')
                    .filter(|d| !d.is_empty())
                    .all(|d| proto::rules::check_name(d.as_bytes()).is_ok());
            if !valid {
                tracing::warn!(%key, "an object whose key is no lode path: not imported");
                continue;
            }
            let ts = meta.last_modified;
            let entry = Imported {
                name: name.as_bytes().to_vec(),
                size: meta.size,
                mtime: Time {
                    sec: ts.timestamp(),
                    nsec: ts.timestamp_subsec_nanos().min(999_999_999),
                },
                key,
                etag: meta.e_tag.unwrap_or_default(),
            };
            let batch = batches.entry(dir.to_string()).or_default();
            batch.push(entry);
            if batch.len() >= MAX_IMPORT {
                let entries = std::mem::take(batch);
                made += self
                    .name_in(link, &owner, dir, entries, &mut made_dirs)
                    .await?;
            }
        }
        for (dir, entries) in batches {
            if !entries.is_empty() {
                made += self
                    .name_in(link, &owner, &dir, entries, &mut made_dirs)
                    .await?;
            }
        }
        if link.import.deleted {
            let gone = self.remove_deleted(link, &seen).await?;
            tracing::info!(dir = %link.path, removed = gone, "objects deleted from the archive");
        }
        Ok(made)
    }

    /// Removes the released files of `link` whose objects are no longer listed (`--import
    /// deleted`): only released ones, unchanged and with no action under way, whose bytes are
    /// in the archive alone; a file with bytes in lode stays. How many were removed.
    async fn remove_deleted(&self, link: &Link, seen: &HashSet<String>) -> Result<u64> {
        let mut gone = 0;
        let mut todo = vec![link.path.trim_end_matches('/').to_string()];
        while let Some(dir) = todo.pop() {
            let fid = self.client.resolve(&dir, true).await?.fid;
            for e in self.client.readdir_fid(fid).await? {
                let name = String::from_utf8_lossy(&e.name).into_owned();
                if name == "." || name == ".." {
                    continue;
                }
                let path = format!("{dir}/{name}");
                match e.kind {
                    proto::md::Kind::Dir => todo.push(path),
                    proto::md::Kind::File => {
                        let Some(s) = self.client.hsm_state(e.fid).await? else {
                            continue;
                        };
                        let stale = s.link == link.id
                            && s.released
                            && !s.dirty
                            && s.action.is_none()
                            && !seen.contains(&s.key);
                        if stale {
                            match self.client.unlink(&path).await {
                                Ok(()) => gone += 1,
                                Err(e) => tracing::warn!(%path, error = %e, "not removed"),
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok(gone)
    }

    async fn name_in(
        &self,
        link: &Link,
        owner: &Client,
        dir: &str,
        entries: Vec<Imported>,
        made_dirs: &mut HashSet<String>,
    ) -> Result<u64> {
        let path = if dir.is_empty() {
            link.path.clone()
        } else {
            format!("{}/{dir}", link.path.trim_end_matches('/'))
        };
        if !dir.is_empty() && made_dirs.insert(path.clone()) {
            owner.mkdir_all(&path, 0o755).await?;
        }
        let parent = self.client.resolve(&path, true).await?.fid;
        let (made, _skipped) = self.client.hsm_import(link.id, parent, entries).await?;
        Ok(made as u64)
    }
}

/// A key below a prefix as (directory, name); none for a directory marker (`a/b/`).
fn split(rel: &str) -> Option<(&str, &str)> {
    if rel.is_empty() || rel.ends_with('/') {
        return None;
    }
    Some(match rel.rsplit_once('/') {
        Some((d, n)) => (d, n),
        None => ("", rel),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_split_into_a_directory_and_a_name() {
        assert_eq!(split("a/b/c.bin"), Some(("a/b", "c.bin")));
        assert_eq!(split("c.bin"), Some(("", "c.bin")));
        assert_eq!(split("a/b/"), None);
        assert_eq!(split(""), None);
    }
}
