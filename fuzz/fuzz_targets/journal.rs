//! Whatever the MDS finds on its disk: a journal or a snapshot of any bytes must recover to a
//! namespace that passes its own checks, or stop with an error; never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mds::disk::{MemDisk, MetaDisk};
use mds::journal;
use mds::namespace::Namespace;

fuzz_target!(|data: &[u8]| {
    let disk = MemDisk::new();
    // The first byte picks which file the rest is.
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let name = if which & 1 == 0 { "journal" } else { "snapshot" };
    disk.replace(name, rest).expect("an in-memory disk takes any bytes");
    let fresh = Namespace::new(proto::md::Time { sec: 0, nsec: 0 });
    if let Ok(r) = journal::recover(&disk, fresh) {
        assert!(r.journal_len <= rest.len() as u64 || name == "snapshot");
        let _ = r.namespace.check();
    }
    let _ = journal::decode_snapshot(rest);
});
