//! What the cross-crate tests share: starting lode's server binaries as real processes on
//! loopback, reading the address they print, and stopping them (gently or with `kill -9`).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use proto::Nid;

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
    /// last word.
    pub fn start(bin: &str, args: &[&str]) -> Result<Server, String> {
        let path = bin_dir().join(bin);
        if !path.exists() {
            return Err(format!(
                "{} is not built: run the whole workspace's tests (cargo nextest run --workspace), which build every server",
                path.display()
            ));
        }
        let mut child = Command::new(&path)
            .args(args)
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

/// Runs `bin` to completion and returns (success, stdout, stderr).
pub fn run(bin: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(bin_dir().join(bin))
        .args(args)
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
