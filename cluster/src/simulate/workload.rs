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
        if self.rng.gen_bool(0.05) {
            return self.tree(slot, k).await;
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

    /// A job's tree: a directory striped over both MDTs, or on MDT1, or on MDT0 with a default
    /// that stripes its subdirectories, made, filled with subdirectories and files, read
    /// back, one file linked into another subdirectory, one subdirectory moved into another,
    /// emptied and removed. A crash between operations leaves it as it was, and the next
    /// tree of the same name removes what is left first; every step that succeeded is seen, and
    /// the namespaces stay whole across MDTs (checked with fsck).
    pub(super) async fn tree(&mut self, slot: usize, k: u32) -> Result<(), Failure> {
        let c = self.clients[slot].clone();
        let top = format!("/t{k}");
        if let Err(e) = remove_tree(&c, &top).await {
            self.note(|| format!("tree {top}: what was left not removed: {e}"));
            self.report.refused += 1;
            return Ok(());
        }
        let hash = proto::dirstripe::HashType::Fnv1a64;
        let made = match k % 3 {
            0 => c
                .mkdir_striped(&top, 0o755, 2, None, hash)
                .await
                .map(|_| ()),
            1 => c.mkdir_on(&top, 0o755, 1).await.map(|_| ()),
            _ => {
                let d = proto::dirstripe::DirDefault {
                    count: 2,
                    offset: None,
                    hash: hash.code(),
                    inherit: 0,
                };
                match c.mkdir_on(&top, 0o755, 0).await {
                    Ok(_) => c.set_dir_default(&top, Some(d)).await,
                    Err(e) => Err(e),
                }
            }
        };
        if let Err(e) = made {
            self.note(|| format!("tree {top}: not made: {e}"));
            self.report.refused += 1;
            return Ok(());
        }
        let mut want = BTreeSet::new();
        for i in 0..3 {
            let sub = format!("{top}/s{i}");
            let file = format!("{sub}/f");
            let done = async {
                c.mkdir(&sub, 0o755).await?;
                let f = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&c, &file)
                    .await?;
                f.write_at(0, file.as_bytes()).await?;
                f.close().await
            }
            .await;
            match done {
                Ok(()) => {
                    want.insert(format!("s{i}"));
                }
                Err(e) => {
                    self.note(|| format!("tree {file}: not made: {e}"));
                    self.report.refused += 1;
                    return Ok(());
                }
            }
        }
        // Listed whole, each file read back as written.
        let listed: BTreeSet<String> = match c.readdir(&top).await {
            Ok(l) => l
                .into_iter()
                .map(|e| String::from_utf8_lossy(&e.name).into_owned())
                .collect(),
            Err(e) => {
                self.report.refused += 1;
                self.note(|| format!("tree {top}: not listed: {e}"));
                return Ok(());
            }
        };
        if listed != want {
            return Err(self.fail(format!("{top} lists {listed:?}, not {want:?}")));
        }
        for name in &want {
            let file = format!("{top}/{name}/f");
            match read_path(&c, &file).await {
                Ok(b) if b == file.as_bytes() => {}
                Ok(b) => {
                    return Err(self.fail(format!("{file} reads {} bytes, not its path", b.len())))
                }
                Err(e) => {
                    self.report.refused += 1;
                    self.note(|| format!("tree {file}: not read: {e}"));
                    return Ok(());
                }
            }
        }
        // A hard link between two of its subdirectories (on two MDTs in a striped tree):
        // read the same through both names, counted twice.
        let (file, link) = (format!("{top}/s0/f"), format!("{top}/s1/l0"));
        match c.link(&file, &link).await {
            Ok(_) => {
                let seen = match (read_path(&c, &link).await, c.stat(&file).await) {
                    (Ok(b), Ok(st)) => Some((b, st.nlink)),
                    (Err(e), _) | (_, Err(e)) => {
                        self.report.refused += 1;
                        self.note(|| format!("tree {link}: not read: {e}"));
                        None
                    }
                };
                if let Some((b, nlink)) = seen {
                    if b != file.as_bytes() || nlink != 2 {
                        return Err(self.fail(format!(
                            "{link}, a link of {file}, reads {} bytes with {nlink} links",
                            b.len()
                        )));
                    }
                }
            }
            Err(e) => {
                self.report.refused += 1;
                self.note(|| format!("tree {link}: not linked: {e}"));
            }
        }
        // A subdirectory moved into another (between two MDTs in a striped tree): its file
        // read through the new path, the old one gone; and never below itself.
        let (from, to) = (format!("{top}/s2"), format!("{top}/s0/m"));
        match c.rename(&from, &to).await {
            Ok(()) => {
                let file = format!("{to}/f");
                match (read_path(&c, &file).await, c.stat(&from).await) {
                    (Ok(b), Err(e)) if e.is(proto::FsErrorKind::NotFound) => {
                        if b != format!("{from}/f").as_bytes() {
                            return Err(self.fail(format!(
                                "{file}, moved from {from}, reads {} bytes",
                                b.len()
                            )));
                        }
                    }
                    (_, Ok(_)) => {
                        return Err(self.fail(format!("{from}, moved to {to}, is still there")))
                    }
                    (Err(e), _) | (_, Err(e)) => {
                        self.report.refused += 1;
                        self.note(|| format!("tree {to}: not read: {e}"));
                    }
                }
                let below = format!("{to}/loop");
                if c.rename(&format!("{top}/s0"), &below).await.is_ok() {
                    return Err(self.fail(format!("{top}/s0 moved below itself, to {below}")));
                }
            }
            Err(e) => {
                self.report.refused += 1;
                self.note(|| format!("tree {to}: not moved: {e}"));
            }
        }
        match remove_tree(&c, &top).await {
            Ok(()) => match c.stat(&top).await {
                Err(e) if e.is(proto::FsErrorKind::NotFound) => {}
                other => {
                    return Err(self.fail(format!(
                        "{top}, removed, is still there: {:?}",
                        other.map(|i| i.fid)
                    )))
                }
            },
            Err(e) => {
                self.report.refused += 1;
                self.note(|| format!("tree {top}: not removed: {e}"));
            }
        }
        Ok(())
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
            // On MDT0, where creates are answered ahead (a plain mkdir in the root may go to
            // either MDT).
            c.mkdir_on(&dir, 0o755, 0).await
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

/// Removes the tree at `top`, if any: files, then directories, deepest first.
async fn remove_tree(c: &Client, top: &str) -> client::Result<()> {
    let subs = match c.readdir(top).await {
        Ok(l) => l,
        Err(e) if e.is(proto::FsErrorKind::NotFound) => return Ok(()),
        Err(e) => return Err(e),
    };
    for e in subs {
        let path = format!("{top}/{}", String::from_utf8_lossy(&e.name));
        if e.kind == proto::md::Kind::Dir {
            Box::pin(remove_tree(c, &path)).await?;
        } else {
            c.unlink(&path).await?;
        }
    }
    c.rmdir(top).await
}

/// The bytes of the file at `path`.
async fn read_path(c: &Client, path: &str) -> client::Result<Vec<u8>> {
    let f = OpenOptions::new().read(true).open(c, path).await?;
    let mut buf = vec![0u8; 4096];
    let n = f.read_at(0, &mut buf).await?;
    buf.truncate(n);
    f.close().await?;
    Ok(buf)
}
