//! The lode client library: what ML code links to reach a lode filesystem.
//!
//! - [`Client`]: a connection to a filesystem; paths, directories, links, renames, layouts.
//! - [`File`] and [`OpenOptions`]: striped parallel reads and writes, straight into memory the
//!   caller registered.
//! - [`blocking`]: the same for callers without an async runtime.
//! - [`readahead`] and [`writebehind`]: which reads to have on their way and when a write may
//!   go, as plain state machines; [`plan`]: which pieces a read or write takes from which
//!   copies.
//!
//! The modules stand in floors, each importing only its own floor and those below: plain
//! data (`plan`, `readahead`, `writebehind`, `replay`, `requests`, `unstable`, `error`, `gpu`),
//! the MDS session (`client`, `lease`, `pending`, `closing`, `opens`, `kept`, `caps`), joining
//! (`connect`: the session's background work), files (`file/`, one module per operation, and
//! `early`), tools (`mirrors`, `blocking`). `scripts/check-architecture.py` checks it.
//!
//! Metadata goes to the MDS; file data goes to and from the storage servers directly, one
//! stream per stripe, in parallel. This crate holds no server, no mount and no command line:
//! those are `lode-mount` and `lode-cli`, built on it.

pub mod blocking;
mod caps;
pub mod client;
mod closing;
mod connect;
pub mod crypt;
pub mod early;
mod encrypted;
pub mod error;
pub mod file;
pub mod gpu;
pub mod hsm;
mod kept;
pub mod lease;
pub mod mirrors;
mod opens;
pub mod pending;
pub mod plan;
pub mod readahead;
pub mod replay;
mod requests;
mod sessions;
pub mod stripe_args;
mod striped;
mod unstable;
pub mod writebehind;

pub use client::{parse_nid, raid0, Client, ClientConfig, Clock, ROOT};
pub use early::EarlyRead;
pub use error::{ClientError, Result};
pub use file::{At, Behind, Chunk, File, OpenOptions, Reader, Writer};
pub use readahead::{Access, Readahead};
pub use writebehind::{Step, WriteBehind};

/// Maps every metadata call looks up, keyed by FIDs: hashed with foldhash (seeded at random
/// per process) instead of SipHash. The keys are numbers the MDS hands out.
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
pub(crate) type FastSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
