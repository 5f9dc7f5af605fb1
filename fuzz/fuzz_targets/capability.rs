//! Capabilities as a hostile client sends them: whatever bytes arrive as a capability, a grant
//! or an object request carrying one, decoding answers with a value or an error, and checking
//! never passes a capability the MDS did not sign.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use lnet::auth::capability::{READ, WRITE};
use lnet::auth::{CapabilityKey, KeyFile, Keyring};
use proto::capa::{Capability, Grant};
use proto::msg::decode_body;
use proto::ost::{OstGetattr, OstPunch, OstRead, OstSync, OstTruncate, OstWrite};
use proto::Fid;

fn key() -> &'static CapabilityKey {
    static KEY: OnceLock<CapabilityKey> = OnceLock::new();
    KEY.get_or_init(|| CapabilityKey::of(&Keyring::new(&KeyFile::generate().unwrap())).unwrap())
}

fn refused(capa: Option<&Capability>, target: u32, fid: Fid) {
    for need in [READ, WRITE, READ | WRITE] {
        assert!(
            key().check(capa, target, fid, need, 0).is_err(),
            "an unsigned capability passed"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(c) = decode_body::<Capability>(data) {
        refused(Some(&c), 0, Fid::new(0x1_0000_0000, 1, 0));
    }
    if let Ok(g) = decode_body::<Grant>(data) {
        for o in &g.objects {
            refused(g.for_object(o.target, o.object).as_ref(), o.target, o.object);
        }
    }
    if let Ok(w) = decode_body::<OstWrite>(data) {
        refused(w.capa.as_ref(), w.target, w.fid);
    }
    if let Ok(r) = decode_body::<OstRead>(data) {
        refused(r.capa.as_ref(), r.target, r.fid);
    }
    if let Ok(r) = decode_body::<OstTruncate>(data) {
        refused(r.capa.as_ref(), r.target, r.fid);
    }
    if let Ok(r) = decode_body::<OstPunch>(data) {
        refused(r.capa.as_ref(), r.target, r.fid);
    }
    if let Ok(r) = decode_body::<OstGetattr>(data) {
        refused(r.capa.as_ref(), r.target, r.fid);
    }
    if let Ok(r) = decode_body::<OstSync>(data) {
        refused(r.capa.as_ref(), r.target, r.fid);
    }
});
