//! A hostile client's session: an MDS and two storage servers running in this process with
//! authentication on, and a client holding the client key that sends them whatever the input
//! says, as the wire protocol allows and as it does not. Messages are built from a live
//! namespace (the FIDs, objects, handles and capabilities the session has seen), then some are
//! mutated byte by byte.
//!
//! After every input: nothing panicked (a panic anywhere aborts), the namespace passes `fsck`,
//! the victim's files (0600 and 0644, under a directory of the victim's) are byte for byte as
//! they were, no capability granted to the attacker names the victim's objects with rights it
//! lacks, and no read of the victim's private bytes succeeded.
#![no_main]

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use arbitrary::Arbitrary;
use client::{Client, ClientConfig, OpenOptions};
use cluster::{Cluster, ClusterBuilder, Network};
use libfuzzer_sys::fuzz_target;
use lnet::tcp::{TcpConfig, TcpEndpoint};
use lnet::{NetError, Registered, Transport};
use mds::identity::{NodeGroup, Nodemap};
use oss::engine::mem::MemEngine;
use proto::capa::{Capability, Grant};
use proto::md::*;
use proto::ost::*;
use proto::{Fid, Nid, Opcode, Rpc};

const T: Duration = Duration::from_secs(5);
const VICTIM: u32 = 1000;
const ATTACKER: u32 = 2000;
const SECRET: &[u8] = b"private bytes of the victim";

struct World {
    cluster: Cluster,
    victim: Client,
    raw: TcpEndpoint,
    mds: Nid,
    oss: Vec<(u32, Nid)>,
    /// The victim's private file, its private file on the MDS, its readable file.
    secret: Inode,
    small: Inode,
    dirs: Vec<Fid>,
    /// Every FID and object the session has seen, and the grants it was given.
    seen: Mutex<Seen>,
    buf: Registered<Vec<u8>>,
}

#[derive(Default)]
struct Seen {
    fids: Vec<Fid>,
    objects: Vec<(u32, Fid)>,
    caps: Vec<(u32, Fid, Capability)>,
    seq: u64,
}

