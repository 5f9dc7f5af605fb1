//! lode's network: RPC and RDMA-style bulk transfer behind one API, over three backends.
//!
//! - [`tcp`]: real sockets through tokio.
//! - [`sim`]: an in-process fabric of named nodes, seeded and deterministic, with latency,
//!   bandwidth, loss, duplication, reordering, partitions and crashes.
//! - `verbs` (feature `verbs`): RDMA hardware through libibverbs, loaded at run time.
//!
//! A caller sees [`Transport`]: typed calls with a deadline, and registration of the memory that
//! bulk transfers move bytes in and out of. A server implements [`Service`]; its handler gets
//! the request and a [`BulkPeer`] that moves bytes with the caller's registered memory. This
//! crate never interprets what it carries beyond the frame and its own self-test service.

pub mod anynet;
pub mod auth;
pub mod device;
pub mod error;
pub mod job;
pub mod jobstats;
pub mod metrics;
pub mod region;
pub mod selftest;
pub mod service;
pub mod sim;
pub mod tcp;
pub mod transport;
#[cfg(feature = "verbs")]
pub mod verbs;

pub use anynet::{AnyNet, Attach};
pub use device::{DeviceDma, DeviceError, DeviceMemory, MemoryKind};
pub use error::{NetError, RegionError};
pub use region::{DmaAccess, DmaBuffer, RegionTable, Registered};
pub use service::{BulkPeer, Incoming, Service};
pub use transport::{call, Transport};
