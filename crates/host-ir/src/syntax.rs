//! The host IR node set, data only: what a host program may say, with no behaviour attached.
//!
//! Definitions live apart from order. [`HostProgram`] owns one arena per kind of entity
//! (statements, tensors, scalars, streams, kernels); program order lives only in
//! [`HostProgram::top_level`] and in the `body` of each [`Stmt::ForLoop`]. A statement id
//! appears in exactly one scope.
//!
//! The semantics follow nvFuser's `HostIrEvaluator` (reference/nvfuser-host-ir.md §3): every
//! statement is issued, in program order, by one host thread per rank; device work (kernels,
//! library calls, communications) is enqueued on the *current stream*, and streams are ordered
//! only by [`Stmt::Synchronize`] and [`Stmt::Wait`].
//!
//! Changing this module changes the printed form, the parser and every pass; review it with
//! that in mind.

use slotmap::SlotMap;
use weave_ir::{DType, Fusion, MemoryType, ReduceOp, Scalar, ScalarOp};

use crate::ids::{HostTensorId, KernelId, ScalarId, StmtId, StreamId};
use crate::signature::Signature;

/// A whole host program: the arenas of its entities, its inputs and outputs, and the
/// top-level scope.
#[derive(Clone, Debug, Default)]
pub struct HostProgram {
    /// Every statement, wherever it is placed.
    pub stmts: SlotMap<StmtId, Stmt>,
    /// Every tensor: program inputs and outputs, allocated buffers and aliasing views.
    pub tensors: SlotMap<HostTensorId, HostTensor>,
    /// Every integer scalar the program reads.
    pub scalars: SlotMap<ScalarId, HostScalar>,
    /// Every stream value.
    pub streams: SlotMap<StreamId, Stream>,
    /// Every compute segment that a [`Stmt::LaunchKernel`] runs.
    pub kernels: SlotMap<KernelId, KernelUnit>,
    /// Tensors bound by the caller before the first statement, in signature order.
    pub inputs: Vec<HostTensorId>,
    /// Tensors handed back to the caller after the last statement, in signature order.
    pub outputs: Vec<HostTensorId>,
    /// The top-level scope, in program order.
    pub top_level: Vec<StmtId>,
    /// What the caller binds and gets back in global terms (names, global shapes,
    /// shardings, parameter values) and the fusion it computes: what makes a printed
    /// program runnable by itself. `None` for a program written by hand without one.
    pub signature: Option<Signature>,
    /// What is derived from the program once and kept for every run while it stays as it
    /// was (statement labels); a clone starts empty.
    pub memo: Memo,
}

/// Data derived from a [`HostProgram`] on first use: see [`HostProgram::statement_labels`].
/// What it derived is kept with a copy of the parts of the program it was derived from, and
/// derived again when the program no longer equals them: an edit in place (a statement
/// changed, added or moved) never leaves stale labels behind.
#[derive(Default)]
pub struct Memo {
    labels: std::sync::Mutex<Option<std::sync::Arc<Labelled>>>,
}

/// Statement labels and the parts of the program they were printed from.
struct Labelled {
    stmts: SlotMap<StmtId, Stmt>,
    tensors: SlotMap<HostTensorId, HostTensor>,
    scalars: SlotMap<ScalarId, HostScalar>,
    streams: SlotMap<StreamId, Stream>,
    kernels: Vec<KernelId>,
    top_level: Vec<StmtId>,
    labels: std::sync::Arc<slotmap::SecondaryMap<StmtId, String>>,
}

impl Labelled {
    /// Whether `program` still has the statements, entities and order these labels were
    /// printed from (a label names a kernel by its place, not its contents).
    fn describes(&self, program: &HostProgram) -> bool {
        self.top_level == program.top_level
            && self.stmts.iter().eq(program.stmts.iter())
            && self.tensors.iter().eq(program.tensors.iter())
            && self.scalars.iter().eq(program.scalars.iter())
            && self.streams.iter().eq(program.streams.iter())
            && self.kernels.iter().copied().eq(program.kernels.keys())
    }
}

impl Clone for Memo {
    /// Empty: a copy derives its own.
    fn clone(&self) -> Memo {
        Memo::default()
    }
}

impl std::fmt::Debug for Memo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Memo")
    }
}

