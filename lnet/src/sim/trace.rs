//! The fabric's record of what it decided, for replaying and comparing runs.

use std::time::Duration;

/// What became of one message or transfer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Lands after each of these delays (two entries: duplicated).
    Delivered {
        after: Vec<Duration>,
    },
    Lost,
    Partitioned,
    /// The destination is not running.
    Down,
    /// The sender had crashed; nothing leaves a dead node.
    SenderDown,
    /// Not a message: the node `from` crashed.
    Crash,
}

/// One decision, timed from the fabric's creation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    pub at: Duration,
    pub from: String,
    pub to: String,
    pub kind: &'static str,
    pub xid: u64,
    pub bytes: u64,
    pub fate: Fate,
}

impl TraceEvent {
    pub(crate) fn message(
        at: Duration,
        from: &str,
        to: &str,
        kind: &'static str,
        xid: u64,
        bytes: u64,
    ) -> Self {
        TraceEvent {
            at,
            from: from.to_owned(),
            to: to.to_owned(),
            kind,
            xid,
            bytes,
            fate: Fate::Lost,
        }
    }

    pub(crate) fn crash(at: Duration, node: &str) -> Self {
        TraceEvent {
            at,
            from: node.to_owned(),
            to: String::new(),
            kind: "crash",
            xid: 0,
            bytes: 0,
            fate: Fate::Crash,
        }
    }
}
