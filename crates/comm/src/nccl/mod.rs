//! `Nccl`: one NCCL communicator per rank, posting collectives and point-to-point groups on
//! the caller's stream, with every wait bounded by a timeout.
//!
//! * **Initialisation.** Rank 0 makes an [`NcclId`] and hands it to every rank (see
//!   [`crate::bootstrap::exchange_id`], or share it in memory when the ranks are threads of
//!   one process); each rank then calls [`Nccl::init`] with its GPU, from its own thread.
//!   Communicators are created *non-blocking* by default (`ncclConfig_t::blocking = 0`):
//!   every NCCL call may answer `ncclInProgress`, after which the communicator is polled
//!   with `ncclCommGetAsyncError` until it settles. A poll that outlasts
//!   [`NcclOptions::timeout`] aborts every communicator of the rank and fails with
//!   [`CommError::Timeout`](crate::CommError::Timeout), so a rank that never arrives cannot hang its peers' `init`.
//!   [`NcclOptions::blocking`] trades that guarantee for less host time per operation.
//! * **Teams.** A [`Collective`](crate::Collective) names its team by world ranks, in team order. The team
//!   `0..world` in that order uses the world communicator; a one-member team needs no
//!   communicator (its operation is a device copy, or nothing); every other team uses a
//!   communicator split off the world by `ncclCommSplit`, whose ranks are the team indices.
//!   Splitting is collective over the whole world, so every rank calls
//!   [`Nccl::prepare_teams`] with the same list of teams before posting.
//! * **Operations.** Allgather, allreduce, reduce-scatter, broadcast and reduce are NCCL's
//!   own collectives; gather, scatter, all-to-all, collective permute and send-recv are
//!   groups of `ncclSend`/`ncclRecv` on the team's communicator, a member's piece for itself
//!   being a device-to-device copy on the same stream. [`Communicator::post_p2p`](crate::Communicator::post_p2p) is a
//!   group of sends then receives on the world communicator.
//! * **Order.** NCCL matches operations by the order in which they are issued on each
//!   communicator, and ranks that issue operations on several communicators in different
//!   orders can deadlock. Every rank must therefore post its collectives and transfers in
//!   the same order: the evaluator posts them in program order, which is the same on every
//!   rank.
//! * **Semantics.** Results are those of [`crate::Local`], with two differences: the ranks
//!   cannot check each other's arguments (mismatched sizes or kinds between ranks are
//!   undefined behaviour in NCCL, typically a hang ended by the caller's timeout), and
//!   floating-point reductions round after every step in NCCL's own order instead of once.
//!   Boolean sums and products are computed as maximum and minimum, which is what `Local`
//!   yields for 0/1 values.
//! * **Failures.** [`Nccl::async_error`] polls every communicator and is meant for the
//!   executor's event waits; [`Communicator::abort`](crate::Communicator::abort) aborts every communicator of the rank.
//!
//! The library is loaded at run time: when `libnccl.so` cannot be found, every entry point
//! answers [`CommError::Backend`](crate::CommError::Backend) instead of panicking.
//!
//! The module by concern: `config` (the id, [`NcclOptions`] and `ncclConfig_t`), `library`
//! (loading NCCL, type and operator mapping, the one unsafe call site of a plan's calls),
//! `routing` ([`TeamRoute`], [`TeamPlan`]: which communicator a team uses and how the splits
//! are made), `plan` (the pure plan compiler: what one member issues, checked without
//! touching NCCL), `window` (the symmetric window that whole-world collectives are staged
//! through when [`NcclOptions::symmetric_window`] asks for one) and `communicator` ([`Nccl`]'s lifecycle: init, splits, polling, posting,
//! abort and finalisation).

mod communicator;
mod config;
#[cfg(test)]
pub(crate) mod fake;
mod library;
mod plan;
mod routing;
mod window;

pub use communicator::Nccl;
pub use config::{CtaPolicy, NcclId, NcclOptions, NCCL_CONFIG_UNDEF_INT};
pub use routing::{TeamError, TeamPlan, TeamRoute, NCCL_SPLIT_NOCOLOR};

use crate::dtype::DataType;

/// A buffer in device memory that NCCL can read or write.
pub trait DeviceBuffer: Clone + Send + Sync + 'static {
    /// The device address of the first element.
    fn device_ptr(&self) -> u64;
    /// The number of elements.
    fn len(&self) -> usize;
    /// Whether the buffer has no element.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The element type.
    fn data_type(&self) -> DataType;
    /// Whether the elements are contiguous in row-major order (NCCL moves contiguous memory
    /// only).
    fn is_contiguous(&self) -> bool;
}
