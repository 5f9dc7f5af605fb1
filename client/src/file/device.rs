//! Reads and writes of device (GPU) memory, straight or through the host staging ring.

use super::*;

impl File {
    /// Reads up to `len` bytes at `offset` into device memory `buf` at `buf_offset`, on the
    /// path `io` asks for (see [`crate::gpu`]). Returns what was done: the count (short only
    /// at the end of the file), the path taken, what was verified and how many bytes passed
    /// through host staging. The bytes are on the device when it returns.
    pub async fn read_device(
        &self,
        offset: u64,
        buf: &DeviceBuf,
        buf_offset: u64,
        len: u64,
        io: DeviceIo,
    ) -> Result<Completion> {
        let dst = buf.slice(buf_offset, len).ok_or_else(|| {
            ClientError::fs(
                FsErrorKind::Invalid,
                "the read does not fit the device buffer",
            )
        })?;
        let gpu = self.client.gpu();
        gpu.check(&dst)?;
        let size = self
            .inode
            .lock()
            .size
            .max(self.written_to.load(Ordering::Relaxed));
        let len = len.min(size.saturating_sub(offset));
        let dst = DeviceBuf { len, ..dst };
        let fallback = match self.route(&*gpu, &dst, io.path, "read")? {
            Route::Direct(region) => {
                let n = self.read_into(offset, &region, 0, len).await?;
                return Ok(Completion::direct(n as u64));
            }
            Route::Staged(fallback) => fallback,
        };
        let n = self.read_staged(offset, &dst, io.stream, &gpu).await?;
        Ok(Completion::staged(n, fallback))
    }

    /// The path a device transfer of `buf` takes: direct with `buf` registered, or staged
    /// (with the reason, when `Auto` could not go direct); `Direct` that cannot be honoured is
    /// an error.
    pub(super) fn route(
        &self,
        gpu: &dyn GpuBackend,
        buf: &DeviceBuf,
        path: IoPath,
        what: &str,
    ) -> Result<Route> {
        if path == IoPath::Staged {
            return Ok(Route::Staged(None));
        }
        // An encrypted file's bytes are decrypted and encrypted on the host, in the staging
        // chunk, before its copy to or after its copy from the device.
        let direct = if self.encrypted() {
            Err("the file is encrypted: its bytes pass through the host's cipher".to_string())
        } else {
            self.direct_region(gpu, buf)
        };
        match direct {
            Ok(region) => Ok(Route::Direct(region)),
            Err(why) if path == IoPath::Auto => {
                tracing::info!(reason = %why, "device {what} staged through host memory");
                Ok(Route::Staged(Some(why)))
            }
            Err(why) => Err(GpuError::DirectUnavailable(why).into()),
        }
    }

    /// `dst` registered with the transport as device memory, or why it cannot be.
    pub(super) fn direct_region(
        &self,
        gpu: &dyn GpuBackend,
        dst: &DeviceBuf,
    ) -> std::result::Result<Registered<lnet::DeviceMemory>, String> {
        let mem = gpu.device_memory(dst).map_err(|e| e.to_string())?;
        self.client
            .inner
            .net
            .register_device(mem)
            .map_err(|e| e.to_string())
    }

    /// The staged read: chunks of the ring are filled (and verified) in parallel, and each is
    /// copied to the device as soon as it has landed, while later chunks are on the network.
    pub(super) async fn read_staged(
        &self,
        offset: u64,
        dst: &DeviceBuf,
        stream: u64,
        gpu: &Arc<dyn GpuBackend>,
    ) -> Result<u64> {
        use futures_util::stream::{FuturesUnordered, StreamExt};
        let chunk = self.client.inner.staging.chunk() as u64;
        let ring = self.client.inner.cfg.staging_chunks.max(1);
        let mut inflight = FuturesUnordered::new();
        let mut first_err = None;
        let mut at = 0;
        loop {
            while at < dst.len && inflight.len() < ring && first_err.is_none() {
                let n = chunk.min(dst.len - at);
                inflight.push(self.stage_chunk(offset + at, dst.addr + at, n, stream, gpu));
                at += n;
            }
            match inflight.next().await {
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                None => break,
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(dst.len),
        }
    }

    /// One chunk of a staged read: into a pinned chunk, verified, then copied to `device_addr`.
    pub(super) async fn stage_chunk(
        &self,
        offset: u64,
        device_addr: u64,
        n: u64,
        stream: u64,
        gpu: &Arc<dyn GpuBackend>,
    ) -> Result<u64> {
        let staging = &self.client.inner.staging;
        let slot = staging.take(&**gpu, &self.client.inner.net).await?;
        let got = self.read_into(offset, &slot.region, 0, n).await? as u64;
        staging.count(got);
        if got < n {
            // Past the end of the file as it is now (it shrank since the size was learnt).
            return Err(ClientError::fs(
                FsErrorKind::Io,
                format!("the file ended at {} during a device read", offset + got),
            ));
        }
        let access = slot.region.read(0, got)?;
        let src = access.as_slice().as_ptr() as usize;
        let gpu = gpu.clone();
        // The copy runs on the GPU's engine; the chunk stays read-locked (and so unchanged)
        // until it is done.
        tokio::task::spawn_blocking(move || {
            // SAFETY: `access` holds `src..src+got` of the registered chunk, which nobody may
            // change while it is held, and it is held until the copy has finished.
            let ticket =
                unsafe { gpu.copy_to_device(device_addr, src as *const u8, got as usize, stream) }?;
            let r = ticket.wait();
            drop(access);
            drop(slot);
            r
        })
        .await
        .map_err(|e| ClientError::fs(FsErrorKind::Io, e.to_string()))??;
        Ok(got)
    }

    /// Writes `len` bytes of device memory `buf` (from `buf_offset`) at `offset`, on the path
    /// `io` asks for. Staged, each chunk is copied into pinned host memory, checksummed there
    /// and sent (verified end to end); direct, the storage servers pull the bytes from device
    /// memory and checksum them on receipt.
    pub async fn write_device(
        &self,
        offset: u64,
        buf: &DeviceBuf,
        buf_offset: u64,
        len: u64,
        io: DeviceIo,
    ) -> Result<Completion> {
        let src = buf.slice(buf_offset, len).ok_or_else(|| {
            ClientError::fs(
                FsErrorKind::Invalid,
                "the write does not fit the device buffer",
            )
        })?;
        let gpu = self.client.gpu();
        gpu.check(&src)?;
        let fallback = match self.route(&*gpu, &src, io.path, "write")? {
            Route::Direct(region) => {
                self.write_from(offset, Arc::new(region), 0, len).await?;
                return Ok(Completion::direct(len));
            }
            Route::Staged(fallback) => fallback,
        };
        let staging = self.client.inner.staging.clone();
        let chunk = staging.chunk() as u64;
        let mut at = 0;
        let offset = if self.append {
            self.size().await?
        } else {
            offset
        };
        while at < len {
            let n = chunk.min(len - at);
            let slot = staging.take(&*gpu, &self.client.inner.net).await?;
            {
                let mut w = slot.region.write(0, n)?;
                let host = w.as_mut_slice().unwrap_or_default();
                gpu.copy_from_device(host, src.addr + at, io.stream)?;
            }
            staging.count(n);
            self.write_from(offset + at, slot.region.clone(), 0, n)
                .await?;
            at += n;
        }
        Ok(Completion::staged(len, fallback))
    }
}

/// Where a device transfer goes: straight to the registered device memory, or through the
/// staging ring (with why, when it could not go direct).
pub(super) enum Route {
    Direct(Registered<lnet::DeviceMemory>),
    Staged(Option<String>),
}
