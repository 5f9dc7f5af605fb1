//! The metadata journal: every mutation, in order, made durable before it is acknowledged; and
//! the snapshot that lets the journal be cut short.
//!
//! ```text
//! journal:   "LODEJNL\0" (8) | version u32 | reserved u32 | batch*
//! batch:     "LJB2" (4) | body_len u32 | first_seq u64 | count u32
//!            | crc32c(the 20 bytes before it, then body) u32 | body
//! body:      (record_len u32 | postcard Record)*     (count records, seqs first_seq...)
//! snapshot:  "LODESNP\0" (8) | version u32 | body_len u64 | crc32c(body) u32 | body
//!            body = postcard (last_seq u64, Namespace) then, from version 3, postcard
//!                   map FID -> bytes of Data-on-MDT files
//! ```
//!
//! One group commit writes one batch, with one checksum, and syncs it. Replay applies, on top
//! of the snapshot, the records with a higher sequence number, in order.
//!
//! Only the very end of the journal may be cut: the batch that was being written when the
//! power went (it was never acknowledged). A batch that fails its checksum is such a torn tail
//! only if no valid batch with later records follows it; otherwise the journal is damaged in
//! the middle, and recovery stops with [`JournalError::Damaged`] naming the byte, rather than
//! drop acknowledged changes. The file is extended with zeros ahead of the batches, 4 MiB at a
//! time, so that a commit overwrites blocks the filesystem already holds and its fdatasync
//! flushes data alone.
//!
//! A record larger than [`MAX_RECORD`] is never written: the store refuses the change before
//! applying it.

use std::io;

use proto::md::{Creds, Mutation, ReqId, Time};
use serde::{Deserialize, Serialize};

use crate::disk::MetaDisk;
use crate::namespace::Namespace;

const JOURNAL_MAGIC: [u8; 8] = *b"LODEJNL\0";
const SNAPSHOT_MAGIC: [u8; 8] = *b"LODESNP\0";
const BATCH_MAGIC: [u8; 4] = *b"LJB2";
const VERSION: u32 = 2;
/// Snapshots of version 3 keep the bytes of Data-on-MDT files after the namespace; version 2
/// ones (none) still read.
const SNAPSHOT_VERSION: u32 = 3;
const JOURNAL_HEADER: u64 = 16;
const BATCH_HEADER: usize = 24;
/// Largest record: a mutation with its largest names, target and xattr value, with room.
pub const MAX_RECORD: u32 = 1 << 20;
/// Largest batch replay accepts (the store flushes long before).
pub const MAX_BATCH: u32 = 256 << 20;
const JOURNAL: &str = "journal";
const SNAPSHOT: &str = "snapshot";

/// One journaled mutation, with everything needed to replay it exactly.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub seq: u64,
    pub creds: Creds,
    pub time: Time,
    pub mutation: Mutation,
    /// The client's name for the request, so its reply is remembered again on replay.
    pub req: Option<ReqId>,
}

/// What a client keeps of a change applied before it was durable, to replay it after a
/// restart: the record as journaled, and the inode number the next create took then.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ticket {
    pub next_inode: u32,
    pub record: Record,
}

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("{name}: {source}")]
    Io {
        name: &'static str,
        source: io::Error,
    },
    #[error("{name} is damaged: {reason}")]
    Damaged { name: &'static str, reason: String },
    #[error("record {seq} is {len} bytes; the journal takes at most {MAX_RECORD}")]
    TooLarge { seq: u64, len: usize },
}

fn io_err(name: &'static str) -> impl Fn(io::Error) -> JournalError {
    move |source| JournalError::Io { name, source }
}

/// A record as it goes in a batch: its length, then its body. Refused past [`MAX_RECORD`].
pub fn encode_record(r: &Record) -> Result<Vec<u8>, JournalError> {
    // Records are plain data: encoding cannot fail.
    let mut out = proto::msg::encode_after(&[0; 4], r).unwrap_or_else(|_| vec![0; 4]);
    let len = out.len().saturating_sub(4);
    if len > MAX_RECORD as usize {
        return Err(JournalError::TooLarge { seq: r.seq, len });
    }
    out[..4].copy_from_slice(&(len as u32).to_le_bytes());
    Ok(out)
}

