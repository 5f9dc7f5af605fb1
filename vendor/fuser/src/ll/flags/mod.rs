//! FUSE flag types.

pub(crate) mod copy_file_range_flags;
pub(crate) mod cuse_init_flags;
pub(crate) mod fattr_flags;
pub(crate) mod fopen_flags;
pub(crate) mod fsync_flags;
pub(crate) mod getattr_flags;
pub(crate) mod init_flags;
pub(crate) mod ioctl_flags;
pub(crate) mod poll_flags;
pub(crate) mod read_flags;
pub(crate) mod release_flags;
pub(crate) mod write_flags;
