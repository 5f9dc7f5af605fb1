//! lode-mds as a process: its registry over the network, its data directory lock, and its
//! state across `kill -9`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use lnet::auth::{KeyFile, Keyring, Security};
use lnet::call;
use lnet::tcp::{TcpConfig, TcpEndpoint};
use proto::registry::{Heartbeat, ListTargets, RegisterTargets, TargetReport};
use proto::Nid;

/// The cluster key of the test's cluster, in `dir`'s parent (made once).
fn key_for(dir: &std::path::Path) -> (std::path::PathBuf, KeyFile) {
    let path = dir.with_extension("key");
    if !path.exists() {
        KeyFile::generate().unwrap().save_new(&path).unwrap();
    }
    let key = KeyFile::load(&path).unwrap();
    (path, key)
}

/// `lode-mds format` on `dir`, as an operator makes a filesystem.
fn format(dir: &std::path::Path) {
    format_with(&["--data-dir", dir.to_str().unwrap()]);
}

/// `lode-mds format ARGS`, which must succeed.
fn format_with(args: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_lode-mds"))
        .arg("format")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("formatted filesystem lode"));
}

fn start(dir: &std::path::Path, listen: &str) -> (Child, Option<Nid>) {
    let (key, _) = key_for(dir);
    let mut child = Command::new(env!("CARGO_BIN_EXE_lode-mds"))
        .args(["--data-dir", dir.to_str().unwrap(), "--listen", listen])
        .arg("--key")
        .arg(&key)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (
        child,
        line.split_whitespace().last().and_then(|w| w.parse().ok()),
    )
}

