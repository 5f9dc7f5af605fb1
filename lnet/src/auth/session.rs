//! The handshake that opens every TCP connection, and the sealing of every frame after it.
//!
//! ```text
//! initiator -> hello: "LODE" 1 <protection> <role> 0,  u16 length, Noise message 1
//! responder -> status <protection>,  u16 length, Noise message 2 (or the reason it refused)
//! ```
//!
//! The Noise pattern is `NKpsk0` with X25519, ChaCha20-Poly1305 and SHA-256 (hello version 2):
//! the pre-shared key is the one of the role the initiator claims, the responder proves it
//! holds the servers' static key (derived from the cluster key; its public half is in the
//! client key), and the hello is the prologue, so neither the role nor the protection can be
//! changed on the way. A peer without the role's key cannot read message 1 (the responder
//! refuses); a responder without the cluster key cannot write message 2 (the initiator gives
//! up), so a client holding the client key cannot pose as a server to another client. The keys
//! never cross the wire, and the ephemeral keys give each connection secrets of its own.
//!
//! An initiator whose key does not know the servers' public key (a client key of format 1)
//! uses `NNpsk0` (hello version 1), which proves the pre-shared key alone; servers still
//! accept it.
//!
//! After the handshake every frame is one record and every bulk payload another, each with a
//! 16-byte AES-256-GCM tag under a per-direction key and a counter nonce: a record dropped,
//! replayed, reordered or changed fails the next check and closes the connection. With
//! integrity protection the bytes travel in the clear and are authenticated (GMAC); with
//! privacy they are encrypted too.

use std::sync::Arc;

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use proto::frame::HEADER_LEN;

use super::key::{Keyring, Role};
use super::AuthError;

/// The length of a record's tag.
pub const TAG_LEN: usize = 16;
/// The hello's fixed part.
pub const HELLO_LEN: usize = 8;
/// The longest handshake message either side accepts.
pub const MAX_HANDSHAKE_MSG: usize = 1024;

const NOISE: &str = "Noise_NNpsk0_25519_ChaChaPoly_SHA256";
const NOISE_NK: &str = "Noise_NKpsk0_25519_ChaChaPoly_SHA256";
const MAGIC: &[u8; 4] = b"LODE";
/// The hello's version: 1 for `NNpsk0`, 2 for `NKpsk0` (the server proves its static key).
const VERSION_NN: u8 = 1;
const VERSION_NK: u8 = 2;
/// Reply status bytes.
const ACCEPTED: u8 = 0;
const REFUSED: u8 = 1;

/// How frames are protected after the handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Protection {
    /// No authentication at all: an explicit choice for closed test networks.
    None,
    /// Every frame and payload authenticated, carried in the clear.
    Integrity,
    /// Every frame and payload authenticated and encrypted.
    Privacy,
}

impl Protection {
    fn to_byte(self) -> u8 {
        match self {
            Protection::None => 0,
            Protection::Integrity => 1,
            Protection::Privacy => 2,
        }
    }

    fn from_byte(b: u8) -> Option<Protection> {
        match b {
            0 => Some(Protection::None),
            1 => Some(Protection::Integrity),
            2 => Some(Protection::Privacy),
            _ => None,
        }
    }
}

/// A node's security settings.
#[derive(Clone)]
pub enum Security {
    /// Anyone who can reach the node gets in, as a server. Only by explicit choice.
    Off,
    /// Connections authenticate with `keys`; calls out present `role`. `privacy` asks for
    /// encryption on calls out and requires it of calls in.
    Keyed {
        keys: Arc<Keyring>,
        role: Role,
        privacy: bool,
    },
}

impl std::fmt::Debug for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Security::Off => f.write_str("Off"),
            Security::Keyed { role, privacy, .. } => {
                write!(f, "Keyed({role}, privacy: {privacy})")
            }
        }
    }
}

impl Security {
    /// A server's settings: it needs the cluster key.
    pub fn server(keys: Arc<Keyring>, privacy: bool) -> Result<Security, AuthError> {
        if !keys.is_cluster() {
            return Err(AuthError::BadKey(
                "a server needs the cluster key, not a client key".into(),
            ));
        }
        Ok(Security::Keyed {
            keys,
            role: Role::Server,
            privacy,
        })
    }

