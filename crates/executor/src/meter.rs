//! A backend and a communicator that do no work: buffers are shapes, streams are names, and
//! every GEMM, kernel launch and communication is counted (flops, bytes). Running a program
//! on them measures the evaluator's own host cost, and tells a cost model what one rank's
//! program computes and moves.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use weave_comm::{Collective, CommError, CommOp, Communicator, P2p, RedOp, ReductionShape};
use weave_host_ir::KernelId;
use weave_ir::{DType, Fusion};

use crate::backend::{Backend, Region, Span, StreamKey};
use crate::dense::{elem_bytes, Dense};
use crate::error::ExecError;
use weave_codegen::TensorArg;

/// A buffer that is only a shape: a box of an allocation.
#[derive(Clone, Debug)]
pub struct Shape {
    dtype: DType,
    allocation: u64,
    /// The allocation's sizes.
    full: Arc<Vec<usize>>,
    ranges: Vec<Range<usize>>,
}

impl Shape {
    /// The layout a kernel sees: the box's sizes, the allocation's row-major strides.
    pub fn arg(&self) -> TensorArg {
        TensorArg {
            dtype: self.dtype,
            sizes: self.sizes(),
            strides: row_major(&self.full),
        }
    }

    /// The layout of a contiguous copy of the box: its sizes, their row-major strides.
    fn copy_arg(&self) -> TensorArg {
        let sizes = self.sizes();
        TensorArg {
            dtype: self.dtype,
            strides: row_major(&sizes),
            sizes,
        }
    }

    fn sizes(&self) -> Vec<usize> {
        self.ranges.iter().map(|r| r.len()).collect()
    }

    /// The elements of the box.
    fn numel(&self) -> u64 {
        self.ranges
            .iter()
            .map(|r| r.len() as u64)
            .fold(1u64, u64::saturating_mul)
    }

    fn bytes(&self) -> usize {
        self.ranges.iter().map(|r| r.len()).product::<usize>() * elem_bytes(self.dtype)
    }
}

/// The row-major element strides of `sizes` (saturating).
fn row_major(sizes: &[usize]) -> Vec<usize> {
    let mut strides = vec![1usize; sizes.len()];
    for a in (0..sizes.len().saturating_sub(1)).rev() {
        strides[a] = strides[a + 1].saturating_mul(sizes[a + 1]);
    }
    strides
}

/// The bytes of a whole allocation of `sizes` at `dtype`'s size (saturating).
fn bytes_of(dtype: DType, sizes: &[usize]) -> u64 {
    crate::memory::bytes_of(sizes, elem_bytes(dtype)).unwrap_or(u64::MAX)
}

/// The bytes of the whole allocation `shape` is a box of.
fn whole_bytes(shape: &Shape) -> u64 {
    bytes_of(shape.dtype, &shape.full)
}

/// One kernel launch as the meter saw it: the segment and its buffers' layouts.
#[derive(Clone, Debug)]
pub struct MeteredLaunch {
    /// The host statement, as printed.
    pub label: String,
    /// The kernel segment.
    pub fusion: Arc<Fusion>,
    /// The inputs' layouts as the CUDA backend's kernels read them: an input that shares
    /// its allocation with an output (a running total updated in place) is read from a
    /// contiguous copy, so its layout is that copy's.
    pub inputs: Vec<TensorArg>,
    /// The outputs' layouts.
    pub outputs: Vec<TensorArg>,
}

impl PartialEq for MeteredLaunch {
    /// The same statement launching the same segment (by identity) on the same layouts.
    fn eq(&self, other: &MeteredLaunch) -> bool {
        self.label == other.label
            && Arc::ptr_eq(&self.fusion, &other.fusion)
            && self.inputs == other.inputs
            && self.outputs == other.outputs
    }
}

/// One communication as the meter saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct MeteredComm {
    /// `allreduce`, `allgather`, …, or `send/recv`.
    pub kind: &'static str,
    /// Ranks taking part.
    pub team: usize,
    /// Bytes of the larger of its input and output on this rank (for send/recv: the bytes
    /// sent).
    pub bytes: usize,
}

