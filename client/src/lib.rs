//! The client: the library (striped parallel I/O straight into caller-owned memory), the `lode`
//! command, the FUSE mount and the Python bindings.
//!
//! Nothing is built here yet; the crate holds its place in the workspace so the tree shows the
//! architecture (see `docs/architecture.md`).
