//! Signing and checking capabilities ([`proto::capa`]) with HMAC-SHA256 under the capability
//! key, which is derived from the cluster key and held by servers only.

use aws_lc_rs::hmac;
use proto::capa::{Capability, Grant, ObjectMac};
use proto::Fid;

use super::Keyring;

pub use proto::capa::{READ, WRITE};

/// The rights a request needs.
pub type Rights = u8;

/// Why a capability was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapabilityError {
    #[error("no capability")]
    Missing,
    #[error("the capability does not match this object")]
    Forged,
    #[error("the capability expired")]
    Expired,
    #[error("the capability does not grant this access")]
    Denied,
}

/// The key that signs and checks capabilities.
#[derive(Clone)]
pub struct CapabilityKey(hmac::Key);

impl std::fmt::Debug for CapabilityKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CapabilityKey")
    }
}

impl CapabilityKey {
    /// The capability key of a keyring, if it holds the cluster key.
    pub fn of(keys: &Keyring) -> Option<CapabilityKey> {
        keys.capability_key()
            .map(|k| CapabilityKey(hmac::Key::new(hmac::HMAC_SHA256, k)))
    }

    fn mac(&self, target: u32, object: Fid, rights: u8, expiry: u64) -> [u8; 16] {
        let mut msg = [0u8; 18 + 4 + 16 + 1 + 8];
        msg[..18].copy_from_slice(b"lode capability v1");
        msg[18..22].copy_from_slice(&target.to_be_bytes());
        msg[22..38].copy_from_slice(&object.to_bytes());
        msg[38] = rights;
        msg[39..].copy_from_slice(&expiry.to_be_bytes());
        let tag = hmac::sign(&self.0, &msg);
        let mut out = [0u8; 16];
        out.copy_from_slice(&tag.as_ref()[..16]);
        out
    }

    /// A seal on `payload` under the context `what`: the MDS seals what it hands a client to
    /// give back later (a replay ticket), so that a client cannot forge one.
    pub fn seal(&self, what: &[u8], payload: &[u8]) -> [u8; 32] {
        let mut ctx = hmac::Context::with_key(&self.0);
        ctx.update(b"lode seal v1\0");
        ctx.update(&(what.len() as u32).to_be_bytes());
        ctx.update(what);
        ctx.update(payload);
        let mut out = [0u8; 32];
        out.copy_from_slice(ctx.sign().as_ref());
        out
    }

    /// Whether `seal` is this key's seal of `payload` under `what`.
    pub fn unseal(&self, what: &[u8], payload: &[u8], seal: &[u8]) -> bool {
        aws_lc_rs::constant_time::verify_slices_are_equal(&self.seal(what, payload), seal).is_ok()
    }

    /// Grants `rights` on `objects` until `expiry` (seconds since the epoch).
    pub fn grant(
        &self,
        objects: impl IntoIterator<Item = (u32, Fid)>,
        rights: u8,
        expiry: u64,
    ) -> Grant {
        Grant {
            rights,
            expiry,
            objects: objects
                .into_iter()
                .map(|(target, object)| ObjectMac {
                    target,
                    object,
                    mac: self.mac(target, object, rights, expiry),
                })
                .collect(),
        }
    }

    /// Checks that `capa` grants `need` on `object` of `target` at `now` (seconds since the
    /// epoch).
    pub fn check(
        &self,
        capa: Option<&Capability>,
        target: u32,
        object: Fid,
        need: Rights,
        now: u64,
    ) -> Result<(), CapabilityError> {
        let capa = capa.ok_or(CapabilityError::Missing)?;
        let want = self.mac(target, object, capa.rights, capa.expiry);
        aws_lc_rs::constant_time::verify_slices_are_equal(&want, &capa.mac)
            .map_err(|_| CapabilityError::Forged)?;
        if now > capa.expiry {
            return Err(CapabilityError::Expired);
        }
        if capa.rights & need != need {
            return Err(CapabilityError::Denied);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::KeyFile;

    #[test]
    fn a_capability_is_checked_for_object_rights_expiry_and_forgery() {
        let keys = Keyring::new(&KeyFile::generate().unwrap());
        let key = CapabilityKey::of(&keys).unwrap();
        let obj = Fid::new(0x1_0000_0000, 7, 0);
        let other = Fid::new(0x1_0000_0000, 8, 0);
        let g = key.grant([(0, obj)], READ, 1000);
        let c = g.for_object(0, obj).unwrap();
        assert_eq!(key.check(Some(&c), 0, obj, READ, 999), Ok(()));
        assert_eq!(
            key.check(None, 0, obj, READ, 999),
            Err(CapabilityError::Missing)
        );
        assert_eq!(
            key.check(Some(&c), 0, other, READ, 999),
            Err(CapabilityError::Forged)
        );
        assert_eq!(
            key.check(Some(&c), 1, obj, READ, 999),
            Err(CapabilityError::Forged)
        );
        assert_eq!(
            key.check(Some(&c), 0, obj, READ, 1001),
            Err(CapabilityError::Expired)
        );
        assert_eq!(
            key.check(Some(&c), 0, obj, WRITE, 999),
            Err(CapabilityError::Denied)
        );
        let widened = Capability {
            rights: READ | WRITE,
            ..c
        };
        assert_eq!(
            key.check(Some(&widened), 0, obj, WRITE, 999),
            Err(CapabilityError::Forged)
        );
        let later = Capability { expiry: 5000, ..c };
        assert_eq!(
            key.check(Some(&later), 0, obj, READ, 2000),
            Err(CapabilityError::Forged)
        );
        let stranger = CapabilityKey::of(&Keyring::new(&KeyFile::generate().unwrap())).unwrap();
        assert_eq!(
            stranger.check(Some(&c), 0, obj, READ, 999),
            Err(CapabilityError::Forged)
        );
    }
}
