//! `lode verify PATH`: checks a checkpoint saved by `lode.torch.save` against its manifest:
//! the SHA-256 of every tensor and of the skeleton, read straight from the storage servers.

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
    let bar = indicatif::ProgressBar::new(total).with_style(
        indicatif::ProgressStyle::with_template("{bytes}/{total_bytes} {bar:40} {bytes_per_sec}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
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
        let hex: String = ctx
            .finish()
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        if at != e.nbytes || hex != e.sha256 {
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
