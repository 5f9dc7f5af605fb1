//! Striped directories: one directory whose entries are spread over shards on several MDTs
//! by a hash of each name (Lustre's LMV layout).
//!
//! A striped directory is a *master* inode, named in its parent as any directory is, that
//! holds no entries itself: its extended attribute [`LMV_XATTR`] lists its shards, each an
//! ordinary directory on an MDT of its own (shard `j` on MDT `(offset + j) % MDTs`), whose
//! attribute [`SHARD_XATTR`] names its master and its place. A name lives in exactly one
//! shard: the one [`DirStripe::shard_index`] gives, by a hash whose number is written into the
//! layout ([`HashType`]) and whose definition never changes with it, so every client and
//! every server, of any build, agrees where a name is. The MDS of a shard refuses a name that
//! is not its own, and the master's refuses every name ([`crate::FsErrorKind::WrongShard`]),
//! so a client that routed by an old or missing layout is told, never answered wrong.

use serde::{Deserialize, Serialize};

use crate::Fid;

/// The extended attribute of a striped directory's master: its [`DirStripe`], encoded.
pub const LMV_XATTR: &str = "lode.lmv";
/// The extended attribute of each shard of a striped directory: its [`ShardOf`], encoded.
pub const SHARD_XATTR: &str = "lode.shard";
/// The most shards a striped directory may have.
pub const MAX_DIR_STRIPES: u32 = crate::fid::MAX_MDTS;
/// The extended attribute of a directory whose new subdirectories get a layout of their own
/// by default (Lustre's default LMV, `lfs setdirstripe -D`): its [`DirDefault`], encoded.
pub const DEFAULT_XATTR: &str = "lode.dmv";
/// [`DirDefault::inherit`] that never runs out.
pub const INHERIT_ALWAYS: u8 = u8::MAX;

/// How names are placed on shards. The number is the one written into the layout; a new
/// hash gets a new number, and the definition behind a number never changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum HashType {
    /// 64-bit FNV-1a of the name's bytes, modulo the shard count (Lustre's `fnv_1a_64`,
    /// number 2 there too).
    Fnv1a64,
}

impl HashType {
    /// The number written into the layout.
    pub fn code(self) -> u32 {
        match self {
            HashType::Fnv1a64 => 2,
        }
    }

    /// The hash numbered `code`, if this build knows it.
    pub fn from_code(code: u32) -> Option<HashType> {
        match code {
            2 => Some(HashType::Fnv1a64),
            _ => None,
        }
    }

    /// The name `lode setdirstripe -H` takes and `getdirstripe` prints.
    pub fn name(self) -> &'static str {
        match self {
            HashType::Fnv1a64 => "fnv_1a_64",
        }
    }

    /// The hash `name` names, as `-H` spells it.
    pub fn parse(name: &str) -> Option<HashType> {
        match name {
            "fnv_1a_64" | "fnv1a64" => Some(HashType::Fnv1a64),
            _ => None,
        }
    }

    /// The hash of `name`.
    pub fn hash(self, name: &[u8]) -> u64 {
        match self {
            HashType::Fnv1a64 => fnv_1a_64(name),
        }
    }
}

/// 64-bit FNV-1a (offset basis 0xcbf29ce484222325, prime 0x100000001b3).
pub fn fnv_1a_64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Where a striped directory stands: shards being made, in use, or being removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StripeState {
    /// The master is named; its shards are being made (no shard is listed yet). Names in it
    /// wait.
    Building,
    /// Every shard is made and listed.
    Ready,
    /// An rmdir is freezing the shards (each refuses new names meanwhile); if one is not
    /// empty, they thaw and the directory is `Ready` again.
    Removing,
    /// Every shard is removed: only the master's name is left to go.
    Emptied,
}

/// The layout of a striped directory, kept in its master's [`LMV_XATTR`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirStripe {
    /// The hash's number ([`HashType::code`]).
    pub hash: u32,
    /// How many shards.
    pub count: u32,
    /// The MDT of shard 0 (Lustre's `lmv_stripe_offset`).
    pub offset: u32,
    /// The shards' FIDs, shard 0 first (empty while [`StripeState::Building`]).
    pub shards: Vec<Fid>,
    pub state: StripeState,
}

impl DirStripe {
    /// The shard `name` lives in; `None` under a hash this build does not know or with no
    /// shards.
    pub fn shard_index(&self, name: &[u8]) -> Option<u32> {
        shard_index(self.hash, self.count, name)
    }

    /// The FID of the shard `name` lives in, while the directory is in use.
    pub fn shard_for(&self, name: &[u8]) -> Option<Fid> {
        if self.state != StripeState::Ready {
            return None;
        }
        let j = self.shard_index(name)?;
        self.shards.get(j as usize).copied()
    }

    pub fn encode(&self) -> Vec<u8> {
        crate::msg::encode(self).expect("a layout always encodes")
    }

    pub fn decode(bytes: &[u8]) -> Option<DirStripe> {
        postcard::from_bytes(bytes).ok()
    }
}

/// The shard index of `name` in a directory of `count` shards hashed by `hash`.
pub fn shard_index(hash: u32, count: u32, name: &[u8]) -> Option<u32> {
    let h = HashType::from_code(hash)?;
    if count == 0 {
        return None;
    }
    Some((h.hash(name) % u64::from(count)) as u32)
}

/// What a shard of a striped directory knows of its place, kept in its [`SHARD_XATTR`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardOf {
    /// The striped directory's master.
    pub master: Fid,
    /// This shard's index.
    pub index: u32,
    /// How many shards the directory has.
    pub count: u32,
    /// The hash's number.
    pub hash: u32,
    /// Frozen by an rmdir of the directory under way: no new name is given here.
    pub frozen: bool,
}

