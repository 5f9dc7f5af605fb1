//! File layouts and their offset math: RAID0 striping and progressive (composite) layouts,
//! after Lustre.
//!
//! A layout is a list of components, each covering an extent `[start, end)` of the file
//! (`end == EOF` for the last may be open). Within a component, data is striped RAID0 over
//! `stripe_count` objects in units of `stripe_size`. As in Lustre, the mapping uses the
//! **absolute file offset**, not the offset within the component:
//!
//! ```text
//! unit   = offset / stripe_size
//! stripe = unit % stripe_count                     (which object)
//! object_offset = (unit / stripe_count) * stripe_size + offset % stripe_size
//! ```
//!
//! so a component that starts past 0 leaves its objects sparse below the component's start.
//! Component boundaries are multiples of the component's stripe size, so every stripe unit
//! lies inside one component. This module is pure: no I/O, no allocation of objects.
//!
//! **Mirrors** (Lustre's File Level Redundancy): a layout may hold up to [`MAX_MIRRORS`]
//! complete copies of the file. Each component names its mirror; the components of one mirror
//! cover the file from 0 on their own, and the layout lists them mirror by mirror. A component
//! marked `stale` missed writes and is not read until it is resynced. The offset math works
//! on one mirror at a time ([`Layout::mirror`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::Fid;

/// Stripe sizes are multiples of this (and at least this).
pub const STRIPE_ALIGN: u64 = 64 << 10;
/// The stripe size when none is given: 4 MiB, as in current Lustre.
pub const DEFAULT_STRIPE_SIZE: u64 = 4 << 20;
/// Largest stripe size: 4 GiB.
pub const MAX_STRIPE_SIZE: u64 = 4 << 30;
/// Most stripes in one component (Lustre's limit).
pub const MAX_STRIPE_COUNT: u32 = 2000;
/// Most components in one layout.
pub const MAX_COMPONENTS: usize = 64;
/// The open end of the last component.
pub const EOF: u64 = u64::MAX;
/// Most mirrors of one file.
pub const MAX_MIRRORS: u16 = 4;
/// Largest Data-on-MDT component: the bytes of a file the MDS may keep (Lustre's default
/// `dom_stripesize` limit).
pub const MAX_MDT_SIZE: u64 = 1 << 20;

/// How many targets a component stripes over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StripeCount {
    /// Every available target (`-1` in Lustre's tools).
    All,
    Count(u32),
    /// Data-on-MDT: the metadata server keeps the component's bytes itself (no objects). Only
    /// a file's first component may be one, up to [`MAX_MDT_SIZE`], with its stripe size its
    /// end, in a file with one mirror.
    Mdt,
}

/// One stripe's object: where it lives and what it is called.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StripeObject {
    pub target: u32,
    pub fid: Fid,
}

/// One extent of a file and how it is striped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Component {
    pub start: u64,
    pub end: u64,
    pub stripe_size: u64,
    pub stripe_count: StripeCount,
    /// The first target to use, or `None` to let the MDS choose.
    pub stripe_offset: Option<u32>,
    /// An explicit list of targets, overriding count and offset when not empty.
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub targets: Vec<u32>,
    /// The objects, once allocated (the component is then "instantiated"); one per stripe.
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub objects: Vec<StripeObject>,
    /// Which copy of the file this component belongs to (0 for an unmirrored file).
    pub mirror: u16,
    /// The component missed writes (its server was away): it is not read until resynced.
    pub stale: bool,
}

