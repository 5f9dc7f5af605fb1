//! Opening a file: [`OpenOptions`], the one way to open one, by path, by name in a directory, by
//! FID, unnamed, or as an inode already looked up.

use super::*;

/// How to open a file, after `std::fs::OpenOptions`, with a layout for new files.
#[derive(Clone, Debug, Default)]
pub struct OpenOptions {
    read: bool,
    write: bool,
    append: bool,
    truncate: bool,
    create: bool,
    create_new: bool,
    mode: Option<u32>,
    stripe_count: Option<StripeCount>,
    stripe_size: Option<u64>,
    stripe_offset: Option<u32>,
    layout: Option<Layout>,
    as_is: bool,
}

/// What [`OpenOptions::open`] opens. A path converts into it (`&str`, `&String`), and so do a
/// FID and an inode.
#[derive(Clone, Debug)]
pub enum At<'a> {
    /// A path from the root, symlinks followed; created with `create`.
    Path(&'a str),
    /// The entry `name` of directory `parent`; created with `create` in one round trip.
    Entry { parent: proto::Fid, name: &'a [u8] },
    /// A new regular file with no name in directory `parent` (open(2)'s `O_TMPFILE`): the MDS
    /// keeps it while a handle holds it, and it is gone after the last close unless a link
    /// names it first ([`Client::link_fid`]). Needs write access; the mode is as for a create.
    Unnamed { parent: proto::Fid },
    /// The file `fid`, in one round trip: the MDS counts the open and answers with its
    /// attributes as of now (close-to-open).
    Fid(proto::Fid),
    /// A file already looked up.
    Inode(Inode),
}

impl<'a> From<&'a str> for At<'a> {
    fn from(path: &'a str) -> At<'a> {
        At::Path(path)
    }
}

impl<'a> From<&'a String> for At<'a> {
    fn from(path: &'a String) -> At<'a> {
        At::Path(path)
    }
}

impl<'a, 'b> From<&'b &'a str> for At<'a> {
    fn from(path: &'b &'a str) -> At<'a> {
        At::Path(path)
    }
}

impl From<proto::Fid> for At<'_> {
    fn from(fid: proto::Fid) -> Self {
        At::Fid(fid)
    }
}

impl From<Inode> for At<'_> {
    fn from(inode: Inode) -> Self {
        At::Inode(inode)
    }
}

impl OpenOptions {
    pub fn new() -> Self {
        OpenOptions {
            read: true,
            ..Default::default()
        }
    }

    pub fn read(mut self, v: bool) -> Self {
        self.read = v;
        self
    }
    pub fn write(mut self, v: bool) -> Self {
        self.write = v;
        self
    }
    /// O_APPEND: every write goes to the end of the file.
    pub fn append(mut self, v: bool) -> Self {
        self.append = v;
        self.write |= v;
        self
    }
    /// O_TRUNC.
    pub fn truncate(mut self, v: bool) -> Self {
        self.truncate = v;
        self
    }
    /// O_CREAT.
    pub fn create(mut self, v: bool) -> Self {
        self.create = v;
        self
    }
    /// O_CREAT | O_EXCL.
    pub fn create_new(mut self, v: bool) -> Self {
        self.create_new = v;
        self
    }
    pub fn mode(mut self, mode: u32) -> Self {
        self.mode = Some(mode);
        self
    }
    /// Stripes of a new file (-1 in `lfs`: use [`OpenOptions::stripe_all`]).
    pub fn stripe_count(mut self, n: u32) -> Self {
        self.stripe_count = Some(StripeCount::Count(n));
        self
    }
    /// Stripe over every target.
    pub fn stripe_all(mut self) -> Self {
        self.stripe_count = Some(StripeCount::All);
        self
    }
    pub fn stripe_size(mut self, bytes: u64) -> Self {
        self.stripe_size = Some(bytes);
        self
    }
    /// The first target of a new file.
    pub fn stripe_offset(mut self, target: u32) -> Self {
        self.stripe_offset = Some(target);
        self
    }
    /// Opens a released file as it is, its bytes left in the archive (a copytool's open, to
    /// restore them); without it, an open for writing of a released file restores it first.
    pub fn as_is(mut self, v: bool) -> Self {
        self.as_is = v;
        self
    }
    /// A whole layout (progressive components) for a new file.
    pub fn layout(mut self, layout: Layout) -> Self {
        self.layout = Some(layout);
        self
    }

