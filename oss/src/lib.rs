//! The object storage server: storage targets holding the stripes of files as objects, on
//! local disks through io_uring, with a checksum on every block.
//!
//! - [`engine`]: how bytes reach the disk (io_uring, psync, and an in-memory crash simulator).
//!
//! File data arrives and leaves through the network layer's bulk transfers; this crate never
//! sees a path of the namespace, only objects.

pub mod engine;
