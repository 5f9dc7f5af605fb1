//! Hierarchical storage: files whose bytes also live in an object store (S3), Lustre's HSM.
//!
//! A directory is *linked* to a bucket and prefix (a data repository link). The MDS keeps each
//! file's state in its internal xattr [`STATE_XATTR`] (journaled with the namespace): whether a
//! copy is in the archive (*archived*, with the object's key and ETag), whether the file's bytes
//! are in the archive only (*released*: its one mirror stale and without objects, so that a
//! reader that does not know HSM gets an error, never zeros), whether it changed since it was
//! archived (*dirty*), and the action under way (archive or restore). The links are kept on
//! the root ([`LINKS_XATTR`]). A copytool (`lode-copytool`, holding the cluster key and the S3
//! credentials) takes actions from the MDS, moves the bytes and reports back; the MDS decides
//! every state change.

use serde::{Deserialize, Serialize};

use crate::md::{Inode, Time};
use crate::msg::{opcodes, Opcode, Rpc};
use crate::Fid;

/// Where a file's HSM state is kept.
pub const STATE_XATTR: &str = "lode.hsm";
/// Where the data repository links are kept (on the root).
pub const LINKS_XATTR: &str = "lode.hsmlinks";
/// Most links per filesystem (FSx for Lustre's limit).
pub const MAX_LINKS: usize = 8;
/// Most names in one [`HsmRequest::Import`].
pub const MAX_IMPORT: usize = 1024;
/// Most actions one [`HsmRequest::Take`] hands out.
pub const MAX_TAKE: u32 = 64;

/// Which changes of the other side a link carries over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    pub new: bool,
    pub changed: bool,
    pub deleted: bool,
}

impl Policy {
    /// Parses `new,changed,deleted` (any of them, comma-separated; `none` or empty for none).
    pub fn parse(s: &str) -> Result<Policy, String> {
        let mut p = Policy::default();
        for w in s.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match w {
                "new" => p.new = true,
                "changed" => p.changed = true,
                "deleted" => p.deleted = true,
                "none" => {}
                other => {
                    return Err(format!(
                        "unknown policy word {other:?}: use new, changed, deleted or none"
                    ))
                }
            }
        }
        Ok(p)
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let words: Vec<&str> = [
            (self.new, "new"),
            (self.changed, "changed"),
            (self.deleted, "deleted"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, w)| *w)
        .collect();
        if words.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&words.join(","))
        }
    }
}

/// A directory linked to a bucket and prefix.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    /// Never reused within a filesystem.
    pub id: u32,
    pub dir: Fid,
    /// The directory's path when it was linked (shown; `dir` is what counts).
    pub path: String,
    pub bucket: String,
    /// The key prefix, without a trailing `/` (empty: the whole bucket).
    pub prefix: String,
    /// An S3-compatible endpoint (`http://127.0.0.1:9000`); none: AWS.
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub import: Policy,
    pub export: Policy,
    /// An import is queued or under way.
    pub importing: bool,
}

impl Link {
    /// `s3://bucket/prefix`.
    pub fn url(&self) -> String {
        if self.prefix.is_empty() {
            format!("s3://{}", self.bucket)
        } else {
            format!("s3://{}/{}", self.bucket, self.prefix)
        }
    }

    /// The object key of the file at `rel` (a path below the linked directory).
    pub fn key_of(&self, rel: &str) -> String {
        let rel = rel.trim_start_matches('/');
        if self.prefix.is_empty() {
            rel.to_string()
        } else {
            format!("{}/{rel}", self.prefix)
        }
    }
}

/// Splits `s3://bucket/prefix` into the bucket and the prefix (no trailing `/`).
pub fn parse_url(url: &str) -> Result<(String, String), String> {
    let rest = url
        .strip_prefix("s3://")
        .ok_or_else(|| format!("{url}: an archive is named s3://BUCKET[/PREFIX]"))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let ok = (3..=63).contains(&bucket.len())
        && bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    if !ok {
        return Err(format!("{url}: {bucket:?} is not a valid bucket name"));
    }
    Ok((bucket.to_string(), prefix.trim_matches('/').to_string()))
}

/// The links, as kept on the root.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Links {
    #[serde(deserialize_with = "crate::seq::deserialize")]
    pub links: Vec<Link>,
    /// The next link's id.
    pub next: u32,
}

