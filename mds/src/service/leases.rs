//! Lease waits (the long poll recalls come back on) and directories held alone.

use super::*;

impl MdsService {
    /// The long poll recalls come back on (`MDS_LEASE_WAIT`), for clients that joined.
    pub(super) async fn serve_lease_wait(&self, req: &Incoming) -> Result<Vec<u8>, RemoteError> {
        let r: MdsLeaseWait = req.decode()?;
        self.owns(req, r.client)?;
        if !self.clients.holds(r.client) {
            return Err(RemoteError::new(
                StatusCode::Fs(FsErrorKind::NotPermitted),
                "leases are for clients that joined (MDS_CONNECT)",
            ));
        }
        let idmap = self.nodemap.idmap(req);
        let recall = self
            .leases
            .wait(
                r.client,
                r.nr,
                r.acked,
                r.epoch,
                &r.cancel,
                self.instance,
                idmap,
            )
            .await;
        reply::<MdsLeaseWait>(&recall)
    }

    /// A directory held alone, asked for (`MDS_LEASE_ALONE`).
    pub(super) fn serve_lease_alone(&self, req: &Incoming) -> Result<Vec<u8>, RemoteError> {
        let r: MdsLeaseAlone = req.decode()?;
        let granted = self
            .lessee(Some(r.client))
            .is_some_and(|c| self.leases.grant_alone(c, r.dir));
        reply::<MdsLeaseAlone>(&MdsLeaseAloneReply { granted })
    }

    /// The client a request's leases go to: one that asked and joined the table of clients.
    pub(super) fn lessee(&self, asked: Option<u128>) -> Option<u128> {
        asked.filter(|c| self.clients.holds(*c))
    }

    /// The leases granted, for tests and statistics.
    pub fn leases(&self) -> &Arc<Leases> {
        &self.leases
    }
}
