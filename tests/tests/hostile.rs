//! A hostile client: it holds a valid client key and speaks the wire protocol itself, with none
//! of the client library's checks, and tries to reach what its user may not. Each test is one
//! attack; each must end in a clear refusal with nothing changed on the servers (checked
//! afterwards through an honest client and `fsck`), and the servers keep serving others.
//!
//! The cluster: an MDS and two storage servers on loopback with authentication on. The victim
//! (uid 1000) works through an administrator's connection (the cluster key: its claims are
//! taken as made); the attacker's node is mapped to uid and gid 2000 only, so the attacker is
//! uid 2000 whatever it claims.

use std::sync::Arc;
use std::time::{Duration, Instant};

use client::{Client, ClientConfig, OpenOptions};
use cluster::{Cluster, ClusterBuilder, Network};
use lnet::auth::{Role, Security};
use lnet::tcp::{TcpConfig, TcpEndpoint};
use lnet::{call, NetError, Transport};
use mds::identity::{NodeGroup, Nodemap};
use oss::engine::mem::MemEngine;
use proto::capa::Capability;
use proto::md::*;
use proto::{Fid, FsErrorKind, Nid, Rpc, StatusCode};

const T: Duration = Duration::from_secs(10);
const VICTIM: u32 = 1000;
const ATTACKER: u32 = 2000;
const SECRET: &[u8] = b"the victim's weights, which nobody else may read";

fn victim_creds() -> Creds {
    Creds {
        uid: VICTIM,
        gid: VICTIM,
        groups: vec![],
    }
}

fn attacker_creds() -> Creds {
    Creds {
        uid: ATTACKER,
        gid: ATTACKER,
        groups: vec![],
    }
}

/// The cluster, the victim's client, its files, and the attacker's raw endpoint.
struct Stage {
    c: Cluster,
    admin: Client,
    victim: Client,
    /// `/home/victim/secret`, mode 0600, its bytes on the storage servers.
    secret: Inode,
    /// `/home/victim/small`, mode 0600, its bytes on the MDS (Data-on-MDT).
    small: Inode,
    /// `/home/victim/notes`, mode 0644: the attacker may read it, not write it.
    notes: Inode,
    /// `/shared`, mode 0777: where the attacker may make names.
    shared: Inode,
    raw: TcpEndpoint,
    mds: Nid,
    /// The attacker's client id, and the next request number.
    id: u128,
    seq: std::sync::atomic::AtomicU64,
}

async fn stage(name: &str) -> Stage {
    stage_with(name, |b| b).await
}

async fn stage_with(name: &str, f: impl FnOnce(ClusterBuilder) -> ClusterBuilder) -> Stage {
    let dir = std::env::temp_dir().join(format!("lode-hostile-{name}-{}", std::process::id()));
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
    let b = ClusterBuilder::new(Network::Loopback, &dir)
        .storage_server(vec![Arc::new(MemEngine::new(1 << 30))])
        .storage_server(vec![Arc::new(MemEngine::new(1 << 30))])
        .heartbeat(Duration::from_millis(100), Duration::from_secs(2))
        .maintain_every(Duration::from_millis(50))
        .nodemap(nodemap);
    let c = f(b).start().await.unwrap();
    let net = TcpEndpoint::client(TcpConfig {
        security: c.server_security(),
        ..TcpConfig::default()
    });
    let admin = Client::connect_on(
        net.into(),
        &c.mds().nid().to_string(),
        ClientConfig {
            creds: Creds::root(),
            ..ClientConfig::default()
        },
    )
    .await
    .unwrap();
    c.wait_ready(&admin, 2, Duration::from_secs(20))
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
    let victim = admin.as_user(victim_creds());
    let write = |path: &'static str, mode: u32, data: &'static [u8]| {
        let victim = victim.clone();
        async move {
            let f = OpenOptions::new()
                .write(true)
                .create(true)
                .mode(mode)
                .open(&victim, path)
                .await
                .unwrap();
            f.write_at(0, data).await.unwrap();
            f.close().await.unwrap();
        }
    };
    write("/home/victim/secret", 0o600, SECRET).await;
    write("/home/victim/notes", 0o644, SECRET).await;
    victim.mkdir("/home/victim/dom", 0o755).await.unwrap();
    let opts: Vec<String> = "-E 64K -L mdt".split(' ').map(String::from).collect();
    victim
        .setstripe(
            "/home/victim/dom",
            client::stripe_args::parse(&opts).unwrap(),
        )
        .await
        .unwrap();
    write("/home/victim/dom/small", 0o600, SECRET).await;
    victim.sync().await.unwrap();
    let secret = victim.stat("/home/victim/secret").await.unwrap();
    let small = victim.stat("/home/victim/dom/small").await.unwrap();
    let notes = victim.stat("/home/victim/notes").await.unwrap();
    let shared = admin.stat("/shared").await.unwrap();
    let raw = TcpEndpoint::client(TcpConfig {
        security: c.client_security(),
        ..TcpConfig::default()
    });
    let mds = c.mds().nid();
    Stage {
        c,
        admin,
        victim,
        secret,
        small,
        notes,
        shared,
        raw,
        mds,
        id: 0xa77a_c4e5_0000_0000_0000_0000_0000_0001,
        seq: 1.into(),
    }
}

