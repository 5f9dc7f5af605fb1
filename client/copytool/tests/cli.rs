//! The `lode-copytool` binary as an operator starts it: bad arguments are refused with a
//! clear error before anything connects, and a missing key is named.

use std::process::Command;

fn copytool() -> Command {
    Command::new(env!("CARGO_BIN_EXE_lode-copytool"))
}

#[test]
fn a_bad_part_size_is_refused_with_its_value_named() {
    let out = copytool()
        .args(["--part-size", "lots", "--no-auth"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--part-size lots"), "{err}");
}

#[test]
fn a_missing_key_is_named_and_nothing_runs() {
    let out = copytool()
        .args(["--key", "/nonexistent/cluster.key", "--mds", "127.0.0.1:1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("key"), "{err}");
}
