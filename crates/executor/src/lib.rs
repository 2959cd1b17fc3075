//! weave-executor: runs host programs.
//!
//! What this crate will own, as the execution issues land:
//!
//! * **evaluator**: walks a [`weave_host_ir::HostProgram`] once per rank, binding scalars
//!   (`rank`, `numberOfStreams`, the fusion's parameters) and tensors, and issues every
//!   statement to a backend and a communicator;
//! * **backends**: `Cpu`, always available, whose streams are worker threads with FIFO queues
//!   and events so that a missing synchronization is a real race; and `Cuda`, over
//!   `weave-cuda`;
//! * **race checker** (`--check-races`): vector clocks per stream, advanced by `Synchronize`
//!   and `Wait`, reporting an access not ordered after the last conflicting one together with
//!   the host statement;
//! * **timeline** (`--trace`): per-rank, per-stream spans in Chrome trace format.
//!
//! This version holds the error type only.
//!
//! Architecture Invariant: the executor runs host programs as given; it never rewrites them.
//! It knows nothing of fusions' schedules, segmentation or passes; anything a program needs
//! is decided before it reaches here.

pub mod error;

pub use error::ExecError;
