//! The verbs backend on whatever this machine has. Without an RDMA device (CI, laptops) the
//! answer must be a clear error, never a panic.
#![cfg(feature = "verbs")]

use lnet::verbs::{device_names, VerbsNic};
use lnet::{NetError, RegionTable};

#[test]
fn opening_reports_a_missing_device_as_an_error() {
    let names = device_names().unwrap_or_default();
    match VerbsNic::open(Some("no-such-device0")) {
        Err(NetError::NoRdmaDevice(msg)) => assert!(
            msg.contains("no-such-device0") || msg.contains("cannot"),
            "{msg}"
        ),
        Err(other) => panic!("wrong error: {other}"),
        Ok(_) => panic!("opened a device that does not exist"),
    }
    match VerbsNic::open(None) {
        Ok(nic) => {
            assert!(names.contains(&nic.name().to_owned()));
            let table = RegionTable::new(1);
            let region = table.register(vec![0u8; 4096]).unwrap();
            let mr = nic.register(&region).expect("registering 4 KiB of memory");
            let _ = (mr.rkey(), mr.lkey());
        }
        Err(NetError::NoRdmaDevice(msg)) => {
            assert!(
                names.is_empty(),
                "devices {names:?} exist but none opened: {msg}"
            );
            eprintln!("no RDMA device here: {msg}");
        }
        Err(other) => panic!("wrong error: {other}"),
    }
}
