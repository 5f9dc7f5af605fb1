//! The data path's planner: which bytes of which objects a read takes, and from which copies,
//! decided on plain data (a layout and a range in, pieces and tries out). No I/O, no runtime:
//! the executor in [`crate::file`] carries a plan out, and these rules are tested on their own.
//!
//! A read is cut into stripe units of the first copy in sync. Each unit is read from one copy,
//! the units spread over the copies in sync (unit k starts at copy k mod n), with the other
//! copies in sync as its next tries, in order. Each try is the unit's range in that copy, as
//! pieces: runs of bytes inside one stripe unit of one object. A piece in a component that has
//! no objects (never instantiated) is a hole: it reads as zeros. The part the MDS keeps (Data
//! on MDT) is not planned here: it comes from the MDS.

use std::collections::HashSet;

use proto::layout::{Layout, LayoutError, StripeObject};

/// A run of bytes inside one stripe unit of one object of one copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Where the bytes go, from the start of the read.
    pub at: u64,
    pub file_offset: u64,
    pub len: u64,
    /// The object holding the bytes and where in it; `None`: a hole (the component has no
    /// objects), which reads as zeros.
    pub object: Option<(StripeObject, u64)>,
    /// The copy of the file the piece is in.
    pub mirror: u16,
}

/// One stripe unit of a read (or the part of one the read covers): the copies to try, in
/// order, each as the pieces of the unit's range in that copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unit {
    pub file_offset: u64,
    pub len: u64,
    pub tries: Vec<Vec<Piece>>,
}

/// A read, planned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadPlan {
    /// Bytes at the start of the read that the MDS keeps (Data-on-MDT).
    pub mdt: u64,
    pub units: Vec<Unit>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("the file has no mirror {0}")]
    NoMirror(u16),
}

impl ReadPlan {
    /// The targets any try of the plan reads from.
    pub fn targets(&self) -> HashSet<u32> {
        self.units
            .iter()
            .flat_map(|u| u.tries.iter().flatten())
            .filter_map(|p| p.object.map(|(o, _)| o.target))
            .collect()
    }
}

/// The pieces of `offset..offset+len` in copy `mirror` of `layout`, with `at` counted from
/// `origin`.
fn pieces(
    layout: &Layout,
    mirror: u16,
    origin: u64,
    offset: u64,
    len: u64,
) -> Result<Vec<Piece>, PlanError> {
    let copy = layout.mirror(mirror);
    Ok(copy
        .pieces(offset, len)?
        .into_iter()
        .map(|p| {
            let c = &copy.components[p.component];
            Piece {
                at: p.file_offset - origin,
                file_offset: p.file_offset,
                len: p.len,
                object: c
                    .objects
                    .get(p.stripe as usize)
                    .map(|o| (*o, p.object_offset)),
                mirror,
            }
        })
        .collect())
}

/// A read of `offset..offset+len` (already cut to the file's size): the part the MDS keeps,
/// then each stripe unit with the copies in sync to try. A file with no copy in sync plans no
/// unit past the MDS's part: [`in_sync`] says so first.
pub fn read(layout: &Layout, offset: u64, len: u64) -> Result<ReadPlan, PlanError> {
    let mdt = layout
        .mdt_end()
        .filter(|e| offset < *e)
        .map_or(0, |e| len.min(e - offset));
    let mut plan = ReadPlan { mdt, units: vec![] };
    let copies = in_sync(layout);
    let Some(&first) = copies.first() else {
        return Ok(plan);
    };
    let (rest, rest_len) = (offset + mdt, len - mdt);
    let base = layout.mirror(first);
    for unit in base.pieces(rest, rest_len)? {
        let spread = (unit.file_offset / base.components[unit.component].stripe_size) as usize;
        let tries = (0..copies.len())
            .map(|k| {
                let m = copies[(spread + k) % copies.len()];
                pieces(layout, m, offset, unit.file_offset, unit.len)
            })
            .collect::<Result<Vec<_>, _>>()?;
        plan.units.push(Unit {
            file_offset: unit.file_offset,
            len: unit.len,
            tries,
        });
    }
    Ok(plan)
}

/// The copies a read may use: those with no stale component.
pub fn in_sync(layout: &Layout) -> Vec<u16> {
    let stale = layout.stale_mirrors();
    (0..layout.mirror_count())
        .filter(|m| !stale.contains(m))
        .collect()
}

