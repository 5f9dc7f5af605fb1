//! Names: lookups and the changes that add, remove or move entries.

use super::*;

impl LodeFs {
    // Entries keep the short timeout: the kernel asks again, and the lease cache answers
    // without a round trip (dropping an entry takes the kernel's lock on its directory, which a
    // call in that directory may hold while it waits on this daemon, so a recall cannot wait
    // for it). Attributes the lease cache covers go to the kernel with a long timeout and are
    // dropped, before the recall is acknowledged, when the lease is. A lease dropped while the
    // answer was on its way drops the kernel's copy again after it.
    pub(super) fn lookup(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEntry) {
        self.begin("lookup", req);
        let (c, n) = (self.as_caller(req), name(n));
        // What the lease cache answers is answered on this thread, with no hand-off.
        let before = c.lease_recalls();
        match c.lookup_cached(fid_of(parent), &n) {
            Some(Ok(i)) => {
                let a = attr(&i, Self::size_of(&self.files, &i));
                reply.entry(&TTL, &a, Generation(0));
                if a.size == i.size {
                    self.pages.gave(&i, || c.lease_recalls() == before);
                }
                return;
            }
            Some(Err(e)) if errno(&e) == Errno::ENOENT => {
                // Known absent under the directory's lease: the kernel keeps the negative
                // entry as long as a found one, and it is dropped the same way (a creation
                // elsewhere recalls the lease, and the names it covered are dropped).
                return reply.entry(&TTL, &absent(), Generation(0));
            }
            Some(Err(e)) => return reply.error(errno(&e)),
            None => {}
        }
        // A name of a listing just read (where the kernel checks permissions: it checked the
        // search right on the directory before asking), as readdirplus would have given it.
        if self.kernel_checks {
            let now = self.listings.since(before);
            if let Some(i) = self.listings.entry(fid_of(parent), &n, TTL, now) {
                return reply.entry(
                    &TTL,
                    &attr(&i, Self::size_of(&self.files, &i)),
                    Generation(0),
                );
            }
        }
        self.entry(reply, async move { c.lookup(fid_of(parent), &n).await });
    }

    pub(super) fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        self.begin("readlink", req);
        let c = self.client.clone();
        self.inline(async move {
            match c.getattr(fid_of(ino)).await {
                Ok(i) if i.kind == Kind::Symlink => match c.link_target(&i) {
                    Ok(t) => reply.data(&t),
                    Err(e) => reply.error(errno(&e)),
                },
                Ok(_) => reply.error(Errno::EINVAL),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    #[allow(clippy::too_many_arguments)] // the kernel's request, as fuser passes it
    pub(super) fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.begin("mknod", req);
        // The kernel has already checked CAP_MKNOD for device nodes.
        let kind = match mode & libc::S_IFMT {
            libc::S_IFREG => Kind::File,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFSOCK => Kind::Socket,
            libc::S_IFCHR => Kind::CharDev(rdev.into()),
            libc::S_IFBLK => Kind::BlockDev(rdev.into()),
            _ => {
                reply.error(Errno::EINVAL);
                return;
            }
        };
        let (c, n) = (self.as_caller(req), name(n));
        let m = Mutation::Create {
            parent: fid_of(parent),
            name: n,
            kind,
            mode: mode & !umask & 0o7777,
            exclusive: true,
            target: vec![],
            layout: None,
        };
        self.entry(reply, async move { c.reint(m).await.and_then(created) });
    }

    pub(super) fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.begin("mkdir", req);
        let (c, n) = (self.as_caller(req), name(n));
        let m = Mutation::Create {
            parent: fid_of(parent),
            name: n,
            kind: Kind::Dir,
            mode: mode & !umask & 0o7777,
            exclusive: true,
            target: vec![],
            layout: None,
        };
        self.entry(reply, async move { c.reint(m).await.and_then(created) });
    }

    pub(super) fn unlink(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        self.begin("unlink", req);
        let (c, n) = (self.as_caller(req), name(n));
        self.empty(reply, async move {
            // Answered here when the directory's lease tells the outcome; sent behind.
            if c.unlink_ahead(fid_of(parent), &n).await {
                return Ok(());
            }
            c.reint(Mutation::Unlink {
                parent: fid_of(parent),
                name: n,
                dir: false,
            })
            .await
            .map(|_| ())
        });
    }

    pub(super) fn rmdir(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        self.begin("rmdir", req);
        let (c, n) = (self.as_caller(req), name(n));
        self.empty(reply, async move {
            c.reint(Mutation::Unlink {
                parent: fid_of(parent),
                name: n,
                dir: true,
            })
            .await
            .map(|_| ())
        });
    }

    pub(super) fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        self.begin("symlink", req);
        let (c, n) = (self.as_caller(req), name(link));
        let m = Mutation::Create {
            parent: fid_of(parent),
            name: n,
            kind: Kind::Symlink,
            mode: 0o777,
            exclusive: true,
            target: target.as_os_str().as_bytes().to_vec(),
            layout: None,
        };
        self.entry(reply, async move { c.reint(m).await.and_then(created) });
    }

    #[allow(clippy::too_many_arguments)] // the kernel's request, as fuser passes it
    pub(super) fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: FuseRename,
        reply: ReplyEmpty,
    ) {
        self.begin("rename", req);
        let c = self.as_caller(req);
        let bits = flags.bits();
        let flags = RenameFlags {
            noreplace: bits & libc::RENAME_NOREPLACE != 0,
            exchange: bits & libc::RENAME_EXCHANGE != 0,
        };
        let m = Mutation::Rename {
            parent: fid_of(parent),
            name: name(n),
            new_parent: fid_of(newparent),
            new_name: name(newname),
            flags,
        };
        // A directory moved to another parent has a new `..`.
        let parents = (parent != newparent).then(|| self.parents.clone());
        if let Some(p) = &parents {
            p.forget_all();
        }
        self.empty(reply, async move {
            let done = c.reint(m).await.map(|_| ());
            if let Some(p) = parents {
                p.forget_all();
            }
            done
        });
    }

    pub(super) fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.begin("link", req);
        let c = self.as_caller(req);
        let m = Mutation::Link {
            fid: fid_of(ino),
            parent: fid_of(newparent),
            name: name(newname),
        };
        self.entry(reply, async move { c.reint(m).await.and_then(created) });
    }
}
