//! The copy-engine communicator: one [`Communicator`] that moves allgathers and
//! point-to-point transfers over contiguous buffers with the GPUs' copy engines (no SM taken
//! from the compute they overlap) and hands every other operation to the communicator it
//! wraps (NCCL).
//!
//! How the bytes travel is the [`CopyTransport`]'s business; the communicator decides what
//! travels. Two transports exist:
//!
//! * [`crate::peer::PeerTransport`]: peer copies pulled by the receiver between the threads
//!   of one process, meeting at a [`crate::PeerHub`] ([`crate::PeerCopy`]);
//! * [`crate::ipc::IpcTransport`]: pushes into receive windows that ranks share through CUDA
//!   IPC handles, between processes of one host or threads ([`crate::IpcCopy`]).
//!
//! Given a [`Reducer`] ([`CopyComm::with_reducer`]), sum reduce-scatters and allreduces go
//! through the copy engines too: each member's blocks are pushed to the members that own
//! them, into a scratch buffer of the receiver's, and one streaming reduction kernel per post
//! adds the blocks up in team order (an allreduce then gathers the reduced blocks the same
//! way): the SMs a GEMM beside it loses are those of that kernel alone, not NCCL's
//! persistent CTAs for the whole transfer ([`reduce_plan`]).

use std::sync::Arc;
use std::time::Duration;

use crate::communicator::{Collective, CommOp, Communicator, P2p, Produce};
use crate::dtype::{DataType, RedOp};
use crate::error::CommError;
use crate::nccl::DeviceBuffer;

/// What the copy engines do for one operation of one rank: copies within its own memory
/// (its block of an allgather, sends to itself), and sends `(to, address, bytes)` and
/// receives `(from, address, bytes)` between ranks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Transfers {
    /// `(destination, source, bytes)` copies within this rank's memory.
    pub local: Vec<(u64, u64, usize)>,
    /// `(to, address, bytes)`: the bytes at `address` go to rank `to`.
    pub sends: Vec<(usize, u64, usize)>,
    /// `(from, address, bytes)`: the bytes rank `from` sends land at `address`.
    pub recvs: Vec<(usize, u64, usize)>,
}

impl Transfers {
    /// The bytes this rank moves: its local copies, sends and receives.
    pub fn bytes(&self) -> usize {
        let local: usize = self.local.iter().map(|c| c.2).sum();
        let sent: usize = self.sends.iter().map(|s| s.2).sum();
        let received: usize = self.recvs.iter().map(|r| r.2).sum();
        local + sent + received
    }
}

/// How a copy-engine communicator moves the bytes of the operations it takes over.
///
/// A transport enqueues work on the caller's stream; like every post, it must not block
/// longer than the communicator's timeout, and every rank enqueues its transfers in program
/// order (pairs of ranks match their transfers by that order).
pub trait CopyTransport: Send + Sync {
    /// The streams it enqueues on.
    type Stream: ?Sized;

    /// Enqueues the transfers `t` of rank `me` for operation `label` on `stream`: the local
    /// copies, then the sends and receives. `timeout` bounds every host wait.
    fn transfer(
        &self,
        me: usize,
        label: &str,
        t: &Transfers,
        stream: &Self::Stream,
        timeout: Duration,
    ) -> Result<(), CommError>;

    /// The rank fails: host waits of this transport end at once from now on.
    fn abort(&self) {}

    /// Whether [`CopyTransport::reduce_in_windows`] works: the pushed blocks can be summed
    /// where they land, with no copy out of the receive windows.
    fn reduces_in_windows(&self) -> bool {
        false
    }

    /// Enqueues, for rank `me` on `stream`, the pushes `sends` (`(to, address, bytes)`) and,
    /// for the `bytes` that each rank of `from` pushes to this one, piece by piece: a wait
    /// until the piece of every rank of `from` has landed, `sum(offset, len, windows,
    /// stream)` with the address of each rank's piece (in the order of `from`; `offset` and
    /// `len` in bytes within the block), and the release of those pieces. Only called where
    /// [`CopyTransport::reduces_in_windows`] is true.
    #[allow(clippy::too_many_arguments)]
    fn reduce_in_windows(
        &self,
        me: usize,
        label: &str,
        sends: &[(usize, u64, usize)],
        from: &[usize],
        bytes: usize,
        stream: &Self::Stream,
        timeout: Duration,
        sum: &mut WindowSum<'_, Self::Stream>,
    ) -> Result<(), CommError> {
        let _ = (sends, from, bytes, stream, timeout, sum);
        Err(copy_error(
            me,
            label,
            "this transport cannot reduce in its receive windows".into(),
        ))
    }

