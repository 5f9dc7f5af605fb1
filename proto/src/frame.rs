//! The frame: a fixed 32-byte little-endian header, a postcard body of at most [`MAX_BODY`]
//! bytes, and for bulk frames a raw payload of at most [`MAX_BULK`] bytes.
//!
//! ```text
//!  0      4      6      8          12         16                 24         28        32
//!  +------+------+------+----------+----------+------------------+----------+---------+
//!  |magic |ver   |opcode| flags    | body_len | xid              | bulk_len | crc32c  |
//!  +------+------+------+----------+----------+------------------+----------+---------+
//! ```
//!
//! The crc32c covers header bytes 0..28 followed by the body; a bulk payload carries its own
//! crc32c in the bulk descriptor. A request may carry the bytes of its write's bulk range after
//! its body, up to [`MAX_EAGER`], so that the server need not ask for them (Lustre's short
//! I/O): the request's descriptor holds their crc32c. Every length is checked against its bound before a single byte
//! of body is read or allocated.

use crate::msg::Opcode;

pub const MAGIC: u32 = u32::from_le_bytes(*b"LODE");
pub const VERSION: u16 = 1;
pub const HEADER_LEN: usize = 32;
/// Largest message body. Metadata replies (a readdir page, a layout) fit well inside it.
pub const MAX_BODY: u32 = 1 << 20;
/// Largest bulk payload in one frame: Lustre's largest bulk RPC, 16 MiB.
pub const MAX_BULK: u32 = 16 << 20;
/// Largest payload a request carries ahead of being asked (see [`FrameKind::Request`]): a
/// server reads it before the request is admitted, so it stays small.
pub const MAX_EAGER: u32 = 64 << 10;

const KIND_MASK: u32 = 0xff;
/// A reply whose body is a [`crate::RemoteError`] instead of the expected reply.
pub const FLAG_ERROR: u32 = 1 << 8;
/// A request whose body starts with the job it works for ([`crate::job`]).
pub const FLAG_JOB: u32 = 1 << 9;
const KNOWN_FLAGS: u32 = KIND_MASK | FLAG_ERROR | FLAG_JOB;

/// What a frame is for; the low byte of `flags`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameKind {
    /// A call; `xid` is chosen by the caller and echoed by everything that answers it. A call
    /// whose server reads a bulk range of at most [`MAX_EAGER`] bytes may carry those bytes
    /// after its body, so the server needs no `BulkGet`.
    Request = 1,
    /// The answer to the request with the same `xid`.
    Reply = 2,
    /// Server to owner: "write this payload into your region" (the data of a read).
    BulkPut = 3,
    /// Server to owner: "send me this range of your region" (the data of a write).
    BulkGet = 4,
    /// Owner to server: the payload answering a `BulkGet`.
    BulkData = 5,
}

impl FrameKind {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => FrameKind::Request,
            2 => FrameKind::Reply,
            3 => FrameKind::BulkPut,
            4 => FrameKind::BulkGet,
            5 => FrameKind::BulkData,
            _ => return None,
        })
    }

    /// Whether frames of this kind may carry a raw payload after the body (a request: at most
    /// [`MAX_EAGER`] bytes).
    pub fn carries_bulk(self) -> bool {
        matches!(
            self,
            FrameKind::Request | FrameKind::BulkPut | FrameKind::BulkData
        )
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("bad magic {0:#010x}")]
    BadMagic(u32),
    #[error("unsupported protocol version {0}")]
    BadVersion(u16),
    #[error("unknown opcode {0:#06x}")]
    UnknownOpcode(u16),
    #[error("unknown frame kind or flags {0:#010x}")]
    BadFlags(u32),
    #[error("body of {len} bytes exceeds the limit of {MAX_BODY}")]
    BodyTooLarge { len: u32 },
    #[error("bulk payload of {len} bytes exceeds the limit of {MAX_BULK}")]
    BulkTooLarge { len: u32 },
    #[error("a {kind:?} frame cannot carry a bulk payload")]
    UnexpectedBulk { kind: FrameKind },
    #[error("checksum mismatch: header says {expected:#010x}, frame hashes to {actual:#010x}")]
    Checksum { expected: u32, actual: u32 },
    #[error("body does not decode: {0}")]
    Body(String),
}

