//! The HSM coordinator: the queue of archive and restore actions copytools take, as Lustre's
//! MDT coordinator keeps it.
//!
//! What must survive a crash is in the namespace: each action is recorded on its file's state
//! ([`proto::hsm::State::action`]) and each import on the link, so the queue is rebuilt from
//! the journal when the MDS starts ([`Coordinator::rebuild`]). What is only here: which
//! copytool holds an action (it is handed out again once the copytool stops reporting for
//! [`TAKE_TIMEOUT`]), how far a restore's bytes landed, attempts and the last error.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use proto::hsm::{Action, ActionKind, Queued};
use proto::Fid;

/// A copytool that reports nothing on an action for this long has lost it.
pub const TAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Attempts of one action before it is given up (its error kept for `lode hsm status`).
pub const MAX_ATTEMPTS: u32 = 4;

struct Entry {
    fid: Fid,
    kind: ActionKind,
    taken: Option<(u128, Instant)>,
    not_before: Instant,
    landed: u64,
    attempts: u32,
    last_error: Option<String>,
}

struct Import {
    taken: Option<(u128, Instant)>,
    not_before: Instant,
    attempts: u32,
    last_error: Option<String>,
}

/// How an action ended, for those waiting on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ended {
    Done,
    Failed(String),
}

#[derive(Default)]
struct Queue {
    actions: BTreeMap<u64, Entry>,
    by_fid: HashMap<Fid, u64>,
    imports: BTreeMap<u32, Import>,
    /// How the last action on each file ended lately, and when, for restores' waiters that
    /// look after the end.
    ended: HashMap<Fid, (Ended, Instant)>,
    archived: u64,
    restored: u64,
    failed: u64,
}

/// The queue, and a wake-up for copytools waiting for work and readers waiting for bytes.
#[derive(Default)]
pub struct Coordinator {
    q: Mutex<Queue>,
    /// Work was queued.
    pub work: tokio::sync::Notify,
    /// A restore made progress or ended.
    pub progress: tokio::sync::Notify,
    /// Held while an action is recorded on a file, so that readers asking at once start one
    /// restore, not one each.
    pub starting: tokio::sync::Mutex<()>,
}

impl Coordinator {
    /// The queue as the namespace records it: every file's action, and the links whose
    /// import is wanted.
    pub fn rebuild(&self, actions: Vec<(Fid, Action)>, imports: Vec<u32>) {
        let mut q = self.q.lock();
        let now = Instant::now();
        for (fid, a) in actions {
            q.by_fid.insert(fid, a.id);
            q.actions.insert(
                a.id,
                Entry {
                    fid,
                    kind: a.kind,
                    taken: None,
                    not_before: now,
                    landed: 0,
                    attempts: 0,
                    last_error: None,
                },
            );
        }
        for link in imports {
            q.imports.entry(link).or_insert(Import {
                taken: None,
                not_before: now,
                attempts: 0,
                last_error: None,
            });
        }
        drop(q);
        self.work.notify_waiters();
    }

    /// The action under way on `fid`, if any.
    pub fn of_file(&self, fid: Fid) -> Option<(u64, ActionKind)> {
        let q = self.q.lock();
        let id = *q.by_fid.get(&fid)?;
        q.actions.get(&id).map(|e| (id, e.kind))
    }

    /// Queues action `id` on `fid` (already recorded on its state).
    pub fn queue(&self, fid: Fid, id: u64, kind: ActionKind) {
        let mut q = self.q.lock();
        q.ended.remove(&fid);
        q.by_fid.insert(fid, id);
        q.actions.insert(
            id,
            Entry {
                fid,
                kind,
                taken: None,
                not_before: Instant::now(),
                landed: 0,
                attempts: 0,
                last_error: None,
            },
        );
        drop(q);
        self.work.notify_waiters();
    }

    /// Queues an import of `link`.
    pub fn queue_import(&self, link: u32) {
        self.q.lock().imports.insert(
            link,
            Import {
                taken: None,
                not_before: Instant::now(),
                attempts: 0,
                last_error: None,
            },
        );
        self.work.notify_waiters();
    }

    /// Forgets a link's import (the link is gone).
    pub fn drop_import(&self, link: u32) {
        self.q.lock().imports.remove(&link);
    }