    /// The largest piece of a reduction in the windows, in bytes (a slot); `None` where
    /// the transport has no windows.
    fn slot_bytes(&self) -> Option<usize> {
        None
    }

    /// [`CopyTransport::reduce_in_windows`] with the input not computed yet and nothing
    /// copied: for every piece (at most `piece` bytes), `produce(src, len, at)` computes
    /// the `len` bytes of this rank's input at `src` and writes them at `at` — a peer's
    /// piece straight into that peer's window slot, the rank's own piece (of the block at
    /// `own`) in place — and the pieces every rank of `from` produced for this one are
    /// summed where they landed, as there. Everything runs on `stream`, in the plan's
    /// order (which no single hardware queue can deadlock). Only called where
    /// [`CopyTransport::reduces_in_windows`] is true.
    #[allow(clippy::too_many_arguments)]
    fn produce_in_windows(
        &self,
        me: usize,
        label: &str,
        sends: &[(usize, u64, usize)],
        own: u64,
        from: &[usize],
        (bytes, piece): (usize, usize),
        stream: &Self::Stream,
        produce: &mut ProduceAt<'_>,
        sum: &mut WindowSum<'_, Self::Stream>,
    ) -> Result<(), CommError> {
        let _ = (sends, own, from, bytes, piece, stream, produce, sum);
        Err(copy_error(
            me,
            label,
            "this transport cannot produce into its receive windows".into(),
        ))
    }
}

/// What [`CopyTransport::produce_in_windows`] calls for each piece: `(src, len, at)`
/// computes the `len` bytes of the rank's input at address `src` and writes them at `at`.
pub type ProduceAt<'a> = dyn FnMut(u64, usize, u64) -> Result<(), CommError> + 'a;

/// What [`CopyTransport::reduce_in_windows`] calls for each piece: `(offset, len, windows,
/// stream)` enqueues the sum of the piece at `offset` (`len` bytes) of the member's own block
/// and of each peer's piece at its window address.
pub type WindowSum<'a, S> = dyn FnMut(usize, usize, &[u64], &S) -> Result<(), CommError> + 'a;

/// The reduction kernels and scratch memory of copy-engine reduce-scatters and allreduces,
/// enqueued on the posting stream.
pub trait Reducer<S: ?Sized>: Send + Sync {
    /// Enqueues `f` with `bytes` of scratch device memory at the address it is given,
    /// allocated and freed in the order of `stream` around what `f` enqueues.
    fn with_scratch(
        &self,
        bytes: usize,
        stream: &S,
        f: &mut dyn FnMut(u64) -> Result<(), CommError>,
    ) -> Result<(), CommError>;

    /// Enqueues `out[e] = src[e] + src[n + e] + … + src[(blocks - 1) n + e]` for `e < n`, in
    /// that order (the sum accumulated in `float`, or `double` for f64, rounded once), on
    /// `stream`. `Err` when `dtype` has no reduction kernel.
    fn sum_blocks(
        &self,
        out: u64,
        src: u64,
        blocks: usize,
        n: usize,
        dtype: DataType,
        stream: &S,
    ) -> Result<(), CommError>;

    /// Enqueues `out[e] = srcs[0][e] + srcs[1][e] + …` for `e < n`, in that order (the sum
    /// accumulated like [`Reducer::sum_blocks`]'s), on `stream`. `Err` when `dtype` has no
    /// reduction kernel.
    fn sum_pointers(
        &self,
        out: u64,
        srcs: &[u64],
        n: usize,
        dtype: DataType,
        stream: &S,
    ) -> Result<(), CommError>;

    /// Whether [`Reducer::sum_blocks`] and [`Reducer::sum_pointers`] take `dtype`.
    fn reduces(&self, dtype: DataType) -> bool;

    /// Makes `kernel` ready to launch (compiled and loaded), enqueuing nothing: called before
    /// a run ([`CopyComm::load_reductions`]). By default nothing is loaded ahead.
    fn load(&self, kernel: SumKernel) -> Result<(), CommError> {
        let _ = kernel;
        Ok(())
    }
}

/// A communicator whose allgathers and point-to-point transfers over contiguous buffers go
/// through the copy-engine transport `T`, everything else through `C` (see the module
/// documentation); with a [`Reducer`], its sum reduce-scatters and allreduces too.
pub struct CopyComm<T: CopyTransport, C> {
    inner: Arc<C>,
    transport: T,
    reducer: Option<Arc<dyn Reducer<T::Stream>>>,
}