/// The refusal's kind, or a panic naming what went through.
fn refused<T: std::fmt::Debug>(what: &str, out: Result<T, NetError>) -> StatusCode {
    match out {
        Ok(v) => panic!("{what} went through: {v:?}"),
        Err(NetError::Remote { err, .. }) => err.code,
        Err(e) => panic!("{what}: not a refusal but {e}"),
    }
}

fn denied(code: StatusCode) -> bool {
    matches!(
        code,
        StatusCode::Fs(FsErrorKind::AccessDenied) | StatusCode::Fs(FsErrorKind::NotPermitted)
    )
}

impl Stage {
    async fn mds_call<R: Rpc>(&self, r: &R) -> Result<R::Reply, NetError> {
        call(&self.raw, &self.mds, r, T).await
    }

    fn handle(&self, h: u64) -> OpenHandle {
        OpenHandle {
            client: self.id,
            handle: h,
        }
    }

    /// A change as the attacker sends it: its own identity claimed, a fresh request number.
    fn reint(&self, mutation: Mutation, open: Option<OpenHandle>) -> MdsReint {
        MdsReint {
            creds: attacker_creds(),
            mutation,
            req: Some(ReqId {
                client: self.id,
                seq: self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            }),
            acked: 0,
            open,
            size_gen: None,
            behind: false,
            lease: false,
            time: None,
        }
    }

    /// A create of a new file `name` (mode `mode`) in the shared directory.
    fn new_file(&self, name: &str, mode: u32) -> Mutation {
        Mutation::Create {
            parent: self.shared.fid,
            name: name.as_bytes().to_vec(),
            kind: Kind::File,
            mode,
            exclusive: true,
            target: vec![],
            layout: None,
        }
    }

    /// The victim's files are as the victim left them, the namespace passes `fsck`, and an
    /// honest client is served.
    async fn unchanged(&self) {
        for (path, want) in [
            ("/home/victim/secret", SECRET),
            ("/home/victim/notes", SECRET),
            ("/home/victim/dom/small", SECRET),
        ] {
            let f = OpenOptions::new()
                .read(true)
                .open(&self.victim, path)
                .await
                .unwrap_or_else(|e| panic!("the victim opens {path}: {e}"));
            let mut buf = vec![0u8; want.len() + 64];
            let n = f.read_at(0, &mut buf).await.unwrap();
            assert_eq!(&buf[..n], want, "{path} changed");
            f.close().await.unwrap();
            let st = self.victim.stat(path).await.unwrap();
            assert_eq!(st.size, want.len() as u64, "{path}'s size");
            assert_eq!(st.uid, VICTIM, "{path}'s owner");
        }
        let secret = self.victim.stat("/home/victim/secret").await.unwrap();
        assert_eq!(secret.mode & 0o7777, 0o600);
        assert_eq!(secret.nlink, 1, "no name was added to the secret");
        assert_eq!(
            secret
                .layout
                .as_ref()
                .map(|l| l.mirror_count())
                .unwrap_or(1),
            1,
            "no mirror was added"
        );
        let problems = self.c.mds().fsck();
        assert!(problems.is_empty(), "fsck: {problems:?}");
    }

    async fn stop(self) {
        self.c.stop().await;
    }
}

/// Linking someone else's file into a directory of one's own, with an open, used to return
/// read and write capabilities for every one of its objects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_to_anothers_file_with_an_open_is_refused_and_grants_nothing() {
    let s = stage("link").await;
    let handles = s.c.mds().open_handles();
    let m = Mutation::Link {
        fid: s.secret.fid,
        parent: s.shared.fid,
        name: b"mine".to_vec(),
    };
    let code = refused(
        "a link of the secret",
        s.mds_call(&s.reint(m, Some(s.handle(1)))).await,
    );
    assert!(denied(code), "{code:?}");
    assert!(s.admin.stat("/shared/mine").await.is_err(), "no name made");
    assert_eq!(s.c.mds().open_handles(), handles, "no handle counted");
    s.unchanged().await;
    s.stop().await;
}

