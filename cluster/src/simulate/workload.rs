//! The workload: checkpoints written, fsynced and renamed into place, files written at random
//! offsets, truncates, unlinks, and bursts of creates answered ahead; what each client was told is
//! recorded in the model the checks hold the cluster to.

use super::*;

impl Sim {
    pub(super) async fn operation(&mut self) -> Result<(), Failure> {
        let slot = self.rng.gen_range(0..2);
        let c = self.clients[slot].clone();
        let k = self.rng.gen_range(0..NAMES);
        if self.rng.gen_bool(0.1) {
            self.hold(slot, k).await;
        }
        if self.rng.gen_bool(0.1) {
            self.check_held().await?;
        }
        if self.rng.gen_bool(0.05) {
            let count = self.rng.gen_range(1..=600);
            return self.burst(slot, count).await;
        }
        match self.rng.gen_range(0..10) {
            0..=3 => {
                let data = self.bytes(MAX_BYTES);
                let chunk = self.rng.gen_range(1..=64) << 10;
                self.checkpoint(slot, k, data, chunk).await
            }
            4..=6 => {
                let data = self.bytes(64 << 10);
                let offset = self.rng.gen_range(0..MAX_BYTES as u64);
                self.write_file(&c, k, offset, data).await
            }
            7 => {
                let size = self.rng.gen_range(0..MAX_BYTES as u64);
                self.truncate_file(slot, k, size).await
            }
            8 => {
                let name = format!("/ck{k}");
                let done = c.unlink(&name).await;
                let versions = self
                    .model
                    .checkpoints
                    .entry(name.clone())
                    .or_insert(vec![None]);
                match done {
                    Ok(()) => {
                        let before = std::mem::replace(versions, vec![None]);
                        self.model.uncertain.push(Uncertain {
                            client: slot,
                            undo: Undo::Checkpoint { name, before },
                        });
                    }
                    Err(_) => {
                        self.report.refused += 1;
                        versions.push(None);
                    }
                }
                Ok(())
            }
            _ => {
                let name = file_name(k);
                match c.unlink(&name).await {
                    Ok(()) => {
                        if let Some(bytes) = self.model.files.remove(&name) {
                            self.model.uncertain.push(Uncertain {
                                client: slot,
                                undo: Undo::Unlinked {
                                    name,
                                    len: bytes.len(),
                                },
                            });
                        }
                    }
                    Err(e) if e.is(proto::FsErrorKind::NotFound) => {}
                    Err(_) => {
                        // Removed or not: nothing about it is promised any more.
                        self.report.refused += 1;
                        self.model.files.insert(name, vec![]);
                    }
                }
                Ok(())
            }
        }
    }

