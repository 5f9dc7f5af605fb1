//! Encryption at rest, done on the client (the model of Linux's fscrypt v2): the servers store
//! and checksum ciphertext, and never see a key.
//!
//! - A **master key** is 64 random bytes the user holds in a file. Its identifier (HKDF-SHA512
//!   of the key) names it in a directory's policy and in the kernel keyring.
//! - **Contents**: each file has its own AES-256-XTS key, HKDF-SHA512 of the master key salted
//!   with the tree's nonce, for the file's FID. Each [`UNIT`] of the file is encrypted alone,
//!   its number the tweak, so any range reads and writes at random. The unit at the end of a
//!   file is as long as the file reaches (XTS steals ciphertext for a tail that is not a
//!   multiple of 16 bytes; a tail under 16 bytes is XORed with the unit's first XTS block of
//!   zeros), so the servers keep the file's size as it is. A unit of zeros on the servers is
//!   a hole (a unit never written), and reads as zeros: an XTS ciphertext of 16 bytes or more
//!   is never all zeros (2^-128).
//! - **Names**: each directory has its own AES-256-GCM-SIV key and nonce, for the directory's
//!   FID. A name is padded with NULs to a multiple of 16 bytes, encrypted (deterministic, so a
//!   lookup finds it) with its 16-byte tag (a wrong key is found out, never shown as garbage)
//!   and kept in base64url.
//! - **Symlink targets**: a key of the tree, a random nonce kept with the target.
//!
//! Cryptography only from AWS-LC (aws-lc-rs, and its own AES-XTS through aws-lc-sys); keys are
//! zeroized when dropped and never logged.

use std::path::Path;
use std::sync::Arc;

use aws_lc_rs::{aead, constant_time, hkdf};
use base64::Engine;
use proto::crypt::{Policy, KEY_ID_LEN, MASTER_KEY_LEN, UNIT};
use proto::Fid;
use zeroize::{Zeroize, Zeroizing};

/// What went wrong with a key or a cipher.
#[derive(Debug, thiserror::Error)]
pub enum CryptError {
    #[error("a master key is {MASTER_KEY_LEN} bytes; this one is {0}")]
    KeyLength(usize),
    #[error("reading the key file {path}: {source}")]
    KeyFile {
        path: String,
        source: std::io::Error,
    },
    #[error("the kernel keyring: {0}")]
    Keyring(std::io::Error),
    #[error("the cipher failed: {0}")]
    Cipher(&'static str),
}

type Result<T, E = CryptError> = std::result::Result<T, E>;

/// A master key, zeroized when dropped.
pub struct MasterKey {
    key: Zeroizing<[u8; MASTER_KEY_LEN]>,
    id: [u8; KEY_ID_LEN],
}

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MasterKey({})", proto::crypt::hex(&self.id))
    }
}

/// An HKDF output length.
struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

impl MasterKey {
    /// The key of `bytes` (exactly [`MASTER_KEY_LEN`]).
    pub fn new(bytes: &[u8]) -> Result<MasterKey> {
        if bytes.len() != MASTER_KEY_LEN {
            return Err(CryptError::KeyLength(bytes.len()));
        }
        let mut key = Zeroizing::new([0u8; MASTER_KEY_LEN]);
        key.copy_from_slice(bytes);
        let mut id = [0u8; KEY_ID_LEN];
        derive(&key[..], &[], &[b"lode key identifier"], &mut id);
        Ok(MasterKey { key, id })
    }

    /// A new random key (from the operating system's generator).
    pub fn generate() -> Result<MasterKey> {
        let mut b = Zeroizing::new([0u8; MASTER_KEY_LEN]);
        aws_lc_rs::rand::fill(&mut b[..]).map_err(|_| CryptError::Cipher("random bytes"))?;
        MasterKey::new(&b[..])
    }

    /// The key in the file `path` (its 64 bytes, as `head -c 64 /dev/urandom` makes one).
    pub fn read_file(path: &Path) -> Result<MasterKey> {
        let bytes = Zeroizing::new(std::fs::read(path).map_err(|source| CryptError::KeyFile {
            path: path.display().to_string(),
            source,
        })?);
        MasterKey::new(&bytes)
    }

    /// The key's identifier, as a policy names it.
    pub fn id(&self) -> [u8; KEY_ID_LEN] {
        self.id
    }

