//! Keys: the cluster key, the client key derived from it, and what each lets a node do.
//!
//! A key file is one line, readable by its owner only: `lode-key 1 cluster <64 hex digits>`,
//! or `lode-key 2 client <64 hex digits> <64 hex digits>`. The cluster key stays on the
//! servers (and administrators' machines); client machines get the client key, which is
//! derived from the cluster key and cannot be turned back into it. Every secret a connection or
//! a capability uses is derived from one of the two with HKDF, so a client key can
//! authenticate a client and nothing else.
//!
//! The servers also hold a static X25519 key pair derived from the cluster key. A client key
//! carries its public half (the second number), so a client checks, in every handshake, that
//! the server it reached holds the cluster key: another client holding the same client key
//! cannot pose as a server. A client key of format 1 (the secret alone, from before) still
//! works, without that check, and says so when it is loaded.

use std::fmt;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use aws_lc_rs::hkdf;

use super::AuthError;

/// The length of every secret: 256 bits.
pub const SECRET_LEN: usize = 32;

/// What a node proves it is when it connects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Data loaders, mounts, tools: namespace and object I/O under capabilities.
    Client,
    /// The MDS and storage servers: also the registry of targets, precreate and destroy.
    Server,
}

impl Role {
    pub(crate) fn to_byte(self) -> u8 {
        match self {
            Role::Client => 0,
            Role::Server => 1,
        }
    }

    pub(crate) fn from_byte(b: u8) -> Option<Role> {
        match b {
            0 => Some(Role::Client),
            1 => Some(Role::Server),
            _ => None,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Client => "client",
            Role::Server => "server",
        })
    }
}

/// Which key a file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    Cluster,
    Client,
}

impl KeyKind {
    fn name(self) -> &'static str {
        match self {
            KeyKind::Cluster => "cluster",
            KeyKind::Client => "client",
        }
    }
}

/// A key as stored in a key file.
#[derive(Clone)]
pub struct KeyFile {
    pub kind: KeyKind,
    secret: [u8; SECRET_LEN],
    /// The servers' static public key: derived for a cluster key, carried by a client key
    /// (none in a client key of format 1).
    server_public: Option<[u8; SECRET_LEN]>,
}

/// The servers' static X25519 key pair, derived from the cluster key's secret: the private
/// half, and the public half.
fn server_static(cluster: &[u8; SECRET_LEN]) -> ([u8; SECRET_LEN], [u8; SECRET_LEN]) {
    use snow::resolvers::{CryptoResolver, DefaultResolver};
    let private = derive(cluster, b"lode server static x25519");
    let mut public = [0u8; SECRET_LEN];
    // The default resolver always has Curve25519 (the feature is on).
    if let Some(mut dh) = DefaultResolver.resolve_dh(&snow::params::DHChoice::Curve25519) {
        dh.set(&private);
        public.copy_from_slice(dh.pubkey());
    }
    (private, public)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<[u8; SECRET_LEN]> {
    if text.len() != 2 * SECRET_LEN {
        return None;
    }
    let mut out = [0u8; SECRET_LEN];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

impl fmt::Debug for KeyFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyFile({} key)", self.kind.name())
    }
}

impl KeyFile {
    /// A new cluster key from the operating system's random source.
    pub fn generate() -> Result<KeyFile, AuthError> {
        let mut secret = [0u8; SECRET_LEN];
        aws_lc_rs::rand::fill(&mut secret).map_err(|_| AuthError::Random)?;
        Ok(KeyFile::cluster(secret))
    }

    fn cluster(secret: [u8; SECRET_LEN]) -> KeyFile {
        KeyFile {
            kind: KeyKind::Cluster,
            secret,
            server_public: Some(server_static(&secret).1),
        }
    }

    /// The client key of this cluster key (a client key is its own client key).
    pub fn client_key(&self) -> KeyFile {
        KeyFile {
            kind: KeyKind::Client,
            secret: match self.kind {
                KeyKind::Client => self.secret,
                KeyKind::Cluster => derive(&self.secret, b"lode client key"),
            },
            server_public: self.server_public,
        }
    }

    /// Whether this key lets a client check that a server holds the cluster key (every key
    /// but a client key of format 1).
    pub fn checks_servers(&self) -> bool {
        self.server_public.is_some()
    }