    /// Creates `count` files of names never used, answered ahead where the client may, then
    /// removes them; a change carried out twice shows as a name found there, or found gone.
    pub(super) async fn burst(&mut self, slot: usize, count: usize) -> Result<(), Failure> {
        let c = self.clients[slot].clone();
        let dir = format!("/u{slot}");
        // The second client's bursts go to a directory striped over both MDTs.
        let made = if slot == 1 {
            c.mkdir_striped(&dir, 0o755, 2, None, proto::dirstripe::HashType::Fnv1a64)
                .await
        } else {
            c.mkdir(&dir, 0o755).await
        };
        match made {
            Ok(_) => {}
            Err(e) if e.is(proto::FsErrorKind::Exists) => {}
            Err(_) => {
                self.report.refused += 1;
                return Ok(());
            }
        }
        let first = self.unique;
        self.unique += count as u64;
        let mut made = vec![];
        let mut failed = false;
        for n in first..first + count as u64 {
            let path = format!("{dir}/n{n}");
            let opened = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&c, &path)
                .await;
            match opened {
                Ok(f) => {
                    let _ = f.close().await;
                    made.push(path);
                }
                Err(e) if e.is(proto::FsErrorKind::Exists) => {
                    return Err(self.fail(format!(
                        "{path}, a name never used, exists: a create was carried out twice ({e})"
                    )))
                }
                Err(_) => failed = true,
            }
        }
        match c.settle_ahead().await {
            Ok(()) => {}
            Err(e) if e.is(proto::FsErrorKind::Exists) => {
                return Err(self.fail(format!(
                    "a create answered ahead, of a name never used, failed with EEXIST: carried out twice ({e})"
                )))
            }
            Err(_) => failed = true,
        }
        for path in &made {
            match c.unlink(path).await {
                Ok(()) => {}
                Err(e) if e.is(proto::FsErrorKind::NotFound) && !failed => {
                    return Err(self.fail(format!(
                        "{path}, created and acknowledged, was gone before its removal: a change was carried out twice ({e})"
                    )))
                }
                Err(_) => failed = true,
            }
        }
        match c.settle_ahead().await {
            Ok(()) => {}
            Err(e) if e.is(proto::FsErrorKind::NotFound) && !failed => {
                return Err(self.fail(format!(
                    "a removal answered ahead found its file gone: carried out twice ({e})"
                )))
            }
            Err(_) => failed = true,
        }
        if failed {
            self.report.refused += 1;
        }
        Ok(())
    }

    /// Writes a whole new version under a temporary name, fsyncs it and renames it into place.
    pub(super) async fn checkpoint(
        &mut self,
        slot: usize,
        k: u32,
        data: Vec<u8>,
        chunk: usize,
    ) -> Result<(), Failure> {
        let c = &self.clients[slot].clone();
        // Every third checkpoint is written on MDT1 and renamed into place on MDT0: a rename
        // across MDTs, which MDT1 coordinates while MDT0 crashes.
        let tmp = if k % 3 == 2 {
            format!("{}/ck{k}.tmp", super::MDT1_DIR)
        } else {
            format!("/ck{k}.tmp")
        };
        let name = format!("/ck{k}");
        let written = async {
            let mut o = OpenOptions::new().write(true).create(true).truncate(true);
            if k % 2 == 1 {
                // Odd checkpoints keep a copy on each storage server.
                o = o.layout(mirrored()?);
            }
            let f = o.open(c, &tmp).await?;
            for (i, piece) in data.chunks(chunk).enumerate() {
                f.write_at((i * chunk) as u64, piece).await?;
            }
            f.fsync().await?;
            f.close().await
        }
        .await;
        if let Err(e) = written {
            self.note(|| format!("checkpoint {tmp}: {} bytes not written: {e}", data.len()));
            self.last_error = e.to_string();
            self.report.refused += 1;
            return Ok(()); // a checkpointer gives up on a version it could not make durable
        }
        let renamed = c.rename(&tmp, &name).await;
        self.note(|| {
            format!(
                "checkpoint {name} (client {slot}): {} bytes written, rename {:?}",
                data.len(),
                renamed.as_ref().map_err(|e| e.to_string())
            )
        });
        let versions = self
            .model
            .checkpoints
            .entry(name.clone())
            .or_insert(vec![None]);
        match renamed {
            Ok(()) => {
                let before = std::mem::replace(versions, vec![Some(data)]);
                self.model.uncertain.push(Uncertain {
                    client: slot,
                    undo: Undo::Checkpoint { name, before },
                });
            }
            Err(e) => {
                self.last_error = e.to_string();
                self.report.refused += 1;
                versions.push(Some(data));
            }
        }
        Ok(())
    }

    /// A reader opens checkpoint `k` and keeps it open (at most two at once).
    pub(super) async fn hold(&mut self, slot: usize, k: u32) {
        let c = &self.clients[slot].clone();
        if self.held.len() >= 2 {
            let (f, ..) = self.held.remove(0);
            let _ = f.close().await;
        }
        let name = format!("/ck{k}");
        let Ok(f) = OpenOptions::new().read(true).open(c, &name).await else {
            return;
        };
        match read_all(&f).await {
            Ok(bytes) => self.held.push((f, slot, name, bytes)),
            Err(e) => {
                self.last_error = e;
                self.report.refused += 1;
            }
        }
    }

    pub(super) async fn write_file(
        &mut self,
        c: &Client,
        k: u32,
        offset: u64,
        data: Vec<u8>,
    ) -> Result<(), Failure> {
        let name = file_name(k);
        let done = async {
            let f = OpenOptions::new()
                .write(true)
                .create(true)
                .open(c, &name)
                .await?;
            f.write_at(offset, &data).await?;
            f.fsync().await?;
            f.close().await
        }
        .await;
        let bytes = self.model.files.entry(name).or_default();
        let end = offset as usize + data.len();
        if bytes.len() < end {
            bytes.resize(end, None);
        }
        let range = &mut bytes[offset as usize..end];
        match done {
            Ok(()) => {
                for (b, d) in range.iter_mut().zip(&data) {
                    *b = Some(*d);
                }
            }
            Err(_) => {
                self.report.refused += 1;
                range.fill(None);
            }
        }
        Ok(())
    }

    pub(super) async fn truncate_file(
        &mut self,
        slot: usize,
        k: u32,
        size: u64,
    ) -> Result<(), Failure> {
        let c = &self.clients[slot].clone();
        let name = file_name(k);
        if !self.model.files.contains_key(&name) {
            return Ok(());
        }
        let done = async {
            let f = OpenOptions::new().write(true).open(c, &name).await?;
            f.set_len(size).await?;
            f.close().await
        }
        .await;
        let bytes = self.model.files.entry(name.clone()).or_default();
        match done {
            Ok(()) => {
                let len = bytes.len() as u64;
                bytes.resize(size as usize, Some(0));
                self.model.uncertain.push(Uncertain {
                    client: slot,
                    undo: Undo::Truncate {
                        name,
                        from: len.min(size),
                        to: len.max(size),
                    },
                });
            }
            Err(_) => {
                self.report.refused += 1;
                // Cut or not: the bytes past `size` are no longer promised.
                let keep = bytes.len().min(size as usize);
                bytes[keep..].fill(None);
            }
        }
        Ok(())
    }

    pub(super) fn bytes(&mut self, max: usize) -> Vec<u8> {
        let len = self.rng.gen_range(0..=max);
        let mut v = vec![0u8; len];
        self.rng.fill(&mut v[..]);
        v
    }

    /// The fabric name of the client in `slot` now.
    pub(super) fn client_name(&self, slot: usize) -> String {
        self.names[slot].clone()
    }

    /// A new client: while the MDS waits for the clients of its last run, connecting is
    /// refused for a while.
    pub(super) async fn connect(
        &mut self,
        name: &str,
        cfg: ClientConfig,
    ) -> Result<Client, Failure> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            match self.cluster.client(name, cfg.clone()).await {
                Ok(c) => return Ok(c),
                Err(e) if tokio::time::Instant::now() > deadline => {
                    return Err(self.fail(format!("client {name} cannot connect: {e}")))
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }
}
