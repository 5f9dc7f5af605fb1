//! The vocabulary every lode process shares: identifiers (FIDs, NIDs), the frame that carries
//! every message, the message bodies and the status codes carried back in replies.
//!
//! This crate does no I/O and owns no threads. Everything here is plain data and pure functions,
//! so every other crate (and every fuzz target) can use it without a runtime.

pub mod bulk;
pub mod capa;
pub mod crypt;
pub mod dirstripe;
pub mod fid;
pub mod frame;
pub mod hsm;
pub mod job;
pub mod layout;
pub mod md;
pub mod msg;
pub mod nid;
pub mod ost;
pub mod registry;
pub mod rules;
pub mod seq;
pub mod size;
pub mod stats;
pub mod status;

pub use bulk::BulkDesc;
pub use fid::Fid;
pub use frame::{FrameError, FrameKind, Header, HEADER_LEN, MAX_BODY, MAX_BULK, MAX_EAGER};
pub use job::JobId;
pub use msg::{Opcode, Rpc};
pub use nid::{Net, Nid, NidError};
pub use status::{FsErrorKind, RemoteError, StatusCode};
