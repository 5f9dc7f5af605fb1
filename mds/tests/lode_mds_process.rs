//! lode-mds as a process: its registry over the network, its data directory lock, and its
//! state across `kill -9`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use lnet::call;
use lnet::tcp::{TcpConfig, TcpEndpoint};
use proto::registry::{ListTargets, RegisterTargets, TargetReport};
use proto::Nid;

fn start(dir: &std::path::Path, listen: &str) -> (Child, Option<Nid>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_lode-mds"))
        .args(["--data-dir", dir.to_str().unwrap(), "--listen", listen])
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
    let (mut mds, nid) = start(&dir, "127.0.0.1:0");
    let nid = nid.expect("lode-mds printed its NID");

    let (second, none) = start(&dir, "127.0.0.1:0");
    assert!(none.is_none());
    let out = second.wait_with_output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use by process"));

    let c = TcpEndpoint::client(TcpConfig::default());
    let t = Duration::from_secs(10);
    let oss: Nid = "127.0.0.1:9999@tcp".parse().unwrap();
    let reports = vec![TargetReport {
        index: None,
        uuid: 42,
        total: 10,
        free: 5,
    }];
    let got = call(
        &c,
        &nid,
        &RegisterTargets {
            oss: oss.clone(),
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
}

#[test]
fn a_config_file_sets_what_flags_do_not_and_typos_are_refused() {
    let dir = std::env::temp_dir().join(format!("lode-mds-conf-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("mds.toml");
    std::fs::write(
        &conf,
        format!(
            "data_dir = {:?}\nlisten = \"127.0.0.1:0\"\ncheckpoint_mib = 8\n",
            dir.join("data")
        ),
    )
    .unwrap();
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