impl ShardOf {
    /// Whether `name` belongs in this shard.
    pub fn holds(&self, name: &[u8]) -> bool {
        shard_index(self.hash, self.count, name) == Some(self.index)
    }

    pub fn encode(&self) -> Vec<u8> {
        crate::msg::encode(self).expect("a shard's place always encodes")
    }

    pub fn decode(bytes: &[u8]) -> Option<ShardOf> {
        postcard::from_bytes(bytes).ok()
    }
}

/// How a directory's new subdirectories are laid out when their mkdir says nothing, kept in
/// its [`DEFAULT_XATTR`] (and, on a striped directory, in each shard's, where the names are).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirDefault {
    /// Shards of each new subdirectory (1: a plain directory); never more than the filesystem
    /// has MDTs.
    pub count: u32,
    /// The MDT of each new subdirectory's shard 0; `None`: its parent's, or, for one made in
    /// the root, the MDT the MDS picks (Lustre's `-i -1`).
    pub offset: Option<u32>,
    /// The hash's number ([`HashType::code`]).
    pub hash: u32,
    /// How many levels further down the default goes: each new subdirectory gets it with one
    /// less, and with 0 it stops there ([`INHERIT_ALWAYS`]: for ever; Lustre's
    /// `--max-inherit`).
    pub inherit: u8,
}

impl DirDefault {
    /// What a new subdirectory made under this default gets, if anything.
    pub fn passed_on(&self) -> Option<DirDefault> {
        match self.inherit {
            0 => None,
            INHERIT_ALWAYS => Some(*self),
            n => Some(DirDefault {
                inherit: n - 1,
                ..*self
            }),
        }
    }

    /// Why it cannot be a default: an unknown hash, no shards or more than any filesystem
    /// has MDTs, an MDT past the most.
    pub fn invalid(&self) -> Option<String> {
        if HashType::from_code(self.hash).is_none() {
            return Some(format!("hash {} is unknown", self.hash));
        }
        if self.count == 0 || self.count > MAX_DIR_STRIPES {
            return Some(format!(
                "a default of {} shards (1 to {MAX_DIR_STRIPES})",
                self.count
            ));
        }
        match self.offset {
            Some(o) if o >= crate::fid::MAX_MDTS => Some(format!("MDT{o} is past the most")),
            _ => None,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        crate::msg::encode(self).expect("a default always encodes")
    }

    pub fn decode(bytes: &[u8]) -> Option<DirDefault> {
        postcard::from_bytes(bytes).ok()
    }
}

/// The default layout of `inode`'s new subdirectories, when it has one.
pub fn default_of_inode(inode: &crate::md::Inode) -> Option<DirDefault> {
    inode
        .xattrs
        .get(DEFAULT_XATTR)
        .and_then(|v| DirDefault::decode(v))
}

/// The layout of `inode` when it is a striped directory's master.
pub fn of_inode(inode: &crate::md::Inode) -> Option<DirStripe> {
    inode
        .xattrs
        .get(LMV_XATTR)
        .and_then(|v| DirStripe::decode(v))
}

/// The place of `inode` when it is a shard of a striped directory.
pub fn shard_of_inode(inode: &crate::md::Inode) -> Option<ShardOf> {
    inode
        .xattrs
        .get(SHARD_XATTR)
        .and_then(|v| ShardOf::decode(v))
}

/// Whether `name` is an attribute lode keeps itself (a striped directory's layout), never set
/// or removed by a caller.
pub fn is_internal_xattr(name: &str) -> bool {
    name.starts_with("lode.")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_1a_64_matches_the_published_vectors() {
        // From the FNV reference test suite.
        assert_eq!(fnv_1a_64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv_1a_64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv_1a_64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn every_name_has_exactly_one_shard_and_the_spread_is_even() {
        let count = 4;
        let mut per = [0u32; 4];
        for i in 0..40_000 {
            let name = format!("file.{i}");
            let j = shard_index(2, count, name.as_bytes()).unwrap();
            per[j as usize] += 1;
            let holders = (0..count)
                .filter(|k| {
                    ShardOf {
                        master: Fid::new(1, 1, 0),
                        index: *k,
                        count,
                        hash: 2,
                        frozen: false,
                    }
                    .holds(name.as_bytes())
                })
                .count();
            assert_eq!(holders, 1, "{name}");
        }
        for n in per {
            assert!((9_000..11_000).contains(&n), "{per:?}");
        }
    }

    #[test]
    fn an_unknown_hash_places_nothing() {
        assert_eq!(shard_index(99, 4, b"x"), None);
        assert_eq!(shard_index(2, 0, b"x"), None);
    }

    #[test]
    fn layouts_round_trip_and_garbage_is_none() {
        let s = DirStripe {
            hash: 2,
            count: 2,
            offset: 1,
            shards: vec![Fid::new(0x200000401, 5, 0), Fid::new(0x200000400, 9, 0)],
            state: StripeState::Ready,
        };
        assert_eq!(DirStripe::decode(&s.encode()), Some(s.clone()));
        assert_eq!(DirStripe::decode(&[0xff, 0xff, 0xff]), None);
        let f = s.shard_for(b"name").unwrap();
        assert!(s.shards.contains(&f));
        let building = DirStripe {
            state: StripeState::Building,
            shards: vec![],
            ..s
        };
        assert_eq!(building.shard_for(b"name"), None);
    }
}
