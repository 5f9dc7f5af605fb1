//! The registry of storage targets: which index belongs to which target (by its uuid) on which
//! server, and how much space each had at its last heartbeat.
//!
//! Index assignments are durable: the registry file is rewritten whole (to a temporary name,
//! fsynced, renamed over the old one, directory fsynced) before a registration is answered, so
//! an index is never given to two targets, even across a crash. Space and liveness are kept in
//! memory; they come back with the next heartbeat.
//!
//! ```text
//! registry file:  "LODEREG\0" (8) | version u32 | body_len u32 | crc32c(body) u32 | body
//! body:           postcard Vec<(index u32, uuid u128, oss NID)>
//! mdts file:      "LODEMDT\0" (8) | version u32 | body_len u32 | crc32c(body) u32 | body
//! body:           postcard Vec<(mdt u32, NID)>
//! ```
//!
//! MDT0's registry also lists the filesystem's other MDTs, each where its MDS last said it
//! serves (kept the same way, so a restarted MDT0 lists them before they are heard from
//! again), and whether it was heard from lately: every other MDT's MDS registers again at
//! each heartbeat.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use parking_lot::Mutex;
use proto::registry::{TargetInfo, TargetReport};
use proto::Nid;

use crate::format::Identity;

const MAGIC: [u8; 8] = *b"LODEREG\0";
const MDTS_MAGIC: [u8; 8] = *b"LODEMDT\0";
const VERSION: u32 = 1;
/// Most targets one filesystem may have.
pub const MAX_TARGETS: usize = 65_536;
/// A target not heard from for this long is reported down, unless the MDS is set otherwise.
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a list made for [`Registry::targets`] stays the answer, unless a registration or a
/// heartbeat changed the registry meanwhile: creates read it many times a millisecond, and
/// a target's liveness moves on the scale of its heartbeat timeout.
const SNAPSHOT_AGE: Duration = Duration::from_millis(50);

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("target index {index} belongs to another target")]
    IndexTaken { index: u32 },
    #[error(
        "target {uuid:032x} belongs to filesystem {theirs:032x}, and this MDS serves {ours}: \
         refusing it (is the storage server pointed at the wrong MDS, or the MDS at the wrong \
         data directory?)"
    )]
    OtherFilesystem {
        uuid: u128,
        theirs: u128,
        ours: Box<Identity>,
    },
    #[error(
        "target {uuid:032x} says it is index {index}, which this MDS does not know: refusing \
         it (is the MDS's data directory the right one?); if it belongs here, add it with \
         `lode-mds target-add --data-dir DIR --index {index} --uuid {uuid:032x} --oss ADDR`"
    )]
    UnknownIndex { index: u32, uuid: u128 },
    #[error(
        "target {uuid:032x} has no index yet, and only MDT0 gives targets their indices: \
         register its server with MDT0's MDS first (the first --mds of lode-oss)"
    )]
    NotFromMdt0 { uuid: u128 },
    #[error("the filesystem already has {MAX_TARGETS} targets")]
    Full,
    #[error("MDT{mdt} belongs to filesystem {theirs:032x}, and this MDS serves {ours}: refused")]
    MdtOfAnother {
        mdt: u32,
        theirs: u128,
        ours: Box<Identity>,
    },
    #[error("only MDT0 keeps the list of MDTs; this MDS serves MDT{0}")]
    NotMdt0(u32),
    #[error("MDT{0} is not another MDT of a filesystem (0 is this one; at most {max} MDTs)", max = proto::fid::MAX_MDTS)]
    BadMdt(u32),
    #[error(
        "MDT{mdt} is served at {serving}, heard from lately, and {asking} says it serves it too: \
         refused (two MDSs formatted as one MDT?)"
    )]
    MdtTaken { mdt: u32, serving: Nid, asking: Nid },
    #[error("registry file {path}: {reason}")]
    Damaged { path: PathBuf, reason: String },
    #[error("registry file {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