    /// A client's settings: any key of the cluster.
    pub fn client(keys: Arc<Keyring>, privacy: bool) -> Security {
        Security::Keyed {
            keys,
            role: Role::Client,
            privacy,
        }
    }

    /// These settings, acting as an administrator where the key is the cluster key (the
    /// server role: what `lode jobstats` needs); a client key stays a client.
    pub fn admin(self) -> Security {
        match self {
            Security::Keyed { keys, privacy, .. } if keys.is_cluster() => Security::Keyed {
                keys,
                role: Role::Server,
                privacy,
            },
            other => other,
        }
    }

    /// The keyring, when there is one.
    pub fn keys(&self) -> Option<&Arc<Keyring>> {
        match self {
            Security::Off => None,
            Security::Keyed { keys, .. } => Some(keys),
        }
    }

    fn wanted(&self) -> Protection {
        match self {
            Security::Off => Protection::None,
            Security::Keyed { privacy: true, .. } => Protection::Privacy,
            Security::Keyed { .. } => Protection::Integrity,
        }
    }
}

/// One direction's key and record counter.
pub struct Sealer {
    key: LessSafeKey,
    next: u64,
    privacy: bool,
}

/// The other direction's.
pub struct Opener {
    key: LessSafeKey,
    next: u64,
    privacy: bool,
}

fn nonce(counter: &mut u64) -> Result<Nonce, AuthError> {
    let n = *counter;
    *counter = n.checked_add(1).ok_or(AuthError::Exhausted)?;
    let mut bytes = [0u8; 12];
    bytes[4..].copy_from_slice(&n.to_be_bytes());
    Ok(Nonce::assume_unique_for_key(bytes))
}

fn aead_key(raw: &[u8; 32]) -> Result<LessSafeKey, AuthError> {
    UnboundKey::new(&AES_256_GCM, raw)
        .map(LessSafeKey::new)
        .map_err(|_| AuthError::Handshake("bad session key".into()))
}

impl Sealer {
    /// Seals an encoded frame (header and body) in place and returns its tag: the header
    /// stays readable, the body is encrypted under privacy.
    pub fn seal_frame(&mut self, frame: &mut [u8]) -> Result<[u8; TAG_LEN], AuthError> {
        let nonce = nonce(&mut self.next)?;
        let tag = if self.privacy && frame.len() > HEADER_LEN {
            let (head, body) = frame.split_at_mut(HEADER_LEN);
            self.key
                .seal_in_place_separate_tag(nonce, Aad::from(&*head), body)
        } else {
            self.key
                .seal_in_place_separate_tag(nonce, Aad::from(&*frame), &mut [])
        }
        .map_err(|_| AuthError::Seal)?;
        Ok(tag_bytes(tag.as_ref()))
    }

    /// Seals a bulk payload: its tag, and under privacy the encrypted copy to send instead.
    pub fn seal_payload(
        &mut self,
        data: &[u8],
    ) -> Result<(Option<Vec<u8>>, [u8; TAG_LEN]), AuthError> {
        let nonce = nonce(&mut self.next)?;
        if self.privacy {
            let mut copy = data.to_vec();
            let tag = self
                .key
                .seal_in_place_separate_tag(nonce, Aad::empty(), &mut copy)
                .map_err(|_| AuthError::Seal)?;
            Ok((Some(copy), tag_bytes(tag.as_ref())))
        } else {
            let tag = self
                .key
                .seal_in_place_separate_tag(nonce, Aad::from(data), &mut [])
                .map_err(|_| AuthError::Seal)?;
            Ok((None, tag_bytes(tag.as_ref())))
        }
    }
}

fn tag_bytes(t: &[u8]) -> [u8; TAG_LEN] {
    let mut out = [0u8; TAG_LEN];
    out.copy_from_slice(&t[..TAG_LEN]);
    out
}

