//! The faults the seed throws between operations: servers killed or losing power, disks full or
//! failing a sync, partitions, lost replies, clients evicted, and the network healed after.

use super::*;

impl Sim {
    pub(super) async fn fault(&mut self) -> Result<(), Failure> {
        self.report.faults += 1;
        let server = self.rng.gen_range(0..SERVERS);
        let kind = self.rng.gen_range(0..13);
        self.note(|| {
            let what = [
                "kill",
                "power loss",
                "MDS kill",
                "MDS power loss",
                "disk full",
                "MDS disk full",
                "partition",
                "client and MDS crash",
                "lost replies",
                "failing sync",
                "eviction",
                "MDT1 kill",
                "MDT1 power loss",
            ];
            format!("fault: {} (storage server {server})", what[kind])
        });
        match kind {
            0 => {
                self.cluster.kill_oss(server);
                self.restart_oss(server).await
            }
            1 => {
                self.cluster.kill_oss(server);
                self.engines[server].crash();
                self.restart_oss(server).await
            }
            2 => {
                self.cluster.kill_mds().await;
                self.restart_mds().await
            }
            3 => {
                self.cluster.kill_mds().await;
                self.disk.crash(Some(self.rng.gen()));
                self.restart_mds().await
            }
            4 => {
                // A storage server's disk fills up, and has room again a while later.
                let engine = self.engines[server].clone();
                let space = oss::engine::Engine::space(&*engine, std::path::Path::new("/"))
                    .map_err(|e| self.fail(format!("the engine's space: {e}")))?;
                engine.set_capacity(space.total - space.free);
                let after = Duration::from_millis(self.rng.gen_range(50..1500));
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    engine.set_capacity(1 << 30);
                });
                Ok(())
            }
            5 => {
                // The MDS's disk fills up: a journal write that needs room fails and the MDS
                // refuses changes from then on; the operator makes room and restarts it.
                self.disk.set_capacity(Some(self.disk.used()));
                let c = self.clients[self.rng.gen_range(0..2)].clone();
                let _ = c
                    .mkdir(&format!("/full{}", self.report.faults), 0o755)
                    .await;
                self.disk.set_capacity(None);
                self.cluster.kill_mds().await;
                self.restart_mds().await
            }
            7 => {
                // A client dies with changes the MDS has not committed, and the MDS dies
                // before committing them: those may be lost (and what depended on them), and
                // nothing else.
                let slot = self.rng.gen_range(0..2);
                self.drop_held_lost_with(slot);
                let id = u128::from(self.seed) << 64 | u128::from(self.started + 1);
                let name = format!("c{slot}-{}", self.started);
                self.started += 1;
                self.names[slot] = name.clone();
                // Its slot holds the other client until the MDS is back.
                let other = self.clients[1 - slot].clone();
                drop(std::mem::replace(&mut self.clients[slot], other));
                self.cluster.kill_mds().await;
                if self.rng.gen_bool(0.5) {
                    self.disk.crash(Some(self.rng.gen()));
                }
                self.model.client_lost(slot);
                self.restart_mds().await?;
                let cfg = ClientConfig {
                    id: Some(id),
                    ..client_config(&self.clock)
                };
                self.clients[slot] = self.connect(&name, cfg).await?;
                Ok(())
            }
            8 => {
                // The MDS's replies to a client are lost for a while: whatever it sends then
                // is carried out and sent again, batches of changes answered ahead included.
                let slot = self.rng.gen_range(0..2);
                let client = self.client_name(slot);
                self.fabric.cut_oneway("mds", &client);
                self.heal_later();
                Ok(())
            }
            9 => {
                // The next sync on a storage server's disk fails, and the writes it covered
                // are dropped from the write-back while the retry would say Ok.
                self.engines[server].fail_next(oss::engine::mem::Op::Sync, libc::EIO);
                Ok(())
            }
            10 => self.evict().await,
            11 | 12 => {
                // MDT1's MDS killed, or losing power with its last journal write torn: it
                // answered every change once durable, so none is lost.
                self.cluster.kill_mdt(1).await;
                if kind == 12 {
                    self.mdt1_disk.crash(Some(self.rng.gen()));
                }
                let r = self.cluster.start_mdt(1).await;
                r.map_err(|e| self.fail(format!("restarting MDT1: {e}")))
            }
            _ => {
                let client = format!("c{}", self.rng.gen_range(0..2));
                self.fabric.partition(&client, &format!("oss{server}"));
                self.heal_later();
                Ok(())
            }
        }
    }

    /// Heals the fabric's cuts a while from now, as the seed says.
    pub(super) fn heal_later(&mut self) {
        let fabric = self.fabric.clone();
        let heal_after = Duration::from_millis(self.rng.gen_range(50..1500));
        tokio::spawn(async move {
            tokio::time::sleep(heal_after).await;
            fabric.heal();
        });
    }

    /// Stops holding to its rule every file held open by client `slot`, or opened by a name
    /// that changes lost with `slot` gave it: once such a change is lost (a checkpoint's rename
    /// into place), the file held is the one its old name names again (the temporary name a
    /// checkpointer truncates and writes anew), as after a Lustre client and server both die
    /// before the commit.
    fn drop_held_lost_with(&mut self, slot: usize) {
        let lost = self.model.names_lost_with(slot);
        self.held
            .retain(|(_, c, name, _)| *c != slot && !lost.contains(name));
    }

    /// A client cut off from the MDS while it restarts and recovers without it: evicted, its
    /// acknowledged changes not committed are lost. It must say so at its next sync; if it
    /// says nothing, they are held to every rule still.
    pub(super) async fn evict(&mut self) -> Result<(), Failure> {
        let slot = self.rng.gen_range(0..2);
        let name = self.client_name(slot);
        self.fabric.partition(&name, "mds");
        self.cluster.kill_mds().await;
        self.restart_mds().await?;
        // Past the recovery window (the lease term at least).
        tokio::time::sleep(mds::lease::TERM + Duration::from_secs(2)).await;
        self.fabric.heal();
        // Its held files may be gone with its handles.
        self.held.retain(|(_, c, ..)| *c != slot);
        let c = self.clients[slot].clone();
        let held = c.uncommitted();
        match c.sync().await {
            Ok(()) => self.note(|| {
                format!("client {slot} was cut off ({held} uncommitted), and not evicted")
            }),
            Err(e) => {
                self.note(|| format!("client {slot} evicted: {e}"));
                self.report.refused += 1;
                self.drop_held_lost_with(slot);
                self.model.client_lost(slot);
            }
        }
        Ok(())
    }

    pub(super) async fn restart_oss(&mut self, i: usize) -> Result<(), Failure> {
        let r = self.cluster.start_oss(i).await;
        r.map_err(|e| self.fail(format!("restarting storage server {i}: {e}")))
    }

    pub(super) async fn restart_mds(&mut self) -> Result<(), Failure> {
        let r = self.cluster.start_mds().await;
        r.map_err(|e| self.fail(format!("restarting the MDS: {e}")))
    }

    /// Forgets the uncertainty of changes whose client knows them committed.
    pub(super) fn forget_committed(&mut self) {
        let done: Vec<bool> = self.clients.iter().map(Client::all_committed).collect();
        self.model.uncertain.retain(|u| !done[u.client]);
    }
}
