//! File identifiers, as in Lustre: a 64-bit sequence, a 32-bit object id within the sequence and
//! a 32-bit version. A sequence is granted to one server, which then hands out object ids in it
//! without asking anyone, so FIDs are unique cluster-wide without a central counter.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A cluster-wide unique identifier of a file, directory or object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Fid {
    pub seq: u64,
    pub oid: u32,
    pub ver: u32,
}

/// Sequences below this are reserved for well-known objects (the root, the registries).
pub const FIRST_NORMAL_SEQ: u64 = 0x2_0000_0400;

/// The sequence of the MDS's inodes: every file and directory but the root.
pub const INODE_SEQ: u64 = FIRST_NORMAL_SEQ;

/// The root directory (Lustre's `[0x200000007:0x1:0x0]`).
pub const ROOT: Fid = Fid::new(0x2_0000_0007, 1, 0);

/// The sequence of the objects MDT0 allocates on storage target 0; on target `i`, MDT0's
/// objects are in `OST_SEQ_BASE + i` (see [`object_seq`] for the other MDTs').
pub const OST_SEQ_BASE: u64 = 0x1_0000_0000;

/// Most metadata targets (MDTs) one filesystem has; their indices are `0..MAX_MDTS`.
pub const MAX_MDTS: u32 = 256;

/// Where MDT `k`'s objects on a target start: bit 40 and up hold the MDT.
const OBJECT_MDT_SHIFT: u32 = 40;

/// The sequence MDT `mdt` numbers its inodes in. The sequence space is split among the MDTs
/// by their index, once and for all (Lustre's FID location database, computed rather than
/// looked up): a FID names the MDT that owns it, so a client routes a request by the FID
/// alone, and no table has to be kept, replicated or recovered.
pub const fn inode_seq(mdt: u32) -> u64 {
    INODE_SEQ + mdt as u64
}

/// MDT `mdt`'s root directory: the filesystem's root on MDT0; on another MDT, the directory
/// its own tree hangs from, object id 0 of its sequence (which no inode is given).
pub const fn mdt_root(mdt: u32) -> Fid {
    if mdt == 0 {
        ROOT
    } else {
        Fid::new(inode_seq(mdt), 0, 0)
    }
}

/// The MDT that owns the inode `fid`, or `None` for a FID no MDT numbers (an object's, a
/// damaged one). The root is MDT0's.
pub fn mdt_of(fid: Fid) -> Option<u32> {
    if fid == ROOT {
        return Some(0);
    }
    let k = fid.seq.checked_sub(INODE_SEQ)?;
    (k < u64::from(MAX_MDTS)).then_some(k as u32)
}

/// The sequence of the objects MDT `mdt` allocates on storage target `index`. Each MDT
/// precreates its own objects on every target, in a sequence of its own, as Lustre's MDTs do,
/// so no two MDTs ever hand out one object, and one MDT's orphan cleanup never reaches
/// another's. MDT0's is `OST_SEQ_BASE + index`, as it was before there were several.
pub const fn object_seq(index: u32, mdt: u32) -> u64 {
    OST_SEQ_BASE + index as u64 + ((mdt as u64) << OBJECT_MDT_SHIFT)
}

/// The target and the MDT of an object sequence ([`object_seq`]'s inverse), or `None` for a
/// sequence that is no object's.
pub fn object_owner(seq: u64) -> Option<(u32, u32)> {
    let k = seq.checked_sub(OST_SEQ_BASE)?;
    let index = k & ((1 << OBJECT_MDT_SHIFT) - 1);
    let mdt = k >> OBJECT_MDT_SHIFT;
    if index > u64::from(u32::MAX) || mdt >= u64::from(MAX_MDTS) {
        return None;
    }
    Some((index as u32, mdt as u32))
}

impl Fid {
    pub const fn new(seq: u64, oid: u32, ver: u32) -> Self {
        Fid { seq, oid, ver }
    }

    /// The 16-byte little-endian form used as a key on disk: seq, oid, ver.
    pub fn to_bytes(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&self.seq.to_le_bytes());
        b[8..12].copy_from_slice(&self.oid.to_le_bytes());
        b[12..16].copy_from_slice(&self.ver.to_le_bytes());
        b
    }

    pub fn from_bytes(b: [u8; 16]) -> Self {
        let word = |r: std::ops::Range<usize>| {
            let mut w = [0u8; 8];
            w[..r.len()].copy_from_slice(&b[r]);
            u64::from_le_bytes(w)
        };
        Fid {
            seq: word(0..8),
            oid: word(8..12) as u32,
            ver: word(12..16) as u32,
        }
    }
}