impl Opener {
    /// Checks (and under privacy decrypts, in place) a frame received with `tag`.
    pub fn open_frame(&mut self, frame: &mut [u8], tag: &[u8; TAG_LEN]) -> Result<(), AuthError> {
        let nonce = nonce(&mut self.next)?;
        if self.privacy && frame.len() > HEADER_LEN {
            let (head, body) = frame.split_at_mut(HEADER_LEN);
            self.key
                .open_in_place_separate_tag(nonce, Aad::from(&*head), tag, body)
                .map(|_| ())
        } else {
            self.key
                .open_in_place_separate_tag(nonce, Aad::from(&*frame), tag, &mut [])
                .map(|_| ())
        }
        .map_err(|_| AuthError::Forged)
    }

    /// Checks (and under privacy decrypts, in place) a bulk payload received with `tag`.
    pub fn open_payload(&mut self, data: &mut [u8], tag: &[u8; TAG_LEN]) -> Result<(), AuthError> {
        let nonce = nonce(&mut self.next)?;
        if self.privacy {
            self.key
                .open_in_place_separate_tag(nonce, Aad::empty(), tag, data)
                .map(|_| ())
        } else {
            self.key
                .open_in_place_separate_tag(nonce, Aad::from(&*data), tag, &mut [])
                .map(|_| ())
        }
        .map_err(|_| AuthError::Forged)
    }
}

/// What a finished handshake leaves: the keys of both directions, or nothing when
/// authentication is off.
pub struct Session {
    pub protection: Protection,
    pub sealer: Option<Sealer>,
    pub opener: Option<Opener>,
}

impl Session {
    fn plain() -> Session {
        Session {
            protection: Protection::None,
            sealer: None,
            opener: None,
        }
    }

    fn keyed(
        protection: Protection,
        send: &[u8; 32],
        recv: &[u8; 32],
    ) -> Result<Session, AuthError> {
        let privacy = protection == Protection::Privacy;
        Ok(Session {
            protection,
            sealer: Some(Sealer {
                key: aead_key(send)?,
                next: 0,
                privacy,
            }),
            opener: Some(Opener {
                key: aead_key(recv)?,
                next: 0,
                privacy,
            }),
        })
    }

    /// The bytes a record of `len` bytes takes on the wire beyond itself.
    pub fn overhead(&self) -> usize {
        if self.sealer.is_some() {
            TAG_LEN
        } else {
            0
        }
    }
}

fn noise_params(version: u8) -> snow::params::NoiseParams {
    // A constant pattern name always parses.
    let name = if version == VERSION_NK {
        NOISE_NK
    } else {
        NOISE
    };
    name.parse().expect("a valid Noise pattern")
}

fn noise_err(e: snow::Error) -> AuthError {
    AuthError::Handshake(e.to_string())
}

/// The initiator's side, between its hello and the responder's reply.
pub struct Initiator {
    state: Option<snow::HandshakeState>,
    wanted: Protection,
}

impl Initiator {
    /// Starts a handshake: the bytes to send first (hello, length, message 1).
    pub fn start(security: &Security) -> Result<(Initiator, Vec<u8>), AuthError> {
        let wanted = security.wanted();
        let role = match security {
            Security::Off => Role::Server,
            Security::Keyed { role, .. } => *role,
        };
        // A client that knows the servers' public key has the server prove it holds it.
        let server_public = match security {
            Security::Keyed { keys, .. } if role == Role::Client => keys.server_public(),
            _ => None,
        };
        let version = if server_public.is_some() {
            VERSION_NK
        } else {
            VERSION_NN
        };
        let mut hello = Vec::with_capacity(HELLO_LEN + 2 + 64);
        hello.extend_from_slice(MAGIC);
        hello.extend_from_slice(&[version, wanted.to_byte(), role.to_byte(), 0]);
        let Security::Keyed { keys, .. } = security else {
            hello.extend_from_slice(&0u16.to_be_bytes());
            return Ok((
                Initiator {
                    state: None,
                    wanted,
                },
                hello,
            ));
        };
        let psk = keys.psk(role).ok_or_else(|| {
            AuthError::BadKey(format!("this key cannot authenticate the {role} role"))
        })?;
        let mut builder = snow::Builder::new(noise_params(version));
        if let Some(public) = server_public {
            builder = builder.remote_public_key(public).map_err(noise_err)?;
        }
        let mut state = builder
            .psk(0, psk)
            .and_then(|b| b.prologue(&hello[..HELLO_LEN]))
            .and_then(|b| b.build_initiator())
            .map_err(noise_err)?;
        let mut msg = [0u8; MAX_HANDSHAKE_MSG];
        let n = state.write_message(&[], &mut msg).map_err(noise_err)?;
        hello.extend_from_slice(&(n as u16).to_be_bytes());
        hello.extend_from_slice(&msg[..n]);
        Ok((
            Initiator {
                state: Some(state),
                wanted,
            },
            hello,
        ))
    }