/// The runtime the servers and the attacker run on.
fn rt() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    })
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        rt().block_on(async {
            let dir =
                std::env::temp_dir().join(format!("lode-fuzz-session-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            let nodemap = Nodemap {
                groups: vec![NodeGroup {
                    nodes: vec!["127.0.0.0/8".parse().unwrap()],
                    trusted: false,
                    uids: vec![(ATTACKER, ATTACKER)],
                    gids: vec![(ATTACKER, ATTACKER)],
                }],
                ..Nodemap::default()
            };
            let cluster = ClusterBuilder::new(Network::Loopback, &dir)
                .storage_server(vec![Arc::new(MemEngine::new(1 << 30))])
                .storage_server(vec![Arc::new(MemEngine::new(1 << 30))])
                .maintain_every(Duration::from_millis(50))
                .nodemap(nodemap)
                .start()
                .await
                .unwrap();
            let admin = Client::connect_on(
                TcpEndpoint::client(TcpConfig {
                    security: cluster.server_security(),
                    ..TcpConfig::default()
                })
                .into(),
                &cluster.mds().nid().to_string(),
                ClientConfig {
                    creds: Creds::root(),
                    ..ClientConfig::default()
                },
            )
            .await
            .unwrap();
            cluster
                .wait_ready(&admin, 2, Duration::from_secs(20))
                .await
                .unwrap();
            admin.mkdir("/home", 0o755).await.unwrap();
            admin.mkdir("/home/victim", 0o755).await.unwrap();
            admin
                .setattr(
                    "/home/victim",
                    SetAttr {
                        uid: Some(VICTIM),
                        gid: Some(VICTIM),
                        ..SetAttr::default()
                    },
                )
                .await
                .unwrap();
            admin.mkdir("/shared", 0o777).await.unwrap();
            let victim = admin.as_user(Creds {
                uid: VICTIM,
                gid: VICTIM,
                groups: vec![],
            });
            victim.mkdir("/home/victim/dom", 0o755).await.unwrap();
            let opts: Vec<String> = "-E 64K -L mdt".split(' ').map(String::from).collect();
            victim
                .setstripe(
                    "/home/victim/dom",
                    client::stripe_args::parse(&opts).unwrap(),
                )
                .await
                .unwrap();
            for (path, mode) in [
                ("/home/victim/secret", 0o600),
                ("/home/victim/notes", 0o644),
                ("/home/victim/dom/small", 0o600),
            ] {
                let f = OpenOptions::new()
                    .write(true)
                    .create(true)
                    .mode(mode)
                    .open(&victim, path)
                    .await
                    .unwrap();
                f.write_at(0, SECRET).await.unwrap();
                f.close().await.unwrap();
            }
            victim.sync().await.unwrap();
            let secret = victim.stat("/home/victim/secret").await.unwrap();
            let small = victim.stat("/home/victim/dom/small").await.unwrap();
            let notes = victim.stat("/home/victim/notes").await.unwrap();
            let mut dirs = vec![proto::fid::ROOT];
            for d in ["/home", "/home/victim", "/home/victim/dom", "/shared"] {
                dirs.push(admin.stat(d).await.unwrap().fid);
            }
            let mut oss = vec![];
            for i in 0..cluster.storage_servers() {
                let o = cluster.oss(i).unwrap();
                for t in o.indices() {
                    oss.push((t, o.nid()));
                }
            }
            let raw = TcpEndpoint::client(TcpConfig {
                security: cluster.client_security(),
                ..TcpConfig::default()
            });
            let buf = raw.register(vec![0u8; 1 << 16]).unwrap();
            let mut seen = Seen::default();
            for i in [&secret, &small, &notes] {
                seen.fids.push(i.fid);
                seen.objects.extend(
                    i.layout
                        .iter()
                        .flat_map(|l| &l.components)
                        .flat_map(|c| c.objects.iter().map(|o| (o.target, o.fid))),
                );
            }
            seen.fids.extend(dirs.iter().copied());
            let mds = cluster.mds().nid();
            World {
                cluster,
                victim,
                raw,
                mds,
                oss,
                secret,
                small,
                dirs,
                seen: Mutex::new(seen),
                buf,
            }
        })
    })
}

/// One request, its fields drawn from what the session has seen.
#[derive(Arbitrary, Debug)]
enum Op {
    Open {
        fid: u8,
        handle: u8,
        who: u8,
        path: bool,
    },
    Close {
        fid: u8,
        handle: u8,
    },
    Change {
        m: Change,
        open: Option<u8>,
        who: u8,
        seq: Option<u8>,
        acked: u8,
    },
    ReadMdt {
        fid: u8,
        handle: Option<u8>,
        who: u8,
        offset: u16,
        len: u16,
    },
    Getattr {
        fid: u8,
        who: u8,
    },
    Lookup {
        dir: u8,
        name: u8,
        who: u8,
    },
    Readdir {
        dir: u8,
        who: u8,
    },
    Connect {
        id: u8,
    },
    Reopen {
        fid: u8,
        handle: u8,
    },
    Scan {
        target: Option<u8>,
    },
    Object {
        obj: u8,
        capa: Capa,
        what: ObjectOp,
    },
    /// A request built as above, then with one byte changed.
    Mutated {
        op: Box<Op>,
        at: u16,
        xor: u8,
    },
    /// Any bytes under any MDS or OST opcode.
    Raw {
        opcode: u16,
        body: Vec<u8>,
    },
}

