//! The striping testbed: experiments from a TOML file run through a flow-level model of clients,
//! storage servers, targets, the fabric and the MDS, using lode's own layout math and placement
//! policy to split every file into per-target flows; or run on lode's real code over the
//! simulated fabric. Results go to CSVs and plots.
//!
//! - [`experiment`]: the file format, sweeps, and the model's run.
//! - [`flow`]: the flow model (max-min fair sharing by progressive filling).
//! - [`real`]: the same experiment on a real MDS, storage servers and clients in this process.
//! - [`output`] and [`plot`]: CSVs and SVG/PNG plots of a run.

pub mod error;
pub mod experiment;
pub mod flow;
pub mod output;
pub mod plot;
pub mod real;

pub use error::TestbedError;
pub use experiment::{load, run_model, Experiment, ExperimentError, Point, Report};
pub use real::run_real;
