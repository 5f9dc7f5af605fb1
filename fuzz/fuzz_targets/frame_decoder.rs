//! Whatever arrives on a socket: the frame decoder and every body decoder must answer with a
//! frame or an error, never a panic, and a decoded frame must re-encode to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::frame::{decode_frame, encode_frame, HEADER_LEN};
use proto::msg::{decode_body, opcodes, BulkDone, BulkRead, BulkWrite, Echo, Ping, Pong};

fuzz_target!(|data: &[u8]| {
    let Ok(Some((header, body))) = decode_frame(data) else {
        return;
    };
    assert_eq!(encode_frame(header, body), data[..HEADER_LEN + body.len()]);
    if header.error {
        let _ = decode_body::<proto::RemoteError>(body);
        return;
    }
    match header.opcode {
        opcodes::PING => {
            let _ = decode_body::<Ping>(body);
            let _ = decode_body::<Pong>(body);
        }
        opcodes::ECHO => {
            let _ = decode_body::<Echo>(body);
        }
        _ => {
            let _ = decode_body::<BulkRead>(body);
            let _ = decode_body::<BulkWrite>(body);
            let _ = decode_body::<BulkDone>(body);
            let _ = decode_body::<proto::BulkDesc>(body);
            let _ = decode_body::<proto::bulk::BulkPutHead>(body);
            let _ = decode_body::<proto::bulk::BulkDataHead>(body);
        }
    }
});