/// The encoding of `Ticket { next_inode, record }` (what `postcard` makes of it), from the
/// record's journal encoding ([`encode_record`]): the record is encoded once per change.
pub fn encode_ticket(next_inode: u32, encoded_record: &[u8]) -> Vec<u8> {
    let mut head = [0u8; 5];
    // A u32 takes at most five bytes: encoding cannot fail.
    let head = postcard::to_slice(&next_inode, &mut head).map_or(&[][..], |h| &h[..]);
    let body = encoded_record.get(4..).unwrap_or_default();
    let mut out = Vec::with_capacity(head.len() + body.len() + 32);
    out.extend_from_slice(head);
    out.extend_from_slice(body);
    out
}

/// One group commit's records, framed as a batch: `records` are [`encode_record`]s.
pub fn encode_batch(first_seq: u64, count: u32, records: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(BATCH_HEADER + records.len());
    out.extend_from_slice(&BATCH_MAGIC);
    out.extend_from_slice(&(records.len() as u32).to_le_bytes());
    out.extend_from_slice(&first_seq.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&out), records);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(records);
    out
}

/// A batch found whole in a journal.
struct Batch<'a> {
    first_seq: u64,
    count: u32,
    body: &'a [u8],
    end: usize,
}

fn le32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// The batch at `at`, if one is there whole and passes its checksum.
fn batch_at(raw: &[u8], at: usize) -> Option<Batch<'_>> {
    let head = raw.get(at..at.checked_add(BATCH_HEADER)?)?;
    if head[..4] != BATCH_MAGIC {
        return None;
    }
    let len = le32(&head[4..8]);
    if len > MAX_BATCH {
        return None;
    }
    let end = at + BATCH_HEADER + len as usize;
    let body = raw.get(at + BATCH_HEADER..end)?;
    if crc32c::crc32c_append(crc32c::crc32c(&head[..20]), body) != le32(&head[20..24]) {
        return None;
    }
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&head[8..16]);
    Some(Batch {
        first_seq: u64::from_le_bytes(seq),
        count: le32(&head[16..20]),
        body,
        end,
    })
}

/// The records of a batch that passed its checksum.
fn records(b: &Batch<'_>) -> Result<Vec<Record>, String> {
    let mut out = Vec::with_capacity(b.count as usize);
    let mut at = 0;
    while at < b.body.len() {
        let len = b
            .body
            .get(at..at + 4)
            .map(le32)
            .ok_or("a record length is cut short")? as usize;
        let body = b
            .body
            .get(at + 4..at + 4 + len)
            .ok_or("a record is cut short")?;
        let rec: Record = proto::msg::decode_body(body).map_err(|e| e.to_string())?;
        if rec.seq != b.first_seq + out.len() as u64 {
            return Err(format!(
                "record {} where {} was due",
                rec.seq,
                b.first_seq + out.len() as u64
            ));
        }
        out.push(rec);
        at += 4 + len;
    }
    if out.len() != b.count as usize {
        return Err(format!("{} records where {} were due", out.len(), b.count));
    }
    Ok(out)
}

/// What was found on disk.
pub struct Recovered {
    pub namespace: Namespace,
    pub last_seq: u64,
    /// Records applied from the journal.
    pub replayed: u64,
    /// Bytes of valid journal (where new records go).
    pub journal_len: u64,
    /// Bytes after the valid journal: a torn tail.
    pub torn: u64,
}

