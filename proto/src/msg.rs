//! Message bodies and their opcodes.
//!
//! Each request type implements [`Rpc`], which ties it to its opcode and its reply type, so a
//! call site names one type and gets the matching reply back. Bodies are encoded with postcard,
//! a maintained serde codec with a stable, documented format; decoding must consume the whole
//! body, and decoding arbitrary bytes allocates no more than the body holds.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::bulk::BulkDesc;
use crate::frame::FrameError;

/// The operation a request asks for. Replies and bulk frames carry the opcode of their request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Opcode(pub u16);

/// Every opcode lode speaks. A frame with any other opcode is refused at the header.
pub mod opcodes {
    use super::Opcode;

    // 0x00xx: the network layer's own self-test service (after LNet's lnet_selftest).
    pub const PING: Opcode = Opcode(0x0001);
    pub const ECHO: Opcode = Opcode(0x0002);
    pub const BULK_READ: Opcode = Opcode(0x0003);
    pub const BULK_WRITE: Opcode = Opcode(0x0004);
    /// Answered by every server: its status ([`crate::stats`]).
    pub const SERVER_STATS: Opcode = Opcode(0x0005);

    // 0x01xx: the metadata server.
    pub const MDS_REGISTER_TARGETS: Opcode = Opcode(0x0101);
    pub const MDS_HEARTBEAT: Opcode = Opcode(0x0102);
    pub const MDS_LIST_TARGETS: Opcode = Opcode(0x0103);
    pub const MDS_REINT: Opcode = Opcode(0x0110);
    pub const MDS_LOOKUP: Opcode = Opcode(0x0111);
    pub const MDS_GETATTR: Opcode = Opcode(0x0112);
    pub const MDS_READDIR: Opcode = Opcode(0x0113);
    pub const MDS_STATFS: Opcode = Opcode(0x0114);
    pub const MDS_OPEN: Opcode = Opcode(0x0115);
    pub const MDS_CLOSE: Opcode = Opcode(0x0116);
    pub const MDS_REOPEN: Opcode = Opcode(0x0117);
    pub const MDS_PING: Opcode = Opcode(0x0118);
    pub const MDS_MIRROR_SCAN: Opcode = Opcode(0x0119);
    pub const MDS_CONNECT: Opcode = Opcode(0x011a);
    pub const MDS_REPLAY: Opcode = Opcode(0x011b);
    pub const MDS_REPLAY_DONE: Opcode = Opcode(0x011c);
    pub const MDS_SYNC: Opcode = Opcode(0x011d);
    pub const MDS_DISCONNECT: Opcode = Opcode(0x011e);
    pub const MDS_LOOKUP_PATH: Opcode = Opcode(0x011f);
    pub const MDS_LEASE_WAIT: Opcode = Opcode(0x0120);
    pub const MDS_BATCH: Opcode = Opcode(0x0121);
    pub const MDS_RESERVE: Opcode = Opcode(0x0122);
    pub const MDS_READ_MDT: Opcode = Opcode(0x0123);
    pub const MDS_LEASE_ALONE: Opcode = Opcode(0x0124);
    pub const MDS_REGISTER_MDT: Opcode = Opcode(0x0125);
    pub const MDS_LIST_MDTS: Opcode = Opcode(0x0126);
    pub const MDS_HSM: Opcode = Opcode(0x0127);

    // 0x02xx: object storage servers.
    pub const OST_PRECREATE: Opcode = Opcode(0x0201);
    pub const OST_WRITE: Opcode = Opcode(0x0202);
    pub const OST_READ: Opcode = Opcode(0x0203);
    pub const OST_TRUNCATE: Opcode = Opcode(0x0204);
    pub const OST_PUNCH: Opcode = Opcode(0x0205);
    pub const OST_DESTROY: Opcode = Opcode(0x0206);
    pub const OST_GETATTR: Opcode = Opcode(0x0207);
    pub const OST_SYNC: Opcode = Opcode(0x0208);
    pub const OST_STATFS: Opcode = Opcode(0x0209);
    pub const OST_DESTROY_ABOVE: Opcode = Opcode(0x020a);
    pub const OST_DESTROY_MANY: Opcode = Opcode(0x020b);