#[derive(Arbitrary, Debug)]
enum Change {
    Create {
        dir: u8,
        name: u8,
        mode: u16,
        dir_kind: bool,
    },
    Link {
        fid: u8,
        dir: u8,
        name: u8,
    },
    Unlink {
        dir: u8,
        name: u8,
    },
    Rename {
        dir: u8,
        name: u8,
        to_dir: u8,
        to_name: u8,
    },
    Setattr {
        fid: u8,
        size: Option<u16>,
        mode: Option<u16>,
        uid: Option<u16>,
    },
    GrowSize {
        fid: u8,
        size: u32,
    },
    WriteMdt {
        fid: u8,
        offset: u16,
        len: u8,
    },
    SetXattr {
        fid: u8,
        name: u8,
        len: u16,
    },
    MirrorState {
        fid: u8,
        mirror: u8,
        stale: bool,
    },
    PlaceMirror {
        fid: u8,
        mirror: u8,
    },
}

#[derive(Arbitrary, Debug)]
enum Capa {
    None,
    Seen(u8),
    Forged {
        rights: u8,
        expiry: u64,
        mac: [u8; 16],
    },
}

#[derive(Arbitrary, Debug)]
enum ObjectOp {
    Getattr,
    Read { offset: u16, len: u16 },
    Write { offset: u16, len: u16 },
    Truncate { size: u16 },
    Punch { offset: u16, len: u16 },
}

fn pick<T: Copy>(v: &[T], i: u8) -> T {
    v[i as usize % v.len()]
}

fn creds(who: u8) -> Creds {
    let uid = [ATTACKER, VICTIM, 0][who as usize % 3];
    Creds {
        uid,
        gid: uid,
        groups: vec![VICTIM],
    }
}

fn name(n: u8) -> Vec<u8> {
    match n % 8 {
        7 => b"secret".to_vec(),
        6 => b"..".to_vec(),
        _ => format!("f{}", n % 16).into_bytes(),
    }
}

const ID: u128 = 0xa77a_c4e5_0000_0000_0000_0000_0000_0001;

fn handle(h: u8) -> OpenHandle {
    OpenHandle {
        client: ID + u128::from(h % 4),
        handle: u64::from(h % 16),
    }
}

/// The request `op` stands for: its opcode, body, peer and the bulk memory it lends.
type Built = (Opcode, Vec<u8>, Nid, Option<proto::bulk::BulkGrant>);

