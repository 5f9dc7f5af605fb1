//! Which I/O a target's data goes through: the page cache or straight to the disk (O_DIRECT),
//! chosen per target from a measurement of its device, with an operator's override.
//!
//! Every data file is open both ways (see [`crate::object`]); an I/O up to a size limit goes
//! through the page cache, a larger one direct. Small I/O is always cached, as Lustre's OSS
//! caches it: a small file read soon after it was written costs no disk trip. For streams the
//! better choice depends on the device: on NVMe, direct I/O saves a copy and keeps the page
//! cache for what is reused, while some virtual disks take buffered writes, merged and queued
//! deep by the kernel's write-back, far faster than the same writes direct. So a target in
//! `auto` mode measures its device once (a few tens of MiB written and read both ways, with
//! the final sync) and keeps the result in its directory (`IO_PROFILE`); `lode-oss probe`
//! measures again.
//!
//! Durability is the same either way: an object's sync flushes the page cache's pages of its
//! data file and waits for the disk, whichever open wrote them.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::Instant;

use crate::engine::AlignedBuf;

/// I/Os up to this size go through the page cache whatever the mode.
pub const SMALL_IO: u64 = 256 << 10;
/// The file in a target's directory holding its device's measurement.
pub const PROFILE_FILE: &str = "IO_PROFILE";
/// How much faster buffered I/O must be than direct for streams to take it: direct costs the
/// servers no copy, so a tie goes to it.
pub const BUFFERED_MARGIN: f64 = 1.15;
/// Bytes written and read each way by a probe, in [`PROBE_IO`] pieces from [`PROBE_THREADS`]
/// threads, as a stream's requests reach a storage server.
pub const PROBE_BYTES: u64 = 64 << 20;
pub const PROBE_IO: u64 = 1 << 20;
pub const PROBE_THREADS: u64 = 4;

/// Size limits of the page cache's share of one target's I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoPolicy {
    /// Reads up to this many bytes go through the page cache, larger ones direct.
    pub cache_max_read: u64,
    /// Writes (and the reads of their edge blocks) up to this many bytes likewise.
    pub cache_max_write: u64,
}

impl IoPolicy {
    /// Streams direct, small I/O cached.
    pub const DIRECT: IoPolicy = IoPolicy {
        cache_max_read: SMALL_IO,
        cache_max_write: SMALL_IO,
    };
    /// Everything through the page cache.
    pub const BUFFERED: IoPolicy = IoPolicy {
        cache_max_read: u64::MAX,
        cache_max_write: u64::MAX,
    };

    fn name(limit: u64) -> &'static str {
        if limit == u64::MAX {
            "buffered"
        } else {
            "direct"
        }
    }

    /// How streaming reads go: `direct` or `buffered`.
    pub fn reads(&self) -> &'static str {
        Self::name(self.cache_max_read)
    }

    /// How streaming writes go.
    pub fn writes(&self) -> &'static str {
        Self::name(self.cache_max_write)
    }
}

impl Default for IoPolicy {
    fn default() -> Self {
        IoPolicy::DIRECT
    }
}

/// What a server's targets run with: measured, or the operator's word.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IoMode {
    /// Each target by its device's measurement (made once, kept in the target).
    #[default]
    Auto,
    /// Streams direct.
    Direct,
    /// Everything through the page cache.
    Buffered,
}

impl std::str::FromStr for IoMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(IoMode::Auto),
            "direct" => Ok(IoMode::Direct),
            "buffered" => Ok(IoMode::Buffered),
            _ => Err(format!("unknown I/O mode {s:?} (auto, direct or buffered)")),
        }
    }
}

/// One device's measured rates, in bytes per second (writes to durability).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IoProfile {
    pub direct_write: f64,
    pub buffered_write: f64,
    pub direct_read: f64,
    pub buffered_read: f64,
}

impl IoProfile {
    /// The policy the figures call for: buffered where it beats direct by the margin.
    pub fn choose(&self) -> IoPolicy {
        let pick = |buffered: f64, direct: f64| {
            if buffered >= direct * BUFFERED_MARGIN {
                u64::MAX
            } else {
                SMALL_IO
            }
        };
        IoPolicy {
            cache_max_read: pick(self.buffered_read, self.direct_read),
            cache_max_write: pick(self.buffered_write, self.direct_write),
        }
    }

