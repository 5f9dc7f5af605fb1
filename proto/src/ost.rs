//! Messages to an object storage server. Every request names the target (OST index) and,
//! except precreate and statfs, the object. File data moves by bulk transfer: the client's
//! descriptor says where its buffer is.

use serde::{Deserialize, Serialize};

use crate::bulk::BulkDesc;
use crate::capa::Capability;
use crate::msg::{opcodes, Opcode, Rpc};
use crate::Fid;

/// Creates `count` objects for MDT `mdt`, in its sequence on the target
/// ([`crate::fid::object_seq`]); their ids are consecutive from `first`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OstPrecreate {
    pub target: u32,
    pub count: u32,
    pub mdt: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OstPrecreated {
    pub first: Fid,
    pub count: u32,
}

/// Writes `desc.len` bytes pulled from the caller at `offset`. The descriptor must carry the
/// data's crc32c; the server checks it before storing anything.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OstWrite {
    pub target: u32,
    pub fid: Fid,
    pub offset: u64,
    pub desc: BulkDesc,
    /// Durable before the reply.
    pub sync: bool,
    /// Which client sent it, in what order: a write older than one it overlaps that the
    /// server already applied from the same client is refused (Stale), never applied late.
    pub stamp: WriteStamp,
    /// The MDS's capability for this object (see [`crate::capa`]); servers need none.
    pub capa: Option<Capability>,
}

/// A write's place in its client's order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteStamp {
    /// The client's random id; 0 for a write that takes no part in ordering (tools).
    pub client: u64,
    /// The client's number for this write, rising; a resend keeps it.
    pub xid: u64,
    /// The lowest xid the client still waits on: anything older that arrives is stale.
    pub oldest: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OstWritten {
    /// The object's size after the write.
    pub size: u64,
    /// The target's durability epoch (see [`OstAck`]).
    pub epoch: u64,
}

/// The answer to a sync or a punch: the target's durability epoch. It changes only when the
/// target may have lost writes that were not yet synced (its machine restarted), so a client
/// whose unsynced writes were answered under another epoch knows they may be gone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OstAck {
    pub epoch: u64,
}

/// Reads up to `desc.len` bytes at `offset` into the caller's region; short at the end of
/// the object, zeros in holes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OstRead {
    pub target: u32,
    pub fid: Fid,
    pub offset: u64,
    pub desc: BulkDesc,
    /// The MDS's capability for this object (see [`crate::capa`]); servers need none.
    pub capa: Option<Capability>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OstReadDone {
    /// Bytes placed at the start of the descriptor's range. The rest of the range, up to what
    /// was asked, reads as zeros: a hole, the object's end, or zeros the server did not send.
    pub bytes: u32,
    pub size: u64,
    /// The crc32c of the bytes placed, taken from the data the server read and verified
    /// against its stored checksums: the client checks what landed against it (end to end)
    /// wherever it can see the memory.
    pub crc32c: Option<u32>,
}

/// Sets an object's size (durably).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OstTruncate {
    pub target: u32,
    pub fid: Fid,
    pub size: u64,
    /// Its place in the client's order, as a write's: a truncate that arrives late never
    /// cuts a newer write of the same client.
    pub stamp: WriteStamp,
    /// The MDS's capability for this object (see [`crate::capa`]); servers need none.
    pub capa: Option<Capability>,
}

/// The most bytes one [`OstPunch`] may deallocate: a request's work on the server is bounded
/// (a larger hole is punched by several requests).
pub const MAX_PUNCH: u64 = 4 << 30;

/// Deallocates a range of an object (at most [`MAX_PUNCH`] bytes); it reads as zeros.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OstPunch {
    pub target: u32,
    pub fid: Fid,
    pub offset: u64,
    pub len: u64,
    /// Its place in the client's order, as a write's.
    pub stamp: WriteStamp,
    /// The MDS's capability for this object (see [`crate::capa`]); servers need none.
    pub capa: Option<Capability>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OstDestroy {
    pub target: u32,
    pub fid: Fid,
}

/// Most objects one [`OstDestroyMany`] names.
pub const MAX_DESTROY_MANY: usize = 1024;

/// Destroys the objects `fids` of one target (at most [`MAX_DESTROY_MANY`]), durably, with one
/// sync of the target's record of destroyed ids for them all.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OstDestroyMany {
    pub target: u32,
    pub fids: Vec<Fid>,
}

