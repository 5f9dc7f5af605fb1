//! The `lode` command's own behaviour, without a cluster. (Building this test also builds the
//! binary the cross-crate tests run.)

use std::process::Command;

fn lode(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_lode"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn help_names_every_command() {
    let (ok, out) = lode(&["--help"]);
    assert!(ok);
    for cmd in [
        "cluster",
        "setstripe",
        "getstripe",
        "df",
        "ls",
        "cat",
        "cp",
        "mkdir",
        "rm",
        "mv",
        "stat",
        "bench",
        "mount",
        "umount",
    ] {
        assert!(out.contains(cmd), "{cmd} missing from:\n{out}");
    }
}

#[test]
fn cluster_status_of_an_unused_directory_says_so() {
    let dir = std::env::temp_dir().join(format!("lode-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ok, out) = lode(&["cluster", "status", "--dir", dir.to_str().unwrap()]);
    assert!(ok, "{out}");
    assert!(out.contains("no cluster has run"), "{out}");
    let (ok, out) = lode(&["cluster", "down", "--dir", dir.to_str().unwrap()]);
    assert!(ok && out.contains("0 processes stopped"), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_mount_options_are_refused_by_name() {
    let (ok, out) = lode(&[
        "--mds",
        "127.0.0.1:1",
        "mount",
        "--daemon",
        "/tmp",
        "-o",
        "bogus",
    ]);
    assert!(!ok);
    assert!(out.contains("unknown mount option \"bogus\""), "{out}");
    let (ok, out) = lode(&[
        "--mds",
        "127.0.0.1:1",
        "mount",
        "--daemon",
        "/nonexistent-mountpoint",
    ]);
    assert!(!ok && out.contains("not a directory"), "{out}");
}
