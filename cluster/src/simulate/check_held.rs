//! Invariant: a checkpoint a reader holds open reads the same until it closes it, whatever is
//! renamed over it and however the MDS restarts.

use super::*;

impl Sim {
    /// Every checkpoint held open reads as it did when it was opened.
    pub(super) async fn check_held(&mut self) -> Result<(), Failure> {
        for (f, _, name, bytes) in &self.held {
            match read_all(f).await {
                Ok(now) if now == *bytes => {}
                Ok(now) => {
                    return Err(self.fail(format!(
                        "{name}, held open, read {} bytes and now {} ({})",
                        bytes.len(),
                        now.len(),
                        describe(&Some(now.clone()))
                    )))
                }
                Err(e) => return Err(self.fail(format!("{name}, held open: {e}"))),
            }
        }
        Ok(())
    }
}