/// A decoded, validated header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub opcode: Opcode,
    pub kind: FrameKind,
    /// [`FLAG_ERROR`]: replies only.
    pub error: bool,
    /// [`FLAG_JOB`]: requests only.
    pub job: bool,
    pub xid: u64,
    pub body_len: u32,
    pub bulk_len: u32,
    pub crc: u32,
}

impl Header {
    pub fn new(kind: FrameKind, opcode: Opcode, xid: u64) -> Self {
        Header {
            opcode,
            kind,
            error: false,
            job: false,
            xid,
            body_len: 0,
            bulk_len: 0,
            crc: 0,
        }
    }

    fn flags(&self) -> u32 {
        self.kind as u32
            | if self.error { FLAG_ERROR } else { 0 }
            | if self.job { FLAG_JOB } else { 0 }
    }

    fn first_28(&self) -> [u8; 28] {
        let mut b = [0u8; 28];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&self.opcode.0.to_le_bytes());
        b[8..12].copy_from_slice(&self.flags().to_le_bytes());
        b[12..16].copy_from_slice(&self.body_len.to_le_bytes());
        b[16..24].copy_from_slice(&self.xid.to_le_bytes());
        b[24..28].copy_from_slice(&self.bulk_len.to_le_bytes());
        b
    }

    /// Encodes the header for `body`, filling in `body_len` and the checksum.
    /// `bulk_len` must already be set for bulk frames.
    pub fn encode(&mut self, body: &[u8]) -> [u8; HEADER_LEN] {
        self.body_len = u32::try_from(body.len()).unwrap_or(u32::MAX);
        let first = self.first_28();
        self.crc = crc32c::crc32c_append(crc32c::crc32c(&first), body);
        let mut out = [0u8; HEADER_LEN];
        out[..28].copy_from_slice(&first);
        out[28..].copy_from_slice(&self.crc.to_le_bytes());
        out
    }

    /// Validates everything the header alone can tell: magic, version, kind, flags, opcode and
    /// both lengths. The checksum needs the body: see [`Header::verify`].
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Header, FrameError> {
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let magic = u32_at(0);
        if magic != MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        let version = u16_at(4);
        if version != VERSION {
            return Err(FrameError::BadVersion(version));
        }
        let op = u16_at(6);
        let opcode = Opcode::known(op).ok_or(FrameError::UnknownOpcode(op))?;
        let flags = u32_at(8);
        let kind = FrameKind::from_u8((flags & KIND_MASK) as u8);
        let kind = match kind {
            Some(k) if flags & !KNOWN_FLAGS == 0 => k,
            _ => return Err(FrameError::BadFlags(flags)),
        };
        let error = flags & FLAG_ERROR != 0;
        if error && kind != FrameKind::Reply {
            return Err(FrameError::BadFlags(flags));
        }
        let job = flags & FLAG_JOB != 0;
        if job && kind != FrameKind::Request {
            return Err(FrameError::BadFlags(flags));
        }
        let body_len = u32_at(12);
        if body_len > MAX_BODY {
            return Err(FrameError::BodyTooLarge { len: body_len });
        }
        let bulk_len = u32_at(24);
        if bulk_len > MAX_BULK {
            return Err(FrameError::BulkTooLarge { len: bulk_len });
        }
        if bulk_len > 0 && !kind.carries_bulk() {
            return Err(FrameError::UnexpectedBulk { kind });
        }
        if kind == FrameKind::Request && bulk_len > MAX_EAGER {
            return Err(FrameError::BulkTooLarge { len: bulk_len });
        }
        let mut xid = [0u8; 8];
        xid.copy_from_slice(&b[16..24]);
        Ok(Header {
            opcode,
            kind,
            error,
            job,
            xid: u64::from_le_bytes(xid),
            body_len,
            bulk_len,
            crc: u32_at(28),
        })
    }

    /// Checks the crc32c over the header and `body`.
    pub fn verify(&self, body: &[u8]) -> Result<(), FrameError> {
        let actual = crc32c::crc32c_append(crc32c::crc32c(&self.first_28()), body);
        if actual != self.crc || body.len() != self.body_len as usize {
            return Err(FrameError::Checksum {
                expected: self.crc,
                actual,
            });
        }
        Ok(())
    }
}

