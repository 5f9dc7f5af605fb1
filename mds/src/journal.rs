//! The metadata journal: every mutation, in order, made durable before it is acknowledged; and
//! the snapshot that lets the journal be cut short.
//!
//! ```text
//! journal:   "LODEJNL\0" (8) | version u32 | reserved u32 | record*
//! record:    body_len u32 | crc32c(body) u32 | body (postcard Record)
//! snapshot:  "LODESNP\0" (8) | version u32 | body_len u64 | crc32c(body) u32 | body
//!            body = postcard (last_seq u64, Namespace)
//! ```
//!
//! Records carry a sequence number; replay applies, on top of the snapshot, the records with a
//! higher number, in order. A record cut short or failing its checksum ends the journal: it
//! is the tail of a write that never completed (and so was never acknowledged), and the file is
//! truncated there before new records are appended. A zero length ends it too: the file is
//! extended with zeros ahead of the records, 4 MiB at a time, so that a commit overwrites
//! blocks the filesystem already holds and its fdatasync flushes data alone (several times
//! faster than growing the file at every commit).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use proto::md::{Creds, Mutation, ReqId, Time};
use serde::{Deserialize, Serialize};

use crate::namespace::Namespace;

const JOURNAL_MAGIC: [u8; 8] = *b"LODEJNL\0";
const SNAPSHOT_MAGIC: [u8; 8] = *b"LODESNP\0";
const VERSION: u32 = 1;
const JOURNAL_HEADER: u64 = 16;
/// Largest record: a mutation with its largest names, target and xattr value, with room.
pub const MAX_RECORD: u32 = 1 << 20;

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

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path}: {reason}")]
    Damaged { path: PathBuf, reason: String },
}

fn io_err(path: &Path) -> impl Fn(io::Error) -> JournalError + '_ {
    move |source| JournalError::Io {
        path: path.to_path_buf(),
        source,
    }
}

