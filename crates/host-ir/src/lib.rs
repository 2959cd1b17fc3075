//! weave-host-ir: the host program every rank runs — streams, loops over stream chunks,
//! allocations, kernel and library launches, communications and the waits that order them.
//!
//! A [`HostProgram`] is what `weave-passes` lowers a segmented fusion into and what
//! `weave-executor` walks. Its node set follows nvFuser's Host IR (`FOR i5 from 0 to 3:`,
//! `SetCurrentStream(Stream i5)`, `Communication 3 (type=Allreduce, …)`, `Wait(Communication 3)`)
//! and is defined, data only, in [`syntax`]. Arenas hold the nodes; scopes hold the order as
//! `Vec<StmtId>`, so a pass that moves a statement edits a vector and never a node.
//!
//! The printer, the parser of the printed form and the verifier (every read dominated by a
//! write or an input, streams defined before use, a `Wait` after every asynchronous
//! communication before its buffers are reused) arrive with the host IR issue; this version
//! holds the node definitions they will share.
//!
//! Architecture Invariant: weave-host-ir knows nothing of CUDA, NCCL or threads. A
//! [`syntax::Stream`] is a name for an ordering queue and a [`syntax::Communication`] a
//! description of a collective; giving them meaning on a device is `weave-executor`'s job.
//! It depends on `weave-ir` only for dtypes, symbolic scalars, reduction ops, memory types and
//! the fusions that kernel launches run; it knows nothing of segmentation or passes.

pub mod ids;
pub mod syntax;

pub use ids::{HostTensorId, KernelId, ScalarId, StmtId, StreamId};
pub use syntax::{
    Communication, CommunicationType, HostProgram, HostScalar, HostTensor, KernelUnit,
    P2PCommunication, P2PDirection, Stmt, Stream,
};