/// A file's (or a directory's default) layout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    /// Bumped on every change, so a client can tell its cached copy is stale.
    pub generation: u32,
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub components: Vec<Component>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("stripe size {0} is not a positive multiple of 64 KiB up to 4 GiB")]
    StripeSize(u64),
    #[error("stripe count {0} is over the limit of {MAX_STRIPE_COUNT}")]
    StripeCount(u32),
    #[error("a layout needs 1 to {MAX_COMPONENTS} components")]
    ComponentCount,
    #[error("component {index} starts at {start}, expected {expected}: components must be contiguous from 0")]
    Gap {
        index: usize,
        start: u64,
        expected: u64,
    },
    #[error(
        "component {index} extent [{start}, {end}) is empty or not a multiple of its stripe size"
    )]
    Extent { index: usize, start: u64, end: u64 },
    #[error("component {index} names target {target} twice")]
    DuplicateTarget { index: usize, target: u32 },
    #[error("component {index} has {objects} objects for {stripes} stripes")]
    Objects {
        index: usize,
        objects: usize,
        stripes: usize,
    },
    #[error("offset {0} is past the last component of the layout")]
    NoComponent(u64),
    #[error("mirrors must be numbered 0 to {} in order, listed mirror by mirror", MAX_MIRRORS - 1)]
    Mirrors,
    #[error("no mirror of the file is in sync")]
    AllStale,
    #[error("a Data-on-MDT component must be the first, of a file with one mirror, end at a multiple of 64 KiB up to {} KiB and have its end as stripe size", MAX_MDT_SIZE >> 10)]
    Mdt,
    #[error("offset {0} is kept by the MDS (Data-on-MDT), not by objects")]
    OnMdt(u64),
}

impl Component {
    /// A plain RAID0 component over the whole file.
    pub fn raid0(stripe_count: StripeCount, stripe_size: u64) -> Component {
        Component {
            start: 0,
            end: EOF,
            stripe_size,
            stripe_count,
            stripe_offset: None,
            targets: vec![],
            objects: vec![],
            mirror: 0,
            stale: false,
        }
    }

    pub fn contains(&self, offset: u64) -> bool {
        self.start <= offset && offset < self.end
    }

    /// The component has its objects (a Data-on-MDT component needs none).
    pub fn is_instantiated(&self) -> bool {
        !self.objects.is_empty() || self.on_mdt()
    }

    /// The MDS keeps this component's bytes (Data-on-MDT).
    pub fn on_mdt(&self) -> bool {
        self.stripe_count == StripeCount::Mdt
    }

    /// Stripes of an instantiated component.
    pub fn stripes(&self) -> u64 {
        self.objects.len() as u64
    }

    /// The stripe and object offset of file `offset` (inside this component).
    pub fn map(&self, offset: u64) -> (u64, u64) {
        let count = self.stripes().max(1);
        let unit = offset / self.stripe_size;
        (
            unit % count,
            (unit / count) * self.stripe_size + offset % self.stripe_size,
        )
    }

    /// The file offset held at `object_offset` of `stripe`: the inverse of [`Component::map`].
    /// `None` if that object offset holds no byte of this component.
    pub fn unmap(&self, stripe: u64, object_offset: u64) -> Option<u64> {
        let count = self.stripes().max(1);
        if stripe >= count {
            return None;
        }
        let row = object_offset / self.stripe_size;
        let unit = row.checked_mul(count)?.checked_add(stripe)?;
        let offset = unit
            .checked_mul(self.stripe_size)?
            .checked_add(object_offset % self.stripe_size)?;
        self.contains(offset).then_some(offset)
    }

    /// How long object `stripe` is when the file is `file_size` bytes: its highest object
    /// offset holding a file byte of this component, plus one (0 if it holds none).
    pub fn object_size(&self, stripe: u64, file_size: u64) -> u64 {
        if file_size <= self.start {
            return 0;
        }
        let end = file_size.min(self.end);
        let (ss, n) = (self.stripe_size, self.stripes().max(1));
        let row = ss * n;
        let (full, rem) = (end / row, end % row);
        full * ss + rem.saturating_sub(stripe * ss).min(ss)
    }
}

/// One contiguous piece of a file range on one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub component: usize,
    pub stripe: u64,
    pub object_offset: u64,
    pub file_offset: u64,
    pub len: u64,
}

impl Layout {
    pub fn new(components: Vec<Component>) -> Result<Layout, LayoutError> {
        let l = Layout {
            generation: 1,
            components,
        };
        l.validate()?;
        Ok(l)
    }

