//! A storage object's data and checksum files, whatever bytes they hold: opening, reading,
//! scrubbing and writing give data that matches its checksums or an error; never a panic or a
//! hang. The first two bytes split the input between the two files.
#![no_main]

use std::path::Path;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use oss::engine::mem::MemEngine;
use oss::engine::Engine;
use oss::object::Object;
use proto::ost::WriteStamp;
use proto::Fid;

fuzz_target!(|data: &[u8]| {
    let Some((split, rest)) = data.split_first_chunk::<2>() else {
        return;
    };
    let at = (u16::from_le_bytes(*split) as usize).min(rest.len());
    let (data_bytes, meta_bytes) = rest.split_at(at);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let mem = Arc::new(MemEngine::new(1 << 30));
        let engine: Arc<dyn Engine> = mem.clone();
        let (d, m) = (Path::new("/t/o"), Path::new("/t/o.cs"));
        let fid = Fid::new(1, 1, 0);
        engine.create_dir_all(Path::new("/t")).unwrap();
        drop(Object::create(engine.clone(), fid, d, m).unwrap());
        mem.with_file(d, |f| f.extend_from_slice(data_bytes));
        mem.with_file(m, |f| f.extend_from_slice(meta_bytes));
        let Ok(obj) = Object::open(engine.clone(), fid, d, m).await else {
            return;
        };
        let size = obj.size().await;
        let _ = obj.read(0, size.min(1 << 20)).await;
        if size <= 64 << 20 {
            let _ = obj.scrub().await;
        }
        let block = [0x5au8; 100];
        if obj.write(10, &block, false, WriteStamp::default(), 0).await.is_ok() {
            let back = obj.read(10, 100).await.expect("a block just written reads back");
            assert_eq!(&back[..], &block[..]);
        }
    });
});
