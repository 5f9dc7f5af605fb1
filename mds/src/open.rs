//! Files held open by clients. A file whose last name goes while it is open stays readable:
//! its objects are kept until the last close.
//!
//! Each open is a handle named by its client ([`OpenHandle`]), so a resent open or close counts
//! once. The table lives in memory: after an MDS restart, clients count their handles again
//! ([`proto::md::MdsReopen`]) within the recovery window, during which nothing is destroyed.
//! A client that holds files open pings; one not heard from for the eviction time loses its
//! handles (Lustre's eviction), so a client that died does not keep objects for ever.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::time::Duration;

use tokio::time::Instant;

use crate::FastMap;
use parking_lot::Mutex;
use proto::md::OpenHandle;
use proto::Fid;

/// Most handles open at once; past it, opens are refused (EMFILE).
pub const MAX_OPEN_HANDLES: usize = 1 << 20;

/// Most handles one client holds at once: one client cannot fill the table for the others.
pub const MAX_HANDLES_PER_CLIENT: usize = 1 << 17;

/// Most handles the clients of one node (one address) hold at once, however many client ids
/// it uses: a node cannot fill more than a quarter of the table.
pub const MAX_HANDLES_PER_NODE: usize = MAX_OPEN_HANDLES / 4;

/// Why an open was not counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OpenRefused {
    #[error("the MDS holds {MAX_OPEN_HANDLES} open files")]
    Full,
    #[error("this client holds {MAX_HANDLES_PER_CLIENT} open files")]
    ClientFull,
    #[error("the clients of this node hold {MAX_HANDLES_PER_NODE} open files")]
    NodeFull,
}

/// One handle: the order it was opened in, the rights it was granted, and the node that
/// opened it (none for a server).
#[derive(Clone, Copy)]
struct Held {
    order: u64,
    rights: u8,
    node: Option<IpAddr>,
}

/// The handles open on one file, each with the order it was opened in and the rights it was
/// granted, and the order of the latest open: whether any other handle opened since a given
/// one (a resync's, whose copy would miss that handle's writes).
#[derive(Default)]
struct Opens {
    handles: HashMap<OpenHandle, Held>,
    latest: u64,
}

impl Opens {
    fn contains(&self, h: &OpenHandle) -> bool {
        self.handles.contains_key(h)
    }

    fn remove(&mut self, h: &OpenHandle) -> Option<Held> {
        self.handles.remove(h)
    }

    fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }
}

#[derive(Default)]
struct Table {
    files: FastMap<Fid, Opens>,
    /// Counts opens, to order them.
    opened: u64,
    /// Per client: when it was last heard from, and the files it holds open.
    clients: HashMap<u128, (Instant, HashSet<(Fid, u64)>)>,
    handles: usize,
    /// Handles per node.
    nodes: HashMap<IpAddr, usize>,
}

impl Table {
    /// A handle is gone: counted out of the table and of its node.
    fn forget(&mut self, held: Held) {
        self.handles -= 1;
        if let Some(ip) = held.node {
            if let Some(n) = self.nodes.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    self.nodes.remove(&ip);
                }
            }
        }
    }
}

#[derive(Default)]
pub struct OpenFiles {
    table: Mutex<Table>,
}

impl OpenFiles {
    /// Counts the open `handle` of `fid` granted `rights` ([`proto::capa::READ`],
    /// [`proto::capa::WRITE`]); counted again (a resend, a renewal, a reopen), it counts once
    /// and keeps the rights it had as well (what an open granted stays granted until the
    /// close, as a file descriptor's access does). The rights the handle holds now.
    pub fn open(
        &self,
        fid: Fid,
        handle: OpenHandle,
        rights: u8,
        node: Option<IpAddr>,
    ) -> Result<u8, OpenRefused> {
        let mut t = self.table.lock();
        let t = &mut *t;
        if let Some(held) = t
            .files
            .get_mut(&fid)
            .and_then(|h| h.handles.get_mut(&handle))
        {
            held.rights |= rights;
            let now = held.rights;
            t.clients
                .entry(handle.client)
                .or_insert_with(|| (Instant::now(), HashSet::new()))
                .0 = Instant::now();
            return Ok(now);
        }
        if t.handles >= MAX_OPEN_HANDLES {
            return Err(OpenRefused::Full);
        }
        if t.clients
            .get(&handle.client)
            .is_some_and(|c| c.1.len() >= MAX_HANDLES_PER_CLIENT)
        {
            return Err(OpenRefused::ClientFull);
        }
        if let Some(ip) = node {
            let n = t.nodes.entry(ip).or_default();
            if *n >= MAX_HANDLES_PER_NODE {
                return Err(OpenRefused::NodeFull);
            }
            *n += 1;
        }
        t.opened += 1;
        let opens = t.files.entry(fid).or_default();
        opens.handles.insert(
            handle,
            Held {
                order: t.opened,
                rights,
                node,
            },
        );
        opens.latest = t.opened;
        let c = t
            .clients
            .entry(handle.client)
            .or_insert_with(|| (Instant::now(), HashSet::new()));
        c.0 = Instant::now();
        c.1.insert((fid, handle.handle));
        t.handles += 1;
        Ok(rights)
    }

