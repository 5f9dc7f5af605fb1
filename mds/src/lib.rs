//! The metadata server: the namespace, its journal and recovery, atomic rename, layout choice and
//! object allocation, and the registry of storage targets. File data never passes through it.
//!
//! Built so far: the [`registry`] of storage targets, served by [`service`]. The namespace
//! comes next (see `docs/architecture.md`).

pub mod alloc;
pub mod journal;
pub mod namespace;
pub mod open;
pub mod registry;
pub mod service;
pub mod store;
