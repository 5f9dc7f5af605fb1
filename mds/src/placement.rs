//! Where a new component's stripes go: a plain function over the targets that may take new
//! stripes now and a round-robin cursor, no I/O. The MDS's allocator calls it for every file it
//! creates; the testbed's model calls it to lay out the files of an experiment, so both place
//! stripes the same way.
//!
//! The policy, after Lustre's: a component asking for given targets gets exactly those; one
//! asking for a first target starts there; otherwise successive files tile the targets (a file
//! of n stripes moves the start on by n; files over every target still start one further on
//! each time). When free space is out of balance (the emptiest target has less than 80% of the
//! fullest's free bytes), the fullest targets are taken first instead.

use std::collections::HashSet;
use std::hash::Hash;

use proto::layout::{Component, StripeCount};

/// A target that may take new stripes: up, in service and not full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub index: u32,
    pub free: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error("no storage target is up with free space")]
    NoTargets,
    #[error("target {0} is down, full or unknown")]
    Unavailable(u32),
    #[error("a mirror needs storage servers that hold no other copy of the file")]
    NoSpareServer,
}

/// A target that may take new stripes, and the server `S` it is on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Site<S> {
    pub index: u32,
    pub server: S,
    pub free: u64,
}

/// The targets of one copy's component `c` (mirror spread): only on servers outside `avoid`
/// (those holding the file's other copies), so that no server holds two copies of a byte. A
/// copy over every target (`-c -1`) takes its share of the servers left, whole servers each:
/// `copies_left` copies, this one included, still need theirs. With one copy this is
/// [`place`] over every site.
pub fn place_copy<S: Clone + Eq + Hash>(
    sites: &[Site<S>],
    c: &Component,
    avoid: &HashSet<S>,
    exclude: &HashSet<u32>,
    copies_left: u16,
    cursor: &mut usize,
) -> Result<Vec<u32>, PlacementError> {
    let eligible: Vec<&Site<S>> = sites
        .iter()
        .filter(|t| !avoid.contains(&t.server) && !exclude.contains(&t.index))
        .collect();
    if eligible.is_empty() && !avoid.is_empty() {
        return Err(PlacementError::NoSpareServer);
    }
    let servers: HashSet<&S> = eligible.iter().map(|t| &t.server).collect();
    let mut c = c.clone();
    if copies_left > 1 && c.stripe_count == StripeCount::All && c.targets.is_empty() {
        let share = (servers.len() / usize::from(copies_left)).max(1);
        // Whole servers: every target of the servers this copy's share covers.
        let per_server = eligible.len().div_ceil(servers.len().max(1));
        c.stripe_count = StripeCount::Count((share * per_server) as u32);
    }
    let candidates: Vec<Candidate> = eligible
        .iter()
        .map(|t| Candidate {
            index: t.index,
            free: t.free,
        })
        .collect();
    let mut chosen = place(&candidates, &c, cursor)?;
    if copies_left > 1 {
        // Leave whole servers to the copies still to come: a server is taken with the first of
        // its targets this copy uses.
        let server_of = |t: u32| eligible.iter().find(|e| e.index == t).map(|e| &e.server);
        let mut taken: Vec<&S> = vec![];
        for t in &chosen {
            if let Some(s) = server_of(*t) {
                if !taken.contains(&s) {
                    taken.push(s);
                }
            }
        }
        let share = taken.len().max(1).min(
            servers
                .len()
                .saturating_sub(usize::from(copies_left - 1))
                .max(1),
        );
        taken.truncate(share);
        chosen.retain(|t| server_of(*t).is_some_and(|s| taken.contains(&s)));
    }
    Ok(chosen)
}

/// Below this ratio of least to most free space, placement favours the emptiest targets.
const BALANCED: f64 = 0.8;

