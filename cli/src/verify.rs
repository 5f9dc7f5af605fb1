//! `lode verify PATH`: checks a checkpoint against its manifest, reading straight from the
//! storage servers: a file saved by `lode.torch.save` (the SHA-256 of every tensor and of the
//! skeleton), or a directory saved by `lode.torch.dcp.Writer` (the SHA-256 of every piece of
//! every shard, and of DCP's metadata, from `.lode-manifest.json`).

use anyhow::{bail, Context, Result};
use aws_lc_rs::digest;
use client::{Client, OpenOptions};

const MAGIC: &[u8; 8] = b"LODECKPT";
const HEAD: usize = 24;
const CHUNK: u64 = 16 << 20;

struct Entry {
    what: String,
    offset: u64,
    nbytes: u64,
    sha256: String,
}

fn entry(v: &serde_json::Value, what: String) -> Result<Entry> {
    let field = |k: &str| {
        v.get(k)
            .with_context(|| format!("{what}: no {k:?} in the manifest"))
    };
    Ok(Entry {
        offset: field("offset")?.as_u64().context("offset")?,
        nbytes: field("nbytes")?.as_u64().context("nbytes")?,
        sha256: field("sha256")?.as_str().context("sha256")?.to_owned(),
        what,
    })
}

pub async fn run(client: &Client, path: &str) -> Result<()> {
    if client.stat(path).await?.kind == proto::md::Kind::Dir {
        return run_dcp(client, path).await;
    }
    let f = OpenOptions::new().read(true).open(client, path).await?;
    let mut head = [0u8; HEAD];
    if f.read_at(0, &mut head).await? < HEAD || &head[..8] != MAGIC {
        bail!("{path}: not a lode checkpoint (no manifest)");
    }
    let version = u32::from_le_bytes(head[8..12].try_into()?);
    if version != 1 {
        bail!("{path}: checkpoint version {version}; this lode reads version 1");
    }
    let len = u64::from_le_bytes(head[16..24].try_into()?);
    if len > 1 << 30 {
        bail!("{path}: a header of {len} bytes");
    }
    let mut text = vec![0u8; len as usize];
    if f.read_at(HEAD as u64, &mut text).await? < text.len() {
        bail!("{path}: the header is cut short");
    }
    let header: serde_json::Value =
        serde_json::from_slice(&text).with_context(|| format!("{path}: the header is damaged"))?;
    let mut entries = vec![entry(&header["skeleton"], "the skeleton".into())?];
    let tensors = header["tensors"]
        .as_array()
        .with_context(|| format!("{path}: the manifest lists no tensors"))?;
    for t in tensors {
        let name = t["name"].as_str().unwrap_or("?");
        entries.push(entry(t, format!("tensor {name:?}"))?);
    }
    let total: u64 = entries.iter().map(|e| e.nbytes).sum();
    let bar = progress(total);
    let mut buf = vec![0u8; CHUNK.min(total.max(1)) as usize];
    let mut damaged = 0;
    for e in &entries {
        let mut ctx = digest::Context::new(&digest::SHA256);
        let mut at = 0;
        while at < e.nbytes {
            let n = CHUNK.min(e.nbytes - at) as usize;
            let got = f.read_at(e.offset + at, &mut buf[..n]).await?;
            ctx.update(&buf[..got]);
            at += got as u64;
            bar.inc(got as u64);
            if got < n {
                break;
            }
        }
        if at != e.nbytes || hex(ctx.finish()) != e.sha256 {
            damaged += 1;
            bar.suspend(|| {
                eprintln!(
                    "lode verify: {path}: {} is damaged: its SHA-256 does not match the manifest",
                    e.what
                )
            });
        }
    }
    bar.finish_and_clear();
    f.close().await?;
    if damaged > 0 {
        bail!("{path}: {damaged} of {} parts damaged", entries.len());
    }
    out!(
        "{path}: {} tensors, {total} bytes: every digest matches the manifest",
        tensors.len()
    );
    Ok(())
}

/// One stored range of a DCP checkpoint and the digests of its pieces.
struct Shard {
    what: String,
    file: String,
    offset: u64,
    length: u64,
    sha256: Vec<String>,
}