    /// Up to `max` actions free to take, now taken by `copytool`.
    pub fn take(&self, copytool: u128, max: usize) -> Vec<(u64, Fid, ActionKind)> {
        let now = Instant::now();
        let mut q = self.q.lock();
        let mut out = vec![];
        for (id, e) in q.actions.iter_mut() {
            if out.len() >= max {
                break;
            }
            let free = e.taken.is_none_or(|(_, until)| until <= now);
            if free && e.not_before <= now {
                e.taken = Some((copytool, now + TAKE_TIMEOUT));
                e.attempts += 1;
                out.push((*id, e.fid, e.kind));
            }
        }
        out
    }

    /// An import free to take, now taken by `copytool`.
    pub fn take_import(&self, copytool: u128) -> Option<u32> {
        let now = Instant::now();
        let mut q = self.q.lock();
        let (link, i) = q
            .imports
            .iter_mut()
            .find(|(_, i)| i.taken.is_none_or(|(_, until)| until <= now) && i.not_before <= now)?;
        i.taken = Some((copytool, now + TAKE_TIMEOUT));
        i.attempts += 1;
        Some(*link)
    }

    /// The file and kind of action `id`, when `copytool` holds it (or nobody does, after a
    /// restart of the MDS: the copytool carries on).
    pub fn held(&self, id: u64, copytool: Option<u128>) -> Option<(Fid, ActionKind)> {
        let mut q = self.q.lock();
        let e = q.actions.get_mut(&id)?;
        match (e.taken, copytool) {
            (Some((c, _)), Some(me)) if c != me => return None,
            (None, Some(me)) => e.taken = Some((me, Instant::now() + TAKE_TIMEOUT)),
            _ => {}
        }
        Some((e.fid, e.kind))
    }

    /// A restore's bytes up to `landed` are in place; the copytool keeps the action.
    pub fn progress(&self, id: u64, landed: u64) -> bool {
        let mut q = self.q.lock();
        let Some(e) = q.actions.get_mut(&id) else {
            return false;
        };
        e.landed = e.landed.max(landed);
        if let Some((_, until)) = &mut e.taken {
            *until = Instant::now() + TAKE_TIMEOUT;
        }
        drop(q);
        self.progress.notify_waiters();
        true
    }

    /// How the action on `fid` stands: bytes a restore landed while under way, or how the
    /// last one ended (within `lately`).
    pub fn restore_of(&self, fid: Fid, lately: Duration) -> Option<Result<u64, Ended>> {
        let q = self.q.lock();
        if let Some(e) = q.by_fid.get(&fid).and_then(|id| q.actions.get(id)) {
            return Some(Ok(e.landed));
        }
        q.ended
            .get(&fid)
            .filter(|(_, at)| at.elapsed() < lately)
            .map(|(e, _)| Err(e.clone()))
    }

    /// Action `id` ended (its file's state already says so).
    pub fn finish(&self, id: u64, ended: Ended) {
        let mut q = self.q.lock();
        if let Some(e) = q.actions.remove(&id) {
            if q.by_fid.get(&e.fid) == Some(&id) {
                q.by_fid.remove(&e.fid);
            }
            match (&ended, e.kind) {
                (Ended::Done, ActionKind::Archive) => q.archived += 1,
                (Ended::Done, ActionKind::Restore) => q.restored += 1,
                (Ended::Failed(_), _) => q.failed += 1,
            }
            if q.ended.len() > 4096 {
                q.ended.clear();
            }
            // An action another replaced tells nobody anything about the file.
            if !q.by_fid.contains_key(&e.fid) {
                q.ended.insert(e.fid, (ended, Instant::now()));
            }
        }
        drop(q);
        self.progress.notify_waiters();
    }

    /// Action `id` failed this time: handed out again after a pause that doubles with each
    /// attempt, or, past [`MAX_ATTEMPTS`] (or at once when `permanent`), to be given up
    /// (true: the caller ends it).
    pub fn failed(&self, id: u64, error: &str, permanent: bool) -> bool {
        let mut q = self.q.lock();
        let Some(e) = q.actions.get_mut(&id) else {
            return false;
        };
        e.last_error = Some(error.to_string());
        e.taken = None;
        if permanent || e.attempts >= MAX_ATTEMPTS {
            return true;
        }
        e.not_before = Instant::now() + Duration::from_secs(1 << e.attempts.min(6));
        drop(q);
        self.progress.notify_waiters();
        false
    }