/// A name the attacker may make (a file of its own) with an open on any change that is not a
/// create: the open means nothing and grants nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_on_a_change_that_is_not_a_create_grants_nothing() {
    let s = stage("rename-open").await;
    // A file the victim left in the shared directory (mode 0600): the directory lets anyone
    // rename it, which answers with its inode.
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .mode(0o600)
        .open(&s.victim, "/shared/left")
        .await
        .unwrap();
    f.write_at(0, SECRET).await.unwrap();
    f.close().await.unwrap();
    s.victim.sync().await.unwrap();
    let handles = s.c.mds().open_handles();
    let m = Mutation::Rename {
        parent: s.shared.fid,
        name: b"left".to_vec(),
        new_parent: s.shared.fid,
        new_name: b"moved".to_vec(),
        flags: Default::default(),
    };
    let r = s.reint(m, Some(s.handle(7)));
    let reply = s
        .mds_call(&r)
        .await
        .expect("renaming in a 0777 directory is allowed");
    assert!(
        reply
            .grant
            .as_ref()
            .is_none_or(|g| g.rights == 0 && g.objects.is_empty()),
        "a rename granted {:?}",
        reply.grant
    );
    // The same request number sent again as a create that opens: answered from the reply
    // cache, it must not count as the creator's.
    let resend = MdsReint {
        mutation: Mutation::Create {
            parent: s.shared.fid,
            name: b"moved".to_vec(),
            kind: Kind::File,
            mode: 0o666,
            exclusive: false,
            target: vec![],
            layout: None,
        },
        ..r
    };
    let out = s.mds_call(&resend).await;
    if let Ok(reply) = out {
        assert!(
            reply.grant.as_ref().is_none_or(|g| g.rights == 0),
            "a resent number granted {:?}",
            reply.grant
        );
    }
    assert_eq!(s.c.mds().open_handles(), handles, "no handle counted");
    s.unchanged().await;
    s.stop().await;
}

/// An open of a file the caller may neither read nor write used to count a handle, which then
/// allowed truncating, growing, writing the MDS's bytes and marking mirrors as root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_without_rights_is_refused_and_its_handle_allows_nothing() {
    let s = stage("open-norights").await;
    let handles = s.c.mds().open_handles();
    let h = s.handle(1);
    for fid in [s.secret.fid, s.small.fid] {
        let open = MdsOpen {
            fid,
            handle: h,
            creds: attacker_creds(),
            path: None,
            lease: None,
        };
        let code = refused("an open of a 0600 file", s.mds_call(&open).await);
        assert!(denied(code), "{code:?}");
    }
    assert_eq!(s.c.mds().open_handles(), handles, "no handle counted");
    // What the handle would have allowed, each refused.
    let attacks = [
        (
            "a truncate",
            s.secret.fid,
            Mutation::Setattr {
                fid: s.secret.fid,
                attr: SetAttr {
                    size: Some(0),
                    ..SetAttr::default()
                },
            },
        ),
        (
            "a grown size",
            s.secret.fid,
            Mutation::GrowSize {
                fid: s.secret.fid,
                size: 1 << 30,
            },
        ),
        (
            "a write of the MDS's bytes",
            s.small.fid,
            Mutation::WriteMdt {
                fid: s.small.fid,
                offset: 0,
                data: b"overwritten".to_vec(),
            },
        ),
    ];
    for (what, _fid, m) in attacks {
        let code = refused(what, s.mds_call(&s.reint(m, Some(h))).await);
        assert!(denied(code), "{what}: {code:?}");
    }
    let read = MdsReadMdt {
        fid: s.small.fid,
        handle: Some(h),
        creds: attacker_creds(),
        offset: 0,
        len: 4096,
        lease: None,
    };
    let code = refused("a read of the MDS's bytes", s.mds_call(&read).await);
    assert!(denied(code), "{code:?}");
    s.unchanged().await;
    s.stop().await;
}