    /// The rights `handle` was granted on `fid`, if it is counted open.
    pub fn rights(&self, fid: Fid, handle: OpenHandle) -> Option<u8> {
        self.table
            .lock()
            .files
            .get(&fid)
            .and_then(|h| h.handles.get(&handle))
            .map(|h| h.rights)
    }

    /// Forgets the open `handle` of `fid`, if counted.
    pub fn close(&self, fid: Fid, handle: OpenHandle) {
        let mut t = self.table.lock();
        let t = &mut *t;
        if let Some(c) = t.clients.get_mut(&handle.client) {
            c.0 = Instant::now();
            c.1.remove(&(fid, handle.handle));
            if c.1.is_empty() {
                t.clients.remove(&handle.client);
            }
        }
        if let Some(h) = t.files.get_mut(&fid) {
            let gone = h.remove(&handle);
            if h.is_empty() {
                t.files.remove(&fid);
            }
            if let Some(held) = gone {
                t.forget(held);
            }
        }
    }

    /// The client is alive (it pinged).
    pub fn seen(&self, client: u128) {
        if let Some(c) = self.table.lock().clients.get_mut(&client) {
            c.0 = Instant::now();
        }
    }

    /// Whether `handle` is counted open on `fid`.
    pub fn holds(&self, fid: Fid, handle: OpenHandle) -> bool {
        self.table
            .lock()
            .files
            .get(&fid)
            .is_some_and(|h| h.contains(&handle))
    }

    /// Whether `handle` holds `fid` alone, and no other handle opened it since `handle` did
    /// (and closed it again): a copy resynced through `handle` then missed no one's writes.
    pub fn alone_since(&self, fid: Fid, handle: OpenHandle) -> bool {
        let t = self.table.lock();
        let Some(opens) = t.files.get(&fid) else {
            return false;
        };
        opens.handles.len() == 1
            && opens
                .handles
                .get(&handle)
                .is_some_and(|h| h.order == opens.latest)
    }

    pub fn is_open(&self, fid: Fid) -> bool {
        self.table.lock().files.contains_key(&fid)
    }

    /// Handles counted now.
    pub fn handles(&self) -> usize {
        self.table.lock().handles
    }