/// A GEMM operand as the meter saw it: a box of an allocation, as a device buffer is one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GemmOperand {
    /// Its element type.
    pub dtype: DType,
    /// The allocation's sizes.
    pub full: Vec<usize>,
    /// The box of the allocation the operand is.
    pub ranges: Vec<Range<usize>>,
}

impl GemmOperand {
    fn of(shape: &Shape) -> GemmOperand {
        GemmOperand {
            dtype: shape.dtype,
            full: shape.full.to_vec(),
            ranges: shape.ranges.clone(),
        }
    }
}

/// One distinct GEMM a rank's program issues: what a GPU run launches once before its first
/// statement, so that no GEMM's first launch in the process (cuBLASLt's per-kernel set-up)
/// happens while the GPU waits on another rank.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MeteredGemm {
    /// A `linear` (`out = input · weightᵀ + bias`) rather than a `matmul`.
    pub linear: bool,
    /// A GEMM that adds to its output (cuBLASLt's beta = 1: a plan of its own).
    pub accumulate: bool,
    /// The left operand (a linear's input).
    pub a: GemmOperand,
    /// The right operand (a linear's weight).
    pub b: GemmOperand,
    /// A linear's bias.
    pub bias: Option<GemmOperand>,
    /// The output.
    pub out: GemmOperand,
    /// The stream it is issued on.
    pub stream: StreamKey,
    /// A linear that a copy-engine sum computes straight into its windows
    /// ([`Backend::linear_rows_into`]): `a` is one member's block of rows, which the
    /// communicator cuts into pieces of whole rows that fit a window slot; a run warms the
    /// GEMM of each piece size its slots give.
    pub into_windows: bool,
}

impl MeteredGemm {
    /// The GEMMs a copy-engine communicator with window slots of `slot_bytes` has this
    /// linear ([`MeteredGemm::into_windows`]) compute: its block of rows cut into pieces of
    /// as many whole rows as fit a slot, and what is left of the block — one GEMM per piece
    /// size, each of those rows of `a` into an output of its own. None for a GEMM that is
    /// not computed into windows, or rows that do not fit a slot.
    pub fn window_pieces(&self, slot_bytes: usize) -> Vec<MeteredGemm> {
        let (Some(block), Some(&n)) = (self.a.ranges.first(), self.out.full.get(1)) else {
            return Vec::new();
        };
        let row_bytes = n.saturating_mul(elem_bytes(self.out.dtype));
        let per_piece = slot_bytes.checked_div(row_bytes).unwrap_or(0);
        let rows = block.len();
        if !self.into_windows || per_piece == 0 || rows == 0 {
            return Vec::new();
        }
        let mut sizes = vec![per_piece.min(rows)];
        if rows > per_piece && rows % per_piece != 0 {
            sizes.push(rows % per_piece);
        }
        sizes
            .into_iter()
            .map(|r| {
                let mut piece = self.clone();
                piece.a.ranges[0] = block.start..block.start + r;
                piece.out.full = vec![r, n];
                piece.out.ranges = vec![0..r, 0..n];
                piece
            })
            .collect()
    }
}

/// What a rank's program did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Meter {
    /// GEMMs issued.
    pub gemms: usize,
    /// The distinct ones, in the order first issued.
    pub distinct_gemms: Vec<MeteredGemm>,
    /// Their floating-point operations (2 · m · n · k each).
    pub gemm_flops: f64,
    /// Kernel segments launched.
    pub kernels: usize,
    /// Each launch, in order.
    pub launches: Vec<MeteredLaunch>,
    /// Communications posted, in order.
    pub comms: Vec<MeteredComm>,
    /// The sum reduce-scatters and allreduces among them, in order, by their sizes: what a
    /// copy-engine reduction of each sums, so that its kernels can be loaded before a run.
    pub reductions: Vec<ReductionShape>,
    /// Buffers allocated.
    pub allocations: usize,
    /// Bytes of the rank's buffers (uploaded inputs and allocations, at their dtype's size)
    /// live now.
    pub live_bytes: u64,
    /// The most bytes of buffers live at once: what the rank holds at its peak.
    pub peak_bytes: u64,
    /// The largest buffers live at that peak (at most [`PEAK_BUFFERS`]), largest first:
    /// their dtypes and sizes.
    pub peak_buffers: Vec<(DType, Vec<usize>)>,
    /// The most bytes live at once when, besides the buffers, each kernel launch, matmul
    /// and linear also holds what a host evaluator of `f64` values does while it runs (the
    /// CPU backend): its operands read as `f64` and one `f64` value of the output's size
    /// for each expression of the segment (an estimate: a reduction's values are smaller).
    pub peak_with_f64_work: u64,
}

