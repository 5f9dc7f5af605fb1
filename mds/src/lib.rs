//! The metadata server: the namespace, its journal and recovery, atomic rename, layout choice and
//! object allocation, and the registry of storage targets. File data never passes through it.
//!
//! [`server::MdsServer`] assembles the pieces and runs them on any network; `lode-mds` and
//! in-process clusters start it the same way.

pub mod alloc;
pub mod audit;
pub mod disk;
pub mod identity;
pub mod journal;
pub mod lease;
pub mod metrics;
pub mod namespace;
pub mod open;
pub mod placement;
pub mod recovery;
pub mod registry;
pub mod reserve;
pub mod server;
pub mod service;
pub mod store;

pub use server::{MdsConfig, MdsServer};