    /// The file's one line.
    pub fn to_line(&self) -> String {
        match (self.kind, &self.server_public) {
            (KeyKind::Client, Some(public)) => {
                format!("lode-key 2 client {} {}\n", hex(&self.secret), hex(public))
            }
            _ => format!("lode-key 1 {} {}\n", self.kind.name(), hex(&self.secret)),
        }
    }

    /// Parses a key file's contents.
    pub fn parse(text: &str) -> Result<KeyFile, AuthError> {
        let bad = |why: &str| AuthError::BadKey(why.to_owned());
        let mut words = text.split_whitespace();
        if words.next() != Some("lode-key") {
            return Err(bad("not a lode key (it must start with `lode-key`)"));
        }
        let version = match words.next() {
            Some("1") => 1,
            Some("2") => 2,
            _ => return Err(bad("unknown key format version")),
        };
        let kind = match words.next() {
            Some("cluster") => KeyKind::Cluster,
            Some("client") => KeyKind::Client,
            _ => return Err(bad("the kind must be `cluster` or `client`")),
        };
        let secret = words
            .next()
            .and_then(unhex)
            .ok_or_else(|| bad("the key must be 64 hex digits"))?;
        let key = match (version, kind) {
            (1, KeyKind::Cluster) => KeyFile::cluster(secret),
            (1, KeyKind::Client) => KeyFile {
                kind,
                secret,
                server_public: None,
            },
            (2, KeyKind::Client) => KeyFile {
                kind,
                secret,
                server_public: Some(
                    words
                        .next()
                        .and_then(unhex)
                        .ok_or_else(|| bad("the servers' public key must be 64 hex digits"))?,
                ),
            },
            _ => return Err(bad("a cluster key is of format 1")),
        };
        if words.next().is_some() {
            return Err(bad("more than a key on the line"));
        }
        Ok(key)
    }

    /// Reads a key file, refusing one that anyone but its owner can read or write.
    pub fn load(path: &Path) -> Result<KeyFile, AuthError> {
        let io = |e: std::io::Error| AuthError::KeyFile {
            path: path.to_owned(),
            reason: e.to_string(),
        };
        let meta = std::fs::metadata(path).map_err(io)?;
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            return Err(AuthError::KeyFile {
                path: path.to_owned(),
                reason: format!(
                    "mode {:03o} lets others read it; `chmod 600` it (and think about whether the key has leaked)",
                    mode & 0o777
                ),
            });
        }
        let text = std::fs::read_to_string(path).map_err(io)?;
        let key = KeyFile::parse(&text).map_err(|e| AuthError::KeyFile {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        if !key.checks_servers() {
            tracing::warn!(
                path = %path.display(),
                "this client key (format 1) cannot check that a server holds the cluster key: \
                 anyone with the client key could pose as a server to this client; make a new \
                 one with `lode key client --from CLUSTER_KEY FILE`"
            );
        }
        Ok(key)
    }

    /// Writes a new key file (mode 0600); an existing file is never overwritten.
    pub fn save_new(&self, path: &Path) -> Result<(), AuthError> {
        let io = |e: std::io::Error| AuthError::KeyFile {
            path: path.to_owned(),
            reason: e.to_string(),
        };
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(io)?;
        f.write_all(self.to_line().as_bytes()).map_err(io)?;
        f.sync_all().map_err(io)
    }
}

/// HKDF-SHA256 of `secret` for one purpose.
fn derive(secret: &[u8; SECRET_LEN], purpose: &[u8]) -> [u8; SECRET_LEN] {
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, b"lode key derivation v1").extract(secret);
    let mut out = [0u8; SECRET_LEN];
    // Expanding to one hash length cannot fail.
    if let Ok(okm) = prk.expand(&[purpose], hkdf::HKDF_SHA256) {
        let _ = okm.fill(&mut out);
    }
    out
}

/// The secrets a node holds, derived from its key file.
pub struct Keyring {
    /// Proves the client role (every node has it).
    client_psk: [u8; SECRET_LEN],
    /// Proves the server role: only from the cluster key.
    server_psk: Option<[u8; SECRET_LEN]>,
    /// Signs and checks capabilities: only from the cluster key.
    capability: Option<[u8; SECRET_LEN]>,
    /// The servers' static private key (only from the cluster key) and public key (also in a
    /// client key of format 2).
    server_private: Option<[u8; SECRET_LEN]>,
    server_public: Option<[u8; SECRET_LEN]>,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Keyring({})",
            if self.server_psk.is_some() {
                "cluster"
            } else {
                "client"
            }
        )
    }
}

