//! What a server says of itself: its clock, what it has served, its targets or its journal,
//! and, for an administrator, the work of each job. `lode top`, `lode health` and
//! `lode jobstats` are built on this one request, which the MDS and every storage server answer.

use serde::{Deserialize, Serialize};

use crate::job::JobId;
use crate::msg::{opcodes, Opcode, Rpc};

/// Most jobs one answer lists (the busiest first).
pub const MAX_JOBS_LISTED: usize = 4096;

/// Asks a server for its status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerStats {
    /// Also list the work of each job: refused to anyone without the cluster key.
    pub jobs: bool,
}

/// A count of one operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpCount {
    /// The opcode's name ("mds_reint", "ost_write").
    pub op: String,
    pub count: u64,
}

/// One storage target as its server sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetStatus {
    pub index: u32,
    pub total: u64,
    pub free: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub reads: u64,
    pub writes: u64,
    /// Why the target's space could not be read, when it could not.
    pub error: Option<String>,
}

/// The MDS's journal.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalStatus {
    /// The last change applied, and the last one on disk.
    pub applied: u64,
    pub committed: u64,
    /// A journal write failed: the MDS takes no more changes until it restarts.
    pub failed: bool,
}

/// The part of a status only the service knows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceStatus {
    /// "mds", "oss", or empty for a service with nothing more to say.
    pub kind: String,
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub targets: Vec<TargetStatus>,
    pub journal: Option<JournalStatus>,
    /// Clients connected (the MDS's table of clients).
    pub clients: u64,
    pub inodes: u64,
}

/// What one job asked of one server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobStat {
    pub job: JobId,
    /// Seconds since the epoch when the server first and last saw the job.
    pub start_unix_s: u64,
    pub last_unix_s: u64,
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub ops: Vec<OpCount>,
    /// Bulk bytes moved for the job: sent to it (reads) and taken from it (writes).
    pub read_bytes: u64,
    pub write_bytes: u64,
}

impl JobStat {
    /// Every request the job made.
    pub fn requests(&self) -> u64 {
        self.ops.iter().map(|o| o.count).sum()
    }
}

/// A server's status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerStatus {
    /// The server's clock, in milliseconds since the epoch, when it answered.
    pub now_unix_ms: u64,
    pub uptime_s: u64,
    /// Whether the server counts requests and jobs at all (off, the counts below are empty).
    pub counting: bool,
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub ops: Vec<OpCount>,
    pub errors: u64,
    pub busy: u64,
    /// Requests admitted and not yet answered.
    pub serving: u64,
    pub service: ServiceStatus,
    /// Each job's work, busiest first; empty unless asked for.
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub jobs: Vec<JobStat>,
}

impl ServerStatus {
    /// Every request served.
    pub fn requests(&self) -> u64 {
        self.ops.iter().map(|o| o.count).sum()
    }
}

impl Rpc for ServerStats {
    const OPCODE: Opcode = opcodes::SERVER_STATS;
    type Reply = ServerStatus;
}
