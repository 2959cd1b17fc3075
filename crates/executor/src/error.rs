//! Errors of host-program execution.

use weave_comm::CommError;
#[cfg(feature = "cuda")]
use weave_cuda::CudaError;

/// A failure while running a host program.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    /// The program asked for something it cannot have at this point — an unbound tensor or
    /// scalar, sizes that do not match — which the verifier should have caught. The message
    /// names the statement as printed.
    #[error("invalid host program: {0}")]
    Program(String),
    /// The inputs given do not fit the program (count, dtype, sizes, ranks); nothing ran.
    #[error("{0}")]
    Input(String),
    /// Device work failed; `stmt` is the host statement as printed.
    #[error("`{stmt}` failed: {message}")]
    Compute {
        /// The statement.
        stmt: String,
        /// What went wrong.
        message: String,
    },
    /// A stream waited longer than the timeout.
    #[error("{what}: timed out after {millis} ms")]
    Timeout {
        /// What waited for what.
        what: String,
        /// How long it waited.
        millis: u64,
    },
    /// The CUDA layer failed.
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// A communication failed.
    #[error(transparent)]
    Comm(#[from] CommError),
}