impl<T: CopyTransport, C> CopyComm<T, C> {
    /// Wraps `inner`, moving copy-engine transfers through `transport`.
    pub fn with_transport(inner: Arc<C>, transport: T) -> CopyComm<T, C> {
        CopyComm {
            inner,
            transport,
            reducer: None,
        }
    }

    /// Moves sum reduce-scatters and allreduces through the copy engines too, their blocks
    /// added up by `reducer`.
    pub fn with_reducer(mut self, reducer: Arc<dyn Reducer<T::Stream>>) -> CopyComm<T, C> {
        self.reducer = Some(reducer);
        self
    }

    /// The wrapped communicator.
    pub fn inner(&self) -> &Arc<C> {
        &self.inner
    }

    /// The transport.
    pub fn transport(&self) -> &T {
        &self.transport
    }
}

impl<T, C> Communicator for CopyComm<T, C>
where
    C: Communicator,
    C::Buffer: DeviceBuffer,
    T: CopyTransport<Stream = C::Stream>,
{
    type Buffer = C::Buffer;
    type Stream = C::Stream;

    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn size(&self) -> usize {
        self.inner.size()
    }

    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }

    fn post(&self, collective: Collective<C::Buffer>, stream: &C::Stream) -> Result<(), CommError> {
        let me = self.rank();
        if let Some(reducer) = &self.reducer {
            if let Some(plan) = reduce_plan(me, &collective, |t| reducer.reduces(t)) {
                let _span = tracing::debug_span!(
                    "copy_engine_reduce",
                    rank = me,
                    op = collective.op.name(),
                    label = %collective.label,
                    team = ?collective.team,
                    bytes = plan.block_bytes * plan.blocks,
                )
                .entered();
                return self.reduce(&collective.label, &plan, reducer.as_ref(), stream);
            }
        }
        match allgather_transfers(me, &collective) {
            Some(t) => {
                let _span = tracing::debug_span!(
                    "copy_engine",
                    rank = me,
                    op = collective.op.name(),
                    label = %collective.label,
                    team = ?collective.team,
                    bytes = t.bytes(),
                )
                .entered();
                self.transport
                    .transfer(me, &collective.label, &t, stream, self.timeout())
            }
            None => self.inner.post(collective, stream),
        }
    }

    fn moved_by(&self, collective: &Collective<C::Buffer>) -> Option<&'static str> {
        let me = self.rank();
        let reduced = self
            .reducer
            .as_ref()
            .is_some_and(|r| reduce_plan(me, collective, |t| r.reduces(t)).is_some());
        if reduced || allgather_transfers(me, collective).is_some() {
            Some("copy-engine")
        } else {
            self.inner.moved_by(collective)
        }
    }

    fn post_p2p(
        &self,
        label: String,
        ops: Vec<P2p<C::Buffer>>,
        stream: &C::Stream,
    ) -> Result<(), CommError> {
        let me = self.rank();
        match p2p_transfers(me, &ops) {
            Ok(Some(t)) => {
                let _span = tracing::debug_span!(
                    "copy_engine",
                    rank = me,
                    op = "p2p",
                    label = %label,
                    bytes = t.bytes(),
                )
                .entered();
                self.transport
                    .transfer(me, &label, &t, stream, self.timeout())
            }
            Ok(None) => self.inner.post_p2p(label, ops, stream),
            Err(m) => Err(copy_error(me, &label, m)),
        }
    }

    fn abort(&self, reason: &str) {
        self.transport.abort();
        self.inner.abort(reason);
    }

    /// A sum reduce-scatter or allreduce reduced in the windows, its input blocks produced
    /// where they are summed (see [`CopyTransport::produce_in_windows`]); anything else is
    /// handed back.
    fn post_produced(
        &self,
        collective: Collective<C::Buffer>,
        granule: usize,
        produce: &mut Produce<'_>,
        stream: &C::Stream,
    ) -> Result<Option<Collective<C::Buffer>>, CommError> {
        let me = self.rank();
        let (Some(reducer), Some(slot)) = (&self.reducer, self.transport.slot_bytes()) else {
            return Ok(Some(collective));
        };
        if !self.transport.reduces_in_windows() {
            return Ok(Some(collective));
        }
        let Some(plan) = reduce_plan(me, &collective, |t| reducer.reduces(t)) else {
            return Ok(Some(collective));
        };
        let size = plan.dtype.size();
        let granule_bytes = granule.saturating_mul(size);
        // Pieces of whole granules (rows of a GEMM's output) that fit a slot.
        let piece = match granule_bytes {
            0 => 0,
            g => slot / g * g,
        };
        if piece == 0 || !plan.block_bytes.is_multiple_of(granule_bytes) {
            return Ok(Some(collective));
        }
        let label = collective.label.clone();
        let _span = tracing::debug_span!(
            "copy_engine_produce",
            rank = me,
            op = collective.op.name(),
            label = %label,
            bytes = plan.block_bytes * plan.blocks,
        )
        .entered();
        let (sends, from) = plan.pushes();
        // Each rank starts with the next rank's block, so the ranks' GEMMs write to
        // different peers at any moment.
        let sends = rotate_after(&plan.team, plan.index, sends);
        let own = plan.input + (plan.index * plan.block_bytes) as u64;
        self.transport.produce_in_windows(
            me,
            &label,
            &sends,
            own,
            &from,
            (plan.block_bytes, piece),
            stream,
            &mut |src: u64, len: usize, at: u64| {
                produce((src - plan.input) as usize / size, len / size, at)
            },
            &mut |offset, len, windows, stream| {
                sum_piece(
                    &plan,
                    reducer.as_ref(),
                    me,
                    &label,
                    (offset, len),
                    windows,
                    stream,
                )
            },
        )?;
        if let Some(gather) = plan.gather() {
            self.transport.transfer(
                me,
                &format!("{label} (gather)"),
                &gather,
                stream,
                self.timeout(),
            )?;
        }
        Ok(None)
    }
}

