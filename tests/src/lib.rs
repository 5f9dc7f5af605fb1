//! What the cross-crate tests share: starting lode's server binaries as real processes on
//! loopback, reading the address they print, and stopping them (gently or with `kill -9`).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use std::sync::{Arc, OnceLock};

use lnet::auth::{KeyFile, Keyring, Security};
use proto::Nid;

/// This test process's cluster key and its client key, in files (mode 0600) as an operator
/// keeps them.
struct Keys {
    dir: PathBuf,
    cluster: KeyFile,
}

fn keys() -> &'static Keys {
    static KEYS: OnceLock<Keys> = OnceLock::new();
    KEYS.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("lode-test-keys-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a key directory");
        let cluster = KeyFile::generate().expect("the random source");
        cluster
            .save_new(&dir.join("cluster.key"))
            .expect("writing the cluster key");
        cluster
            .client_key()
            .save_new(&dir.join("client.key"))
            .expect("writing the client key");
        Keys { dir, cluster }
    })
}

/// The cluster key file the servers this process starts use.
pub fn cluster_key_file() -> PathBuf {
    keys().dir.join("cluster.key")
}

/// The client key file of that cluster (what `LODE_KEY` names for the tools it runs).
pub fn client_key_file() -> PathBuf {
    keys().dir.join("client.key")
}

/// What a server (or a test acting as one) authenticates with.
pub fn server_security() -> Security {
    Security::server(Arc::new(Keyring::new(&keys().cluster)), false).expect("a cluster key")
}

/// What a client authenticates with.
pub fn client_security() -> Security {
    Security::client(Arc::new(Keyring::new(&keys().cluster.client_key())), false)
}

/// The path of this build's binary `name` (`lode`, `lode-mds`, ...).
pub fn bin(name: &str) -> PathBuf {
    bin_dir().join(name)
}

/// The directory holding this build's binaries (`target/<profile>`).
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>
    exe.parent()
        .and_then(Path::parent)
        .expect("target directory")
        .to_path_buf()
}

/// A server process, killed when dropped.
pub struct Server {
    pub child: Child,
    pub nid: Nid,
    pub first_line: String,
}

