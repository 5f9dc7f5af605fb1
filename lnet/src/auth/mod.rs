//! Who may talk to a lode node: cluster and client keys, the handshake that proves a peer holds
//! one, the protection of every frame after it, and capabilities for object I/O.
//!
//! The cryptography is Noise (`snow`) for the handshake and AWS-LC (`aws-lc-rs`) for HKDF,
//! AES-256-GCM and HMAC; nothing here implements a primitive.

pub mod capability;
pub mod key;
pub mod session;

use std::path::PathBuf;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub use capability::{CapabilityKey, Rights};
pub use key::{KeyFile, KeyKind, Keyring, Role};
pub use session::{Protection, Security, Session};

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("key file {path}: {reason}")]
    KeyFile { path: PathBuf, reason: String },
    #[error("no key ({looked}): make one with `lode key new FILE`, or turn authentication off explicitly")]
    NoKey { looked: String },
    #[error("bad key: {0}")]
    BadKey(String),
    #[error("the random source failed")]
    Random,
    #[error("refused: {0}")]
    Refused(String),
    #[error("handshake failed: {0}")]
    Handshake(String),
    #[error("handshake timed out after {0:?}")]
    Timeout(Duration),
    #[error("a record failed its integrity check")]
    Forged,
    #[error("sealing a record failed")]
    Seal,
    #[error("the connection used up its nonces")]
    Exhausted,
    #[error("handshake I/O: {0}")]
    Io(#[from] std::io::Error),
}

/// Runs the initiator's side of the handshake on a fresh connection.
pub async fn initiate<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    security: &Security,
    timeout: Duration,
) -> Result<Session, AuthError> {
    let run = async {
        let (init, first) = session::Initiator::start(security)?;
        stream.write_all(&first).await?;
        stream.flush().await?;
        let mut head = [0u8; 4];
        stream.read_exact(&mut head).await?;
        let len = usize::from(u16::from_be_bytes([head[2], head[3]]));
        if len > session::MAX_HANDSHAKE_MSG {
            return Err(AuthError::Handshake("reply too long".into()));
        }
        let mut msg = vec![0u8; len];
        stream.read_exact(&mut msg).await?;
        init.finish(head[0], head[1], &msg)
    };
    tokio::time::timeout(timeout, run)
        .await
        .map_err(|_| AuthError::Timeout(timeout))?
}

/// Runs the responder's side. A refusal is sent to the peer before it is returned.
pub async fn accept<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    security: &Security,
    timeout: Duration,
) -> Result<(Session, Role), AuthError> {
    let run = async {
        let mut fixed = [0u8; session::HELLO_LEN + 2];
        stream.read_exact(&mut fixed).await?;
        let hello = session::Hello::parse(&fixed)?;
        let mut msg = vec![0u8; hello.msg_len];
        stream.read_exact(&mut msg).await?;
        let answer = session::respond(security, &hello, &msg);
        stream.write_all(&answer.reply).await?;
        stream.flush().await?;
        answer.outcome
    };
    tokio::time::timeout(timeout, run)
        .await
        .map_err(|_| AuthError::Timeout(timeout))?
}

/// Where a client looks for its key when none is named: `$LODE_KEY`, then this file.
pub const DEFAULT_CLIENT_KEY: &str = "/etc/lode/client.key";

/// A server's settings from its key file, or authentication off by explicit choice (logged).
pub fn server_security(
    key: Option<&std::path::Path>,
    auth_off: bool,
    privacy: bool,
) -> Result<Security, AuthError> {
    match (key, auth_off) {
        (Some(_), true) => Err(AuthError::BadKey(
            "a key file and authentication off: choose one".into(),
        )),
        (None, true) => {
            tracing::warn!(
                "authentication is OFF: anyone who can reach this server can read, change and destroy everything"
            );
            Ok(Security::Off)
        }
        (Some(path), false) => Security::server(std::sync::Arc::new(Keyring::load(path)?), privacy),
        (None, false) => Err(AuthError::NoKey {
            looked: "no key file given".into(),
        }),
    }
}

/// A client's settings: the key file named, else `$LODE_KEY`, else [`DEFAULT_CLIENT_KEY`];
/// or authentication off by explicit choice (logged).
pub fn client_security(
    key: Option<&std::path::Path>,
    auth_off: bool,
    privacy: bool,
) -> Result<Security, AuthError> {
    if auth_off {
        if key.is_some() {
            return Err(AuthError::BadKey(
                "a key file and authentication off: choose one".into(),
            ));
        }
        tracing::warn!("authentication is OFF for this client");
        return Ok(Security::Off);
    }
    let from_env = std::env::var_os("LODE_KEY").map(PathBuf::from);
    let path = match (key, from_env) {
        (Some(k), _) => k.to_owned(),
        (None, Some(k)) => k,
        (None, None) if std::path::Path::new(DEFAULT_CLIENT_KEY).exists() => {
            PathBuf::from(DEFAULT_CLIENT_KEY)
        }
        (None, None) => {
            return Err(AuthError::NoKey {
                looked: format!("no --key, no $LODE_KEY, no {DEFAULT_CLIENT_KEY}"),
            })
        }
    };
    Ok(Security::client(
        std::sync::Arc::new(Keyring::load(&path)?),
        privacy,
    ))
}
