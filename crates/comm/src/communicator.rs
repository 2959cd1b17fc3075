//! The communicator interface shared by every backend: what a collective or point-to-point
//! transfer is, and how it is posted on a stream.

use std::time::Duration;

use crate::dtype::{DataType, RedOp};
use crate::error::CommError;

/// What a collective does, over buffers of type `B`. Buffers are read and written in
/// row-major order of their elements, as NCCL sees contiguous memory: a gather concatenates
/// the members' inputs in team order, a scatter cuts the root's input into `team.len()`
/// equal consecutive pieces, and so on.
#[derive(Clone, Debug)]
pub enum CommOp<B> {
    /// `output` = concatenation of every member's `input`, in team order.
    Allgather {
        /// This member's piece.
        input: B,
        /// `team.len()` times the input.
        output: B,
    },
    /// `output` = reduction of every member's `input`.
    Allreduce {
        /// This member's contribution.
        input: B,
        /// Same size as the input.
        output: B,
        /// The reduction.
        op: RedOp,
    },
    /// `output` = piece `i` (of `team.len()`) of the reduction of every member's `input`,
    /// where `i` is this member's team index.
    ReduceScatter {
        /// This member's contribution, `team.len()` times the output.
        input: B,
        /// This member's piece.
        output: B,
        /// The reduction.
        op: RedOp,
    },
    /// Every member's `output` = the root's `input`.
    Broadcast {
        /// Team index of the root.
        root: usize,
        /// Read on the root only.
        input: B,
        /// Written on every member.
        output: B,
    },
    /// The root's `output` = reduction of every member's `input`.
    Reduce {
        /// Team index of the root.
        root: usize,
        /// This member's contribution.
        input: B,
        /// Written on the root only.
        output: B,
        /// The reduction.
        op: RedOp,
    },
    /// The root's `output` = concatenation of every member's `input`, in team order.
    Gather {
        /// Team index of the root.
        root: usize,
        /// This member's piece.
        input: B,
        /// Written on the root only.
        output: B,
    },
    /// Member `i`'s `output` = piece `i` of the root's `input`.
    Scatter {
        /// Team index of the root.
        root: usize,
        /// Read on the root only.
        input: B,
        /// This member's piece.
        output: B,
    },
    /// The root sends `input`; the other member (a team of two) receives into `output`.
    SendRecv {
        /// Team index of the sender.
        root: usize,
        /// Read on the sender.
        input: B,
        /// Written on the receiver.
        output: B,
    },
    /// Piece `j` of member `i`'s `input` lands as piece `i` of member `j`'s `output`.
    AllToAll {
        /// `team.len()` pieces, one per destination.
        input: B,
        /// `team.len()` pieces, one per source.
        output: B,
    },
    /// Every member sends `input` to team member `send_to` and receives `output` from team
    /// member `recv_from`.
    CollectivePermute {
        /// Sent.
        input: B,
        /// Received into.
        output: B,
        /// Team index of the destination.
        send_to: usize,
        /// Team index of the source.
        recv_from: usize,
    },
}

impl<B> CommOp<B> {
    /// The lower-case name used in messages (`allgather`, …).
    pub fn name(&self) -> &'static str {
        match self {
            CommOp::Allgather { .. } => "allgather",
            CommOp::Allreduce { .. } => "allreduce",
            CommOp::ReduceScatter { .. } => "reduce-scatter",
            CommOp::Broadcast { .. } => "broadcast",
            CommOp::Reduce { .. } => "reduce",
            CommOp::Gather { .. } => "gather",
            CommOp::Scatter { .. } => "scatter",
            CommOp::SendRecv { .. } => "send-recv",
            CommOp::AllToAll { .. } => "all-to-all",
            CommOp::CollectivePermute { .. } => "collective-permute",
        }
    }

    /// The team index of the root, for the operations that have one.
    pub(crate) fn root(&self) -> Option<usize> {
        match self {
            CommOp::Broadcast { root, .. }
            | CommOp::Reduce { root, .. }
            | CommOp::Gather { root, .. }
            | CommOp::Scatter { root, .. }
            | CommOp::SendRecv { root, .. } => Some(*root),
            _ => None,
        }
    }

    /// Checks the members the operation names against a team of `n`: a send-recv's team of
    /// two, then the root, or a permute's `send_to` and `recv_from`. Every backend checks
    /// these before the buffers.
    pub(crate) fn check_members(&self, n: usize) -> Result<(), String> {
        if let CommOp::SendRecv { .. } = self {
            if n != 2 {
                return Err(format!("send-recv needs a team of two ranks, not {n}"));
            }
        }
        if let Some(root) = self.root() {
            if root >= n {
                return Err(format!("root {root} is out of range for a team of {n}"));
            }
        }
        if let CommOp::CollectivePermute {
            send_to, recv_from, ..
        } = self
        {
            for (what, member) in [("send_to", *send_to), ("recv_from", *recv_from)] {
                if member >= n {
                    return Err(format!("{what} {member} is out of range for a team of {n}"));
                }
            }
        }
        Ok(())
    }
}

/// How a buffer of `factor` times the elements of the other must relate to it, for messages:
/// "as many elements as the other buffer", or "`factor` times the elements of the other
/// buffer".
pub(crate) fn size_relation(factor: usize) -> String {
    if factor == 1 {
        "as many elements as the other buffer".to_string()
    } else {
        format!("{factor} times the elements of the other buffer")
    }
}