/// Lustre's printed form: `[0x200000400:0x1:0x0]`.
impl fmt::Display for Fid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{:#x}:{:#x}:{:#x}]", self.seq, self.oid, self.ver)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("not a FID (expected [0xSEQ:0xOID:0xVER]): {0:?}")]
pub struct FidParseError(pub String);

impl FromStr for Fid {
    type Err = FidParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || FidParseError(s.to_owned());
        let inner = s
            .trim()
            .strip_prefix('[')
            .and_then(|s| s.strip_suffix(']'))
            .ok_or_else(bad)?;
        let mut parts = inner.split(':');
        let mut field = |max: u64| -> Result<u64, FidParseError> {
            let p = parts.next().ok_or_else(bad)?;
            let hex = p.strip_prefix("0x").ok_or_else(bad)?;
            let v = u64::from_str_radix(hex, 16).map_err(|_| bad())?;
            if v > max {
                return Err(bad());
            }
            Ok(v)
        };
        let seq = field(u64::MAX)?;
        let oid = field(u32::MAX as u64)? as u32;
        let ver = field(u32::MAX as u64)? as u32;
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(Fid { seq, oid, ver })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn prints_like_lustre() {
        assert_eq!(
            Fid::new(0x200000400, 1, 0).to_string(),
            "[0x200000400:0x1:0x0]"
        );
    }

    #[test]
    fn rejects_malformed_text() {
        for s in [
            "",
            "[]",
            "[0x1:0x2]",
            "[0x1:0x2:0x3:0x4]",
            "[1:2:3]",
            "[0x1:0x100000000:0x0]",
        ] {
            assert!(s.parse::<Fid>().is_err(), "{s} parsed");
        }
    }

    #[test]
    fn a_fid_names_its_mdt_and_an_object_sequence_its_target_and_mdt() {
        assert_eq!(mdt_of(ROOT), Some(0));
        assert_eq!(mdt_root(0), ROOT);
        assert_eq!(mdt_of(mdt_root(5)), Some(5));
        assert_eq!(mdt_of(Fid::new(INODE_SEQ, 7, 0)), Some(0));
        assert_eq!(mdt_of(Fid::new(inode_seq(3), 7, 0)), Some(3));
        assert_eq!(mdt_of(Fid::new(inode_seq(MAX_MDTS), 7, 0)), None);
        assert_eq!(mdt_of(Fid::new(OST_SEQ_BASE, 7, 0)), None);
        assert_eq!(object_seq(5, 0), OST_SEQ_BASE + 5);
        assert_eq!(object_owner(OST_SEQ_BASE + 5), Some((5, 0)));
        assert_eq!(object_owner(INODE_SEQ), None);
        assert_eq!(object_owner(0), None);
        assert_eq!(
            object_owner(object_seq(u32::MAX, MAX_MDTS - 1)),
            Some((u32::MAX, MAX_MDTS - 1))
        );
        assert_eq!(object_owner(object_seq(0, MAX_MDTS - 1) + (1 << 40)), None);
        // Objects' sequences and inodes' never meet.
        for mdt in [0, 1, MAX_MDTS - 1] {
            for index in [0, 1, 0x3ff, 0xffff, u32::MAX] {
                let s = object_seq(index, mdt);
                assert!(mdt_of(Fid::new(s, 1, 0)).is_none());
                assert_ne!(s, ROOT.seq);
            }
        }
    }

    proptest! {
        #[test]
        fn object_sequences_round_trip(index: u32, mdt in 0..MAX_MDTS) {
            prop_assert_eq!(object_owner(object_seq(index, mdt)), Some((index, mdt)));
        }

        #[test]
        fn text_and_bytes_round_trip(seq: u64, oid: u32, ver: u32) {
            let fid = Fid::new(seq, oid, ver);
            prop_assert_eq!(fid.to_string().parse::<Fid>().unwrap(), fid);
            prop_assert_eq!(Fid::from_bytes(fid.to_bytes()), fid);
        }

        #[test]
        fn byte_order_is_seq_then_oid_then_ver(a: (u64, u32, u32), b: (u64, u32, u32)) {
            let (fa, fb) = (Fid::new(a.0, a.1, a.2), Fid::new(b.0, b.1, b.2));
            prop_assert_eq!(fa.cmp(&fb), a.cmp(&b));
        }
    }
}
