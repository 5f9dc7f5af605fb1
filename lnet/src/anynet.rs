//! One endpoint type for code that runs on either network: TCP in production, the simulated
//! fabric in the testbed's real-code mode and in tests.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use proto::{Nid, Opcode};

use crate::auth::{CapabilityKey, Security};
use crate::error::NetError;
use crate::region::RegionTable;
use crate::service::BoxFuture;
use crate::service::Service;
use crate::sim::{Fabric, SimEndpoint};
use crate::tcp::{TcpConfig, TcpEndpoint};
use crate::transport::Transport;

#[derive(Clone)]
pub enum AnyNet {
    Tcp(TcpEndpoint),
    Sim(SimEndpoint),
}

impl From<TcpEndpoint> for AnyNet {
    fn from(e: TcpEndpoint) -> Self {
        AnyNet::Tcp(e)
    }
}

impl From<SimEndpoint> for AnyNet {
    fn from(e: SimEndpoint) -> Self {
        AnyNet::Sim(e)
    }
}

impl Transport for AnyNet {
    fn nid(&self) -> Nid {
        match self {
            AnyNet::Tcp(e) => e.nid(),
            AnyNet::Sim(e) => e.nid(),
        }
    }

    fn regions(&self) -> &Arc<RegionTable> {
        match self {
            AnyNet::Tcp(e) => e.regions(),
            AnyNet::Sim(e) => e.regions(),
        }
    }

    fn call_raw<'a>(
        &'a self,
        peer: &'a Nid,
        opcode: Opcode,
        body: Vec<u8>,
        bulk: Option<proto::bulk::BulkGrant>,
        deadline: Duration,
    ) -> BoxFuture<'a, Result<Vec<u8>, NetError>> {
        match self {
            AnyNet::Tcp(e) => e.call_raw(peer, opcode, body, bulk, deadline),
            AnyNet::Sim(e) => e.call_raw(peer, opcode, body, bulk, deadline),
        }
    }

    fn seals_payloads(&self) -> bool {
        match self {
            AnyNet::Tcp(e) => e.seals_payloads(),
            AnyNet::Sim(e) => e.seals_payloads(),
        }
    }

    fn rails(&self) -> Vec<Nid> {
        match self {
            AnyNet::Tcp(e) => e.rails(),
            AnyNet::Sim(e) => e.rails(),
        }
    }

    fn set_peer_rails(&self, peer: &Nid, rails: &[Nid]) {
        match self {
            AnyNet::Tcp(e) => e.set_peer_rails(peer, rails),
            AnyNet::Sim(e) => e.set_peer_rails(peer, rails),
        }
    }

    fn register_device(
        &self,
        mem: crate::device::DeviceMemory,
    ) -> Result<crate::Registered<crate::device::DeviceMemory>, NetError> {
        match self {
            AnyNet::Tcp(e) => e.register_device(mem),
            AnyNet::Sim(e) => e.register_device(mem),
        }
    }
}

impl AnyNet {
    /// Stops serving: a TCP endpoint stops accepting and closes its connections; a node of the
    /// simulated fabric goes down (its peers see it as crashed).
    pub fn shutdown(&self) {
        match self {
            AnyNet::Tcp(e) => e.shutdown(),
            AnyNet::Sim(e) => e.shutdown(),
        }
    }
}

/// Where a server attaches to the network: an address to listen on, or a named node of a
/// simulated fabric. The same server code runs on both.
// Made once per server: the size of its variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
pub enum Attach {
    Tcp {
        listen: SocketAddr,
        /// Further addresses it listens on (multi-rail).
        rails: Vec<SocketAddr>,
        cfg: TcpConfig,
    },
    Sim {
        fabric: Fabric,
        node: String,
    },
}

impl Attach {
    /// Serves on `listen` with `security` (a server's: see [`Security::server`]).
    pub fn tcp(listen: SocketAddr, security: Security) -> Attach {
        Attach::Tcp {
            listen,
            rails: vec![],
            cfg: TcpConfig {
                security,
                ..TcpConfig::default()
            },
        }
    }

    /// Listens on `rails` too, one address per interface; peers are told of them.
    pub fn with_rails(mut self, more: Vec<SocketAddr>) -> Attach {
        if let Attach::Tcp { rails, .. } = &mut self {
            *rails = more;
        }
        self
    }

    /// The key that signs and checks capabilities, when connections are authenticated.
    pub fn capability_key(&self) -> Option<CapabilityKey> {
        match self {
            Attach::Tcp { cfg, .. } => cfg.security.keys().and_then(|k| CapabilityKey::of(k)),
            Attach::Sim { .. } => None,
        }
    }

    pub fn sim(fabric: &Fabric, node: &str) -> Attach {
        Attach::Sim {
            fabric: fabric.clone(),
            node: node.to_owned(),
        }
    }

    /// Serves `service` here.
    pub async fn serve(&self, service: Arc<dyn Service>) -> Result<AnyNet, NetError> {
        Ok(match self {
            Attach::Tcp { listen, rails, cfg } => {
                let mut all = vec![*listen];
                all.extend(rails);
                TcpEndpoint::bind_rails(&all, service, cfg.clone())
                    .await?
                    .into()
            }
            Attach::Sim { fabric, node } => fabric.start_node(node, Some(service))?.into(),
        })
    }

    /// An endpoint that only makes calls, for a part of the server with calls of its own (the
    /// MDS's allocator, a storage server's heartbeats). On the fabric it is a node of its own,
    /// named after the server and `role`.
    pub fn caller(&self, role: &str) -> Result<AnyNet, NetError> {
        Ok(match self {
            Attach::Tcp { cfg, .. } => TcpEndpoint::client(cfg.clone()).into(),
            Attach::Sim { fabric, node } => {
                fabric.start_node(&format!("{node}-{role}"), None)?.into()
            }
        })
    }
}
