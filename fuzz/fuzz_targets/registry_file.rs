//! The MDS's target registry file, whatever bytes it holds: a list of distinct targets, or a
//! reason the file is damaged; never a panic.
#![no_main]

use std::collections::HashSet;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(list) = mds::registry::decode_file(data) {
        let indices: HashSet<u32> = list.iter().map(|t| t.0).collect();
        let uuids: HashSet<u128> = list.iter().map(|t| t.1).collect();
        assert_eq!(indices.len(), list.len());
        assert_eq!(uuids.len(), list.len());
    }
});
