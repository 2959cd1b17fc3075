//! weave-host-ir: the host program every rank runs — streams, loops over stream chunks,
//! allocations, kernel and library launches, communications and the waits that order them.
//!
//! A [`HostProgram`] is what `weave-passes` lowers a segmented fusion into and what
//! `weave-executor` walks. Its node set follows nvFuser's Host IR (`FOR i5 from 0 to 3:`,
//! `SetCurrentStream(Stream i5)`, `Communication 3 (type=Allreduce, …)`, `Wait(Communication 3)`)
//! and is defined, data only, in [`syntax`]. Arenas hold the nodes; scopes hold the order as
//! `Vec<StmtId>`, so a pass that moves a statement edits a vector and never a node.
//!
//! The modules around the node set:
//!
//! * [`builder`]: create entities, place statements in scopes ([`ScopeRef`]), move them, and
//!   [`HostProgram::walk`] the program in order.
//! * [`access`]: what one statement reads, writes, binds and names.
//! * [`printer`]: the seed-style text ([`print()`]), with names assigned in print order
//!   ([`Names`]); [`parser`]: that text back ([`parse`]), so host passes are tested on
//!   hand-written programs. `print(parse(x)) == x` for printed text; the grammar is in
//!   docs/host-ir-format.md.
//! * [`mod@verify`]: every read dominated by a definition, streams defined before use, a `Wait`
//!   after every asynchronous communication before its buffers are reused or the scope ends
//!   (a `Wait` counts as a use of those buffers), loop indices used inside their loop,
//!   balanced coalescing groups.
//!
//! Architecture Invariant: weave-host-ir knows nothing of CUDA, NCCL or threads. A
//! [`syntax::Stream`] is a name for an ordering queue and a [`syntax::Communication`] a
//! description of a collective; giving them meaning on a device is `weave-executor`'s job.
//! It depends on `weave-ir` only for dtypes, symbolic scalars, reduction ops, memory types and
//! the fusions that kernel launches run; it knows nothing of segmentation or passes.

pub mod access;
pub mod builder;
pub mod ids;
mod lexer;
pub mod parser;
pub mod printer;
pub mod signature;
pub mod syntax;
pub mod verify;

pub use builder::{ScopeRef, Walk, Walked};
pub use ids::{HostTensorId, KernelId, ScalarId, StmtId, StreamId};
pub use parser::parse;
pub use printer::{print, Names};
pub use signature::{AxisSplit, DefinitionMismatch, ShardError, Sharding, Signature, TensorSig};
pub use syntax::{
    ChunkOf, Communication, CommunicationType, HostProgram, HostScalar, HostTensor, KernelUnit,
    P2PCommunication, P2PDirection, Stmt, Stream,
};
pub use verify::verify;