impl Keyring {
    pub fn new(key: &KeyFile) -> Keyring {
        let client = key.client_key();
        let cluster = (key.kind == KeyKind::Cluster).then_some(key.secret);
        Keyring {
            client_psk: derive(&client.secret, b"lode psk client"),
            server_psk: cluster.map(|s| derive(&s, b"lode psk server")),
            capability: cluster.map(|s| derive(&s, b"lode capability")),
            server_private: cluster.map(|s| server_static(&s).0),
            server_public: key.server_public,
        }
    }

    /// The servers' static private key, held by servers only.
    pub(crate) fn server_private(&self) -> Option<&[u8; SECRET_LEN]> {
        self.server_private.as_ref()
    }

    /// The servers' static public key, when this key knows it.
    pub(crate) fn server_public(&self) -> Option<&[u8; SECRET_LEN]> {
        self.server_public.as_ref()
    }

    /// Loads the keyring of a key file.
    pub fn load(path: &Path) -> Result<Keyring, AuthError> {
        Ok(Keyring::new(&KeyFile::load(path)?))
    }

    /// Whether this keyring holds the cluster key (it may act as a server).
    pub fn is_cluster(&self) -> bool {
        self.server_psk.is_some()
    }

    pub(crate) fn psk(&self, role: Role) -> Option<&[u8; SECRET_LEN]> {
        match role {
            Role::Client => Some(&self.client_psk),
            Role::Server => self.server_psk.as_ref(),
        }
    }

    /// The key that signs capabilities, held by servers only.
    pub fn capability_key(&self) -> Option<&[u8; SECRET_LEN]> {
        self.capability.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_file_round_trips_and_the_client_key_cannot_act_as_a_server() {
        let key = KeyFile::generate().unwrap();
        let back = KeyFile::parse(&key.to_line()).unwrap();
        assert_eq!(back.secret, key.secret);
        let client_line = key.client_key().to_line();
        assert!(
            client_line.starts_with("lode-key 2 client "),
            "{client_line}"
        );
        let client_back = KeyFile::parse(&client_line).unwrap();
        assert_eq!(client_back.server_public, key.server_public);
        assert!(client_back.checks_servers());
        // A client key of format 1 still parses, and checks no server.
        let old = format!("lode-key 1 client {}", hex(&client_back.secret));
        assert!(!KeyFile::parse(&old).unwrap().checks_servers());
        let cluster = Keyring::new(&key);
        let client = Keyring::new(&key.client_key());
        assert_eq!(cluster.psk(Role::Client), client.psk(Role::Client));
        assert!(cluster.psk(Role::Server).is_some());
        assert!(client.psk(Role::Server).is_none());
        assert!(client.capability_key().is_none());
        assert_ne!(cluster.psk(Role::Client), cluster.psk(Role::Server));
        let other = Keyring::new(&KeyFile::generate().unwrap());
        assert_ne!(other.psk(Role::Client), cluster.psk(Role::Client));
    }

    #[test]
    fn malformed_key_files_are_refused() {
        for text in [
            "",
            "lode-key 1 cluster",
            "lode-key 2 cluster 00",
            "lode-key 3 cluster 0000000000000000000000000000000000000000000000000000000000000000",
            "lode-key 2 client 0000000000000000000000000000000000000000000000000000000000000000",
            "lode-key 2 cluster 0000000000000000000000000000000000000000000000000000000000000000 0000000000000000000000000000000000000000000000000000000000000000",
            "lode-key 1 admin 0000000000000000000000000000000000000000000000000000000000000000",
            "lode-key 1 cluster 000000000000000000000000000000000000000000000000000000000000000g",
            "lode-key 1 cluster 00000000000000000000000000000000000000000000000000000000000000",
        ] {
            assert!(KeyFile::parse(text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn a_key_file_others_can_read_is_refused() {
        let dir = std::env::temp_dir().join(format!("lode-key-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cluster.key");
        KeyFile::generate().unwrap().save_new(&path).unwrap();
        assert!(KeyFile::load(&path).is_ok());
        assert!(KeyFile::generate().unwrap().save_new(&path).is_err());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = KeyFile::load(&path).unwrap_err().to_string();
        assert!(err.contains("chmod 600"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