fn build(w: &World, op: &Op) -> Option<Built> {
    let s = w.seen.lock().unwrap();
    let fid = |i: u8| pick(&s.fids, i);
    let dir = |i: u8| pick(&w.dirs, i);
    let enc = |body: Vec<u8>, op: Opcode| Some((op, body, w.mds.clone(), None));
    fn body<R: Rpc>(r: &R) -> Vec<u8> {
        proto::msg::encode_body(r).unwrap()
    }
    match op {
        Op::Open {
            fid: f,
            handle: h,
            who,
            path,
        } => {
            let r = MdsOpen {
                fid: fid(*f),
                handle: handle(*h),
                creds: creds(*who),
                path: path.then(|| "/shared/f1".to_owned()),
                lease: None,
            };
            enc(body(&r), MdsOpen::OPCODE)
        }
        Op::Close { fid: f, handle: h } => {
            let r = MdsClose {
                fid: fid(*f),
                handle: handle(*h),
            };
            enc(body(&r), MdsClose::OPCODE)
        }
        Op::Change {
            m,
            open,
            who,
            seq,
            acked,
        } => {
            let mutation = match m {
                Change::Create {
                    dir: d,
                    name: n,
                    mode,
                    dir_kind,
                } => Mutation::Create {
                    parent: dir(*d),
                    name: name(*n),
                    kind: if *dir_kind { Kind::Dir } else { Kind::File },
                    mode: u32::from(*mode) & 0o7777,
                    exclusive: false,
                    target: vec![],
                    layout: None,
                },
                Change::Link {
                    fid: f,
                    dir: d,
                    name: n,
                } => Mutation::Link {
                    fid: fid(*f),
                    parent: dir(*d),
                    name: name(*n),
                },
                Change::Unlink { dir: d, name: n } => Mutation::Unlink {
                    parent: dir(*d),
                    name: name(*n),
                    dir: false,
                },
                Change::Rename {
                    dir: d,
                    name: n,
                    to_dir,
                    to_name,
                } => Mutation::Rename {
                    parent: dir(*d),
                    name: name(*n),
                    new_parent: dir(*to_dir),
                    new_name: name(*to_name),
                    flags: Default::default(),
                },
                Change::Setattr {
                    fid: f,
                    size,
                    mode,
                    uid,
                } => Mutation::Setattr {
                    fid: fid(*f),
                    attr: SetAttr {
                        size: size.map(u64::from),
                        mode: mode.map(|m| u32::from(m) & 0o7777),
                        uid: uid.map(u32::from),
                        ..SetAttr::default()
                    },
                },
                Change::GrowSize { fid: f, size } => Mutation::GrowSize {
                    fid: fid(*f),
                    size: u64::from(*size),
                },
                Change::WriteMdt {
                    fid: f,
                    offset,
                    len,
                } => Mutation::WriteMdt {
                    fid: fid(*f),
                    offset: u64::from(*offset),
                    data: vec![0x41; *len as usize],
                },
                Change::SetXattr {
                    fid: f,
                    name: n,
                    len,
                } => Mutation::SetXattr {
                    fid: fid(*f),
                    name: format!("user.x{}", n % 8),
                    value: vec![7; *len as usize],
                },
                Change::MirrorState {
                    fid: f,
                    mirror,
                    stale,
                } => Mutation::MirrorState {
                    fid: fid(*f),
                    mirror: u16::from(*mirror % 3),
                    stale: *stale,
                    generation: 1,
                },
                Change::PlaceMirror { fid: f, mirror } => Mutation::PlaceMirror {
                    fid: fid(*f),
                    mirror: u16::from(*mirror % 3),
                    generation: 1,
                    exclude: vec![],
                    components: vec![],
                },
            };
            let r = MdsReint {
                creds: creds(*who),
                mutation,
                req: seq.map(|q| ReqId {
                    client: ID,
                    seq: s.seq.saturating_sub(u64::from(q % 4)) + 1,
                }),
                acked: u64::from(*acked),
                open: open.map(handle),
                size_gen: None,
                behind: false,
                lease: false,
                time: None,
            };
            enc(body(&r), MdsReint::OPCODE)
        }
        Op::ReadMdt {
            fid: f,
            handle: h,
            who,
            offset,
            len,
        } => {
            let r = MdsReadMdt {
                fid: fid(*f),
                handle: h.map(handle),
                creds: creds(*who),
                offset: u64::from(*offset),
                len: u32::from(*len),
                lease: None,
            };
            enc(body(&r), MdsReadMdt::OPCODE)
        }
        Op::Getattr { fid: f, who } => enc(
            body(&MdsGetattr {
                fid: fid(*f),
                creds: creds(*who),
                lease: None,
            }),
            MdsGetattr::OPCODE,
        ),
        Op::Lookup {
            dir: d,
            name: n,
            who,
        } => enc(
            body(&MdsLookup {
                creds: creds(*who),
                parent: dir(*d),
                name: name(*n),
                lease: None,
            }),
            MdsLookup::OPCODE,
        ),
        Op::Readdir { dir: d, who } => enc(
            body(&MdsReaddir {
                creds: creds(*who),
                dir: dir(*d),
                after: vec![],
                max: 64,
                plus: true,
                lease: None,
            }),
            MdsReaddir::OPCODE,
        ),
        Op::Connect { id } => enc(
            body(&MdsConnect {
                client: ID + u128::from(*id % 4),
            }),
            MdsConnect::OPCODE,
        ),
        Op::Reopen { fid: f, handle: h } => enc(
            body(&MdsReopen {
                handles: vec![(fid(*f), handle(*h))],
            }),
            MdsReopen::OPCODE,
        ),
        Op::Scan { target } => enc(
            body(&MdsMirrorScan {
                after: None,
                max: 16,
                stale: target.is_none(),
                target: target.map(|t| u32::from(t % 2)),
            }),
            MdsMirrorScan::OPCODE,
        ),
        Op::Object { obj, capa, what } => {
            let (target, ofid) = pick(&s.objects, *obj);
            let capa = match capa {
                Capa::None => None,
                Capa::Seen(i) if !s.caps.is_empty() => Some(pick(&s.caps, *i).2),
                Capa::Seen(_) => None,
                Capa::Forged {
                    rights,
                    expiry,
                    mac,
                } => Some(Capability {
                    rights: *rights,
                    expiry: *expiry,
                    mac: *mac,
                }),
            };
            let peer = w.oss.iter().find(|(t, _)| *t == target)?.1.clone();
            let mut bulk = None;
            let (op, b) = match what {
                ObjectOp::Getattr => (
                    OstGetattr::OPCODE,
                    body(&OstGetattr {
                        target,
                        fid: ofid,
                        capa,
                    }),
                ),
                ObjectOp::Read { offset, len } => {
                    let r = OstRead {
                        target,
                        fid: ofid,
                        offset: u64::from(*offset),
                        desc: w.buf.desc(0, u32::from(*len).max(1), false).ok()?,
                        capa,
                    };
                    bulk = r.bulk();
                    (OstRead::OPCODE, body(&r))
                }
                ObjectOp::Write { offset, len } => {
                    let r = OstWrite {
                        target,
                        fid: ofid,
                        offset: u64::from(*offset),
                        desc: w.buf.desc(0, u32::from(*len).max(1), true).ok()?,
                        sync: false,
                        stamp: Default::default(),
                        capa,
                    };
                    bulk = r.bulk();
                    (OstWrite::OPCODE, body(&r))
                }
                ObjectOp::Truncate { size } => (
                    OstTruncate::OPCODE,
                    body(&OstTruncate {
                        target,
                        fid: ofid,
                        size: u64::from(*size),
                        stamp: Default::default(),
                        capa,
                    }),
                ),
                ObjectOp::Punch { offset, len } => (
                    OstPunch::OPCODE,
                    body(&OstPunch {
                        target,
                        fid: ofid,
                        offset: u64::from(*offset),
                        len: u64::from(*len),
                        stamp: Default::default(),
                        capa,
                    }),
                ),
            };
            Some((op, b, peer, bulk))
        }
        Op::Mutated { op, at, xor } => {
            drop(s);
            let (code, mut b, peer, bulk) = build(w, op)?;
            if !b.is_empty() {
                let i = *at as usize % b.len();
                b[i] ^= xor | 1;
            }
            Some((code, b, peer, bulk))
        }
        Op::Raw { opcode, body } => {
            let all = proto::msg::opcodes::ALL;
            let code = all[*opcode as usize % all.len()];
            let peer = if code.0 >= 0x0200 {
                w.oss[0].1.clone()
            } else {
                w.mds.clone()
            };
            Some((code, body.clone(), peer, None))
        }
    }
}