/// A handle opened for reading (the file's mode lets the attacker read it) allows reading:
/// not truncating, growing, writing the MDS's bytes, placing mirrors or clearing stale ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_handle_cannot_change_the_file() {
    let s = stage("readonly-handle").await;
    let h = s.handle(3);
    let open = MdsOpen {
        fid: s.notes.fid,
        handle: h,
        creds: attacker_creds(),
        path: Some("/home/victim/notes".into()),
        lease: None,
    };
    let opened = s
        .mds_call(&open)
        .await
        .expect("a 0644 file opens for reading");
    assert_eq!(opened.grant.rights, proto::capa::READ, "read only");
    let changes = [
        (
            "a truncate",
            Mutation::Setattr {
                fid: s.notes.fid,
                attr: SetAttr {
                    size: Some(1),
                    ..SetAttr::default()
                },
            },
        ),
        (
            "a grown size",
            Mutation::GrowSize {
                fid: s.notes.fid,
                size: 1 << 40,
            },
        ),
        (
            "a mirror placed",
            Mutation::PlaceMirror {
                fid: s.notes.fid,
                mirror: 1,
                generation: s.notes.layout.as_ref().map_or(0, |l| l.generation),
                exclude: vec![],
                components: vec![],
            },
        ),
        (
            "a mirror declared in sync",
            Mutation::MirrorState {
                fid: s.notes.fid,
                mirror: 0,
                stale: false,
                generation: s.notes.layout.as_ref().map_or(0, |l| l.generation),
            },
        ),
    ];
    for (what, m) in changes {
        let code = refused(what, s.mds_call(&s.reint(m, Some(h))).await);
        assert!(
            denied(code) || code == StatusCode::Fs(FsErrorKind::WouldBlock),
            "{what}: {code:?}"
        );
    }
    s.unchanged().await;
    s.stop().await;
}

/// Capabilities the MDS did not grant: made up, for another object, for the other right, or
/// expired. Each is refused by the storage server before it does anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_cross_object_wrong_right_and_expired_capabilities_are_refused() {
    let s = stage_with("capabilities", |b| {
        b.capability_lifetime(Duration::from_secs(2))
    })
    .await;
    let victim_obj = s.secret.layout.as_ref().unwrap().components[0].objects[0];
    let oss = oss_of(&s, victim_obj.target);
    // A file of the attacker's own, and the grant for it.
    let h = s.handle(1);
    let create = s.reint(s.new_file("own", 0o600), Some(h));
    let made = s.mds_call(&create).await.expect("a file of its own");
    let grant = made.grant.expect("a create that opens is granted");
    let own = made.inode.unwrap().layout.unwrap().components[0].objects[0];
    let own_cap = grant.for_object(own.target, own.fid).unwrap();
    let getattr = |fid: Fid, target: u32, capa: Option<Capability>| proto::ost::OstGetattr {
        target,
        fid,
        capa,
    };
    // Made up.
    let forged = Capability {
        rights: proto::capa::READ | proto::capa::WRITE,
        expiry: u64::MAX,
        mac: [0x5a; 16],
    };
    let cases = [
        ("no capability", None),
        ("a forged one", Some(forged)),
        ("one for another object", Some(own_cap)),
    ];
    for (what, capa) in cases {
        let out = call(
            &s.raw,
            &oss,
            &getattr(victim_obj.fid, victim_obj.target, capa),
            T,
        )
        .await;
        let code = refused(what, out);
        assert_eq!(code, StatusCode::Fs(FsErrorKind::AccessDenied), "{what}");
    }
    // Its own capability, with the rights changed: the MAC covers them.
    let mut widened = own_cap;
    widened.rights |= proto::capa::WRITE | proto::capa::READ;
    widened.expiry += 3600;
    let out = call(
        &s.raw,
        &oss,
        &getattr(own.fid, own.target, Some(widened)),
        T,
    )
    .await;
    assert_eq!(
        refused("a widened capability", out),
        StatusCode::Fs(FsErrorKind::AccessDenied)
    );
    // Its own, as granted, works; once expired it does not.
    call(
        &s.raw,
        &oss,
        &getattr(own.fid, own.target, Some(own_cap)),
        T,
    )
    .await
    .expect("its own capability");
    tokio::time::sleep(Duration::from_millis(3100)).await;
    let out = call(
        &s.raw,
        &oss,
        &getattr(own.fid, own.target, Some(own_cap)),
        T,
    )
    .await;
    assert_eq!(
        refused("an expired capability", out),
        StatusCode::Fs(FsErrorKind::AccessDenied)
    );
    s.unchanged().await;
    s.stop().await;
}

fn oss_of(s: &Stage, target: u32) -> Nid {
    for i in 0..s.c.storage_servers() {
        let o = s.c.oss(i).unwrap();
        if o.indices().contains(&target) {
            return o.nid();
        }
    }
    panic!("no storage server holds target {target}");
}