/// How many of the largest buffers live at the peak [`Meter::peak_buffers`] keeps.
pub const PEAK_BUFFERS: usize = 3;

/// The shape-only backend.
#[derive(Default)]
pub struct MeterBackend {
    meter: Arc<Mutex<Meter>>,
    next: AtomicU64,
    /// The allocations live now, by their number: dtype and sizes.
    live: Mutex<std::collections::HashMap<u64, Held>>,
}

/// A live allocation: its dtype and sizes.
type Held = (DType, Arc<Vec<usize>>);

impl MeterBackend {
    /// A backend whose counts are shared with communicators made by [`MeterBackend::comm`].
    pub fn new() -> MeterBackend {
        MeterBackend::default()
    }

    /// A communicator for rank `rank` of `size` that records into this backend's meter.
    pub fn comm(&self, rank: usize, size: usize) -> MeterComm {
        MeterComm {
            rank,
            size,
            meter: self.meter.clone(),
        }
    }

    /// The counts so far.
    pub fn meter(&self) -> Meter {
        self.meter.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A buffer of `sizes` (an input the program will take).
    pub fn shape(&self, dtype: DType, sizes: &[usize]) -> Shape {
        Shape {
            dtype,
            allocation: self.next.fetch_add(1, Ordering::Relaxed),
            full: Arc::new(sizes.to_vec()),
            ranges: sizes.iter().map(|&n| 0..n).collect(),
        }
    }

    /// Counts `shape`, a new allocation, as live (and the peak, should it be one).
    fn hold(&self, shape: &Shape) {
        let bytes = whole_bytes(shape);
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.insert(shape.allocation, (shape.dtype, shape.full.clone()));
        self.count(|c| {
            c.live_bytes = c.live_bytes.saturating_add(bytes);
            c.peak_with_f64_work = c.peak_with_f64_work.max(c.live_bytes);
            if c.live_bytes > c.peak_bytes {
                c.peak_bytes = c.live_bytes;
                let mut held: Vec<(u64, DType, Vec<usize>)> = live
                    .values()
                    .map(|(d, sizes)| (bytes_of(*d, sizes), *d, sizes.to_vec()))
                    .collect();
                held.sort_by_key(|h| std::cmp::Reverse(h.0));
                c.peak_buffers = held
                    .into_iter()
                    .take(PEAK_BUFFERS)
                    .map(|(_, d, sizes)| (d, sizes))
                    .collect();
            }
        });
    }

    /// Counts the `f64` working values of one operation of the host evaluator: `values`
    /// elements held besides the live buffers while it runs.
    fn work(&self, values: u64) {
        self.count(|c| {
            let bytes = values.saturating_mul(8);
            let now = c.live_bytes.saturating_add(bytes);
            c.peak_with_f64_work = c.peak_with_f64_work.max(now).max(c.peak_bytes);
        });
    }

    fn count(&self, f: impl FnOnce(&mut Meter)) {
        f(&mut self.meter.lock().unwrap_or_else(|e| e.into_inner()));
    }

    fn gemm(&self, m: usize, n: usize, k: usize, call: MeteredGemm) {
        self.count(|c| {
            c.gemms += 1;
            c.gemm_flops += 2.0 * m as f64 * n as f64 * k as f64;
            if !c.distinct_gemms.contains(&call) {
                c.distinct_gemms.push(call);
            }
        });
    }
}

impl Backend for MeterBackend {
    type Buffer = Shape;
    type Stream = StreamKey;
    type Event = ();
    type CommStream = StreamKey;

    fn name(&self) -> &'static str {
        "meter"
    }

    fn stream(&self, key: StreamKey) -> Result<StreamKey, ExecError> {
        Ok(key)
    }

