//! The object storage server: storage targets holding the stripes of files as objects, on
//! local disks through io_uring, with a checksum on every block.
//!
//! - [`engine`]: how bytes reach the disk (io_uring, psync, and an in-memory crash simulator).
//! - [`io_policy`]: which data I/O goes through the page cache, measured per target.
//! - [`object`]: one object's data and checksums, in 4 KiB blocks.
//! - [`target`]: a storage target: a directory of objects and the id counter.
//! - [`service`]: the OST requests of the network, carried out on the targets.
//! - [`server`]: a whole storage server: registration, index assignment, heartbeats, shutdown.
//!
//! File data arrives and leaves through the network layer's bulk transfers; this crate never
//! sees a path of the namespace, only objects.

pub mod engine;
pub mod error;
pub mod io_policy;
pub mod metrics;
pub mod object;
pub mod server;
pub mod service;
pub mod target;

pub use error::TargetError;
pub use server::{OssConfig, OssServer, TargetHome};
pub use target::{ScrubReport, Target};