/// A collective posted by one member of a team.
#[derive(Clone, Debug)]
pub struct Collective<B> {
    /// How errors name this collective: the host statement as printed
    /// (`Communication 10 (type=Allreduce, …)`).
    pub label: String,
    /// The members' ranks, in team order; must contain the posting rank.
    pub team: Vec<usize>,
    /// What it does.
    pub op: CommOp<B>,
}

/// One half of a point-to-point exchange.
#[derive(Clone, Debug)]
pub enum P2p<B> {
    /// Send `buffer` to rank `peer`.
    Send {
        /// Destination rank.
        peer: usize,
        /// Read.
        buffer: B,
    },
    /// Receive from rank `peer` into `buffer`.
    Recv {
        /// Source rank.
        peer: usize,
        /// Written.
        buffer: B,
    },
}

/// A unit of work queued on a stream: it runs on the stream's own thread, after everything
/// queued before it.
pub type Task = Box<dyn FnOnce() -> Result<(), CommError> + Send>;

/// A stream that accepts work in order: the CPU backend's worker-thread streams implement it,
/// so the `Local` communicator posts collectives exactly where NCCL would, on the current
/// stream.
pub trait TaskQueue: Send + Sync {
    /// Queues `task`, named `label` in traces and errors, behind everything queued so far.
    fn enqueue(&self, label: String, task: Task);
}

/// One rank's handle on the group of ranks running the same host program.
///
/// Posting is asynchronous: a post returns once the operation is queued on `stream`, and the
/// operation runs when the stream reaches it. Every rank must post the collectives of a team,
/// and the transfers between a pair of ranks, in the same order (as NCCL requires); they are
/// matched by that order.
pub trait Communicator: Send + Sync {
    /// The buffers it moves.
    type Buffer;
    /// The streams it posts on.
    type Stream: ?Sized;

    /// This rank's index in the world, in `0..size()`; equal to its device id.
    fn rank(&self) -> usize;

    /// The number of ranks in the world.
    fn size(&self) -> usize;

    /// How long an operation waits for its peers before failing with
    /// [`CommError::Timeout`].
    fn timeout(&self) -> Duration;

    /// Posts a collective on `stream`.
    fn post(
        &self,
        collective: Collective<Self::Buffer>,
        stream: &Self::Stream,
    ) -> Result<(), CommError>;

    /// Posts point-to-point transfers on `stream` as one operation (a coalescing group, or
    /// a single send or receive): every send of the group is issued before any receive
    /// blocks, so a ring of sends and receives cannot deadlock.
    fn post_p2p(
        &self,
        label: String,
        ops: Vec<P2p<Self::Buffer>>,
        stream: &Self::Stream,
    ) -> Result<(), CommError>;

    /// Marks this rank as failed with `reason`: every operation of any rank that waits for
    /// it from now on fails with [`CommError::PeerFailed`] instead of waiting.
    fn abort(&self, reason: &str);

    /// Posts `collective` on `stream` with its input not computed yet: `produce` computes
    /// each part of the input (whole multiples of `granule` elements) where the
    /// communicator wants it — a copy-engine reduce-scatter has a GEMM write each peer's
    /// block straight into that peer's receive window, so the transfer is the GEMM's own
    /// stores. A communicator that cannot enqueues nothing and hands the collective back
    /// (the default); the caller then computes the input and posts it.
    fn post_produced(
        &self,
        collective: Collective<Self::Buffer>,
        granule: usize,
        produce: &mut Produce<'_>,
        stream: &Self::Stream,
    ) -> Result<Option<Collective<Self::Buffer>>, CommError> {
        let _ = (granule, produce, stream);
        Ok(Some(collective))
    }

    /// The transport that moves `collective`'s bytes where it is not the program's label
    /// (`backend=NCCL`): `"copy-engine"` where a copy-engine communicator takes it. For the
    /// collective's name in traces; `None` (the default): the program's label.
    fn moved_by(&self, collective: &Collective<Self::Buffer>) -> Option<&'static str> {
        let _ = collective;
        None
    }
}

/// What [`Communicator::post_produced`] calls to compute part of a collective's input:
/// `(first, len, at)` enqueues, on the post's stream, the input's elements `first .. first +
/// len` written at device address `at` (this rank's memory, or a peer's mapped here).
pub type Produce<'a> = dyn FnMut(usize, usize, u64) -> Result<(), CommError> + 'a;

/// A sum reduce-scatter or allreduce of one member, by its sizes: what a copy-engine
/// reduction of it sums (`copy::sum_kernels`), known before a run from the program's
/// metered collectives, so that the kernels it launches can be loaded ahead.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReductionShape {
    /// Members of the team.
    pub team: usize,
    /// An allreduce (else a reduce-scatter).
    pub allreduce: bool,
    /// The element type.
    pub dtype: DataType,
    /// Elements of the member's input.
    pub input_len: usize,
    /// Elements of the member's output.
    pub output_len: usize,
    /// Elements of a row of the input: a collective that computes its input
    /// ([`Communicator::post_produced`]) cuts its pieces at whole rows.
    pub row: usize,
}