    fn comm_stream<'s>(&self, stream: &'s StreamKey) -> &'s StreamKey {
        stream
    }

    fn record_event(&self, _stream: &StreamKey) {}

    fn wait_event(&self, _stream: &StreamKey, _event: &(), _label: &str) {}

    fn allocate(
        &self,
        dtype: DType,
        sizes: &[usize],
        _zero: bool,
        _stream: &StreamKey,
    ) -> Result<Shape, ExecError> {
        self.count(|c| c.allocations += 1);
        let shape = self.shape(dtype, sizes);
        self.hold(&shape);
        Ok(shape)
    }

    fn zero(&self, _buffer: &Shape, _stream: &StreamKey) -> Result<(), ExecError> {
        Ok(())
    }

    fn deallocate(&self, buffer: Shape, _stream: &StreamKey) {
        let freed = self
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&buffer.allocation);
        if let Some((dtype, sizes)) = freed {
            let bytes = bytes_of(dtype, &sizes);
            self.count(|c| c.live_bytes = c.live_bytes.saturating_sub(bytes));
        }
    }

    fn chunk(
        &self,
        buffer: &Shape,
        axis: usize,
        chunks: usize,
        index: usize,
    ) -> Result<Shape, String> {
        let ranges = weave_comm::host::chunk_ranges(&buffer.ranges, axis, chunks, index)
            .map_err(|e| e.to_string())?;
        Ok(Shape {
            ranges,
            ..buffer.clone()
        })
    }

    fn narrow(&self, buffer: &Shape, axis: usize, len: usize) -> Result<Shape, String> {
        let ranges = weave_comm::host::narrow_ranges(&buffer.ranges, axis, len)
            .map_err(|e| e.to_string())?;
        Ok(Shape {
            ranges,
            ..buffer.clone()
        })
    }

    fn sizes(&self, buffer: &Shape) -> Vec<usize> {
        buffer.sizes()
    }

    fn dtype(&self, buffer: &Shape) -> DType {
        buffer.dtype
    }

    fn region(&self, buffer: &Shape) -> Region {
        Region {
            allocation: buffer.allocation,
            ranges: buffer.ranges.clone(),
        }
    }

    fn launch_kernel(
        &self,
        label: &str,
        _kernel: KernelId,
        fusion: &Arc<Fusion>,
        inputs: &[Shape],
        outputs: &[Shape],
        _stream: &StreamKey,
    ) -> Result<(), ExecError> {
        // The layouts the CUDA backend launches the kernels on: an input that shares its
        // allocation with an output is read from a contiguous copy there (generated kernels
        // take their buffers as `__restrict__`).
        let args = inputs
            .iter()
            .map(
                |i| match outputs.iter().any(|o| o.allocation == i.allocation) {
                    true => i.copy_arg(),
                    false => i.arg(),
                },
            )
            .collect();
        self.count(|c| {
            c.kernels += 1;
            c.launches.push(MeteredLaunch {
                label: label.to_string(),
                fusion: fusion.clone(),
                inputs: args,
                outputs: outputs.iter().map(Shape::arg).collect(),
            })
        });
        let read: u64 = inputs.iter().map(Shape::numel).sum();
        let largest = outputs.iter().map(Shape::numel).max().unwrap_or(0);
        let values = u64::try_from(fusion.exprs().len().max(outputs.len())).unwrap_or(u64::MAX);
        self.work(read.saturating_add(largest.saturating_mul(values)));
        Ok(())
    }

    fn matmul(
        &self,
        _label: &str,
        a: &Shape,
        b: &Shape,
        out: &Shape,
        accumulate: bool,
        stream: &StreamKey,
    ) -> Result<(), ExecError> {
        self.work(a.numel() + b.numel() + out.numel());
        let call = MeteredGemm {
            linear: false,
            accumulate,
            a: GemmOperand::of(a),
            b: GemmOperand::of(b),
            bias: None,
            out: GemmOperand::of(out),
            stream: *stream,
            into_windows: false,
        };
        let (a, b, o) = (a.sizes(), b.sizes(), out.sizes());
        let k = a.last().copied().unwrap_or(0);
        let n = b.last().copied().unwrap_or(0);
        let m = o.iter().product::<usize>() / n.max(1);
        self.gemm(m, n, k, call);
        Ok(())
    }

    fn linear(
        &self,
        _label: &str,
        input: &Shape,
        weight: &Shape,
        bias: Option<&Shape>,
        out: &Shape,
        accumulate: bool,
        stream: &StreamKey,
    ) -> Result<(), ExecError> {
        let call = MeteredGemm {
            linear: true,
            accumulate,
            a: GemmOperand::of(input),
            b: GemmOperand::of(weight),
            bias: bias.map(GemmOperand::of),
            out: GemmOperand::of(out),
            stream: *stream,
            into_windows: false,
        };
        let bias = bias.map_or(0, Shape::numel);
        self.work(input.numel() + weight.numel() + bias + out.numel());
        let (x, w) = (input.sizes(), weight.sizes());
        let k = x.last().copied().unwrap_or(0);
        let m = x.iter().product::<usize>() / k.max(1);
        let n = w.first().copied().unwrap_or(0);
        self.gemm(m, n, k, call);
        Ok(())
    }

    /// The meter takes the path of a run whose copy-engine sums compute their linears into
    /// the windows, so that it sees those GEMMs too ([`MeteredGemm::into_windows`]); its
    /// communicator then hands each collective back, and the linear also runs whole (a run
    /// on NCCL computes it so).
    fn produces_into_windows(&self) -> bool {
        true
    }

    fn linear_rows_into(
        &self,
        label: &str,
        input: &Shape,
        weight: &Shape,
        bias: Option<&Shape>,
        rows: Range<usize>,
        _at: u64,
        stream: &StreamKey,
    ) -> Result<(), ExecError> {
        let (x, w) = (input.sizes(), weight.sizes());
        if x.len() != 2 || w.len() != 2 || rows.end > x[0] || rows.start > rows.end {
            return Err(ExecError::Compute {
                stmt: label.to_string(),
                message: format!("rows {rows:?} of a linear of a {x:?} input and a {w:?} weight"),
            });
        }
        let mut block = GemmOperand::of(input);
        let first = block.ranges[0].start;
        block.ranges[0] = first + rows.start..first + rows.end;
        let out = [rows.len(), w[0]];
        let call = MeteredGemm {
            linear: true,
            accumulate: false,
            a: block,
            b: GemmOperand::of(weight),
            bias: bias.map(GemmOperand::of),
            out: GemmOperand {
                dtype: input.dtype,
                full: out.to_vec(),
                ranges: out.iter().map(|&n| 0..n).collect(),
            },
            stream: *stream,
            into_windows: true,
        };
        // Not counted as a GEMM: the meter's communicator hands the collective back, and the
        // whole linear is counted when it runs.
        self.count(|c| {
            if !c.distinct_gemms.contains(&call) {
                c.distinct_gemms.push(call);
            }
        });
        Ok(())
    }

    fn upload(&self, data: &Dense) -> Result<Shape, ExecError> {
        let shape = self.shape(data.dtype, &data.sizes);
        self.hold(&shape);
        Ok(shape)
    }

    fn download(&self, buffer: &Shape, _stream: &StreamKey) -> Result<Dense, ExecError> {
        Ok(Dense {
            dtype: buffer.dtype,
            sizes: buffer.sizes(),
            data: Vec::new(),
        })
    }

    fn synchronize(&self) -> Result<(), ExecError> {
        Ok(())
    }

    fn spans(&self) -> Vec<Span> {
        Vec::new()
    }

    fn streams(&self) -> Vec<StreamKey> {
        Vec::new()
    }

    fn live_allocations(&self) -> usize {
        0
    }
}