/// Reads the snapshot and replays the journal. `fresh` is the namespace of a disk that holds
/// none yet; the one read back numbers its inodes in `fresh`'s sequence (its MDT's).
pub fn recover(disk: &dyn MetaDisk, fresh: Namespace) -> Result<Recovered, JournalError> {
    let mdt = (fresh.seq(), fresh.root());
    let (mut ns, mut last_seq) = read_snapshot(disk)?.unwrap_or((fresh, 0));
    ns.belong_to(mdt);
    let raw = disk
        .read(JOURNAL)
        .map_err(io_err(JOURNAL))?
        .unwrap_or_default();
    let damaged = |reason: String| JournalError::Damaged {
        name: JOURNAL,
        reason,
    };
    if raw.is_empty() {
        return Ok(Recovered {
            namespace: ns,
            last_seq,
            replayed: 0,
            journal_len: 0,
            torn: 0,
        });
    }
    if raw.len() < JOURNAL_HEADER as usize || raw[..8] != JOURNAL_MAGIC {
        return Err(damaged("not a journal".into()));
    }
    if le32(&raw[8..12]) != VERSION {
        return Err(damaged(format!(
            "journal version {} (this MDS reads {VERSION})",
            le32(&raw[8..12])
        )));
    }
    let mut at = JOURNAL_HEADER as usize;
    let mut replayed = 0;
    while let Some(batch) = batch_at(&raw, at) {
        let recs = records(&batch).map_err(|e| damaged(format!("batch at byte {at}: {e}")))?;
        for rec in recs {
            if rec.seq <= last_seq {
                continue; // already in the snapshot
            }
            if rec.seq != last_seq + 1 {
                return Err(damaged(format!("record {} follows {last_seq}", rec.seq)));
            }
            ns.apply_request(&rec.mutation, &rec.creds, rec.time, rec.req)
                .map_err(|e| {
                    let mut what = format!("{:?}", rec.mutation);
                    what.truncate(200);
                    damaged(format!("record {} ({what}) does not replay: {e}", rec.seq))
                })?;
            last_seq = rec.seq;
            replayed += 1;
        }
        at = batch.end;
    }
    // Past the last whole batch: the zeros laid ahead, and perhaps the torn batch of a write
    // that never completed. A whole batch with later records further on means the damage is
    // in the middle, and cutting there would drop acknowledged changes.
    let tail = &raw[at..];
    if let Some(first) = tail.iter().position(|b| *b != 0) {
        let later = (at + first..raw.len().saturating_sub(BATCH_HEADER))
            .filter(|&p| raw[p..p + 4] == BATCH_MAGIC)
            .find_map(|p| {
                batch_at(&raw, p)
                    .filter(|b| b.first_seq > last_seq)
                    .map(|b| (p, b))
            });
        if let Some((p, b)) = later {
            return Err(damaged(format!(
                "bytes {at}..{p} fail their checksum, and records {}.. follow at byte {p}: \
                 damage in the middle of the journal (records up to {last_seq} are good)",
                b.first_seq
            )));
        }
    }
    let torn = tail.iter().rposition(|b| *b != 0).map_or(0, |p| p + 1);
    Ok(Recovered {
        namespace: ns,
        last_seq,
        replayed,
        journal_len: at as u64,
        torn: torn as u64,
    })
}

fn read_snapshot(disk: &dyn MetaDisk) -> Result<Option<(Namespace, u64)>, JournalError> {
    let Some(raw) = disk.read(SNAPSHOT).map_err(io_err(SNAPSHOT))? else {
        return Ok(None);
    };
    let damaged = |reason: &str| JournalError::Damaged {
        name: SNAPSHOT,
        reason: reason.to_owned(),
    };
    if raw.len() < 24 || raw[..8] != SNAPSHOT_MAGIC {
        return Err(damaged("not a snapshot"));
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&raw[12..20]);
    let len = usize::try_from(u64::from_le_bytes(len)).map_err(|_| damaged("absurd length"))?;
    let crc = le32(&raw[20..24]);
    let body = raw
        .get(24..24usize.saturating_add(len))
        .ok_or_else(|| damaged("truncated"))?;
    if crc32c::crc32c(body) != crc {
        return Err(damaged("checksum mismatch"));
    }
    let ((seq, mut ns), rest): ((u64, Namespace), _) =
        postcard::take_from_bytes(body).map_err(|e| damaged(&e.to_string()))?;
    match le32(&raw[8..12]) {
        // Before Data-on-MDT: nothing follows the namespace.
        2 if rest.is_empty() => {}
        SNAPSHOT_VERSION => {
            let mdt: std::collections::HashMap<proto::Fid, Vec<u8>> =
                postcard::from_bytes(rest).map_err(|e| damaged(&e.to_string()))?;
            ns.set_mdt_bytes(mdt);
        }
        v => {
            return Err(damaged(&format!(
                "snapshot version {v} (this MDS reads 2 and {SNAPSHOT_VERSION})"
            )))
        }
    }
    ns.find_unlinked();
    Ok(Some((ns, seq)))
}

/// Decodes a snapshot's bytes (for `fsck` and the fuzzer).
pub fn decode_snapshot(raw: &[u8]) -> Result<(Namespace, u64), JournalError> {
    let disk = crate::disk::MemDisk::new();
    disk.replace(SNAPSHOT, raw).map_err(io_err(SNAPSHOT))?;
    read_snapshot(&disk)?.ok_or_else(|| JournalError::Damaged {
        name: SNAPSHOT,
        reason: "missing".into(),
    })
}

