//! The crash-simulating disk: each file is two images, what the program sees (`live`) and what
//! would survive a power cut (`durable`), plus the writes made since the last sync. A crash
//! throws the live images away; with a seed it first lets a random prefix of the unsynced
//! writes reach the durable image, the last of them torn at a random byte, as a disk that lost
//! power mid-write would. Operations can be made to fail with a chosen errno, a capacity makes
//! writes past it fail with ENOSPC, and syncs can be held back to stretch a commit.

use std::collections::{HashMap, VecDeque};
use std::io;

use parking_lot::{Condvar, Mutex};

use super::MetaDisk;

/// Which operations an injected failure applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    Sync,
    Replace,
}

#[derive(Clone, Debug)]
enum Change {
    Write(u64, Vec<u8>),
    SetLen(u64),
}

#[derive(Default, Clone)]
struct Image {
    live: Vec<u8>,
    /// `None`: the name itself would not survive a crash.
    durable: Option<Vec<u8>>,
    unsynced: Vec<Change>,
}

#[derive(Default)]
struct State {
    files: HashMap<String, Image>,
    failures: VecDeque<(Op, i32)>,
    capacity: Option<u64>,
    hold_syncs: bool,
    crashes: u64,
}

impl State {
    fn injected(&mut self, op: Op) -> io::Result<()> {
        if let Some(i) = self.failures.iter().position(|(o, _)| *o == op) {
            let errno = self.failures.remove(i).map_or(libc::EIO, |(_, e)| e);
            return Err(io::Error::from_raw_os_error(errno));
        }
        Ok(())
    }

    fn used_without(&self, name: &str) -> u64 {
        self.files
            .iter()
            .filter(|(n, _)| n.as_str() != name)
            .map(|(_, f)| f.live.len() as u64)
            .sum()
    }

    fn room_for(&self, name: &str, len: u64) -> io::Result<()> {
        match self.capacity {
            Some(cap) if self.used_without(name) + len > cap => {
                Err(io::Error::from_raw_os_error(libc::ENOSPC))
            }
            _ => Ok(()),
        }
    }
}

fn apply(image: &mut Vec<u8>, change: &Change) {
    match change {
        Change::Write(offset, bytes) => {
            let (at, end) = (*offset as usize, *offset as usize + bytes.len());
            if image.len() < end {
                image.resize(end, 0);
            }
            image[at..end].copy_from_slice(bytes);
        }
        Change::SetLen(len) => image.resize(*len as usize, 0),
    }
}

/// A disk in memory that can crash.
#[derive(Default)]
pub struct MemDisk {
    state: Mutex<State>,
    released: Condvar,
}

impl MemDisk {
    pub fn new() -> MemDisk {
        MemDisk::default()
    }

    /// Fails the next operation of kind `op` with `errno`.
    pub fn fail_next(&self, op: Op, errno: i32) {
        self.state.lock().failures.push_back((op, errno));
    }

    /// Bytes past which writes fail with ENOSPC (`None`: no limit).
    /// Bytes the files hold now.
    pub fn used(&self) -> u64 {
        self.state.lock().used_without("")
    }

    pub fn set_capacity(&self, bytes: Option<u64>) {
        self.state.lock().capacity = bytes;
    }

    /// While held, syncs wait (a slow disk); releasing lets them finish.
    pub fn hold_syncs(&self, hold: bool) {
        self.state.lock().hold_syncs = hold;
        self.released.notify_all();
    }

    /// How many times the disk crashed.
    pub fn crashes(&self) -> u64 {
        self.state.lock().crashes
    }

    /// A power cut: everything not synced is lost. With `tear`, a random prefix of each file's
    /// unsynced changes reaches the disk first, the last one cut at a random byte.
    pub fn crash(&self, tear: Option<u64>) {
        let mut st = self.state.lock();
        st.crashes += 1;
        st.hold_syncs = false;
        let mut rng = tear.map(|seed| seed | 1);
        let mut next = move || {
            rng.as_mut().map(|x| {
                *x ^= *x << 13;
                *x ^= *x >> 7;
                *x ^= *x << 17;
                *x
            })
        };
        let mut names: Vec<String> = st.files.keys().cloned().collect();
        names.sort();
        for name in names {
            let Some(f) = st.files.get_mut(&name) else {
                continue;
            };
            let mut durable = f.durable.take();
            if let (Some(image), Some(r)) = (durable.as_mut(), next()) {
                let keep = (r % (f.unsynced.len() as u64 + 1)) as usize;
                for (i, change) in f.unsynced.iter().take(keep + 1).enumerate() {
                    match change {
                        Change::Write(offset, bytes) if i == keep => {
                            let cut = next().map_or(0, |r| r % (bytes.len() as u64 + 1));
                            apply(
                                image,
                                &Change::Write(*offset, bytes[..cut as usize].to_vec()),
                            );
                        }
                        _ if i == keep => {}
                        c => apply(image, c),
                    }
                }
            }
            match durable {
                Some(image) => {
                    f.live = image.clone();
                    f.durable = Some(image);
                    f.unsynced.clear();
                }
                None => {
                    st.files.remove(&name);
                }
            }
        }
        self.released.notify_all();
    }