/// Reaching files by FID past directories the caller may not search: the mirror scan (which
/// lists every mirrored file) is for administrators.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_of_files_by_fid_is_for_administrators() {
    let s = stage("scan").await;
    let scan = MdsMirrorScan {
        after: None,
        max: 100,
        stale: false,
        target: Some(0),
    };
    let code = refused("a mirror scan", s.mds_call(&scan).await);
    assert!(denied(code), "{code:?}");
    // The administrator scans.
    s.admin.mirror_scan(false, Some(0)).await.unwrap();
    s.unchanged().await;
    s.stop().await;
}

/// On a node mapped to uid 2000, claiming the victim's uid (or root) makes the caller nobody,
/// not the victim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_uid_the_node_is_not_mapped_to_is_squashed() {
    let s = stage("uid").await;
    for claimed in [VICTIM, 0] {
        let open = MdsOpen {
            fid: s.secret.fid,
            handle: s.handle(u64::from(claimed) + 1),
            creds: Creds {
                uid: claimed,
                gid: claimed,
                groups: vec![VICTIM],
            },
            path: None,
            lease: None,
        };
        let code = refused("an open as another uid", s.mds_call(&open).await);
        assert!(denied(code), "uid {claimed}: {code:?}");
    }
    // What it makes claiming the victim's uid is nobody's.
    let mut r = s.reint(s.new_file("as-victim", 0o644), None);
    r.creds = victim_creds();
    let made = s.mds_call(&r).await.unwrap().inode.unwrap();
    assert_eq!(
        (made.uid, made.gid),
        (mds::identity::NOBODY, mds::identity::NOBODY)
    );
    s.unchanged().await;
    s.stop().await;
}

/// The client key cannot claim the server role, and a client's connection cannot ask for
/// the servers' operations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_key_cannot_claim_the_server_role_or_its_operations() {
    let s = stage("role").await;
    let Security::Keyed { keys, .. } = s.c.client_security() else {
        panic!("authentication is on");
    };
    // The library will not present the client key as a server's...
    let posing = TcpEndpoint::client(TcpConfig {
        security: Security::Keyed {
            keys,
            role: Role::Server,
            privacy: false,
        },
        ..TcpConfig::default()
    });
    let out = call(&posing, &s.mds, &MdsStatfs {}, T).await;
    assert!(
        matches!(
            out,
            Err(NetError::Refused { .. }) | Err(NetError::BadConfig(_))
        ),
        "{out:?}"
    );
    // ...and the client key's secret passed off as a cluster key fails the server's
    // handshake: the server role's secret is derived from the cluster key, which the client
    // key does not give.
    let line = s.c.client_key().unwrap().to_line();
    let secret = line.split_whitespace().nth(3).unwrap();
    let forged = lnet::auth::KeyFile::parse(&format!("lode-key 1 cluster {secret}")).unwrap();
    let posing = TcpEndpoint::client(TcpConfig {
        security: Security::server(Arc::new(lnet::auth::Keyring::new(&forged)), false).unwrap(),
        ..TcpConfig::default()
    });
    for nid in [s.mds.clone(), s.c.oss(0).unwrap().nid()] {
        let out = call(&posing, &nid, &MdsStatfs {}, T).await;
        assert!(
            matches!(out, Err(NetError::Refused { .. })),
            "{nid}: {out:?}"
        );
    }
    // As a client: a heartbeat for targets, and a destroy of every object above 0.
    let hb = proto::registry::Heartbeat {
        oss: s.raw.nid(),
        rails: vec![],
        targets: vec![],
    };
    let code = refused("a heartbeat", s.mds_call(&hb).await);
    assert!(denied(code), "{code:?}");
    let obj = s.secret.layout.as_ref().unwrap().components[0].objects[0];
    let destroy = proto::ost::OstDestroy {
        target: obj.target,
        fid: obj.fid,
    };
    let code = refused(
        "a destroy",
        call(&s.raw, &oss_of(&s, obj.target), &destroy, T).await,
    );
    assert!(denied(code), "{code:?}");
    s.unchanged().await;
    s.stop().await;
}

