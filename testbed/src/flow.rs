//! A flow-level network and storage model: every transfer is a flow across a set of resources
//! (NICs, a fabric core, storage targets, the MDS), and the rates of the flows in progress are
//! the max-min fair allocation over those resources, found by progressive filling and computed
//! again whenever a flow starts or ends, as SimGrid's validated flow model does. A flow may also
//! carry its own rate cap (what a window of requests in flight over a round-trip time allows)
//! and a start latency.
//!
//! Units are whatever the caller uses consistently (bytes and bytes/s here; operations and
//! operations/s for the MDS).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// A shared resource of fixed capacity.
#[derive(Clone, Debug)]
pub struct Resource {
    pub name: String,
    pub capacity: f64,
}

/// One transfer.
#[derive(Clone, Debug)]
pub struct Flow {
    /// The resources it crosses (each at most once).
    pub resources: Vec<usize>,
    /// How much it moves.
    pub amount: f64,
    /// When it is issued, in seconds.
    pub start: f64,
    /// Added once before it moves anything (round trips to set it up).
    pub latency: f64,
    /// Its own rate limit (f64::INFINITY for none).
    pub cap: f64,
}

/// What a run gives.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// When each flow finished.
    pub finish: Vec<f64>,
    /// How much crossed each resource, and for how long it carried anything.
    pub carried: Vec<f64>,
    pub busy: Vec<f64>,
    /// (time, total rate of every flow) after each event.
    pub timeline: Vec<(f64, f64)>,
    /// Rate recomputations made.
    pub events: u64,
    /// When the last flow finished.
    pub makespan: f64,
}

#[derive(PartialEq)]
struct Level(f64, usize);

impl Eq for Level {}

