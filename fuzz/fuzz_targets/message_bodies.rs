//! Every body an MDS or a storage server decodes from the network: metadata requests and
//! replies, storage requests and replies, and the registry's messages. Each must decode to a
//! value or an error, never panic, and what decodes must re-encode to a body that decodes to
//! the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::md::*;
use proto::msg::{decode_body, encode_body};
use proto::ost::*;
use proto::registry::*;

fn body<T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug>(
    bytes: &[u8],
) {
    if let Ok(v) = decode_body::<T>(bytes) {
        let again = encode_body(&v).expect("a decoded body encodes");
        let back: T = decode_body(&again).expect("an encoded body decodes");
        assert_eq!(back, v);
    }
}

fuzz_target!(|data: &[u8]| {
    body::<MdsReint>(data);
    body::<MdsReintReply>(data);
    body::<MdsLookup>(data);
    body::<MdsGetattr>(data);
    body::<MdsInode>(data);
    body::<MdsReaddir>(data);
    body::<MdsDirPage>(data);
    body::<MdsOpen>(data);
    body::<MdsOpened>(data);
    body::<MdsClose>(data);
    body::<MdsReopen>(data);
    body::<MdsReopened>(data);
    body::<MdsPing>(data);
    body::<MdsMirrorScan>(data);
    body::<MdsMirrorScanned>(data);
    body::<MdsConnect>(data);
    body::<MdsConnected>(data);
    body::<MdsReplay>(data);
    body::<MdsReplayed>(data);
    body::<MdsReplayDone>(data);
    body::<MdsSync>(data);
    body::<MdsSynced>(data);
    body::<MdsDisconnect>(data);
    body::<MdsLookupPath>(data);
    body::<MdsLeaseWait>(data);
    body::<MdsLeaseRecall>(data);
    body::<MdsPath>(data);
    body::<MdsPong>(data);
    body::<MdsBatch>(data);
    body::<MdsBatched>(data);
    body::<MdsReserve>(data);
    body::<MdsReserved>(data);
    body::<MdsReadMdt>(data);
    body::<MdsMdtData>(data);
    body::<MdsLeaseAlone>(data);
    body::<MdsLeaseAloneReply>(data);
    body::<FsStats>(data);
    body::<RegisterTargets>(data);
    body::<Registered>(data);
    body::<Heartbeat>(data);
    body::<TargetList>(data);
    body::<OstPrecreate>(data);
    body::<OstPrecreated>(data);
    body::<OstWrite>(data);
    body::<OstWritten>(data);
    body::<OstAck>(data);
    body::<OstRead>(data);
    body::<OstReadDone>(data);
    body::<OstTruncate>(data);
    body::<OstPunch>(data);
    body::<OstDestroyAbove>(data);
    body::<TargetSpace>(data);
});