/// Another holder of the client key answering as a server (an MDS it made up, reached by a
/// client told to use it): the client's handshake asks the server to prove the cluster key's
/// static key, which the client key does not give, and gives up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_key_holder_cannot_pose_as_a_server_to_other_clients() {
    let s = stage("impostor").await;
    let Security::Keyed { keys, .. } = s.c.client_security() else {
        panic!("authentication is on");
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let impostor = tokio::spawn(async move {
        let security = Security::Keyed {
            keys,
            role: Role::Server,
            privacy: false,
        };
        let (mut stream, _) = listener.accept().await.unwrap();
        lnet::auth::accept(&mut stream, &security, T)
            .await
            .map(|_| ())
    });
    let out = call(
        &s.raw,
        &Nid::Tcp(addr),
        &MdsStatfs {},
        Duration::from_secs(3),
    )
    .await;
    assert!(out.is_err(), "a client was served by an impostor: {out:?}");
    let accepted = impostor.await.unwrap();
    assert!(accepted.is_err(), "the impostor's handshake went through");
    s.unchanged().await;
    s.stop().await;
}

/// After a valid handshake: bodies that do not decode, bodies of the wrong message, and the
/// largest body a frame may carry. Each gets a clear error, and the MDS serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_oversized_bodies_are_refused_and_the_mds_serves_on() {
    let s = stage("malformed").await;
    let opcodes = [
        proto::msg::opcodes::MDS_REINT,
        proto::msg::opcodes::MDS_OPEN,
        proto::msg::opcodes::MDS_BATCH,
        proto::msg::opcodes::MDS_READ_MDT,
        proto::msg::opcodes::MDS_LEASE_WAIT,
        proto::msg::opcodes::MDS_REOPEN,
    ];
    let bodies: Vec<Vec<u8>> = vec![
        vec![],
        vec![0xff; 7],
        vec![0xff; 4096],
        (0..=255u8).collect(),
        vec![0x7f; proto::MAX_BODY as usize],
    ];
    for op in opcodes {
        for body in &bodies {
            let out = s.raw.call_raw(&s.mds, op, body.clone(), None, T).await;
            match out {
                Err(NetError::Remote { err, .. }) => assert!(
                    matches!(
                        err.code,
                        StatusCode::BadRequest | StatusCode::Fs(FsErrorKind::Invalid)
                    ),
                    "{op:?} with {} bytes: {err}",
                    body.len()
                ),
                other => panic!("{op:?} with {} bytes: {other:?}", body.len()),
            }
        }
    }
    // A body past the frame limit does not leave the sender.
    let big = vec![0u8; proto::MAX_BODY as usize + 1];
    assert!(s
        .raw
        .call_raw(&s.mds, proto::msg::opcodes::MDS_OPEN, big, None, T)
        .await
        .is_err());
    s.unchanged().await;
    s.stop().await;
}

/// One connection making up client ids: each table kept per client grows only by a bounded
/// number of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_made_up_client_ids_is_bounded_per_connection() {
    let s = stage("ids").await;
    let joined = s.c.mds().clients_joined();
    // One connection.
    let one = TcpEndpoint::client(TcpConfig {
        security: s.c.client_security(),
        conns_per_peer: 1,
        ..TcpConfig::default()
    });
    let mut refused_at = None;
    for i in 0..(mds::peers::IDS_PER_CONNECTION as u128 + 16) {
        let out = call(&one, &s.mds, &MdsConnect { client: s.id + i }, T).await;
        if let Err(e) = out {
            let code = refused("a join", Err::<(), _>(e));
            assert!(denied(code), "{code:?}");
            refused_at.get_or_insert(i);
        }
    }
    assert_eq!(refused_at, Some(mds::peers::IDS_PER_CONNECTION as u128));
    assert_eq!(
        s.c.mds().clients_joined(),
        joined + mds::peers::IDS_PER_CONNECTION,
        "the table grew by the allowance only"
    );
    // Opens under a new id on the same connection are refused too.
    let open = MdsOpen {
        fid: s.notes.fid,
        handle: OpenHandle {
            client: 1 << 120,
            handle: 1,
        },
        creds: attacker_creds(),
        path: None,
        lease: None,
    };
    let out = call(&one, &s.mds, &open, T).await;
    assert!(denied(refused("an open under yet another id", out)));
    s.unchanged().await;
    s.stop().await;
}