/// A write of `offset..offset+len`: the pieces of every copy in sync (or of copy `only`, for a
/// resync), copy by copy, each in file order. Every copy gets every byte; a piece without an
/// object (a component never instantiated) is for the caller to refuse.
pub fn write(
    layout: &Layout,
    offset: u64,
    len: u64,
    only: Option<u16>,
) -> Result<Vec<Piece>, PlanError> {
    let copies = match only {
        Some(m) if m >= layout.mirror_count() => return Err(PlanError::NoMirror(m)),
        Some(m) => vec![m],
        None => in_sync(layout),
    };
    let mut out = vec![];
    for m in copies {
        out.extend(pieces(layout, m, offset, offset, len)?);
    }
    Ok(out)
}

/// A read of `offset..offset+len` from copy `mirror` alone, in sync or not (to compare or
/// repair copies): each piece a unit of its own with that one try.
pub fn read_copy(
    layout: &Layout,
    mirror: u16,
    offset: u64,
    len: u64,
) -> Result<ReadPlan, PlanError> {
    if mirror >= layout.mirror_count() {
        return Err(PlanError::NoMirror(mirror));
    }
    Ok(ReadPlan {
        mdt: 0,
        units: pieces(layout, mirror, offset, offset, len)?
            .into_iter()
            .map(|p| Unit {
                file_offset: p.file_offset,
                len: p.len,
                tries: vec![vec![p]],
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use proto::fid::OST_SEQ_BASE;
    use proto::layout::{Component, StripeCount, EOF};
    use proto::Fid;

    const KIB64: u64 = 64 << 10;

    /// A layout of up to three components per copy, up to three copies, some components
    /// stale, some never instantiated, the first maybe on the MDS.
    fn layout() -> impl Strategy<Value = Layout> {
        (
            prop::collection::vec((1u64..6, 1u64..4, 1u64..5, any::<bool>()), 1..4),
            1u16..4,
            prop::collection::vec(any::<bool>(), 12),
            any::<bool>(),
        )
            .prop_map(|(comps, copies, stale, mdt)| {
                let mut out = vec![];
                let n = comps.len();
                for m in 0..copies {
                    let mut start = 0;
                    for (k, (ends, size, count, objects)) in comps.iter().enumerate() {
                        let on_mdt = mdt && k == 0 && m == 0;
                        let mut c = Component::raid0(
                            if on_mdt {
                                StripeCount::Mdt
                            } else {
                                StripeCount::Count(*count as u32)
                            },
                            size * KIB64,
                        );
                        c.mirror = m;
                        c.start = start;
                        c.end = if k + 1 == n {
                            EOF
                        } else {
                            start + ends * size * KIB64
                        };
                        start = c.end;
                        if !on_mdt && (*objects || k == 0) {
                            c.objects = (0..*count as u32)
                                .map(|s| proto::layout::StripeObject {
                                    target: s + 10 * u32::from(m),
                                    fid: Fid::new(OST_SEQ_BASE + u64::from(s), k as u32 + 1, 0),
                                })
                                .collect();
                        }
                        c.stale = stale[(usize::from(m) * 3 + k) % stale.len()] && m > 0;
                        out.push(c);
                    }
                }
                Layout {
                    generation: 1,
                    components: out,
                }
            })
    }

    proptest! {
        #[test]
        fn every_copy_covers_the_read_exactly_once(
            l in layout(),
            offset in 0u64..(4 << 20),
            len in 0u64..(3 << 20),
        ) {
            let plan = read(&l, offset, len).unwrap();
            prop_assert!(plan.mdt <= len);
            if let Some(e) = l.mdt_end() {
                prop_assert_eq!(plan.mdt, if offset < e { len.min(e - offset) } else { 0 });
            }
            let copies = in_sync(&l);
            // Units tile what the MDS does not keep, in order.
            let mut at = offset + plan.mdt;
            for u in &plan.units {
                prop_assert_eq!(u.file_offset, at);
                at += u.len;
                // Each copy in sync is tried once, and only those.
                let tried: Vec<u16> = u.tries.iter().map(|t| t[0].mirror).collect();
                let mut sorted = tried.clone();
                sorted.sort_unstable();
                prop_assert_eq!(&sorted, &copies);
                for t in &u.tries {
                    // Each try covers the unit exactly once, in order, inside one copy.
                    let mut p_at = u.file_offset;
                    for p in t {
                        prop_assert_eq!(p.file_offset, p_at);
                        prop_assert_eq!(p.at, p.file_offset - offset);
                        prop_assert!(p.len > 0);
                        prop_assert_eq!(p.mirror, t[0].mirror);
                        p_at += p.len;
                        // Inside one component and one stripe unit of it.
                        let c = l.components.iter()
                            .find(|c| c.mirror == p.mirror && c.contains(p.file_offset))
                            .unwrap();
                        prop_assert!(p.file_offset + p.len <= c.end);
                        prop_assert_eq!(
                            p.file_offset / c.stripe_size,
                            (p.file_offset + p.len - 1) / c.stripe_size
                        );
                        // A hole exactly where the component has no objects; else the
                        // object the component maps the offset to.
                        match p.object {
                            None => prop_assert!(c.objects.is_empty()),
                            Some((o, object_offset)) => {
                                let (stripe, oo) = c.map(p.file_offset);
                                prop_assert_eq!(o, c.objects[stripe as usize]);
                                prop_assert_eq!(object_offset, oo);
                            }
                        }
                    }
                    prop_assert_eq!(p_at, u.file_offset + u.len);
                }
            }
            if copies.is_empty() {
                prop_assert!(plan.units.is_empty());
            } else {
                prop_assert_eq!(at, offset + len);
            }
        }

        #[test]
        fn one_copy_read_covers_the_range_in_that_copy(
            l in layout(),
            offset in 0u64..(4 << 20),
            len in 0u64..(3 << 20),
            m in 0u16..4,
        ) {
            let mdt_free = l.components.iter().all(|c| !c.on_mdt());
            match read_copy(&l, m, offset, len) {
                Err(PlanError::NoMirror(x)) => prop_assert!(x >= l.mirror_count()),
                Err(PlanError::Layout(_)) => prop_assert!(m == 0 && !mdt_free),
                Ok(plan) => {
                    let mut at = offset;
                    for u in &plan.units {
                        prop_assert_eq!(u.tries.len(), 1);
                        let p = u.tries[0][0];
                        prop_assert_eq!(p.mirror, m);
                        prop_assert_eq!(p.file_offset, at);
                        at += p.len;
                    }
                    prop_assert_eq!(at, offset + len);
                }
            }
        }
    }

    proptest! {
        #[test]
        fn a_write_reaches_every_copy_in_sync_once(
            l in layout(),
            offset in 0u64..(4 << 20),
            len in 0u64..(3 << 20),
        ) {
            let Ok(pieces) = write(&l, offset, len, None) else {
                // Only a write over the MDS's part is refused here.
                prop_assert!(l.mdt_end().is_some_and(|e| offset < e && len > 0));
                return Ok(());
            };
            for m in in_sync(&l) {
                let mut at = offset;
                for p in pieces.iter().filter(|p| p.mirror == m) {
                    prop_assert_eq!(p.file_offset, at);
                    at += p.len;
                }
                prop_assert_eq!(at, offset + len);
            }
            prop_assert!(pieces.iter().all(|p| in_sync(&l).contains(&p.mirror)));
        }
    }

    #[test]
    fn units_spread_over_the_copies_in_sync() {
        let mut c = Component::raid0(StripeCount::Count(1), KIB64);
        c.objects = vec![proto::layout::StripeObject {
            target: 0,
            fid: Fid::new(OST_SEQ_BASE, 1, 0),
        }];
        let one = Layout::new(vec![c]).unwrap();
        let mut l = one.with_mirrors(3).unwrap();
        for (i, c) in l.components.iter_mut().enumerate() {
            c.objects = vec![proto::layout::StripeObject {
                target: i as u32,
                fid: Fid::new(OST_SEQ_BASE + i as u64, 1, 0),
            }];
        }
        l.components[1].stale = true;
        let plan = read(&l, 0, 4 * KIB64).unwrap();
        let first: Vec<u16> = plan.units.iter().map(|u| u.tries[0][0].mirror).collect();
        assert_eq!(first, vec![0, 2, 0, 2], "the stale copy is never tried");
        assert_eq!(plan.targets(), HashSet::from([0, 2]));
    }
}