    /// Whether this is the key `policy` names (compared in constant time).
    pub fn unlocks(&self, policy: &Policy) -> bool {
        constant_time::verify_slices_are_equal(&self.id, &policy.key_id).is_ok()
    }

    /// The contents cipher of file `fid` in the tree of `policy`.
    pub fn contents(&self, policy: &Policy, fid: Fid) -> Result<Contents> {
        let mut key = Zeroizing::new([0u8; 64]);
        let f = fid.to_bytes();
        derive(
            &self.key[..],
            &policy.nonce,
            &[b"lode contents", &f],
            &mut key[..],
        );
        // XTS refuses a key whose halves are equal; HKDF makes them so with 2^-256.
        Ok(Contents { key })
    }

    /// The names cipher of directory `dir` in the tree of `policy`.
    pub fn names(&self, policy: &Policy, dir: Fid) -> Result<Names> {
        let mut k = Zeroizing::new([0u8; 32 + aead::NONCE_LEN]);
        let f = dir.to_bytes();
        derive(
            &self.key[..],
            &policy.nonce,
            &[b"lode names", &f],
            &mut k[..],
        );
        let key = aead::UnboundKey::new(&aead::AES_256_GCM_SIV, &k[..32])
            .map_err(|_| CryptError::Cipher("the names key"))?;
        let mut nonce = [0u8; aead::NONCE_LEN];
        nonce.copy_from_slice(&k[32..]);
        Ok(Names {
            key: aead::LessSafeKey::new(key),
            nonce,
        })
    }

    /// The symlink target cipher of the tree of `policy`.
    pub fn targets(&self, policy: &Policy) -> Result<Targets> {
        let mut k = Zeroizing::new([0u8; 32]);
        derive(
            &self.key[..],
            &policy.nonce,
            &[b"lode symlink targets"],
            &mut k[..],
        );
        let key = aead::UnboundKey::new(&aead::AES_256_GCM_SIV, &k[..])
            .map_err(|_| CryptError::Cipher("the targets key"))?;
        Ok(Targets {
            key: aead::LessSafeKey::new(key),
        })
    }
}

/// HKDF-SHA512 of `ikm`, salted with `salt`, for `info`, into `out`.
fn derive(ikm: &[u8], salt: &[u8], info: &[&[u8]], out: &mut [u8]) {
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA512, salt).extract(ikm);
    prk.expand(info, Len(out.len()))
        .and_then(|okm| okm.fill(out))
        .expect("HKDF-SHA512 gives up to 255 * 64 bytes");
}

/// A file's contents cipher: AES-256-XTS, one unit at a time.
pub struct Contents {
    key: Zeroizing<[u8; 64]>,
}

impl Contents {
    /// Encrypts `data` in place: the units of the file from unit `first` on, each [`UNIT`]
    /// bytes but the last, which is as long as the file reaches.
    pub fn encrypt(&self, first: u64, data: &mut [u8]) -> Result<()> {
        self.run(first, data, true)
    }

    /// Decrypts `data` in place, as [`Contents::encrypt`] laid it out. A unit of zeros of 16
    /// bytes or more is a hole, and stays zeros.
    pub fn decrypt(&self, first: u64, data: &mut [u8]) -> Result<()> {
        self.run(first, data, false)
    }

    /// Encrypts `src` (the units from unit `first` on, laid out as for
    /// [`Contents::encrypt`]) onto the end of `dst`, out of place: one pass over the bytes.
    pub fn encrypt_to(&self, first: u64, src: &[u8], dst: &mut Vec<u8>) -> Result<()> {
        dst.reserve(src.len());
        let mut xts = Xts::new(&self.key, true)?;
        for (i, unit) in src.chunks(UNIT as usize).enumerate() {
            let at = dst.len();
            if unit.len() < 16 {
                dst.extend_from_slice(unit);
                self.run(first + i as u64, &mut dst[at..], true)?;
                continue;
            }
            let spare = &mut dst.spare_capacity_mut()[..unit.len()];
            xts.unit_to(first + i as u64, unit, spare.as_mut_ptr().cast())?;
            // SAFETY: `unit_to` wrote all `unit.len()` bytes past the old length, within the
            // capacity reserved above.
            unsafe { dst.set_len(at + unit.len()) };
        }
        Ok(())
    }

