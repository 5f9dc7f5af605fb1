//! Registered memory: the regions a node exposes to remote peers for bulk transfers.
//!
//! As with an RDMA NIC, the owner registers a buffer and gets a key; a peer that presents the
//! key may read or write any range inside the region, and nothing else. Bytes land directly in
//! the owner's buffer (a socket read on TCP, one copy on the simulated fabric), so a caller's
//! buffer (later GPU memory) is the destination, with no staging copy.
//!
//! Accesses hold a range lock for as long as they touch the memory: readers may share a range,
//! a writer excludes everyone on its range, and a conflicting access is refused (never waited
//! for: two transfers on one range is a protocol bug a NIC would turn into corrupt data).
//! Deregistration removes the key at once and waits for accesses in flight to finish.
//!
//! A region may also be device memory ([`RegionTable::register_device`]): its bytes are
//! moved only through the device's DMA engine ([`DmaAccess`]), and every CPU view of it
//! ([`RegionTable::access`], [`Registered::read`]) is refused.

use std::any::Any;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use concur::range::{RangeLocks, Refused};
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::device::{DeviceDma, DeviceMemory, MemoryKind};
use crate::error::RegionError;

/// Memory that can be registered for bulk transfers.
///
/// # Safety
/// `dma_ptr` must return a pointer valid for reads and writes of `dma_len` bytes for as long as
/// the value lives, and that pointer must not change when the value is moved (heap memory, not
/// an inline array). Nothing else may touch that memory while the value is registered.
pub unsafe trait DmaBuffer: Any + Send + Sync {
    fn dma_ptr(&mut self) -> *mut u8;
    fn dma_len(&self) -> usize;
}

// SAFETY: a Vec's heap buffer does not move when the Vec is moved, and the registered Vec is
// owned by the region, so nobody can grow it.
unsafe impl DmaBuffer for Vec<u8> {
    fn dma_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn dma_len(&self) -> usize {
        self.len()
    }
}

// SAFETY: as for Vec: heap memory, fixed length.
unsafe impl DmaBuffer for Box<[u8]> {
    fn dma_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn dma_len(&self) -> usize {
        self.len()
    }
}

/// Most ranges locked at once in one region; past it, accesses are refused as conflicts.
pub const MAX_ACCESSES_PER_REGION: usize = 1024;
/// Most regions registered at once on one node.
pub const MAX_REGIONS: usize = 65536;

struct RegionInner {
    key: u64,
    /// Host memory: its address. Device memory: null, never dereferenced.
    ptr: *mut u8,
    len: u64,
    /// Device memory: its address on the device, its ordinal, and the engine that reaches it.
    device: Option<(u64, u32, Arc<dyn DeviceDma>)>,
    /// Owns the memory `ptr` points into; taken back on deregistration.
    owner: Mutex<Option<Box<dyn Any + Send + Sync>>>,
    /// The ranges transfers hold; revoked when the owner lets go of the region.
    locks: RangeLocks,
    idle: Notify,
}

// SAFETY: `ptr` points into memory owned by `owner`, which lives as long as this struct. Every
// dereference of `ptr` happens through a `RegionAccess`, whose range lock guarantees that no
// two accesses with a writer among them overlap, so sharing across threads is sound.
unsafe impl Send for RegionInner {}
unsafe impl Sync for RegionInner {}

impl RegionInner {
    /// The end of `offset..offset+len`, if the range lies inside the region.
    fn check_bounds(&self, offset: u64, len: u64) -> Result<u64, RegionError> {
        let oob = || RegionError::OutOfBounds {
            key: self.key,
            offset,
            len,
            size: self.len,
        };
        offset
            .checked_add(len)
            .filter(|&end| end <= self.len)
            .ok_or_else(oob)
    }

    /// Refuses a CPU view of device memory.
    fn host_only(&self) -> Result<(), RegionError> {
        match self.device {
            Some(_) => Err(RegionError::DeviceMemory { key: self.key }),
            None => Ok(()),
        }
    }

    fn kind(&self) -> MemoryKind {
        match &self.device {
            Some((_, ordinal, _)) => MemoryKind::Device { ordinal: *ordinal },
            None => MemoryKind::Host,
        }
    }