/// Writes a snapshot of `ns` as of `seq`, durably and atomically.
pub fn write_snapshot(disk: &dyn MetaDisk, ns: &Namespace, seq: u64) -> Result<(), JournalError> {
    let failed = |e: postcard::Error| JournalError::Damaged {
        name: SNAPSHOT,
        reason: e.to_string(),
    };
    let mut body = postcard::to_allocvec(&(seq, ns)).map_err(failed)?;
    // The bytes of Data-on-MDT files follow the namespace.
    body = postcard::to_extend(ns.mdt_bytes(), body).map_err(failed)?;
    let mut out = Vec::with_capacity(24 + body.len());
    out.extend_from_slice(&SNAPSHOT_MAGIC);
    out.extend_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    out.extend_from_slice(&body);
    disk.replace(SNAPSHOT, &out).map_err(io_err(SNAPSHOT))
}

/// Appends batches and makes them durable.
pub struct JournalWriter {
    disk: std::sync::Arc<dyn MetaDisk>,
    len: u64,
    /// How far the file holds written zeros for batches to come.
    laid: u64,
}

/// Zeros laid ahead of the batches at a time.
const LAY_AHEAD: u64 = 4 << 20;

impl JournalWriter {
    /// Opens the journal for appending after its last valid batch (cutting a torn tail).
    pub fn open(
        disk: std::sync::Arc<dyn MetaDisk>,
        valid_len: u64,
    ) -> Result<JournalWriter, JournalError> {
        let io = io_err(JOURNAL);
        let len = if valid_len < JOURNAL_HEADER {
            let mut head = Vec::with_capacity(16);
            head.extend_from_slice(&JOURNAL_MAGIC);
            head.extend_from_slice(&VERSION.to_le_bytes());
            head.extend_from_slice(&0u32.to_le_bytes());
            disk.set_len(JOURNAL, 0).map_err(&io)?;
            disk.write_at(JOURNAL, 0, &head).map_err(&io)?;
            disk.sync(JOURNAL).map_err(&io)?;
            JOURNAL_HEADER
        } else {
            disk.set_len(JOURNAL, valid_len).map_err(&io)?;
            disk.sync(JOURNAL).map_err(&io)?;
            valid_len
        };
        Ok(JournalWriter {
            disk,
            len,
            laid: len,
        })
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len <= JOURNAL_HEADER
    }

    /// Appends one batch and syncs it: one call per group commit.
    pub fn append(&mut self, batch: &[u8]) -> Result<(), JournalError> {
        let io = io_err(JOURNAL);
        let end = self.len + batch.len() as u64;
        if end > self.laid {
            // Zeros first, durable, so the commits that follow overwrite allocated blocks.
            let upto = end.max(self.laid + LAY_AHEAD);
            let zeros = vec![0u8; (upto - self.laid) as usize];
            self.disk
                .write_at(JOURNAL, self.laid, &zeros)
                .map_err(&io)?;
            self.disk.sync(JOURNAL).map_err(&io)?;
            self.laid = upto;
        }
        self.disk.write_at(JOURNAL, self.len, batch).map_err(&io)?;
        self.disk.sync_data(JOURNAL).map_err(&io)?;
        self.len = end;
        Ok(())
    }

    /// Empties the journal after a snapshot has made its records redundant.
    pub fn reset(&mut self) -> Result<(), JournalError> {
        let io = io_err(JOURNAL);
        self.disk.set_len(JOURNAL, JOURNAL_HEADER).map_err(&io)?;
        self.disk.sync(JOURNAL).map_err(&io)?;
        self.len = JOURNAL_HEADER;
        self.laid = JOURNAL_HEADER;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::Fid;

    #[test]
    fn a_ticket_made_from_the_journaled_record_is_the_ticket_encoded() {
        let record = Record {
            seq: 300,
            creds: Creds::root(),
            time: Time {
                sec: 1_700_000_000,
                nsec: 5,
            },
            mutation: Mutation::CreateAt {
                fid: Fid::new(proto::fid::INODE_SEQ, 70_000, 0),
                parent: Fid::new(proto::fid::INODE_SEQ, 1, 0),
                name: b"f0000001".to_vec(),
                kind: proto::md::Kind::File,
                mode: 0o644,
                target: vec![],
                layout: None,
            },
            req: Some(ReqId {
                client: u128::MAX - 3,
                seq: 1 << 40,
            }),
        };
        let encoded = encode_record(&record).unwrap();
        for next_inode in [0, 1, 127, 128, 70_001, u32::MAX] {
            let ticket = Ticket {
                next_inode,
                record: record.clone(),
            };
            let made = encode_ticket(next_inode, &encoded);
            assert_eq!(made, postcard::to_allocvec(&ticket).unwrap());
            assert_eq!(postcard::from_bytes::<Ticket>(&made).unwrap(), ticket);
        }
    }
}
