//! Encrypted files: contents encrypted per unit ([`proto::crypt::UNIT`]) on their way to the
//! servers and decrypted on their way back, so that every path above (the library, the mount,
//! Python, GPU staging) reads and writes clear bytes and every path below (stripes, mirrors,
//! Data-on-MDT, checksums, resync, HSM) moves ciphertext.
//!
//! A write that covers its units whole (or ends at the end of the file) is encrypted and sent
//! as it is. One that covers part of a unit reads the unit, decrypts it, changes it and
//! writes it whole (under the file's write turn on this client); so does the unit that was
//! the file's last when a write or a truncate moves the end past it, since a unit's
//! encryption depends on its length.

use super::*;
use crate::crypt::Contents;
use proto::crypt::UNIT;

/// A file's contents cipher, as its open found it.
pub(super) enum Cipher {
    Clear,
    Key(Arc<Contents>),
    /// Encrypted under a key this client does not hold: the error to give.
    Locked(FsErrorKind, String),
}

impl Cipher {
    pub(super) fn of(client: &Client, inode: &Inode) -> Cipher {
        match client.contents_of(inode) {
            Ok(None) => Cipher::Clear,
            Ok(Some(c)) => Cipher::Key(Arc::new(c)),
            Err(ClientError::Fs { kind, what }) => Cipher::Locked(kind, what),
            Err(e) => Cipher::Locked(e.kind(), e.to_string()),
        }
    }
}

fn floor(at: u64) -> u64 {
    at / UNIT * UNIT
}

/// Buffers whole-unit writes are encrypted into, kept for the next ones.
static SPARE: parking_lot::Mutex<Vec<Vec<u8>>> = parking_lot::Mutex::new(Vec::new());
/// Spare buffers kept, at most, and the largest kept.
const SPARE_KEPT: usize = 16;
const SPARE_MAX: usize = 16 << 20;

/// An empty buffer with room for `n` bytes: a spare one if one is large enough.
fn take_spare(n: usize) -> Vec<u8> {
    let mut spare = SPARE.lock();
    match spare.iter().position(|b| b.capacity() >= n) {
        Some(i) => {
            let mut b = spare.swap_remove(i);
            b.clear();
            b
        }
        None => Vec::with_capacity(n),
    }
}

/// Keeps `r`'s buffer for a later write, once nothing else holds it.
async fn give_spare(r: Arc<Registered<Vec<u8>>>) {
    let Ok(r) = Arc::try_unwrap(r) else {
        return;
    };
    let b = r.deregister().await;
    let mut spare = SPARE.lock();
    if b.capacity() <= SPARE_MAX && spare.len() < SPARE_KEPT {
        spare.push(b);
    }
}

/// Below this, a buffer is encrypted or decrypted on the calling thread alone.
const SPREAD_MIN: usize = 2 << 20;

/// Runs `f` on `buf` (units from unit 0 of it on), split at unit boundaries over the CPUs when
/// it is large: `f` gets each part's first unit (counted from the buffer's) and the part.
fn spread<F>(buf: &mut [u8], f: F) -> Result<()>
where
    F: Fn(u64, &mut [u8]) -> std::result::Result<(), crate::crypt::CryptError> + Sync,
{
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    let map = |e: crate::crypt::CryptError| ClientError::fs(FsErrorKind::Io, e.to_string());
    if buf.len() < SPREAD_MIN || cpus == 1 {
        return f(0, buf).map_err(map);
    }
    let per = buf.len().div_ceil(cpus).div_ceil(UNIT as usize) * UNIT as usize;
    std::thread::scope(|s| {
        let f = &f;
        let parts: Vec<_> = buf
            .chunks_mut(per)
            .enumerate()
            .map(|(i, part)| s.spawn(move || f((i * per) as u64 / UNIT, part)))
            .collect();
        parts
            .into_iter()
            .try_for_each(|p| p.join().expect("a cipher thread does not panic"))
    })
    .map_err(map)
}

impl File {
    /// The file's contents cipher: `None` for a file in clear, an error without its key.
    pub(super) fn contents(&self) -> Result<Option<Arc<Contents>>> {
        match &self.cipher {
            Cipher::Clear => Ok(None),
            Cipher::Key(c) => Ok(Some(c.clone())),
            Cipher::Locked(kind, what) => Err(ClientError::fs(*kind, what.clone())),
        }
    }