/// Whether a grant gives rights on the victim's private objects.
fn grants_private(w: &World, g: &Grant) -> bool {
    let private: Vec<(u32, Fid)> = [&w.secret, &w.small]
        .into_iter()
        .flat_map(|i| i.layout.iter())
        .flat_map(|l| &l.components)
        .flat_map(|c| c.objects.iter().map(|o| (o.target, o.fid)))
        .collect();
    g.rights != 0
        && g.objects
            .iter()
            .any(|o| private.contains(&(o.target, o.object)))
}

/// Learns what a reply shows (FIDs, objects, capabilities) and checks it grants nothing it
/// must not.
fn learn(w: &World, code: Opcode, op: &Op, reply: &[u8]) {
    let mut s = w.seen.lock().unwrap();
    let inode_seen = |s: &mut Seen, i: &Inode| {
        if !s.fids.contains(&i.fid) && s.fids.len() < 256 {
            s.fids.push(i.fid);
        }
        for c in i.layout.iter().flat_map(|l| &l.components) {
            for o in &c.objects {
                if !s.objects.contains(&(o.target, o.fid)) && s.objects.len() < 256 {
                    s.objects.push((o.target, o.fid));
                }
            }
        }
    };
    let grant_seen = |s: &mut Seen, g: &Grant| {
        assert!(!grants_private(w, g), "the attacker was granted {g:?}");
        for o in &g.objects {
            if s.caps.len() < 256 {
                s.caps.push((
                    o.target,
                    o.object,
                    Capability {
                        rights: g.rights,
                        expiry: g.expiry,
                        mac: o.mac,
                    },
                ));
            }
        }
    };
    if code == MdsOpen::OPCODE {
        if let Ok(r) = proto::msg::decode_body::<MdsOpened>(reply) {
            inode_seen(&mut s, &r.inode);
            grant_seen(&mut s, &r.grant);
            if r.inode.fid == w.small.fid || r.inode.fid == w.secret.fid {
                assert!(r.mdt.is_empty(), "the victim's bytes came with an open");
            }
        }
    } else if code == MdsReint::OPCODE {
        if let Ok(r) = proto::msg::decode_body::<MdsReintReply>(reply) {
            if let Some(i) = &r.inode {
                inode_seen(&mut s, i);
            }
            if let Some(g) = &r.grant {
                grant_seen(&mut s, g);
            }
        }
    } else if code == MdsReadMdt::OPCODE {
        if let Ok(r) = proto::msg::decode_body::<MdsMdtData>(reply) {
            assert!(
                r.inode.fid != w.small.fid || r.data.is_empty(),
                "the victim's bytes on the MDS were read"
            );
        }
    } else if code == OstRead::OPCODE {
        if let Op::Object { obj, .. } = op {
            let o = pick(&s.objects, *obj);
            let private = [&w.secret]
                .into_iter()
                .flat_map(|i| i.layout.iter())
                .flat_map(|l| &l.components)
                .any(|c| c.objects.iter().any(|x| (x.target, x.fid) == o));
            if let Ok(r) = proto::msg::decode_body::<OstReadDone>(reply) {
                assert!(!private || r.bytes == 0, "the victim's object was read");
            }
        }
    }
    s.seq += 1;
}