impl HostProgram {
    /// Every statement as printed (`Names::stmt`), computed on the first call and shared by
    /// every later one while the program stays as it was (an edit in place computes them
    /// anew): what errors, spans and traces name statements by.
    pub fn statement_labels(&self) -> std::sync::Arc<slotmap::SecondaryMap<StmtId, String>> {
        let mut memo = self
            .memo
            .labels
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(kept) = memo.as_ref().filter(|kept| kept.describes(self)) {
            return kept.labels.clone();
        }
        let mut names = crate::Names::of(self);
        let labels: std::sync::Arc<slotmap::SecondaryMap<StmtId, String>> = std::sync::Arc::new(
            self.walk()
                .map(|w| (w.stmt, names.stmt(self, w.stmt)))
                .collect(),
        );
        *memo = Some(std::sync::Arc::new(Labelled {
            stmts: self.stmts.clone(),
            tensors: self.tensors.clone(),
            scalars: self.scalars.clone(),
            streams: self.streams.clone(),
            kernels: self.kernels.keys().collect(),
            top_level: self.top_level.clone(),
            labels: labels.clone(),
        }));
        labels
    }
}

/// A tensor of the host program: a buffer or an aliasing view of one, as seen by one rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostTensor {
    /// Element type.
    pub dtype: DType,
    /// Local sizes on one rank, outermost first (device-sharded axes already divided; a
    /// stream-sharded buffer holds its slots).
    pub sizes: Vec<ScalarId>,
    /// Where the buffer lives.
    pub memory: MemoryType,
}

/// An integer scalar. Scalars are values, not statements: the evaluator computes one when a
/// statement reads it, from the bindings current at that point.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum HostScalar {
    /// A loop-invariant value: a constant or an expression over the fusion's parameters and
    /// the evaluator's bindings (`rank`, `numberOfStreams`), such as `ceilDiv(t, 3)`.
    Value(Scalar),
    /// The index of the one [`Stmt::ForLoop`] that names it; rebound every iteration.
    LoopIndex,
    /// `lhs op rhs` over other host scalars, such as `( i5 % numberOfStreams )`.
    Binary(ScalarOp, ScalarId, ScalarId),
}

/// A stream value. Two stream values denote the same stream when they are the same captured
/// value, or when their indices evaluate to the same integer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stream {
    /// The stream that was current when a [`Stmt::GetCurrentStream`] defined this value: the
    /// caller's (main) stream of the program.
    Captured,
    /// The pool stream numbered by the runtime value of the index (`Stream i5`,
    /// `Stream ( i5 % numberOfStreams )`); created on first use and kept for the program's
    /// lifetime.
    Indexed(ScalarId),
}

/// A compute segment that runs as one generated kernel.
#[derive(Clone, Debug)]
pub struct KernelUnit {
    /// The segment's own fusion; its inputs and outputs bind, in order, to the `inputs` and
    /// `outputs` of the [`Stmt::LaunchKernel`] statements that run it (shared: a run and a
    /// backend's kernel cache hold it without copying).
    pub fusion: std::sync::Arc<Fusion>,
}

/// The kind of a collective [`Communication`] (nvFuser's `CommunicationType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CommunicationType {
    /// Every member gathers every member's shard.
    Allgather,
    /// Every member receives the reduction of every member's buffer.
    Allreduce,
    /// Every member receives one shard of the reduction of every member's buffer.
    ReduceScatter,
    /// The root's buffer is copied to every member.
    Broadcast,
    /// The root receives the reduction of every member's buffer.
    Reduce,
    /// The root receives every member's shard.
    Gather,
    /// The root sends one shard to each member.
    Scatter,
    /// One member (the root) sends its buffer to the other.
    SendRecv,
    /// Every member sends one shard to each member.
    AllToAll,
    /// Every member sends its buffer to one peer and receives from another, as one step of a
    /// permutation.
    CollectivePermute,
}

impl CommunicationType {
    /// Every type, in a fixed order.
    pub const ALL: [CommunicationType; 10] = [
        CommunicationType::Allgather,
        CommunicationType::Allreduce,
        CommunicationType::ReduceScatter,
        CommunicationType::Broadcast,
        CommunicationType::Reduce,
        CommunicationType::Gather,
        CommunicationType::Scatter,
        CommunicationType::SendRecv,
        CommunicationType::AllToAll,
        CommunicationType::CollectivePermute,
    ];