pub fn encode_record(r: &Record) -> Vec<u8> {
    // Records are plain data: encoding cannot fail.
    let body = postcard::to_allocvec(r).unwrap_or_default();
    let mut out = Vec::with_capacity(8 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    out.extend_from_slice(&body);
    out
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

/// Reads the snapshot and replays the journal in `dir`.
pub fn recover(dir: &Path, fresh: Namespace) -> Result<Recovered, JournalError> {
    let (mut ns, mut last_seq) = read_snapshot(dir)?.unwrap_or((fresh, 0));
    let path = dir.join("journal");
    let raw = match fs::read(&path) {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::NotFound => vec![],
        Err(e) => return Err(io_err(&path)(e)),
    };
    let damaged = |reason: String| JournalError::Damaged {
        path: path.clone(),
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
    let mut at = JOURNAL_HEADER as usize;
    let mut replayed = 0;
    while let Some(head) = raw.get(at..at + 8) {
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
        let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        if len == 0 || len > MAX_RECORD {
            break;
        }
        let Some(body) = raw.get(at + 8..at + 8 + len as usize) else {
            break;
        };
        if crc32c::crc32c(body) != crc {
            break;
        }
        let rec: Record =
            proto::msg::decode_body(body).map_err(|e| damaged(format!("record at {at}: {e}")))?;
        if rec.seq > last_seq {
            if rec.seq != last_seq + 1 {
                return Err(damaged(format!("record {} follows {last_seq}", rec.seq)));
            }
            ns.apply_request(&rec.mutation, &rec.creds, rec.time, rec.req)
                .map_err(|e| damaged(format!("record {} does not replay: {e}", rec.seq)))?;
            last_seq = rec.seq;
            replayed += 1;
        }
        at += 8 + len as usize;
    }
    // Bytes of an unfinished write past the last record; the zeros laid ahead are not torn.
    let torn = raw[at.min(raw.len())..]
        .iter()
        .rposition(|b| *b != 0)
        .map_or(0, |p| p + 1);
    Ok(Recovered {
        namespace: ns,
        last_seq,
        replayed,
        journal_len: at as u64,
        torn: torn as u64,
    })
}

fn read_snapshot(dir: &Path) -> Result<Option<(Namespace, u64)>, JournalError> {
    let path = dir.join("snapshot");
    let raw = match fs::read(&path) {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(&path)(e)),
    };
    let damaged = |reason: &str| JournalError::Damaged {
        path: path.clone(),
        reason: reason.to_owned(),
    };
    if raw.len() < 24 || raw[..8] != SNAPSHOT_MAGIC {
        return Err(damaged("not a snapshot"));
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&raw[12..20]);
    let len = u64::from_le_bytes(len) as usize;
    let crc = u32::from_le_bytes([raw[20], raw[21], raw[22], raw[23]]);
    let body = raw.get(24..24 + len).ok_or_else(|| damaged("truncated"))?;
    if crc32c::crc32c(body) != crc {
        return Err(damaged("checksum mismatch"));
    }
    let (seq, ns): (u64, Namespace) =
        postcard::from_bytes(body).map_err(|e| damaged(&e.to_string()))?;
    Ok(Some((ns, seq)))
}

/// Writes a snapshot of `ns` as of `seq` durably (temporary file, fsync, rename, fsync dir).
pub fn write_snapshot(dir: &Path, ns: &Namespace, seq: u64) -> Result<(), JournalError> {
    let path = dir.join("snapshot");
    let io = io_err(&path);
    let body = postcard::to_allocvec(&(seq, ns)).map_err(|e| JournalError::Damaged {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    let tmp = dir.join("snapshot.tmp");
    let mut f = File::create(&tmp).map_err(&io)?;
    f.write_all(&SNAPSHOT_MAGIC).map_err(&io)?;
    f.write_all(&VERSION.to_le_bytes()).map_err(&io)?;
    f.write_all(&(body.len() as u64).to_le_bytes())
        .map_err(&io)?;
    f.write_all(&crc32c::crc32c(&body).to_le_bytes())
        .map_err(&io)?;
    f.write_all(&body).map_err(&io)?;
    f.sync_all().map_err(&io)?;
    fs::rename(&tmp, &path).map_err(&io)?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(&io)
}

/// Appends records and makes them durable.
pub struct JournalWriter {
    path: PathBuf,
    file: File,
    len: u64,
    /// How far the file holds written zeros for records to come.
    laid: u64,
}

/// Zeros laid ahead of the records at a time.
const LAY_AHEAD: u64 = 4 << 20;

impl JournalWriter {
    /// Opens the journal for appending after its last valid record (cutting a torn tail).
    pub fn open(dir: &Path, valid_len: u64) -> Result<JournalWriter, JournalError> {
        let path = dir.join("journal");
        let io = io_err(&path);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(&io)?;
        let len = if valid_len < JOURNAL_HEADER {
            let mut head = Vec::with_capacity(16);
            head.extend_from_slice(&JOURNAL_MAGIC);
            head.extend_from_slice(&VERSION.to_le_bytes());
            head.extend_from_slice(&0u32.to_le_bytes());
            file.set_len(0).map_err(&io)?;
            file.write_all(&head).map_err(&io)?;
            file.sync_all().map_err(&io)?;
            File::open(dir).and_then(|d| d.sync_all()).map_err(&io)?;
            JOURNAL_HEADER
        } else {
            file.set_len(valid_len).map_err(&io)?;
            file.sync_all().map_err(&io)?;
            valid_len
        };
        file.seek(SeekFrom::Start(len)).map_err(&io)?;
        drop(io);
        Ok(JournalWriter {
            path,
            file,
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

    /// Appends encoded records and fsyncs them: one call per group commit.
    pub fn append(&mut self, records: &[u8]) -> Result<(), JournalError> {
        use std::os::unix::fs::FileExt;
        let io = io_err(&self.path);
        let end = self.len + records.len() as u64;
        if end > self.laid {
            // Zeros first, durable, so the commits that follow overwrite allocated blocks.
            let upto = end.max(self.laid + LAY_AHEAD);
            let zeros = vec![0u8; (upto - self.laid) as usize];
            self.file.write_all_at(&zeros, self.laid).map_err(&io)?;
            self.file.sync_all().map_err(&io)?;
            self.laid = upto;
        }
        self.file.write_all_at(records, self.len).map_err(&io)?;
        self.file.sync_data().map_err(&io)?;
        self.len = end;
        Ok(())
    }

    /// Empties the journal after a snapshot has made its records redundant.
    pub fn reset(&mut self) -> Result<(), JournalError> {
        let io = io_err(&self.path);
        self.file.set_len(JOURNAL_HEADER).map_err(&io)?;
        self.file
            .seek(SeekFrom::Start(JOURNAL_HEADER))
            .map_err(&io)?;
        self.file.sync_all().map_err(&io)?;
        self.len = JOURNAL_HEADER;
        self.laid = JOURNAL_HEADER;
        Ok(())
    }
}

/// Reads a whole file (for tests that damage journals).
pub fn read_all(path: &Path) -> io::Result<Vec<u8>> {
    let mut v = vec![];
    File::open(path)?.read_to_end(&mut v)?;
    Ok(v)
}
