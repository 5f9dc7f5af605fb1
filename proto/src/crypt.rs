//! Encryption at rest: the policy a directory tree is encrypted under, as the MDS keeps it.
//!
//! A directory is bound to a master key by `lode crypt set` while it is empty: the MDS keeps the
//! policy in its internal attribute [`POLICY_XATTR`] (the key's identifier, never the key, and a
//! random nonce of the tree) and gives the same attribute to everything made below it, in the
//! same journaled change as the create. Clients encrypt contents, names and symlink targets
//! with keys derived from the master key, the tree's nonce and each inode's FID (which no other
//! inode ever has): the servers hold ciphertext only, and never a key. The ciphers and the
//! derivations are the client's (`client::crypt`); this module is the plain data both sides
//! share.

use crate::md::Inode;

/// The internal attribute holding an encrypted inode's policy.
pub const POLICY_XATTR: &str = "lode.crypt";

/// The bytes of a master key (as fscrypt's raw keys: 64 random bytes).
pub const MASTER_KEY_LEN: usize = 64;

/// The bytes of a master key's identifier (derived from the key; naming it, not revealing it).
pub const KEY_ID_LEN: usize = 16;

/// Contents are encrypted in units of this many bytes, each on its own (random access); the
/// unit at a file's end is as long as the file reaches.
pub const UNIT: u64 = 4096;

/// The longest name an encrypted directory keeps (the ciphertext, encoded: a plaintext name of
/// 255 bytes padded to 256, with its 16-byte tag, in base64url).
pub const MAX_STORED_NAME: usize = 363;

/// The contents cipher: AES-256 in XTS mode, per unit, the tweak the unit's number.
pub const CONTENTS_AES_256_XTS: u8 = 1;

/// The names cipher: AES-256-GCM-SIV, deterministic per directory (a name encrypts alike in
/// one directory, so lookups find it), authenticated (a wrong key is found out).
pub const NAMES_AES_256_GCM_SIV: u8 = 1;

const VERSION: u8 = 1;
const ENCODED_LEN: usize = 4 + KEY_ID_LEN + 16;

/// A tree's encryption policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    pub contents: u8,
    pub names: u8,
    /// The master key's identifier.
    pub key_id: [u8; KEY_ID_LEN],
    /// Random, made once for the tree: salts every key derived for it.
    pub nonce: [u8; 16],
}

impl Policy {
    /// A policy under the key named `key_id`, with the ciphers lode knows.
    pub fn new(key_id: [u8; KEY_ID_LEN], nonce: [u8; 16]) -> Policy {
        Policy {
            contents: CONTENTS_AES_256_XTS,
            names: NAMES_AES_256_GCM_SIV,
            key_id,
            nonce,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(ENCODED_LEN);
        v.extend_from_slice(&[VERSION, self.contents, self.names, 0]);
        v.extend_from_slice(&self.key_id);
        v.extend_from_slice(&self.nonce);
        v
    }

    /// The policy in `b`, or `None` if it is not one this version knows.
    pub fn decode(b: &[u8]) -> Option<Policy> {
        if b.len() != ENCODED_LEN || b[0] != VERSION || b[3] != 0 {
            return None;
        }
        if b[1] != CONTENTS_AES_256_XTS || b[2] != NAMES_AES_256_GCM_SIV {
            return None;
        }
        Some(Policy {
            contents: b[1],
            names: b[2],
            key_id: b[4..4 + KEY_ID_LEN].try_into().ok()?,
            nonce: b[4 + KEY_ID_LEN..].try_into().ok()?,
        })
    }

    /// `inode`'s policy, if it is encrypted.
    pub fn of_inode(inode: &Inode) -> Option<Policy> {
        inode
            .xattrs
            .get(POLICY_XATTR)
            .and_then(|v| Policy::decode(v))
    }

    /// The key's identifier in hex, as `lode crypt status` prints it and the keyring names it.
    pub fn key_hex(&self) -> String {
        hex(&self.key_id)
    }
}

/// Whether `name` has the form of an encrypted directory's names: base64url (no padding) of a
/// ciphertext of 32 to 272 bytes in steps of 16 (the name padded to 16 bytes, and its tag).
pub fn is_stored_name(name: &[u8]) -> bool {
    let len = name.len();
    (32usize..=272)
        .step_by(16)
        .any(|n| (4 * n).div_ceil(3) == len)
        && name
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'_')
}

/// Whether `inode` is encrypted (has a policy, known or not).
pub fn is_encrypted(inode: &Inode) -> bool {
    inode.xattrs.contains_key(POLICY_XATTR)
}

/// Lower-case hex of `b`.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_round_trips_and_foreign_bytes_are_refused() {
        let p = Policy::new([7; KEY_ID_LEN], [9; 16]);
        assert_eq!(Policy::decode(&p.encode()), Some(p));
        let mut v = p.encode();
        v[0] = 2;
        assert_eq!(Policy::decode(&v), None);
        assert_eq!(Policy::decode(&p.encode()[1..]), None);
        let mut v = p.encode();
        v[1] = 9;
        assert_eq!(Policy::decode(&v), None);
    }

    #[test]
    fn stored_names_have_their_lengths_and_alphabet() {
        assert!(is_stored_name(&[b'A'; 43]));
        assert!(is_stored_name(&[b'_'; MAX_STORED_NAME]));
        assert!(!is_stored_name(&[b'A'; 44]));
        assert!(!is_stored_name(b"weights.bin"));
        let mut n = vec![b'a'; 64];
        n[3] = b'.';
        assert!(!is_stored_name(&n));
    }
}