/// The objects of an [`OstDestroyMany`] that were not there (destroyed before, or never
/// handed out); the others are destroyed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OstDestroyedMany {
    pub missing: Vec<Fid>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OstGetattr {
    pub target: u32,
    pub fid: Fid,
    /// The MDS's capability for this object (see [`crate::capa`]); servers need none.
    pub capa: Option<Capability>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OstAttr {
    pub size: u64,
}

/// Makes every write to an object durable.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OstSync {
    pub target: u32,
    pub fid: Fid,
    /// The MDS's capability for this object (see [`crate::capa`]); servers need none.
    pub capa: Option<Capability>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OstDone {}

/// Space and identity of one target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OstStatfs {
    pub target: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetSpace {
    pub index: u32,
    pub total: u64,
    pub free: u64,
}

/// Destroys every object of the target with an id above `keep_up_to`: the objects a crashed
/// MDS had precreated but never given to a file. `run` names the MDS run asking (its
/// instance): a cleanup that arrives again from the run that already had one (a late or
/// duplicated message) destroys nothing precreated since, since that run is handing those out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OstDestroyAbove {
    pub target: u32,
    /// The MDT whose objects these are: only its sequence is cleaned up.
    pub mdt: u32,
    pub keep_up_to: u32,
    pub run: u64,
    /// The filesystem the asking MDS serves: a target bound to another, or to none yet,
    /// refuses.
    pub fs: u128,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OstDestroyedAbove {
    pub destroyed: u32,
}

macro_rules! rpc {
    ($req:ty, $op:expr, $reply:ty) => {
        impl Rpc for $req {
            const OPCODE: Opcode = $op;
            type Reply = $reply;
        }
    };
}

rpc!(OstPrecreate, opcodes::OST_PRECREATE, OstPrecreated);
impl Rpc for OstWrite {
    const OPCODE: Opcode = opcodes::OST_WRITE;
    type Reply = OstWritten;
    fn bulk(&self) -> Option<crate::bulk::BulkGrant> {
        Some(crate::bulk::BulkGrant::of(&self.desc, false))
    }
}

impl Rpc for OstRead {
    const OPCODE: Opcode = opcodes::OST_READ;
    type Reply = OstReadDone;
    fn bulk(&self) -> Option<crate::bulk::BulkGrant> {
        Some(crate::bulk::BulkGrant::of(&self.desc, true))
    }
}
rpc!(OstTruncate, opcodes::OST_TRUNCATE, OstDone);
rpc!(OstPunch, opcodes::OST_PUNCH, OstAck);
rpc!(OstDestroy, opcodes::OST_DESTROY, OstDone);
rpc!(OstDestroyMany, opcodes::OST_DESTROY_MANY, OstDestroyedMany);
rpc!(OstGetattr, opcodes::OST_GETATTR, OstAttr);
rpc!(OstSync, opcodes::OST_SYNC, OstAck);
rpc!(OstStatfs, opcodes::OST_STATFS, TargetSpace);
rpc!(
    OstDestroyAbove,
    opcodes::OST_DESTROY_ABOVE,
    OstDestroyedAbove
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::{decode_body, encode_body};
    use crate::registry::*;
    use crate::Nid;
    use proptest::prelude::*;
    use std::fmt::Debug;

    fn round_trips<T: Serialize + serde::de::DeserializeOwned + PartialEq + Debug>(v: T) {
        let body = encode_body(&v).unwrap();
        assert_eq!(decode_body::<T>(&body).unwrap(), v);
    }

    proptest! {
        #[test]
        fn storage_and_registry_messages_round_trip(target: u32, seq: u64, oid: u32, offset: u64, len: u32,
                                                      key: u64, crc: Option<u32>, sync: bool, uuid: u128,
                                                      total: u64, free: u64, n in 0usize..20) {
            let fid = Fid::new(seq, oid, 0);
            let desc = BulkDesc { key, offset, len, crc32c: crc };
            round_trips(OstPrecreate { target, count: len, mdt: target % 256 });
            round_trips(OstPrecreated { first: fid, count: len });
            let stamp = WriteStamp { client: u64::from(target), xid: offset, oldest: u64::from(len) };
            round_trips(OstWrite { target, fid, offset, desc: desc.clone(), sync, stamp, capa: None });
            round_trips(OstWritten { size: offset, epoch: offset });
            round_trips(OstAck { epoch: offset });
            round_trips(OstRead { target, fid, offset, desc, capa: Some(crate::capa::Capability { rights: 1, expiry: offset, mac: [len as u8; 16] }) });
            round_trips(OstReadDone { bytes: len, size: offset, crc32c: crc });
            round_trips(OstTruncate { target, fid, size: offset, stamp: WriteStamp::default(), capa: None });
            round_trips(OstPunch { target, fid, offset, len: u64::from(len), stamp: WriteStamp::default(), capa: None });
            round_trips(OstDestroy { target, fid });
            round_trips(OstDestroyMany { target, fids: vec![fid; n] });
            round_trips(OstDestroyedMany { missing: vec![fid; n] });
            round_trips(OstGetattr { target, fid, capa: None });
            round_trips(OstAttr { size: offset });
            round_trips(OstSync { target, fid, capa: None });
            round_trips(OstDone {});
            round_trips(OstStatfs { target });
            round_trips(TargetSpace { index: target, total, free });
            let oss: Nid = "127.0.0.1:9500@tcp".parse().unwrap();
            let reports: Vec<_> = (0..n).map(|i| TargetReport { index: (i % 2 == 0).then_some(i as u32), uuid, fs: (i % 3 == 0).then_some(uuid), total, free }).collect();
            round_trips(RegisterTargets { oss: oss.clone(), rails: vec![oss.clone()], targets: reports.clone() });
            round_trips(Registered { indices: (0..n as u32).collect(), fs: uuid, fs_name: "lode".into() });
            round_trips(Heartbeat { oss: oss.clone(), rails: vec![], targets: reports });
            round_trips(ListTargets {});
            round_trips(TargetList { targets: (0..n as u32).map(|index| TargetInfo { index, uuid, oss: oss.clone(), rails: vec![oss.clone()], total, free, up: sync, takes_stripes: !sync }).collect() });
        }
    }
}