    fn run(&self, first: u64, data: &mut [u8], enc: bool) -> Result<()> {
        let mut xts = Xts::new(&self.key, enc)?;
        for (i, unit) in data.chunks_mut(UNIT as usize).enumerate() {
            let n = first + i as u64;
            if unit.len() < 16 {
                // Too short for XTS: XORed with the unit's own keystream block.
                let mut pad = [0u8; 16];
                let mut ks = Xts::new(&self.key, true)?;
                ks.unit(n, &mut pad)?;
                unit.iter_mut().zip(pad.iter()).for_each(|(b, k)| *b ^= k);
                pad.zeroize();
                continue;
            }
            if !enc && unit.iter().all(|&b| b == 0) {
                continue;
            }
            xts.unit(n, unit)?;
        }
        Ok(())
    }
}

/// One AES-256-XTS context of AWS-LC, keyed once and re-tweaked per unit.
struct Xts {
    ctx: *mut aws_lc_sys::EVP_CIPHER_CTX,
}

impl Xts {
    fn new(key: &[u8; 64], enc: bool) -> Result<Xts> {
        // SAFETY: a fresh context, initialized with AWS-LC's own cipher and a key of the length
        // it takes (64 bytes for AES-256-XTS); freed in drop.
        unsafe {
            let ctx = aws_lc_sys::EVP_CIPHER_CTX_new();
            if ctx.is_null() {
                return Err(CryptError::Cipher("no cipher context"));
            }
            let xts = Xts { ctx };
            let ok = aws_lc_sys::EVP_CipherInit_ex(
                ctx,
                aws_lc_sys::EVP_aes_256_xts(),
                std::ptr::null_mut(),
                key.as_ptr(),
                [0u8; 16].as_ptr(),
                i32::from(enc),
            );
            if ok != 1 {
                return Err(CryptError::Cipher("the XTS key"));
            }
            Ok(xts)
        }
    }

    /// Encrypts or decrypts one unit (16 bytes or more) in place, its number the tweak.
    fn unit(&mut self, n: u64, data: &mut [u8]) -> Result<()> {
        let p = data.as_mut_ptr();
        self.unit_to(n, data, p)
    }

    /// Encrypts or decrypts one unit (16 bytes or more) from `data` to `out` (`data.len()`
    /// bytes, which may be `data` itself), its number the tweak.
    fn unit_to(&mut self, n: u64, data: &[u8], out: *mut u8) -> Result<()> {
        let mut iv = [0u8; 16];
        iv[..8].copy_from_slice(&n.to_le_bytes());
        let len = i32::try_from(data.len()).map_err(|_| CryptError::Cipher("unit too long"))?;
        let mut done = 0;
        // SAFETY: the context was initialized in `new`; only the tweak is set again. `out`
        // holds `len` bytes (the callers' contract); XTS also works in place.
        let ok = unsafe {
            aws_lc_sys::EVP_CipherInit_ex(
                self.ctx,
                std::ptr::null(),
                std::ptr::null_mut(),
                std::ptr::null(),
                iv.as_ptr(),
                -1,
            ) == 1
                && aws_lc_sys::EVP_CipherUpdate(self.ctx, out, &mut done, data.as_ptr(), len) == 1
        };
        if !ok || done != len {
            return Err(CryptError::Cipher("AES-XTS"));
        }
        Ok(())
    }
}

impl Drop for Xts {
    fn drop(&mut self) {
        // SAFETY: made by EVP_CIPHER_CTX_new, freed once; the free clears the key schedule.
        unsafe { aws_lc_sys::EVP_CIPHER_CTX_free(self.ctx) }
    }
}

/// The keys a client holds and the policies of the directories it met, shared by its sessions.
#[derive(Default)]
pub struct Keys {
    /// Keys given to this client itself (`Client::crypt_add_key`), besides the keyring's.
    added: parking_lot::Mutex<std::collections::HashMap<[u8; KEY_ID_LEN], Arc<MasterKey>>>,
    /// Keys found in the keyring, and when: looked for there again after [`KEYRING_RECHECK`]
    /// (two system calls and a derivation per name or open otherwise).
    found: parking_lot::Mutex<std::collections::HashMap<[u8; KEY_ID_LEN], Found>>,
    /// Each directory met: its policy, or none (a policy is set once, on an empty directory).
    policies: parking_lot::Mutex<std::collections::HashMap<Fid, Option<Policy>>>,
}

/// A key found in the keyring, and when.
type Found = (Arc<MasterKey>, std::time::Instant);

