//! The filesystem's identity and the explicit format step, as `mkfs.lustre` gives Lustre.
//!
//! `lode-mds format` makes a new filesystem: a uuid and a name, written beside an empty
//! namespace. The MDS serves only a data directory that holds both; a missing or empty one
//! (a volume that failed to mount, a typo in `data_dir`) is refused with the directory named,
//! never formatted behind the operator's back. Every storage target records the uuid at its
//! first registration and refuses an MDS of any other filesystem, so an MDS started on the
//! wrong directory cannot take another filesystem's targets (and destroy their objects as
//! orphans of its own empty namespace).
//!
//! A namespace written before identities existed is adopted at its first start: the identity
//! is written beside it, once.
//!
//! ```text
//! filesystem:  "LODEFS\0\0" (8) | version u32 | uuid u128 | name_len u16 | name (UTF-8)
//!              | [version 2: mdt u32] | crc32c of everything before it, u32   (little-endian)
//! ```
//!
//! A filesystem has one or more metadata targets (MDTs), each formatted with its index and
//! the filesystem's uuid and name: MDT0 makes the filesystem (and holds its root), MDT `k` joins
//! it. Version 1, still written for MDT0, is version 2 with MDT 0.
//!
//! The file is written last at a format and replaced atomically, so a crash while formatting
//! leaves a directory that is refused as unformatted, never one that half-serves.

use std::fmt;

use crate::disk::MetaDisk;
use crate::journal::{self, JournalError};
use crate::namespace::{Namespace, Time};

/// The identity's file on the MDS's disk.
pub const FILE: &str = "filesystem";
const MAGIC: [u8; 8] = *b"LODEFS\0\0";
/// The identity of MDT0 (written as before there were several MDTs).
const VERSION: u32 = 1;
/// The identity of any MDT.
const VERSION_MDT: u32 = 2;
/// Longest filesystem name.
pub const MAX_NAME: usize = 32;
/// The name a filesystem gets when the operator gives none.
pub const DEFAULT_NAME: &str = "lode";

/// Which filesystem a data directory holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub uuid: u128,
    pub name: String,
    /// The index of the metadata target this data directory holds.
    pub mdt: u32,
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({:032x})", self.name, self.uuid)?;
        if self.mdt != 0 {
            write!(f, " MDT{}", self.mdt)?;
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error(
        "{dir} holds no lode filesystem (no namespace, no identity); if this is a new \
         filesystem, format it with `lode-mds format --data-dir {dir}`; if it should hold one, \
         check that its volume is mounted and the path is right"
    )]
    NotFormatted { dir: String },
    #[error(
        "{dir} is formatted for filesystem {identity} but its namespace (snapshot and journal) \
         is missing: refusing to serve an empty namespace in its place"
    )]
    NamespaceMissing {
        dir: String,
        identity: Box<Identity>,
    },
    #[error("{dir} already holds a filesystem{}; format refuses to overwrite it", .identity.as_ref().map(|i| format!(" ({i})")).unwrap_or_default())]
    AlreadyFormatted {
        dir: String,
        identity: Option<Box<Identity>>,
    },
    #[error("a filesystem name is 1 to {MAX_NAME} letters, digits, '-' or '_', not {0:?}")]
    BadName(String),
    #[error("an MDT index is below {max}, not {0}", max = proto::fid::MAX_MDTS)]
    BadMdt(u32),
    #[error("{FILE} in {dir} is damaged: {reason}")]
    Damaged { dir: String, reason: String },
    #[error("{dir}: {source}")]
    Io { dir: String, source: std::io::Error },
    #[error(transparent)]
    Journal(#[from] JournalError),
}

fn check_name(name: &str) -> Result<(), FormatError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(FormatError::BadName(name.to_owned()))
    }
}

