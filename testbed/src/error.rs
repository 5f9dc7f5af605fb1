//! What can go wrong running an experiment.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum TestbedError {
    #[error(transparent)]
    Experiment(#[from] crate::ExperimentError),
    #[error("the real-code mode {0}")]
    Unsupported(String),
    #[error("building the simulated cluster: {0}")]
    Cluster(#[from] cluster::ClusterError),
    #[error(transparent)]
    Client(#[from] client::ClientError),
    #[error("starting the runtime: {0}")]
    Runtime(std::io::Error),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("drawing a plot: {0}")]
    Plot(String),
    #[error("a client task failed: {0}")]
    Task(String),
}
