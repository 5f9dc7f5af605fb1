//! The check across MDTs: each MDT's namespace is checked on its own ([`Namespace::check`]);
//! this checks what no one MDT can, the pairs a directory on another MDT than its parent's
//! makes: its name (a stub) in the parent's MDT and the directory in its own.
//!
//! - a name whose directory is not there, or is not a directory whose parent is the name's
//!   directory: an `rmdir` cut short between its halves (`rmdir` of the name removes it);
//! - a directory named by no entry of its parent's MDT: a `mkdir -i` cut short (it is empty),
//!   or, holding entries, a namespace that lost the name;
//! - a directory named twice;
//! - a striped directory listing a shard its MDT does not hold, or a shard its master does
//!   not list (a name in the wrong shard is each MDT's own check);
//! - a file whose home counts another number of names on other MDTs than they hold, or a
//!   name of a file its home does not hold.
//!
//! A mkdir, rmdir or rename across MDTs recorded and not yet ended is between two of these
//! states, and is not judged: its MDS ends it when it starts.
//!
//! Only the MDTs given are checked against each other: a name or a parent on an MDT not given
//! is not judged.

use std::collections::HashMap;

use proto::Fid;

use crate::namespace::Namespace;

/// The problems between `namespaces`, each an MDT's (two of one MDT is a problem too).
pub fn check_across(namespaces: &[&Namespace]) -> Vec<String> {
    let mut problems = vec![];
    let mut by_mdt: HashMap<u32, &Namespace> = HashMap::new();
    for ns in namespaces {
        if by_mdt.insert(ns.mdt(), ns).is_some() {
            problems.push(format!("MDT{} is given twice", ns.mdt()));
        }
    }
    // Every name of a directory of another MDT, by that directory.
    let mut names: HashMap<Fid, Vec<(u32, Fid, Vec<u8>)>> = HashMap::new();
    for ns in namespaces {
        for (dir, name, fid) in ns.remote_entries() {
            names.entry(fid).or_default().push((ns.mdt(), dir, name));
        }
    }
    // mkdirs and rmdirs across MDTs recorded and not yet ended (their MDS ends them when it
    // starts): the parent, and the name.
    let placing: Vec<(Fid, Vec<u8>, bool)> = namespaces
        .iter()
        .flat_map(|ns| ns.placing())
        .map(|(d, p)| {
            let rmdir = matches!(*p.step, crate::namespace::Mutation::RmdirRemote { .. });
            (d, p.name, rmdir)
        })
        .collect();
    // Directories whose names are moving between directories of two MDTs (their MDS ends
    // the moves when it starts): named in both, or with either parent, meanwhile.
    let moving: std::collections::HashSet<Fid> = namespaces
        .iter()
        .flat_map(|ns| {
            ns.moving().into_iter().filter_map(|m| {
                ns.lookup(m.parent, &m.name, &crate::namespace::Creds::root())
                    .ok()
                    .map(|i| i.fid)
            })
        })
        .collect();
    for (fid, named) in &names {
        if moving.contains(fid) {
            continue;
        }
        let shown = |(mdt, dir, name): &(u32, Fid, Vec<u8>)| {
            format!("{dir}/{} on MDT{mdt}", String::from_utf8_lossy(name))
        };
        if named.len() > 1 {
            let all: Vec<String> = named.iter().map(shown).collect();
            problems.push(format!(
                "{fid} is named {} times: {}",
                named.len(),
                all.join(", ")
            ));
        }
        let Some(home) = proto::fid::mdt_of(*fid).and_then(|k| by_mdt.get(&k)) else {
            continue;
        };
        for n in named {
            let removing = placing
                .iter()
                .any(|(d, name, rmdir)| *rmdir && *d == n.1 && *name == n.2);
            match home.remote_parent_of(*fid) {
                None if removing => {}
                None => problems.push(format!(
                    "{} names {fid}, which MDT{} does not hold as a directory placed from \
                     another MDT (an rmdir cut short between its halves: rmdir the name)",
                    shown(n),
                    home.mdt()
                )),
                Some(p) if p != n.1 => problems.push(format!(
                    "{} names {fid}, whose parent on MDT{} is {p}",
                    shown(n),
                    home.mdt()
                )),
                Some(_) => {}
            }
        }
    }
    // Striped directories: every shard a master lists is there, as that shard; every shard
    // is listed by its master (unless the master is being made or removed).
    let mut listed: HashMap<Fid, (Fid, u32)> = HashMap::new();
    for ns in namespaces {
        for (master, stripe) in ns.striped() {
            for (j, shard) in stripe.shards.iter().enumerate() {
                listed.insert(*shard, (master, j as u32));
                let Some(there) = proto::fid::mdt_of(*shard).and_then(|k| by_mdt.get(&k)) else {
                    continue;
                };
                let held = there
                    .shards()
                    .into_iter()
                    .any(|(f, s, _)| f == *shard && s.master == master && s.index == j as u32);
                if !held {
                    problems.push(format!(
                        "{master} on MDT{} lists {shard} as shard {j}, which MDT{} does not hold                          as one",
                        ns.mdt(),
                        there.mdt()
                    ));
                }
            }
        }
    }
    // Files named on other MDTs: the home counts as many names elsewhere as the other MDTs
    // hold stubs of it (a stub whose name went and whose home is yet to hear counts still);
    // a stub's file exists at its home unless the home heard its name go.
    if by_mdt.len() == namespaces.len() {
        let mut stubs: HashMap<Fid, Vec<u32>> = HashMap::new();
        for ns in namespaces {
            for f in ns.remote_files() {
                stubs.entry(f).or_default().push(ns.mdt());
            }
        }
        for ns in namespaces {
            for (fid, n) in ns.named_elsewhere() {
                let held = stubs.get(&fid).map_or(0, Vec::len);
                let all_given = (0..=by_mdt.keys().copied().max().unwrap_or(0))
                    .all(|k| by_mdt.contains_key(&k));
                // A move under way (its MDS finishes it when it starts) is between counts.
                let moving = namespaces.iter().any(|m| m.is_moving(fid));
                if all_given && !moving && held != n as usize {
                    problems.push(format!(
                        "{fid} on MDT{} counts {n} names on other MDTs, which hold {held}",
                        ns.mdt()
                    ));
                }
            }
        }
        for (fid, on) in &stubs {
            let Some(home) = proto::fid::mdt_of(*fid).and_then(|k| by_mdt.get(&k)) else {
                continue;
            };
            if home.inode(*fid).is_err() && on.iter().any(|k| !by_mdt[k].is_dropping(*fid)) {
                problems.push(format!(
                    "{fid} is named on MDT{on:?} but MDT{} does not hold it",
                    home.mdt()
                ));
            }
        }
    }
    let mut shard_fids = std::collections::HashSet::new();
    for ns in namespaces {
        for (shard, of, entries) in ns.shards() {
            shard_fids.insert(shard);
            let Some(home) = proto::fid::mdt_of(of.master).and_then(|k| by_mdt.get(&k)) else {
                continue;
            };
            let settled = home
                .striped()
                .into_iter()
                .find(|(f, _)| *f == of.master)
                .map(|(_, s)| s.state == proto::dirstripe::StripeState::Ready);
            if listed.get(&shard) != Some(&(of.master, of.index)) && settled != Some(false) {
                problems.push(format!(
                    "{shard} on MDT{} is shard {} of {}, which MDT{} does not list ({entries}                      entries)",
                    ns.mdt(),
                    of.index,
                    of.master,
                    home.mdt()
                ));
            }
        }
    }
    for ns in namespaces {
        for (dir, parent, entries) in ns.remote_parented() {
            if shard_fids.contains(&dir) {
                continue; // a shard: checked with its master above
            }
            let Some(k) = proto::fid::mdt_of(parent) else {
                problems.push(format!(
                    "{dir} on MDT{} has parent {parent}, no MDT's",
                    ns.mdt()
                ));
                continue;
            };
            if !by_mdt.contains_key(&k) {
                continue;
            }
            let named_there = names
                .get(&dir)
                .is_some_and(|n| n.iter().any(|(m, d, _)| *m == k && *d == parent));
            let making = placing.iter().any(|(d, _, rmdir)| !rmdir && *d == parent);
            if !named_there && !making && !moving.contains(&dir) {
                let what = if entries == 0 {
                    "empty: a mkdir across MDTs cut short between its halves".to_string()
                } else {
                    format!("holding {entries} entries, which no path reaches")
                };
                problems.push(format!(
                    "{dir} on MDT{} is named by no entry of its parent {parent} on MDT{k} ({what})",
                    ns.mdt()
                ));
            }
        }
    }
    problems.sort();
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::namespace::{Creds, Kind, Mutation, Time, ROOT};

    fn now() -> Time {
        Time::default()
    }

    /// MDT0 and MDT1, with `/r` on MDT1 (both halves made).
    fn pair() -> (Namespace, Namespace, Fid) {
        let mut zero = Namespace::for_mdt(0, now());
        let mut one = Namespace::for_mdt(1, now());
        let root = Creds::root();
        let made = one
            .apply(
                &Mutation::MkdirForRemote {
                    parent: ROOT,
                    name: b"r".to_vec(),
                    mode: 0o755,
                    gid: 0,
                    layout: None,
                },
                &root,
                now(),
            )
            .unwrap()
            .inode
            .unwrap();
        zero.apply(
            &Mutation::LinkRemoteDir {
                parent: ROOT,
                name: b"r".to_vec(),
                inode: made.clone(),
            },
            &root,
            now(),
        )
        .unwrap();
        (zero, one, made.fid)
    }

    #[test]
    fn both_halves_check_clean_and_either_missing_is_named() {
        let (zero, one, r) = pair();
        assert!(zero.check().is_empty(), "{:?}", zero.check());
        assert!(one.check().is_empty(), "{:?}", one.check());
        assert!(check_across(&[&zero, &one]).is_empty());
        // Only the MDTs given are judged.
        assert!(check_across(&[&zero]).is_empty());
        assert!(check_across(&[&one]).is_empty());

        // An rmdir cut short: the directory gone, its name left.
        let mut gone = one.clone();
        gone.apply(&Mutation::RmdirRemote { fid: r }, &Creds::root(), now())
            .unwrap();
        let p = check_across(&[&zero, &gone]);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("rmdir cut short"), "{p:?}");

        // A mkdir cut short: the directory made, never named.
        let bare = Namespace::for_mdt(0, now());
        let p = check_across(&[&bare, &one]);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("mkdir across MDTs cut short"), "{p:?}");

        // A directory holding entries that no name reaches.
        let mut full = one.clone();
        full.apply(
            &Mutation::Create {
                parent: r,
                name: b"f".to_vec(),
                kind: Kind::File,
                mode: 0o644,
                exclusive: true,
                target: vec![],
                layout: None,
            },
            &Creds::root(),
            now(),
        )
        .unwrap();
        let p = check_across(&[&bare, &full]);
        assert!(p[0].contains("holding 1 entries"), "{p:?}");

        // One MDT given twice.
        assert!(check_across(&[&zero, &zero])[0].contains("given twice"));
    }
}
