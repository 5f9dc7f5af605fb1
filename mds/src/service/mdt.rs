//! Reads of a file's bytes the MDS keeps (Data-on-MDT): through a handle granted read, else by the
//! caller's read permission.

use super::*;

impl MdsService {
    /// A read of the bytes the MDS keeps (`MDS_READ_MDT`).
    pub(super) fn serve_read_mdt(&self, req: &Incoming) -> Result<Vec<u8>, RemoteError> {
        let mut r: MdsReadMdt = req.decode()?;
        r.creds = self.nodemap.map(req, r.creds);
        self.audit_writes(false)?;
        if r.len as u64 > proto::layout::MAX_MDT_SIZE {
            return Err(RemoteError::new(
                StatusCode::Fs(FsErrorKind::Invalid),
                format!(
                    "a read of the MDS's part is at most {} bytes",
                    proto::layout::MAX_MDT_SIZE
                ),
            ));
        }
        // Through an open handle granted read, the open was the check; otherwise the
        // caller's read permission.
        let by_handle = r
            .handle
            .and_then(|h| self.alloc.open.rights(r.fid, h))
            .is_some_and(|rights| rights & proto::capa::READ != 0);
        let leased = self
            .lessee(r.lease)
            .is_some_and(|c| self.grant(c, &[r.fid]));
        let (data, inode) = self
            .store
            .read(|ns| {
                let inode = ns.inode(r.fid)?.clone();
                if !by_handle && !inode.permits(&r.creds, 4) {
                    return Err(NsError {
                        kind: FsErrorKind::AccessDenied,
                        what: format!("permission denied on {}", r.fid),
                    });
                }
                Ok((ns.read_mdt(r.fid, r.offset, u64::from(r.len))?, inode))
            })
            .map_err(ns_error)?;
        self.record_mdt_read(req, &r.creds, r.fid, r.offset, data.len());
        reply::<MdsReadMdt>(&MdsMdtData {
            data,
            inode,
            leased,
        })
    }
}