    /// Checks every rule; a layout from the network or a user is checked before it is used.
    pub fn validate(&self) -> Result<(), LayoutError> {
        if self.components.is_empty() || self.components.len() > MAX_COMPONENTS {
            return Err(LayoutError::ComponentCount);
        }
        let mut expected = 0;
        let mut mirror = 0;
        for (index, c) in self.components.iter().enumerate() {
            if c.mirror != mirror {
                // The next mirror starts, from 0 again.
                if c.mirror != mirror + 1 || c.mirror >= MAX_MIRRORS {
                    return Err(LayoutError::Mirrors);
                }
                mirror = c.mirror;
                expected = 0;
            }
            if c.stripe_size == 0
                || c.stripe_size % STRIPE_ALIGN != 0
                || c.stripe_size > MAX_STRIPE_SIZE
            {
                return Err(LayoutError::StripeSize(c.stripe_size));
            }
            match c.stripe_count {
                StripeCount::Count(n) if n == 0 || n > MAX_STRIPE_COUNT => {
                    return Err(LayoutError::StripeCount(n))
                }
                StripeCount::Mdt
                    if index != 0
                        || c.end == EOF
                        || c.end > MAX_MDT_SIZE
                        || c.stripe_size != c.end
                        || !c.targets.is_empty()
                        || !c.objects.is_empty()
                        || c.stripe_offset.is_some()
                        || self.components.iter().any(|x| x.mirror != 0) =>
                {
                    return Err(LayoutError::Mdt)
                }
                _ => {}
            }
            if c.targets.len() > MAX_STRIPE_COUNT as usize {
                return Err(LayoutError::StripeCount(c.targets.len() as u32));
            }
            let mut seen = std::collections::HashSet::with_capacity(c.targets.len());
            if let Some(&target) = c.targets.iter().find(|t| !seen.insert(**t)) {
                return Err(LayoutError::DuplicateTarget { index, target });
            }
            if c.start != expected {
                return Err(LayoutError::Gap {
                    index,
                    start: c.start,
                    expected,
                });
            }
            let aligned = |x: u64| x == EOF || x % c.stripe_size == 0;
            // After the MDS's part (a multiple of 64 KiB), a component starts where it ends,
            // whatever its stripe size: its first stripe unit is cut short, as in Lustre.
            let after_mdt = index > 0 && self.components[index - 1].on_mdt();
            if c.end <= c.start || !(aligned(c.start) || after_mdt) || !aligned(c.end) {
                return Err(LayoutError::Extent {
                    index,
                    start: c.start,
                    end: c.end,
                });
            }
            if !c.objects.is_empty() {
                let want = match (c.targets.len(), c.stripe_count) {
                    (n, _) if n > 0 => Some(n),
                    (_, StripeCount::Count(n)) => Some(n as usize),
                    (_, StripeCount::All) => None,
                    (_, StripeCount::Mdt) => Some(0),
                };
                if want.is_some_and(|w| w != c.objects.len())
                    || c.objects.len() > MAX_STRIPE_COUNT as usize
                {
                    return Err(LayoutError::Objects {
                        index,
                        objects: c.objects.len(),
                        stripes: want.unwrap_or(0),
                    });
                }
            }
            let last_of_mirror = self
                .components
                .get(index + 1)
                .is_none_or(|n| n.mirror != c.mirror);
            if c.end == EOF && !last_of_mirror {
                return Err(LayoutError::Extent {
                    index,
                    start: c.start,
                    end: c.end,
                });
            }
            expected = c.end;
        }
        Ok(())
    }

    /// Where the bytes the MDS keeps end: the end of a Data-on-MDT first component.
    pub fn mdt_end(&self) -> Option<u64> {
        self.components
            .first()
            .filter(|c| c.on_mdt())
            .map(|c| c.end)
    }

    /// How many mirrors the file has (1 when it is not mirrored).
    pub fn mirror_count(&self) -> u16 {
        // Not the last component's: a layout being built (a mirror placed anew) may hold its
        // components out of mirror order.
        self.components
            .iter()
            .map(|c| c.mirror)
            .max()
            .map_or(1, |m| m.saturating_add(1))
    }

    /// Mirror `id` alone, as a layout of its own for the offset math.
    pub fn mirror(&self, id: u16) -> Layout {
        Layout {
            generation: self.generation,
            components: self
                .components
                .iter()
                .filter(|c| c.mirror == id)
                .cloned()
                .collect(),
        }
    }

    /// Whether mirror `id` may be read over `offset..offset+len` (no component of it there
    /// is stale).
    pub fn in_sync(&self, id: u16, offset: u64, len: u64) -> bool {
        let end = offset.saturating_add(len.max(1));
        self.components
            .iter()
            .filter(|c| c.mirror == id && c.start < end && offset < c.end)
            .all(|c| !c.stale)
    }

