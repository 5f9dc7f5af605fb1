//! Files held open by clients. A file whose last name goes while it is open stays readable:
//! its objects are kept until the last close.
//!
//! The counts live in memory. After an MDS restart they start at zero (a client's handle on a
//! removed file may then lose its data), and a client that dies without closing keeps its files'
//! objects until the MDS restarts.

use std::collections::HashMap;

use parking_lot::Mutex;
use proto::Fid;

/// Most files counted open at once; past it, opens are refused (EMFILE).
pub const MAX_OPEN_FILES: usize = 1 << 20;

#[derive(Default)]
pub struct OpenFiles {
    counts: Mutex<HashMap<Fid, u32>>,
}

impl OpenFiles {
    /// Counts an open; false if the table is full.
    pub fn open(&self, fid: Fid) -> bool {
        let mut c = self.counts.lock();
        if !c.contains_key(&fid) && c.len() >= MAX_OPEN_FILES {
            return false;
        }
        *c.entry(fid).or_default() += 1;
        true
    }

    pub fn close(&self, fid: Fid) {
        let mut c = self.counts.lock();
        if let Some(n) = c.get_mut(&fid) {
            *n -= 1;
            if *n == 0 {
                c.remove(&fid);
            }
        }
    }

    pub fn is_open(&self, fid: Fid) -> bool {
        self.counts.lock().contains_key(&fid)
    }
}