    /// Finishes with the responder's reply: its status, protection and message.
    pub fn finish(self, status: u8, protection: u8, msg: &[u8]) -> Result<Session, AuthError> {
        if status == REFUSED {
            return Err(AuthError::Refused(
                String::from_utf8_lossy(msg).chars().take(200).collect(),
            ));
        }
        if status != ACCEPTED {
            return Err(AuthError::Handshake(format!("unknown status {status}")));
        }
        let got = Protection::from_byte(protection)
            .ok_or_else(|| AuthError::Handshake(format!("unknown protection {protection}")))?;
        let Some(mut state) = self.state else {
            return if got == Protection::None && msg.is_empty() {
                Ok(Session::plain())
            } else {
                Err(AuthError::Handshake(
                    "the server answered with a handshake we did not start".into(),
                ))
            };
        };
        let mut payload = [0u8; MAX_HANDSHAKE_MSG];
        let n = state.read_message(msg, &mut payload).map_err(|_| {
            AuthError::Handshake("the server could not prove it holds the cluster's key".into())
        })?;
        // The protection is inside the authenticated payload; the clear byte must agree.
        if payload[..n] != [protection] || got < self.wanted || got == Protection::None {
            return Err(AuthError::Handshake(format!(
                "the server chose {got:?} protection, below the {:?} asked for",
                self.wanted
            )));
        }
        let (send, recv) = state.dangerously_get_raw_split();
        Session::keyed(got, &send, &recv)
    }
}

/// A parsed hello: the fixed part, before the message.
#[derive(Clone, Copy, Debug)]
pub struct Hello {
    raw: [u8; HELLO_LEN],
    /// 1: `NNpsk0`; 2: `NKpsk0`.
    pub version: u8,
    pub protection: Protection,
    pub role: Role,
    /// The length of message 1, which follows.
    pub msg_len: usize,
}

impl Hello {
    /// Parses the fixed part and the length that follows it (`HELLO_LEN + 2` bytes).
    pub fn parse(bytes: &[u8; HELLO_LEN + 2]) -> Result<Hello, AuthError> {
        let bad = |why: &str| AuthError::Handshake(why.to_owned());
        if &bytes[..4] != MAGIC {
            return Err(bad("not a lode peer"));
        }
        let version = bytes[4];
        if version != VERSION_NN && version != VERSION_NK {
            return Err(bad("unknown handshake version"));
        }
        let protection = Protection::from_byte(bytes[5]).ok_or_else(|| bad("bad protection"))?;
        let role = Role::from_byte(bytes[6]).ok_or_else(|| bad("bad role"))?;
        let msg_len = usize::from(u16::from_be_bytes([bytes[8], bytes[9]]));
        if msg_len > MAX_HANDSHAKE_MSG {
            return Err(bad("handshake message too long"));
        }
        let mut raw = [0u8; HELLO_LEN];
        raw.copy_from_slice(&bytes[..HELLO_LEN]);
        Ok(Hello {
            raw,
            version,
            protection,
            role,
            msg_len,
        })
    }
}

/// The responder's answer: the bytes to send back, and on success the session and the role
/// the peer proved.
pub struct Answer {
    pub reply: Vec<u8>,
    pub outcome: Result<(Session, Role), AuthError>,
}

fn reply(status: u8, protection: u8, msg: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + msg.len());
    out.extend_from_slice(&[status, protection]);
    out.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    out.extend_from_slice(msg);
    out
}

