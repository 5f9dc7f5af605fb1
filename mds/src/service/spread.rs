//! Where a new directory goes when its mkdir names no MDT. In a filesystem of several MDTs, a
//! directory made in the root goes to one of the MDTs in service (MDT0 and every other heard
//! from lately), as under Lustre's default layout of the root (`lfs setdirstripe -D -i -1`):
//! in turn while the MDTs hold about as many inodes as each other, and among the emptier
//! ones only once they do not. The directories below a top-level one stay on its MDT, so one
//! job's tree is served by one MDS and separate jobs' trees by several. A mkdir that names
//! its MDT (`lode mkdir -i`), a striped one, or one with a layout of its own is left alone.

use super::*;

/// MDTs whose inode counts differ by at most this fraction of the largest (or by
/// [`SPREAD_SLACK`]) count as balanced, and are taken in turn (Lustre's `qos_threshold_rr`).
const SPREAD_THRESHOLD_PCT: u64 = 17;
/// Inode counts this close are balanced whatever their ratio (a new filesystem's).
const SPREAD_SLACK: u64 = 1024;

impl MdsService {
    /// Turns a plain mkdir in the root into one on the MDT the spreading picks
    /// ([`Mutation::MkdirOn`]; left as it is when that is this MDT).
    pub(super) fn spread_top_dir(&self, m: &mut Mutation) {
        let Mutation::Create {
            parent,
            name,
            kind: Kind::Dir,
            mode,
            layout: None,
            ..
        } = m
        else {
            return;
        };
        let here = self.registry.filesystem().mdt;
        if here != 0 {
            return;
        }
        let (root, own) = self.store.read(|ns| (ns.root(), ns.len() as u64));
        if *parent != root {
            return;
        }
        let mut mdts = vec![(here, own)];
        mdts.extend(self.registry.mdts_in_service());
        if mdts.len() < 2 {
            return;
        }
        let turn = self
            .spread_turn
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mdt = pick(&mdts, turn);
        if mdt != here {
            *m = Mutation::MkdirOn {
                parent: *parent,
                name: std::mem::take(name),
                mode: *mode,
                mdt,
            };
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
    takers[(turn % takers.len() as u64) as usize]
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
    }
}