/// The communicator of a [`MeterBackend`]: records, never waits.
pub struct MeterComm {
    rank: usize,
    size: usize,
    meter: Arc<Mutex<Meter>>,
}

impl Communicator for MeterComm {
    type Buffer = Shape;
    type Stream = StreamKey;

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs(1)
    }

    fn post(&self, c: Collective<Shape>, _stream: &StreamKey) -> Result<(), CommError> {
        let kind = c.op.name();
        let bytes = match &c.op {
            CommOp::Allgather { input, output }
            | CommOp::Allreduce { input, output, .. }
            | CommOp::ReduceScatter { input, output, .. }
            | CommOp::Broadcast { input, output, .. }
            | CommOp::Reduce { input, output, .. }
            | CommOp::Gather { input, output, .. }
            | CommOp::Scatter { input, output, .. }
            | CommOp::SendRecv { input, output, .. }
            | CommOp::AllToAll { input, output }
            | CommOp::CollectivePermute { input, output, .. } => input.bytes().max(output.bytes()),
        };
        let reduction = match &c.op {
            CommOp::Allreduce {
                input,
                output,
                op: RedOp::Sum,
            }
            | CommOp::ReduceScatter {
                input,
                output,
                op: RedOp::Sum,
            } => Some(ReductionShape {
                team: c.team.len(),
                allreduce: matches!(c.op, CommOp::Allreduce { .. }),
                dtype: crate::cpu::data_type(input.dtype),
                input_len: input.numel() as usize,
                output_len: output.numel() as usize,
                row: input.sizes().iter().skip(1).product(),
            }),
            _ => None,
        };
        let mut meter = self.meter.lock().unwrap_or_else(|e| e.into_inner());
        meter.comms.push(MeteredComm {
            kind,
            team: c.team.len(),
            bytes,
        });
        meter.reductions.extend(reduction);
        Ok(())
    }

    fn post_p2p(
        &self,
        _label: String,
        ops: Vec<P2p<Shape>>,
        _stream: &StreamKey,
    ) -> Result<(), CommError> {
        let bytes = ops
            .iter()
            .map(|op| match op {
                P2p::Send { buffer, .. } => buffer.bytes(),
                P2p::Recv { .. } => 0,
            })
            .sum();
        self.meter
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .comms
            .push(MeteredComm {
                kind: "send/recv",
                team: 2,
                bytes,
            });
        Ok(())
    }

    fn abort(&self, _reason: &str) {}

    /// A sum reduce-scatter or allreduce has each member's block of the input produced
    /// (what a copy-engine communicator computes into its windows, block by block), then
    /// is handed back: the meter records both ways a run may compute the linear.
    fn post_produced(
        &self,
        collective: Collective<Shape>,
        granule: usize,
        produce: &mut weave_comm::Produce<'_>,
        _stream: &StreamKey,
    ) -> Result<Option<Collective<Shape>>, CommError> {
        let input = match &collective.op {
            CommOp::ReduceScatter {
                input,
                op: RedOp::Sum,
                ..
            }
            | CommOp::Allreduce {
                input,
                op: RedOp::Sum,
                ..
            } => input,
            _ => return Ok(Some(collective)),
        };
        let (n, team) = (input.numel() as usize, collective.team.len());
        if team > 0 && granule > 0 && n % team == 0 && (n / team) % granule == 0 {
            let block = n / team;
            for b in 0..team {
                produce(b * block, block, 0)?;
            }
        }
        Ok(Some(collective))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_input_updated_in_place_is_recorded_as_the_contiguous_copy_a_gpu_reads() {
        let backend = MeterBackend::new();
        // A running total: columns 2..4 of a [4, 6] buffer, read and written by one launch.
        let total = backend.shape(DType::F32, &[4, 6]);
        let chunk = backend.chunk(&total, 1, 3, 1).unwrap();
        let other = backend.shape(DType::F32, &[4, 6]);
        let other = backend.chunk(&other, 1, 3, 1).unwrap();
        let fusion = Arc::new(Fusion::new("k"));
        backend
            .launch_kernel(
                "L",
                KernelId::default(),
                &fusion,
                &[chunk.clone(), other],
                &[chunk],
                &StreamKey::Main,
            )
            .unwrap();
        let launch = &backend.meter().launches[0];
        let layout = |a: &TensorArg| (a.sizes.clone(), a.strides.clone());
        assert_eq!(layout(&launch.inputs[0]), (vec![4, 2], vec![2, 1]));
        assert_eq!(layout(&launch.inputs[1]), (vec![4, 2], vec![6, 1]));
        assert_eq!(layout(&launch.outputs[0]), (vec![4, 2], vec![6, 1]));
    }
}