/// `sends` (to team members, in team order) reordered to start with the member after
/// `index` and wrap around.
fn rotate_after(
    team: &[usize],
    index: usize,
    sends: Vec<(usize, u64, usize)>,
) -> Vec<(usize, u64, usize)> {
    let position = |p: usize| team.iter().position(|&q| q == p).unwrap_or(0);
    let n = team.len().max(1);
    let mut sends = sends;
    sends.sort_by_key(|s| (position(s.0) + n - index) % n);
    sends
}

/// Enqueues the sum of one piece (`offset`, `len` bytes into the block) of a reduction in
/// the windows: the member's own block's piece and each peer's piece at its window address
/// (`windows`, in team order without the member), added in team order into `reduced`.
fn sum_piece<S: ?Sized>(
    plan: &ReducePlan,
    reducer: &dyn Reducer<S>,
    me: usize,
    label: &str,
    (offset, len): (usize, usize),
    windows: &[u64],
    stream: &S,
) -> Result<(), CommError> {
    let mut windows = windows.iter();
    let mut srcs = Vec::with_capacity(plan.blocks);
    for j in 0..plan.blocks {
        if j == plan.index {
            srcs.push(plan.input + (j * plan.block_bytes + offset) as u64);
        } else {
            srcs.push(
                *windows
                    .next()
                    .ok_or_else(|| copy_error(me, label, "a window is missing".into()))?,
            );
        }
    }
    reducer.sum_pointers(
        plan.reduced + offset as u64,
        &srcs,
        len / plan.dtype.size(),
        plan.dtype,
        stream,
    )
}

impl<T, C> CopyComm<T, C>
where
    C: Communicator,
    C::Buffer: DeviceBuffer,
    T: CopyTransport<Stream = C::Stream>,
{
    /// Enqueues a copy-engine reduce-scatter or allreduce planned by [`reduce_plan`].
    fn reduce(
        &self,
        label: &str,
        plan: &ReducePlan,
        reducer: &dyn Reducer<C::Stream>,
        stream: &C::Stream,
    ) -> Result<(), CommError> {
        let me = self.rank();
        let timeout = self.timeout();
        let gather = |stream: &C::Stream| match plan.gather() {
            Some(gather) => {
                self.transport
                    .transfer(me, &format!("{label} (gather)"), &gather, stream, timeout)
            }
            None => Ok(()),
        };
        if self.transport.reduces_in_windows() {
            // Each block summed where its pushes land: no scratch, no copy out of the
            // windows.
            let (sends, from) = plan.pushes();
            self.transport.reduce_in_windows(
                me,
                label,
                &sends,
                &from,
                plan.block_bytes,
                stream,
                timeout,
                &mut |offset, len, windows, stream| {
                    sum_piece(plan, reducer, me, label, (offset, len), windows, stream)
                },
            )?;
            return gather(stream);
        }
        reducer.with_scratch(plan.block_bytes * plan.blocks, stream, &mut |scratch| {
            let scatter = plan.scatter(scratch);
            self.transport
                .transfer(me, label, &scatter, stream, timeout)?;
            reducer.sum_blocks(
                plan.reduced,
                scratch,
                plan.blocks,
                plan.block_len,
                plan.dtype,
                stream,
            )?;
            gather(stream)
        })
    }
}

