//! The lode client: the library ML code links, the `lode` command, and local clusters.
//!
//! - [`Client`]: a connection to a filesystem; paths, directories, links, renames, layouts.
//! - [`File`] and [`OpenOptions`]: striped parallel reads and writes, straight into memory the
//!   caller registered.
//! - [`blocking`]: the same for callers without an async runtime.
//! - [`fuse`]: the POSIX mount.
//!
//! Metadata goes to the MDS; file data goes to and from the storage servers directly, one
//! stream per stripe, in parallel.

pub mod blocking;
pub mod client;
pub mod error;
pub mod file;
pub mod fuse;
pub mod stream;
pub mod stripe_args;

pub use client::{parse_nid, raid0, Client, ClientConfig, ROOT};
pub use error::{ClientError, Result};
pub use file::{File, OpenOptions, Reader, Writer};
