//! Invariant: after the faults stop, the cluster makes progress (a new checkpoint commits).

use super::*;

impl Sim {
    /// Liveness: with the faults over, a new checkpoint commits.
    pub(super) async fn check_progress(&mut self) -> Result<(), Failure> {
        let data = self.bytes(64 << 10);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let before = self.report.refused;
            self.checkpoint(0, NAMES, data.clone(), 16 << 10).await?;
            let committed = self
                .model
                .checkpoints
                .get(&format!("/ck{NAMES}"))
                .is_some_and(|v| v.len() == 1 && v[0].is_some());
            if self.report.refused == before && committed {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                return Err(self.fail(format!(
                    "no progress within 30 s after the faults stopped: {}",
                    self.last_error
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
