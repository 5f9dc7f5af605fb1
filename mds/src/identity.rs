//! Whom the MDS believes: identities mapped by the node a request comes from (Lustre's
//! nodemap), root squashed unless the node is trusted, and the capabilities handed out for a
//! file's objects.
//!
//! A client states its uid and groups, as NFS's AUTH_SYS does; what the MDS lets that claim do
//! depends on the node it comes from. Servers (which hold the cluster key) are trusted; a
//! client node is trusted only when an operator lists it. On an untrusted node uid 0 becomes
//! the squash identity (nobody), and gid 0 likewise, so root there cannot read other users'
//! files or create files owned by root.

use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lnet::auth::capability::{READ, WRITE};
use lnet::auth::{CapabilityKey, Role};
use lnet::service::Incoming;
use proto::capa::Grant;
use proto::md::{Creds, IdMap, Inode, Kind};
use proto::Nid;

/// The identity root is squashed to: nobody, nogroup.
pub const NOBODY: u32 = 65534;

/// How long a capability lasts; clients renew it before it ends.
pub const CAPABILITY_LIFETIME: Duration = Duration::from_secs(3600);

/// A range of addresses: `10.0.0.0/8`, `192.168.1.7`, `::1/128`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeRange {
    addr: IpAddr,
    prefix: u8,
}

impl std::str::FromStr for NodeRange {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .trim()
            .parse()
            .map_err(|_| format!("{s:?} is not an address or a range like 10.0.0.0/8"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{s:?}: the prefix must be 0 to {max}"))?,
            None => max,
        };
        Ok(NodeRange { addr, prefix })
    }
}

impl NodeRange {
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match (self.addr, ip) {
            // An IPv4 client seen through an IPv6 socket.
            (IpAddr::V4(_), IpAddr::V6(v6)) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            _ => ip,
        };
        match (self.addr, ip) {
            (IpAddr::V4(a), IpAddr::V4(b)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(a) & mask == u32::from(b) & mask
            }
            (IpAddr::V6(a), IpAddr::V6(b)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(a) & mask == u128::from(b) & mask
            }
            _ => false,
        }
    }
}

/// One nodemap entry: the nodes it covers, and how their identities map.
#[derive(Clone, Debug, Default)]
pub struct NodeGroup {
    pub nodes: Vec<NodeRange>,
    /// Root on these nodes is root on the filesystem.
    pub trusted: bool,
    /// Client uid to filesystem uid, for these nodes. When the list is not empty, a uid it
    /// does not name is squashed (to `squash_uid`); an empty list passes uids unchanged.
    pub uids: Vec<(u32, u32)>,
    /// Client gid to filesystem gid.
    pub gids: Vec<(u32, u32)>,
}

/// How the MDS maps the identities clients claim.
#[derive(Clone, Debug)]
pub struct Nodemap {
    /// The first group whose nodes contain a client's address applies to it.
    pub groups: Vec<NodeGroup>,
    /// What uid 0 and gid 0 become on an untrusted node.
    pub squash_uid: u32,
    pub squash_gid: u32,
}

impl Default for Nodemap {
    /// Nothing trusted: root is squashed on every client node.
    fn default() -> Self {
        Nodemap {
            groups: vec![],
            squash_uid: NOBODY,
            squash_gid: NOBODY,
        }
    }
}

impl Nodemap {
    /// Trusts root on `nodes` (and maps nothing).
    pub fn trusting(nodes: Vec<NodeRange>) -> Nodemap {
        Nodemap {
            groups: vec![NodeGroup {
                nodes,
                trusted: true,
                ..NodeGroup::default()
            }],
            ..Nodemap::default()
        }
    }

    /// The identity a request's claim maps to.
    pub fn map(&self, req: &Incoming, creds: Creds) -> Creds {
        self.idmap(req).map(creds)
    }

    /// How the identities claimed by the sender of `req` are mapped.
    pub fn idmap(&self, req: &Incoming) -> IdMap {
        // Servers hold the cluster key; with authentication off every peer counts as one.
        if req.role == Role::Server {
            return IdMap {
                identity: true,
                ..IdMap::default()
            };
        }
        let ip = match &req.from {
            Nid::Tcp(addr) => Some(addr.ip()),
            _ => None,
        };
        let group = ip.and_then(|ip| {
            self.groups
                .iter()
                .find(|g| g.nodes.iter().any(|n| n.contains(ip)))
        });
        let (trusted, uids, gids) = match group {
            Some(g) => (g.trusted, g.uids.clone(), g.gids.clone()),
            None => (false, vec![], vec![]),
        };
        IdMap {
            identity: false,
            trusted,
            squash_uid: self.squash_uid,
            squash_gid: self.squash_gid,
            uids,
            gids,
        }
    }
}

/// Hands out capabilities for files' objects.
#[derive(Clone, Debug)]
pub struct Granter {
    pub key: Option<CapabilityKey>,
    pub lifetime: Duration,
}

