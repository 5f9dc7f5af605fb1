//! The metadata server: the namespace, its journal and recovery, atomic rename, layout choice and
//! object allocation, and the registry of storage targets. File data never passes through it.
//!
//! Nothing is built here yet; the crate holds its place in the workspace so the tree shows the
//! architecture (see `docs/architecture.md`).
