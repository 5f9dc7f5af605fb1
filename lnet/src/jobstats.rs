//! What each job asked of this server (Lustre's job_stats): requests by operation and bulk
//! bytes each way, per job id, in a bounded table.
//!
//! The table holds at most [`MAX_JOBS`] jobs. A job idle for [`JOB_IDLE`] is dropped when
//! room is needed (Lustre's `job_cleanup_interval`); when every job is busier than that, the
//! one seen least recently makes room. Counting costs one short lock per request.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use proto::msg::opcodes;
use proto::stats::{JobStat, OpCount};
use proto::{JobId, Opcode};

/// Most jobs a server keeps counts for.
pub const MAX_JOBS: usize = 4096;
/// A job not seen for this long gives its place to a new one first.
pub const JOB_IDLE: Duration = Duration::from_secs(600);

const OPS: usize = opcodes::ALL.len();

struct Counts {
    ops: [u64; OPS],
    read_bytes: u64,
    write_bytes: u64,
    start: SystemTime,
    last: Instant,
}

/// The table of jobs.
pub struct JobTable {
    jobs: Mutex<HashMap<JobId, Counts>>,
    max: usize,
}

impl std::fmt::Debug for JobTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobTable").finish_non_exhaustive()
    }
}

impl Default for JobTable {
    fn default() -> Self {
        JobTable::with_capacity(MAX_JOBS)
    }
}

impl JobTable {
    /// A table of at most `max` jobs.
    pub fn with_capacity(max: usize) -> JobTable {
        JobTable {
            jobs: Mutex::new(HashMap::new()),
            max: max.max(1),
        }
    }

    /// Counts one request of `job`, and the bulk bytes it moved.
    pub fn record(&self, job: &JobId, op: Opcode, read_bytes: u64, write_bytes: u64) {
        let now = Instant::now();
        let mut jobs = self.jobs.lock();
        // The common case, a job already counted, takes no allocation and no clock but one.
        let c = match jobs.get_mut(job) {
            Some(c) => c,
            None => {
                if jobs.len() >= self.max {
                    jobs.retain(|_, c| now.duration_since(c.last) < JOB_IDLE);
                    if jobs.len() >= self.max {
                        let oldest = jobs
                            .iter()
                            .min_by_key(|(_, c)| c.last)
                            .map(|(j, _)| j.clone());
                        if let Some(j) = oldest {
                            jobs.remove(&j);
                        }
                    }
                }
                jobs.entry(job.clone()).or_insert_with(|| Counts {
                    ops: [0; OPS],
                    read_bytes: 0,
                    write_bytes: 0,
                    start: SystemTime::now(),
                    last: now,
                })
            }
        };
        if let Some(i) = op.index() {
            c.ops[i] += 1;
        }
        c.read_bytes += read_bytes;
        c.write_bytes += write_bytes;
        c.last = now;
    }

    /// Every job's counts, busiest (most requests) first.
    pub fn snapshot(&self) -> Vec<JobStat> {
        let secs = |t: SystemTime| t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        // When a job was last seen, on the wall clock: now, less how long ago it was.
        let (now, wall) = (Instant::now(), SystemTime::now());
        let last_wall = |last: Instant| wall - now.duration_since(last);
        let mut out: Vec<JobStat> = self
            .jobs
            .lock()
            .iter()
            .map(|(job, c)| JobStat {
                job: job.clone(),
                start_unix_s: secs(c.start),
                last_unix_s: secs(last_wall(c.last)),
                ops: opcodes::ALL
                    .iter()
                    .zip(c.ops)
                    .filter(|(_, n)| *n > 0)
                    .map(|(op, count)| OpCount {
                        op: op.name().to_owned(),
                        count,
                    })
                    .collect(),
                read_bytes: c.read_bytes,
                write_bytes: c.write_bytes,
            })
            .collect();
        out.sort_by(|a, b| {
            b.requests()
                .cmp(&a.requests())
                .then_with(|| a.job.cmp(&b.job))
        });
        out.truncate(proto::stats::MAX_JOBS_LISTED);
        out
    }

    /// Jobs in the table.
    pub fn len(&self) -> usize {
        self.jobs.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(s: &str) -> JobId {
        JobId::new(s).unwrap()
    }

    #[test]
    fn counts_land_on_their_job_and_operation() {
        let t = JobTable::default();
        for _ in 0..3 {
            t.record(&job("a"), opcodes::OST_WRITE, 0, 100);
        }
        t.record(&job("a"), opcodes::OST_READ, 7, 0);
        t.record(&job("b"), opcodes::MDS_GETATTR, 0, 0);
        let s = t.snapshot();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].job, job("a"));
        assert_eq!(s[0].requests(), 4);
        assert_eq!((s[0].read_bytes, s[0].write_bytes), (7, 300));
        let writes = s[0].ops.iter().find(|o| o.op == "ost_write").unwrap();
        assert_eq!(writes.count, 3);
        assert_eq!(
            s[1].ops,
            vec![OpCount {
                op: "mds_getattr".into(),
                count: 1
            }]
        );
    }

    #[test]
    fn the_table_is_bounded_and_the_least_recent_job_goes() {
        let t = JobTable::with_capacity(3);
        for name in ["a", "b", "c"] {
            t.record(&job(name), opcodes::PING, 0, 0);
        }
        t.record(&job("a"), opcodes::PING, 0, 0);
        t.record(&job("d"), opcodes::PING, 0, 0);
        assert_eq!(t.len(), 3);
        let names: Vec<String> = t.snapshot().iter().map(|j| j.job.to_string()).collect();
        assert!(!names.contains(&"b".to_owned()), "{names:?}");
        assert!(names.contains(&"a".to_owned()) && names.contains(&"d".to_owned()));
    }
}
