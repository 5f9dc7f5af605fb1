//! The `lst` binary as an operator runs it: a server process on loopback, a client in this
//! process, and a `kill -9` in between.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use std::sync::Arc;

use lnet::auth::{KeyFile, Keyring, Security};
use lnet::tcp::{TcpConfig, TcpEndpoint};
use lnet::{call, Transport};
use proto::msg::{BulkRead, Ping};
use proto::Nid;

const T: Duration = Duration::from_secs(10);

/// The cluster key of this test's servers, in a file (mode 0600).
fn key() -> (std::path::PathBuf, KeyFile) {
    let path = std::env::temp_dir().join(format!("lode-lst-{}.key", std::process::id()));
    if !path.exists() {
        KeyFile::generate().unwrap().save_new(&path).unwrap();
    }
    let key = KeyFile::load(&path).unwrap();
    (path, key)
}

/// Starts `lst serve` and returns it with the NID it printed.
fn serve(listen: &str) -> (Child, Nid) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_lst"))
        .args(["serve", "--listen", listen, "--key"])
        .arg(key().0)
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting lst");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let nid = line
        .trim()
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .expect("lst printed its NID");
    (child, nid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_is_an_error_and_its_restart_is_reached_again() {
    let (mut server, nid) = serve("127.0.0.1:0");
    let client = TcpEndpoint::client(TcpConfig {
        security: Security::client(Arc::new(Keyring::new(&key().1.client_key())), false),
        ..TcpConfig::default()
    });
    call(&client, &nid, &Ping { nonce: 1 }, T).await.unwrap();
    let region = client.register(vec![0u8; 1 << 20]).unwrap();
    let read = BulkRead {
        desc: region.desc(0, 1 << 20, false).unwrap(),
        seed: 9,
    };
    call(&client, &nid, &read, T).await.unwrap();
    assert_eq!(
        region.read(0, 1 << 20).unwrap().as_slice(),
        &lnet::selftest::pattern(9, 1 << 20)[..]
    );

    server.kill().unwrap();
    server.wait().unwrap();
    let err = call(&client, &nid, &Ping { nonce: 2 }, T)
        .await
        .unwrap_err();
    assert!(err.is_retryable(), "{err}");

    let addr = nid.socket_addr().unwrap().to_string();
    let (mut again, nid2) = serve(&addr);
    assert_eq!(nid2, nid);
    let pong = call(&client, &nid, &Ping { nonce: 3 }, T).await.unwrap();
    assert_eq!(pong.nonce, 3);
    again.kill().unwrap();
    again.wait().unwrap();
}
