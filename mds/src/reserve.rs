//! Inode numbers set aside for one client's creates, so that the client can answer a create
//! before sending it (an asynchronous create names its FID: [`proto::md::Mutation::CreateAt`]).
//!
//! The numbers themselves are taken from the namespace by a journaled
//! [`proto::md::Mutation::ReserveInodes`], committed before the reservation is answered, so no
//! restart gives them out again. Which client holds which range is kept in a small file beside
//! the table of clients, written before the answer too, so that a client's creates sent after
//! an MDS restart are still accepted. Only the last [`KEPT`] ranges of a client hold; a client
//! that leaves the table of clients loses its ranges.
//!
//! ```text
//! reserved file:  "LODERSV\0" (8) | crc32c(body) u32 | body = postcard Vec<(u128, u32, u32)>
//! ```

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;
use proto::Fid;

use crate::disk::MetaDisk;
use crate::recovery::ClientsError;

const MAGIC: [u8; 8] = *b"LODERSV\0";
const FILE: &str = "reserved";
/// Ranges kept per client: a client asks for the next while creates from the last are still on
/// their way.
pub const KEPT: usize = proto::md::RESERVATIONS_KEPT;

/// The ranges each client holds: `(first, end)` of inode numbers.
pub struct Reservations {
    disk: Arc<dyn MetaDisk>,
    held: Mutex<HashMap<u128, VecDeque<(u32, u32)>>>,
    /// One writer of the file at a time, in the order ranges were given.
    saving: tokio::sync::Mutex<()>,
    /// The sequence the ranges are of: the MDT's.
    seq: u64,
}

type Saved = Vec<(u128, u32, u32)>;

fn load(disk: &dyn MetaDisk) -> Result<Saved, ClientsError> {
    let Some(raw) = disk.read(FILE)? else {
        return Ok(vec![]);
    };
    if raw.len() < 12 || raw[..8] != MAGIC {
        return Err(ClientsError::Damaged("reserved: no header".into()));
    }
    let crc = u32::from_le_bytes([raw[8], raw[9], raw[10], raw[11]]);
    if crc32c::crc32c(&raw[12..]) != crc {
        return Err(ClientsError::Damaged("reserved: checksum mismatch".into()));
    }
    postcard::from_bytes(&raw[12..]).map_err(|e| ClientsError::Damaged(e.to_string()))
}

impl Reservations {
    /// The reservations kept on `disk`.
    pub fn open(disk: Arc<dyn MetaDisk>) -> Result<Reservations, ClientsError> {
        let mut held: HashMap<u128, VecDeque<(u32, u32)>> = HashMap::new();
        for (client, first, end) in load(&*disk)? {
            held.entry(client).or_default().push_back((first, end));
        }
        // The MDT the disk holds (one without an identity, in tests, is MDT0's).
        let mdt = crate::format::read(&*disk, "data directory")
            .ok()
            .flatten()
            .map_or(0, |id| id.mdt);
        Ok(Reservations {
            disk,
            held: Mutex::new(held),
            saving: tokio::sync::Mutex::new(()),
            seq: proto::fid::inode_seq(mdt),
        })
    }

    /// Whether `client` holds `fid`.
    pub fn holds(&self, client: u128, fid: Fid) -> bool {
        fid.seq == self.seq
            && fid.ver == 0
            && self.held.lock().get(&client).is_some_and(|ranges| {
                ranges
                    .iter()
                    .any(|(first, end)| (*first..*end).contains(&fid.oid))
            })
    }

    /// Gives `client` the range `first..end` (durable when this returns), dropping its oldest
    /// past [`KEPT`] and every range of a client `keep` says is gone.
    pub async fn give(
        &self,
        client: u128,
        first: u32,
        end: u32,
        keep: impl Fn(u128) -> bool,
    ) -> Result<(), ClientsError> {
        let _one = self.saving.lock().await;
        let saved: Saved = {
            let mut held = self.held.lock();
            held.retain(|c, _| *c == client || keep(*c));
            let ranges = held.entry(client).or_default();
            ranges.push_back((first, end));
            while ranges.len() > KEPT {
                ranges.pop_front();
            }
            held.iter()
                .flat_map(|(c, r)| r.iter().map(|(f, e)| (*c, *f, *e)))
                .collect()
        };
        let body =
            postcard::to_allocvec(&saved).map_err(|e| ClientsError::Damaged(e.to_string()))?;
        let mut out = Vec::with_capacity(12 + body.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        out.extend_from_slice(&body);
        let disk = self.disk.clone();
        if disk.in_memory() {
            disk.replace(FILE, &out)?;
        } else {
            tokio::task::spawn_blocking(move || disk.replace(FILE, &out))
                .await
                .map_err(|e| ClientsError::Damaged(e.to_string()))??;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::MemDisk;
    use proto::fid::INODE_SEQ;

    #[tokio::test]
    async fn ranges_survive_a_reopen_and_only_the_last_few_hold() {
        let disk: Arc<dyn MetaDisk> = Arc::new(MemDisk::new());
        let r = Reservations::open(disk.clone()).unwrap();
        let f = |oid| Fid::new(INODE_SEQ, oid, 0);
        r.give(7, 10, 20, |_| true).await.unwrap();
        r.give(8, 20, 30, |_| true).await.unwrap();
        assert!(r.holds(7, f(10)) && r.holds(7, f(19)));
        assert!(!r.holds(7, f(20)), "another client's range");
        assert!(!r.holds(7, Fid::new(INODE_SEQ + 1, 10, 0)));
        let again = Reservations::open(disk.clone()).unwrap();
        assert!(again.holds(7, f(15)) && again.holds(8, f(25)));
        for k in 0..KEPT as u32 {
            again
                .give(7, 100 + k * 10, 110 + k * 10, |_| true)
                .await
                .unwrap();
        }
        assert!(!again.holds(7, f(15)), "the oldest range lapsed");
        assert!(again.holds(7, f(100)));
        again.give(9, 500, 510, |c| c != 8).await.unwrap();
        assert!(
            !again.holds(8, f(25)),
            "a client gone from the table loses its ranges"
        );
    }
}
