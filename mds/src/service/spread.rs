//! Where a new directory goes, and how it is laid out, when its mkdir says nothing: as its
//! parent's default layout for subdirectories says ([`DirDefault`], set with `lode
//! setdirstripe -D`, Lustre's default LMV), and in the root of a filesystem of several MDTs
//! without one, on one of the MDTs in service, as under Lustre's default layout of the root
//! (`lfs setdirstripe -D -i -1`): MDT0 and every other MDT heard from lately, in turn while
//! they hold about as many inodes as each other, and in turn among the emptier ones once
//! they do not. The directories below a top-level one stay on its MDT, so one job's tree is
//! served by one MDS and separate jobs' trees by several. A mkdir that names its MDT (`lode
//! mkdir -i`) or its stripes, or that has a layout of its own, is left alone.
//!
//! A default that goes further down is passed on to each new subdirectory (and its shards)
//! just after it is made, one level less each time.

use proto::dirstripe::{DirDefault, DEFAULT_XATTR};

use super::*;

/// MDTs whose inode counts differ by at most this fraction of the largest (or by
/// [`SPREAD_SLACK`]) count as balanced, and are taken in turn (Lustre's `qos_threshold_rr`).
const SPREAD_THRESHOLD_PCT: u64 = 17;
/// Inode counts this close are balanced whatever their ratio (a new filesystem's).
const SPREAD_SLACK: u64 = 1024;

impl MdsService {
    /// Turns a plain mkdir into the one its parent's default layout asks for (striped, on an
    /// MDT, or on the MDT the spreading picks); returns the default the new directory is to
    /// get, if the parent's goes further down.
    pub(super) async fn place_new_dir(
        &self,
        m: &mut Mutation,
    ) -> Result<Option<DirDefault>, RemoteError> {
        let Mutation::Create {
            parent,
            name,
            kind: Kind::Dir,
            mode,
            layout: None,
            ..
        } = m
        else {
            return Ok(None);
        };
        let here = self.registry.filesystem().mdt;
        let (root, given, encrypted) = self.store.read(|ns| {
            let p = ns.inode(*parent).ok();
            let given = p.and_then(proto::dirstripe::default_of_inode);
            (ns.root(), given, p.is_some_and(proto::crypt::is_encrypted))
        });
        // An encrypted tree stays on its MDT (the policy is passed on where it is made).
        if encrypted {
            return Ok(None);
        }
        let default = match given {
            Some(d) => d,
            // The root's implicit default: top-level directories spread, nothing below.
            None if *parent == root && here == 0 && !self.registry.mdts_in_service().is_empty() => {
                DirDefault {
                    count: 1,
                    offset: None,
                    hash: proto::dirstripe::HashType::Fnv1a64.code(),
                    inherit: 0,
                }
            }
            None => return Ok(None),
        };
        let plain = default.count <= 1 && default.offset.is_none_or(|k| k == here);
        if plain && (*parent != root || here != 0) {
            // Here, as asked: the mkdir as it is.
            return Ok(default.passed_on());
        }
        let (parent, name, mode) = (*parent, std::mem::take(name), *mode);
        *m = if default.count > 1 {
            // Never more shards than MDTs (a default set before MDTs were taken out).
            let mdts = self.mdt_indices().await?.len() as u32;
            Mutation::MkdirStriped {
                parent,
                name,
                mode,
                count: default.count.min(mdts.max(1)),
                offset: default.offset,
                hash: default.hash,
            }
        } else {
            let mdt = match default.offset {
                Some(k) => k,
                None => self.spread_pick(),
            };
            // On this MDT after all, `mkdir_on` turns it back into a plain mkdir.
            Mutation::MkdirOn {
                parent,
                name,
                mode,
                mdt,
            }
        };
        Ok(default.passed_on())
    }

    /// The MDT for the next top-level directory spread over the MDTs in service.
    fn spread_pick(&self) -> u32 {
        let own = self.store.read(|ns| ns.len() as u64);
        let mut mdts = vec![(0, own)];
        mdts.extend(self.registry.mdts_in_service());
        let turn = self
            .spread_turn
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        pick(&mdts, turn)
    }

