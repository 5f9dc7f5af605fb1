//! The network self-test service, after LNet's `lnet_selftest`: ping, echo, and bulk reads and
//! writes of a known pattern. It exercises every path a storage server uses (RPC, bulk put into
//! the caller's memory, bulk get from it) with nothing behind it but the network, so it is what
//! the tests, the benchmarks and `lst` run against.

use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use proto::msg::{opcodes, pattern_byte, BulkDone, BulkRead, BulkWrite, Echo, Ping, Pong};
use proto::{RemoteError, StatusCode};

use crate::error::NetError;
use crate::service::{reply, BoxFuture, BulkPeer, Incoming, Service};

/// Serves the self-test opcodes.
pub struct SelfTest {
    /// The last pattern served, by (seed, length): benchmarks read the same one over and over,
    /// and must measure the network, not the pattern generator.
    last: Mutex<Option<(u64, Bytes, u32)>>,
}

impl SelfTest {
    pub fn new() -> Arc<Self> {
        Arc::new(SelfTest {
            last: Mutex::new(None),
        })
    }

    /// The pattern for `(seed, len)` and its crc32c.
    fn pattern(&self, seed: u64, len: usize) -> (Bytes, u32) {
        let mut last = self.last.lock();
        match &*last {
            Some((s, b, crc)) if *s == seed && b.len() == len => (b.clone(), *crc),
            _ => {
                let b = Bytes::from(pattern(seed, len));
                let crc = crc32c::crc32c(&b);
                *last = Some((seed, b.clone(), crc));
                (b, crc)
            }
        }
    }
}

/// Fills `len` bytes of the self-test pattern.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64).map(|i| pattern_byte(seed, i)).collect()
}

fn bulk_failed(e: NetError) -> RemoteError {
    let code = match e {
        NetError::Checksum { .. } => StatusCode::Checksum,
        _ => StatusCode::Bulk,
    };
    RemoteError::new(code, e.to_string())
}

impl Service for SelfTest {
    fn handle(
        self: Arc<Self>,
        req: Incoming,
        bulk: Arc<dyn BulkPeer>,
    ) -> BoxFuture<'static, Result<Vec<u8>, RemoteError>> {
        Box::pin(async move {
            match req.opcode {
                opcodes::PING => {
                    let p: Ping = req.decode()?;
                    reply::<Ping>(&Pong {
                        nonce: p.nonce,
                        nid: req.to.clone(),
                    })
                }
                opcodes::ECHO => {
                    let e: Echo = req.decode()?;
                    reply::<Echo>(&e)
                }
                opcodes::BULK_READ => {
                    let r: BulkRead = req.decode()?;
                    let (data, crc32c) = self.pattern(r.seed, r.desc.len as usize);
                    bulk.put(&r.desc, data).await.map_err(bulk_failed)?;
                    reply::<BulkRead>(&BulkDone {
                        bytes: u64::from(r.desc.len),
                        crc32c,
                    })
                }
                opcodes::BULK_WRITE => {
                    let w: BulkWrite = req.decode()?;
                    let data = bulk.get(&w.desc).await.map_err(bulk_failed)?;
                    // `get` has checked the data against the descriptor's checksum.
                    let crc32c = w.desc.crc32c.unwrap_or_else(|| crc32c::crc32c(&data));
                    reply::<BulkWrite>(&BulkDone {
                        bytes: data.len() as u64,
                        crc32c,
                    })
                }
                other => Err(RemoteError::new(
                    StatusCode::NoService,
                    format!("self-test does not serve {other:?}"),
                )),
            }
        })
    }
}
