//! Errors of the communication layer.

use weave_cuda::CudaError;

/// A failure to set up or use a communicator.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CommError {
    /// The ranks could not be set up: a missing or malformed launcher variable, or an
    /// unreachable TCP store.
    #[error("bootstrap failed: {0}")]
    Bootstrap(String),
    /// A communication named a team that does not contain the calling rank as required.
    #[error("rank {rank} is not a member of team {team:?}")]
    NotInTeam {
        /// The calling rank.
        rank: usize,
        /// The team's device ids.
        team: Vec<i64>,
    },
    /// The backend reported a failure for a posted operation.
    #[error("{op} failed: {message}")]
    Backend {
        /// The operation (`allreduce`, `send`, …).
        op: &'static str,
        /// The backend's description.
        message: String,
    },
    /// The CUDA layer underneath failed.
    #[error(transparent)]
    Cuda(#[from] CudaError),
}