    /// The printed name (`type=Allgather`).
    pub fn name(self) -> &'static str {
        match self {
            CommunicationType::Allgather => "Allgather",
            CommunicationType::Allreduce => "Allreduce",
            CommunicationType::ReduceScatter => "ReduceScatter",
            CommunicationType::Broadcast => "Broadcast",
            CommunicationType::Reduce => "Reduce",
            CommunicationType::Gather => "Gather",
            CommunicationType::Scatter => "Scatter",
            CommunicationType::SendRecv => "SendRecv",
            CommunicationType::AllToAll => "AllToAll",
            CommunicationType::CollectivePermute => "CollectivePermute",
        }
    }

    /// Whether the type has a root: Broadcast, Reduce, Gather, Scatter and SendRecv do.
    pub fn has_root(self) -> bool {
        matches!(
            self,
            CommunicationType::Broadcast
                | CommunicationType::Reduce
                | CommunicationType::Gather
                | CommunicationType::Scatter
                | CommunicationType::SendRecv
        )
    }

    /// Whether the type reduces and so needs a reduction op: Allreduce, ReduceScatter and
    /// Reduce do.
    pub fn is_reduction(self) -> bool {
        matches!(
            self,
            CommunicationType::Allreduce
                | CommunicationType::ReduceScatter
                | CommunicationType::Reduce
        )
    }
}

/// A collective communication among a team of devices.
///
/// The team a rank posts on may depend on the rank: a collective over one axis of a 2-D mesh
/// runs within each slice of the mesh along that axis, so the node holds every slice
/// (`teams`, pairwise disjoint) and each rank posts on the one that contains it. A rank in no
/// team takes no part: it posts nothing, and its `Wait` for the communication is a no-op.
/// Every rank still sees every team, which is what lets a communicator split one
/// sub-communicator per team up front, identically on every rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Communication {
    /// What the collective does.
    pub kind: CommunicationType,
    /// The teams, pairwise disjoint, each listing its member devices by absolute device id
    /// in team order; most communications have one.
    pub teams: Vec<Vec<i64>>,
    /// The root, as an index into the rank's team (not a device id), the same index in every
    /// team; may depend on a loop index. Present exactly when [`CommunicationType::has_root`].
    pub root: Option<ScalarId>,
    /// The reduction. Present exactly when [`CommunicationType::is_reduction`].
    pub red_op: Option<ReduceOp>,
    /// The buffer sent.
    pub input: HostTensorId,
    /// The buffer received into.
    pub output: HostTensorId,
}

impl Communication {
    /// The team `device` posts on: the one that contains it, if any.
    pub fn team_of(&self, device: i64) -> Option<&[i64]> {
        self.teams
            .iter()
            .find(|t| t.contains(&device))
            .map(Vec::as_slice)
    }
}

/// The chunk `chunk` of `chunks` chunks of an axis of `extent` elements, cut like
/// [`Stmt::ShardByStream`] cuts (`ceilDiv(extent, chunks)` elements each, the last ones fewer
/// or none). A buffer bounded to `numberOfStreams` slots holds one such chunk per slot, and a
/// slot is as long as the longest chunk; the view of a slot that holds a shorter chunk (or an
/// empty one) is narrowed to that chunk's length, so that it has the same sizes as the chunk
/// of the unbounded buffer it stands for. Printed `holds=(chunk=i0, chunks=3, extent=t)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChunkOf {
    /// Which chunk; usually the loop index.
    pub chunk: ScalarId,
    /// How many chunks the axis is cut into.
    pub chunks: ScalarId,
    /// The length of the whole axis.
    pub extent: ScalarId,
}

/// Which half of a point-to-point exchange a [`P2PCommunication`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum P2PDirection {
    /// Send the buffer to the peer.
    Send,
    /// Receive the peer's message into the buffer.
    Recv,
}

/// One half of a point-to-point exchange with a peer device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct P2PCommunication {
    /// Send or receive.
    pub direction: P2PDirection,
    /// The peer's device id; usually computed from the loop index and `rank`.
    pub peer: ScalarId,
    /// The buffer sent from or received into.
    pub buffer: HostTensorId,
}