fn encode(id: &Identity) -> Vec<u8> {
    let mut out = Vec::with_capacity(34 + id.name.len() + 8);
    out.extend_from_slice(&MAGIC);
    let version = if id.mdt == 0 { VERSION } else { VERSION_MDT };
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&id.uuid.to_le_bytes());
    out.extend_from_slice(&(id.name.len() as u16).to_le_bytes());
    out.extend_from_slice(id.name.as_bytes());
    if version == VERSION_MDT {
        out.extend_from_slice(&id.mdt.to_le_bytes());
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The identity in `raw`, or why it is not one.
pub fn decode(raw: &[u8]) -> Result<Identity, String> {
    if raw.len() < 34 + 4 || raw[..8] != MAGIC {
        return Err("not a filesystem identity".into());
    }
    let (body, crc) = raw.split_at(raw.len() - 4);
    if crc32c::crc32c(body).to_le_bytes() != crc {
        return Err("checksum mismatch".into());
    }
    let version = u32::from_le_bytes(body[8..12].try_into().expect("4 bytes"));
    let tail = match version {
        VERSION => 0,
        VERSION_MDT => 4,
        _ => return Err(format!("unknown version {version}")),
    };
    let uuid = u128::from_le_bytes(body[12..28].try_into().expect("16 bytes"));
    let len = usize::from(u16::from_le_bytes([body[28], body[29]]));
    let rest = &body[30..];
    if rest.len() != len + tail {
        return Err("name length does not match".into());
    }
    let (name, tail) = rest.split_at(len);
    let name = String::from_utf8(name.to_vec()).map_err(|_| "name is not UTF-8")?;
    check_name(&name).map_err(|e| e.to_string())?;
    let mdt = match tail.try_into() {
        Ok(b) => u32::from_le_bytes(b),
        Err(_) => 0,
    };
    if mdt >= proto::fid::MAX_MDTS {
        return Err(format!("MDT index {mdt} is out of range"));
    }
    Ok(Identity { uuid, name, mdt })
}

fn io(dir: &str) -> impl Fn(std::io::Error) -> FormatError + '_ {
    move |source| FormatError::Io {
        dir: dir.to_owned(),
        source,
    }
}

/// The identity kept on `disk` (`dir` names it in errors), if any.
pub fn read(disk: &dyn MetaDisk, dir: &str) -> Result<Option<Identity>, FormatError> {
    match disk.read(FILE).map_err(io(dir))? {
        None => Ok(None),
        Some(raw) => decode(&raw)
            .map(Some)
            .map_err(|reason| FormatError::Damaged {
                dir: dir.to_owned(),
                reason,
            }),
    }
}

fn namespace_present(disk: &dyn MetaDisk, dir: &str) -> Result<bool, FormatError> {
    Ok(disk.exists("snapshot").map_err(io(dir))? || disk.exists("journal").map_err(io(dir))?)
}

/// Makes a new filesystem on `disk`: an empty namespace (its root made `now`), then its
/// identity. Refuses a disk that holds a namespace or an identity already.
pub fn format(
    disk: &dyn MetaDisk,
    dir: &str,
    name: &str,
    uuid: u128,
    now: Time,
) -> Result<Identity, FormatError> {
    format_mdt(disk, dir, name, uuid, 0, now)
}

/// Makes MDT `mdt` of filesystem `uuid` (`name`) on `disk`, as [`format`] makes MDT0.
pub fn format_mdt(
    disk: &dyn MetaDisk,
    dir: &str,
    name: &str,
    uuid: u128,
    mdt: u32,
    now: Time,
) -> Result<Identity, FormatError> {
    check_name(name)?;
    if mdt >= proto::fid::MAX_MDTS {
        return Err(FormatError::BadMdt(mdt));
    }
    let existing = read(disk, dir)?;
    if existing.is_some() || namespace_present(disk, dir)? {
        return Err(FormatError::AlreadyFormatted {
            dir: dir.to_owned(),
            identity: existing.map(Box::new),
        });
    }
    journal::write_snapshot(disk, &Namespace::for_mdt(mdt, now), 0)?;
    let id = Identity {
        uuid,
        name: name.to_owned(),
        mdt,
    };
    disk.replace(FILE, &encode(&id)).map_err(io(dir))?;
    Ok(id)
}