    fn lock(
        self: &Arc<Self>,
        offset: u64,
        len: u64,
        write: bool,
    ) -> Result<RegionAccess, RegionError> {
        let end = self.check_bounds(offset, len)?;
        let id = match self.locks.lock(offset, end, write) {
            Ok(id) => id,
            // Deregistered: the memory may be back with its owner already.
            Err(Refused::Revoked) => return Err(RegionError::UnknownKey { key: self.key }),
            Err(Refused::Conflict | Refused::Full) => {
                return Err(RegionError::Conflict {
                    key: self.key,
                    offset,
                    len,
                })
            }
        };
        Ok(RegionAccess {
            region: self.clone(),
            id,
            offset,
            len: len as usize,
            write,
        })
    }

    async fn wait_idle(&self) {
        loop {
            let notified = self.idle.notified();
            if self.locks.is_idle() {
                return;
            }
            notified.await;
        }
    }
}

/// A locked range of a region. Reads (and for a write lock, writes) go straight to the
/// registered memory. Dropping it releases the range.
pub struct RegionAccess {
    region: Arc<RegionInner>,
    id: u64,
    offset: u64,
    len: usize,
    write: bool,
}

impl RegionAccess {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the range is inside the region (checked in `lock`), the memory is alive
        // (we hold the region), and no writer overlaps it (the range lock).
        unsafe { std::slice::from_raw_parts(self.region.ptr.add(self.offset as usize), self.len) }
    }

    /// The range as mutable memory; `None` unless the access was taken for writing.
    pub fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        // SAFETY: as in `as_slice`, and this access is the only one on its range because it
        // holds the write lock; `&mut self` keeps the slice unique on our side.
        self.write.then(|| unsafe {
            std::slice::from_raw_parts_mut(self.region.ptr.add(self.offset as usize), self.len)
        })
    }
}

impl Drop for RegionAccess {
    fn drop(&mut self) {
        if self.region.locks.unlock(self.id) {
            self.region.idle.notify_waiters();
        }
    }
}

/// A locked range of a region of either kind, as a NIC reaches it: bytes are copied in and
/// out (through the device's DMA engine for device memory), never viewed by the CPU.
pub struct DmaAccess {
    access: RegionAccess,
}

impl DmaAccess {
    pub fn len(&self) -> usize {
        self.access.len
    }

    pub fn is_empty(&self) -> bool {
        self.access.len == 0
    }

    /// Where the memory is.
    pub fn kind(&self) -> MemoryKind {
        self.access.region.kind()
    }

    fn device_error(e: crate::device::DeviceError) -> RegionError {
        RegionError::Device(e.to_string())
    }

    /// Copies `src` (the access's length) into the range; refused unless taken for writing.
    pub fn copy_in(&mut self, src: &[u8]) -> Result<(), RegionError> {
        let a = &mut self.access;
        if src.len() != a.len || !a.write {
            return Err(RegionError::Conflict {
                key: a.region.key,
                offset: a.offset,
                len: src.len() as u64,
            });
        }
        match &a.region.device {
            Some((addr, _, dma)) => dma.write(addr + a.offset, src).map_err(Self::device_error),
            None => {
                a.as_mut_slice().unwrap_or_default().copy_from_slice(src);
                Ok(())
            }
        }
    }

    /// Fills the range with zeros (a hole read); refused unless taken for writing.
    pub fn zero(&mut self) -> Result<(), RegionError> {
        const CHUNK: usize = 64 << 10;
        static ZEROS: [u8; CHUNK] = [0; CHUNK];
        let a = &mut self.access;
        if !a.write {
            return Err(RegionError::Conflict {
                key: a.region.key,
                offset: a.offset,
                len: a.len as u64,
            });
        }
        match &a.region.device {
            Some((addr, _, dma)) => {
                let mut at = 0;
                while at < a.len {
                    let n = CHUNK.min(a.len - at);
                    dma.write(addr + a.offset + at as u64, &ZEROS[..n])
                        .map_err(Self::device_error)?;
                    at += n;
                }
                Ok(())
            }
            None => {
                a.as_mut_slice().unwrap_or_default().fill(0);
                Ok(())
            }
        }
    }

    /// Copies the first `n` bytes of `src` into the start of the range, as a transfer that
    /// broke off after `n` bytes leaves it.
    pub fn copy_in_prefix(&mut self, src: &[u8], n: usize) -> Result<(), RegionError> {
        let n = n.min(src.len()).min(self.access.len);
        let a = &mut self.access;
        if !a.write {
            return Err(RegionError::Conflict {
                key: a.region.key,
                offset: a.offset,
                len: n as u64,
            });
        }
        match &a.region.device {
            Some((addr, _, dma)) => dma
                .write(addr + a.offset, &src[..n])
                .map_err(Self::device_error),
            None => {
                a.as_mut_slice().unwrap_or_default()[..n].copy_from_slice(&src[..n]);
                Ok(())
            }
        }
    }