    pub const ALL: &[Opcode] = &[
        PING,
        ECHO,
        BULK_READ,
        BULK_WRITE,
        SERVER_STATS,
        MDS_REGISTER_TARGETS,
        MDS_HEARTBEAT,
        MDS_LIST_TARGETS,
        MDS_REINT,
        MDS_LOOKUP,
        MDS_GETATTR,
        MDS_READDIR,
        MDS_STATFS,
        MDS_OPEN,
        MDS_CLOSE,
        MDS_REOPEN,
        MDS_PING,
        MDS_MIRROR_SCAN,
        MDS_CONNECT,
        MDS_REPLAY,
        MDS_REPLAY_DONE,
        MDS_SYNC,
        MDS_DISCONNECT,
        MDS_LOOKUP_PATH,
        MDS_LEASE_WAIT,
        MDS_BATCH,
        MDS_RESERVE,
        MDS_READ_MDT,
        MDS_LEASE_ALONE,
        MDS_REGISTER_MDT,
        MDS_LIST_MDTS,
        MDS_HSM,
        OST_PRECREATE,
        OST_WRITE,
        OST_READ,
        OST_TRUNCATE,
        OST_PUNCH,
        OST_DESTROY,
        OST_GETATTR,
        OST_SYNC,
        OST_STATFS,
        OST_DESTROY_ABOVE,
        OST_DESTROY_MANY,
    ];
}

impl Opcode {
    /// The opcode for `v`, if lode knows it.
    pub fn known(v: u16) -> Option<Opcode> {
        opcodes::ALL.iter().copied().find(|o| o.0 == v)
    }

    /// The opcode's place in [`opcodes::ALL`], for tables indexed by operation.
    pub fn index(self) -> Option<usize> {
        opcodes::ALL.iter().position(|o| *o == self)
    }

    /// The opcode's name, as metrics and logs show it ("mds_reint", "ost_write").
    pub fn name(self) -> &'static str {
        match self {
            opcodes::PING => "ping",
            opcodes::ECHO => "echo",
            opcodes::BULK_READ => "bulk_read",
            opcodes::BULK_WRITE => "bulk_write",
            opcodes::SERVER_STATS => "server_stats",
            opcodes::MDS_REGISTER_TARGETS => "mds_register_targets",
            opcodes::MDS_HEARTBEAT => "mds_heartbeat",
            opcodes::MDS_LIST_TARGETS => "mds_list_targets",
            opcodes::MDS_REINT => "mds_reint",
            opcodes::MDS_LOOKUP => "mds_lookup",
            opcodes::MDS_GETATTR => "mds_getattr",
            opcodes::MDS_READDIR => "mds_readdir",
            opcodes::MDS_STATFS => "mds_statfs",
            opcodes::MDS_OPEN => "mds_open",
            opcodes::MDS_CLOSE => "mds_close",
            opcodes::MDS_REOPEN => "mds_reopen",
            opcodes::MDS_PING => "mds_ping",
            opcodes::MDS_MIRROR_SCAN => "mds_mirror_scan",
            opcodes::MDS_CONNECT => "mds_connect",
            opcodes::MDS_REPLAY => "mds_replay",
            opcodes::MDS_REPLAY_DONE => "mds_replay_done",
            opcodes::MDS_SYNC => "mds_sync",
            opcodes::MDS_DISCONNECT => "mds_disconnect",
            opcodes::MDS_LOOKUP_PATH => "mds_lookup_path",
            opcodes::MDS_LEASE_WAIT => "mds_lease_wait",
            opcodes::MDS_BATCH => "mds_batch",
            opcodes::MDS_RESERVE => "mds_reserve",
            opcodes::MDS_READ_MDT => "mds_read_mdt",
            opcodes::MDS_LEASE_ALONE => "mds_lease_alone",
            opcodes::MDS_REGISTER_MDT => "mds_register_mdt",
            opcodes::MDS_LIST_MDTS => "mds_list_mdts",
            opcodes::MDS_HSM => "mds_hsm",
            opcodes::OST_PRECREATE => "ost_precreate",
            opcodes::OST_WRITE => "ost_write",
            opcodes::OST_READ => "ost_read",
            opcodes::OST_TRUNCATE => "ost_truncate",
            opcodes::OST_PUNCH => "ost_punch",
            opcodes::OST_DESTROY => "ost_destroy",
            opcodes::OST_GETATTR => "ost_getattr",
            opcodes::OST_SYNC => "ost_sync",
            opcodes::OST_STATFS => "ost_statfs",
            opcodes::OST_DESTROY_ABOVE => "ost_destroy_above",
            opcodes::OST_DESTROY_MANY => "ost_destroy_many",
            _ => "unknown",
        }
    }
}