impl Granter {
    /// Capabilities for `inode`'s objects with the access `creds` have (read and write for
    /// the creator of a file, whatever its mode).
    pub fn grant(&self, inode: &Inode, creds: &Creds, created: bool) -> Grant {
        self.grant_rights(inode, Self::rights(inode, creds, created))
    }

    /// The rights on a file's objects `creds` have: read and write as its mode allows them
    /// (both for the creator of a new file, whatever its mode); none on what is not a file.
    pub fn rights(inode: &Inode, creds: &Creds, created: bool) -> u8 {
        let mut rights = 0;
        if inode.kind == Kind::File {
            if created || inode.permits(creds, 4) {
                rights |= READ;
            }
            if created || inode.permits(creds, 2) {
                rights |= WRITE;
            }
        }
        rights
    }

    /// Capabilities for `inode`'s objects with `rights`. Without a key (authentication off)
    /// the grant is unbounded and names no objects: storage servers check nothing.
    pub fn grant_rights(&self, inode: &Inode, rights: u8) -> Grant {
        let Some(key) = &self.key else {
            return Grant {
                rights: READ | WRITE,
                expiry: u64::MAX,
                objects: vec![],
            };
        };
        let expiry = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
            .saturating_add(self.lifetime.as_secs());
        let objects = inode
            .layout
            .iter()
            .flat_map(|l| &l.components)
            .flat_map(|c| c.objects.iter().map(|o| (o.target, o.fid)));
        key.grant(objects, rights, expiry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(ip: &str, role: Role) -> Incoming {
        Incoming {
            role,
            from: Nid::Tcp(format!("{ip}:1000").parse().unwrap()),
            to: Nid::Tcp("127.0.0.1:9400".parse().unwrap()),
            opcode: proto::msg::opcodes::MDS_LOOKUP,
            xid: 1,
            job: None,
            body: vec![],
        }
    }

    #[test]
    fn root_is_squashed_unless_its_node_is_trusted_and_ids_map_per_node() {
        let map = Nodemap {
            groups: vec![
                NodeGroup {
                    nodes: vec!["10.0.0.0/24".parse().unwrap()],
                    trusted: true,
                    ..NodeGroup::default()
                },
                NodeGroup {
                    nodes: vec!["10.0.1.0/24".parse().unwrap()],
                    trusted: false,
                    uids: vec![(1000, 5000)],
                    gids: vec![(100, 500)],
                },
            ],
            ..Nodemap::default()
        };
        let root = Creds {
            uid: 0,
            gid: 0,
            groups: vec![0, 7],
        };
        let trusted = map.map(&from("10.0.0.9", Role::Client), root.clone());
        assert_eq!(trusted, root);
        let squashed = map.map(&from("10.0.1.9", Role::Client), root.clone());
        assert_eq!((squashed.uid, squashed.gid), (NOBODY, NOBODY));
        // The node maps gids: one it does not list (7) is squashed too.
        assert_eq!(squashed.groups, vec![NOBODY, NOBODY]);
        let elsewhere = map.map(&from("192.168.0.1", Role::Client), root.clone());
        assert_eq!(elsewhere.uid, NOBODY);
        let server = map.map(&from("192.168.0.1", Role::Server), root.clone());
        assert_eq!(server.uid, 0);
        let user = Creds {
            uid: 1000,
            gid: 100,
            groups: vec![],
        };
        let mapped = map.map(&from("10.0.1.3", Role::Client), user.clone());
        assert_eq!((mapped.uid, mapped.gid), (5000, 500));
        assert_eq!(map.map(&from("10.0.0.3", Role::Client), user.clone()), user);
        // An id the node's map does not list is nobody's, not passed through.
        let stranger = Creds {
            uid: 1001,
            gid: 101,
            groups: vec![100, 102],
        };
        let mapped = map.map(&from("10.0.1.3", Role::Client), stranger);
        assert_eq!((mapped.uid, mapped.gid), (NOBODY, NOBODY));
        assert_eq!(mapped.groups, vec![500, NOBODY]);
    }

    #[test]
    fn ranges_parse_and_match() {
        let r: NodeRange = "127.0.0.0/8".parse().unwrap();
        assert!(r.contains("127.1.2.3".parse().unwrap()));
        assert!(!r.contains("128.0.0.1".parse().unwrap()));
        assert!(r.contains("::ffff:127.0.0.1".parse().unwrap()));
        let all: NodeRange = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("8.8.8.8".parse().unwrap()));
        let one: NodeRange = "::1".parse().unwrap();
        assert!(one.contains("::1".parse().unwrap()));
        for bad in ["10.0.0.0/33", "nonsense", "10.0.0.0/x", "::1/129"] {
            assert!(bad.parse::<NodeRange>().is_err(), "{bad}");
        }
    }
}
