//! One endpoint type for code that runs on either network: TCP in production, the simulated
//! fabric in the testbed's real-code mode and in tests.

use std::sync::Arc;
use std::time::Duration;

use proto::{Nid, Opcode};

use crate::error::NetError;
use crate::region::RegionTable;
use crate::service::BoxFuture;
use crate::sim::SimEndpoint;
use crate::tcp::TcpEndpoint;
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
        deadline: Duration,
    ) -> BoxFuture<'a, Result<Vec<u8>, NetError>> {
        match self {
            AnyNet::Tcp(e) => e.call_raw(peer, opcode, body, deadline),
            AnyNet::Sim(e) => e.call_raw(peer, opcode, body, deadline),
        }
    }
}
