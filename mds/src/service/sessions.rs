//! Client sessions: joining, pings, leaving, and the replay of uncommitted changes after a restart
//! (with the sealed tickets it checks).

use super::*;

/// What a replay ticket's seal covers besides the ticket: its purpose and its client.
fn ticket_context(client: u128) -> Vec<u8> {
    let mut what = b"replay ticket ".to_vec();
    what.extend_from_slice(&client.to_be_bytes());
    what
}

impl MdsService {
    /// A client's ping (`MDS_PING`): keeps its handles and its place in the table of clients.
    pub(super) fn serve_ping(&self, req: &Incoming) -> Result<Vec<u8>, RemoteError> {
        let r: MdsPing = req.decode()?;
        self.owns(req, r.client)?;
        self.alloc.open.seen(r.client);
        self.clients.seen(r.client);
        reply::<MdsPing>(&MdsPong {
            instance: self.instance,
            committed: self.store.committed(),
        })
    }

    /// A client joins (`MDS_CONNECT`).
    pub(super) fn serve_connect(&self, req: &Incoming) -> Result<Vec<u8>, RemoteError> {
        let r: MdsConnect = req.decode()?;
        self.owns(req, r.client)?;
        let recovering = self
            .clients
            .connect(r.client)
            .map_err(|e| RemoteError::new(StatusCode::Io, e.to_string()))?;
        reply::<MdsConnect>(&MdsConnected {
            instance: self.instance,
            committed: self.store.committed(),
            recovering,
            recovered: self.clients.recovered().unwrap_or(0),
        })
    }

    /// A client leaves (`MDS_DISCONNECT`): its leases go.
    pub(super) fn serve_disconnect(&self, req: &Incoming) -> Result<Vec<u8>, RemoteError> {
        let r: MdsDisconnect = req.decode()?;
        self.owns(req, r.client)?;
        self.clients
            .disconnect(r.client)
            .map_err(|e| RemoteError::new(StatusCode::Io, e.to_string()))?;
        self.leases.forget(r.client);
        reply::<MdsDisconnect>(&MdsDisconnected {})
    }

    /// One uncommitted change replayed after a restart (`MDS_REPLAY`), by its sealed ticket.
    pub(super) async fn serve_replay(&self, req: &Incoming) -> Result<Vec<u8>, RemoteError> {
        let r: MdsReplay = req.decode()?;
        self.owns(req, r.client)?;
        self.same_run(r.instance)?;
        let ticket = self.unseal(r.client, &r.ticket)?;
        let outcome = self
            .clients
            .replay(r.client, r.transno, ticket)
            .await
            .map_err(|why| RemoteError::new(StatusCode::Io, why))?;
        reply::<MdsReplay>(&MdsReplayed { outcome })
    }

    /// A client replayed all it had (`MDS_REPLAY_DONE`).
    pub(super) fn serve_replay_done(&self, req: &Incoming) -> Result<Vec<u8>, RemoteError> {
        let r: MdsReplayDone = req.decode()?;
        self.same_run(r.instance)?;
        self.owns(req, r.client)?;
        self.clients.replay_done(r.client, r.ahead);
        reply::<MdsReplayDone>(&MdsReplayDoneAck {})
    }

    /// Everything answered so far made durable (`MDS_SYNC`).
    pub(super) async fn serve_sync(&self, req: &Incoming) -> Result<Vec<u8>, RemoteError> {
        let _: MdsSync = req.decode()?;
        let committed = self.store.sync().await.map_err(store_error)?;
        reply::<MdsSync>(&MdsSynced {
            committed,
            instance: self.instance,
        })
    }

    /// A ticket for `client` to replay: the encoded ticket ([`crate::journal::encode_ticket`]),
    /// then its seal (none when authentication is off: every peer is trusted then).
    pub(super) fn seal(&self, client: u128, mut out: Vec<u8>) -> Vec<u8> {
        if let Some(key) = &self.granter.key {
            let seal = key.seal(&ticket_context(client), &out);
            out.extend_from_slice(&seal);
        }
        out
    }

    /// The ticket `client` sent back, if the MDS sealed it for that client.
    pub(super) fn unseal(&self, client: u128, raw: &[u8]) -> Result<Ticket, RemoteError> {
        let forged = || {
            tracing::warn!(
                client = format!("{client:032x}"),
                "a replay ticket failed its seal"
            );
            RemoteError::new(
                StatusCode::Fs(FsErrorKind::NotPermitted),
                "the replay ticket is not one this filesystem sealed for this client",
            )
        };
        let body = match &self.granter.key {
            Some(key) => {
                let cut = raw.len().checked_sub(32).ok_or_else(forged)?;
                let (body, seal) = raw.split_at(cut);
                if !key.unseal(&ticket_context(client), body, seal) {
                    return Err(forged());
                }
                body
            }
            None => raw,
        };
        postcard::from_bytes(body).map_err(|e| {
            RemoteError::new(
                StatusCode::Fs(FsErrorKind::Invalid),
                format!("a replay ticket that does not decode: {e}"),
            )
        })
    }
}