    /// Whether the file's contents are encrypted.
    pub fn encrypted(&self) -> bool {
        !matches!(self.cipher, Cipher::Clear)
    }

    /// The clear bytes of `[at, at + len)`, `at` a unit's start, as far as the file reaches.
    async fn read_plain(&self, c: &Contents, at: u64, len: u64) -> Result<Vec<u8>> {
        let region = self.client.register(vec![0u8; len as usize])?;
        let n = self.read_raw(at, &region, 0, len).await?;
        let mut buf = region.read(0, n as u64)?.as_slice().to_vec();
        spread(&mut buf, |first, part| c.decrypt(at / UNIT + first, part))?;
        Ok(buf)
    }

    /// The size the file had at its open (or as this handle last set it).
    fn opened_size(&self) -> u64 {
        self.inode.lock().size
    }

    /// [`File::read_into`] of an encrypted file: its whole units read and decrypted, the
    /// range asked copied out.
    pub(super) async fn read_decrypted<B: std::any::Any + Send + Sync>(
        &self,
        c: &Contents,
        offset: u64,
        region: &Registered<B>,
        region_offset: u64,
        len: u64,
    ) -> Result<usize> {
        let turn = self.client.inner.writes.cipher_turn(self.fid());
        let _shared = turn.lock.read().await;
        let size = turn.stored(self.readable_size());
        if offset >= size || len == 0 {
            return Ok(0);
        }
        let len = len.min(size - offset);
        // Whole units into host memory: read where they go and decrypted there.
        let whole = offset % UNIT == 0 && (len % UNIT == 0 || offset + len == size);
        if whole && region.kind() == lnet::MemoryKind::Host {
            let n = self.read_raw(offset, region, region_offset, len).await?;
            let mut at = region.write(region_offset, n as u64)?;
            let buf = at.as_mut_slice().expect("taken for writing");
            spread(buf, |first, part| c.decrypt(offset / UNIT + first, part))?;
            return Ok(n);
        }
        let a = floor(offset);
        let b = (offset + len).div_ceil(UNIT).saturating_mul(UNIT).min(size);
        let plain = self.read_plain(c, a, b - a).await?;
        let skip = (offset - a) as usize;
        if plain.len() <= skip {
            return Ok(0);
        }
        let n = (plain.len() - skip).min(len as usize);
        region
            .dma(region_offset, n as u64, true)?
            .copy_in(&plain[skip..skip + n])?;
        Ok(n)
    }

