//! Network identifiers (NIDs), after LNet: an address followed by `@` and the network it lives on.
//!
//! - `127.0.0.1:9400@tcp`: a TCP endpoint.
//! - `node3@sim`: a node on the in-process simulated fabric.
//! - `10.0.0.7:9400@o2ib`: an RDMA (verbs) endpoint, addressed by its IP for connection setup.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Longest node name accepted on the simulated fabric.
pub const MAX_SIM_NAME: usize = 64;

/// The network a NID lives on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Net {
    Tcp,
    Sim,
    O2ib,
}

impl Net {
    pub fn as_str(self) -> &'static str {
        match self {
            Net::Tcp => "tcp",
            Net::Sim => "sim",
            Net::O2ib => "o2ib",
        }
    }
}

/// A node's address on one network.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Nid {
    Tcp(SocketAddr),
    Sim(String),
    O2ib(SocketAddr),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NidError {
    #[error("NID {0:?} has no '@network' suffix")]
    NoNetwork(String),
    #[error("NID {0:?} names an unknown network (expected tcp, sim or o2ib)")]
    UnknownNetwork(String),
    #[error("NID {0:?}: the address is not IP:PORT")]
    BadAddress(String),
    #[error("NID {0:?}: a sim node name is 1 to {MAX_SIM_NAME} of [A-Za-z0-9._-]")]
    BadName(String),
}

impl Nid {
    pub fn net(&self) -> Net {
        match self {
            Nid::Tcp(_) => Net::Tcp,
            Nid::Sim(_) => Net::Sim,
            Nid::O2ib(_) => Net::O2ib,
        }
    }

    /// A sim-fabric NID, checking the name.
    pub fn sim(name: &str) -> Result<Nid, NidError> {
        let ok = !name.is_empty()
            && name.len() <= MAX_SIM_NAME
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if ok {
            Ok(Nid::Sim(name.to_owned()))
        } else {
            Err(NidError::BadName(name.to_owned()))
        }
    }

    /// The socket address of a TCP or o2ib NID.
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        match self {
            Nid::Tcp(a) | Nid::O2ib(a) => Some(*a),
            Nid::Sim(_) => None,
        }
    }
}

impl fmt::Display for Nid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Nid::Tcp(a) | Nid::O2ib(a) => write!(f, "{a}@{}", self.net().as_str()),
            Nid::Sim(n) => write!(f, "{n}@sim"),
        }
    }
}

impl FromStr for Nid {
    type Err = NidError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (addr, net) = s
            .rsplit_once('@')
            .ok_or_else(|| NidError::NoNetwork(s.to_owned()))?;
        let sock = || {
            addr.parse::<SocketAddr>()
                .map_err(|_| NidError::BadAddress(s.to_owned()))
        };
        match net {
            "tcp" => Ok(Nid::Tcp(sock()?)),
            "o2ib" => Ok(Nid::O2ib(sock()?)),
            "sim" => Nid::sim(addr),
            _ => Err(NidError::UnknownNetwork(s.to_owned())),
        }
    }
}

impl Nid {
    /// A NID, or a bare `IP:PORT` taken as a TCP NID: what users type.
    pub fn parse_loose(s: &str) -> Result<Nid, NidError> {
        let s = s.trim();
        if s.contains('@') {
            return s.parse();
        }
        s.parse()
            .map(Nid::Tcp)
            .map_err(|_| NidError::BadAddress(s.to_owned()))
    }

    /// A server given by all its addresses, comma-separated (`10.0.0.1:9400,10.1.0.1:9400`,
    /// one per interface: multi-rail): the first names it, the rest are its other rails.
    pub fn parse_rails(s: &str) -> Result<(Nid, Vec<Nid>), NidError> {
        let mut all = s.split(',').map(Nid::parse_loose);
        let first = all
            .next()
            .ok_or_else(|| NidError::BadAddress(s.to_owned()))??;
        let rails = all.collect::<Result<Vec<_>, _>>()?;
        Ok((first, rails))
    }
}

impl TryFrom<String> for Nid {
    type Error = NidError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<Nid> for String {
    fn from(n: Nid) -> String {
        n.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bare_addresses_and_lists_of_rails_parse() {
        let tcp = |s: &str| Nid::Tcp(s.parse().unwrap());
        assert_eq!(
            Nid::parse_loose("10.0.0.1:9400").unwrap(),
            tcp("10.0.0.1:9400")
        );
        assert_eq!(Nid::parse_loose("x@sim").unwrap(), Nid::Sim("x".into()));
        assert_eq!(
            Nid::parse_rails("10.0.0.1:9400, 10.1.0.1:9400@tcp").unwrap(),
            (tcp("10.0.0.1:9400"), vec![tcp("10.1.0.1:9400")])
        );
        assert_eq!(Nid::parse_rails("10.0.0.1:9400").unwrap().1, vec![]);
        assert!(Nid::parse_rails("10.0.0.1:9400,").is_err());
        assert!(Nid::parse_rails("").is_err());
        assert!(Nid::parse_loose("node3").is_err());
    }

    #[test]
    fn parses_the_three_networks() {
        assert_eq!("127.0.0.1:9400@tcp".parse::<Nid>().unwrap().net(), Net::Tcp);
        assert_eq!(
            "node3@sim".parse::<Nid>().unwrap(),
            Nid::Sim("node3".into())
        );
        assert_eq!("[::1]:9400@o2ib".parse::<Nid>().unwrap().net(), Net::O2ib);
    }

    #[test]
    fn rejects_bad_nids_with_the_reason() {
        assert!(matches!(
            "node3".parse::<Nid>(),
            Err(NidError::NoNetwork(_))
        ));
        assert!(matches!(
            "node3@ib9".parse::<Nid>(),
            Err(NidError::UnknownNetwork(_))
        ));
        assert!(matches!(
            "node3@tcp".parse::<Nid>(),
            Err(NidError::BadAddress(_))
        ));
        assert!(matches!(
            "no/de@sim".parse::<Nid>(),
            Err(NidError::BadName(_))
        ));
        assert!(matches!("@sim".parse::<Nid>(), Err(NidError::BadName(_))));
        let long = format!("{}@sim", "n".repeat(MAX_SIM_NAME + 1));
        assert!(matches!(long.parse::<Nid>(), Err(NidError::BadName(_))));
    }

    proptest! {
        #[test]
        fn text_round_trips(name in "[A-Za-z0-9._-]{1,64}", ip: [u8; 4], port: u16) {
            let sim = Nid::sim(&name).unwrap();
            prop_assert_eq!(sim.to_string().parse::<Nid>().unwrap(), sim);
            let tcp = Nid::Tcp(SocketAddr::from((ip, port)));
            prop_assert_eq!(tcp.to_string().parse::<Nid>().unwrap(), tcp);
        }

        #[test]
        fn arbitrary_text_never_panics(s in ".{0,100}") {
            let _ = s.parse::<Nid>();
        }
    }
}
