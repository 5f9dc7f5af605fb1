//! Capabilities: what lets a client read or write a file's objects on a storage server.
//!
//! The MDS grants them with every open, signed with a key only servers hold, one MAC per
//! object; a storage server checks the MAC and the expiry without asking the MDS. A client
//! that guesses an object id has no MAC for it.

use serde::{Deserialize, Serialize};

use crate::Fid;

/// The right to read an object (read, getattr).
pub const READ: u8 = 1;
/// The right to change it (write, truncate, punch, sync).
pub const WRITE: u8 = 2;

/// The proof carried in each object request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capability {
    /// [`READ`] and/or [`WRITE`].
    pub rights: u8,
    /// Seconds since the Unix epoch after which it is refused.
    pub expiry: u64,
    /// The MDS's MAC over the target, the object, the rights and the expiry.
    pub mac: [u8; 16],
}

/// One object's MAC in a grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectMac {
    pub target: u32,
    pub object: Fid,
    pub mac: [u8; 16],
}

/// What the MDS hands out for one file: the same rights and expiry for each of its objects.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub rights: u8,
    pub expiry: u64,
    pub objects: Vec<ObjectMac>,
}

impl Grant {
    /// The capability for one object, if the grant covers it.
    pub fn for_object(&self, target: u32, object: Fid) -> Option<Capability> {
        self.objects
            .iter()
            .find(|o| o.target == target && o.object == object)
            .map(|o| Capability {
                rights: self.rights,
                expiry: self.expiry,
                mac: o.mac,
            })
    }
}
