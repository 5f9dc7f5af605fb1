//! `lode hsm`: data repository links to S3, and files' archive, release, restore and state
//! (Lustre's `lfs hsm_*`, FSx for Lustre's data repository associations).

use std::time::Duration;

use anyhow::Result;
use clap::Subcommand;
use client::Client;
use proto::hsm::{HsmReply, Policy};

#[derive(Subcommand)]
pub enum HsmCmd {
    /// Link a directory to an S3 bucket and prefix; its names are imported (administrators).
    Link {
        dir: String,
        /// s3://BUCKET[/PREFIX]
        url: String,
        /// An S3-compatible endpoint (http://HOST:PORT); default AWS's.
        #[arg(long)]
        endpoint: Option<String>,
        #[arg(long)]
        region: Option<String>,
        /// Which of the archive's changes are brought in: new, changed, deleted, or none.
        #[arg(long, default_value = "new,changed")]
        import: String,
        /// Which of lode's changes are archived on their own: new, changed, deleted, or none.
        #[arg(long, default_value = "none")]
        export: String,
    },
    /// The links.
    Links,
    /// Remove a directory's link (its files keep their state; released ones cannot be restored
    /// until it is linked again).
    Unlink { dir: String },
    /// Import a link's names again.
    Import { dir: String },
    /// Copy files to their archive (in the background; --wait for it).
    Archive {
        #[arg(long)]
        wait: bool,
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Free the storage servers' space of archived, unchanged, closed files.
    Release {
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Bring released files' bytes back from their archive.
    Restore {
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Each file's state, in Lustre's words, with its object's key and ETag.
    State {
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// What the MDS has queued and under way.
    Status,
}

impl HsmCmd {
    /// Whether the command is an administrator's (it acts as one with the cluster key).
    pub fn admin(&self) -> bool {
        matches!(
            self,
            HsmCmd::Link { .. } | HsmCmd::Unlink { .. } | HsmCmd::Import { .. }
        )
    }
}

fn policy(s: &str) -> Result<Policy> {
    Policy::parse(s).map_err(|e| anyhow::anyhow!(e))
}

/// Runs each path through `f`, printing `lode: hsm VERB: PATH: ERROR` for those that fail.
async fn each<F, Fut>(verb: &str, paths: &[String], mut f: F) -> Result<()>
where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let mut failed = 0;
    for p in paths {
        if let Err(e) = f(p.clone()).await {
            eprintln!("lode: hsm {verb}: {p}: {e}");
            failed += 1;
        }
    }
    if failed > 0 {
        anyhow::bail!("{failed} of {} files not done", paths.len());
    }
    Ok(())
}

pub async fn run(client: &Client, cmd: HsmCmd) -> Result<()> {
    match cmd {
        HsmCmd::Link {
            dir,
            url,
            endpoint,
            region,
            import,
            export,
        } => {
            let l = client
                .hsm_link(
                    &dir,
                    &url,
                    endpoint,
                    region,
                    policy(&import)?,
                    policy(&export)?,
                )
                .await?;
            out!(
                "{} -> {} (link {}, import {}, export {}){}",
                l.path,
                l.url(),
                l.id,
                l.import,
                l.export,
                if l.importing { "; importing" } else { "" }
            );
            Ok(())
        }
        HsmCmd::Links => {
            for l in client.hsm_links().await? {
                let at = l.endpoint.as_deref().unwrap_or("aws");
                out!(
                    "{}\t{}\tid={} endpoint={at} import={} export={}{}",
                    l.path,
                    l.url(),
                    l.id,
                    l.import,
                    l.export,
                    if l.importing { " importing" } else { "" }
                );
            }
            Ok(())
        }
        HsmCmd::Unlink { dir } => Ok(client.hsm_unlink(&dir).await?),
        HsmCmd::Import { dir } => Ok(client.hsm_import_again(&dir).await?),
        HsmCmd::Archive { wait, paths } => {
            each("archive", &paths, |p| async move {
                client.hsm_archive(&p).await?;
                if wait {
                    let fid = client.stat(&p).await?.fid;
                    loop {
                        let s = client.hsm_state(fid).await?.unwrap_or_default();
                        if s.action.is_none() {
                            if s.archived && !s.dirty {
                                break;
                            }
                            anyhow::bail!("not archived ({}); see lode hsm status", s.words());
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
                Ok(())
            })
            .await
        }
        HsmCmd::Release { paths } => {
            each("release", &paths, |p| async move {
                client.hsm_release(&p).await?;
                Ok(())
            })
            .await
        }
        HsmCmd::Restore { paths } => {
            each("restore", &paths, |p| async move {
                let fid = client.stat(&p).await?.fid;
                let bar = indicatif::ProgressBar::new(0).with_style(
                    indicatif::ProgressStyle::with_template(
                        "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
                    )
                    .expect("a valid template"),
                );
                bar.set_message(p.clone());
                let done = client
                    .hsm_restore(fid, |at, total| {
                        bar.set_length(total);
                        bar.set_position(at.min(total));
                    })
                    .await;
                bar.finish_and_clear();
                done?;
                Ok(())
            })
            .await
        }
        HsmCmd::State { paths } => {
            each("state", &paths, |p| async move {
                let fid = client.stat(&p).await?.fid;
                match client.hsm_state(fid).await? {
                    None => out!("{p}: (0x00000000)"),
                    Some(s) => {
                        let flags = 1
                            | u32::from(s.dirty) << 1
                            | u32::from(s.released) << 2
                            | u32::from(s.archived) << 3
                            | u32::from(s.lost) << 5;
                        out!(
                            "{p}: (0x{flags:08x}) {}, archive_id:{}\n  key: {}\n  etag: {}",
                            s.words(),
                            s.link,
                            s.key,
                            s.etag
                        );
                    }
                }
                Ok(())
            })
            .await
        }
        HsmCmd::Status => {
            let HsmReply::Status {
                actions,
                imports,
                archived,
                restored,
                failed,
            } = client.hsm_status().await?
            else {
                anyhow::bail!("the MDS answered the status with something else");
            };
            out!(
                "archived {archived}, restored {restored}, failed {failed} (since the MDS started)"
            );
            for (link, what) in imports {
                out!("import of link {link}: {what}");
            }
            for a in actions {
                out!(
                    "{:016x} {:?} {} {} landed={} attempts={}{}",
                    a.id,
                    a.kind,
                    a.fid,
                    if a.running { "running" } else { "waiting" },
                    a.landed,
                    a.attempts,
                    a.last_error
                        .map(|e| format!(" last error: {e}"))
                        .unwrap_or_default()
                );
            }
            Ok(())
        }
    }
}
