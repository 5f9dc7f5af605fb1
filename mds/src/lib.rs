//! The metadata server: the namespace, its journal and recovery, atomic rename, layout choice and
//! object allocation, and the registry of storage targets. File data never passes through it.
//!
//! [`server::MdsServer`] assembles the pieces and runs them on any network; `lode-mds` and
//! in-process clusters start it the same way.

pub mod across;
pub mod alloc;
pub mod audit;
pub mod disk;
pub mod format;
pub mod hsm;
pub mod identity;
pub mod journal;
pub mod lease;
pub mod metrics;
pub mod namespace;
pub mod open;
pub mod peers;
pub mod placement;
pub mod recovery;
pub mod registry;
pub mod reserve;
pub mod server;
pub mod service;
pub mod store;

pub use server::{MdsConfig, MdsServer};

/// Maps on the path of every change (inodes, entries, leases, open files), keyed by FIDs and
/// client ids: hashed with foldhash (seeded at random per process) instead of SipHash, which
/// took a tenth of a create's time on the MDS. Keys are numbers the MDS hands out, not names
/// a client picks freely; names stay in ordered maps.
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
/// The set of [`FastMap`].
pub(crate) type FastSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