/// Encodes a whole frame (header then body) into one buffer.
pub fn encode_frame(mut header: Header, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(&header.encode(body));
    out.extend_from_slice(body);
    out
}

/// Encodes a request, with the job it works for in front of its body when there is one.
pub fn encode_request(
    opcode: crate::Opcode,
    xid: u64,
    job: Option<&crate::job::JobId>,
    body: &[u8],
) -> Vec<u8> {
    encode_request_with(opcode, xid, job, body, 0)
}

/// Encodes a request as [`encode_request`] does, announcing `eager` payload bytes (at most
/// [`MAX_EAGER`]) that the caller sends after it.
pub fn encode_request_with(
    opcode: crate::Opcode,
    xid: u64,
    job: Option<&crate::job::JobId>,
    body: &[u8],
    eager: u32,
) -> Vec<u8> {
    let mut header = Header::new(FrameKind::Request, opcode, xid);
    header.bulk_len = eager.min(MAX_EAGER);
    match job {
        Some(job) => {
            header.job = true;
            encode_frame(header, &crate::job::prefix(job, body))
        }
        None => encode_frame(header, body),
    }
}

/// A request's job and message body, taken apart as [`encode_request`] put them together.
pub fn request_job(
    header: &Header,
    body: Vec<u8>,
) -> Result<(Option<crate::job::JobId>, Vec<u8>), FrameError> {
    if !header.job {
        return Ok((None, body));
    }
    let (job, body) = crate::job::split(body)?;
    Ok((Some(job), body))
}