    /// Gives `made`, a directory made on another MDT for a name in `parent` and not named yet,
    /// what `parent`'s default layout for subdirectories passes on (before its name makes it
    /// seen, so that a mkdir carried on after a crash passes it too).
    pub(super) async fn pass_parents_default(&self, parent: proto::Fid, made: &Inode) {
        let pass = self
            .store
            .read(|ns| {
                ns.inode(parent)
                    .ok()
                    .and_then(proto::dirstripe::default_of_inode)
            })
            .and_then(|d| d.passed_on());
        if let Some(pass) = pass {
            self.pass_dir_default(made, pass).await;
        }
    }

    /// Gives `made`, a directory just made under a default that goes further down, the
    /// default `pass`: on the directory, and on each shard when it is striped (where its
    /// names, and so its subdirectories' mkdirs, are). Logged when an MDT does not take it:
    /// the directory is made either way, only its subdirectories are then plain.
    pub(super) async fn pass_dir_default(&self, made: &Inode, pass: DirDefault) {
        let mut fids = vec![made.fid];
        if let Some(stripe) = proto::dirstripe::of_inode(made) {
            fids.extend(stripe.shards);
        }
        self.set_default_on(&fids, Some(pass.encode())).await;
    }

    /// After a default set on (or removed from) a striped directory's master: the same on each
    /// shard.
    pub(super) async fn restripe_default(&self, m: &Mutation) {
        let (fid, value) = match m {
            Mutation::SetXattr { fid, name, value } if name == DEFAULT_XATTR => {
                (fid, Some(value.clone()))
            }
            Mutation::RemoveXattr { fid, name } if name == DEFAULT_XATTR => (fid, None),
            _ => return,
        };
        let Some((_, stripe)) = self.stripe_now(*fid) else {
            return;
        };
        self.set_default_on(&stripe.shards, value).await;
    }

    async fn set_default_on(&self, fids: &[proto::Fid], value: Option<Vec<u8>>) {
        for fid in fids {
            let mdt = proto::fid::mdt_of(*fid).unwrap_or(0);
            let name = DEFAULT_XATTR.to_string();
            let set = match &value {
                Some(v) => Mutation::SetXattr {
                    fid: *fid,
                    name,
                    value: v.clone(),
                },
                None => Mutation::RemoveXattr { fid: *fid, name },
            };
            if let Err(e) = self.on_shard_mdt(mdt, set).await {
                tracing::warn!(%fid, mdt, error = %e, "a directory's default layout for its subdirectories was not set");
            }
        }
    }
}

/// The MDT for the `turn`th new top-level directory among `mdts` (index, inodes held): every
/// one in turn while they are balanced, else the ones within the threshold of the emptiest.
fn pick(mdts: &[(u32, u64)], turn: u64) -> u32 {
    let most = mdts.iter().map(|m| m.1).max().unwrap_or(0);
    let least = mdts.iter().map(|m| m.1).min().unwrap_or(0);
    let near = |n: u64| n - least <= SPREAD_SLACK.max(most / 100 * SPREAD_THRESHOLD_PCT);
    let takers: Vec<u32> = mdts.iter().filter(|m| near(m.1)).map(|m| m.0).collect();
    takers
        .get((turn % takers.len().max(1) as u64) as usize)
        .copied()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::pick;

    #[test]
    fn balanced_mdts_are_taken_in_turn_and_a_fuller_one_is_passed_over() {
        let balanced = [(0, 5_000), (1, 4_200), (2, 5_100)];
        let picks: Vec<u32> = (0..6).map(|t| pick(&balanced, t)).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
        // MDT0 holds a million inodes more: new trees go to the other two until it does not.
        let skewed = [(0, 1_000_000), (1, 10_000), (2, 12_000)];
        let picks: Vec<u32> = (0..4).map(|t| pick(&skewed, t)).collect();
        assert_eq!(picks, [1, 2, 1, 2]);
        // A new filesystem: every MDT, whatever the ratio of small counts.
        let new = [(0, 40), (1, 1), (2, 1)];
        assert_eq!((0..3).map(|t| pick(&new, t)).collect::<Vec<_>>(), [0, 1, 2]);
        // MDT0 alone.
        assert_eq!(pick(&[(0, 7)], 5), 0);
    }
}