/// A statement of a host program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stmt {
    /// Binds `tensor` to a fresh buffer of its sizes, uninitialised unless `zero_init`.
    Allocate {
        /// The tensor to bind.
        tensor: HostTensorId,
        /// Whether the buffer is zero-filled (on the current stream).
        zero_init: bool,
    },
    /// Drops the binding of `tensor`; its buffer may be reused once every stream that used
    /// it is ordered after this point.
    Deallocate {
        /// The tensor to unbind.
        tensor: HostTensorId,
    },
    /// Runs `body` once for every integer of `[start, stop)`, in order, with `index` bound to
    /// it.
    ForLoop {
        /// The loop index; a [`HostScalar::LoopIndex`] named by this loop only.
        index: ScalarId,
        /// First value of the index.
        start: ScalarId,
        /// One past the last value of the index.
        stop: ScalarId,
        /// The loop body, in program order.
        body: Vec<StmtId>,
    },
    /// Defines `out` as the stream that is current now.
    GetCurrentStream {
        /// A [`Stream::Captured`] value defined by this statement only.
        out: StreamId,
    },
    /// Makes `stream` the current stream of the statements that follow.
    SetCurrentStream {
        /// The new current stream.
        stream: StreamId,
    },
    /// Makes the current stream wait for the work enqueued so far on `stream`, without
    /// blocking the host.
    Synchronize {
        /// The stream waited for.
        stream: StreamId,
    },
    /// Binds `output` to the `index`-th of `chunks` chunks of `input` along `axis`: an
    /// aliasing view, no copy. Chunks hold `ceilDiv(n, chunks)` elements of the axis' `n`,
    /// the last ones fewer or none. With `holds`, the view is then narrowed to the length of
    /// the chunk it holds (a slot of a bounded buffer, see [`ChunkOf`]).
    ShardByStream {
        /// The tensor cut into chunks.
        input: HostTensorId,
        /// The axis of `input` that is cut, counted in its local sizes.
        axis: usize,
        /// How many chunks the axis is cut into.
        chunks: ScalarId,
        /// Which chunk; usually the loop index.
        index: ScalarId,
        /// The chunk of a longer axis that this view holds, when `input` is a buffer of
        /// slots: the view is narrowed to that chunk's length.
        holds: Option<ChunkOf>,
        /// The view.
        output: HostTensorId,
    },
    /// Runs the generated kernel of `kernel` on the current stream into preallocated outputs.
    LaunchKernel {
        /// The compute segment.
        kernel: KernelId,
        /// Bound, in order, to the segment's fusion inputs.
        inputs: Vec<HostTensorId>,
        /// Bound, in order, to the segment's fusion outputs; allocated before the launch.
        outputs: Vec<HostTensorId>,
    },
    /// `out = a @ b` by the GEMM library on the current stream, into a preallocated `out`;
    /// with `accumulate`, `out += a @ b` (printed `T4 += matmul(T5, T0)`): the partial
    /// product of one stream chunk of the contraction axis added to what `out` holds
    /// (cuBLASLt's beta = 1), so `out` is read as well as written.
    Matmul {
        /// Left operand.
        a: HostTensorId,
        /// Right operand.
        b: HostTensorId,
        /// The preallocated result.
        out: HostTensorId,
        /// Add the product to `out` instead of overwriting it.
        accumulate: bool,
    },
    /// `out = input @ weightᵀ (+ bias)` by the GEMM library on the current stream, into a
    /// preallocated `out`; with `accumulate`, `out += input @ weightᵀ` (printed `T4 +=
    /// linear(T5, T0)`): a step of a reduce ring adding this rank's partial of a piece to
    /// the partial received into `out` (cuBLASLt's beta = 1), so `out` is read as well as
    /// written.
    Linear {
        /// The activations.
        input: HostTensorId,
        /// The weight, `[out_features, in_features]`.
        weight: HostTensorId,
        /// The optional bias, `[out_features]`.
        bias: Option<HostTensorId>,
        /// The preallocated result.
        out: HostTensorId,
        /// Add the product to `out` instead of overwriting it.
        accumulate: bool,
    },
    /// Posts a collective on the current stream. Asynchronous: its buffers may be read or
    /// reused only after a [`Stmt::Wait`] names this statement.
    Communication(Communication),
    /// Posts a send or a receive on the current stream. Asynchronous like
    /// [`Stmt::Communication`]; inside a coalescing group it is waited for through the
    /// group's [`Stmt::EndCoalescing`].
    P2PCommunication(P2PCommunication),
    /// Opens a coalescing group: the point-to-point communications up to the matching
    /// [`Stmt::EndCoalescing`] are posted as one operation.
    StartCoalescing,
    /// Closes the innermost open coalescing group and posts it.
    EndCoalescing,
    /// Makes the current stream wait for the communication posted by `comm`: a
    /// [`Stmt::Communication`], a [`Stmt::P2PCommunication`] outside any coalescing group, or
    /// an [`Stmt::EndCoalescing`]. Counts as a use of that communication's buffers.
    Wait {
        /// The statement that posted the communication.
        comm: StmtId,
    },
}
