//! Starting a multi-process run: reading rank and world size from launcher variables, and a
//! small TCP key-value store through which the ranks exchange the NCCL unique id and collect
//! per-rank results.
//!
//! * [`LaunchEnv`] reads (through a lookup its caller passes) the variables set by torchrun, Open MPI, MPICH/Intel MPI (PMI) or
//!   Slurm, in that order of precedence; none of them set means a single process.
//! * [`TcpStore`]: rank 0 serves a key-value map on `MASTER_ADDR:MASTER_PORT`, the other
//!   ranks connect to it (retrying until the timeout, since rank 0 may start later). `get`
//!   blocks until the key is set, bounded by the timeout. A launcher that picks the port
//!   itself (`weave launch`) binds port 0 and hands the bound, listening socket to rank 0
//!   ([`STORE_FD`]), publishing its port as `MASTER_PORT`: no other process can take the port
//!   between the pick and rank 0's store, as it could were the port picked, freed and bound
//!   again.
//! * [`exchange_id`] hands rank 0's NCCL unique id to every rank; [`gather`] collects one
//!   value per rank on rank 0.
//!
//! The wire protocol is private to this module and versionless: every rank of a run must use
//! the same build. A request is one byte of operation, a length-prefixed key and, for `set`,
//! a length-prefixed value; `get` carries how long the server may wait for the key. Lengths
//! are big-endian; keys and values have size limits, and a request over them closes the
//! connection.

mod exchange;
mod launch;
mod listener;
mod store;
mod wire;

pub use exchange::{all_gather, exchange_id, gather};
pub use launch::LaunchEnv;
pub use store::{TcpStore, MAX_KEY_BYTES, MAX_VALUE_BYTES};

use crate::error::CommError;

/// The default address of rank 0's store when `MASTER_ADDR` is not set.
pub const DEFAULT_MASTER_ADDR: &str = "127.0.0.1";

/// The default port of rank 0's store when `MASTER_PORT` is not set.
pub const DEFAULT_MASTER_PORT: u16 = 29500;

/// The variable that chooses the port of rank 0's store outright.
pub const STORE_PORT: &str = "WEAVE_STORE_PORT";

/// The variable through which a launcher hands rank 0 the listening socket of its store: the
/// number of an inherited descriptor, a TCP socket listening at `MASTER_PORT` (`weave launch`
/// binds port 0 and sets it on rank 0 only). Rank 0 serves its stores on that socket instead
/// of binding `MASTER_PORT` itself.
pub const STORE_FD: &str = "WEAVE_STORE_FD";

/// The key under which [`exchange_id`] publishes the NCCL unique id.
pub const NCCL_ID_KEY: &str = "nccl-id";

fn bootstrap(message: impl Into<String>) -> CommError {
    CommError::Bootstrap(message.into())
}