impl Links {
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("links encode")
    }

    pub fn decode(b: &[u8]) -> Option<Links> {
        postcard::from_bytes(b).ok()
    }

    pub fn of_inode(root: &Inode) -> Links {
        root.xattrs
            .get(LINKS_XATTR)
            .and_then(|v| Links::decode(v))
            .unwrap_or_default()
    }
}

/// What the copytool is asked to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ActionKind {
    /// Copy the file to its object.
    Archive,
    /// Copy the object back into the file's objects.
    Restore,
}

/// An action recorded on a file, until it ends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Action {
    pub id: u64,
    pub kind: ActionKind,
}

/// A file's HSM state, in its [`STATE_XATTR`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// A whole copy is in the archive, under `key` with `etag`.
    pub archived: bool,
    /// The bytes are in the archive only.
    pub released: bool,
    /// Changed since it was archived.
    pub dirty: bool,
    /// The archive lost the copy (a restore found no object, or another).
    pub lost: bool,
    /// The link whose archive holds it.
    pub link: u32,
    pub key: String,
    pub etag: String,
    /// The size and modification time the archived copy has.
    pub size: u64,
    pub mtime: Time,
    pub action: Option<Action>,
}

impl State {
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("state encodes")
    }

    pub fn decode(b: &[u8]) -> Option<State> {
        postcard::from_bytes(b).ok()
    }

    pub fn of_inode(i: &Inode) -> Option<State> {
        i.xattrs.get(STATE_XATTR).and_then(|v| State::decode(v))
    }

    /// Lustre's words (`lfs hsm_state`): `exists archived released dirty lost`, and the
    /// action under way.
    pub fn words(&self) -> String {
        let mut w = vec!["exists"];
        if self.archived {
            w.push("archived");
        }
        if self.released {
            w.push("released");
        }
        if self.dirty {
            w.push("dirty");
        }
        if self.lost {
            w.push("lost");
        }
        match self.action.as_ref().map(|a| a.kind) {
            Some(ActionKind::Archive) => w.push("(archiving)"),
            Some(ActionKind::Restore) => w.push("(restoring)"),
            None => {}
        }
        w.join(" ")
    }
}

/// One object the copytool found under a link's prefix: its name relative to the linked
/// directory's `dir` (one level: the copytool makes the directories).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Imported {
    #[serde(with = "crate::msg::bytes_field")]
    pub name: Vec<u8>,
    pub size: u64,
    pub mtime: Time,
    pub key: String,
    pub etag: String,
}

/// An action a copytool took, with what it needs to carry it out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Work {
    pub id: u64,
    pub kind: ActionKind,
    pub fid: Fid,
    pub link: Link,
    pub key: String,
    /// For a restore: the archived size, and the ETag the object must still have.
    pub size: u64,
    pub etag: String,
}

/// An import a copytool took: list `link`'s prefix and name what it finds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportWork {
    pub link: Link,
}

/// One request of the HSM family (one opcode).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HsmRequest {
    /// Links the directory at `link.path` (administrators); the MDS numbers the link and
    /// finds its directory (`id`, `dir` and `importing` as sent are not used). Queues an
    /// import if its import policy asks.
    Link(Link),
    /// Removes the link of the directory at `path` (administrators); the files keep their
    /// state, and a released one can no longer be restored until linked again.
    Unlink {
        path: String,
    },
    Links,
    /// Queues an import of a link's prefix (administrators).
    ImportAgain {
        path: String,
    },
    /// The state of a file.
    State {
        fid: Fid,
    },
    /// Queues an archive of the file `fid` at `path` (its owner, or who may write it).
    Archive {
        fid: Fid,
        path: String,
    },
    /// Frees the storage servers' space of an archived, unchanged, closed file (who may
    /// write it).
    Release {
        fid: Fid,
    },
    /// Queues a restore of a released file if none is under way, and waits (a while) until
    /// its bytes up to `end` landed (who may read it).
    Restore {
        fid: Fid,
        end: u64,
    },
    /// What is queued and under way.
    Status,
    /// A copytool takes up to `max` actions, waiting a while for one (cluster key).
    Take {
        copytool: u128,
        max: u32,
    },
    /// A copytool takes a queued import, if any (cluster key).
    TakeImport {
        copytool: u128,
    },
    /// Names objects found under a link in the directory `parent` (cluster key).
    Import {
        link: u32,
        parent: Fid,
        #[serde(deserialize_with = "crate::seq::deserialize")]
        entries: Vec<Imported>,
    },
    /// Bytes up to `landed` of a restore are in the file's objects; the copytool still works
    /// on the action.
    Progress {
        copytool: u128,
        id: u64,
        landed: u64,
    },
    /// The action ended: for an archive, with the object's ETag, the size and modification time
    /// the copytool read through `handle` (its own open, which must have held the file alone
    /// since it opened it). `Err`: what failed.
    Done {
        copytool: u128,
        id: u64,
        result: Result<Finished, Failure>,
    },
    /// An import ended (with how many names it made), or failed.
    ImportDone {
        copytool: u128,
        link: u32,
        result: Result<u64, String>,
    },
}

