//! Invariant: the namespace passes fsck and every target passes scrub.

use super::*;

impl Sim {
    pub(super) async fn check_consistency(&mut self) -> Result<(), Failure> {
        let problems = self.cluster.mds().fsck();
        if !problems.is_empty() {
            return Err(self.fail(format!("fsck: {}", problems.join("; "))));
        }
        for i in 0..SERVERS {
            let Some(s) = self.cluster.oss(i) else {
                continue;
            };
            let reports = s
                .scrub()
                .await
                .map_err(|e| self.fail(format!("scrub of server {i}: {e}")))?;
            for r in reports {
                if !r.bad.is_empty() {
                    return Err(self.fail(format!("scrub of server {i}: bad blocks {:?}", r.bad)));
                }
            }
        }
        Ok(())
    }
}