/// The victim's files are as they were and the namespace is sound.
async fn check(w: &World) {
    for (path, want) in [
        ("/home/victim/secret", SECRET),
        ("/home/victim/notes", SECRET),
        ("/home/victim/dom/small", SECRET),
    ] {
        let f = OpenOptions::new()
            .read(true)
            .open(&w.victim, path)
            .await
            .unwrap_or_else(|e| panic!("the victim opens {path}: {e}"));
        let mut buf = vec![0u8; want.len() + 16];
        let n = f.read_at(0, &mut buf).await.unwrap();
        assert_eq!(&buf[..n], want, "{path} changed");
        f.close().await.unwrap();
        let st = w.victim.stat(path).await.unwrap();
        assert_eq!(
            (st.uid, st.mode & 0o7777 & !0o044),
            (VICTIM, 0o600),
            "{path}"
        );
    }
    let problems = w.cluster.mds().fsck();
    assert!(problems.is_empty(), "fsck: {problems:?}");
}

fuzz_target!(|data: &[u8]| {
    let w = world();
    let mut u = arbitrary::Unstructured::new(data);
    let Ok(ops) = u.arbitrary::<Vec<Op>>() else {
        return;
    };
    rt().block_on(async {
        for op in ops.iter().take(32) {
            let Some((code, body, peer, bulk)) = build(w, op) else {
                continue;
            };
            match w.raw.call_raw(&peer, code, body, bulk, T).await {
                Ok(reply) => learn(w, code, op, &reply),
                Err(NetError::Remote { .. }) | Err(NetError::Busy { .. }) => {}
                Err(e) if e.is_retryable() => {}
                Err(e) => panic!("{code:?}: not an answer but {e}"),
            }
        }
        check(w).await;
    });
});