/// What the MDS serves on `disk`, checked before anything is opened: an identity with its
/// namespace. A namespace without an identity (made before identities existed) is adopted
/// once under `adopt_uuid` and the default name.
pub fn check(disk: &dyn MetaDisk, dir: &str, adopt_uuid: u128) -> Result<Identity, FormatError> {
    let id = read(disk, dir)?;
    let present = namespace_present(disk, dir)?;
    match (id, present) {
        (Some(id), true) => Ok(id),
        (Some(identity), false) => Err(FormatError::NamespaceMissing {
            dir: dir.to_owned(),
            identity: Box::new(identity),
        }),
        (None, false) => Err(FormatError::NotFormatted {
            dir: dir.to_owned(),
        }),
        (None, true) => {
            let id = Identity {
                uuid: adopt_uuid,
                name: DEFAULT_NAME.to_owned(),
                mdt: 0,
            };
            disk.replace(FILE, &encode(&id)).map_err(io(dir))?;
            tracing::warn!(dir, filesystem = %id, "a namespace without an identity: adopted, and its identity written");
            Ok(id)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::MemDisk;

    fn now() -> Time {
        Time::default()
    }

    #[test]
    fn an_empty_disk_is_refused_until_formatted_and_a_format_is_never_repeated() {
        let disk = MemDisk::new();
        assert!(matches!(
            check(&disk, "d", 1),
            Err(FormatError::NotFormatted { .. })
        ));
        let id = format(&disk, "d", "scratch", 7, now()).unwrap();
        assert_eq!(check(&disk, "d", 1).unwrap(), id);
        assert_eq!(id.mdt, 0);
        let second = MemDisk::new();
        let joined = format_mdt(&second, "e", "scratch", 7, 2, now()).unwrap();
        assert_eq!((joined.uuid, joined.mdt), (7, 2));
        assert_eq!(check(&second, "e", 1).unwrap(), joined);
        assert!(matches!(
            format_mdt(
                &MemDisk::new(),
                "f",
                "scratch",
                7,
                proto::fid::MAX_MDTS,
                now()
            ),
            Err(FormatError::BadMdt(_))
        ));
        assert!(matches!(
            format(&disk, "d", "again", 8, now()),
            Err(FormatError::AlreadyFormatted { identity: Some(i), .. }) if *i == id
        ));
    }

    #[test]
    fn a_namespace_without_identity_is_adopted_once_and_an_identity_without_namespace_refused() {
        let disk = MemDisk::new();
        journal::write_snapshot(&disk, &Namespace::new(now()), 0).unwrap();
        let adopted = check(&disk, "d", 5).unwrap();
        assert_eq!(adopted.uuid, 5);
        // Adopted once: a later start keeps the uuid written.
        assert_eq!(check(&disk, "d", 6).unwrap().uuid, 5);
        let bare = MemDisk::new();
        bare.replace(FILE, &encode(&adopted)).unwrap();
        assert!(matches!(
            check(&bare, "d", 1),
            Err(FormatError::NamespaceMissing { .. })
        ));
    }

    #[test]
    fn a_damaged_identity_or_a_bad_name_is_refused() {
        for mdt in [0, 3] {
            let id = Identity {
                uuid: 3,
                name: "fs-1".into(),
                mdt,
            };
            let raw = encode(&id);
            assert_eq!(decode(&raw).unwrap(), id);
            for at in 0..raw.len() {
                let mut bad = raw.clone();
                bad[at] ^= 0x40;
                assert!(decode(&bad).is_err(), "a flip at byte {at} went unseen");
            }
            assert!(decode(&raw[..raw.len() - 1]).is_err());
        }
        let disk = MemDisk::new();
        for name in ["", "a b", "x/y", &"n".repeat(MAX_NAME + 1)] {
            assert!(matches!(
                format(&disk, "d", name, 1, now()),
                Err(FormatError::BadName(_))
            ));
        }
    }
}
