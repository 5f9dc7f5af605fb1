//! The mirror scan (administrators only): files with stale copies, or with objects on a target.

use super::*;

impl MdsService {
    /// Files whose copies need care (`MDS_MIRROR_SCAN`), for administrators.
    pub(super) fn serve_mirror_scan(&self, req: &Incoming) -> Result<Vec<u8>, RemoteError> {
        // A scan lists files by FID, past every directory's permissions: it is for
        // administrators (the cluster key, or root on a trusted node).
        let map = self.nodemap.idmap(req);
        if !map.identity && !map.trusted {
            return Err(RemoteError::new(
                StatusCode::Fs(FsErrorKind::NotPermitted),
                "the mirror scan is for administrators (the cluster key, or root on a \
                     trusted node)",
            ));
        }
        let r: MdsMirrorScan = req.decode()?;
        self.mirror_scan(r)
    }

    /// Inodes, and the space of the targets that are up.
    /// Files whose mirrors need care: stale ones, or those with objects on a target.
    pub(super) fn mirror_scan(&self, r: MdsMirrorScan) -> Result<Vec<u8>, RemoteError> {
        let max = r.max.clamp(1, MAX_MIRROR_SCAN) as usize;
        let on = |l: &Layout, t: u32| -> Vec<u16> {
            let mut ms: Vec<u16> = l
                .components
                .iter()
                .filter(|c| c.objects.iter().any(|o| o.target == t))
                .map(|c| c.mirror)
                .collect();
            ms.dedup();
            ms
        };
        let (files, end) = self.store.read(|ns| {
            let (found, end) = ns.mirrored_files(r.after, max, |l| {
                (!r.stale || !l.stale_mirrors().is_empty())
                    && r.target.is_none_or(|t| !on(l, t).is_empty())
            });
            let files = found
                .into_iter()
                .map(|i| {
                    let l = i.layout.as_ref().expect("picked by its layout");
                    let stale = l.stale_mirrors();
                    let mut stale_targets: Vec<u32> = l
                        .components
                        .iter()
                        .filter(|c| c.stale)
                        .flat_map(|c| c.objects.iter().map(|o| o.target))
                        .collect();
                    stale_targets.sort_unstable();
                    stale_targets.dedup();
                    ScannedFile {
                        fid: i.fid,
                        size: i.size,
                        mirrors: l.mirror_count(),
                        stale,
                        on_target: r.target.map(|t| on(l, t)).unwrap_or_default(),
                        stale_targets,
                        open: self.alloc.open.is_open(i.fid),
                    }
                })
                .collect();
            (files, end)
        });
        reply::<MdsMirrorScan>(&MdsMirrorScanned { files, end })
    }
}