/// Decodes one frame (header and body, not the bulk payload) from the front of `buf`.
///
/// Returns `Ok(None)` when `buf` holds only part of a frame, so a stream reader knows to read
/// more; the header alone is enough to reject a frame, so garbage is refused at once, before
/// any body is awaited.
pub fn decode_frame(buf: &[u8]) -> Result<Option<(Header, &[u8])>, FrameError> {
    let Some(head) = buf.first_chunk::<HEADER_LEN>() else {
        return Ok(None);
    };
    let header = Header::decode(head)?;
    let end = HEADER_LEN + header.body_len as usize;
    let Some(body) = buf.get(HEADER_LEN..end) else {
        return Ok(None);
    };
    header.verify(body)?;
    Ok(Some((header, body)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::{opcodes, Opcode};
    use proptest::prelude::*;

    fn any_kind() -> impl Strategy<Value = FrameKind> {
        prop_oneof![
            Just(FrameKind::Request),
            Just(FrameKind::Reply),
            Just(FrameKind::BulkPut),
            Just(FrameKind::BulkGet),
            Just(FrameKind::BulkData),
        ]
    }

    fn any_opcode() -> impl Strategy<Value = Opcode> {
        proptest::sample::select(opcodes::ALL.to_vec())
    }

    #[test]
    fn header_bytes_are_the_documented_layout() {
        let mut h = Header::new(FrameKind::Request, opcodes::PING, 0x0102030405060708);
        let b = h.encode(b"xy");
        assert_eq!(&b[0..4], b"LODE");
        assert_eq!(&b[4..6], &[1, 0]);
        assert_eq!(&b[6..8], &opcodes::PING.0.to_le_bytes());
        assert_eq!(&b[8..12], &[1, 0, 0, 0]);
        assert_eq!(&b[12..16], &[2, 0, 0, 0]);
        assert_eq!(&b[16..24], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(&b[24..28], &[0, 0, 0, 0]);
        let crc = crc32c::crc32c_append(crc32c::crc32c(&b[..28]), b"xy");
        assert_eq!(&b[28..32], &crc.to_le_bytes());
    }

    #[test]
    fn each_bad_field_is_named() {
        let good = encode_frame(Header::new(FrameKind::Request, opcodes::PING, 1), b"");
        let with = |at: usize, bytes: &[u8]| {
            let mut f = good.clone();
            f[at..at + bytes.len()].copy_from_slice(bytes);
            decode_frame(&f).unwrap_err()
        };
        assert!(matches!(with(0, b"XODE"), FrameError::BadMagic(_)));
        assert!(matches!(with(4, &[9, 0]), FrameError::BadVersion(9)));
        assert!(matches!(
            with(6, &[0xff, 0xff]),
            FrameError::UnknownOpcode(0xffff)
        ));
        assert!(matches!(with(8, &[0x77, 0, 0, 0]), FrameError::BadFlags(_)));
        assert!(matches!(with(10, &[1, 0]), FrameError::BadFlags(_)));
        // A job rides on requests only.
        assert!(matches!(with(8, &[2, 2, 0, 0]), FrameError::BadFlags(_)));
        assert!(matches!(
            with(12, &[0, 0, 0x20, 0]),
            FrameError::BodyTooLarge { .. }
        ));
        assert!(matches!(
            with(24, &[0, 0, 0, 0x20]),
            FrameError::BulkTooLarge { .. }
        ));
        // A request carries at most MAX_EAGER bytes; a reply or a bulk get none.
        assert!(decode_frame(&{
            let mut f = good.clone();
            f[24..28].copy_from_slice(&MAX_EAGER.to_le_bytes());
            f
        })
        .is_err_and(|e| matches!(e, FrameError::Checksum { .. })));
        assert!(matches!(
            with(24, &(MAX_EAGER + 1).to_le_bytes()),
            FrameError::BulkTooLarge { .. }
        ));
        for kind in [FrameKind::Reply, FrameKind::BulkGet] {
            let mut f = encode_frame(Header::new(kind, opcodes::PING, 1), b"");
            f[24..28].copy_from_slice(&[1, 0, 0, 0]);
            assert!(matches!(
                decode_frame(&f).unwrap_err(),
                FrameError::UnexpectedBulk { .. }
            ));
        }
        assert!(matches!(
            with(28, &[0, 0, 0, 0]),
            FrameError::Checksum { .. }
        ));
    }

    proptest! {
        #[test]
        fn frames_round_trip(kind in any_kind(), op in any_opcode(), xid: u64,
                             body in proptest::collection::vec(any::<u8>(), 0..512), bulk in 0..=MAX_BULK) {
            let mut h = Header::new(kind, op, xid);
            h.bulk_len = match kind {
                FrameKind::Request => bulk.min(MAX_EAGER),
                k if k.carries_bulk() => bulk,
                _ => 0,
            };
            h.error = kind == FrameKind::Reply && xid % 2 == 0;
            let frame = encode_frame(h, &body);
            let (got, got_body) = decode_frame(&frame).unwrap().unwrap();
            prop_assert_eq!(got.kind, kind);
            prop_assert_eq!(got.opcode, op);
            prop_assert_eq!(got.xid, xid);
            prop_assert_eq!(got.bulk_len, h.bulk_len);
            prop_assert_eq!(got.error, h.error);
            prop_assert_eq!(got_body, &body[..]);
            // Every strict prefix is "need more", never an error or a wrong frame.
            for cut in [0, 1, HEADER_LEN - 1, HEADER_LEN, frame.len() - 1] {
                if cut < frame.len() {
                    prop_assert_eq!(decode_frame(&frame[..cut]), Ok(None));
                }
            }
        }

        #[test]
        fn requests_carry_their_job(job in "[!-~]{1,31}", xid: u64,
                                    body in proptest::collection::vec(any::<u8>(), 0..256)) {
            let job = crate::job::JobId::new(&job).unwrap();
            let frame = encode_request(opcodes::ECHO, xid, Some(&job), &body);
            let (h, b) = decode_frame(&frame).unwrap().unwrap();
            prop_assert!(h.job);
            let (got, rest) = request_job(&h, b.to_vec()).unwrap();
            prop_assert_eq!(got, Some(job));
            prop_assert_eq!(rest, body.clone());
            let plain = encode_request(opcodes::ECHO, xid, None, &body);
            let (h, b) = decode_frame(&plain).unwrap().unwrap();
            prop_assert_eq!(request_job(&h, b.to_vec()).unwrap(), (None, body));
        }

        #[test]
        fn any_flipped_bit_is_detected(body in proptest::collection::vec(any::<u8>(), 1..64), bit in 0usize..(32 + 64) * 8) {
            let frame = encode_frame(Header::new(FrameKind::Request, opcodes::ECHO, 7), &body);
            let bit = bit % (frame.len() * 8);
            let mut bad = frame.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            // A flip in body_len can make the frame look incomplete; anything else is an error.
            prop_assert!(!matches!(decode_frame(&bad), Ok(Some(_))));
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_frame(&bytes);
        }
    }
}