fn shard(v: &serde_json::Value, what: String) -> Result<Shard> {
    let field = |k: &str| {
        v.get(k)
            .with_context(|| format!("{what}: no {k:?} in the manifest"))
    };
    let sha256 = field("sha256")?
        .as_array()
        .context("sha256")?
        .iter()
        .map(|d| d.as_str().map(str::to_owned).context("sha256"))
        .collect::<Result<Vec<_>>>()?;
    let file = field("file")?.as_str().context("file")?.to_owned();
    if file.contains('/') || file == ".." || file.is_empty() {
        bail!("{what}: the manifest names {file:?}, outside the checkpoint");
    }
    Ok(Shard {
        file,
        offset: v.get("offset").and_then(|o| o.as_u64()).unwrap_or(0),
        length: field("length")?.as_u64().context("length")?,
        sha256,
        what,
    })
}

fn hex(d: digest::Digest) -> String {
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes checked so far, on a terminal.
fn progress(total: u64) -> indicatif::ProgressBar {
    indicatif::ProgressBar::new(total).with_style(
        indicatif::ProgressStyle::with_template("{bytes}/{total_bytes} {bar:40} {bytes_per_sec}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    )
}

/// A directory written by `lode.torch.dcp.Writer`: every piece of every shard and DCP's
/// metadata checked against `.lode-manifest.json`.
async fn run_dcp(client: &Client, path: &str) -> Result<()> {
    let dir = path.trim_end_matches('/');
    let manifest_path = format!("{dir}/.lode-manifest.json");
    let mf = match OpenOptions::new()
        .read(true)
        .open(client, &manifest_path)
        .await
    {
        Ok(f) => f,
        Err(e) if e.errno() == libc::ENOENT => {
            bail!("{path}: not a lode DCP checkpoint (no .lode-manifest.json)")
        }
        Err(e) => return Err(e.into()),
    };
    let size = mf.size().await?;
    if size > 1 << 30 {
        bail!("{path}: a manifest of {size} bytes");
    }
    let mut text = vec![0u8; size as usize];
    let got = mf.read_at(0, &mut text).await?;
    text.truncate(got);
    mf.close().await?;
    let manifest: serde_json::Value = serde_json::from_slice(&text)
        .with_context(|| format!("{path}: the manifest is damaged"))?;
    if manifest["format"] != "lode-dcp" || manifest["version"] != 1 {
        bail!("{path}: not a lode DCP checkpoint of version 1");
    }
    let piece = manifest["piece"]
        .as_u64()
        .filter(|p| *p > 0 && *p <= 1 << 30)
        .with_context(|| format!("{path}: the manifest gives no sound piece size"))?;
    let mut shards = vec![shard(&manifest["metadata"], "DCP's metadata".into())?];
    let listed = manifest["shards"]
        .as_array()
        .with_context(|| format!("{path}: the manifest lists no shards"))?;
    for s in listed {
        let name = s["name"].as_str().unwrap_or("?");
        shards.push(shard(s, format!("tensor {name:?}"))?);
    }
    let total: u64 = shards.iter().map(|s| s.length).sum();
    let bar = progress(total);
    let mut buf = vec![0u8; piece.min(total.max(1)) as usize];
    let mut files = std::collections::HashMap::new();
    let mut damaged = 0;
    for s in &shards {
        if !files.contains_key(&s.file) {
            let f = OpenOptions::new()
                .read(true)
                .open(client, &format!("{dir}/{}", s.file))
                .await
                .with_context(|| format!("{path}: {}: {}", s.what, s.file))?;
            files.insert(s.file.clone(), f);
        }
        let f = &files[&s.file];
        let pieces = s.length.div_ceil(piece).max(1);
        let mut bad = pieces != s.sha256.len() as u64;
        for k in 0..pieces.min(s.sha256.len() as u64) {
            let at = k * piece;
            let n = piece.min(s.length - at) as usize;
            let got = match f.read_at(s.offset + at, &mut buf[..n]).await {
                Ok(got) => got,
                Err(e) => {
                    bar.suspend(|| eprintln!("lode verify: {path}: {}: {e}", s.what));
                    bad = true;
                    break;
                }
            };
            bar.inc(got as u64);
            if got < n || hex(digest::digest(&digest::SHA256, &buf[..n])) != s.sha256[k as usize] {
                bad = true;
                break;
            }
        }
        if bad {
            damaged += 1;
            bar.suspend(|| {
                eprintln!(
                    "lode verify: {path}: {} is damaged ({} at byte {}): its SHA-256 does not match the manifest",
                    s.what, s.file, s.offset
                )
            });
        }
    }
    bar.finish_and_clear();
    for (_, f) in files {
        f.close().await?;
    }
    if damaged > 0 {
        bail!("{path}: {damaged} of {} parts damaged", shards.len());
    }
    out!(
        "{path}: a DCP checkpoint of {} shards, {total} bytes: every digest matches the manifest",
        shards.len() - 1
    );
    Ok(())
}