/// How long a key found in the keyring is used without looking again: a key locked by
/// another process (`lode crypt lock`) is no longer used after this.
pub const KEYRING_RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// Directories whose policy a client remembers, at most.
const POLICIES_KEPT: usize = 1 << 18;

impl Keys {
    /// Keeps `key` for this client; its identifier.
    pub fn add(&self, key: MasterKey) -> [u8; KEY_ID_LEN] {
        let id = key.id;
        self.added.lock().insert(id, Arc::new(key));
        id
    }

    /// Forgets the key `id`, given to this client or found in the keyring; whether it was
    /// given.
    pub fn remove(&self, id: &[u8; KEY_ID_LEN]) -> bool {
        self.found.lock().remove(id);
        self.added.lock().remove(id).is_some()
    }

    /// The key `policy` names: given to this client, or unlocked in the user's keyring.
    pub fn key_for(&self, policy: &Policy) -> Result<Option<Arc<MasterKey>>> {
        let id = &policy.key_id;
        if let Some(k) = self.added.lock().get(id) {
            return Ok(Some(k.clone()));
        }
        if let Some((k, at)) = self.found.lock().get(id) {
            if at.elapsed() < KEYRING_RECHECK {
                return Ok(Some(k.clone()));
            }
        }
        let got = keyring::find(id)?.map(Arc::new);
        let mut found = self.found.lock();
        match &got {
            Some(k) => {
                found.insert(*id, (k.clone(), std::time::Instant::now()));
            }
            None => {
                found.remove(id);
            }
        }
        Ok(got)
    }

    /// Remembers the policy of `inode` when it is a directory.
    pub fn learn(&self, inode: &proto::md::Inode) {
        if inode.kind != proto::md::Kind::Dir {
            return;
        }
        let p = Policy::of_inode(inode);
        let mut m = self.policies.lock();
        if m.len() >= POLICIES_KEPT {
            m.clear();
        }
        m.insert(inode.fid, p);
    }

    /// Forgets the policy of directory `dir`.
    pub fn forget(&self, dir: Fid) {
        self.policies.lock().remove(&dir);
    }

    /// The policy of directory `dir`, if this client met it.
    pub fn known(&self, dir: Fid) -> Option<Option<Policy>> {
        self.policies.lock().get(&dir).copied()
    }
}

/// One client's turn on an encrypted file: writes that rewrite part of a unit, or the unit
/// that was the file's last, go one at a time (`lock` held to write), while reads and writes
/// of whole units inside the stored length go together (held to read). `stored` is how far
/// the file's ciphertext reaches as this client laid it out ([`u64::MAX`]: not known yet, the
/// size at the open then): the length its last unit is encrypted at.
pub struct CipherTurn {
    pub lock: tokio::sync::RwLock<()>,
    stored: std::sync::atomic::AtomicU64,
}

impl Default for CipherTurn {
    fn default() -> Self {
        CipherTurn {
            lock: tokio::sync::RwLock::new(()),
            stored: std::sync::atomic::AtomicU64::new(u64::MAX),
        }
    }
}

impl CipherTurn {
    /// The stored length, or `opened` (the size at the open) when no write laid it out yet.
    pub fn stored(&self, opened: u64) -> u64 {
        match self.stored.load(std::sync::atomic::Ordering::SeqCst) {
            u64::MAX => opened,
            s => s,
        }
    }

    /// The stored length is at least `end` now (from `opened` if not known yet).
    pub fn grew_to(&self, opened: u64, end: u64) {
        use std::sync::atomic::Ordering::SeqCst;
        let _ = self.stored.fetch_update(SeqCst, SeqCst, |s| {
            let base = if s == u64::MAX { opened } else { s };
            Some(base.max(end))
        });
    }