    fn new_file_layout(&self) -> Result<Option<Layout>> {
        if let Some(l) = &self.layout {
            l.validate()?;
            return Ok(Some(l.clone()));
        }
        if self.stripe_count.is_none() && self.stripe_size.is_none() && self.stripe_offset.is_none()
        {
            return Ok(None); // the directory's default, or the filesystem's
        }
        let mut c = Component::raid0(
            self.stripe_count.unwrap_or(StripeCount::Count(1)),
            self.stripe_size
                .unwrap_or(proto::layout::DEFAULT_STRIPE_SIZE),
        );
        c.stripe_offset = self.stripe_offset;
        Ok(Some(Layout::new(vec![c])?))
    }

    /// Opens what `at` names with these options: a path (`"/d/f"`), an entry of a directory
    /// ([`At::Entry`]), a new file with no name ([`At::Unnamed`]), a FID, or an inode already
    /// looked up. The one way to open a file.
    pub async fn open<'a>(&self, client: &Client, at: impl Into<At<'a>>) -> Result<File> {
        match at.into() {
            At::Path(path) => self.open_path(client, path).await,
            At::Entry { parent, name } => self.open_entry(client, parent, name).await,
            At::Unnamed { parent } => self.open_unnamed(client, parent).await,
            At::Fid(fid) => self.open_fid(client, fid).await,
            At::Inode(inode) => self.open_named(client, inode, None).await,
        }
    }

    async fn open_path(&self, client: &Client, path: &str) -> Result<File> {
        if self.create || self.create_new {
            let (parent, name) = client.parent_of(path).await?;
            match self.open_entry(client, parent.fid, name).await {
                // An existing directory or symlink under O_CREAT: resolve it as open(2) does.
                Err(e) if e.is(FsErrorKind::Exists) && !self.create_new => {}
                other => return other,
            }
        }
        // Between the lookup and the open, a rename may replace the file the path named (a
        // checkpoint committed): the old one is gone, and the path now names the new one.
        let mut tries = 0;
        loop {
            let inode = client.resolve(path, true).await?;
            match self.open_named(client, inode, Some(path)).await {
                Err(e) if e.is(FsErrorKind::Stale) && tries < MAX_REOPEN => tries += 1,
                other => return other,
            }
        }
    }

    /// Opens (creating it, with `create`) the entry `name` of directory `parent`.
    async fn open_entry(&self, client: &Client, parent: proto::Fid, name: &[u8]) -> Result<File> {
        if self.create || self.create_new {
            if let Some(f) = self.create_ahead(client, parent, name).await {
                return f;
            }
            // One round trip: the MDS creates the file, or (without O_EXCL) finds it there and
            // opens it, counting the open either way.
            let m = Mutation::Create {
                parent,
                name: name.to_vec(),
                kind: Kind::File,
                mode: self.mode.unwrap_or(0o644),
                exclusive: self.create_new,
                target: vec![],
                layout: self.new_file_layout()?,
            };
            let (counted, created) = Self::create_counted(client, m).await?;
            let inode = counted.inode.clone();
            if !created {
                // An existing file: opened with the access its mode gives, as any open.
                if let Err(e) = self.check_access(client, &inode) {
                    let _ = client.close_handle(counted.handle, inode.fid).await;
                    return Err(e);
                }
            }
            return self.open_counted(client, inode, Some(counted), None).await;
        }
        let inode = client.lookup(parent, name).await?;
        self.open_named(client, inode, None).await
    }

    /// Creates a regular file with no name in directory `parent` (open(2)'s O_TMPFILE) and
    /// opens it, in one round trip: the MDS keeps it while a handle holds it, and it is gone
    /// after the last close unless a link names it first ([`Client::link_fid`]). Needs write
    /// access; the mode is as for a create.
    async fn open_unnamed(&self, client: &Client, parent: proto::Fid) -> Result<File> {
        if !self.write {
            return Err(ClientError::fs(
                FsErrorKind::Invalid,
                "a file with no name is opened for writing",
            ));
        }
        let m = Mutation::CreateUnnamed {
            parent,
            mode: self.mode.unwrap_or(0o600),
            layout: self.new_file_layout()?,
        };
        let (counted, _) = Self::create_counted(client, m).await?;
        let inode = counted.inode.clone();
        self.open_counted(client, inode, Some(counted), None).await
    }

    /// Sends create `m` with a new handle, so the MDS counts the open with it (one round
    /// trip), and records the handle: the open counted, and whether the file was made now.
    async fn create_counted(client: &Client, m: Mutation) -> Result<(Counted, bool)> {
        let handle = client.handle(client.inner.next_handle());
        let replays = client.inner.opens.replays();
        let done = client.reint_with(m, Some(handle)).await?;
        let inode = done
            .inode
            .ok_or_else(|| ClientError::fs(FsErrorKind::Io, "no inode in the reply"))?;
        client.opened(handle, inode.fid, replays).await?;
        let counted = Counted {
            inode,
            handle,
            gen: done.size_gen,
            grant: done.grant.unwrap_or_default(),
            mdt: None,
            kept: None,
        };
        Ok((counted, done.created))
    }

    /// Creates and opens the file without waiting for the MDS, when the client's leases let
    /// it ([`Client::create_ahead`]): its objects come with the MDS's answer, which the first
    /// read or write waits for.
    async fn create_ahead(
        &self,
        client: &Client,
        parent: proto::Fid,
        name: &[u8],
    ) -> Option<Result<File>> {
        let layout = match self.new_file_layout() {
            Ok(l) => l,
            Err(e) => return Some(Err(e)),
        };
        if layout.is_some() {
            return None;
        }
        let handle = client.handle(client.inner.next_handle());
        let mode = self.mode.unwrap_or(0o644);
        let (inode, sent) = match client
            .create_ahead(parent, name, mode, Some(handle))
            .await?
        {
            Ok(x) => x,
            Err(e) => return Some(Err(e)),
        };
        // Made through the session of its directory's MDT, which is its own.
        let client = &client.at_now(inode.fid).unwrap_or_else(|| client.clone());
        let cipher = super::cipher::Cipher::of(client, &inode);
        let caps = Arc::new(Caps::new(
            inode.fid,
            handle,
            client.creds().clone(),
            Grant::default(),
        ));
        client.inner.writes.opened(inode.fid);
        Some(Ok(File {
            client: client.clone(),
            inode: Mutex::new(inode),
            caps,
            handle,
            size_gen: AtomicU64::new(0),
            append: self.append,
            writable: self.write || self.append,
            written_to: AtomicU64::new(0),
            lost_from: AtomicU64::new(u64::MAX),
            closed: AtomicBool::new(false),
            unpublished: AtomicBool::new(false),
            ahead: Some(sent),
            created_in: Some(parent),
            recalls_at_create: client.lease_recalls(),
            behind: AtomicBool::new(false),
            ready: AtomicBool::new(false),
            taking_in: Mutex::new(()),
            mdt: Mutex::new(None),
            evictions_seen: AtomicU64::new(client.evictions()),
            cipher,
        }))
    }

    /// Opens the file `fid` in one round trip: the MDS counts the open and answers with its
    /// attributes as of now (close-to-open); the access asked for is then checked, and the open
    /// undone if it is refused.
    async fn open_fid(&self, client: &Client, fid: proto::Fid) -> Result<File> {
        let counted = Self::count_open(client, fid, None, self.rights()).await?;
        let checked = self
            .check_access(client, &counted.inode)
            .and_then(|()| self.kind_opens(&counted.inode));
        if let Err(e) = checked {
            let _ = client.close_handle(counted.handle, fid).await;
            return Err(e);
        }
        self.open_counted(client, counted.inode.clone(), Some(counted), None)
            .await
    }

    /// Has the MDS count an open of `fid` under a new handle, or takes a handle kept past its
    /// close that allows `rights` ([`crate::kept`]); the file's attributes as of now and the
    /// capabilities for its objects.
    async fn count_open(
        client: &Client,
        fid: proto::Fid,
        path: Option<&str>,
        rights: u8,
    ) -> Result<Counted> {
        let client = &client.at(fid).await?;
        // Close-to-open with this client's own closes finishing behind.
        if path.is_some() {
            client.after_closings().await;
        } else {
            client.after_closing(fid).await;
        }
        let inner = &client.inner;
        let (kept, stale) = inner.kept.take(&inner.leases, fid, client.creds(), rights);
        client.close_unkept(stale.into_iter().map(|e| (fid, e)));
        if let Some((e, inode)) = kept {
            return Ok(Counted {
                inode,
                handle: e.handle,
                gen: e.gen,
                grant: Grant::default(),
                mdt: None,
                kept: Some(e.caps),
            });
        }
        let handle = client.handle(client.inner.next_handle());
        let replays = client.inner.opens.replays();
        let mds = client.inner.mds.clone();
        let leases = &client.inner.leases;
        let open = MdsOpen {
            fid,
            handle,
            creds: client.creds().clone(),
            path: path.map(str::to_owned),
            lease: leases.live().then_some(client.inner.client_id()),
        };
        let stamp = leases.stamp();
        let opened = client.rpc(&mds, &open).await?;
        leases.learn_attr(stamp, &opened.inode, opened.leased);
        client.opened(handle, fid, replays).await?;
        let mdt = opened
            .inode
            .layout
            .as_ref()
            .is_some_and(|l| l.mdt_end().is_some())
            .then_some(MdtCopy {
                bytes: opened.mdt,
                stamp,
            });
        Ok(Counted {
            inode: opened.inode,
            handle,
            gen: opened.size_gen,
            grant: opened.grant,
            mdt,
            kept: None,
        })
    }

    /// The rights on objects this open needs.
    fn rights(&self) -> u8 {
        let mut r = 0;
        if self.read {
            r |= proto::capa::READ;
        }
        if self.write || self.append || self.truncate {
            r |= proto::capa::WRITE;
        }
        r
    }

    /// Opens a file already looked up, if the client's credentials allow the access asked for,
    /// naming the path it was found at if there is one (the MDS's audit log records it).
    async fn open_named(&self, client: &Client, inode: Inode, path: Option<&str>) -> Result<File> {
        self.check_access(client, &inode)?;
        self.open_counted(client, inode, None, path).await
    }

    /// Only regular files are opened here (a directory, a symlink or a special file is not).
    fn kind_opens(&self, inode: &Inode) -> Result<()> {
        let (kind, what) = match inode.kind {
            Kind::File => return Ok(()),
            Kind::Dir => (FsErrorKind::IsDir, "a directory"),
            Kind::Symlink => (FsErrorKind::Loop, "a symlink"),
            _ => (
                FsErrorKind::NoDevice,
                "a special file, opened by the kernel",
            ),
        };
        Err(ClientError::fs(kind, format!("{} is {what}", inode.fid)))
    }

    /// Whether the client's credentials allow the access asked for on an existing file.
    fn check_access(&self, client: &Client, inode: &Inode) -> Result<()> {
        let want = if self.read { 4 } else { 0 }
            | if self.write || self.append || self.truncate {
                2
            } else {
                0
            };
        if inode.kind == Kind::File && !inode.permits(client.creds(), want) {
            return Err(ClientError::fs(
                FsErrorKind::AccessDenied,
                format!("permission denied on {}", inode.fid),
            ));
        }
        Ok(())
    }

    /// Opens `inode`; with `counted`, the handle the MDS already counted this open under and
    /// the file's size generation then.
    async fn open_counted(
        &self,
        client: &Client,
        inode: Inode,
        counted: Option<Counted>,
        path: Option<&str>,
    ) -> Result<File> {
        self.kind_opens(&inode)?;
        // The file's MDT's session holds its handle and carries its changes.
        let client = &client.at(inode.fid).await?;
        // Counted open at the MDS: if the file loses its last name meanwhile, its objects stay
        // until this handle closes. Its answer is the freshest view of the file.
        let Counted {
            inode,
            handle,
            gen,
            grant,
            mdt,
            kept,
        } = match counted {
            Some(c) => c,
            None => Self::count_open(client, inode.fid, path, self.rights()).await?,
        };
        let caps = match kept {
            Some(caps) => caps,
            None => {
                client
                    .inner
                    .grants
                    .remember(inode.fid, client.creds(), &grant);
                Arc::new(Caps::new(inode.fid, handle, client.creds().clone(), grant))
            }
        };
        // The MDS decides with the identity it maps this client's to (root squashed on an
        // untrusted node): an access it did not grant is refused here, at the open.
        if !caps.allows(self.rights()) {
            let _ = client.close_handle(handle, inode.fid).await;
            return Err(ClientError::fs(
                FsErrorKind::AccessDenied,
                format!("permission denied on {}", inode.fid),
            ));
        }
        let cipher = super::cipher::Cipher::of(client, &inode);
        let file = File {
            client: client.clone(),
            inode: Mutex::new(inode),
            caps,
            handle,
            size_gen: AtomicU64::new(gen),
            append: self.append,
            writable: self.write || self.append,
            written_to: AtomicU64::new(0),
            lost_from: AtomicU64::new(u64::MAX),
            closed: AtomicBool::new(false),
            unpublished: AtomicBool::new(false),
            ahead: None,
            created_in: None,
            behind: AtomicBool::new(false),
            recalls_at_create: 0,
            ready: AtomicBool::new(true),
            taking_in: Mutex::new(()),
            mdt: Mutex::new(mdt),
            evictions_seen: AtomicU64::new(client.evictions()),
            cipher,
        };
        client.inner.writes.opened(file.inode.lock().fid);
        // A released file's bytes come back before anything changes them.
        if (self.write || self.append) && !self.as_is {
            file.restore_whole().await?;
        }
        if self.truncate && (self.write || self.append) {
            file.set_len(0).await?;
        }
        Ok(file)
    }
}
