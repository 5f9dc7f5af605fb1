//! Invariant: each MDT's namespace passes fsck, the two pass the check across MDTs, and every
//! target passes scrub.

use super::*;

impl Sim {
    pub(super) async fn check_consistency(&mut self) -> Result<(), Failure> {
        let problems = self.cluster.mds().fsck();
        if !problems.is_empty() {
            return Err(self.fail(format!("fsck: {}", problems.join("; "))));
        }
        let Some(mdt1) = self.cluster.mdt(1) else {
            return Err(self.fail("MDT1 does not run"));
        };
        let problems = mdt1.fsck();
        if !problems.is_empty() {
            return Err(self.fail(format!("fsck of MDT1: {}", problems.join("; "))));
        }
        let both = [self.cluster.mds().namespace(), mdt1.namespace()];
        let problems = mds::across::check_across(&[&both[0], &both[1]]);
        if !problems.is_empty() {
            return Err(self.fail(format!("across MDTs: {}", problems.join("; "))));
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