/// Changes sent without ever saying which replies came back, on an inode carrying as many
/// xattrs as it may: the reply cache keeps them without the xattrs' weight, and an inode
/// holds a bounded weight of xattrs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_unacknowledged_changes_keeps_the_reply_cache_light() {
    let s = stage("replies").await;
    let made = s
        .mds_call(&s.reint(s.new_file("heavy", 0o644), None))
        .await
        .unwrap();
    let fid = made.inode.unwrap().fid;
    let value = vec![0xabu8; 16 << 10];
    let mut set = 0;
    for i in 0..16 {
        let m = Mutation::SetXattr {
            fid,
            name: format!("user.pad{i}"),
            value: value.clone(),
        };
        match s.mds_call(&s.reint(m, None)).await {
            Ok(_) => set += 1,
            Err(e) => {
                let code = refused("an xattr past the bound", Err::<(), _>(e));
                assert_eq!(code, StatusCode::Fs(FsErrorKind::NoSpace));
                break;
            }
        }
    }
    assert!(set < 16, "an inode's xattrs are bounded");
    let (before, bytes_before) = s.c.mds().replies_kept();
    let n = 500;
    for _ in 0..n {
        let m = Mutation::Setattr {
            fid,
            attr: SetAttr {
                times_now: true,
                ..SetAttr::default()
            },
        };
        s.mds_call(&s.reint(m, None)).await.unwrap();
    }
    let (after, bytes_after) = s.c.mds().replies_kept();
    let per_reply = (bytes_after - bytes_before) / (after - before).max(1);
    println!(
        "reply cache: {} replies, {} bytes as saved ({per_reply} bytes a reply; the inode \
         carries {} bytes of xattrs)",
        after,
        bytes_after,
        set * value.len()
    );
    assert!(after - before >= n - 1, "the replies are kept for resends");
    assert!(
        per_reply < 4096,
        "{per_reply} bytes a reply: the xattrs went in"
    );
    s.unchanged().await;
    s.stop().await;
}

/// Lease waits held open from many client ids over several connections, more than the MDS's
/// request slots: they wait in slots of their own, so an honest getattr is answered in its
/// usual time and storage servers' heartbeats keep their targets up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_lease_waits_does_not_take_the_request_slots() {
    // Targets are listed down after 4 s without a heartbeat: the flood lasts longer.
    let s = stage_with("waits", |b| {
        b.heartbeat(Duration::from_millis(100), Duration::from_secs(4))
    })
    .await;
    // An honest client's getattr, as the library sends it.
    let honest = Arc::new(TcpEndpoint::client(TcpConfig {
        security: s.c.client_security(),
        ..TcpConfig::default()
    }));
    let latency = |n: usize| {
        let (honest, mds, fid) = (honest.clone(), s.mds.clone(), s.notes.fid);
        async move {
            let mut v = vec![];
            for _ in 0..n {
                let t = Instant::now();
                call(
                    &*honest,
                    &mds,
                    &MdsGetattr {
                        fid,
                        creds: attacker_creds(),
                        lease: None,
                    },
                    T,
                )
                .await
                .unwrap();
                v.push(t.elapsed());
            }
            v.sort();
            v[v.len() / 2]
        }
    };
    let idle = latency(50).await;
    let conns = 10;
    let mut floods = vec![];
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    for c in 0..conns {
        let ep = Arc::new(TcpEndpoint::client(TcpConfig {
            security: s.c.client_security(),
            ..TcpConfig::default()
        }));
        for i in 0..mds::peers::IDS_PER_CONNECTION as u128 {
            let id = (c as u128) << 64 | i | 1 << 100;
            call(&*ep, &s.mds, &MdsConnect { client: id }, T)
                .await
                .unwrap();
            for _ in 0..2 {
                let (ep, mds, stop) = (ep.clone(), s.mds.clone(), stop.clone());
                floods.push(tokio::spawn(async move {
                    let mut epoch = 0;
                    let mut nr = 0;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        nr += 1;
                        let w = MdsLeaseWait {
                            client: id,
                            acked: 0,
                            epoch,
                            nr,
                            cancel: vec![],
                        };
                        match call(&*ep, &mds, &w, Duration::from_secs(30)).await {
                            Ok(r) => epoch = r.epoch,
                            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                        }
                    }
                }));
            }
        }
    }
    // Let the waits pile up (each is held a third of the lease term), for longer than a
    // target lasts without heartbeats.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let flooded = latency(50).await;
    println!(
        "getattr median latency: idle {idle:?}, during {} lease waits kept open {flooded:?}",
        floods.len()
    );
    let st = s.admin.statfs().await.unwrap();
    assert_eq!(
        st.targets_up, 2,
        "heartbeats got through: the targets are up"
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for f in floods {
        let _ = f.await;
    }
    s.unchanged().await;
    s.stop().await;
}