/// What a copytool did: for an archive, the object's ETag and the size and modification
/// time it read through `handle` (its own open, which must have held the file alone since it
/// opened it); for a restore, the layout generation at which it filled mirror 0.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finished {
    pub etag: String,
    pub size: u64,
    pub mtime: Time,
    pub handle: crate::md::OpenHandle,
    pub generation: u32,
}

/// Why an action failed; `permanent`: trying again cannot help (no such object, its ETag
/// changed, no such bucket).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub error: String,
    pub permanent: bool,
}

/// One queued or running action, as `lode hsm status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Queued {
    pub id: u64,
    pub kind: ActionKind,
    pub fid: Fid,
    pub running: bool,
    pub landed: u64,
    pub attempts: u32,
    pub last_error: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HsmReply {
    Done,
    Link(Link),
    Links(#[serde(deserialize_with = "crate::seq::deserialize")] Vec<Link>),
    State(Option<State>),
    /// A restore's progress: `done` (the file is whole in lode again, `inode` its attributes
    /// and layout) or bytes up to `landed` readable from mirror 0 of `inode`'s layout.
    Restoring {
        done: bool,
        landed: u64,
        inode: Inode,
    },
    Status {
        #[serde(deserialize_with = "crate::seq::deserialize")]
        actions: Vec<Queued>,
        #[serde(deserialize_with = "crate::seq::deserialize")]
        imports: Vec<(u32, String)>,
        archived: u64,
        restored: u64,
        failed: u64,
    },
    Work(#[serde(deserialize_with = "crate::seq::deserialize")] Vec<Work>),
    Import(Option<ImportWork>),
    Imported {
        made: u32,
        skipped: u32,
    },
}

/// An HSM request, by whom (`MDS_HSM`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsHsm {
    pub creds: crate::md::Creds,
    pub request: HsmRequest,
}

impl Rpc for MdsHsm {
    const OPCODE: Opcode = opcodes::MDS_HSM;
    type Reply = HsmReply;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_policies_parse_and_bad_ones_are_refused() {
        assert_eq!(
            parse_url("s3://my-bucket/a/b/").unwrap(),
            ("my-bucket".into(), "a/b".into())
        );
        assert_eq!(parse_url("s3://abc").unwrap(), ("abc".into(), "".into()));
        assert!(parse_url("http://abc").is_err());
        assert!(parse_url("s3://A_B").is_err());
        assert!(parse_url("s3://ab").is_err());
        let p = Policy::parse("new,deleted").unwrap();
        assert!(p.new && !p.changed && p.deleted);
        assert_eq!(p.to_string(), "new,deleted");
        assert!(Policy::parse("new,sometimes").is_err());
        assert_eq!(Policy::parse("").unwrap().to_string(), "none");
    }

    #[test]
    fn states_round_trip_and_print_lustres_words() {
        let s = State {
            archived: true,
            released: true,
            key: "p/x".into(),
            etag: "\"e\"".into(),
            size: 5,
            ..Default::default()
        };
        assert_eq!(State::decode(&s.encode()), Some(s.clone()));
        assert_eq!(s.words(), "exists archived released");
        assert_eq!(State::decode(&[0xff; 3]), None);
        let l = Link {
            id: 1,
            dir: Fid::new(1, 2, 0),
            path: "/d".into(),
            bucket: "b-1".into(),
            prefix: "".into(),
            endpoint: None,
            region: None,
            import: Policy::default(),
            export: Policy::default(),
            importing: false,
        };
        assert_eq!(l.key_of("/x/y"), "x/y");
        assert_eq!(
            Link {
                prefix: "p".into(),
                ..l
            }
            .key_of("x"),
            "p/x"
        );
    }
}