/// A request type: its opcode and the type of its reply.
pub trait Rpc: Serialize + DeserializeOwned + Send + 'static {
    const OPCODE: Opcode;
    type Reply: Serialize + DeserializeOwned + Send + 'static;

    /// The caller's memory the server may move bytes with while serving this request.
    fn bulk(&self) -> Option<crate::bulk::BulkGrant> {
        None
    }
}

/// postcard's output into a growing `Vec`, copying short runs (varints, small fields: most of
/// what a body holds) byte by byte rather than through a call to `memmove` each: those calls
/// took about a twentieth of the MDS's time under a stream of creates.
struct Out(Vec<u8>);

impl postcard::ser_flavors::Flavor for Out {
    type Output = Vec<u8>;

    #[inline(always)]
    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        if data.len() <= 16 {
            self.0.reserve(data.len());
            for &b in data {
                self.0.push(b);
            }
        } else {
            self.0.extend_from_slice(data);
        }
        Ok(())
    }

    #[inline(always)]
    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.0.push(data);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<Vec<u8>> {
        Ok(self.0)
    }
}

/// Length the encoding of a value starts with room for: most messages and records fit.
const FIRST_ROOM: usize = 256;

/// `value` in postcard's encoding, as `postcard::to_allocvec` makes it.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> postcard::Result<Vec<u8>> {
    postcard::serialize_with_flavor(value, Out(Vec::with_capacity(FIRST_ROOM)))
}

/// `head`, then `value` in postcard's encoding.
pub fn encode_after<T: Serialize + ?Sized>(head: &[u8], value: &T) -> postcard::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(FIRST_ROOM);
    out.extend_from_slice(head);
    postcard::serialize_with_flavor(value, Out(out))
}

/// Encodes a body. Bodies are plain data, so this only fails on a body past [`crate::MAX_BODY`].
pub fn encode_body<T: Serialize>(value: &T) -> Result<Vec<u8>, FrameError> {
    let out = encode(value).map_err(|e| FrameError::Body(e.to_string()))?;
    if out.len() > crate::MAX_BODY as usize {
        return Err(FrameError::BodyTooLarge {
            len: u32::try_from(out.len()).unwrap_or(u32::MAX),
        });
    }
    Ok(out)
}

/// Decodes a body, which must be consumed exactly.
pub fn decode_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, FrameError> {
    let (value, rest) =
        postcard::take_from_bytes(body).map_err(|e| FrameError::Body(e.to_string()))?;
    if !rest.is_empty() {
        return Err(FrameError::Body(format!("{} trailing bytes", rest.len())));
    }
    Ok(value)
}

/// Liveness and identity: the answer names the node that answered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ping {
    pub nonce: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pong {
    pub nonce: u64,
    pub nid: crate::Nid,
}

impl Rpc for Ping {
    const OPCODE: Opcode = opcodes::PING;
    type Reply = Pong;
}

/// Small-message round trip: the payload comes back unchanged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Echo {
    #[serde(with = "bytes_field")]
    pub payload: Vec<u8>,
}

impl Rpc for Echo {
    const OPCODE: Opcode = opcodes::ECHO;
    type Reply = Echo;
}

