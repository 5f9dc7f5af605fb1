//! The POSIX mount: lode through FUSE, so that any tool sees ordinary paths.
//!
//! - [`fs`]: the filesystem's calls (lookup, open, read, write, rename, xattrs...) carried out
//!   through the client library.
//! - [`stream`]: readahead and write-behind per file, between the kernel's small requests and
//!   the striped engine.
//! - `kernel`: how lode's inodes, times and errors look to the kernel (errno is made here).
//! - [`session`]: options, mounting, serving until stopped, unmounting.
//! - [`metrics`]: what the mount counts for its metrics endpoint.
//!
//! Errors from the library become errno values here and nowhere else.

pub mod fs;
mod invalidate;
mod kernel;
mod listings;
pub mod metrics;
mod pages;
pub mod session;
pub mod stream;

pub use fs::LodeFs;
pub use session::{config, mounted, serve, MountError, OPTIONS};