    fn change(&self, name: &str, change: Change) -> io::Result<()> {
        let mut st = self.state.lock();
        st.injected(Op::Write)?;
        let len = match &change {
            Change::Write(offset, bytes) => {
                let live = st.files.get(name).map_or(0, |f| f.live.len() as u64);
                live.max(offset + bytes.len() as u64)
            }
            Change::SetLen(len) => *len,
        };
        st.room_for(name, len)?;
        let f = st.files.entry(name.to_owned()).or_default();
        apply(&mut f.live, &change);
        f.unsynced.push(change);
        Ok(())
    }
}

impl MetaDisk for MemDisk {
    fn read(&self, name: &str) -> io::Result<Option<Vec<u8>>> {
        let mut st = self.state.lock();
        st.injected(Op::Read)?;
        Ok(st.files.get(name).map(|f| f.live.clone()))
    }

    fn write_at(&self, name: &str, offset: u64, bytes: &[u8]) -> io::Result<()> {
        self.change(name, Change::Write(offset, bytes.to_vec()))
    }

    fn set_len(&self, name: &str, len: u64) -> io::Result<()> {
        self.change(name, Change::SetLen(len))
    }

    fn sync(&self, name: &str) -> io::Result<()> {
        let mut st = self.state.lock();
        let crashes = st.crashes;
        while st.hold_syncs {
            self.released.wait(&mut st);
        }
        if st.crashes != crashes {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        st.injected(Op::Sync)?;
        if let Some(f) = st.files.get_mut(name) {
            f.durable = Some(f.live.clone());
            f.unsynced.clear();
        }
        Ok(())
    }

    fn replace(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        let mut st = self.state.lock();
        st.injected(Op::Replace)?;
        st.room_for(name, bytes.len() as u64)?;
        st.files.insert(
            name.to_owned(),
            Image {
                live: bytes.to_vec(),
                durable: Some(bytes.to_vec()),
                unsynced: vec![],
            },
        );
        Ok(())
    }

    fn in_memory(&self) -> bool {
        true
    }

    fn exists(&self, name: &str) -> io::Result<bool> {
        Ok(self.state.lock().files.contains_key(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crash_keeps_what_was_synced_and_nothing_else() {
        let d = MemDisk::new();
        d.write_at("j", 0, b"hello").unwrap();
        d.sync("j").unwrap();
        d.write_at("j", 5, b" world").unwrap();
        d.write_at("k", 0, b"never synced").unwrap();
        d.crash(None);
        assert_eq!(d.read("j").unwrap().unwrap(), b"hello");
        assert_eq!(d.read("k").unwrap(), None);
    }

    #[test]
    fn a_torn_crash_keeps_a_prefix_of_the_unsynced_writes() {
        for seed in 0..50 {
            let d = MemDisk::new();
            d.write_at("j", 0, b"ab").unwrap();
            d.sync("j").unwrap();
            d.write_at("j", 2, b"cdef").unwrap();
            d.write_at("j", 6, b"ghij").unwrap();
            d.crash(Some(seed));
            let got = d.read("j").unwrap().unwrap();
            assert!(b"abcdefghij".starts_with(&got), "{seed}: {got:?}");
            assert!(got.len() >= 2);
        }
    }

    #[test]
    fn injected_failures_and_a_full_disk_refuse_without_changing_anything() {
        let d = MemDisk::new();
        d.fail_next(Op::Sync, libc::EIO);
        d.write_at("j", 0, b"x").unwrap();
        assert_eq!(d.sync("j").unwrap_err().raw_os_error(), Some(libc::EIO));
        d.sync("j").unwrap();
        d.set_capacity(Some(4));
        let e = d.write_at("j", 0, b"too long").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
        assert_eq!(d.read("j").unwrap().unwrap(), b"x");
    }
}