/// How a copy-engine reduce-scatter or allreduce of one member runs: its input cut into
/// `blocks` blocks of `block_len` elements (block `j` belongs to the member at team index
/// `j`), each pushed to its owner's scratch slot `index` (this member's own block copied
/// into its own scratch), the blocks of this member's scratch summed in team order into
/// `reduced`; an allreduce then sends `reduced` to every member, whose output block `index`
/// it becomes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReducePlan {
    /// The team, in order.
    pub team: Vec<usize>,
    /// This member's team index.
    pub index: usize,
    /// The team's size: blocks per input.
    pub blocks: usize,
    /// Elements per block.
    pub block_len: usize,
    /// Bytes per block.
    pub block_bytes: usize,
    /// The element type.
    pub dtype: DataType,
    /// The input's address.
    pub input: u64,
    /// Where this member's reduced block goes: the reduce-scatter's output, or the
    /// allreduce output's block `index`.
    pub reduced: u64,
    /// For an allreduce, the output's address (its block `j` comes from member `j`).
    pub gathered: Option<u64>,
}

impl ReducePlan {
    /// The transfers that bring every member's block `index` into `scratch` (block `j` from
    /// member `j`; this member's own by a local copy) and send this member's other blocks to
    /// their owners.
    pub fn scatter(&self, scratch: u64) -> Transfers {
        let b = self.block_bytes;
        let block = |base: u64, j: usize| base + (j * b) as u64;
        let mut t = Transfers::default();
        for (j, &p) in self.team.iter().enumerate() {
            if j == self.index {
                t.local.push((block(scratch, j), block(self.input, j), b));
            } else {
                t.sends.push((p, block(self.input, j), b));
                t.recvs.push((p, block(scratch, j), b));
            }
        }
        t
    }

    /// The pushes of this member's blocks to their owners (`(to, address, bytes)`), and the
    /// members whose pushes this one receives, in team order.
    pub fn pushes(&self) -> (Vec<(usize, u64, usize)>, Vec<usize>) {
        let b = self.block_bytes;
        let mut sends = Vec::new();
        let mut from = Vec::new();
        for (j, &p) in self.team.iter().enumerate() {
            if j != self.index {
                sends.push((p, self.input + (j * b) as u64, b));
                from.push(p);
            }
        }
        (sends, from)
    }

    /// For an allreduce, the transfers that send the reduced block to every other member and
    /// receive theirs into the output.
    pub fn gather(&self) -> Option<Transfers> {
        let out = self.gathered?;
        let b = self.block_bytes;
        let mut t = Transfers::default();
        for (j, &p) in self.team.iter().enumerate() {
            if j != self.index {
                t.sends.push((p, self.reduced, b));
                t.recvs.push((p, out + (j * b) as u64, b));
            }
        }
        Some(t)
    }
}

/// The copy-engine plan of a sum reduce-scatter or allreduce that `me` is a member of, over
/// contiguous, non-overlapping buffers of an element type `reduces` takes, on a team of two
/// or more whose size divides an allreduce (a reduce-scatter's input is the team size times
/// its output); `None` for anything else (it goes to NCCL).
pub fn reduce_plan<B: DeviceBuffer>(
    me: usize,
    collective: &Collective<B>,
    reduces: impl Fn(DataType) -> bool,
) -> Option<ReducePlan> {
    let (input, output, allreduce) = match &collective.op {
        CommOp::ReduceScatter {
            input,
            output,
            op: RedOp::Sum,
        } => (input, output, false),
        CommOp::Allreduce {
            input,
            output,
            op: RedOp::Sum,
        } => (input, output, true),
        _ => return None,
    };
    let team = &collective.team;
    let index = team.iter().position(|&p| p == me)?;
    let d = team.len();
    let dtype = input.data_type();
    if d < 2
        || !input.is_contiguous()
        || !output.is_contiguous()
        || output.data_type() != dtype
        || !reduces(dtype)
    {
        return None;
    }
    let (block_len, reduced, gathered) = if allreduce {
        if output.len() != input.len() || input.len() % d != 0 {
            return None;
        }
        let n = input.len() / d;
        let at = output.device_ptr() + (index * n * dtype.size()) as u64;
        (n, at, Some(output.device_ptr()))
    } else {
        if input.len() != output.len() * d {
            return None;
        }
        (output.len(), output.device_ptr(), None)
    };
    if block_len == 0 {
        return None;
    }
    let bytes = |b: &B| (b.len() * dtype.size()) as u64;
    let (i0, o0) = (input.device_ptr(), output.device_ptr());
    if i0 < o0 + bytes(output) && o0 < i0 + bytes(input) {
        return None;
    }
    Some(ReducePlan {
        team: team.clone(),
        index,
        blocks: d,
        block_len,
        block_bytes: block_len * dtype.size(),
        dtype,
        input: i0,
        reduced,
        gathered,
    })
}

