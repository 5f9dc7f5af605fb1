//! Invariant: every acknowledged byte reads back exactly (a checkpoint whose rename was
//! acknowledged holds one whole version; fsynced ranges), never as zeros; the copies of a
//! mirrored checkpoint its layout calls in sync hold the same bytes.

use super::*;

impl Sim {
    /// Every acknowledged byte is there, exactly; checkpoint names hold one whole version.
    pub(super) async fn check_contents(&mut self) -> Result<(), Failure> {
        self.check_held().await?;
        for (f, ..) in self.held.drain(..) {
            let _ = f.close().await;
        }
        let c = self.clients[1].clone();
        for (name, versions) in &self.model.checkpoints {
            let got = read_whole(&c, name).await.map_err(|e| self.fail(e))?;
            if !versions.contains(&got) {
                return Err(self.fail(format!(
                    "{name} holds {} ({} bytes) where the acknowledged version(s) are {}",
                    describe(&got),
                    got.as_ref().map_or(0, Vec::len),
                    versions
                        .iter()
                        .map(describe)
                        .collect::<Vec<_>>()
                        .join(" or ")
                )));
            }
        }
        // Copies a mirrored file's layout calls in sync hold the same bytes.
        for name in self.model.checkpoints.keys() {
            let Ok(f) = OpenOptions::new().read(true).open(&c, name).await else {
                continue;
            };
            let layout = c.getstripe(name).await.ok().flatten();
            if let Some(l) = layout.filter(|l| l.mirror_count() > 1 && l.stale_mirrors().is_empty())
            {
                let size = f
                    .size()
                    .await
                    .map_err(|e| self.fail(format!("{name}: {e}")))?;
                let a = f.read_copy(0, 0, size).await;
                let b = f.read_copy(1, 0, size).await;
                match (a, b) {
                    (Ok(a), Ok(b)) if a == b => {}
                    (Ok(_), Ok(_)) => {
                        return Err(self.fail(format!(
                            "{name}: its two copies differ while its layout (generation {}) calls both in sync",
                            l.generation
                        )))
                    }
                    (a, b) => {
                        return Err(self.fail(format!(
                            "{name}: a copy in sync cannot be read whole: {:?} / {:?}",
                            a.err().map(|e| e.to_string()),
                            b.err().map(|e| e.to_string())
                        )))
                    }
                }
            }
            let _ = f.close().await;
        }
        for (name, bytes) in &self.model.files {
            if bytes.iter().all(Option::is_none) {
                continue;
            }
            let got = read_whole(&c, name)
                .await
                .map_err(|e| self.fail(e))?
                .ok_or_else(|| self.fail(format!("{name} was acknowledged and is gone")))?;
            for (at, want) in bytes.iter().enumerate() {
                let Some(want) = want else { continue };
                if got.get(at) != Some(want) {
                    return Err(self.fail(format!(
                        "{name}: byte {at} reads {:?}, acknowledged {want} (file of {} bytes)",
                        got.get(at),
                        got.len()
                    )));
                }
            }
        }
        Ok(())
    }
}
