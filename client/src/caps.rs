//! The capabilities an open file holds for its objects: handed out by the MDS with the open,
//! looked up for every object request, and renewed (by sending the same open again, which
//! counts once) before they expire or when the file's objects changed.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use proto::capa::{Capability, Grant};
use proto::md::{Creds, MdsOpen, OpenHandle};
use proto::{Fid, FsErrorKind, Nid, Rpc};

use crate::client::Client;
use crate::error::{ClientError, Result};

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

    /// The capability to send with a request on `object`: `None` when the servers check none
    /// (authentication off), else one fresh enough, renewed first if needed.
    pub(crate) async fn get(
        &self,
        client: &Client,
        target: u32,
        object: Fid,
    ) -> Result<Option<Capability>> {
        if let Some(c) = self.fresh(target, object) {
            return Ok(c);
        }
        let _one = self.renewing.lock().await;
        if let Some(c) = self.fresh(target, object) {
            return Ok(c);
        }
        if !self.renewable {
            return Err(ClientError::fs(
                FsErrorKind::AccessDenied,
                format!("a borrowed capability for {} is too old", self.fid),
            ));
        }
        let opened = client
            .rpc(
                &client.inner.mds.clone(),
                &MdsOpen {
                    fid: self.fid,
                    handle: self.handle,
                    creds: self.creds.clone(),
                    path: None,
                    lease: None,
                },
            )
            .await?;
        client
            .inner
            .grants
            .remember(self.fid, &self.creds, &opened.grant);
        let m = margin(&opened.grant);
        *self.grant.lock() = (opened.grant, m);
        self.fresh(target, object).ok_or_else(|| {
            ClientError::fs(
                FsErrorKind::AccessDenied,
                format!(
                    "the MDS granted no access to object {object} of {}",
                    self.fid
                ),
            )
        })
    }

    /// Sends the object request `make` builds around the capability for `object`. A storage
    /// server refusing it (EACCES: expired on the way, clocks apart, the objects changed) gets
    /// it once more with a renewed grant; the server refuses before doing anything, so the
    /// resend is safe.
    pub(crate) async fn rpc<R: Rpc + Clone>(
        &self,
        client: &Client,
        peer: &Nid,
        target: u32,
        object: Fid,
        make: impl Fn(Option<Capability>) -> R,
    ) -> Result<R::Reply> {
        self.rpc_within(client, peer, target, object, make, None)
            .await
    }

    /// As [`Caps::rpc`], giving up on the server after `limit` when one is given.
    pub(crate) async fn rpc_within<R: Rpc + Clone>(
        &self,
        client: &Client,
        peer: &Nid,
        target: u32,
        object: Fid,
        make: impl Fn(Option<Capability>) -> R,
        limit: Option<std::time::Duration>,
    ) -> Result<R::Reply> {
        let capa = self.get(client, target, object).await?;
        match client.rpc_within(peer, &make(capa), limit).await {
            Err(e) if capa.is_some() && e.is(FsErrorKind::AccessDenied) => {
                self.grant.lock().0.expiry = 0;
                let capa = self.get(client, target, object).await?;
                client.rpc_within(peer, &make(capa), limit).await
            }
            other => other,
        }
    }

    fn fresh(&self, target: u32, object: Fid) -> Option<Option<Capability>> {
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