    /// Mirrors with a stale component.
    pub fn stale_mirrors(&self) -> Vec<u16> {
        let mut out: Vec<u16> = self
            .components
            .iter()
            .filter(|c| c.stale)
            .map(|c| c.mirror)
            .collect();
        out.dedup();
        out
    }

    /// `self` with `copies` mirrors: mirror 0's components copied for each new one (a
    /// template: objects left out). Mirrors already there beyond `copies` stay.
    pub fn with_mirrors(&self, copies: u16) -> Result<Layout, LayoutError> {
        if copies == 0 || copies > MAX_MIRRORS {
            return Err(LayoutError::Mirrors);
        }
        let first = self.mirror(0);
        let mut components = vec![];
        for m in 0..copies.max(self.mirror_count()) {
            let src = if m < self.mirror_count() {
                self.mirror(m)
            } else {
                first.clone()
            };
            components.extend(src.components.into_iter().map(|mut c| {
                if m >= self.mirror_count() {
                    c.objects.clear();
                    c.stale = false;
                }
                c.mirror = m;
                c
            }));
        }
        let l = Layout {
            generation: self.generation,
            components,
        };
        l.validate()?;
        Ok(l)
    }

    /// The component holding `offset`.
    pub fn component_at(&self, offset: u64) -> Result<usize, LayoutError> {
        self.components
            .iter()
            .position(|c| c.contains(offset))
            .ok_or(LayoutError::NoComponent(offset))
    }

    /// Splits `offset..offset+len` into pieces, each inside one stripe unit of one object, in
    /// file order.
    pub fn pieces(&self, offset: u64, len: u64) -> Result<Vec<Piece>, LayoutError> {
        let mut out = vec![];
        let end = offset.saturating_add(len);
        let mut at = offset;
        while at < end {
            let ci = self.component_at(at)?;
            let c = &self.components[ci];
            if c.on_mdt() {
                return Err(LayoutError::OnMdt(at));
            }
            let unit_end = (at / c.stripe_size + 1).saturating_mul(c.stripe_size);
            let piece_end = end.min(unit_end).min(c.end);
            let (stripe, object_offset) = c.map(at);
            out.push(Piece {
                component: ci,
                stripe,
                object_offset,
                file_offset: at,
                len: piece_end - at,
            });
            at = piece_end;
        }
        Ok(out)
    }

    /// Adds to `out` the bytes of `offset..offset+len` that land on each target: whole rounds
    /// of a component counted at once (one stripe on every object), the ragged ends piece by
    /// piece. Bytes outside every component are not counted.
    pub fn bytes_per_target(&self, offset: u64, len: u64, out: &mut BTreeMap<u32, u64>) {
        let end = offset.saturating_add(len);
        for c in &self.components {
            let (s, e) = (offset.max(c.start), end.min(c.end));
            if s >= e || c.objects.is_empty() {
                continue;
            }
            let round = c.stripes() * c.stripe_size;
            // Stripes follow absolute file offsets (as Lustre's do).
            let first_round = s.div_ceil(round) * round;
            let last_round = (e / round) * round;
            if first_round < last_round {
                self.piecewise_bytes(s, first_round, out);
                let rounds = (last_round - first_round) / round;
                for o in &c.objects {
                    *out.entry(o.target).or_default() += rounds * c.stripe_size;
                }
                self.piecewise_bytes(last_round, e, out);
            } else {
                self.piecewise_bytes(s, e, out);
            }
        }
    }

