//! The capabilities an open file holds for its objects: handed out by the MDS with the open,
//! looked up for every object request, and renewed (by sending the same open again, which
//! counts once) before they expire or when the file's objects changed. Plain state: the
//! session renews them ([`crate::client::Client::object_rpc`]).
//!
//! And the grants this client's opens were given, remembered to lend to a read begun before
//! its own open is answered (see `early`).

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use proto::capa::{Capability, Grant};
use proto::md::{Creds, OpenHandle};
use proto::Fid;

/// A capability this close to its expiry is renewed first (or a quarter of its lifetime,
/// when it was granted for less than four times this). Clients' and storage servers' clocks
/// must agree to within this.
const RENEW_BEFORE: Duration = Duration::from_secs(300);

pub(crate) struct Caps {
    fid: Fid,
    handle: OpenHandle,
    creds: Creds,
    /// The grant, and how long before its expiry it is renewed.
    grant: Mutex<(Grant, u64)>,
    renewing: tokio::sync::Mutex<()>,
    /// Renewed by opening again under `handle`; false for a grant borrowed from an earlier
    /// open (a read begun before its own open is counted, see `crate::early`): no handle of
    /// its own to renew under, so an expired one is an error.
    renewable: bool,
}

/// How long before its expiry a grant is renewed: a quarter of its lifetime, at most
/// [`RENEW_BEFORE`], and at least a second, since expiries count whole seconds: a capability
/// sent in its last second could expire on the way.
fn margin(g: &Grant) -> u64 {
    (g.expiry.saturating_sub(now()) / 4).clamp(1, RENEW_BEFORE.as_secs())
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Caps {
    pub(crate) fn new(fid: Fid, handle: OpenHandle, creds: Creds, grant: Grant) -> Caps {
        Caps {
            fid,
            handle,
            creds,
            grant: Mutex::new((grant.clone(), margin(&grant))),
            renewing: tokio::sync::Mutex::new(()),
            renewable: true,
        }
    }

    /// Capabilities borrowed from an earlier open's grant, never renewed.
    pub(crate) fn borrowed(fid: Fid, handle: OpenHandle, creds: Creds, grant: Grant) -> Caps {
        Caps {
            renewable: false,
            ..Caps::new(fid, handle, creds, grant)
        }
    }

    pub(crate) fn handle(&self) -> OpenHandle {
        self.handle
    }

    pub(crate) fn creds(&self) -> &Creds {
        &self.creds
    }

    /// Takes the grant an answer brought.
    pub(crate) fn set(&self, grant: Grant) {
        let m = margin(&grant);
        *self.grant.lock() = (grant, m);
    }

    pub(crate) fn fid(&self) -> Fid {
        self.fid
    }

    /// Whether the grant is renewed by opening again (else it was borrowed).
    pub(crate) fn renewable(&self) -> bool {
        self.renewable
    }

    /// Held while the grant is renewed, so that one renewal serves every request waiting.
    pub(crate) fn renewing(&self) -> &tokio::sync::Mutex<()> {
        &self.renewing
    }

    /// Forgets the grant's freshness: the next request renews it first (a server refused it).
    pub(crate) fn expire(&self) {
        self.grant.lock().0.expiry = 0;
    }

    /// The capability for `object`, if the grant holds one fresh enough (`Some(None)`: the
    /// servers check none).
    pub(crate) fn fresh(&self, target: u32, object: Fid) -> Option<Option<Capability>> {
        let g = self.grant.lock();
        let (g, margin) = (&g.0, g.1);
        if g.expiry == u64::MAX && g.objects.is_empty() {
            return Some(None);
        }
        g.for_object(target, object)
            .filter(|c| c.expiry >= now().saturating_add(margin))
            .map(Some)
    }

    /// Whether the grant allows `rights` (always, when servers check no capabilities).
    pub(crate) fn allows(&self, rights: u8) -> bool {
        let g = &self.grant.lock().0;
        (g.expiry == u64::MAX && g.objects.is_empty()) || g.rights & rights == rights
    }
}

/// Most grants remembered; past it, the table starts again.
const MAX_GRANTS: usize = 65_536;
/// A grant with less than this left before its expiry is not lent (seconds).
const LEND_MARGIN: u64 = 60;

/// The latest grant each file's objects were given to this client, with the credentials
/// they were given for.
#[derive(Default)]
pub(crate) struct Grants {
    of: Mutex<HashMap<Fid, (Creds, Grant)>>,
}

impl Grants {
    pub(crate) fn remember(&self, fid: Fid, creds: &Creds, grant: &Grant) {
        let mut of = self.of.lock();
        if of.len() >= MAX_GRANTS && !of.contains_key(&fid) {
            of.clear();
        }
        of.insert(fid, (creds.clone(), grant.clone()));
    }

    /// A grant `creds` were given to read `fid`'s objects, fresh enough to lend.
    pub(crate) fn lend(&self, fid: Fid, creds: &Creds) -> Option<Grant> {
        let of = self.of.lock();
        let (who, g) = of.get(&fid)?;
        let unchecked = g.expiry == u64::MAX && g.objects.is_empty();
        let readable = g.rights & proto::capa::READ != 0;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(u64::MAX, |d| d.as_secs());
        (who == creds && (unchecked || (readable && g.expiry >= now.saturating_add(LEND_MARGIN))))
            .then(|| g.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::capa::ObjectMac;

    fn grant(rights: u8, expiry: u64) -> Grant {
        Grant {
            rights,
            expiry,
            objects: vec![ObjectMac {
                target: 0,
                object: Fid {
                    seq: proto::fid::INODE_SEQ,
                    oid: 2,
                    ver: 0,
                },
                mac: [0; 16],
            }],
        }
    }

    fn user(uid: u32) -> Creds {
        Creds {
            uid,
            gid: uid,
            groups: vec![],
        }
    }

    #[test]
    fn a_grant_is_lent_only_to_its_credentials_to_read_while_fresh() {
        let g = Grants::default();
        let f = Fid {
            seq: proto::fid::INODE_SEQ,
            oid: 1,
            ver: 0,
        };
        let later = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 3600;
        assert!(g.lend(f, &user(5)).is_none(), "nothing remembered yet");
        g.remember(f, &user(5), &grant(proto::capa::READ, later));
        assert!(g.lend(f, &user(5)).is_some());
        assert!(g.lend(f, &user(6)).is_none(), "another caller's grant");
        g.remember(f, &user(5), &grant(proto::capa::WRITE, later));
        assert!(g.lend(f, &user(5)).is_none(), "no right to read");
        g.remember(f, &user(5), &grant(proto::capa::READ, later - 3600 + 10));
        assert!(g.lend(f, &user(5)).is_none(), "about to expire");
    }
}