    /// The stored length is `size` now (a truncate, under the lock held to write).
    pub fn set(&self, size: u64) {
        self.stored.store(size, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The directories whose names `m` changes (and so encrypts in an encrypted one).
pub fn name_dirs(m: &proto::md::Mutation) -> Vec<Fid> {
    match m {
        proto::md::Mutation::Create { parent, .. }
        | proto::md::Mutation::CreateAt { parent, .. }
        | proto::md::Mutation::Link { parent, .. }
        | proto::md::Mutation::Unlink { parent, .. }
        | proto::md::Mutation::MkdirOn { parent, .. }
        | proto::md::Mutation::MkdirStriped { parent, .. } => vec![*parent],
        proto::md::Mutation::Rename {
            parent, new_parent, ..
        } => vec![*parent, *new_parent],
        _ => vec![],
    }
}

/// Whether `name` may be an encrypted directory's name as kept (base64url): what a caller
/// without the key names entries by (as it listed them).
pub fn stored_form(name: &[u8]) -> bool {
    proto::crypt::is_stored_name(name)
}

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// Pads `name` with NULs to a multiple of 16 bytes (at least 16), as the ciphertext is kept.
fn padded(name: &[u8]) -> Zeroizing<Vec<u8>> {
    let len = name.len().div_ceil(16).max(1) * 16;
    let mut v = Zeroizing::new(Vec::with_capacity(len + 16));
    v.extend_from_slice(name);
    v.resize(len, 0);
    v
}

/// The plaintext in `v` without its NUL padding, if it is a name (no NUL inside, no `/`).
fn unpadded(v: &[u8]) -> Option<Vec<u8>> {
    let end = v.iter().rposition(|&b| b != 0)? + 1;
    let name = &v[..end];
    (!name.contains(&0)).then(|| name.to_vec())
}

/// A directory's names cipher.
pub struct Names {
    key: aead::LessSafeKey,
    nonce: [u8; aead::NONCE_LEN],
}

impl Names {
    /// `name` as the directory keeps it.
    pub fn encrypt(&self, name: &[u8]) -> Vec<u8> {
        let mut buf = padded(name);
        self.key
            .seal_in_place_append_tag(
                aead::Nonce::assume_unique_for_key(self.nonce),
                aead::Aad::empty(),
                &mut *buf,
            )
            .expect("GCM-SIV seals any name");
        B64.encode(&buf[..]).into_bytes()
    }

    /// The name `stored` encrypts, or `None` if it is not one of this directory's under this
    /// key.
    pub fn decrypt(&self, stored: &[u8]) -> Option<Vec<u8>> {
        let mut buf = Zeroizing::new(B64.decode(stored).ok()?);
        let plain = self
            .key
            .open_in_place(
                aead::Nonce::assume_unique_for_key(self.nonce),
                aead::Aad::empty(),
                &mut buf[..],
            )
            .ok()?;
        unpadded(plain).filter(|n| !n.contains(&b'/'))
    }
}

/// A tree's symlink target cipher (a random nonce per target).
pub struct Targets {
    key: aead::LessSafeKey,
}

impl Targets {
    /// `target` as the symlink keeps it.
    pub fn encrypt(&self, target: &[u8]) -> Result<Vec<u8>> {
        let mut nonce = [0u8; aead::NONCE_LEN];
        aws_lc_rs::rand::fill(&mut nonce).map_err(|_| CryptError::Cipher("random bytes"))?;
        let mut buf = padded(target);
        self.key
            .seal_in_place_append_tag(
                aead::Nonce::assume_unique_for_key(nonce),
                aead::Aad::from(b"symlink"),
                &mut *buf,
            )
            .map_err(|_| CryptError::Cipher("GCM-SIV"))?;
        let mut all = nonce.to_vec();
        all.extend_from_slice(&buf);
        Ok(B64.encode(all).into_bytes())
    }

    /// The target `stored` encrypts, or `None` if it is not one under this key.
    pub fn decrypt(&self, stored: &[u8]) -> Option<Vec<u8>> {
        let all = B64.decode(stored).ok()?;
        if all.len() < aead::NONCE_LEN + 16 {
            return None;
        }
        let (nonce, rest) = all.split_at(aead::NONCE_LEN);
        let mut buf = Zeroizing::new(rest.to_vec());
        let plain = self
            .key
            .open_in_place(
                aead::Nonce::try_assume_unique_for_key(nonce).ok()?,
                aead::Aad::from(b"symlink"),
                &mut buf[..],
            )
            .ok()?;
        unpadded(plain)
    }
}

/// Master keys in the kernel's keyring: the user keyring of the caller's user (`@u`), where
/// every process of the user on this node finds them (the `lode` command, the mount run by
/// that user, the Python package), each named `lode:` and its identifier in hex. Nothing is
/// written to disk.
pub mod keyring {
    use super::*;

    const KEY_SPEC_USER_KEYRING: libc::c_long = -4;
    const KEYCTL_SEARCH: libc::c_long = 10;
    const KEYCTL_READ: libc::c_long = 11;
    const KEYCTL_INVALIDATE: libc::c_long = 21;

    fn description(id: &[u8; KEY_ID_LEN]) -> std::ffi::CString {
        std::ffi::CString::new(format!("lode:{}", proto::crypt::hex(id))).expect("hex has no NUL")
    }

    /// Adds `key` to the user keyring (replacing one of the same identifier).
    pub fn add(key: &MasterKey) -> Result<()> {
        let desc = description(&key.id);
        // SAFETY: add_key(2) with NUL-terminated strings and a payload of its stated length.
        let r = unsafe {
            libc::syscall(
                libc::SYS_add_key,
                c"user".as_ptr(),
                desc.as_ptr(),
                key.key.as_ptr(),
                MASTER_KEY_LEN,
                KEY_SPEC_USER_KEYRING,
            )
        };
        if r < 0 {
            return Err(CryptError::Keyring(std::io::Error::last_os_error()));
        }
        Ok(())
    }

    fn search(id: &[u8; KEY_ID_LEN]) -> Result<Option<libc::c_long>> {
        let desc = description(id);
        // SAFETY: keyctl(KEYCTL_SEARCH) with NUL-terminated strings; no keyring to link to.
        let r = unsafe {
            libc::syscall(
                libc::SYS_keyctl,
                KEYCTL_SEARCH,
                KEY_SPEC_USER_KEYRING,
                c"user".as_ptr(),
                desc.as_ptr(),
                0,
            )
        };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENOKEY) | Some(libc::EKEYREVOKED) | Some(libc::EKEYEXPIRED) => Ok(None),
                _ => Err(CryptError::Keyring(e)),
            };
        }
        Ok(Some(r))
    }

