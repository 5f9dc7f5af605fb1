//! Job identifiers: which job a request works for, so that servers can say which job loads
//! them (Lustre's jobid and job_stats).
//!
//! A request carries its job in the frame: the header's [`crate::frame::FLAG_JOB`] says the
//! body starts with one length byte and that many bytes of job id, ahead of the message body.
//!
//! ```text
//!  +-----+------------------+----------------------+
//!  | len | job id (len B)   | message body          |
//!  +-----+------------------+----------------------+
//! ```
//!
//! The prefix lies inside the body, so the frame's crc32c covers it.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::frame::FrameError;

/// Longest job id, in bytes (Lustre's `LUSTRE_JOBID_SIZE` less its terminator).
pub const MAX_JOBID: usize = 31;

/// A job id: 1 to [`MAX_JOBID`] bytes of printable ASCII without spaces.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct JobId(String);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("a job id is 1 to {MAX_JOBID} bytes of printable ASCII without spaces, not {0:?}")]
pub struct JobIdError(pub String);

fn allowed(b: u8) -> bool {
    b.is_ascii_graphic()
}

impl JobId {
    /// The job id `s`, checked.
    pub fn new(s: &str) -> Result<JobId, JobIdError> {
        if s.is_empty() || s.len() > MAX_JOBID || !s.bytes().all(allowed) {
            return Err(JobIdError(s.to_owned()));
        }
        Ok(JobId(s.to_owned()))
    }

    /// A job id made from any text (an environment variable, a process name): bytes that may
    /// not stand in one become `_`, and it is cut at [`MAX_JOBID`] bytes. `None` for empty text.
    pub fn lossy(s: &str) -> Option<JobId> {
        let s: String = s
            .bytes()
            .take(MAX_JOBID)
            .map(|b| if allowed(b) { b as char } else { '_' })
            .collect();
        (!s.is_empty()).then_some(JobId(s))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl TryFrom<String> for JobId {
    type Error = JobIdError;
    fn try_from(s: String) -> Result<JobId, JobIdError> {
        JobId::new(&s)
    }
}

impl From<JobId> for String {
    fn from(j: JobId) -> String {
        j.0
    }
}

/// `body` with `job` in front of it, as a request frame flagged with the job carries it.
pub fn prefix(job: &JobId, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + job.0.len() + body.len());
    out.push(job.0.len() as u8);
    out.extend_from_slice(job.0.as_bytes());
    out.extend_from_slice(body);
    out
}

/// Splits the job off the front of a flagged request's body.
pub fn split(mut body: Vec<u8>) -> Result<(JobId, Vec<u8>), FrameError> {
    let bad = |why: &str| FrameError::Body(format!("job id prefix: {why}"));
    let len = *body.first().ok_or_else(|| bad("empty body"))? as usize;
    let text = body
        .get(1..1 + len)
        .ok_or_else(|| bad("shorter than its length"))?;
    let text = std::str::from_utf8(text).map_err(|_| bad("not ASCII"))?;
    let job = JobId::new(text).map_err(|e| bad(&e.to_string()))?;
    body.drain(..1 + len);
    Ok((job, body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn job_ids_are_checked() {
        assert!(JobId::new("slurm.1234").is_ok());
        assert!(JobId::new("").is_err());
        assert!(JobId::new("has space").is_err());
        assert!(JobId::new(&"x".repeat(MAX_JOBID + 1)).is_err());
        assert_eq!(
            JobId::lossy("python3 train.py\n").unwrap().as_str(),
            "python3_train.py_"
        );
        assert_eq!(
            JobId::lossy(&"y".repeat(99)).unwrap().as_str().len(),
            MAX_JOBID
        );
        assert_eq!(JobId::lossy(""), None);
    }

    #[test]
    fn a_bad_prefix_is_an_error() {
        assert!(split(vec![]).is_err());
        assert!(split(vec![5, b'a']).is_err());
        assert!(split(vec![0, 1, 2]).is_err());
        assert!(split(vec![1, b' ', 2]).is_err());
        assert!(split(vec![1, 0xff]).is_err());
    }

    proptest! {
        #[test]
        fn prefixed_bodies_split_back(job in "[!-~]{1,31}", body in proptest::collection::vec(any::<u8>(), 0..256)) {
            let job = JobId::new(&job).unwrap();
            let (got, rest) = split(prefix(&job, &body)).unwrap();
            prop_assert_eq!(got, job);
            prop_assert_eq!(rest, body);
        }

        #[test]
        fn random_prefixes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = split(bytes);
        }
    }
}