    fn piecewise_bytes(&self, a: u64, b: u64, out: &mut BTreeMap<u32, u64>) {
        let Ok(pieces) = self.pieces(a, b.saturating_sub(a)) else {
            return;
        };
        for p in pieces {
            if let Some(o) = self.components[p.component].objects.get(p.stripe as usize) {
                *out.entry(o.target).or_default() += p.len;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mirror_count_holds_while_a_mirror_placed_anew_sits_after_the_others() {
        // The template of mirror 0 placed again: the kept copy first, the new one last.
        let mirror = |m| Component {
            mirror: m,
            ..Component::raid0(StripeCount::Count(2), 1 << 20)
        };
        let l = Layout {
            generation: 1,
            components: vec![mirror(1), mirror(0)],
        };
        assert_eq!(l.mirror_count(), 2);
    }

    #[test]
    fn a_layout_naming_a_target_twice_is_refused_before_anything_is_allocated() {
        let mut c = Component::raid0(StripeCount::Count(2), 1 << 20);
        c.targets = vec![3, 3];
        let l = Layout {
            generation: 1,
            components: vec![c],
        };
        assert_eq!(
            l.validate(),
            Err(LayoutError::DuplicateTarget {
                index: 0,
                target: 3
            })
        );
    }

    #[test]
    fn a_data_on_mdt_component_is_first_bounded_and_maps_to_no_object() {
        let mdt = |end| Component {
            stripe_count: StripeCount::Mdt,
            stripe_size: end,
            end,
            ..Component::raid0(StripeCount::Mdt, end)
        };
        let mut rest = Component::raid0(StripeCount::Count(1), 64 << 10);
        rest.start = 64 << 10;
        let l = Layout::new(vec![mdt(64 << 10), rest.clone()]).unwrap();
        assert_eq!(l.mdt_end(), Some(64 << 10));
        assert!(l.components[0].is_instantiated());
        assert_eq!(l.pieces(100, 10), Err(LayoutError::OnMdt(100)));
        // Past the MDS's part, the offset math is the objects' as before.
        let mut l2 = l.clone();
        l2.components[1].objects = vec![StripeObject {
            target: 0,
            fid: Fid::new(crate::fid::OST_SEQ_BASE, 1, 0),
        }];
        assert_eq!(l2.pieces(64 << 10, 10).unwrap()[0].object_offset, 64 << 10);
        // Alone, to a bounded file.
        assert!(Layout::new(vec![mdt(1 << 20)]).is_ok());
        // Too large, not first, open-ended, mirrored, or a stripe size other than its end.
        assert_eq!(Layout::new(vec![mdt(2 << 20)]), Err(LayoutError::Mdt));
        let mut second = mdt(128 << 10);
        second.start = 64 << 10;
        assert_eq!(
            Layout::new(vec![rest_at(0, 64 << 10), second]),
            Err(LayoutError::Mdt)
        );
        let mut open_ended = mdt(64 << 10);
        open_ended.end = EOF;
        assert_eq!(Layout::new(vec![open_ended]), Err(LayoutError::Mdt));
        let mut odd = mdt(128 << 10);
        odd.stripe_size = 64 << 10;
        assert_eq!(Layout::new(vec![odd]), Err(LayoutError::Mdt));
        let mut copy = rest.clone();
        copy.start = 0;
        copy.mirror = 1;
        assert_eq!(
            Layout::new(vec![mdt(64 << 10), rest, copy]),
            Err(LayoutError::Mdt)
        );
    }

    fn rest_at(start: u64, end: u64) -> Component {
        let mut c = Component::raid0(StripeCount::Count(1), 64 << 10);
        c.start = start;
        c.end = end;
        c
    }
    use proptest::prelude::*;
    use std::collections::HashSet;

    /// A component with objects of its own: no two components (of different starts) share
    /// an object, as the MDS never gives one object to two.
    fn instantiated(start: u64, end: u64, stripe_size: u64, count: u32) -> Component {
        let oid = 1 + (start >> 16) as u32;
        Component {
            start,
            end,
            stripe_size,
            stripe_count: StripeCount::Count(count),
            stripe_offset: None,
            targets: vec![],
            mirror: 0,
            stale: false,
            objects: (0..count)
                .map(|i| StripeObject {
                    target: i,
                    fid: Fid::new(crate::fid::OST_SEQ_BASE + u64::from(i), oid, 0),
                })
                .collect(),
        }
    }

    /// Lustre's example: [0, 4M) on 1 target, [4M, 64M) on 4, [64M, EOF) on 8, 1 MiB stripes.
    fn progressive() -> Layout {
        Layout::new(vec![
            instantiated(0, 4 << 20, 1 << 20, 1),
            instantiated(4 << 20, 64 << 20, 1 << 20, 4),
            instantiated(64 << 20, EOF, 1 << 20, 8),
        ])
        .unwrap()
    }

    #[test]
    fn mirrors_are_whole_copies_numbered_in_order() {
        let l = Layout::new(vec![instantiated(0, EOF, 1 << 20, 2)]).unwrap();
        let m = l.with_mirrors(2).unwrap();
        assert_eq!(m.mirror_count(), 2);
        assert_eq!(m.components[1].mirror, 1);
        assert!(
            !m.components[1].is_instantiated(),
            "a new mirror has no objects yet"
        );
        assert_eq!(m.mirror(1).pieces(0, 10).unwrap()[0].component, 0);
        let mut s = m.clone();
        s.components[1].stale = true;
        assert_eq!(s.stale_mirrors(), vec![1]);
        assert!(s.in_sync(0, 0, 100) && !s.in_sync(1, 0, 100));
        let mut bad = m.clone();
        bad.components[1].mirror = 2;
        assert_eq!(bad.validate(), Err(LayoutError::Mirrors));
        assert_eq!(l.with_mirrors(MAX_MIRRORS + 1), Err(LayoutError::Mirrors));
        let mut swapped = m;
        swapped.components.swap(0, 1);
        assert!(swapped.validate().is_err(), "listed mirror by mirror");
    }

    #[test]
    fn the_worked_example_in_the_docs() {
        let l = progressive();
        // 5 MiB + 10 is in component 1: unit 5, stripe 5 % 4 = 1, row 1 -> object offset 1 MiB + 10.
        let ci = l.component_at((5 << 20) + 10).unwrap();
        assert_eq!(ci, 1);
        assert_eq!(l.components[1].map((5 << 20) + 10), (1, (1 << 20) + 10));
        // 100 MiB: unit 100, stripe 100 % 8 = 4, row 12 -> object offset 12 MiB.
        assert_eq!(l.components[2].map(100 << 20), (4, 12 << 20));
    }

    #[test]
    fn absurd_layouts_are_refused() {
        let ok = instantiated(0, EOF, 1 << 20, 2);
        let bad = |f: &dyn Fn(&mut Component)| {
            let mut c = ok.clone();
            f(&mut c);
            Layout::new(vec![c]).unwrap_err()
        };
        assert!(matches!(
            bad(&|c| c.stripe_size = 1000),
            LayoutError::StripeSize(_)
        ));
        assert!(matches!(
            bad(&|c| c.stripe_size = 0),
            LayoutError::StripeSize(_)
        ));
        assert!(matches!(
            bad(&|c| c.stripe_size = 8 << 30),
            LayoutError::StripeSize(_)
        ));
        assert!(matches!(
            bad(&|c| c.stripe_count = StripeCount::Count(2001)),
            LayoutError::StripeCount(_)
        ));
        assert!(matches!(
            bad(&|c| c.stripe_count = StripeCount::Count(0)),
            LayoutError::StripeCount(_)
        ));
        assert!(matches!(
            bad(&|c| c.objects.pop().map(|_| ()).unwrap_or(())),
            LayoutError::Objects { .. }
        ));
        assert!(matches!(
            bad(&|c| c.start = 1 << 20),
            LayoutError::Gap { .. }
        ));
        assert!(matches!(
            Layout::new(vec![]),
            Err(LayoutError::ComponentCount)
        ));
        // Overlapping, gapped, misaligned and unterminated-before-last components.
        let two = |a: Component, b: Component| Layout::new(vec![a, b]).unwrap_err();
        assert!(matches!(
            two(
                instantiated(0, 8 << 20, 1 << 20, 1),
                instantiated(4 << 20, EOF, 1 << 20, 1)
            ),
            LayoutError::Gap { .. }
        ));
        assert!(matches!(
            two(
                instantiated(0, 3 << 19, 1 << 20, 1),
                instantiated(3 << 19, EOF, 1 << 20, 1)
            ),
            LayoutError::Extent { .. }
        ));
        assert!(matches!(
            two(
                instantiated(0, EOF, 1 << 20, 1),
                instantiated(0, EOF, 1 << 20, 1)
            ),
            LayoutError::Extent { .. }
        ));
    }

    fn any_layout() -> impl Strategy<Value = Layout> {
        // 1 to 4 components; stripe sizes 64K..1M; boundaries at multiples of the larger size.
        let size_units = proptest::sample::select(vec![1u64, 2, 4, 8, 16]);
        proptest::collection::vec((size_units, 1u32..=9, 1u64..=8), 1..=4).prop_map(|specs| {
            let mut comps = vec![];
            let mut start = 0;
            let n = specs.len();
            for (i, (size_units, count, extent_units)) in specs.into_iter().enumerate() {
                let stripe_size = size_units * STRIPE_ALIGN;
                let end = if i + 1 == n {
                    EOF
                } else {
                    start + extent_units * (16 * STRIPE_ALIGN)
                };
                comps.push(instantiated(start, end, stripe_size, count));
                start = end;
            }
            Layout::new(comps).unwrap()
        })
    }

    proptest! {
        #[test]
        fn every_byte_maps_to_one_place_and_back(l in any_layout(), base in 0u64..(64 << 20), offs in proptest::collection::vec(0u64..(8 << 20), 1..200)) {
            let mut seen = std::collections::HashMap::new();
            for o in offs {
                let off = base + o;
                let ci = l.component_at(off).unwrap();
                let c = &l.components[ci];
                let (stripe, obj_off) = c.map(off);
                prop_assert!(stripe < c.stripes());
                prop_assert_eq!(c.unmap(stripe, obj_off), Some(off));
                // No two offsets share an (object, object offset).
                let obj = c.objects[stripe as usize];
                let first = *seen.entry((obj, obj_off)).or_insert(off);
                prop_assert_eq!(first, off);
            }
        }

        #[test]
        fn distinct_offsets_never_collide(l in any_layout(), start in 0u64..(32 << 20), len in 1u64..200_000) {
            let mut seen = HashSet::new();
            for off in (start..start + len).step_by(997) {
                let ci = l.component_at(off).unwrap();
                let c = &l.components[ci];
                let (stripe, obj_off) = c.map(off);
                prop_assert!(seen.insert((c.objects[stripe as usize], obj_off)), "two offsets share a place");
            }
        }

        #[test]
        fn object_offsets_map_back_into_their_component(l in any_layout(), ci in 0usize..4, stripe in 0u64..9, obj_off in 0u64..(64 << 20)) {
            let ci = ci % l.components.len();
            let c = &l.components[ci];
            if let Some(off) = c.unmap(stripe, obj_off) {
                prop_assert!(c.contains(off));
                prop_assert_eq!(c.map(off), (stripe, obj_off));
            }
        }

        #[test]
        fn pieces_cover_a_range_exactly_once(l in any_layout(), offset in 0u64..(64 << 20), len in 0u64..(16 << 20)) {
            let pieces = l.pieces(offset, len).unwrap();
            let mut at = offset;
            for p in &pieces {
                prop_assert_eq!(p.file_offset, at);
                prop_assert!(p.len > 0);
                let c = &l.components[p.component];
                // A piece stays inside one stripe unit: contiguous on its object.
                prop_assert_eq!(c.map(p.file_offset + p.len - 1), (p.stripe, p.object_offset + p.len - 1));
                at += p.len;
            }
            prop_assert_eq!(at, offset + len);
        }
    }

    #[test]
    fn layouts_round_trip_through_the_codec() {
        let l = progressive();
        let body = crate::msg::encode_body(&l).unwrap();
        assert_eq!(crate::msg::decode_body::<Layout>(&body).unwrap(), l);
    }

    #[test]
    fn object_sizes_after_truncation_follow_the_stripes() {
        let c = instantiated(0, EOF, 1 << 20, 4);
        // 5.5 MiB over 4 stripes of 1 MiB: stripe 0 holds 2 MiB, stripe 1 holds 1.5, the others 1.
        let s = (5 << 20) + (1 << 19);
        assert_eq!(c.object_size(0, s), 2 << 20);
        assert_eq!(c.object_size(1, s), (1 << 20) + (1 << 19));
        assert_eq!(c.object_size(2, s), 1 << 20);
        assert_eq!(c.object_size(3, s), 1 << 20);
        assert_eq!(c.object_size(0, 0), 0);
    }

    proptest! {
        #[test]
        fn bytes_per_target_counts_what_the_pieces_count(
            l in any_layout(),
            offset in 0u64..(256 << 20),
            len in 0u64..(64 << 20),
        ) {
            let mut fast = BTreeMap::new();
            l.bytes_per_target(offset, len, &mut fast);
            let mut slow = BTreeMap::new();
            for p in l.pieces(offset, len).unwrap() {
                let t = l.components[p.component].objects[p.stripe as usize].target;
                *slow.entry(t).or_insert(0u64) += p.len;
            }
            prop_assert_eq!(fast, slow);
        }
    }
}