fn refuse(err: AuthError) -> Answer {
    let why = match &err {
        AuthError::Refused(why) => why.clone(),
        other => other.to_string(),
    };
    Answer {
        reply: reply(REFUSED, 0, why.as_bytes()),
        outcome: Err(err),
    }
}

/// Answers a hello and its message 1.
pub fn respond(security: &Security, hello: &Hello, msg: &[u8]) -> Answer {
    let Security::Keyed { keys, privacy, .. } = security else {
        if hello.protection != Protection::None || !msg.is_empty() {
            return refuse(AuthError::Refused(
                "this server runs without authentication; the client must be told so too".into(),
            ));
        }
        return Answer {
            reply: reply(ACCEPTED, 0, &[]),
            // With authentication off every peer is trusted as it always was.
            outcome: Ok((Session::plain(), Role::Server)),
        };
    };
    if hello.protection == Protection::None {
        return refuse(AuthError::Refused(
            "authentication required: the client has no key of this cluster".into(),
        ));
    }
    let Some(psk) = keys.psk(hello.role) else {
        return refuse(AuthError::Refused(format!(
            "this node cannot authenticate the {} role",
            hello.role
        )));
    };
    let chosen = if *privacy {
        Protection::Privacy
    } else {
        hello.protection
    };
    // Asked to prove the servers' static key: only a holder of the cluster key can.
    let private = match (hello.version, keys.server_private()) {
        (VERSION_NK, None) => {
            return refuse(AuthError::Refused(
                "this node does not hold the cluster key: it is not a server".into(),
            ))
        }
        (VERSION_NK, Some(p)) => Some(p),
        _ => None,
    };
    let run = || -> Result<(Vec<u8>, Session), AuthError> {
        let mut builder = snow::Builder::new(noise_params(hello.version));
        if let Some(p) = private {
            builder = builder.local_private_key(p).map_err(noise_err)?;
        }
        let mut state = builder
            .psk(0, psk)
            .and_then(|b| b.prologue(&hello.raw))
            .and_then(|b| b.build_responder())
            .map_err(noise_err)?;
        let mut payload = [0u8; MAX_HANDSHAKE_MSG];
        state
            .read_message(msg, &mut payload)
            .map_err(|_| AuthError::Refused("authentication failed: wrong key".into()))?;
        let mut out = [0u8; MAX_HANDSHAKE_MSG];
        let n = state
            .write_message(&[chosen.to_byte()], &mut out)
            .map_err(noise_err)?;
        let (recv, send) = state.dangerously_get_raw_split();
        Ok((out[..n].to_vec(), Session::keyed(chosen, &send, &recv)?))
    };
    match run() {
        Ok((msg2, session)) => Answer {
            reply: reply(ACCEPTED, chosen.to_byte(), &msg2),
            outcome: Ok((session, hello.role)),
        },
        Err(e) => refuse(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::key::KeyFile;

    fn pair(a: &Security, b: &Security) -> Result<(Session, Session, Role), AuthError> {
        let (init, first) = Initiator::start(a)?;
        let mut fixed = [0u8; HELLO_LEN + 2];
        fixed.copy_from_slice(&first[..HELLO_LEN + 2]);
        let hello = Hello::parse(&fixed)?;
        let answer = respond(b, &hello, &first[HELLO_LEN + 2..]);
        let r = &answer.reply;
        let client = init.finish(r[0], r[1], &r[4..]);
        let (server, role) = answer.outcome?;
        Ok((client?, server, role))
    }

    fn cluster() -> Arc<Keyring> {
        Arc::new(Keyring::new(&KeyFile::generate().unwrap()))
    }

    #[test]
    fn a_client_key_cannot_pose_as_a_server_to_a_client() {
        let key = KeyFile::generate().unwrap();
        let client_key = Arc::new(Keyring::new(&key.client_key()));
        let client = Security::client(client_key.clone(), false);
        // The real server: the client checks it holds the cluster key.
        let server = Security::server(Arc::new(Keyring::new(&key)), false).unwrap();
        let (_, _, role) = pair(&client, &server).unwrap();
        assert_eq!(role, Role::Client);
        // Another holder of the client key, answering as a server: refused either way.
        let impostor = Security::Keyed {
            keys: client_key,
            role: Role::Server,
            privacy: false,
        };
        assert!(
            pair(&client, &impostor).is_err(),
            "an impostor completed the handshake"
        );
        // A server of another cluster cannot either.
        let other = Security::server(cluster(), false).unwrap();
        assert!(pair(&client, &other).is_err());
        // A client key of format 1 (no public key): the older handshake, which the servers
        // still accept, and which an impostor can complete (why the key says so when loaded).
        let line = key.client_key().to_line();
        let secret = line.split_whitespace().nth(3).unwrap();
        let old = KeyFile::parse(&format!("lode-key 1 client {secret}")).unwrap();
        let old_keys = Arc::new(Keyring::new(&old));
        let old_client = Security::client(old_keys.clone(), false);
        assert!(
            pair(&old_client, &server).is_ok(),
            "format 1 keys still connect"
        );
        let old_impostor = Security::Keyed {
            keys: old_keys,
            role: Role::Server,
            privacy: false,
        };
        assert!(pair(&old_client, &old_impostor).is_ok());
    }

    #[test]
    fn both_sides_agree_on_keys_and_a_changed_record_fails() {
        let keys = cluster();
        let server = Security::server(keys.clone(), false).unwrap();
        for privacy in [false, true] {
            let (mut c, mut s, role) =
                pair(&Security::client(keys.clone(), privacy), &server).unwrap();
            assert_eq!(role, Role::Client);
            let mut frame = vec![7u8; HEADER_LEN + 40];
            let original = frame.clone();
            let tag = c.sealer.as_mut().unwrap().seal_frame(&mut frame).unwrap();
            assert_eq!(privacy, frame != original);
            let mut changed = frame.clone();
            changed[HEADER_LEN + 3] ^= 1;
            let mut o = s.opener.take().unwrap();
            assert!(o.open_frame(&mut changed, &tag).is_err());
            // The failed record used its nonce: the stream is dead, as the connection will be.
            let (mut c2, mut s2, _) =
                pair(&Security::client(keys.clone(), privacy), &server).unwrap();
            let tag = c2.sealer.as_mut().unwrap().seal_frame(&mut frame).unwrap();
            let mut f = frame.clone();
            s2.opener
                .as_mut()
                .unwrap()
                .open_frame(&mut f, &tag)
                .unwrap();
            let _ = &mut c;
            let data = vec![9u8; 5000];
            let (sent, tag) = c2.sealer.as_mut().unwrap().seal_payload(&data).unwrap();
            let mut got = sent.unwrap_or_else(|| data.clone());
            s2.opener
                .as_mut()
                .unwrap()
                .open_payload(&mut got, &tag)
                .unwrap();
            assert_eq!(got, data);
        }
    }

    #[test]
    fn a_wrong_key_a_client_key_posing_as_server_and_no_key_are_refused() {
        let keys = cluster();
        let server = Security::server(keys.clone(), false).unwrap();
        let stranger = Security::client(cluster(), false);
        assert!(matches!(
            pair(&stranger, &server),
            Err(AuthError::Refused(_))
        ));
        assert!(matches!(
            pair(&Security::Off, &server),
            Err(AuthError::Refused(_))
        ));
        let client_only = Arc::new(Keyring::new(&KeyFile::generate().unwrap().client_key()));
        assert!(Security::server(client_only.clone(), false).is_err());
        let posing = Security::Keyed {
            keys: client_only,
            role: Role::Server,
            privacy: false,
        };
        assert!(Initiator::start(&posing).is_err());
        // A keyed client does not talk to a server that cannot authenticate itself.
        assert!(pair(&Security::client(keys, false), &Security::Off).is_err());
    }

    #[test]
    fn a_server_requiring_privacy_gets_it() {
        let keys = cluster();
        let server = Security::server(keys.clone(), true).unwrap();
        let (c, s, _) = pair(&Security::client(keys, false), &server).unwrap();
        assert_eq!(c.protection, Protection::Privacy);
        assert_eq!(s.protection, Protection::Privacy);
    }
}
