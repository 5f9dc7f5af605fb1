//! Tells the kernel what the lease cache dropped, on a thread of its own: an invalidation waits
//! for the kernel's lock on the directory, which a call in that directory may hold while it
//! waits on this daemon, so none is ever sent from a call's own path.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};

use client::lease::Dropped;
use client::Client;
use proto::Fid;

use crate::kernel::ino_of;

enum Job {
    Drop(Dropped),
    /// Answered once every job before it is done.
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// The invalidation thread's queue.
#[derive(Clone)]
pub(crate) struct Invalidator {
    tx: mpsc::Sender<Job>,
}

impl Invalidator {
    /// Starts the thread; it sends through the session's notifier once there is one, and
    /// hears every lease `client` drops.
    pub fn start(client: &Client, notifier: Arc<OnceLock<fuser::Notifier>>) -> Invalidator {
        let (tx, rx) = mpsc::channel::<Job>();
        let spawned = std::thread::Builder::new()
            .name("lode-invalidate".into())
            .spawn(move || {
                for job in rx {
                    match job {
                        Job::Drop(d) => {
                            let Some(n) = notifier.get() else { continue };
                            let ino = ino_of(d.fid);
                            for name in &d.names {
                                let _ = n.inval_entry(ino, OsStr::from_bytes(name));
                            }
                            let _ = n.inval_inode(ino, -1, 0);
                        }
                        Job::Flush(done) => {
                            let _ = done.send(());
                        }
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the invalidation thread");
        }
        let me = Invalidator { tx };
        let hook = me.clone();
        client.on_lease_dropped(move |d| {
            let _ = hook.tx.send(Job::Drop(d));
        });
        let flush = me.clone();
        client.on_lease_barrier(move || {
            let (done, wait) = tokio::sync::oneshot::channel();
            let _ = flush.tx.send(Job::Flush(done));
            wait
        });
        me
    }

    /// Drops the kernel's entry `name` of `parent` and its attributes of `parent`.
    pub fn entry(&self, parent: Fid, name: Vec<u8>) {
        let _ = self.tx.send(Job::Drop(Dropped {
            fid: parent,
            names: vec![name],
        }));
    }

    /// Drops the kernel's attributes of `fid`.
    pub fn attrs(&self, fid: Fid) {
        let _ = self.tx.send(Job::Drop(Dropped { fid, names: vec![] }));
    }
}