/// Self-test read: the server puts `desc.len` bytes of a pattern seeded by `seed` into the
/// caller's region, as an OSS does for a read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BulkRead {
    pub desc: BulkDesc,
    pub seed: u64,
}

/// Self-test write: the server pulls `desc.len` bytes from the caller's region, as an OSS does
/// for a write, checks them against `desc.crc32c` and reports what it received.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BulkWrite {
    pub desc: BulkDesc,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BulkDone {
    pub bytes: u64,
    pub crc32c: u32,
}

impl Rpc for BulkRead {
    fn bulk(&self) -> Option<crate::bulk::BulkGrant> {
        Some(crate::bulk::BulkGrant::of(&self.desc, true))
    }
    const OPCODE: Opcode = opcodes::BULK_READ;
    type Reply = BulkDone;
}

impl Rpc for BulkWrite {
    fn bulk(&self) -> Option<crate::bulk::BulkGrant> {
        Some(crate::bulk::BulkGrant::of(&self.desc, false))
    }
    const OPCODE: Opcode = opcodes::BULK_WRITE;
    type Reply = BulkDone;
}

/// The self-test pattern: byte `i` of a transfer with seed `s`. Both sides can check it
/// without keeping a copy.
pub fn pattern_byte(seed: u64, i: u64) -> u8 {
    let x = seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x ^ (x >> 29) ^ (x >> 47)) as u8
}

/// Byte vectors as postcard byte strings (one length, then the bytes), not as sequences of
/// integers: compact, and decoded by borrowing the exact slice, so a lying length cannot make
/// the decoder allocate more than the body holds.
pub(crate) mod bytes_field {
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(v)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a byte string")
            }
            fn visit_bytes<E>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                Ok(v.to_vec())
            }
            fn visit_byte_buf<E>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
                Ok(v)
            }
        }
        d.deserialize_byte_buf(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::fmt::Debug;

    fn round_trips<T: Serialize + DeserializeOwned + PartialEq + Debug>(v: T) {
        let body = encode_body(&v).unwrap();
        // Byte for byte what postcard's own output makes, alone and after a head.
        assert_eq!(body, postcard::to_allocvec(&v).unwrap());
        let after = encode_after(b"head", &v).unwrap();
        assert_eq!((&after[..4], &after[4..]), (&b"head"[..], &body[..]));
        assert_eq!(decode_body::<T>(&body).unwrap(), v);
        // A body with a byte missing or a byte extra is refused, not half-read.
        if !body.is_empty() {
            assert!(decode_body::<T>(&body[..body.len() - 1]).is_err());
        }
        let mut longer = body.clone();
        longer.push(0);
        assert!(decode_body::<T>(&longer).is_err());
    }

    fn any_desc() -> impl Strategy<Value = BulkDesc> {
        (
            any::<u64>(),
            any::<u64>(),
            0..=crate::MAX_BULK,
            any::<Option<u32>>(),
        )
            .prop_map(|(key, offset, len, crc32c)| BulkDesc {
                key,
                offset,
                len,
                crc32c,
            })
    }

    proptest! {
        #[test]
        fn every_message_round_trips(nonce: u64, name in "[a-z0-9]{1,16}",
                                     payload in proptest::collection::vec(any::<u8>(), 0..300),
                                     desc in any_desc(), seed: u64, bytes: u64, crc: u32) {
            round_trips(Ping { nonce });
            round_trips(Pong { nonce, nid: crate::Nid::sim(&name).unwrap() });
            round_trips(Echo { payload });
            round_trips(BulkRead { desc: desc.clone(), seed });
            round_trips(BulkWrite { desc });
            round_trips(BulkDone { bytes, crc32c: crc });
            round_trips(crate::RemoteError::new(crate::StatusCode::Busy, name));
        }
    }

    #[test]
    fn every_opcode_is_known_and_distinct() {
        for (i, op) in opcodes::ALL.iter().enumerate() {
            assert_eq!(Opcode::known(op.0), Some(*op));
            assert!(!opcodes::ALL[..i].contains(op));
        }
        assert_eq!(Opcode::known(0), None);
    }
}