#[derive(Clone, Debug)]
struct Entry {
    uuid: u128,
    oss: Nid,
    /// The server's other addresses, as it last said (kept in memory: every heartbeat
    /// carries them).
    rails: Vec<Nid>,
    total: u64,
    free: u64,
    last_seen: Option<Instant>,
}

pub struct Registry {
    path: PathBuf,
    /// The filesystem whose targets these are: every target records it, and one of another
    /// is refused.
    fs: Identity,
    entries: Mutex<BTreeMap<u32, Entry>>,
    /// A target not heard from for this long is down.
    heartbeat_timeout: Duration,
    /// The list as last made, and when; dropped by every change.
    snapshot: Mutex<Option<(Instant, Arc<[TargetInfo]>)>>,
    /// The other MDTs (on MDT0): where each serves, its other addresses, when last heard of.
    mdts: Mutex<BTreeMap<u32, MdtEntry>>,
    /// The inodes each other MDT said it held at its last registration (in memory).
    mdt_inodes: Mutex<BTreeMap<u32, u64>>,
}

/// Another MDT as MDT0 knows it: where it serves, its other addresses, when last heard of.
type MdtEntry = (Nid, Vec<Nid>, Option<Instant>);

/// The body of a file written by [`Registry::write_file`] under `magic`, checked, or why it
/// is damaged (`what` names the kind of file).
fn framed<'a>(raw: &'a [u8], magic: &[u8; 8], what: &str) -> Result<&'a [u8], String> {
    if raw.len() < 20 || raw[..8] != *magic {
        return Err(format!("not {what}"));
    }
    let word = |at: usize| u32::from_le_bytes([raw[at], raw[at + 1], raw[at + 2], raw[at + 3]]);
    if word(8) != VERSION {
        return Err("unknown version".into());
    }
    let body = (word(12) as usize)
        .checked_add(20)
        .and_then(|end| raw.get(20..end))
        .ok_or("truncated")?;
    if crc32c::crc32c(body) != word(16) {
        return Err("checksum mismatch".into());
    }
    Ok(body)
}

/// The MDTs an mdts file lists, (index, server), or why the file is damaged.
fn decode_mdts(raw: &[u8]) -> Result<Vec<(u32, Nid)>, String> {
    let body = framed(raw, &MDTS_MAGIC, "an mdts file")?;
    proto::msg::decode_body(body).map_err(|e| e.to_string())
}

/// The targets a registry file lists, (index, uuid, server), or why the file is damaged. An
/// index or a uuid listed twice is damage too.
pub fn decode_file(raw: &[u8]) -> Result<Vec<(u32, u128, Nid)>, String> {
    let body = framed(raw, &MAGIC, "a registry file")?;
    let list: Vec<(u32, u128, Nid)> = proto::msg::decode_body(body).map_err(|e| e.to_string())?;
    let mut indices = std::collections::HashSet::new();
    let mut uuids = std::collections::HashSet::new();
    for (index, uuid, _) in &list {
        if !indices.insert(*index) {
            return Err(format!("target index {index} is listed twice"));
        }
        if !uuids.insert(*uuid) {
            return Err(format!("target {uuid:032x} is listed twice"));
        }
    }
    Ok(list)
}