    /// An import ended: done, or failed (tried again later, up to [`MAX_ATTEMPTS`]).
    pub fn import_ended(&self, link: u32, error: Option<&str>) {
        let mut q = self.q.lock();
        match error {
            None => {
                q.imports.remove(&link);
            }
            Some(e) => {
                let give_up = match q.imports.get_mut(&link) {
                    Some(i) => {
                        i.last_error = Some(e.to_string());
                        i.taken = None;
                        i.not_before = Instant::now() + Duration::from_secs(1 << i.attempts.min(6));
                        i.attempts >= MAX_ATTEMPTS
                    }
                    None => false,
                };
                if give_up {
                    q.imports.remove(&link);
                    q.failed += 1;
                }
            }
        }
    }

    /// What is queued, for `lode hsm status`.
    pub fn status(&self) -> (Vec<Queued>, Vec<(u32, String)>, [u64; 3]) {
        let q = self.q.lock();
        let now = Instant::now();
        let actions = q
            .actions
            .iter()
            .map(|(id, e)| Queued {
                id: *id,
                kind: e.kind,
                fid: e.fid,
                running: e.taken.is_some_and(|(_, until)| until > now),
                landed: e.landed,
                attempts: e.attempts,
                last_error: e.last_error.clone(),
            })
            .collect();
        let imports = q
            .imports
            .iter()
            .map(|(l, i)| {
                let what = match (&i.last_error, i.taken.is_some_and(|(_, u)| u > now)) {
                    (_, true) => "importing".to_string(),
                    (Some(e), false) => format!("waiting to try again: {e}"),
                    (None, false) => "queued".to_string(),
                };
                (*l, what)
            })
            .collect();
        (actions, imports, [q.archived, q.restored, q.failed])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_action_is_held_by_one_copytool_until_it_stops_reporting() {
        let c = Coordinator::default();
        let f = Fid::new(0x200000400, 7, 0);
        c.queue(f, 11, ActionKind::Restore);
        assert_eq!(c.take(1, 8), vec![(11, f, ActionKind::Restore)]);
        assert!(c.take(2, 8).is_empty(), "held by copytool 1");
        assert_eq!(c.held(11, Some(2)), None);
        assert_eq!(c.held(11, Some(1)), Some((f, ActionKind::Restore)));
        assert!(c.progress(11, 4096));
        assert_eq!(c.restore_of(f, Duration::from_secs(9)), Some(Ok(4096)));
        assert!(!c.failed(11, "slow down", false), "tried again later");
        assert!(c.take(2, 8).is_empty(), "not before its pause");
        c.finish(11, Ended::Failed("gone".into()));
        let lately = Duration::from_secs(9);
        assert_eq!(
            c.restore_of(f, lately),
            Some(Err(Ended::Failed("gone".into())))
        );
        assert_eq!(
            c.restore_of(f, Duration::ZERO),
            None,
            "forgotten after a while"
        );
        assert_eq!(c.of_file(f), None);
    }

    #[test]
    fn an_action_replaced_on_its_file_ends_without_speaking_for_the_file() {
        let c = Coordinator::default();
        let f = Fid::new(0x200000400, 8, 0);
        c.queue(f, 1, ActionKind::Restore);
        c.queue(f, 2, ActionKind::Restore);
        c.finish(1, Ended::Failed("the action was replaced".into()));
        assert_eq!(c.of_file(f), Some((2, ActionKind::Restore)));
        assert_eq!(c.restore_of(f, Duration::from_secs(9)), Some(Ok(0)));
    }

    #[test]
    fn the_queue_is_rebuilt_from_what_the_files_record() {
        let c = Coordinator::default();
        let f = Fid::new(0x200000400, 9, 0);
        c.rebuild(
            vec![(
                f,
                Action {
                    id: 5,
                    kind: ActionKind::Archive,
                },
            )],
            vec![3],
        );
        assert_eq!(c.of_file(f), Some((5, ActionKind::Archive)));
        assert_eq!(c.take_import(9), Some(3));
        assert_eq!(c.take_import(8), None);
        // A copytool that carried on across the restart keeps its action.
        assert_eq!(c.held(5, Some(4)), Some((f, ActionKind::Archive)));
        assert!(c.take(1, 8).is_empty());
        assert!(
            c.failed(5, "no such bucket", true),
            "a permanent failure ends it"
        );
    }
}