#[tokio::test]
async fn registrations_survive_kill_9_and_a_second_instance_is_refused() {
    let dir = std::env::temp_dir().join(format!("lode-mds-proc-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    format(&dir);
    let (mut mds, nid) = start(&dir, "127.0.0.1:0");
    let nid = nid.expect("lode-mds printed its NID");

    let (second, none) = start(&dir, "127.0.0.1:0");
    assert!(none.is_none());
    let out = second.wait_with_output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use by process"));

    // A storage server's part: it holds the cluster key.
    let (_, key) = key_for(&dir);
    let keys = Arc::new(Keyring::new(&key));
    let c = TcpEndpoint::client(TcpConfig {
        security: Security::server(keys.clone(), false).unwrap(),
        ..TcpConfig::default()
    });
    let t = Duration::from_secs(10);
    // A client key cannot register or heartbeat a target; no key gets nothing.
    let client_key = Arc::new(Keyring::new(&key.client_key()));
    let as_client = TcpEndpoint::client(TcpConfig {
        security: Security::client(client_key, false),
        ..TcpConfig::default()
    });
    let forged = TargetReport {
        index: Some(0),
        uuid: 7,
        fs: None,
        total: 10,
        free: 5,
    };
    let hijack = RegisterTargets {
        oss: "127.0.0.1:6666@tcp".parse().unwrap(),
        rails: vec![],
        targets: vec![forged.clone()],
    };
    let err = call(&as_client, &nid, &hijack, t).await.unwrap_err();
    assert!(err.to_string().contains("servers only"), "{err}");
    let beat = Heartbeat {
        oss: "127.0.0.1:6666@tcp".parse().unwrap(),
        rails: vec![],
        targets: vec![forged],
    };
    let err = call(&as_client, &nid, &beat, t).await.unwrap_err();
    assert!(err.to_string().contains("servers only"), "{err}");
    let nobody = TcpEndpoint::client(TcpConfig::default());
    let err = call(&nobody, &nid, &ListTargets {}, t).await.unwrap_err();
    assert!(matches!(err, lnet::NetError::Refused { .. }), "{err}");
    let stranger = TcpEndpoint::client(TcpConfig {
        security: Security::client(Arc::new(Keyring::new(&KeyFile::generate().unwrap())), false),
        ..TcpConfig::default()
    });
    let err = call(&stranger, &nid, &ListTargets {}, t).await.unwrap_err();
    assert!(matches!(err, lnet::NetError::Refused { .. }), "{err}");
    let listed = call(&as_client, &nid, &ListTargets {}, t).await.unwrap();
    assert!(listed.targets.is_empty(), "nothing was registered");
    let oss: Nid = "127.0.0.1:9999@tcp".parse().unwrap();
    let reports = vec![TargetReport {
        index: None,
        uuid: 42,
        fs: None,
        total: 10,
        free: 5,
    }];
    let got = call(
        &c,
        &nid,
        &RegisterTargets {
            oss: oss.clone(),
            rails: vec![],
            targets: reports,
        },
        t,
    )
    .await
    .unwrap();
    assert_eq!(got.indices, vec![0]);
    mds.kill().unwrap();
    mds.wait().unwrap();

    let (mut again, nid2) = start(&dir, &nid.to_string().replace("@tcp", ""));
    let nid2 = nid2.unwrap();
    let listed = call(&c, &nid2, &ListTargets {}, t).await.unwrap();
    assert_eq!(listed.targets.len(), 1);
    assert_eq!((listed.targets[0].index, listed.targets[0].uuid), (0, 42));
    again.kill().unwrap();
    again.wait().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let _ = std::fs::remove_file(dir.with_extension("key"));
}

#[test]
fn a_config_file_sets_what_flags_do_not_and_typos_are_refused() {
    let dir = std::env::temp_dir().join(format!("lode-mds-conf-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("mds.toml");
    let key = dir.join("cluster.key");
    KeyFile::generate().unwrap().save_new(&key).unwrap();
    let base = format!(
        "data_dir = {:?}\nlisten = \"127.0.0.1:0\"\ncheckpoint_mib = 8\n",
        dir.join("data")
    );
    let refused = |text: String, why: &str| {
        std::fs::write(&conf, text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_lode-mds"))
            .args(["--config", conf.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success() && err.contains(why), "{err}");
    };
    // Without a key and without turning authentication off explicitly, it does not start.
    refused(base.clone(), "lode key new");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).unwrap();
    refused(format!("{base}key_file = {key:?}\n"), "chmod 600");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    refused(
        format!("{base}key_file = {key:?}\ntrusted_nodes = [\"10.0.0.0/40\"]\n"),
        "prefix",
    );
    std::fs::write(
        &conf,
        format!(
            "{base}key_file = {key:?}\ntrusted_nodes = [\"127.0.0.1\"]\n\
             [[nodemap]]\nnodes = [\"10.1.0.0/16\"]\nuids = [[1000, 5000]]\n"
        ),
    )
    .unwrap();
    // Not formatted yet: refused, naming the directory and the format command.
    refused(
        std::fs::read_to_string(&conf).unwrap(),
        "lode-mds format --data-dir",
    );
    assert!(
        !dir.join("data").exists(),
        "a refused start made the directory"
    );
    format_with(&["--config", conf.to_str().unwrap()]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_lode-mds"))
        .args(["--config", conf.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("serving at 127.0.0.1:"), "{line}");
    assert!(dir.join("data").join("lock").exists());
    child.kill().unwrap();
    child.wait().unwrap();

    std::fs::write(&conf, "data_dri = \"/tmp/x\"\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_lode-mds"))
        .args(["--config", conf.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("data_dri"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The operator's slip, as it happened: the MDS's data directory goes missing (a volume that
/// did not mount) and the service manager starts `lode-mds` again with the same command line.
#[tokio::test]
async fn an_mds_on_a_missing_or_reformatted_directory_takes_no_target_of_the_old_filesystem() {
    let dir = std::env::temp_dir().join(format!("lode-mds-slip-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let moved = dir.with_extension("moved");
    let _ = std::fs::remove_dir_all(&moved);
    format(&dir);
    let (_, key) = key_for(&dir);
    let oss_end = TcpEndpoint::client(TcpConfig {
        security: Security::server(Arc::new(Keyring::new(&key)), false).unwrap(),
        ..TcpConfig::default()
    });
    let t = Duration::from_secs(10);
    let oss: Nid = "127.0.0.1:9998@tcp".parse().unwrap();
    let register = |index, fs| RegisterTargets {
        oss: oss.clone(),
        rails: vec![],
        targets: vec![TargetReport {
            index,
            uuid: 42,
            fs,
            total: 10,
            free: 5,
        }],
    };
    let (mut mds, nid) = start(&dir, "127.0.0.1:0");
    let nid = nid.unwrap();
    let first = call(&oss_end, &nid, &register(None, None), t)
        .await
        .unwrap();
    assert_eq!(first.indices, vec![0]);
    assert_ne!(first.fs, 0);
    mds.kill().unwrap();
    mds.wait().unwrap();

    // The directory is gone: the same command line refuses to serve, and makes nothing.
    std::fs::rename(&dir, &moved).unwrap();
    let (again, none) = start(&dir, "127.0.0.1:0");
    assert!(none.is_none());
    let out = again.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("lode-mds format"),
        "{err}"
    );
    assert!(!dir.exists());
    // An empty directory (the mount point without its volume) is refused the same way.
    std::fs::create_dir_all(&dir).unwrap();
    let (again, none) = start(&dir, "127.0.0.1:0");
    assert!(none.is_none());
    assert!(!again.wait_with_output().unwrap().status.success());

    // Formatted afresh by mistake: a new filesystem, which refuses the old one's target,
    // bound or (made before identities) not.
    std::fs::remove_dir_all(&dir).unwrap();
    format(&dir);
    let (mut wrong, nid) = start(&dir, "127.0.0.1:0");
    let nid = nid.unwrap();
    let bound = call(&oss_end, &nid, &register(Some(0), Some(first.fs)), t)
        .await
        .unwrap_err();
    assert!(
        bound.to_string().contains("belongs to filesystem"),
        "{bound}"
    );
    let unbound = call(&oss_end, &nid, &register(Some(0), None), t)
        .await
        .unwrap_err();
    assert!(unbound.to_string().contains("does not know"), "{unbound}");
    wrong.kill().unwrap();
    wrong.wait().unwrap();

    // The right directory back: the target is taken as before.
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::rename(&moved, &dir).unwrap();
    let (mut right, nid) = start(&dir, "127.0.0.1:0");
    let back = call(
        &oss_end,
        &nid.unwrap(),
        &register(Some(0), Some(first.fs)),
        t,
    )
    .await
    .unwrap();
    assert_eq!((back.indices, back.fs), (vec![0], first.fs));
    right.kill().unwrap();
    right.wait().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let _ = std::fs::remove_file(dir.with_extension("key"));
}

/// `format --mdt-index K --fs-uuid U` joins filesystem U as MDT K; MDT K without the uuid, an
/// index past the most, and a malformed uuid are refused with the reason, and nothing is made.
#[test]
fn another_mdt_is_formatted_into_mdt0s_filesystem_and_bad_asks_are_refused() {
    let base = std::env::temp_dir().join(format!("lode-mds-mdt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let (zero, one) = (base.join("mdt0"), base.join("mdt1"));
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_lode-mds"))
            .arg("format")
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&["--data-dir", zero.to_str().unwrap(), "--fsname", "scratch"]);
    assert!(out.status.success());
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    let uuid = printed
        .split(['(', ')'])
        .nth(1)
        .expect("the uuid is printed")
        .to_string();
    for (args, why) in [
        (vec!["--mdt-index", "1"], "--fs-uuid"),
        (
            vec!["--mdt-index", "1", "--fs-uuid", "xyz"],
            "not a filesystem uuid",
        ),
        (vec!["--mdt-index", "256", "--fs-uuid", &uuid], "below 256"),
    ] {
        let mut all = vec!["--data-dir", one.to_str().unwrap(), "--fsname", "scratch"];
        all.extend(args);
        let out = run(&all);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(why), "{err}");
        assert!(!one.join(mds::format::FILE).exists(), "nothing made");
    }
    let out = run(&[
        "--data-dir",
        one.to_str().unwrap(),
        "--fsname",
        "scratch",
        "--mdt-index",
        "1",
        "--fs-uuid",
        &uuid,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("MDT1"));
    let disk = mds::disk::DirDisk::new(&one);
    let id = mds::format::read(&disk, "mdt1").unwrap().unwrap();
    assert_eq!((format!("{:032x}", id.uuid), id.mdt), (uuid, 1));
    // Its namespace numbers inodes in MDT1's sequence, under MDT1's own root.
    let rec = mds::journal::recover(
        &disk,
        mds::namespace::Namespace::for_mdt(1, Default::default()),
    )
    .unwrap();
    assert_eq!(rec.namespace.root(), proto::fid::mdt_root(1));
    assert!(rec.namespace.check().is_empty());
    let _ = std::fs::remove_dir_all(&base);
}
