//! Errors of the communication layer.

#[cfg(feature = "cuda")]
use weave_cuda::CudaError;

/// A failure to set up or use a communicator.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CommError {
    /// The ranks could not be set up: a missing or malformed launcher variable, or an
    /// unreachable TCP store.
    #[error("bootstrap failed: {0}")]
    Bootstrap(String),
    /// A communication named a team that does not contain the calling rank as required.
    #[error("rank {rank} is not a member of team {team:?} of {op}")]
    NotInTeam {
        /// The calling rank.
        rank: usize,
        /// The team's ranks.
        team: Vec<usize>,
        /// The operation, as its label names it.
        op: String,
    },
    /// The members of one operation disagree (sizes, element types, kinds, roots), or a
    /// buffer does not fit the operation.
    #[error("{op} on rank {rank}: {detail}")]
    Mismatch {
        /// The operation, as its label names it.
        op: String,
        /// The rank that noticed.
        rank: usize,
        /// What differs.
        detail: String,
    },
    /// Peers did not arrive in time.
    #[error("{op} on rank {rank} timed out after {millis} ms waiting for rank(s) {waiting_for:?}")]
    Timeout {
        /// The operation, as its label names it.
        op: String,
        /// The rank that waited.
        rank: usize,
        /// The ranks that never arrived.
        waiting_for: Vec<usize>,
        /// How long it waited, in milliseconds.
        millis: u64,
    },
    /// A peer failed while this rank waited for it.
    #[error("{op} on rank {rank} failed because rank {failed_rank} failed: {reason}")]
    PeerFailed {
        /// The operation, as its label names it.
        op: String,
        /// The rank that waited.
        rank: usize,
        /// The rank that failed.
        failed_rank: usize,
        /// Why it failed.
        reason: String,
    },
    /// The backend reported a failure for a posted operation.
    #[error("{op} failed: {message}")]
    Backend {
        /// The operation (`allreduce`, `send`, …).
        op: String,
        /// The backend's description.
        message: String,
    },
    /// The CUDA layer underneath failed.
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Cuda(#[from] CudaError),
}
