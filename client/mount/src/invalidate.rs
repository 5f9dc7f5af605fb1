//! Tells the kernel what the lease cache dropped, on threads of their own. Attributes are
//! dropped on one thread, before a recall is acknowledged: that takes no lock a call could
//! hold. Entries are dropped on another, which a recall waits for only briefly: dropping an
//! entry takes the kernel's lock on its directory, which a call in that directory may hold
//! while it waits on this daemon (and it, through the MDS, on this recall). Entries are given
//! to the kernel with the short timeout, so one dropped late is stale for that long at most.
//! Cached pages are dropped on a third thread, which a recall waits for only briefly as well:
//! dropping them takes the locks of pages a read may hold while it waits on this daemon. An
//! open never keeps pages whose lease dropped ([`crate::pages::PageTrust`]), whenever this
//! thread gets to them.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use client::lease::Dropped;
use client::Client;
use fuser::INodeNo;

use crate::kernel::ino_of;

enum Job {
    Attrs(INodeNo),
    /// A file's cached pages, or a directory's cached listing.
    Pages(INodeNo),
    Entries(INodeNo, Vec<Vec<u8>>),
    /// Answered once every job before it is done.
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// Longest a recall waits for the kernel's entries and pages to be dropped.
const ENTRIES_WAIT: Duration = Duration::from_millis(50);

fn worker(name: &str, notifier: Arc<OnceLock<fuser::Notifier>>) -> mpsc::Sender<Job> {
    let (tx, rx) = mpsc::channel::<Job>();
    let spawned = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            for job in rx {
                let n = notifier.get();
                match (job, n) {
                    (Job::Attrs(ino), Some(n)) => {
                        let _ = n.inval_inode(ino, -1, 0);
                    }
                    (Job::Pages(ino), Some(n)) => {
                        // From the first byte to the last (a length the end cannot overflow).
                        let _ = n.inval_inode(ino, 0, i64::MAX);
                    }
                    (Job::Entries(dir, names), Some(n)) => {
                        for name in &names {
                            let _ = n.inval_entry(dir, OsStr::from_bytes(name));
                        }
                    }
                    (Job::Flush(done), _) => {
                        let _ = done.send(());
                    }
                    (_, None) => {}
                }
            }
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start an invalidation thread");
    }
    tx
}

/// Drops files' cached pages in the kernel, on the thread nothing waits for.
#[derive(Clone)]
pub(crate) struct PageDropper(mpsc::Sender<Job>);

impl PageDropper {
    pub(crate) fn drop_pages(&self, ino: INodeNo) {
        let _ = self.0.send(Job::Pages(ino));
    }

    /// Writes to `fid` failed to land: the pages that hold them are not the file's. No open
    /// keeps them, and the kernel drops them.
    pub(crate) fn lost_writes(&self, pages: &crate::pages::PageTrust, fid: proto::Fid) {
        pages.dropped(fid);
        self.drop_pages(ino_of(fid));
    }
}

/// Starts the threads; they send through the session's notifier once there is one, and hear
/// every lease `client` drops. A lease dropped drops the kernel's attributes, entries and
/// pages of what it covered: another client's change recalls it before it is made.
pub(crate) fn start(
    client: &Client,
    notifier: Arc<OnceLock<fuser::Notifier>>,
    pages: Arc<crate::pages::PageTrust>,
    parents: Arc<crate::pages::Parents>,
) -> PageDropper {
    let attrs = worker("lode-inval-attr", notifier.clone());
    let entries = worker("lode-inval-entry", notifier.clone());
    let dropper = PageDropper(worker("lode-inval-pages", notifier));
    let (a, e, p) = (attrs.clone(), entries.clone(), dropper.clone());
    client.on_lease_dropped(move |d: Dropped| {
        pages.dropped(d.fid);
        parents.dropped(d.fid);
        let ino = ino_of(d.fid);
        let _ = a.send(Job::Attrs(ino));
        p.drop_pages(ino);
        if !d.names.is_empty() {
            let _ = e.send(Job::Entries(ino, d.names));
        }
    });
    let paged = dropper.0.clone();
    client.on_lease_barrier(move || {
        let (done, wait) = tokio::sync::oneshot::channel();
        let (a_done, a_wait) = tokio::sync::oneshot::channel();
        let (e_done, e_wait) = tokio::sync::oneshot::channel();
        let (p_done, p_wait) = tokio::sync::oneshot::channel();
        let _ = attrs.send(Job::Flush(a_done));
        let _ = entries.send(Job::Flush(e_done));
        let _ = paged.send(Job::Flush(p_done));
        tokio::spawn(async move {
            let _ = a_wait.await;
            let _ = tokio::time::timeout(ENTRIES_WAIT, async {
                let _ = e_wait.await;
                let _ = p_wait.await;
            })
            .await;
            let _ = done.send(());
        });
        wait
    });
    dropper
}