impl Server {
    /// Starts `bin` with `args` and waits for the line it prints once serving; the NID is its
    /// last word. The servers get this process's cluster key (unless `args` name a key or turn
    /// authentication off), and the MDS trusts root on this machine (unless `args` say whom
    /// to trust), as `lode cluster up` sets them up.
    pub fn start(bin: &str, args: &[&str]) -> Result<Server, String> {
        let key = cluster_key_file();
        let mut args: Vec<&str> = args.to_vec();
        let server = bin == "lode-mds" || bin == "lode-oss";
        let subcommand = args.first().is_some_and(|a| !a.starts_with('-'));
        if server && !subcommand && !args.iter().any(|a| *a == "--key" || *a == "--no-auth") {
            args.extend(["--key", key.to_str().expect("a UTF-8 temp path")]);
        }
        if bin == "lode-mds" && !subcommand && !args.contains(&"--trust") {
            args.extend(["--trust", "127.0.0.0/8"]);
        }
        let path = bin_dir().join(bin);
        if !path.exists() {
            return Err(format!(
                "{} is not built: run the whole workspace's tests (cargo nextest run --workspace), which build every server",
                path.display()
            ));
        }
        if bin == "lode-mds" && !subcommand {
            format_if_new(&path, &args)?;
        }
        let mut child = Command::new(&path)
            .args(&args)
            .env("LODE_KEY", client_key_file())
            .stdout(Stdio::piped())
            // LODE_TEST_LOGS=1 shows the servers' logs, for debugging a test.
            .stderr(if std::env::var_os("LODE_TEST_LOGS").is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .spawn()
            .map_err(|e| format!("starting {}: {e}", path.display()))?;
        let mut line = String::new();
        let stdout = child.stdout.take().ok_or("no stdout")?;
        BufReader::new(stdout)
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
        if line.is_empty() {
            let status = child.wait().map_err(|e| e.to_string())?;
            return Err(format!("{bin} exited ({status}) before serving"));
        }
        let nid = line
            .split_whitespace()
            .last()
            .and_then(|w| w.parse().ok())
            .ok_or_else(|| format!("{bin} printed {line:?}"))?;
        Ok(Server {
            child,
            nid,
            first_line: line,
        })
    }

    /// `kill -9`.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then waits for the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        // SAFETY: kill with a pid we started and a signal number.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().expect("waiting for the server")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `lode-mds format` on the data directory `args` name, if it holds no filesystem yet: the
/// step an operator (or the first `lode cluster up`) takes once before the first start.
fn format_if_new(mds: &Path, args: &[&str]) -> Result<(), String> {
    let Some(dir) = args
        .iter()
        .position(|a| *a == "--data-dir")
        .and_then(|i| args.get(i + 1))
        .map(Path::new)
    else {
        return Ok(());
    };
    if ["filesystem", "snapshot", "journal"]
        .iter()
        .any(|f| dir.join(f).exists())
    {
        return Ok(());
    }
    let out = Command::new(mds)
        .args(["format", "--data-dir"])
        .arg(dir)
        .output()
        .map_err(|e| format!("running lode-mds format: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "lode-mds format --data-dir {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// Runs `bin` to completion and returns (success, stdout, stderr).
pub fn run(bin: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(bin_dir().join(bin))
        .args(args)
        .env("LODE_KEY", client_key_file())
        .output()
        .expect("running a binary");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A fresh directory for one test.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("lode-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch directory");
    d
}

/// An MDS that commits only when a client waits for it (every change is answered while only
/// in its memory), with a short recovery window: for kill -9 and replay.
pub fn mds_committing_late(root: &Path, listen: &str) -> Server {
    Server::start(
        "lode-mds",
        &[
            "--data-dir",
            root.join("mds").to_str().expect("a UTF-8 path"),
            "--listen",
            listen,
            "--commit-interval-ms",
            "600000",
            "--recovery-window-s",
            "4",
        ],
    )
    .expect("starting lode-mds")
}

/// An MDS with its data in `root/mds`, on a free port of loopback.
pub fn mds_of(root: &Path) -> Server {
    Server::start(
        "lode-mds",
        &[
            "--data-dir",
            root.join("mds").to_str().expect("a UTF-8 path"),
            "--listen",
            "127.0.0.1:0",
        ],
    )
    .expect("starting lode-mds")
}

/// A storage server with its data in `dir`, heartbeating every second to `mds`.
pub fn oss_of(dir: &Path, mds: &Nid) -> Server {
    Server::start(
        "lode-oss",
        &[
            "--data-dir",
            dir.to_str().expect("a UTF-8 path"),
            "--mds",
            &mds.to_string(),
            "--listen",
            "127.0.0.1:0",
            "--heartbeat",
            "1",
        ],
    )
    .expect("starting lode-oss")
}

/// A client that waits out an MDS restart (30 s) and pings twice a second.
pub async fn client_riding_restarts(mds: &Nid) -> client::Client {
    let cfg = client::ClientConfig {
        security: Some(client_security()),
        retry_for: std::time::Duration::from_secs(30),
        ping_every: std::time::Duration::from_millis(500),
        ..Default::default()
    };
    client::Client::connect_with(&mds.to_string(), cfg)
        .await
        .expect("connecting a client")
}

/// An S3-compatible server for the HSM tests: moto's (`pip install 'moto[server]'`), started
/// on a free port of loopback with one bucket made; killed when dropped.
pub struct S3Server {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
}

/// The access key the tests' S3 server takes (moto takes any).
pub const S3_KEY: (&str, &str) = ("lode-test", "lode-test-secret");

impl S3Server {
    pub fn start(bucket: &str) -> S3Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect(
                "moto_server, an S3-compatible server for the HSM tests: pip install 'moto[server]'",
            );
        let s = S3Server {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
        };
        let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            if s.request("PUT", &format!("/{bucket}"))
                .is_ok_and(|r| r.contains(" 200 "))
            {
                return s;
            }
            assert!(
                std::time::Instant::now() < until,
                "the S3 server at {} did not start",
                s.endpoint
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// One request with no body; the status line.
    fn request(&self, method: &str, path: &str) -> std::io::Result<String> {
        use std::io::{Read, Write};
        let addr = self.endpoint.trim_start_matches("http://");
        let mut c = std::net::TcpStream::connect(addr)?;
        write!(
            c,
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )?;
        let mut out = String::new();
        c.read_to_string(&mut out)?;
        Ok(out.lines().next().unwrap_or("").to_string())
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A copytool (`lode-copytool`, with the cluster key and the tests' S3 key) working for the MDS
/// at `mds`; killed when dropped.
pub struct Copytool(pub Child);

impl Copytool {
    pub fn start(mds: &Nid) -> Copytool {
        let child = Command::new(bin("lode-copytool"))
            .args(["--mds", &mds.to_string(), "--key"])
            .arg(cluster_key_file())
            .args(["--part-size", "1M", "--streams", "4"])
            .env("AWS_ACCESS_KEY_ID", S3_KEY.0)
            .env("AWS_SECRET_ACCESS_KEY", S3_KEY.1)
            .env_remove("AWS_PROFILE")
            .stdout(Stdio::null())
            .stderr(if std::env::var_os("LODE_TEST_LOGS").is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .spawn()
            .expect("starting lode-copytool");
        Copytool(child)
    }

    /// `kill -9`.
    pub fn kill(mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Copytool {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