    /// Drops every handle of the clients not heard from for `silent`; returns those clients.
    pub fn evict(&self, silent: Duration) -> Vec<u128> {
        let mut t = self.table.lock();
        let t = &mut *t;
        let now = Instant::now();
        let gone: Vec<u128> = t
            .clients
            .iter()
            .filter(|(_, (seen, _))| now.duration_since(*seen) >= silent)
            .map(|(c, _)| *c)
            .collect();
        for client in &gone {
            let Some((_, held)) = t.clients.remove(client) else {
                continue;
            };
            for (fid, handle) in held {
                if let Some(h) = t.files.get_mut(&fid) {
                    let held = h.remove(&OpenHandle {
                        client: *client,
                        handle,
                    });
                    if h.is_empty() {
                        t.files.remove(&fid);
                    }
                    if let Some(held) = held {
                        t.forget(held);
                    }
                }
            }
        }
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(client: u128, handle: u64) -> OpenHandle {
        OpenHandle { client, handle }
    }

    #[test]
    fn a_resent_open_or_close_counts_once() {
        let t = OpenFiles::default();
        let f = Fid::new(0x200000400, 1, 0);
        assert_eq!(t.open(f, h(1, 1), 4, None), Ok(4));
        assert_eq!(
            t.open(f, h(1, 1), 2, None),
            Ok(6),
            "the resend keeps what it had"
        );
        assert_eq!(
            t.open(f, h(2, 1), 0, None),
            Ok(0),
            "another client's handle"
        );
        assert_eq!(t.rights(f, h(2, 1)), Some(0));
        t.close(f, h(1, 1));
        t.close(f, h(1, 1));
        assert!(t.is_open(f), "the other handle still holds the file");
        t.close(f, h(2, 1));
        assert!(!t.is_open(f));
        assert_eq!(t.handles(), 0);
    }

    #[test]
    fn a_handle_is_alone_since_its_open_only_if_no_other_opened_meanwhile() {
        let t = OpenFiles::default();
        let f = Fid::new(0x200000400, 1, 0);
        t.open(f, h(1, 1), 6, None).unwrap();
        t.open(f, h(9, 1), 6, None).unwrap(); // the resync's
        t.close(f, h(1, 1)); // a writer from before, gone: its writes were in the source
        assert!(t.alone_since(f, h(9, 1)));
        // A writer opens and closes again while the copy is made: the copy may miss it.
        t.open(f, h(2, 1), 6, None).unwrap();
        assert!(!t.alone_since(f, h(9, 1)), "another handle is open");
        t.close(f, h(2, 1));
        assert!(!t.alone_since(f, h(9, 1)), "another handle opened since");
        assert!(
            t.open(f, h(9, 1), 6, None).is_ok(),
            "the resync's resent open"
        );
        assert!(!t.alone_since(f, h(9, 1)), "a resend is not a new open");
        assert!(!t.alone_since(f, h(3, 3)), "not open at all");
    }

    #[test]
    fn a_silent_client_is_evicted_and_a_pinging_one_is_not() {
        let t = OpenFiles::default();
        let (f, g) = (Fid::new(0x200000400, 1, 0), Fid::new(0x200000400, 2, 0));
        t.open(f, h(1, 1), 4, None).unwrap();
        t.open(g, h(2, 1), 4, None).unwrap();
        std::thread::sleep(Duration::from_millis(30));
        t.seen(2);
        assert_eq!(t.evict(Duration::from_millis(20)), vec![1]);
        assert!(!t.is_open(f));
        assert!(t.is_open(g));
        assert_eq!(t.handles(), 1);
    }

    #[test]
    fn one_client_cannot_fill_the_table() {
        let t = OpenFiles::default();
        for i in 0..MAX_HANDLES_PER_CLIENT as u64 {
            t.open(Fid::new(0x200000400, i as u32 + 1, 0), h(1, i), 4, None)
                .unwrap();
        }
        let f = Fid::new(0x200000400, 1, 0);
        assert_eq!(
            t.open(f, h(1, u64::MAX), 4, None),
            Err(OpenRefused::ClientFull)
        );
        assert_eq!(
            t.open(f, h(1, 0), 4, None),
            Ok(4),
            "a handle it holds counts again"
        );
        assert_eq!(t.open(f, h(2, 0), 4, None), Ok(4), "another client opens");
    }

    #[test]
    fn one_node_cannot_fill_the_table_whatever_its_client_ids() {
        let t = OpenFiles::default();
        let node: Option<IpAddr> = Some("10.0.0.66".parse().unwrap());
        let mut i = 0u32;
        let mut open = |client: u128, node: Option<IpAddr>| {
            i += 1;
            t.open(
                Fid::new(0x200000400, i, 0),
                h(client, u64::from(i)),
                4,
                node,
            )
        };
        let per_client = MAX_HANDLES_PER_CLIENT as u128;
        let mut held = 0;
        'ids: for client in 1.. {
            for _ in 0..per_client {
                match open(client, node) {
                    Ok(_) => held += 1,
                    Err(e) => {
                        assert_eq!(e, OpenRefused::NodeFull);
                        break 'ids;
                    }
                }
            }
        }
        assert_eq!(held, MAX_HANDLES_PER_NODE);
        assert!(
            open(999, Some("10.0.0.7".parse().unwrap())).is_ok(),
            "another node"
        );
        assert!(open(999, None).is_ok(), "a server");
        // A close gives the node its room back.
        t.close(Fid::new(0x200000400, 1, 0), h(1, 1));
        assert!(open(1000, node).is_ok());
    }
}