    /// [`File::write_from`] of an encrypted file.
    pub(super) async fn write_encrypted<B: std::any::Any + Send + Sync>(
        &self,
        c: &Contents,
        offset: u64,
        region: &Registered<B>,
        region_offset: u64,
        len: u64,
    ) -> Result<u64> {
        if !self.writable {
            return Err(ClientError::fs(
                FsErrorKind::BadHandle,
                "the file is not open for writing",
            ));
        }
        if region_offset
            .checked_add(len)
            .is_none_or(|e| e > region.len())
        {
            return Err(ClientError::fs(
                FsErrorKind::Invalid,
                "the write does not fit the region",
            ));
        }
        if len == 0 {
            return Ok(offset);
        }
        let fid = self.fid();
        let turn = self.client.inner.writes.cipher_turn(fid);
        let opened = self.opened_size();
        // Whole units, where no unit cut short by the end is touched: with other such
        // writes and reads, nothing read first.
        if !self.append && offset % UNIT == 0 && len % UNIT == 0 {
            let end = offset.checked_add(len).ok_or_else(|| {
                ClientError::fs(FsErrorKind::FileTooLarge, "past the file size limit")
            })?;
            let _shared = turn.lock.read().await;
            let stored = turn.stored(opened);
            if stored % UNIT == 0 || end <= floor(stored) {
                // Encrypted in one pass from the caller's memory into a buffer kept for the
                // next write (a fresh one costs more in page faults than the cipher).
                let mut out = take_spare(len as usize);
                c.encrypt_to(
                    offset / UNIT,
                    region.read(region_offset, len)?.as_slice(),
                    &mut out,
                )
                .map_err(|e| ClientError::fs(FsErrorKind::Io, e.to_string()))?;
                let out = Arc::new(self.client.register(out)?);
                self.write_placed(offset, out.clone(), 0, len, false)
                    .await?;
                turn.grew_to(opened, end);
                give_spare(out).await;
                return Ok(offset);
            }
        }
        let data = region.read(region_offset, len)?.as_slice().to_vec();
        let _alone = turn.lock.write().await;
        tracing::debug!(%fid, offset, len, "an encrypted write of part of a unit, or past the last");
        let size = turn.stored(opened);
        let offset = if self.append { size } else { offset };
        let end = offset.checked_add(len).ok_or_else(|| {
            ClientError::fs(FsErrorKind::FileTooLarge, "past the file size limit")
        })?;
        let new_size = size.max(end);
        // The file's last unit, cut short, now has more after it: as long as it now reaches,
        // the bytes past the old end zeros.
        let last = floor(size);
        if size % UNIT != 0 && floor(offset) > last {
            let mut p = self.read_plain(c, last, size - last).await?;
            p.resize(UNIT.min(new_size - last) as usize, 0);
            self.put_units(c, last, p).await?;
        }
        let a = floor(offset);
        let b = end.div_ceil(UNIT).saturating_mul(UNIT).min(new_size);
        let mut buf = vec![0u8; (b - a) as usize];
        let mut head: Option<Vec<u8>> = None;
        if a < offset && a < size {
            let old = self.read_plain(c, a, UNIT.min(size - a)).await?;
            let n = old.len().min((offset - a) as usize);
            buf[..n].copy_from_slice(&old[..n]);
            head = Some(old);
        }
        if end < b {
            let t = floor(end);
            let old = match head.take() {
                Some(old) if t == a => old,
                _ => self.read_plain(c, t, UNIT.min(size - t)).await?,
            };
            let from = (end - t) as usize;
            if old.len() > from {
                let n = (old.len() - from).min((b - end) as usize);
                let at = (end - a) as usize;
                buf[at..at + n].copy_from_slice(&old[from..from + n]);
            }
        }
        buf[(offset - a) as usize..(end - a) as usize].copy_from_slice(&data);
        self.put_units(c, a, buf).await?;
        turn.set(new_size);
        if self.append {
            self.publish_size().await?;
        }
        Ok(offset)
    }

    /// Encrypts `plain`, the units from `at` on, and writes them.
    async fn put_units(&self, c: &Contents, at: u64, mut plain: Vec<u8>) -> Result<()> {
        if plain.is_empty() {
            return Ok(());
        }
        spread(&mut plain, |first, part| c.encrypt(at / UNIT + first, part))?;
        let n = plain.len() as u64;
        let region = Arc::new(self.client.register(plain)?);
        self.write_placed(at, region, 0, n, false).await?;
        Ok(())
    }

    /// Changes the length of an encrypted file to `size`, `cut` doing it on the servers: the
    /// unit that is to be its last, cut short, is encrypted again at its new length first
    /// (truncated, or grown with zeros).
    pub(super) async fn resize_encrypted<F, Fut>(
        &self,
        c: &Contents,
        size: u64,
        cut: F,
    ) -> Result<()>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<()>>,
    {
        let turn = self.client.inner.writes.cipher_turn(self.fid());
        let _alone = turn.lock.write().await;
        let old = turn.stored(self.opened_size());
        let last = floor(size);
        if size > old {
            // The unit that was last, cut short: as long as it now reaches, zeros after.
            let o = floor(old);
            if old % UNIT != 0 {
                let mut q = self.read_plain(c, o, old - o).await?;
                q.resize(UNIT.min(size - o) as usize, 0);
                self.put_units(c, o, q).await?;
            }
            // A new last unit cut short: zeros, written (one under 16 bytes is no hole).
            if size % UNIT != 0 && last > o {
                self.put_units(c, last, vec![0u8; (size - last) as usize])
                    .await?;
            }
        } else if size < old && size % UNIT != 0 {
            let mut p = self.read_plain(c, last, UNIT.min(old - last)).await?;
            p.truncate((size - last) as usize);
            self.put_units(c, last, p).await?;
        }
        cut().await?;
        turn.set(size);
        Ok(())
    }
}