impl Registry {
    /// Opens the registry of filesystem `fs` kept in `dir`, empty if there is none yet.
    pub fn open(dir: &Path, fs: Identity) -> Result<Registry, RegistryError> {
        let path = dir.join("targets");
        let io = |source| RegistryError::Io {
            path: path.clone(),
            source,
        };
        let damaged = |reason: &str| RegistryError::Damaged {
            path: path.clone(),
            reason: reason.to_owned(),
        };
        let mut entries = BTreeMap::new();
        match fs::read(&path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
            Ok(raw) => {
                for (index, uuid, oss) in decode_file(&raw).map_err(|r| damaged(&r))? {
                    entries.insert(
                        index,
                        Entry {
                            uuid,
                            oss,
                            rails: vec![],
                            total: 0,
                            free: 0,
                            last_seen: None,
                        },
                    );
                }
            }
        }
        let mdts_path = dir.join("mdts");
        let mut mdts = BTreeMap::new();
        match fs::read(&mdts_path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(RegistryError::Io {
                    path: mdts_path,
                    source,
                })
            }
            Ok(raw) => {
                let list = decode_mdts(&raw).map_err(|reason| RegistryError::Damaged {
                    path: mdts_path.clone(),
                    reason,
                })?;
                for (mdt, nid) in list {
                    mdts.insert(mdt, (nid, vec![], None));
                }
            }
        }
        Ok(Registry {
            path,
            fs,
            entries: Mutex::new(entries),
            heartbeat_timeout: HEARTBEAT_TIMEOUT,
            snapshot: Mutex::new(None),
            mdts: Mutex::new(mdts),
            mdt_inodes: Default::default(),
        })
    }

    /// The filesystem whose targets these are.
    pub fn filesystem(&self) -> &Identity {
        &self.fs
    }

    /// Adds target `index` (`uuid`, on the server at `oss`) as an operator's word: a target
    /// whose index this MDS does not know (its registry lost or restored from an older copy)
    /// is refused at registration until it is added. Refused if the index is another's.
    pub fn admit(&self, index: u32, uuid: u128, oss: &Nid) -> Result<(), RegistryError> {
        let mut entries = self.entries.lock();
        match entries.get(&index) {
            Some(e) if e.uuid != uuid => return Err(RegistryError::IndexTaken { index }),
            Some(_) => return Ok(()),
            None if entries.len() >= MAX_TARGETS => return Err(RegistryError::Full),
            None => {}
        }
        let mut next = entries.clone();
        next.insert(
            index,
            Entry {
                uuid,
                oss: oss.clone(),
                rails: vec![],
                total: 0,
                free: 0,
                last_seen: None,
            },
        );
        self.persist(&next)?;
        *entries = next;
        drop(entries);
        *self.snapshot.lock() = None;
        Ok(())
    }

    /// Reports a target down once it has not been heard from for `timeout`.
    pub fn with_heartbeat_timeout(mut self, timeout: Duration) -> Registry {
        self.heartbeat_timeout = timeout;
        *self.snapshot.get_mut() = None;
        self
    }

    fn persist(&self, entries: &BTreeMap<u32, Entry>) -> Result<(), RegistryError> {
        let list: Vec<(u32, u128, Nid)> = entries
            .iter()
            .map(|(i, e)| (*i, e.uuid, e.oss.clone()))
            .collect();
        Self::write_file(&self.path, &MAGIC, &list)
    }

    /// Writes `list` whole into `path` under `magic`: a temporary file, synced, renamed over
    /// the old one, the directory synced.
    fn write_file<T: serde::Serialize>(
        path: &Path,
        magic: &[u8; 8],
        list: &T,
    ) -> Result<(), RegistryError> {
        let io = |source| RegistryError::Io {
            path: path.to_path_buf(),
            source,
        };
        let body = postcard::to_allocvec(list).map_err(|e| RegistryError::Damaged {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let tmp = path.with_extension("tmp");
        let mut f = File::create(&tmp).map_err(io)?;
        f.write_all(magic).map_err(io)?;
        f.write_all(&VERSION.to_le_bytes()).map_err(io)?;
        f.write_all(&(body.len() as u32).to_le_bytes())
            .map_err(io)?;
        f.write_all(&crc32c::crc32c(&body).to_le_bytes())
            .map_err(io)?;
        f.write_all(&body).map_err(io)?;
        f.sync_all().map_err(io)?;
        fs::rename(&tmp, path).map_err(io)?;
        if let Some(dir) = path.parent() {
            File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
        }
        Ok(())
    }

    /// Records that MDT `mdt`'s MDS serves at `nid` (with `rails`), for MDT0's list: durable
    /// before it returns when the MDT or its address is new. Refused on any other MDT, for
    /// another filesystem's MDT, for MDT0 or an index past the most, and for an MDT another
    /// server was heard serving lately.
    pub fn register_mdt(
        &self,
        mdt: u32,
        fs: u128,
        nid: &Nid,
        rails: &[Nid],
    ) -> Result<(), RegistryError> {
        if self.fs.mdt != 0 {
            return Err(RegistryError::NotMdt0(self.fs.mdt));
        }
        if mdt == 0 || mdt >= proto::fid::MAX_MDTS {
            return Err(RegistryError::BadMdt(mdt));
        }
        if fs != self.fs.uuid {
            return Err(RegistryError::MdtOfAnother {
                mdt,
                theirs: fs,
                ours: Box::new(self.fs.clone()),
            });
        }
        let mut mdts = self.mdts.lock();
        let now = Instant::now();
        match mdts.get(&mdt) {
            Some((serving, _, Some(seen)))
                if serving != nid
                    && now.saturating_duration_since(*seen) < self.heartbeat_timeout =>
            {
                return Err(RegistryError::MdtTaken {
                    mdt,
                    serving: serving.clone(),
                    asking: nid.clone(),
                });
            }
            Some((serving, _, _)) if serving == nid => {}
            _ => {
                let mut list: Vec<(u32, Nid)> =
                    mdts.iter().map(|(k, (n, _, _))| (*k, n.clone())).collect();
                list.retain(|(k, _)| *k != mdt);
                list.push((mdt, nid.clone()));
                list.sort_by_key(|(k, _)| *k);
                Self::write_file(&self.path.with_file_name("mdts"), &MDTS_MAGIC, &list)?;
                tracing::info!(mdt, %nid, "an MDT registered");
            }
        }
        mdts.insert(mdt, (nid.clone(), bounded(rails), Some(now)));
        Ok(())
    }

    /// Records the inodes MDT `mdt` said it holds, as it registered.
    pub fn mdt_holds(&self, mdt: u32, inodes: u64) {
        self.mdt_inodes.lock().insert(mdt, inodes);
    }

    /// The other MDTs heard from lately, with the inodes each last said it held.
    pub fn mdts_in_service(&self) -> Vec<(u32, u64)> {
        let inodes = self.mdt_inodes.lock().clone();
        self.mdts()
            .into_iter()
            .filter(|m| m.up)
            .map(|m| (m.index, inodes.get(&m.index).copied().unwrap_or(0)))
            .collect()
    }

    /// The other MDTs, as MDT0 knows them (none on another MDT).
    pub fn mdts(&self) -> Vec<proto::registry::MdtInfo> {
        self.mdts
            .lock()
            .iter()
            .map(|(k, (nid, rails, seen))| proto::registry::MdtInfo {
                index: *k,
                nid: nid.clone(),
                rails: rails.clone(),
                up: seen.is_some_and(|t| t.elapsed() < self.heartbeat_timeout),
            })
            .collect()
    }

    /// Registers a server's targets and returns their indices in order. A target without an
    /// index gets the lowest free one; a target with an index keeps it, unless another target
    /// (another uuid) holds it.
    pub fn register(
        &self,
        oss: &Nid,
        rails: &[Nid],
        targets: &[TargetReport],
    ) -> Result<Vec<u32>, RegistryError> {
        let rails = bounded(rails);
        let mut entries = self.entries.lock();
        let mut next = entries.clone();
        let mut out = Vec::with_capacity(targets.len());
        let now = Instant::now();
        for t in targets {
            if let Some(theirs) = t.fs.filter(|f| *f != self.fs.uuid) {
                return Err(RegistryError::OtherFilesystem {
                    uuid: t.uuid,
                    theirs,
                    ours: Box::new(self.fs.clone()),
                });
            }
            let index = match t.index {
                Some(i) => match next.get(&i) {
                    Some(e) if e.uuid != t.uuid => {
                        return Err(RegistryError::IndexTaken { index: i })
                    }
                    Some(_) => i,
                    // On another MDT than 0: MDT0 gave the index and bound the target to
                    // this filesystem, and this MDT's objects are in a sequence of its own,
                    // which no other MDT's cleanup touches (and a namespace that lost its
                    // own is kept from destroying them by the server's bound on orphans).
                    None if self.fs.mdt != 0 && t.fs == Some(self.fs.uuid) => i,
                    // An index given by some MDS, not this one: the target holds objects
                    // this namespace knows nothing of, which its orphan cleanup would take
                    // for its own and destroy.
                    None => {
                        return Err(RegistryError::UnknownIndex {
                            index: i,
                            uuid: t.uuid,
                        })
                    }
                },
                None if self.fs.mdt != 0 => {
                    return Err(RegistryError::NotFromMdt0 { uuid: t.uuid })
                }
                None => match next.iter().find(|(_, e)| e.uuid == t.uuid) {
                    Some((i, _)) => *i,
                    None => (0..MAX_TARGETS as u32)
                        .find(|i| !next.contains_key(i))
                        .ok_or(RegistryError::Full)?,
                },
            };
            next.insert(
                index,
                Entry {
                    uuid: t.uuid,
                    oss: oss.clone(),
                    rails: rails.clone(),
                    total: t.total,
                    free: t.free,
                    last_seen: Some(now),
                },
            );
            out.push(index);
        }
        // A server registers every target it has when it starts: any other target listed at
        // its address is gone from it (its disk wiped or replaced) and is down from now on.
        for (i, e) in next.iter_mut() {
            if &e.oss == oss && !out.contains(i) && e.last_seen.is_some() {
                tracing::warn!(target = i, %oss, "a server registered without this target: it is down");
                e.last_seen = None;
            }
        }
        let durable_changed = next.len() != entries.len()
            || next.iter().any(|(i, e)| {
                entries
                    .get(i)
                    .is_none_or(|old| old.uuid != e.uuid || old.oss != e.oss)
            });
        if durable_changed {
            self.persist(&next)?;
        }
        *entries = next;
        drop(entries);
        *self.snapshot.lock() = None;
        Ok(out)
    }

    /// Records a heartbeat: the server is up and its targets have this much space.
    pub fn heartbeat(&self, oss: &Nid, rails: &[Nid], targets: &[TargetReport]) {
        let rails = bounded(rails);
        let mut entries = self.entries.lock();
        let now = Instant::now();
        for t in targets {
            if let Some(e) = t.index.and_then(|i| entries.get_mut(&i)) {
                if e.uuid == t.uuid && &e.oss == oss {
                    e.total = t.total;
                    e.free = t.free;
                    e.last_seen = Some(now);
                    if e.rails != rails {
                        e.rails = rails.clone();
                    }
                }
            }
        }
        drop(entries);
        *self.snapshot.lock() = None;
    }

    /// The same as [`Registry::list`], shared: made again once it is [`SNAPSHOT_AGE`] old or
    /// the registry changed.
    pub fn targets(&self) -> Arc<[TargetInfo]> {
        let mut snap = self.snapshot.lock();
        let now = Instant::now();
        if let Some((at, list)) = &*snap {
            if now.saturating_duration_since(*at) < SNAPSHOT_AGE {
                return list.clone();
            }
        }
        // Made under the snapshot's lock: a change drops it only after releasing the
        // entries, so the list kept is never older than a change that dropped it.
        let list: Arc<[TargetInfo]> = self.list().into();
        *snap = Some((now, list.clone()));
        list
    }

    pub fn list(&self) -> Vec<TargetInfo> {
        self.entries
            .lock()
            .iter()
            .map(|(&index, e)| TargetInfo {
                index,
                uuid: e.uuid,
                oss: e.oss.clone(),
                rails: e.rails.clone(),
                total: e.total,
                free: e.free,
                up: e
                    .last_seen
                    .is_some_and(|t| t.elapsed() < self.heartbeat_timeout),
                // The allocator's to say (`Allocator::mark_takes_stripes`).
                takes_stripes: false,
            })
            .collect()
    }
}

/// A server's other addresses as kept: at most [`lnet::tcp::rails::MAX_RAILS`].
fn bounded(rails: &[Nid]) -> Vec<Nid> {
    rails
        .iter()
        .take(lnet::tcp::rails::MAX_RAILS)
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(index: Option<u32>, uuid: u128) -> TargetReport {
        TargetReport {
            index,
            uuid,
            fs: None,
            total: 100,
            free: 50,
        }
    }

    fn ours() -> Identity {
        Identity {
            uuid: 0xf5,
            name: "test".into(),
            mdt: 0,
        }
    }

    #[test]
    fn mdt0_lists_the_other_mdts_durably_and_refuses_strangers_and_impostors() {
        let dir = std::env::temp_dir().join(format!("lode-registry-mdts-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let a: Nid = "127.0.0.1:9401@tcp".parse().unwrap();
        let b: Nid = "127.0.0.1:9402@tcp".parse().unwrap();
        let r = Registry::open(&dir, ours()).unwrap();
        r.register_mdt(1, 0xf5, &a, &[]).unwrap();
        r.register_mdt(2, 0xf5, &b, &[]).unwrap();
        assert!(matches!(
            r.register_mdt(0, 0xf5, &a, &[]),
            Err(RegistryError::BadMdt(0))
        ));
        assert!(matches!(
            r.register_mdt(proto::fid::MAX_MDTS, 0xf5, &a, &[]),
            Err(RegistryError::BadMdt(_))
        ));
        assert!(matches!(
            r.register_mdt(3, 0xbad, &a, &[]),
            Err(RegistryError::MdtOfAnother { theirs: 0xbad, .. })
        ));
        // A second server claiming MDT1 while its own is heard from.
        assert!(matches!(
            r.register_mdt(1, 0xf5, &b, &[]),
            Err(RegistryError::MdtTaken { mdt: 1, .. })
        ));
        let listed = r.mdts();
        assert_eq!(
            listed
                .iter()
                .map(|m| (m.index, m.nid.clone(), m.up))
                .collect::<Vec<_>>(),
            vec![(1, a.clone(), true), (2, b.clone(), true)]
        );
        // Kept across a restart, down until heard from again.
        drop(r);
        let again = Registry::open(&dir, ours()).unwrap();
        let listed = again.mdts();
        assert_eq!(listed.len(), 2);
        assert!(listed.iter().all(|m| !m.up));
        // Not heard from lately: another server may take MDT1 over (it moved).
        again.register_mdt(1, 0xf5, &b, &[]).unwrap();
        assert_eq!(again.mdts()[0].nid, b);
        // Another MDT keeps no list.
        let other = Registry::open(&dir, Identity { mdt: 1, ..ours() }).unwrap();
        assert!(matches!(
            other.register_mdt(2, 0xf5, &a, &[]),
            Err(RegistryError::NotMdt0(1))
        ));
        // It admits a target MDT0 indexed and bound to the filesystem, under that index, and
        // refuses one MDT0 has not indexed.
        let oss: Nid = "127.0.0.1:9500@tcp".parse().unwrap();
        assert!(matches!(
            other.register(&oss, &[], &[report(None, 7)]),
            Err(RegistryError::NotFromMdt0 { uuid: 7 })
        ));
        let bound = TargetReport {
            fs: Some(0xf5),
            ..report(Some(4), 7)
        };
        assert_eq!(other.register(&oss, &[], &[bound]).unwrap(), vec![4]);
        let unbound = report(Some(5), 8);
        assert!(matches!(
            other.register(&oss, &[], &[unbound]),
            Err(RegistryError::UnknownIndex { index: 5, .. })
        ));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_target_of_another_filesystem_or_of_an_unknown_index_is_refused_until_admitted() {
        let dir = std::env::temp_dir().join(format!("lode-registry-fs-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let oss: Nid = "127.0.0.1:9500@tcp".parse().unwrap();
        let r = Registry::open(&dir, ours()).unwrap();
        let mut foreign = report(None, 1);
        foreign.fs = Some(0xbad);
        assert!(matches!(
            r.register(&oss, &[], &[foreign]),
            Err(RegistryError::OtherFilesystem { theirs: 0xbad, .. })
        ));
        // A target that says it has an index this MDS never gave: an MDS started on an empty
        // directory must not take it (and its objects) for its own.
        let mut known_elsewhere = report(Some(3), 2);
        known_elsewhere.fs = Some(ours().uuid);
        assert!(matches!(
            r.register(&oss, &[], &[known_elsewhere.clone()]),
            Err(RegistryError::UnknownIndex { index: 3, uuid: 2 })
        ));
        assert!(
            r.list().is_empty(),
            "a refused registration records nothing"
        );
        r.admit(3, 2, &oss).unwrap();
        assert!(matches!(
            r.admit(3, 9, &oss),
            Err(RegistryError::IndexTaken { index: 3 })
        ));
        assert_eq!(r.register(&oss, &[], &[known_elsewhere]).unwrap(), vec![3]);
        // The admission is durable.
        drop(r);
        let r = Registry::open(&dir, ours()).unwrap();
        assert_eq!(r.list()[0].uuid, 2);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn indices_are_assigned_once_and_survive_a_restart() {
        let dir = std::env::temp_dir().join(format!("lode-registry-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let oss: Nid = "127.0.0.1:9500@tcp".parse().unwrap();
        let r = Registry::open(&dir, ours()).unwrap();
        assert_eq!(
            r.register(&oss, &[], &[report(None, 1), report(None, 2)])
                .unwrap(),
            vec![0, 1]
        );
        // Asking again for the same target gives the same index.
        assert_eq!(r.register(&oss, &[], &[report(None, 2)]).unwrap(), vec![1]);
        assert!(matches!(
            r.register(&oss, &[], &[report(Some(0), 9)]),
            Err(RegistryError::IndexTaken { index: 0 })
        ));
        drop(r);
        let r = Registry::open(&dir, ours()).unwrap();
        let list = r.list();
        assert_eq!(
            list.iter().map(|t| (t.index, t.uuid)).collect::<Vec<_>>(),
            vec![(0, 1), (1, 2)]
        );
        assert!(
            list.iter().all(|t| !t.up),
            "liveness comes back with heartbeats, not from disk"
        );
        r.heartbeat(&oss, &[], &[report(Some(1), 2)]);
        assert!(r.list()[1].up);
        // The server comes back with a new target only (its disk wiped): the old ones at its
        // address are down at once, not after the heartbeat timeout.
        assert_eq!(r.register(&oss, &[], &[report(None, 3)]).unwrap(), vec![2]);
        let up: Vec<u32> = r.list().iter().filter(|t| t.up).map(|t| t.index).collect();
        assert_eq!(up, vec![2]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_shared_list_is_kept_until_a_change_and_no_longer() {
        let dir = std::env::temp_dir().join(format!("lode-registry-snap-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let oss: Nid = "127.0.0.1:9500@tcp".parse().unwrap();
        let r = Registry::open(&dir, ours()).unwrap();
        assert!(r.targets().is_empty());
        // A registration shows at once, not after the snapshot's age.
        r.register(&oss, &[], &[report(None, 1)]).unwrap();
        let first = r.targets();
        assert_eq!(first.len(), 1);
        assert!(first[0].up);
        assert_eq!(first[0].free, 50);
        // Nothing changed: the same list, not a copy.
        assert!(Arc::ptr_eq(&first, &r.targets()));
        // A heartbeat's space shows at once too.
        let mut beat = report(Some(0), 1);
        beat.free = 7;
        r.heartbeat(&oss, &[], &[beat]);
        let after = r.targets();
        assert!(!Arc::ptr_eq(&first, &after));
        assert_eq!(after[0].free, 7);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_damaged_registry_file_is_refused_not_ignored() {
        let dir = std::env::temp_dir().join(format!("lode-registry-bad-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let oss: Nid = "127.0.0.1:9500@tcp".parse().unwrap();
        Registry::open(&dir, ours())
            .unwrap()
            .register(&oss, &[], &[report(None, 1)])
            .unwrap();
        let path = dir.join("targets");
        let mut raw = fs::read(&path).unwrap();
        let last = raw.len() - 1;
        raw[last] ^= 1;
        fs::write(&path, raw).unwrap();
        assert!(matches!(
            Registry::open(&dir, ours()),
            Err(RegistryError::Damaged { .. })
        ));
        fs::remove_dir_all(&dir).unwrap();
    }
}
