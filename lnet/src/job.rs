//! Which job a request works for, on the caller's side (Lustre's `jobid_var`).
//!
//! An endpoint tags each request with a job: the one a task runs under ([`scope`]), else the
//! endpoint's own ([`crate::tcp::TcpConfig::job`]), else none. A process finds its job in the
//! environment ([`from_env`]); the mount finds each caller's in the caller's environment
//! ([`of_process`]).

use std::future::Future;

use proto::JobId;

/// The variable that names the variable holding the job id (`SLURM_JOB_ID`, say).
pub const JOBID_VAR: &str = "LODE_JOBID_VAR";
/// The variable read when [`JOBID_VAR`] is not set.
pub const DEFAULT_JOBID_VAR: &str = "LODE_JOBID";
/// Values of [`JOBID_VAR`] that name no variable: the process name and uid, or no job at all.
pub const PROCNAME_UID: &str = "procname_uid";
pub const DISABLE: &str = "disable";

tokio::task_local! {
    static JOB: Option<JobId>;
}

/// Runs `fut` with its requests tagged with `job`.
pub async fn scope<F: Future>(job: Option<JobId>, fut: F) -> F::Output {
    JOB.scope(job, fut).await
}

/// `fut`, run under the job of the task that made it (a task-local does not pass to a
/// spawned task by itself).
pub fn carry<F: Future>(fut: F) -> impl Future<Output = F::Output> {
    let job = scoped();
    async move {
        match job {
            Some(job) => JOB.scope(job, fut).await,
            None => fut.await,
        }
    }
}

/// `tokio::spawn`, the task working for the spawner's job.
pub fn spawn<F>(fut: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(carry(fut))
}

/// `Handle::spawn`, the task working for the spawner's job.
pub fn spawn_on<F>(rt: &tokio::runtime::Handle, fut: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    rt.spawn(carry(fut))
}

/// `JoinSet::spawn`, the task working for the spawner's job.
pub fn spawn_in<T, F>(set: &mut tokio::task::JoinSet<T>, fut: F) -> tokio::task::AbortHandle
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    set.spawn(carry(fut))
}

/// The job of the task running now, if it runs under [`scope`]; `Some(None)` is a scope
/// without a job.
pub(crate) fn scoped() -> Option<Option<JobId>> {
    JOB.try_with(Clone::clone).ok()
}

/// The job a request tags: the task's, else the endpoint's.
pub(crate) fn current(endpoint: Option<&JobId>) -> Option<JobId> {
    scoped().unwrap_or_else(|| endpoint.cloned())
}

/// Where a job id comes from, as the operator set it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobSource {
    /// The value of this variable, or the process name and uid where it is not set.
    Var(String),
    ProcnameUid,
    Disabled,
}

impl JobSource {
    /// What `$LODE_JOBID_VAR` says (`LODE_JOBID` where it is unset).
    pub fn from_env() -> JobSource {
        match std::env::var(JOBID_VAR) {
            Ok(v) if v == PROCNAME_UID => JobSource::ProcnameUid,
            Ok(v) if v == DISABLE => JobSource::Disabled,
            Ok(v) if !v.is_empty() => JobSource::Var(v),
            _ => JobSource::Var(DEFAULT_JOBID_VAR.to_owned()),
        }
    }

    /// The job of a process, given how to read a variable of its environment, its name and
    /// its uid.
    pub fn job(
        &self,
        var: impl Fn(&str) -> Option<String>,
        procname: &str,
        uid: u32,
    ) -> Option<JobId> {
        let by_name = || JobId::lossy(&format!("{procname}.{uid}"));
        match self {
            JobSource::Disabled => None,
            JobSource::ProcnameUid => by_name(),
            JobSource::Var(name) => var(name).and_then(|v| JobId::lossy(&v)).or_else(by_name),
        }
    }
}

/// This process's job, as [`JobSource::from_env`] says to find it.
pub fn from_env() -> Option<JobId> {
    let name = std::fs::read_to_string("/proc/self/comm").unwrap_or_default();
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    JobSource::from_env().job(|v| std::env::var(v).ok(), name.trim(), uid)
}

/// The job of another process (a caller of the mount), read from `/proc/PID/environ`: `None`
/// when the process is gone or its job cannot be read.
pub fn of_process(source: &JobSource, pid: u32, uid: u32) -> Option<JobId> {
    if *source == JobSource::Disabled {
        return None;
    }
    let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    let environ = match source {
        JobSource::Var(_) => std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default(),
        _ => vec![],
    };
    let var = |want: &str| {
        environ.split(|b| *b == 0).find_map(|kv| {
            let kv = std::str::from_utf8(kv).ok()?;
            let (k, v) = kv.split_once('=')?;
            (k == want).then(|| v.to_owned())
        })
    };
    source.job(var, name.trim(), uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_named_variable_wins_and_the_process_name_stands_in() {
        let slurm = JobSource::Var("SLURM_JOB_ID".into());
        let env = |v: &str| (v == "SLURM_JOB_ID").then(|| "4242".to_owned());
        assert_eq!(slurm.job(env, "python3", 1000).unwrap().as_str(), "4242");
        let none = |_: &str| None;
        assert_eq!(
            slurm.job(none, "python3", 1000).unwrap().as_str(),
            "python3.1000"
        );
        assert_eq!(
            JobSource::ProcnameUid.job(env, "dd", 0).unwrap().as_str(),
            "dd.0"
        );
        assert_eq!(JobSource::Disabled.job(env, "dd", 0), None);
    }

    #[test]
    fn this_process_is_read_from_proc() {
        // SAFETY: getpid/geteuid cannot fail.
        let (pid, uid) = unsafe { (libc::getpid() as u32, libc::geteuid()) };
        let job = of_process(&JobSource::ProcnameUid, pid, uid).unwrap();
        assert!(job.as_str().ends_with(&format!(".{uid}")), "{job}");
        assert_eq!(of_process(&JobSource::ProcnameUid, u32::MAX, 0), None);
    }

    #[tokio::test]
    async fn spawned_tasks_carry_the_spawners_job() {
        let mine = JobId::new("mine").unwrap();
        let got = scope(Some(mine.clone()), async {
            let plain = tokio::spawn(async { current(None) }).await.unwrap();
            let carried = spawn(async { current(None) }).await.unwrap();
            let mut set = tokio::task::JoinSet::new();
            spawn_in(&mut set, async { current(None) });
            (plain, carried, set.join_next().await.unwrap().unwrap())
        })
        .await;
        assert_eq!(got, (None, Some(mine.clone()), Some(mine)));
        assert_eq!(spawn(async { current(None) }).await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_scope_tags_its_task_only() {
        let mine = JobId::new("mine").unwrap();
        let endpoint = JobId::new("endpoint").unwrap();
        assert_eq!(current(Some(&endpoint)), Some(endpoint.clone()));
        let inside = scope(Some(mine.clone()), async { current(Some(&endpoint)) }).await;
        assert_eq!(inside, Some(mine));
        assert_eq!(scope(None, async { current(Some(&endpoint)) }).await, None);
    }
}
