//! Messages between storage servers and the MDS's registry of targets: a server registers its
//! targets when it starts (and is given indices for new ones), then heartbeats with their space.

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
pub struct HeartbeatAck {}

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
