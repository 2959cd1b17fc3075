//! weave-comm: how ranks talk to each other.
//!
//! What this crate will own, as the communication issues land:
//!
//! * the [`Communicator`] trait, through which the executor posts the collectives and
//!   point-to-point transfers of a host program;
//! * `Local`: ranks are threads of one process, exchanging data through rendezvous buffers;
//!   always available, and the backend of every CPU test;
//! * `Nccl`: one NCCL communicator per rank, collectives posted on the *current* stream, in
//!   the same order on every rank;
//! * bootstrap: a single process driving all local GPUs, or one process per GPU configured
//!   from launcher variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`,
//!   `MASTER_PORT`, `OMPI_COMM_WORLD_*`) with a TCP store to exchange the NCCL id.
//!
//! This version holds the part of the interface that is settled — a communicator knows its
//! rank and the world size — and the error type.
//!
//! Architecture Invariant: weave-comm knows nothing of fusions, host programs or passes; it
//! moves buffers between ranks. It depends on `weave-cuda` for devices and streams and on
//! nothing above it.

pub mod communicator;
pub mod error;

pub use communicator::Communicator;
pub use error::CommError;
