//! The handshake as a hostile peer drives it: whatever bytes arrive as a hello and its first
//! message, or as a server's answer, the responder and the initiator answer with a refusal or
//! an error, never a panic, and random bytes never authenticate.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use lnet::auth::session::{respond, Hello, Initiator, HELLO_LEN};
use lnet::auth::{KeyFile, Keyring, Security};

fn keys() -> Arc<Keyring> {
    static KEYS: OnceLock<Arc<Keyring>> = OnceLock::new();
    KEYS.get_or_init(|| Arc::new(Keyring::new(&KeyFile::generate().unwrap())))
        .clone()
}

fuzz_target!(|data: &[u8]| {
    let server = Security::server(keys(), data.first().is_some_and(|b| b & 1 == 1)).unwrap();
    // As the responder: a hello and message 1 from the network.
    if data.len() >= HELLO_LEN + 2 {
        let mut fixed = [0u8; HELLO_LEN + 2];
        fixed.copy_from_slice(&data[..HELLO_LEN + 2]);
        if let Ok(hello) = Hello::parse(&fixed) {
            let rest = &data[HELLO_LEN + 2..];
            let msg = &rest[..hello.msg_len.min(rest.len())];
            let answer = respond(&server, &hello, msg);
            assert!(answer.outcome.is_err(), "random bytes authenticated");
            assert!(answer.reply.len() >= 4);
        }
    }
    // As the initiator: whatever the "server" answers.
    let client = Security::client(keys(), false);
    let (init, _) = Initiator::start(&client).unwrap();
    if data.len() >= 2 {
        assert!(
            init.finish(data[0], data[1], &data[2..]).is_err(),
            "a forged answer authenticated"
        );
    }
});