impl PartialOrd for Level {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Level {
    // A min-heap on the share.
    fn cmp(&self, other: &Self) -> Ordering {
        other.0.total_cmp(&self.0).then(other.1.cmp(&self.1))
    }
}

/// Max-min fair rates of `active` flows over `resources` (progressive filling): raise every
/// unfrozen flow's rate together; when a resource fills (or a flow reaches its cap) freeze the
/// flows it holds back, and go on with the rest.
///
/// Long by design: one algorithm whose steps share its working arrays.
pub fn max_min_rates(resources: &[Resource], flows: &[Flow], active: &[usize], rate: &mut [f64]) {
    let mut left: Vec<f64> = resources.iter().map(|r| r.capacity).collect();
    let mut count = vec![0usize; resources.len()];
    let mut users: Vec<Vec<usize>> = vec![vec![]; resources.len()];
    for &f in active {
        for &r in &flows[f].resources {
            count[r] += 1;
            users[r].push(f);
        }
    }
    let mut frozen = vec![false; flows.len()];
    let mut heap = BinaryHeap::new();
    for r in 0..resources.len() {
        if count[r] > 0 {
            heap.push(Level(left[r] / count[r] as f64, r));
        }
    }
    // Flows with their own caps, smallest first.
    let mut capped: Vec<usize> = active
        .iter()
        .copied()
        .filter(|&f| flows[f].cap.is_finite())
        .collect();
    capped.sort_by(|a, b| flows[*b].cap.total_cmp(&flows[*a].cap));
    let mut remaining = active.len();
    let freeze = |f: usize,
                  r: f64,
                  rate: &mut [f64],
                  frozen: &mut [bool],
                  left: &mut [f64],
                  count: &mut [usize],
                  heap: &mut BinaryHeap<Level>| {
        frozen[f] = true;
        rate[f] = r;
        for &x in &flows[f].resources {
            left[x] = (left[x] - r).max(0.0);
            count[x] -= 1;
            if count[x] > 0 {
                heap.push(Level(left[x] / count[x] as f64, x));
            }
        }
    };
    while remaining > 0 {
        // The lowest fill level among resources, skipping stale heap entries.
        let mut level = f64::INFINITY;
        let mut at = None;
        while let Some(Level(share, r)) = heap.peek() {
            let (share, r) = (*share, *r);
            if count[r] == 0 || (left[r] / count[r] as f64 - share).abs() > share.abs() * 1e-12 {
                heap.pop();
                continue;
            }
            level = share;
            at = Some(r);
            break;
        }
        while let Some(&f) = capped.last() {
            if frozen[f] {
                capped.pop();
                continue;
            }
            break;
        }
        if let Some(&f) = capped.last() {
            if flows[f].cap <= level {
                capped.pop();
                let c = flows[f].cap;
                freeze(f, c, rate, &mut frozen, &mut left, &mut count, &mut heap);
                remaining -= 1;
                continue;
            }
        }
        let Some(r) = at else {
            // Flows crossing no resource and uncapped: nothing holds them back.
            for &f in active {
                if !frozen[f] {
                    rate[f] = f64::INFINITY;
                    frozen[f] = true;
                }
            }
            break;
        };
        heap.pop();
        let holding = std::mem::take(&mut users[r]);
        for &f in &holding {
            if !frozen[f] {
                freeze(
                    f,
                    level,
                    rate,
                    &mut frozen,
                    &mut left,
                    &mut count,
                    &mut heap,
                );
                remaining -= 1;
            }
        }
    }
}

/// Runs every flow to its end. `progress(done, total)` is called as flows finish.
///
/// Long by design: the discrete-event loop (next event, advance, recompute rates) in one piece.
pub fn run(
    resources: &[Resource],
    flows: &[Flow],
    mut progress: impl FnMut(usize, usize),
) -> Outcome {
    let n = flows.len();
    let mut out = Outcome {
        finish: vec![f64::NAN; n],
        carried: vec![0.0; resources.len()],
        busy: vec![0.0; resources.len()],
        ..Default::default()
    };
    // Flows by the time they begin to move.
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|a, b| {
        (flows[*a].start + flows[*a].latency).total_cmp(&(flows[*b].start + flows[*b].latency))
    });
    let mut next = 0;
    let mut left: Vec<f64> = flows.iter().map(|f| f.amount).collect();
    let mut rate = vec![0.0; n];
    let mut active: Vec<usize> = vec![];
    let mut now = 0.0f64;
    let mut done = 0;
    while done < n {
        // Admit every flow due now.
        while next < n && flows[order[next]].start + flows[order[next]].latency <= now + 1e-12 {
            let f = order[next];
            next += 1;
            if left[f] <= 0.0 {
                out.finish[f] = now;
                done += 1;
            } else {
                active.push(f);
            }
        }
        if active.is_empty() {
            if next < n {
                let f = order[next];
                now = now.max(flows[f].start + flows[f].latency);
                continue;
            }
            break;
        }
        max_min_rates(resources, flows, &active, &mut rate);
        out.events += 1;
        let total: f64 = active.iter().map(|&f| rate[f]).sum();
        out.timeline.push((now, total));
        // The next event: a flow ends, or one is due to start.
        let mut dt = active
            .iter()
            .map(|&f| left[f] / rate[f])
            .fold(f64::INFINITY, f64::min);
        if next < n {
            let f = order[next];
            dt = dt.min(flows[f].start + flows[f].latency - now);
        }
        let dt = dt.max(0.0);
        for &f in &active {
            let moved = rate[f] * dt;
            left[f] -= moved;
            for &r in &flows[f].resources {
                out.carried[r] += moved;
            }
        }
        let mut using = vec![];
        for &f in &active {
            using.extend(flows[f].resources.iter().copied());
        }
        using.sort_unstable();
        using.dedup();
        for r in using {
            out.busy[r] += dt;
        }
        now += dt;
        // Everything within a hair of its end ends now (symmetric flows end together).
        let before = active.len();
        active.retain(|&f| {
            let ending = left[f] <= flows[f].amount * 1e-9 || left[f] / rate[f] <= now * 1e-12;
            if ending {
                out.finish[f] = now;
            }
            !ending
        });
        if active.len() != before {
            done += before - active.len();
            progress(done, n);
        }
    }
    out.timeline.push((now, 0.0));
    out.makespan = now;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(caps: &[f64]) -> Vec<Resource> {
        caps.iter()
            .enumerate()
            .map(|(i, &c)| Resource {
                name: format!("r{i}"),
                capacity: c,
            })
            .collect()
    }

    fn flow(resources: &[usize], amount: f64) -> Flow {
        Flow {
            resources: resources.to_vec(),
            amount,
            start: 0.0,
            latency: 0.0,
            cap: f64::INFINITY,
        }
    }

    #[test]
    fn max_min_gives_the_textbook_allocation() {
        // Two links of 10 and 4; flow a crosses both, b only the first, c only the second.
        let r = res(&[10.0, 4.0]);
        let f = vec![flow(&[0, 1], 1.0), flow(&[0], 1.0), flow(&[1], 1.0)];
        let mut rate = vec![0.0; 3];
        max_min_rates(&r, &f, &[0, 1, 2], &mut rate);
        assert!((rate[0] - 2.0).abs() < 1e-9 && (rate[2] - 2.0).abs() < 1e-9);
        assert!((rate[1] - 8.0).abs() < 1e-9, "{rate:?}");
    }

    #[test]
    fn caps_and_latency_shape_a_run() {
        let r = res(&[100.0]);
        let mut slow = flow(&[0], 10.0);
        slow.cap = 10.0; // 1 s at its cap
        let mut late = flow(&[0], 90.0);
        late.latency = 0.5;
        let out = run(&r, &[slow, late], |_, _| {});
        assert!((out.finish[0] - 1.0).abs() < 1e-9, "{:?}", out.finish);
        // The second moves at 90 while the first holds 10 (45 by 1 s), then alone at 100.
        assert!((out.finish[1] - 1.45).abs() < 1e-9, "{:?}", out.finish);
        assert!((out.carried[0] - 100.0).abs() < 1e-6);
    }
}