/// The targets of component `c`'s stripes, in stripe order. `cursor` is the round-robin
/// position shared by successive placements; it moves on unless `c` names its first target.
pub fn place(
    candidates: &[Candidate],
    c: &Component,
    cursor: &mut usize,
) -> Result<Vec<u32>, PlacementError> {
    if candidates.is_empty() {
        return Err(PlacementError::NoTargets);
    }
    if !c.targets.is_empty() {
        if let Some(t) = c
            .targets
            .iter()
            .find(|t| !candidates.iter().any(|e| e.index == **t))
        {
            return Err(PlacementError::Unavailable(*t));
        }
        return Ok(c.targets.clone());
    }
    let mut targets = candidates.to_vec();
    targets.sort_by_key(|t| t.index);
    let n = match c.stripe_count {
        StripeCount::All => targets.len(),
        StripeCount::Count(n) => (n as usize).min(targets.len()),
        // The MDS keeps the component's bytes: no target.
        StripeCount::Mdt => return Ok(vec![]),
    };
    let start = match c.stripe_offset {
        Some(o) => targets
            .iter()
            .position(|t| t.index == o)
            .ok_or(PlacementError::Unavailable(o))?,
        None => {
            // The cursor names a target index, not a place in this list: placements over
            // different subsets of the targets (the copies of a mirrored file, each kept off
            // the others' servers) still tile the targets evenly.
            let span = targets.last().map_or(1, |t| t.index as usize + 1);
            let want = *cursor % span;
            let at = targets
                .iter()
                .position(|t| t.index as usize >= want)
                .unwrap_or(0);
            let last = if n >= targets.len() {
                at
            } else {
                (at + n.max(1) - 1) % targets.len()
            };
            *cursor = targets[last].index as usize + 1;
            at
        }
    };
    targets.rotate_left(start);
    let (min, max) = targets.iter().fold((u64::MAX, 0), |(lo, hi), t| {
        (lo.min(t.free), hi.max(t.free))
    });
    if c.stripe_offset.is_none() && (min as f64) < BALANCED * max as f64 {
        targets.sort_by_key(|t| std::cmp::Reverse(t.free));
    }
    Ok(targets.into_iter().take(n).map(|t| t.index).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn even(n: u32) -> Vec<Candidate> {
        (0..n).map(|index| Candidate { index, free: 100 }).collect()
    }

    fn count(n: u32) -> Component {
        Component::raid0(StripeCount::Count(n), 1 << 20)
    }

    #[test]
    fn successive_files_tile_the_targets() {
        let mut cursor = 0;
        let got: Vec<Vec<u32>> = (0..4)
            .map(|_| place(&even(8), &count(2), &mut cursor).unwrap())
            .collect();
        assert_eq!(got, vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7]]);
    }

    #[test]
    fn files_over_every_target_start_one_further_each_time() {
        let mut cursor = 0;
        let all = Component::raid0(StripeCount::All, 1 << 20);
        assert_eq!(place(&even(3), &all, &mut cursor).unwrap(), vec![0, 1, 2]);
        assert_eq!(place(&even(3), &all, &mut cursor).unwrap(), vec![1, 2, 0]);
    }

    #[test]
    fn a_named_first_target_is_honoured_and_leaves_the_cursor() {
        let mut cursor = 5;
        let mut c = count(2);
        c.stripe_offset = Some(7);
        assert_eq!(place(&even(8), &c, &mut cursor).unwrap(), vec![7, 0]);
        assert_eq!(cursor, 5);
        c.stripe_offset = Some(9);
        assert_eq!(
            place(&even(8), &c, &mut cursor),
            Err(PlacementError::Unavailable(9))
        );
    }

    #[test]
    fn unbalanced_free_space_fills_the_emptiest_targets_first() {
        let mut cands = even(4);
        cands[2].free = 1_000;
        cands[3].free = 500;
        let mut cursor = 0;
        assert_eq!(place(&cands, &count(2), &mut cursor).unwrap(), vec![2, 3]);
    }

    #[test]
    fn placements_over_subsets_still_tile_the_targets() {
        // Two copies of each file, the second kept off the targets of the first (as the
        // allocator keeps mirrors off each other's servers): every target gets its share.
        let mut cursor = 0;
        let mut load = [0u32; 8];
        for _ in 0..8 {
            let first = place(&even(8), &count(2), &mut cursor).unwrap();
            let rest: Vec<Candidate> = even(8)
                .into_iter()
                .filter(|c| !first.contains(&c.index))
                .collect();
            let second = place(&rest, &count(2), &mut cursor).unwrap();
            for t in first.iter().chain(&second) {
                load[*t as usize] += 1;
            }
        }
        assert_eq!(load, [4; 8]);
    }

    #[test]
    fn no_targets_is_an_error_not_an_empty_layout() {
        let mut cursor = 0;
        assert_eq!(
            place(&[], &count(1), &mut cursor),
            Err(PlacementError::NoTargets)
        );
    }
}