    /// The key named `id`, if the user unlocked it on this node.
    pub fn find(id: &[u8; KEY_ID_LEN]) -> Result<Option<MasterKey>> {
        let Some(serial) = search(id)? else {
            return Ok(None);
        };
        let mut buf = Zeroizing::new([0u8; MASTER_KEY_LEN + 1]);
        // SAFETY: keyctl(KEYCTL_READ) into a buffer of the stated length.
        let n = unsafe {
            libc::syscall(
                libc::SYS_keyctl,
                KEYCTL_READ,
                serial,
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENOKEY) | Some(libc::EKEYREVOKED) => Ok(None),
                _ => Err(CryptError::Keyring(e)),
            };
        }
        let key = MasterKey::new(&buf[..(n as usize).min(buf.len())])?;
        // A key under another's name is no key of ours.
        Ok((key.id == *id).then_some(key))
    }

    /// Removes the key named `id` from the keyring; whether it was there.
    pub fn remove(id: &[u8; KEY_ID_LEN]) -> Result<bool> {
        let Some(serial) = search(id)? else {
            return Ok(false);
        };
        // SAFETY: keyctl(KEYCTL_INVALIDATE) of a key serial.
        let r = unsafe { libc::syscall(libc::SYS_keyctl, KEYCTL_INVALIDATE, serial) };
        if r < 0 {
            return Err(CryptError::Keyring(std::io::Error::last_os_error()));
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> MasterKey {
        MasterKey::new(&[b; 64]).unwrap()
    }

    fn policy(k: &MasterKey) -> Policy {
        Policy::new(k.id(), [3; 16])
    }

    #[test]
    fn contents_round_trip_at_every_tail_length_and_differ_per_file_and_unit() {
        let k = key(1);
        let p = policy(&k);
        let a = k.contents(&p, Fid::new(0x2_0000_0400, 1, 0)).unwrap();
        let b = k.contents(&p, Fid::new(0x2_0000_0400, 2, 0)).unwrap();
        for len in [
            1usize,
            15,
            16,
            17,
            100,
            4095,
            4096,
            4097,
            8192,
            3 * 4096 + 33,
        ] {
            let plain: Vec<u8> = (0..len).map(|i| (i * 7 + 1) as u8).collect();
            let mut c = plain.clone();
            a.encrypt(5, &mut c).unwrap();
            assert_ne!(c, plain, "len {len}");
            let mut other = plain.clone();
            b.encrypt(5, &mut other).unwrap();
            assert_ne!(c, other, "two files' ciphertexts alike at len {len}");
            let mut d = c.clone();
            a.decrypt(5, &mut d).unwrap();
            assert_eq!(d, plain, "len {len}");
            // The unit number is the tweak.
            let mut w = c.clone();
            a.decrypt(6, &mut w).unwrap();
            assert_ne!(w, plain, "len {len}");
        }
        // Out of place, the same bytes.
        for len in [1usize, 15, 16, 17, 4096, 3 * 4096 + 33] {
            let plain: Vec<u8> = (0..len).map(|i| (i * 3) as u8).collect();
            let mut inplace = plain.clone();
            a.encrypt(9, &mut inplace).unwrap();
            let mut out = vec![1, 2];
            a.encrypt_to(9, &plain, &mut out).unwrap();
            assert_eq!(&out[2..], &inplace[..], "len {len}");
        }
        // Units are apart: the second unit of a run is the unit alone at its number.
        let plain = vec![0x5au8; 8192];
        let mut all = plain.clone();
        a.encrypt(10, &mut all).unwrap();
        let mut one = plain[4096..].to_vec();
        a.encrypt(11, &mut one).unwrap();
        assert_eq!(&all[4096..], &one[..]);
        // Zeros written are not a hole; a hole reads as zeros.
        let mut z = vec![0u8; 4096];
        a.encrypt(0, &mut z).unwrap();
        assert!(z.iter().any(|&b| b != 0));
        let mut hole = vec![0u8; 4096];
        a.decrypt(0, &mut hole).unwrap();
        assert!(hole.iter().all(|&b| b == 0));
    }

    #[test]
    fn names_are_deterministic_per_directory_and_a_wrong_key_reads_none() {
        let k = key(1);
        let p = policy(&k);
        let d1 = k.names(&p, Fid::new(0x2_0000_0400, 1, 0)).unwrap();
        let d2 = k.names(&p, Fid::new(0x2_0000_0400, 2, 0)).unwrap();
        let s = d1.encrypt(b"model.safetensors");
        assert_eq!(s, d1.encrypt(b"model.safetensors"));
        assert_ne!(s, d2.encrypt(b"model.safetensors"));
        assert!(s
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'_'));
        assert_eq!(d1.decrypt(&s).as_deref(), Some(&b"model.safetensors"[..]));
        assert_eq!(d2.decrypt(&s), None);
        let wrong = key(2).names(&p, Fid::new(0x2_0000_0400, 1, 0)).unwrap();
        assert_eq!(wrong.decrypt(&s), None);
        let long = vec![b'x'; 255];
        let s = d1.encrypt(&long);
        assert_eq!(s.len(), proto::crypt::MAX_STORED_NAME);
        assert_eq!(d1.decrypt(&s), Some(long));
        assert_eq!(d1.decrypt(b"not base64 at all!"), None);
    }

    #[test]
    fn targets_round_trip_and_the_key_id_names_the_key() {
        let k = key(1);
        let p = policy(&k);
        let t = k.targets(&p).unwrap();
        let s = t.encrypt(b"../shards/0001").unwrap();
        assert_ne!(s, t.encrypt(b"../shards/0001").unwrap());
        assert_eq!(t.decrypt(&s).as_deref(), Some(&b"../shards/0001"[..]));
        assert_eq!(key(2).targets(&p).unwrap().decrypt(&s), None);
        assert!(k.unlocks(&p));
        assert!(!key(2).unlocks(&p));
        assert!(MasterKey::new(&[0; 63]).is_err());
    }
}

#[cfg(test)]
mod speed {
    /// `cargo test --release -p lode-client --lib crypt::speed -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn contents_cipher_speed() {
        let k = super::MasterKey::new(&[1; 64]).unwrap();
        let p = proto::crypt::Policy::new(k.id(), [2; 16]);
        let c = k
            .contents(&p, proto::Fid::new(0x2_0000_0400, 1, 0))
            .unwrap();
        let mut buf = vec![7u8; 256 << 20];
        let t = std::time::Instant::now();
        c.encrypt(0, &mut buf).unwrap();
        let e = t.elapsed();
        let t = std::time::Instant::now();
        let copy = buf.clone();
        let m = t.elapsed();
        std::hint::black_box(copy);
        let mut unit = vec![7u8; 4096];
        let t = std::time::Instant::now();
        for i in 0..100_000 {
            c.decrypt(i, &mut unit).unwrap();
        }
        println!("one 4 KiB unit: {:.2} µs", t.elapsed().as_secs_f64() * 10.0);
        println!(
            "AES-256-XTS: {:.2} GB/s on one core; memcpy {:.2} GB/s",
            0.268 / e.as_secs_f64(),
            0.268 / m.as_secs_f64()
        );
    }
}
