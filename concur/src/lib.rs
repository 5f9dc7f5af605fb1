//! The concurrent structures that guard acknowledged data, kept free of any async runtime so
//! that [loom](https://docs.rs/loom) can explore their interleavings (`--cfg loom`, see
//! `tests/loom.rs`). Each holds only the state and the rule; the code around it waits in its
//! own way (a tokio `Notify`, a thread):
//!
//! - [`range::RangeLocks`]: the byte ranges of a registered memory region that transfers hold,
//!   and its revocation when the owner takes the memory back;
//! - [`order::WriteOrder`]: a client's writes in flight, their xids and the oldest one, and
//!   which must wait for an earlier overlapping write;
//! - [`commit::CommitQueue`]: the MDS's group-commit queue between the threads that apply
//!   changes and the one that journals them;
//! - [`replies::ReplyCache`]: the MDS's replies to clients' latest requests, checked and
//!   recorded under one lock so a resend racing its first attempt is never carried out twice.

pub mod commit;
pub mod order;
pub mod range;
pub mod replies;
mod shim;
