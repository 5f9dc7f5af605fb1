//! The client ids each connection has used. A client names itself with a random id of its own
//! choosing (its reply cache, its open handles, its leases hang on it); one holder of the
//! client key must not be able to make up ids without end and so fill the tables kept per
//! client. A connection may use a few ids (a process with several clients on one connection);
//! past [`IDS_PER_CONNECTION`], a request naming a new id is refused.
//!
//! Connections are known by the address they come from (`ip:port`); the ids of the
//! connections heard from least recently are forgotten past [`CONNECTIONS`].

use std::collections::HashMap;

use parking_lot::Mutex;
use proto::Nid;

/// Client ids one connection may use.
pub const IDS_PER_CONNECTION: usize = 64;

/// Connections whose ids are remembered (more than a server accepts at once).
pub const CONNECTIONS: usize = 16_384;

#[derive(Default)]
struct Table {
    /// Per connection: when it was last heard from (a counter) and its ids.
    by_peer: HashMap<Nid, (u64, Vec<u128>)>,
    clock: u64,
}

#[derive(Default)]
pub struct Peers {
    table: Mutex<Table>,
}

impl Peers {
    /// Whether the connection from `peer` may use `client`: one it used before, or a new one
    /// within its allowance.
    pub fn admit(&self, peer: &Nid, client: u128) -> bool {
        let mut t = self.table.lock();
        let t = &mut *t;
        t.clock += 1;
        let now = t.clock;
        if !t.by_peer.contains_key(peer) && t.by_peer.len() >= CONNECTIONS {
            // Forget the connection heard from least recently (gone, most likely).
            if let Some(oldest) = t
                .by_peer
                .iter()
                .min_by_key(|(_, (seen, _))| *seen)
                .map(|(p, _)| p.clone())
            {
                t.by_peer.remove(&oldest);
            }
        }
        let (seen, ids) = t.by_peer.entry(peer.clone()).or_default();
        *seen = now;
        if ids.contains(&client) {
            return true;
        }
        if ids.len() >= IDS_PER_CONNECTION {
            return false;
        }
        ids.push(client);
        true
    }

    /// Connections remembered now.
    pub fn len(&self) -> usize {
        self.table.lock().by_peer.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nid(port: u16) -> Nid {
        Nid::Tcp(format!("10.0.0.1:{port}").parse().unwrap())
    }

    #[test]
    fn a_connection_uses_a_bounded_number_of_ids() {
        let p = Peers::default();
        for id in 0..IDS_PER_CONNECTION as u128 {
            assert!(p.admit(&nid(1), id));
        }
        assert!(!p.admit(&nid(1), 1 << 100), "one id past the allowance");
        assert!(p.admit(&nid(1), 3), "an id it used before");
        assert!(p.admit(&nid(2), 1 << 100), "another connection");
    }

    #[test]
    fn the_connections_remembered_are_bounded() {
        let p = Peers::default();
        for port in 0..(CONNECTIONS + 10) {
            p.admit(
                &Nid::Tcp(
                    format!("10.0.{}.{}:1", port / 250, port % 250)
                        .parse()
                        .unwrap(),
                ),
                1,
            );
        }
        assert_eq!(p.len(), CONNECTIONS);
    }
}