    /// The range's bytes.
    pub fn copy_out(&self) -> Result<Vec<u8>, RegionError> {
        let a = &self.access;
        match &a.region.device {
            Some((addr, _, dma)) => {
                let mut out = vec![0u8; a.len];
                dma.read(addr + a.offset, &mut out)
                    .map_err(Self::device_error)?;
                Ok(out)
            }
            None => Ok(a.as_slice().to_vec()),
        }
    }
}

/// The regions one node has registered, by key.
pub struct RegionTable {
    regions: Mutex<HashMap<u64, Arc<RegionInner>>>,
    /// Keys derived from a salt (a simulated node, which must replay exactly), or drawn from
    /// the operating system's random source (`None`).
    salt: Option<u64>,
    next: AtomicU64,
}

impl RegionTable {
    /// A table whose keys are derived from `salt`, so that keys from a previous incarnation of
    /// the node (another salt) do not match.
    pub fn new(salt: u64) -> Arc<Self> {
        Arc::new(RegionTable {
            regions: Mutex::new(HashMap::new()),
            salt: Some(salt),
            next: AtomicU64::new(1),
        })
    }

    /// A table whose keys are drawn at random (a CSPRNG), so that a peer cannot guess the key
    /// of a buffer it was not given.
    pub fn random() -> Arc<Self> {
        Arc::new(RegionTable {
            regions: Mutex::new(HashMap::new()),
            salt: None,
            next: AtomicU64::new(1),
        })
    }