    fn to_text(self) -> String {
        format!(
            "# The device's rates measured by lode-oss (MB/s); `lode-oss probe` measures again.\n\
             direct_write {:.1}\nbuffered_write {:.1}\ndirect_read {:.1}\nbuffered_read {:.1}\n",
            self.direct_write / 1e6,
            self.buffered_write / 1e6,
            self.direct_read / 1e6,
            self.buffered_read / 1e6,
        )
    }

    fn parse(text: &str) -> Option<IoProfile> {
        let mut v = [None; 4];
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let mut it = line.split_whitespace();
            let (Some(k), Some(x), None) = (it.next(), it.next(), it.next()) else {
                continue;
            };
            let i = match k {
                "direct_write" => 0,
                "buffered_write" => 1,
                "direct_read" => 2,
                "buffered_read" => 3,
                _ => continue,
            };
            v[i] = x
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x > 0.0)
                .map(|x| x * 1e6);
        }
        Some(IoProfile {
            direct_write: v[0]?,
            buffered_write: v[1]?,
            direct_read: v[2]?,
            buffered_read: v[3]?,
        })
    }

    /// The profile kept in target directory `root`, if there is a readable one.
    pub fn load(root: &Path) -> Option<IoProfile> {
        Self::parse(&std::fs::read_to_string(root.join(PROFILE_FILE)).ok()?)
    }

    /// Keeps the profile in `root` (written aside and renamed, so a crash leaves the old or
    /// the new one; a lost one is measured again).
    pub fn save(&self, root: &Path) -> io::Result<()> {
        let tmp = root.join(format!("{PROFILE_FILE}.tmp"));
        std::fs::write(&tmp, self.to_text())?;
        std::fs::rename(&tmp, root.join(PROFILE_FILE))
    }

    /// Measures the device under `root`: the same bytes written (with the final sync) and
    /// read cold, direct and buffered, in two rounds in turned order, the better of each
    /// kept. Uses a scratch file it removes. Blocking: seconds on a slow disk.
    pub fn measure(root: &Path) -> io::Result<IoProfile> {
        let path = root.join("IO_PROBE.tmp");
        let _lock = DeviceLock::take(root);
        let r = (|| {
            let direct = open(&path, true)?;
            let buffered = open(&path, false)?;
            let mut best = [0f64; 4];
            for round in 0..2 {
                let order: [bool; 2] = if round == 0 {
                    [true, false]
                } else {
                    [false, true]
                };
                for d in order {
                    let f = if d { &direct } else { &buffered };
                    let w = timed(|| write_all(f))?;
                    drop_cache(&buffered);
                    let r = timed(|| read_all(f))?;
                    drop_cache(&buffered);
                    let (wi, ri) = if d { (0, 2) } else { (1, 3) };
                    best[wi] = best[wi].max(w);
                    best[ri] = best[ri].max(r);
                }
            }
            Ok(IoProfile {
                direct_write: best[0],
                buffered_write: best[1],
                direct_read: best[2],
                buffered_read: best[3],
            })
        })();
        let _ = std::fs::remove_file(&path);
        r
    }
}

impl IoMode {
    /// The policy of the target in directory `root` under this mode. `Auto` takes the
    /// profile kept there, or measures the device and keeps the result; a target whose
    /// engine is not on a disk (`on_disk` false), or whose measurement fails, runs direct.
    pub async fn policy(self, root: &Path, on_disk: bool) -> IoPolicy {
        match self {
            IoMode::Direct => IoPolicy::DIRECT,
            IoMode::Buffered => IoPolicy::BUFFERED,
            IoMode::Auto if !on_disk => IoPolicy::DIRECT,
            IoMode::Auto => {
                let profile = match IoProfile::load(root) {
                    Some(p) => Ok(p),
                    None => {
                        let root = root.to_owned();
                        tokio::task::spawn_blocking(move || {
                            let p = IoProfile::measure(&root)?;
                            p.save(&root)?;
                            tracing::info!(target = %root.display(), profile = ?p, "measured the target's device");
                            Ok::<_, io::Error>(p)
                        })
                        .await
                        .unwrap_or_else(|e| Err(io::Error::other(e)))
                    }
                };
                match profile {
                    Ok(p) => p.choose(),
                    Err(e) => {
                        tracing::warn!(target = %root.display(), error = %e, "could not measure the target's device; streams go direct");
                        IoPolicy::DIRECT
                    }
                }
            }
        }
    }
}