/// An open naming a path that is not the file's: the audit log records the FID, the claim as a
/// claim, and no path; a read of the MDS's bytes is recorded too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_log_records_what_the_mds_resolved_not_what_the_client_claimed() {
    let log = std::env::temp_dir().join(format!("lode-hostile-audit-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let cfg = mds::audit::AuditConfig::new(&log);
    let s = stage_with("audit", |b| b.audit(cfg)).await;
    let open = MdsOpen {
        fid: s.notes.fid,
        handle: s.handle(1),
        creds: attacker_creds(),
        path: Some("/shared/harmless".into()),
        lease: None,
    };
    s.mds_call(&open).await.expect("the notes open for reading");
    let honest = OpenOptions::new()
        .read(true)
        .open(&s.victim, "/home/victim/dom/small")
        .await
        .unwrap();
    let mut buf = vec![0u8; 64];
    honest.read_at(0, &mut buf).await.unwrap();
    honest.close().await.unwrap();
    s.victim.sync().await.unwrap();
    // Synced every second.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let text = std::fs::read_to_string(&log).unwrap();
    let lied = text
        .lines()
        .find(|l| {
            l.contains("\"op\":\"open\"")
                && l.contains(&s.notes.fid.to_string())
                && l.contains("2000")
        })
        .unwrap_or_else(|| panic!("no record of the attacker's open in {text}"));
    assert!(!lied.contains("\"path\":\"/shared/harmless\""), "{lied}");
    assert!(lied.contains("the client named"), "{lied}");
    assert!(
        text.lines()
            .any(|l| l.contains("\"op\":\"read\"") && l.contains(&s.small.fid.to_string())),
        "no record of the read of the MDS's bytes in {text}"
    );
    s.unchanged().await;
    s.stop().await;
    let _ = std::fs::remove_file(&log);
}

/// Encrypted trees against a raw client: it cannot take the victim's empty directory under a
/// policy of its own, remove or replace a tree's policy, put a clear name into an encrypted
/// directory it may write, or move a clear file into one (or an encrypted one out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encrypted_trees_policy_names_and_edge_hold_against_a_raw_client() {
    let s = stage("crypt").await;
    let key = client::crypt::MasterKey::generate().unwrap();
    s.victim.mkdir("/home/victim/empty", 0o777).await.unwrap();
    s.admin.mkdir("/shared/enc", 0o777).await.unwrap();
    let policy = s.admin.crypt_set("/shared/enc", &key).await.unwrap();
    let empty = s.victim.stat("/home/victim/empty").await.unwrap();
    let enc = s.admin.stat("/shared/enc").await.unwrap();
    let mine = proto::crypt::Policy::new([9; 16], [9; 16]).encode();
    let set = |fid, value: Vec<u8>| Mutation::SetXattr {
        fid,
        name: proto::crypt::POLICY_XATTR.into(),
        value,
    };
    for (what, m) in [
        (
            "a policy on the victim's directory",
            set(empty.fid, mine.clone()),
        ),
        ("another policy on a tree", set(enc.fid, mine.clone())),
        (
            "the removal of a tree's policy",
            Mutation::RemoveXattr {
                fid: enc.fid,
                name: proto::crypt::POLICY_XATTR.into(),
            },
        ),
    ] {
        let code = refused(what, s.mds_call(&s.reint(m, None)).await);
        assert!(
            matches!(
                code,
                StatusCode::Fs(FsErrorKind::NotPermitted | FsErrorKind::Exists)
            ),
            "{what}: {code:?}"
        );
    }
    let clear_name = Mutation::Create {
        parent: enc.fid,
        name: b"not-encrypted".to_vec(),
        kind: Kind::File,
        mode: 0o644,
        exclusive: true,
        target: vec![],
        layout: None,
    };
    let code = refused("a clear name", s.mds_call(&s.reint(clear_name, None)).await);
    assert_eq!(code, StatusCode::Fs(FsErrorKind::NoKey));
    s.mds_call(&s.reint(s.new_file("outside", 0o644), None))
        .await
        .unwrap();
    let move_in = Mutation::Rename {
        parent: s.shared.fid,
        name: b"outside".to_vec(),
        new_parent: enc.fid,
        new_name: vec![b'A'; 43],
        flags: RenameFlags::default(),
    };
    let code = refused(
        "a clear file moved in",
        s.mds_call(&s.reint(move_in, None)).await,
    );
    assert_eq!(code, StatusCode::Fs(FsErrorKind::CrossDevice));
    // What the raw client tried left the tree as it was.
    let again = s.admin.stat("/shared/enc").await.unwrap();
    assert_eq!(proto::crypt::Policy::of_inode(&again), Some(policy));
    assert!(
        proto::crypt::Policy::of_inode(&s.victim.stat("/home/victim/empty").await.unwrap())
            .is_none()
    );
    s.unchanged().await;
    s.stop().await;
}
