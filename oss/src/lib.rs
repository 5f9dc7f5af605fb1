//! The object storage server: storage targets holding striped objects on NVMe through io_uring,
//! with checksums on every block.
//!
//! Nothing is built here yet; the crate holds its place in the workspace so the tree shows the
//! architecture (see `docs/architecture.md`).
