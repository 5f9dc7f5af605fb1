//! The network layer's errors. Each names the peer and the reason, and says whether a retry
//! can help.

use std::time::Duration;

use proto::{FrameError, Nid, RemoteError};

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("{peer}: no reply within {after:?}")]
    Timeout { peer: Nid, after: Duration },
    #[error("{peer}: busy, retry later")]
    Busy { peer: Nid },
    #[error("{peer}: unreachable: {reason}")]
    Unreachable { peer: Nid, reason: String },
    #[error("{peer}: connection closed: {reason}")]
    Closed { peer: Nid, reason: String },
    #[error("{peer}: {reason}")]
    Refused { peer: Nid, reason: String },
    #[error("{peer}: node is down")]
    NodeDown { peer: Nid },
    #[error("{peer}: {err}")]
    Remote { peer: Nid, err: RemoteError },
    #[error("{peer}: bad frame: {err}")]
    Frame { peer: Nid, err: FrameError },
    #[error("bulk transfer: {0}")]
    Region(#[from] RegionError),
    #[error("bulk transfer of {got} bytes for a descriptor of {expected}")]
    BulkLength { expected: u32, got: usize },
    #[error("bulk transfer checksum mismatch: expected {expected:#010x}, got {actual:#010x}")]
    Checksum { expected: u32, actual: u32 },
    #[error("{nid} is not a {want} NID")]
    WrongNetwork { nid: Nid, want: &'static str },
    #[error("invalid setting: {0}")]
    BadConfig(String),
    #[error("no RDMA device: {0}")]
    NoRdmaDevice(String),
    #[error("this transport cannot reach device memory: {0}")]
    NoDeviceMemory(String),
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

impl NetError {
    /// Whether the same call may succeed if sent again (after the peer restarts, the overload
    /// passes or the partition heals). Whether it is *safe* to resend is the caller's business.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            NetError::Timeout { .. }
                | NetError::Busy { .. }
                | NetError::Unreachable { .. }
                | NetError::Closed { .. }
                | NetError::NodeDown { .. }
        )
    }
}

/// Why an access to registered memory was refused. These are the rules an RDMA NIC enforces.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegionError {
    #[error("no region with key {key:#x} (never registered, deregistered, or its node restarted)")]
    UnknownKey { key: u64 },
    #[error("range {offset}+{len} is outside region {key:#x} of {size} bytes")]
    OutOfBounds {
        key: u64,
        offset: u64,
        len: u64,
        size: u64,
    },
    #[error("range {offset}+{len} of region {key:#x} is outside what the request granted")]
    NotGranted { key: u64, offset: u64, len: u64 },
    #[error("range {offset}+{len} of region {key:#x} is in use by another transfer")]
    Conflict { key: u64, offset: u64, len: u64 },
    #[error("region {key:#x} is device memory, which the CPU does not touch")]
    DeviceMemory { key: u64 },
    #[error("device memory: {0}")]
    Device(String),
}
