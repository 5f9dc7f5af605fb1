//! Whatever arrives on a socket: the frame decoder and every body decoder must answer with a
//! value or an error, never a panic, and a decoded frame must re-encode to the same bytes.
//! Bodies are also fed the raw input directly, since random bytes rarely pass the frame's
//! checksum to reach them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::frame::{decode_frame, encode_frame, HEADER_LEN};
use proto::msg::{decode_body, encode_body, BulkDone, BulkRead, BulkWrite, Echo, Ping, Pong};

/// Decodes `bytes` as `T`; anything that decodes must encode back to the same bytes.
fn body<T: serde::Serialize + serde::de::DeserializeOwned>(bytes: &[u8]) {
    if let Ok(v) = decode_body::<T>(bytes) {
        let again = encode_body(&v).expect("a decoded body encodes");
        let back: T = decode_body(&again).expect("an encoded body decodes");
        assert_eq!(encode_body(&back).unwrap(), again);
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(Some((header, frame_body))) = decode_frame(data) {
        assert_eq!(encode_frame(header, frame_body), data[..HEADER_LEN + frame_body.len()]);
    }
    body::<Ping>(data);
    body::<Pong>(data);
    body::<Echo>(data);
    body::<BulkRead>(data);
    body::<BulkWrite>(data);
    body::<BulkDone>(data);
    body::<proto::RemoteError>(data);
    body::<proto::BulkDesc>(data);
    body::<proto::bulk::BulkPutHead>(data);
    body::<proto::bulk::BulkDataHead>(data);
});