/// Serializes probes of one device among the servers of this machine (several servers on
/// one disk, started at once, would each measure a share of it). Best effort: without the
/// lock file, probes run unserialized.
struct DeviceLock {
    _file: Option<File>,
}

impl DeviceLock {
    fn take(root: &Path) -> DeviceLock {
        use std::os::unix::fs::MetadataExt;
        let Ok(dev) = std::fs::metadata(root).map(|m| m.dev()) else {
            return DeviceLock { _file: None };
        };
        let path = std::env::temp_dir().join(format!("lode-io-probe-{dev:x}.lock"));
        let Ok(f) = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
        else {
            return DeviceLock { _file: None };
        };
        // SAFETY: flock on a descriptor this function owns; released when it is closed.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return DeviceLock { _file: None };
        }
        DeviceLock { _file: Some(f) }
    }
}

fn open(path: &Path, direct: bool) -> io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true).write(true).create(true).truncate(false);
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    let f = o.open(path)?;
    if !direct {
        // As a target's cached open: no readahead (see `crate::object`).
        // SAFETY: an advice on a descriptor this function owns.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
    }
    Ok(f)
}

/// Bytes per second of `f`'s run over [`PROBE_BYTES`].
fn timed(f: impl FnOnce() -> io::Result<()>) -> io::Result<f64> {
    let t = Instant::now();
    f()?;
    Ok(PROBE_BYTES as f64 / t.elapsed().as_secs_f64().max(1e-6))
}

/// Each thread takes every [`PROBE_THREADS`]th piece, as a stream's requests arrive.
fn each_piece(
    f: &File,
    op: impl Fn(&File, &mut AlignedBuf, u64) -> io::Result<()> + Sync,
) -> io::Result<()> {
    let pieces = PROBE_BYTES / PROBE_IO;
    std::thread::scope(|s| {
        let op = &op;
        let handles: Vec<_> = (0..PROBE_THREADS)
            .map(|t| {
                s.spawn(move || {
                    let mut buf = AlignedBuf::zeroed(PROBE_IO as usize);
                    buf.fill(0x5a);
                    (t..pieces)
                        .step_by(PROBE_THREADS as usize)
                        .try_for_each(|p| op(f, &mut buf, p * PROBE_IO))
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or_else(|_| Err(io::Error::other("probe thread panicked")))
        })
    })
}

fn write_all(f: &File) -> io::Result<()> {
    each_piece(f, |f, buf, at| f.write_all_at(buf, at))?;
    f.sync_data()
}

fn read_all(f: &File) -> io::Result<()> {
    each_piece(f, |f, buf, at| f.read_exact_at(buf, at))
}

fn drop_cache(f: &File) {
    // SAFETY: an advice on a descriptor the caller owns.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_chooses_buffered_only_past_the_margin() {
        let p = IoProfile {
            direct_write: 100e6,
            buffered_write: 110e6,
            direct_read: 100e6,
            buffered_read: 200e6,
        };
        let c = p.choose();
        assert_eq!(c.cache_max_write, SMALL_IO);
        assert_eq!(c.cache_max_read, u64::MAX);
        assert_eq!((c.writes(), c.reads()), ("direct", "buffered"));
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("lode-io-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_profile_is_kept_and_read_back_and_a_damaged_one_is_none() {
        let dir = scratch("profile");
        assert_eq!(IoProfile::load(&dir), None);
        let p = IoProfile {
            direct_write: 312.5e6,
            buffered_write: 801.2e6,
            direct_read: 650.0e6,
            buffered_read: 610.3e6,
        };
        p.save(&dir).unwrap();
        assert_eq!(IoProfile::load(&dir), Some(p));
        std::fs::write(
            dir.join(PROFILE_FILE),
            "direct_write 12\nbuffered_write x\n",
        )
        .unwrap();
        assert_eq!(IoProfile::load(&dir), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_measurement_of_this_disk_gives_rates_and_leaves_no_file() {
        let dir = scratch("measure");
        let p = IoProfile::measure(&dir).unwrap();
        for r in [
            p.direct_write,
            p.buffered_write,
            p.direct_read,
            p.buffered_read,
        ] {
            assert!(r > 0.0 && r.is_finite(), "{p:?}");
        }
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
