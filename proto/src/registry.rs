//! Messages between storage servers and the MDS's registry of targets: a server registers its
//! targets when it starts (and is given indices for new ones), then heartbeats with their space.
//! And the registry of metadata targets MDT0 keeps: every other MDT's MDS registers with it
//! (again and again, as a heartbeat), and storage servers and clients learn the MDTs from it.

use serde::{Deserialize, Serialize};

use crate::msg::{opcodes, Opcode, Rpc};
use crate::Nid;

/// One target as its server reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetReport {
    /// `None` for a target not yet formatted, asking for an index.
    pub index: Option<u32>,
    /// Chosen by the server when it formats the target; ties the index to this target.
    pub uuid: u128,
    /// The filesystem the target was bound to at its first registration (its MDS's
    /// [`Registered::fs`]); `None` for a target never registered since identities existed.
    pub fs: Option<u128>,
    pub total: u64,
    pub free: u64,
}

/// Registers a server's targets; the reply gives every target's index, in the same order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterTargets {
    /// Where the server is reached; it names the server.
    pub oss: Nid,
    /// Its other addresses (multi-rail): clients use any that answers.
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub rails: Vec<Nid>,
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub targets: Vec<TargetReport>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registered {
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub indices: Vec<u32>,
    /// The filesystem the MDS serves (its uuid, written by `lode-mds format`): every target
    /// records it and refuses an MDS of any other.
    pub fs: u128,
    /// The filesystem's name, for messages.
    pub fs_name: String,
}

/// A server is alive; its targets' space now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heartbeat {
    pub oss: Nid,
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub rails: Vec<Nid>,
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub targets: Vec<TargetReport>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatAck {
    /// The filesystem's other MDTs, as MDT0 knows them (empty from any other MDT): the
    /// storage server registers with each it has not yet.
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub mdts: Vec<MdtInfo>,
}

/// An MDT's MDS (not MDT0's) tells MDT0 where it is serving; sent again every few seconds,
/// so MDT0 knows which MDTs are up. Servers only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterMdt {
    pub mdt: u32,
    /// The filesystem the MDT was formatted into: MDT0 refuses another's.
    pub fs: u128,
    pub nid: Nid,
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub rails: Vec<Nid>,
    /// The inodes the MDT holds, as MDT0 weighs it when it spreads new directories.
    pub inodes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdtRegistered {}

/// Lists the filesystem's MDTs, MDT0 first (answered by MDT0).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListMdts {}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdtInfo {
    pub index: u32,
    pub nid: Nid,
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub rails: Vec<Nid>,
    /// Heard from within the heartbeat timeout (MDT0, answering, is up).
    pub up: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdtList {
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub mdts: Vec<MdtInfo>,
}

impl Rpc for RegisterMdt {
    const OPCODE: Opcode = opcodes::MDS_REGISTER_MDT;
    type Reply = MdtRegistered;
}

impl Rpc for ListMdts {
    const OPCODE: Opcode = opcodes::MDS_LIST_MDTS;
    type Reply = MdtList;
}

/// Lists every registered target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListTargets {}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetInfo {
    pub index: u32,
    pub uuid: u128,
    pub oss: Nid,
    /// The server's other addresses, as it last told them.
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub rails: Vec<Nid>,
    pub total: u64,
    pub free: u64,
    /// Heard from within the heartbeat timeout.
    pub up: bool,
    /// Taking new stripes: up, its orphans cleaned up in this MDS run, and not full. A target
    /// just heard from after an MDS start is up some time before it takes new files.
    pub takes_stripes: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetList {
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub targets: Vec<TargetInfo>,
}

impl Rpc for RegisterTargets {
    const OPCODE: Opcode = opcodes::MDS_REGISTER_TARGETS;
    type Reply = Registered;
}

impl Rpc for Heartbeat {
    const OPCODE: Opcode = opcodes::MDS_HEARTBEAT;
    type Reply = HeartbeatAck;
}

impl Rpc for ListTargets {
    const OPCODE: Opcode = opcodes::MDS_LIST_TARGETS;
    type Reply = TargetList;
}