/// Checks that a rank's sends to itself meet its receives from itself, in order and by size
/// in bytes: they become local copies.
fn pair_self(to_self: &[usize], from_self: &[usize]) -> Result<(), String> {
    if to_self.len() != from_self.len() {
        return Err(format!(
            "{} send(s) to itself but {} receive(s) from itself",
            to_self.len(),
            from_self.len()
        ));
    }
    for (s, r) in to_self.iter().zip(from_self) {
        if s != r {
            return Err(format!("it sends itself {s} bytes but receives {r}"));
        }
    }
    Ok(())
}

/// The transfers of an allgather that `me` is a member of, over contiguous buffers whose
/// output holds every member's input; `None` for anything else (it goes to NCCL).
fn allgather_transfers<B: DeviceBuffer>(
    me: usize,
    collective: &Collective<B>,
) -> Option<Transfers> {
    let CommOp::Allgather { input, output } = &collective.op else {
        return None;
    };
    if !collective.team.contains(&me)
        || !input.is_contiguous()
        || !output.is_contiguous()
        || output.len() != input.len() * collective.team.len()
    {
        return None;
    }
    let bytes = input.len() * input.data_type().size();
    let block = |i: usize| output.device_ptr() + (i * bytes) as u64;
    let mut t = Transfers::default();
    for (i, &p) in collective.team.iter().enumerate() {
        if p == me {
            t.local.push((block(i), input.device_ptr(), bytes));
        } else {
            t.sends.push((p, input.device_ptr(), bytes));
            t.recvs.push((p, block(i), bytes));
        }
    }
    Some(t)
}

/// The transfers of a group of sends and receives of `me` over contiguous buffers (`None`
/// when a buffer is not contiguous: NCCL moves it); sends to itself meet receives from
/// itself in order and become local copies, an error when their count or sizes differ. A
/// buffer sent to itself into the same memory (a reduce ring's last step) moves nothing.
fn p2p_transfers<B: DeviceBuffer>(me: usize, ops: &[P2p<B>]) -> Result<Option<Transfers>, String> {
    if ops.iter().any(|op| match op {
        P2p::Send { buffer, .. } | P2p::Recv { buffer, .. } => !buffer.is_contiguous(),
    }) {
        return Ok(None);
    }
    let bytes = |b: &B| b.len() * b.data_type().size();
    let mut t = Transfers::default();
    let mut to_self = Vec::new();
    let mut from_self = Vec::new();
    for op in ops {
        match op {
            P2p::Send { peer, buffer } if *peer == me => to_self.push(buffer),
            P2p::Recv { peer, buffer } if *peer == me => from_self.push(buffer),
            P2p::Send { peer, buffer } => t.sends.push((*peer, buffer.device_ptr(), bytes(buffer))),
            P2p::Recv { peer, buffer } => t.recvs.push((*peer, buffer.device_ptr(), bytes(buffer))),
        }
    }
    let sizes = |v: &[&B]| v.iter().map(|b| bytes(b)).collect::<Vec<usize>>();
    pair_self(&sizes(&to_self), &sizes(&from_self))?;
    for (s, r) in to_self.into_iter().zip(from_self) {
        if r.device_ptr() != s.device_ptr() {
            t.local.push((r.device_ptr(), s.device_ptr(), bytes(s)));
        }
    }
    Ok(Some(t))
}

/// A copy-engine failure of `label` on `rank`.
pub(crate) fn copy_error(rank: usize, label: &str, message: String) -> CommError {
    CommError::Backend {
        op: label.to_string(),
        message: format!("rank {rank}: {message}"),
    }
}

mod sums;
pub use sums::{sum_kernels, SumKernel};

#[cfg(test)]
mod tests;