    fn new_key(&self, taken: &HashMap<u64, Arc<RegionInner>>) -> u64 {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        match self.salt {
            // An odd multiplier is a bijection on u64, so keys never repeat within one table.
            Some(salt) => salt ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15),
            None => loop {
                let mut b = [0u8; 8];
                let key = match aws_lc_rs::rand::fill(&mut b) {
                    Ok(()) => u64::from_ne_bytes(b),
                    // The system's random source does not fail in practice; thread-local
                    // ChaCha seeded from it is the fallback.
                    Err(_) => rand::random(),
                };
                if key != 0 && !taken.contains_key(&key) {
                    break key;
                }
            },
        }
    }

    /// Registers `buf`; peers reach it through the returned handle's key.
    pub fn register<B: DmaBuffer>(self: &Arc<Self>, buf: B) -> Result<Registered<B>, RegionError> {
        let mut boxed = Box::new(buf);
        let ptr = boxed.dma_ptr();
        let len = boxed.dma_len() as u64;
        let mut regions = self.regions.lock();
        let key = self.new_key(&regions);
        let inner = Arc::new(RegionInner {
            key,
            ptr,
            len,
            device: None,
            owner: Mutex::new(Some(boxed)),
            locks: RangeLocks::new(MAX_ACCESSES_PER_REGION),
            idle: Notify::new(),
        });
        if regions.len() >= MAX_REGIONS {
            return Err(RegionError::Conflict {
                key,
                offset: 0,
                len,
            });
        }
        regions.insert(key, inner.clone());
        Ok(Registered {
            table: self.clone(),
            inner,
            _buf: PhantomData,
        })
    }

    /// Registers device memory; peers reach it through the returned handle's key, and only
    /// through [`RegionTable::access_dma`].
    pub fn register_device(
        self: &Arc<Self>,
        mem: DeviceMemory,
    ) -> Result<Registered<DeviceMemory>, RegionError> {
        let mut regions = self.regions.lock();
        let key = self.new_key(&regions);
        if regions.len() >= MAX_REGIONS {
            return Err(RegionError::Conflict {
                key,
                offset: 0,
                len: mem.len,
            });
        }
        let inner = Arc::new(RegionInner {
            key,
            ptr: std::ptr::null_mut(),
            len: mem.len,
            device: Some((mem.addr, mem.ordinal, mem.dma.clone())),
            owner: Mutex::new(Some(Box::new(mem))),
            locks: RangeLocks::new(MAX_ACCESSES_PER_REGION),
            idle: Notify::new(),
        });
        regions.insert(key, inner.clone());
        Ok(Registered {
            table: self.clone(),
            inner,
            _buf: PhantomData,
        })
    }

    fn lookup(&self, key: u64) -> Result<Arc<RegionInner>, RegionError> {
        self.regions
            .lock()
            .get(&key)
            .cloned()
            .ok_or(RegionError::UnknownKey { key })
    }

    /// Locks `offset..offset+len` of the host region `key` on behalf of a remote peer, for a
    /// CPU view of it (a socket reads into it, a checksum runs over it). Device memory is
    /// refused: it is reached only through [`RegionTable::access_dma`].
    pub fn access(
        &self,
        key: u64,
        offset: u64,
        len: u64,
        write: bool,
    ) -> Result<RegionAccess, RegionError> {
        let region = self.lookup(key)?;
        region.host_only()?;
        region.lock(offset, len, write)
    }

    /// Locks `offset..offset+len` of the region `key`, host or device, for copies in or out.
    pub fn access_dma(
        &self,
        key: u64,
        offset: u64,
        len: u64,
        write: bool,
    ) -> Result<DmaAccess, RegionError> {
        let access = self.lookup(key)?.lock(offset, len, write)?;
        Ok(DmaAccess { access })
    }

    /// Forgets every region, as a node's memory is lost when it crashes.
    pub fn clear(&self) {
        self.regions.lock().clear();
    }

    pub fn len(&self) -> usize {
        self.regions.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Keeps a region's memory alive (not its key) while a NIC holds a registration of it.
#[cfg_attr(not(feature = "verbs"), allow(dead_code))]
pub(crate) struct KeepAlive(#[allow(dead_code)] Arc<RegionInner>);

/// The owner's handle on a registered buffer. Dropping it deregisters the key at once; the
/// memory is freed after the last transfer in flight lets go of it.
pub struct Registered<B> {
    table: Arc<RegionTable>,
    inner: Arc<RegionInner>,
    _buf: PhantomData<B>,
}

impl<B: Any + Send + Sync> Registered<B> {
    /// The region's memory and a handle that keeps it alive, for registering it with a NIC.
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    pub(crate) fn raw_parts(&self) -> (*mut u8, usize, KeepAlive) {
        (
            self.inner.ptr,
            self.inner.len as usize,
            KeepAlive(self.inner.clone()),
        )
    }

    /// Where the region's memory is.
    pub fn kind(&self) -> MemoryKind {
        self.inner.kind()
    }

    /// The key a peer presents to reach this region.
    pub fn key(&self) -> u64 {
        self.inner.key
    }

    pub fn len(&self) -> u64 {
        self.inner.len
    }

    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// A descriptor for `offset..offset+len`, carrying the range's crc32c when `with_crc`
    /// (the owner holds the data: a write). Device memory has no CPU view, so its
    /// descriptors carry none: the server computes the checksum on receipt.
    pub fn desc(
        &self,
        offset: u64,
        len: u32,
        with_crc: bool,
    ) -> Result<proto::BulkDesc, RegionError> {
        let crc32c = if with_crc && self.inner.device.is_none() {
            Some(crc32c::crc32c(
                self.read(offset, u64::from(len))?.as_slice(),
            ))
        } else {
            self.inner.check_bounds(offset, u64::from(len))?;
            None
        };
        Ok(proto::BulkDesc {
            key: self.key(),
            offset,
            len,
            crc32c,
        })
    }

    /// The owner's own read of a range; refused while a peer writes to it, and for device
    /// memory.
    pub fn read(&self, offset: u64, len: u64) -> Result<RegionAccess, RegionError> {
        self.inner.host_only()?;
        self.inner.lock(offset, len, false)
    }

    /// The owner's own write to a range; refused while a peer reads or writes it, and for
    /// device memory.
    pub fn write(&self, offset: u64, len: u64) -> Result<RegionAccess, RegionError> {
        self.inner.host_only()?;
        self.inner.lock(offset, len, true)
    }

    /// The owner's own access of either kind, as the NIC would make it.
    pub fn dma(&self, offset: u64, len: u64, write: bool) -> Result<DmaAccess, RegionError> {
        let access = self.inner.lock(offset, len, write)?;
        Ok(DmaAccess { access })
    }

    /// Removes the key, waits for transfers in flight to let go, and hands the buffer back.
    pub async fn deregister(self) -> B {
        self.table.regions.lock().remove(&self.inner.key);
        // A peer that looked the key up just before holds the region, not a lock: revoking
        // refuses its lock, so once idle nothing can reach the memory.
        self.inner.locks.revoke();
        self.inner.wait_idle().await;
        let owner = self.inner.owner.lock().take();
        match owner.map(|b| b.downcast::<B>()) {
            Some(Ok(b)) => *b,
            // The box is only ever set once, with a B, and only taken here (self is consumed).
            _ => unreachable!("a registered buffer is taken back once, as its own type"),
        }
    }
}

impl<B> Drop for Registered<B> {
    fn drop(&mut self) {
        let mut regions = self.table.regions.lock();
        if regions
            .get(&self.inner.key)
            .is_some_and(|r| Arc::ptr_eq(r, &self.inner))
        {
            regions.remove(&self.inner.key);
        }
        self.inner.locks.revoke();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_reaches_only_what_was_registered() {
        let table = RegionTable::new(7);
        let reg = table.register(vec![0u8; 100]).unwrap();
        let mut w = table.access(reg.key(), 10, 20, true).unwrap();
        w.as_mut_slice().unwrap().fill(0xab);
        drop(w);
        assert!(reg
            .read(10, 20)
            .unwrap()
            .as_slice()
            .iter()
            .all(|&b| b == 0xab));
        assert_eq!(reg.read(0, 10).unwrap().as_slice(), &[0u8; 10]);
        assert!(matches!(
            table.access(reg.key(), 90, 11, false),
            Err(RegionError::OutOfBounds { .. })
        ));
        assert!(matches!(
            table.access(reg.key(), u64::MAX, 2, false),
            Err(RegionError::OutOfBounds { .. })
        ));
        assert!(matches!(
            table.access(reg.key() ^ 1, 0, 1, false),
            Err(RegionError::UnknownKey { .. })
        ));
    }

    #[test]
    fn a_zeroed_range_is_zeros_and_only_a_writer_may_zero() {
        let table = RegionTable::new(9);
        let reg = table.register(vec![7u8; 200_000]).unwrap();
        reg.dma(10, 150_000, true).unwrap().zero().unwrap();
        let all = reg.read(0, 200_000).unwrap();
        let b = all.as_slice();
        assert!(b[..10].iter().all(|&x| x == 7));
        assert!(b[10..150_010].iter().all(|&x| x == 0));
        assert!(b[150_010..].iter().all(|&x| x == 7));
        drop(all);
        assert!(matches!(
            reg.dma(0, 5, false).unwrap().zero(),
            Err(RegionError::Conflict { .. })
        ));
    }

    #[test]
    fn overlapping_writers_are_refused_and_readers_share() {
        let table = RegionTable::new(1);
        let reg = table.register(vec![0u8; 64]).unwrap();
        let r1 = table.access(reg.key(), 0, 32, false).unwrap();
        let _r2 = table.access(reg.key(), 16, 32, false).unwrap();
        assert!(matches!(
            table.access(reg.key(), 31, 2, true),
            Err(RegionError::Conflict { .. })
        ));
        let mut ro = table.access(reg.key(), 0, 1, false).unwrap();
        assert!(ro.as_mut_slice().is_none());
        drop(r1);
        assert!(table.access(reg.key(), 48, 16, true).is_ok());
    }

    #[tokio::test]
    async fn deregistering_revokes_the_key_and_returns_the_buffer() {
        let table = RegionTable::new(3);
        let reg = table.register(vec![5u8; 8]).unwrap();
        let key = reg.key();
        let buf = reg.deregister().await;
        assert_eq!(buf, vec![5u8; 8]);
        assert!(matches!(
            table.access(key, 0, 1, false),
            Err(RegionError::UnknownKey { .. })
        ));
        assert!(table.is_empty());
    }

    #[tokio::test]
    async fn a_peer_that_looked_the_key_up_before_deregistration_cannot_lock_after() {
        let table = RegionTable::new(3);
        let reg = table.register(vec![0u8; 8]).unwrap();
        // The lookup half of `access`, before the owner deregisters.
        let looked_up = table.regions.lock().get(&reg.key()).cloned().unwrap();
        let back = reg.deregister().await;
        assert!(matches!(
            looked_up.lock(0, 8, true),
            Err(RegionError::UnknownKey { .. })
        ));
        assert_eq!(back, vec![0u8; 8]);
    }

    #[tokio::test]
    async fn deregistration_waits_for_a_transfer_in_flight() {
        let table = RegionTable::new(3);
        let reg = table.register(vec![0u8; 8]).unwrap();
        let mut access = table.access(reg.key(), 0, 8, true).unwrap();
        let pending = tokio::spawn(reg.deregister());
        tokio::task::yield_now().await;
        assert!(!pending.is_finished());
        access.as_mut_slice().unwrap().fill(9);
        drop(access);
        assert_eq!(pending.await.unwrap(), vec![9u8; 8]);
    }
}
