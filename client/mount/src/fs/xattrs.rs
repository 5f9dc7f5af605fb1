//! Extended attributes.

use super::*;

impl LodeFs {
    pub(super) fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        n: &OsStr,
        value: &[u8],
        flags: i32,
        reply: ReplyEmpty,
    ) {
        self.begin("setxattr", req);
        let c = self.as_caller(req);
        let name = n.to_string_lossy().into_owned();
        let fid = fid_of(ino);
        if name == LAYOUT_XATTR {
            // The layout as `lode setstripe` options: set on a directory or an empty file. On a
            // file that already holds data it is ignored, as Lustre does with lustre.lov, so
            // that tools copying extended attributes (cp -a, rsync -X, shutil) keep working.
            let text = String::from_utf8_lossy(value).into_owned();
            let opts: Vec<String> = text.split_whitespace().map(String::from).collect();
            let layout = match client::stripe_args::parse(&opts) {
                Ok(l) => l,
                Err(e) => return reply.error(errno(&e)),
            };
            return self.empty(reply, async move {
                let i = c.getattr(fid).await?;
                if i.kind == Kind::File && i.size > 0 {
                    return Ok(());
                }
                c.reint(Mutation::SetLayout { fid, layout })
                    .await
                    .map(|_| ())
            });
        }
        let value = value.to_vec();
        // XATTR_CREATE and XATTR_REPLACE are checked by the MDS with the change, in one step.
        let m = match flags & (libc::XATTR_CREATE | libc::XATTR_REPLACE) {
            0 => Mutation::SetXattr { fid, name, value },
            libc::XATTR_CREATE => Mutation::SetXattrIf {
                fid,
                name,
                value,
                replace: false,
            },
            libc::XATTR_REPLACE => Mutation::SetXattrIf {
                fid,
                name,
                value,
                replace: true,
            },
            _ => return reply.error(Errno::EINVAL),
        };
        self.empty(reply, async move { c.reint(m).await.map(|_| ()) });
    }

    pub(super) fn getxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        n: &OsStr,
        size: u32,
        reply: ReplyXattr,
    ) {
        self.begin("getxattr", req);
        let (c, n) = (self.client.clone(), n.to_string_lossy().into_owned());
        let layout = n == LAYOUT_XATTR;
        if !layout && !n.starts_with("user.") {
            // lode keeps user.* attributes only (the MDS refuses to set any other), so no
            // other name can have a value: answered at once as a filesystem without ACLs or
            // security labels answers. `ls -l` asks two such names of every file it shows
            // (security.selinux, system.posix_acl_access) and stops asking of a filesystem
            // that answers this, and the kernel's check for a capability before each write
            // waits for nothing.
            return reply.error(Errno::from_i32(libc::EOPNOTSUPP));
        }
        let answer = move |i: &Inode, reply: ReplyXattr| match layout
            .then(|| {
                i.layout
                    .as_ref()
                    .map(|l| client::stripe_args::format(l).into_bytes())
            })
            .flatten()
            .as_ref()
            .or(i.xattrs.get(&n))
        {
            Some(v) if size == 0 => reply.size(v.len() as u32),
            Some(v) if v.len() <= size as usize => reply.data(v),
            Some(_) => reply.error(Errno::from_i32(libc::ERANGE)),
            None => reply.error(Errno::from_i32(libc::ENODATA)),
        };
        // A file this mount created ahead whose create the MDS has not answered yet: its
        // attributes are those made here. Only its layout comes with the answer.
        let fid = fid_of(ino);
        if !layout {
            if let Some(i) = self.made_here(fid) {
                return answer(&i, reply);
            }
        }
        self.inline(async move {
            match c.getattr(fid).await {
                Ok(i) => answer(&i, reply),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    pub(super) fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.begin("listxattr", req);
        let c = self.client.clone();
        self.inline(async move {
            match c.getattr(fid_of(ino)).await {
                Ok(i) => {
                    let mut list = vec![];
                    if i.layout.is_some() {
                        list.extend_from_slice(LAYOUT_XATTR.as_bytes());
                        list.push(0);
                    }
                    // lode's own (a striped directory's layout) are not the user's.
                    let own = |k: &&String| proto::dirstripe::is_internal_xattr(k);
                    for k in i.xattrs.keys().filter(|k| !own(k)) {
                        list.extend_from_slice(k.as_bytes());
                        list.push(0);
                    }
                    if size == 0 {
                        reply.size(list.len() as u32)
                    } else if list.len() <= size as usize {
                        reply.data(&list)
                    } else {
                        reply.error(Errno::from_i32(libc::ERANGE))
                    }
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    pub(super) fn removexattr(&self, req: &Request, ino: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        self.begin("removexattr", req);
        let c = self.as_caller(req);
        let m = Mutation::RemoveXattr {
            fid: fid_of(ino),
            name: n.to_string_lossy().into_owned(),
        };
        self.empty(reply, async move { c.reint(m).await.map(|_| ()) });
    }
}
