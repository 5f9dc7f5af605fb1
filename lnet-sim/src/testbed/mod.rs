//! The striping testbed: experiments from a TOML file run through a flow-level model of clients,
//! storage servers, targets, the fabric and the MDS, using lode's own layout math to split
//! every file into per-target flows.

pub mod experiment;
pub mod flow;

pub use experiment::{load, run_model, Experiment, ExperimentError, Point, Report};
