//! The CUDA backend: device buffers as boxes of row-major allocations, a main stream and a
//! pool of streams per rank, events placed by the evaluator, cuBLASLt for `matmul` and
//! `linear`, generated NVRTC kernels for kernel segments, and GPU-side spans from CUDA
//! events for the timeline.
//!
//! Errors of enqueued work surface when the host waits ([`Backend::synchronize`],
//! [`Backend::download`]); every host wait polls with the backend's timeout and an optional
//! check of the communicator's asynchronous errors, so a hung collective ends in an error
//! naming what was waited for instead of a hang.
//!
//! [`Replay`] captures one run of a program as a CUDA graph and launches it again with one
//! call: how repeated runs are timed.

pub mod codegen;
mod emit;
mod expr;
mod reduce;
mod replay;
mod timer;

pub use reduce::BlockSums;
pub use replay::Replay;
pub use timer::{time_back_to_back, IN_FLIGHT};

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use weave_comm::nccl::DeviceBuffer;
use weave_comm::DataType;
use weave_cuda::cudarc::driver::CudaEvent;
use weave_cuda::{
    wait_event, CudaError, DeviceMemory, GemmOperands, GemmShape, GemmType, Gpu, GpuStream,
    Priority,
};
use weave_host_ir::KernelId;
use weave_ir::{DType, Fusion};

use crate::backend::{Backend, Region, Span, StreamKey};
use crate::cpu::data_type;
use crate::dense::Dense;
use crate::error::ExecError;
use codegen::{Buf, KernelPlan, TensorArg};

/// How a [`CudaBackend`] behaves.
#[derive(Clone, Debug)]
pub struct CudaOptions {
    /// How long the host waits for the device before failing.
    pub timeout: Duration,
    /// Record GPU-side spans (two timing events per operation).
    pub trace: bool,
    /// Allow TF32 for f32 GEMMs.
    pub tf32: bool,
    /// cuBLASLt SM-count target for GEMMs (0: the whole GPU).
    pub gemm_sm_count: i32,
    /// Give pool streams the highest priority (they carry the communication).
    pub pool_priority_high: bool,
    /// Run compute (GEMMs and generated kernels) in issue order across streams: each waits,
    /// on the GPU, for the one issued before it on another stream. Chunks of a stream loop
    /// then compute one after another while their collectives overlap the next chunk's
    /// compute, instead of every worker stream's GEMM starting at once and sharing the SMs
    /// (which delays the first collective until most of the compute is done).
    pub ordered_compute: bool,
}

impl Default for CudaOptions {
    fn default() -> CudaOptions {
        CudaOptions {
            timeout: Duration::from_secs(60),
            trace: false,
            tf32: false,
            gemm_sm_count: 0,
            pool_priority_high: false,
            ordered_compute: false,
        }
    }
}

/// A tensor on the GPU: a box (one range per axis) of a row-major allocation.
#[derive(Clone)]
pub struct DeviceTensor {
    mem: Arc<DeviceMemory>,
    dtype: DType,
    shape: Arc<Vec<usize>>,
    ranges: Vec<Range<usize>>,
}

impl std::fmt::Debug for DeviceTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceTensor({:?}, {:?} of {:?})",
            self.mem, self.ranges, self.shape
        )
    }
}

use crate::dense::elem_bytes;

fn row_major(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for a in (0..shape.len().saturating_sub(1)).rev() {
        s[a] = s[a + 1] * shape[a + 1];
    }
    s
}

impl DeviceTensor {
    /// The sizes of the box.
    pub fn sizes(&self) -> Vec<usize> {
        self.ranges.iter().map(|r| r.len()).collect()
    }

    /// Element strides of the box's axes.
    pub fn strides(&self) -> Vec<usize> {
        row_major(&self.shape)
    }

    /// Elements in the box.
    pub fn numel(&self) -> usize {
        self.ranges.iter().map(|r| r.len()).product()
    }

    /// Offset of the box's first element, in elements.
    fn offset(&self) -> usize {
        self.ranges
            .iter()
            .zip(row_major(&self.shape))
            .map(|(r, s)| r.start * s)
            .sum()
    }

    /// The device address of the box's first element.
    pub fn ptr(&self) -> u64 {
        self.mem.ptr() + (self.offset() * elem_bytes(self.dtype)) as u64
    }

    /// Whether the box is one contiguous run of the allocation (an empty box is).
    pub fn contiguous(&self) -> bool {
        if self.numel() == 0 {
            return true;
        }
        // From the innermost axis out: full axes, then one partial axis, then axes of one
        // element.
        let mut partial = false;
        for (r, &n) in self.ranges.iter().zip(self.shape.iter()).rev() {
            if partial {
                if r.len() > 1 {
                    return false;
                }
            } else if r.len() != n {
                partial = true;
            }
        }
        true
    }

    /// The box as a row-major matrix of `cols` columns: its row count and the element
    /// distance between rows, when its leading axes merge into uniformly strided rows.
    fn as_matrix(&self, cols: usize) -> Option<(usize, usize)> {
        matrix_of(&self.sizes(), &self.strides(), cols)
    }

    fn arg(&self) -> TensorArg {
        TensorArg {
            dtype: self.dtype,
            sizes: self.sizes(),
            strides: self.strides(),
        }
    }
}

impl DeviceBuffer for DeviceTensor {
    fn device_ptr(&self) -> u64 {
        self.ptr()
    }

    fn len(&self) -> usize {
        self.numel()
    }

    fn data_type(&self) -> DataType {
        data_type(self.dtype)
    }

    fn is_contiguous(&self) -> bool {
        self.contiguous()
    }
}

/// A box of `sizes` with element `strides` as a row-major matrix of `cols` columns: (rows,
/// leading dimension), when its axes merge into uniformly strided rows. Axes of one element
/// do not matter (a GEMM result may carry a trailing `1`).
fn matrix_of(sizes: &[usize], strides: &[usize], cols: usize) -> Option<(usize, usize)> {
    let (sizes, strides): (Vec<usize>, Vec<usize>) = sizes
        .iter()
        .zip(strides)
        .filter(|(n, _)| **n != 1)
        .map(|(n, s)| (*n, *s))
        .unzip();
    let merges = |axes: usize| {
        (0..axes.saturating_sub(1)).all(|a| strides[a] == strides[a + 1] * sizes[a + 1])
    };
    let r = sizes.len();
    if cols == 1 {
        // One column: the rows are every remaining axis.
        if !merges(r) {
            return None;
        }
        return Some((
            sizes.iter().product(),
            strides.last().copied().unwrap_or(1).max(1),
        ));
    }
    if r == 0 || sizes[r - 1] != cols || strides[r - 1] != 1 || !merges(r - 1) {
        return None;
    }
    let rows: usize = sizes[..r - 1].iter().product();
    let ld = if r >= 2 { strides[r - 2] } else { cols };
    Some((rows, ld.max(cols)))
}

/// The rows of a GEMM whose left operand and result do not merge into uniformly strided rows
/// (`[b, t/s, k]`, a stream chunk of the middle axis of `[b, t, k]`): the blocks of rows that
/// do, each posted as one GEMM.
#[derive(Debug, PartialEq)]
struct RowBlocks {
    /// Rows per block.
    rows: usize,
    /// Leading dimensions (element distance between rows) of the left operand and the result.
    lda: usize,
    ldc: usize,
    /// Element offsets of each block in the left operand and the result, from each box start.
    offsets: Vec<(usize, usize)>,
}

/// The row blocks of `a` (`[.., k]`) and `c` (`[.., n]`): see [`split_rows`].
fn row_blocks(a: &DeviceTensor, k: usize, c: &DeviceTensor, n: usize) -> Option<RowBlocks> {
    split_rows((&a.sizes(), &a.strides()), k, (&c.sizes(), &c.strides()), n)
}

/// Splits the leading axes of `a` (sizes and element strides, `[.., k]`) and `c` (`[.., n]`),
/// which must hold the same rows, into outer axes enumerated block by block and the innermost
/// run of axes that merges into uniformly strided rows in both. `None` when their leading axes
/// differ or a last axis is not contiguous.
fn split_rows(
    a: (&[usize], &[usize]),
    k: usize,
    c: (&[usize], &[usize]),
    n: usize,
) -> Option<RowBlocks> {
    // Axes of one element do not step (a GEMM result may carry a trailing `1`).
    let lead = |(sizes, strides): (&[usize], &[usize]), cols: usize| {
        let axes: Vec<(usize, usize)> = sizes
            .iter()
            .zip(strides)
            .map(|(n, s)| (*n, *s))
            .filter(|(n, _)| *n != 1)
            .collect();
        match axes.split_last() {
            Some((&(last, 1), rest)) if last == cols => Some(rest.to_vec()),
            _ if cols == 1 => Some(axes),
            _ => None,
        }
    };
    let (la, lc) = (lead(a, k)?, lead(c, n)?);
    if la.len() != lc.len() || la.iter().zip(&lc).any(|(x, y)| x.0 != y.0) {
        return None;
    }
    let r = la.len();
    if r == 0 {
        return Some(RowBlocks {
            rows: 1,
            lda: k,
            ldc: n,
            offsets: vec![(0, 0)],
        });
    }
    let mut p = r - 1;
    while p > 0 && la[p - 1].1 == la[p].1 * la[p].0 && lc[p - 1].1 == lc[p].1 * lc[p].0 {
        p -= 1;
    }
    let rows = la[p..].iter().map(|x| x.0).product();
    let mut offsets = vec![(0usize, 0usize)];
    for q in 0..p {
        let (size, sa, sc) = (la[q].0, la[q].1, lc[q].1);
        offsets = offsets
            .iter()
            .flat_map(|&(x, z)| (0..size).map(move |i| (x + i * sa, z + i * sc)))
            .collect();
    }
    Some(RowBlocks {
        rows,
        lda: la[r - 1].1.max(k),
        ldc: lc[r - 1].1.max(n),
        offsets,
    })
}

/// A box of a row-major allocation as 2-D copies: `height` rows of `width` contiguous
/// elements, `pitch` elements apart, starting at each of `offsets` (elements from the box's
/// first element), in the row-major order of the box.
#[derive(Debug, PartialEq)]
struct BoxRows {
    width: usize,
    height: usize,
    pitch: usize,
    offsets: Vec<usize>,
}

impl BoxRows {
    fn of(sizes: &[usize], strides: &[usize]) -> BoxRows {
        // Axes of one element do not step.
        let axes: Vec<(usize, usize)> = sizes
            .iter()
            .zip(strides)
            .map(|(n, s)| (*n, *s))
            .filter(|(n, _)| *n != 1)
            .collect();
        let r = axes.len();
        if r == 0 || axes.iter().any(|a| a.0 == 0) {
            let n = usize::from(r == 0);
            return BoxRows {
                width: n,
                height: n,
                pitch: n,
                offsets: vec![0],
            };
        }
        // The innermost run of axes that is one contiguous run of elements.
        let mut a = r;
        if axes[r - 1].1 == 1 {
            a = r - 1;
            while a > 0 && axes[a - 1].1 == axes[a].1 * axes[a].0 {
                a -= 1;
            }
        }
        let width: usize = axes[a..].iter().map(|x| x.0).product();
        // The axis outside it gives the rows of one 2-D copy; the rest are enumerated.
        let (height, pitch, outer) = if a == 0 {
            (1, width, 0)
        } else {
            (axes[a - 1].0, axes[a - 1].1, a - 1)
        };
        let mut offsets = vec![0usize];
        for &(n, st) in &axes[..outer] {
            offsets = offsets
                .iter()
                .flat_map(|&o| (0..n).map(move |i| o + i * st))
                .collect();
        }
        BoxRows {
            width,
            height,
            pitch,
            offsets,
        }
    }
}

/// An event placed by the evaluator; `None` when recording failed (the failure is reported at
/// the next host wait).
pub type GpuEvent = Option<Arc<CudaEvent>>;

struct PendingSpan {
    stream: StreamKey,
    label: String,
    start: CudaEvent,
    end: CudaEvent,
}

/// A check the backend runs while the host waits: the communicator's asynchronous error.
pub type ErrorCheck = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// A kernel segment's plans are specific to its operands' layouts.
/// A kernel segment (by the address of its fusion, which the plan keeps alive so that the
/// address is never another fusion's), on buffers of these layouts.
type PlanKey = (usize, KernelId, Vec<TensorArg>, Vec<TensorArg>);

/// A kernel segment's plan for one layout, with each launch's kernel (and fallback) once
/// loaded, so that a launch does not look its source up again.
struct Planned {
    _fusion: Arc<Fusion>,
    plan: KernelPlan,
    loaded: Vec<[std::sync::OnceLock<Arc<weave_cuda::Kernel>>; 2]>,
}

/// Launches the kernels of `planned` on `stream`, their buffers at `address` (each kernel's
/// variant chosen by the addresses' alignment, loaded on first use).
fn launch_planned(
    gpu: &Gpu,
    planned: &Planned,
    address: &dyn Fn(&Buf) -> u64,
    stream: &GpuStream,
    sms: usize,
) -> Result<(), ExecError> {
    for (l, loaded) in planned.plan.launches.iter().zip(&planned.loaded) {
        let addresses: Vec<u64> = l.args.iter().map(address).collect();
        let chosen = l.for_addresses(&addresses);
        let slot = &loaded[usize::from(!std::ptr::eq(chosen, l))];
        let Some((grid, block)) = chosen.grid.dims(sms) else {
            continue;
        };
        let k = match slot.get() {
            Some(k) => k.clone(),
            None => {
                let k = gpu.kernel(&chosen.name, &chosen.source)?;
                let _ = slot.set(k.clone());
                k
            }
        };
        let args: Vec<u64> = chosen.args.iter().map(address).collect();
        gpu.launch(stream, &k, grid, block, &args)?;
    }
    Ok(())
}

/// One rank's GPU.
pub struct CudaBackend {
    gpu: Gpu,
    options: CudaOptions,
    streams: Mutex<BTreeMap<StreamKey, GpuStream>>,
    error: Mutex<Option<ExecError>>,
    check: Mutex<Option<ErrorCheck>>,
    plans: Mutex<HashMap<PlanKey, Arc<Planned>>>,
    spans: Mutex<Vec<PendingSpan>>,
    origin: Mutex<Option<CudaEvent>>,
    allocations: Mutex<Vec<std::sync::Weak<DeviceMemory>>>,
    /// With [`CudaOptions::ordered_compute`]: the stream (as an address) and completion
    /// event of the last compute operation issued.
    last_compute: Mutex<Option<(usize, Arc<CudaEvent>)>>,
    /// Events for [`Backend::record_event`], reused once nothing else holds them.
    events: Mutex<Vec<Arc<CudaEvent>>>,
}

/// The most events a backend keeps for reuse.
const EVENT_POOL: usize = 256;

impl CudaBackend {
    /// A backend on `gpu`.
    pub fn new(gpu: Gpu, options: CudaOptions) -> Result<CudaBackend, ExecError> {
        gpu.bind()?;
        let backend = CudaBackend {
            gpu,
            options,
            streams: Mutex::new(BTreeMap::new()),
            error: Mutex::new(None),
            check: Mutex::new(None),
            plans: Mutex::new(HashMap::new()),
            spans: Mutex::new(Vec::new()),
            origin: Mutex::new(None),
            allocations: Mutex::new(Vec::new()),
            last_compute: Mutex::new(None),
            events: Mutex::new(Vec::new()),
        };
        backend.stream(StreamKey::Main)?;
        Ok(backend)
    }

    /// The GPU.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Sets the check that host waits poll (the communicator's asynchronous error).
    pub fn set_error_check(&self, check: ErrorCheck) {
        *self.check.lock().unwrap() = Some(check);
    }

    /// Forgets the last compute operation of [`CudaOptions::ordered_compute`], so the next
    /// one waits for nothing issued before (call it before capturing a graph, which must not
    /// wait for events recorded outside it).
    pub fn reset_compute_order(&self) {
        *self.last_compute.lock().unwrap() = None;
    }

    /// Enqueues the compute operation `enqueue` on `stream`, after the previous one when
    /// compute is ordered.
    fn compute<R>(
        &self,
        stream: &GpuStream,
        enqueue: impl FnOnce() -> Result<R, ExecError>,
    ) -> Result<R, ExecError> {
        if !self.options.ordered_compute {
            return enqueue();
        }
        let mut last = self.last_compute.lock().unwrap();
        let here = stream.cu_stream() as usize;
        if let Some((s, event)) = last.as_ref() {
            if *s != here {
                stream.wait(event)?;
            }
        }
        let r = enqueue()?;
        let event = self.gpu.new_event(false)?;
        stream.record(&event)?;
        *last = Some((here, Arc::new(event)));
        Ok(r)
    }

    /// Starts (or restarts) recording spans: later spans are timed from this point.
    pub fn start_trace(&self) -> Result<(), ExecError> {
        let main = self.stream(StreamKey::Main)?;
        let origin = self.gpu.new_event(true)?;
        main.record(&origin)?;
        *self.origin.lock().unwrap() = Some(origin);
        self.spans.lock().unwrap().clear();
        Ok(())
    }

    /// A row-major `dtype` buffer of `sizes` in `mem`, memory that somebody else allocated
    /// and owns ([`Gpu::borrow`]: a PyTorch tensor's storage): no copy. `mem` must be on
    /// this backend's GPU and hold at least the buffer's bytes.
    pub fn adopt(
        &self,
        mem: Arc<DeviceMemory>,
        dtype: DType,
        sizes: &[usize],
    ) -> Result<DeviceTensor, ExecError> {
        let bytes = sizes
            .iter()
            .try_fold(1usize, |a, s| a.checked_mul(*s))
            .and_then(|n| n.checked_mul(elem_bytes(dtype)))
            .ok_or_else(|| ExecError::Input(format!("sizes {sizes:?} overflow")))?;
        if mem.gpu().ordinal() != self.gpu.ordinal() {
            return Err(ExecError::Input(format!(
                "a buffer on GPU {} given to a run on GPU {}",
                mem.gpu().ordinal(),
                self.gpu.ordinal()
            )));
        }
        if mem.bytes() < bytes || (mem.ptr() == 0 && bytes > 0) {
            return Err(ExecError::Input(format!(
                "a {dtype} buffer of sizes {sizes:?} needs {bytes} bytes; {} were given at {:#x}",
                mem.bytes(),
                mem.ptr()
            )));
        }
        Ok(DeviceTensor {
            mem,
            dtype,
            shape: Arc::new(sizes.to_vec()),
            ranges: sizes.iter().map(|&s| 0..s).collect(),
        })
    }

    /// An event to record: one of the pool that nobody holds any more (so nothing can still
    /// wait on its earlier record; a stream that waited on it has already taken that
    /// record), else a new one, kept in the pool while it has room. Creating an event costs
    /// more host time than recording one, and a chunked run records a few per chunk.
    fn pooled_event(&self) -> Result<Arc<CudaEvent>, CudaError> {
        let mut pool = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = pool.iter().find(|e| Arc::strong_count(e) == 1) {
            return Ok(e.clone());
        }
        let e = Arc::new(self.gpu.new_event(false)?);
        if pool.len() < EVENT_POOL {
            pool.push(e.clone());
        }
        Ok(e)
    }

    /// A buffer of `sizes` on the GPU, filled from nothing (uninitialised).
    pub fn empty(&self, dtype: DType, sizes: &[usize]) -> Result<DeviceTensor, ExecError> {
        let main = self.stream(StreamKey::Main)?;
        self.allocate(dtype, sizes, false, &main)
    }

    fn fail(&self, e: ExecError) {
        let mut slot = self.error.lock().unwrap();
        if slot.is_none() {
            *slot = Some(e);
        }
    }

    fn take_error(&self) -> Result<(), ExecError> {
        match self.error.lock().unwrap().clone() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Blocks until `stream`'s work so far is done, polling the error check.
    fn wait_stream(&self, stream: &GpuStream, what: &str) -> Result<(), ExecError> {
        let event = self.gpu.new_event(false)?;
        stream.record(&event)?;
        self.wait_recorded(&event, what)
    }

    /// Blocks until `event` (recorded) has happened, for at most the backend's timeout,
    /// polling the error check (a failed collective ends the wait with its error).
    pub fn wait_recorded(&self, event: &CudaEvent, what: &str) -> Result<(), ExecError> {
        let check = self.check.lock().unwrap().clone();
        let timeout = self.options.timeout;
        wait_event(event, timeout, || {
            check.as_ref().and_then(|c| c()).map(|m| CudaError::Driver {
                call: "communicator",
                message: m,
            })
        })
        .map_err(|e| match e {
            CudaError::Timeout { waited } => ExecError::Timeout {
                what: format!("{what}: the GPU work did not finish"),
                millis: waited.as_millis() as u64,
            },
            CudaError::Driver {
                call: "communicator",
                message,
            } => ExecError::Compute {
                stmt: what.to_string(),
                message: format!("the communicator failed: {message}"),
            },
            e => ExecError::Cuda(e),
        })
    }

    fn key_of(&self, stream: &GpuStream) -> StreamKey {
        let streams = self.streams.lock().unwrap();
        streams
            .iter()
            .find(|(_, s)| s.cu_stream() == stream.cu_stream())
            .map(|(k, _)| *k)
            .unwrap_or(StreamKey::Main)
    }

    /// Runs `enqueue` on `stream`, timed when tracing.
    fn timed<R>(
        &self,
        stream: &GpuStream,
        label: &str,
        enqueue: impl FnOnce() -> Result<R, ExecError>,
    ) -> Result<R, ExecError> {
        if !self.options.trace {
            return enqueue();
        }
        let start = self.gpu.new_event(true)?;
        stream.record(&start)?;
        let r = enqueue()?;
        let end = self.gpu.new_event(true)?;
        stream.record(&end)?;
        self.spans.lock().unwrap().push(PendingSpan {
            stream: self.key_of(stream),
            label: label.to_string(),
            start,
            end,
        });
        Ok(r)
    }

    fn gemm_type(&self, d: DType, label: &str) -> Result<GemmType, ExecError> {
        match d {
            DType::BF16 => Ok(GemmType::Bf16),
            DType::F16 => Ok(GemmType::F16),
            DType::F32 => Ok(GemmType::F32),
            DType::F64 => Ok(GemmType::F64),
            other => Err(ExecError::Compute {
                stmt: label.to_string(),
                message: format!("GEMMs of {other} tensors are not supported on the GPU"),
            }),
        }
    }

    /// Enqueues `c[.., m, n] = a[.., m, k] · b[.., k, n] (+ bias[n])` where `bt` says that
    /// `b` is given as `[.., n, k]` (linear's weight).
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        label: &str,
        a: &DeviceTensor,
        b: &DeviceTensor,
        bt: bool,
        bias: Option<&DeviceTensor>,
        c: &DeviceTensor,
        stream: &GpuStream,
    ) -> Result<(), ExecError> {
        let err = |m: String| ExecError::Compute {
            stmt: label.to_string(),
            message: m,
        };
        if a.dtype != b.dtype || a.dtype != c.dtype {
            return Err(err(format!(
                "operand types differ: {} x {} -> {}",
                a.dtype, b.dtype, c.dtype
            )));
        }
        let dtype = self.gemm_type(a.dtype, label)?;
        let (asz, bsz) = (a.sizes(), b.sizes());
        // `linear` takes a rank-1 input; `matmul` needs rank 2 or more on both sides.
        let a_ok = if bt { !asz.is_empty() } else { asz.len() >= 2 };
        if !a_ok || bsz.len() < 2 {
            return Err(err(format!("operands of sizes {asz:?} and {bsz:?}")));
        }
        let k = asz[asz.len() - 1];
        let (kb, n) = if bt {
            (bsz[bsz.len() - 1], bsz[bsz.len() - 2])
        } else {
            (bsz[bsz.len() - 2], bsz[bsz.len() - 1])
        };
        if k != kb {
            return Err(err(format!("contraction sizes differ: {asz:?} x {bsz:?}")));
        }
        // The empty last chunk of an axis that the stream chunks do not divide: nothing to
        // compute, and cuBLASLt takes no zero-sized matrices.
        if c.numel() == 0 {
            return Ok(());
        }
        // Each operand as a row-major matrix: (rows, leading dimension).
        let strided = |t: &DeviceTensor, cols: usize, what: &str| {
            t.as_matrix(cols).ok_or_else(|| {
                err(format!(
                    "the {what} (sizes {:?} in an allocation of {:?}) is not a matrix of \
                     uniformly strided rows",
                    t.sizes(),
                    t.shape
                ))
            })
        };
        let a_rows = a.numel() / k.max(1);
        let c_rows = c.numel() / n.max(1);
        let bias_ptr = match bias {
            Some(t) if t.numel() == n && t.contiguous() && t.dtype == a.dtype => t.ptr(),
            Some(t) => {
                return Err(err(format!(
                    "the bias has sizes {:?}, expected [{n}] of {}",
                    t.sizes(),
                    a.dtype
                )))
            }
            None => 0,
        };
        // `linear`'s weight and a rank-2 `b` apply to every row of `a`: one GEMM over all of
        // `a`'s rows. Otherwise the batch axes broadcast numpy-style, and the GEMM runs as
        // strided batches (a stride of 0 for a broadcast operand).
        let (a_batch, b_batch) = if bt {
            (Vec::new(), Vec::new())
        } else {
            (asz[..asz.len() - 2].to_vec(), bsz[..bsz.len() - 2].to_vec())
        };
        let out_batch = crate::interp::broadcast_shapes(&[&a_batch, &b_batch]).map_err(|_| {
            err(format!(
                "batch sizes of {asz:?} and {bsz:?} do not broadcast"
            ))
        })?;
        let batches: usize = out_batch.iter().product();
        let flat =
            b_batch.iter().product::<usize>() <= 1 && a_batch.iter().product::<usize>() == batches;
        let (plan, m, lda_rm, ldb_rm, ldc_rm) = if flat {
            let (_, ldb) = strided(b, if bt { k } else { n }, "right operand")?;
            match (a.as_matrix(k), c.as_matrix(n)) {
                (Some((_, lda)), Some((_, ldc))) => (BatchPlan::single(), a_rows, lda, ldb, ldc),
                // A stream chunk of a middle axis (`[b, t/s, k]` in `[b, t, k]`): the rows
                // are blocks of uniformly strided rows, one GEMM per block.
                (a_mat, _) => {
                    let blocks = row_blocks(a, k, c, n).ok_or_else(|| {
                        let (what, bad) = if a_mat.is_none() {
                            ("left operand", a)
                        } else {
                            ("result", c)
                        };
                        err(format!(
                            "the {what} (sizes {:?} in an allocation of {:?}) is not made of \
                             blocks of uniformly strided rows",
                            bad.sizes(),
                            bad.shape
                        ))
                    })?;
                    let plan = BatchPlan {
                        count: 1,
                        stride: (0, 0, 0),
                        offsets: blocks.offsets.iter().map(|&(oa, oc)| (oa, 0, oc)).collect(),
                    };
                    (plan, blocks.rows, blocks.lda, ldb, blocks.ldc)
                }
            }
        } else {
            // Each operand a batch of row-major matrices: its last two axes a matrix of
            // uniformly strided rows, its batch axes stepping by the allocation's strides (a
            // stream chunk of a middle axis, `[h, t/s, d]` in `[h, t, d]`, is one).
            let batched = |t: &DeviceTensor, cols: usize, what: &str| {
                let (sz, st) = (t.sizes(), t.strides());
                let r = sz.len();
                matrix_of(&sz[r - 2..], &st[r - 2..], cols)
                    .map(|(_, ld)| (ld, sz[..r - 2].to_vec(), st[..r - 2].to_vec()))
                    .ok_or_else(|| {
                        err(format!(
                            "the {what} (sizes {sz:?} in an allocation of {:?}) is not a batch \
                             of matrices of uniformly strided rows",
                            t.shape
                        ))
                    })
            };
            let m = asz[asz.len() - 2];
            let (lda, a_sizes, a_steps) = batched(a, k, "left operand")?;
            let (ldb, b_sizes, b_steps) = batched(b, n, "right operand")?;
            let (ldc, c_sizes, c_steps) = batched(c, n, "result")?;
            if c_sizes != out_batch {
                return Err(err(format!(
                    "the result buffer has batch sizes {c_sizes:?}, expected {out_batch:?}"
                )));
            }
            let plan = BatchPlan::strided(
                (&a_sizes, &a_steps),
                (&b_sizes, &b_steps),
                (&c_sizes, &c_steps),
            );
            (plan, m, lda, ldb, ldc)
        };
        let c_want = if flat {
            m * plan.offsets.len()
        } else {
            batches * m
        };
        if c_rows != c_want {
            return Err(err(format!(
                "the result buffer has sizes {:?}, expected {c_want} rows of {n}",
                c.sizes(),
            )));
        }
        let Ok(batch) = i32::try_from(plan.count) else {
            return Err(err(format!(
                "{} batches in one GEMM exceed what cuBLASLt takes",
                plan.count
            )));
        };
        if m == 0 || n == 0 || batches == 0 {
            return Ok(());
        }
        // Row-major C[m, n] = A[m, k] B[k, n] is column-major C'[n, m] = B'[n, k] A'[k, m].
        let shape = GemmShape {
            dtype,
            m: n as u64,
            n: m as u64,
            k: k as u64,
            transa: bt,
            transb: false,
            lda: ldb_rm as i64,
            ldb: lda_rm as i64,
            ldd: ldc_rm as i64,
            batch,
            stride_a: plan.stride.1 as i64,
            stride_b: plan.stride.0 as i64,
            stride_d: plan.stride.2 as i64,
            bias: bias.is_some(),
            tf32: self.options.tf32,
            sm_count: self.options.gemm_sm_count,
        };
        if k == 0 {
            return self
                .gpu
                .zero(c.ptr(), c.numel() * elem_bytes(c.dtype), stream)
                .map_err(ExecError::from);
        }
        let bytes = elem_bytes(a.dtype) as u64;
        self.compute(stream, || {
            self.timed(stream, label, || {
                for (oa, ob, oc) in &plan.offsets {
                    let ops = GemmOperands {
                        a: b.ptr() + *ob as u64 * bytes,
                        b: a.ptr() + *oa as u64 * bytes,
                        d: c.ptr() + *oc as u64 * bytes,
                        bias: bias_ptr,
                    };
                    self.gpu
                        .gemm(stream, &shape, ops)
                        .map_err(ExecError::from)?;
                }
                Ok(())
            })
        })
    }
}

/// How a GEMM with numpy-broadcast batch axes runs as cuBLASLt strided batches: `count`
/// problems `stride` elements apart per operand `(a, b, c)` (0 for an operand that the
/// batches broadcast), posted once per entry of `offsets` (element offsets of the first
/// problem). Batch axes whose operands all step uniformly merge into one strided batch; the
/// others become separate posts.
#[derive(Debug, PartialEq, Eq)]
struct BatchPlan {
    count: usize,
    stride: (usize, usize, usize),
    offsets: Vec<(usize, usize, usize)>,
}

impl BatchPlan {
    /// One problem.
    fn single() -> BatchPlan {
        BatchPlan {
            count: 1,
            stride: (0, 0, 0),
            offsets: vec![(0, 0, 0)],
        }
    }

    /// The plan for contiguous operands with batch sizes `a`, `b` broadcast to `out`, and
    /// matrices of `mats = (m·k, k·n, m·n)` elements.
    #[cfg(test)]
    fn new(a: &[usize], b: &[usize], out: &[usize], mats: (usize, usize, usize)) -> BatchPlan {
        let packed = |sizes: &[usize], mat: usize| {
            let mut st = vec![0usize; sizes.len()];
            let mut run = mat;
            for k in (0..sizes.len()).rev() {
                st[k] = run;
                run *= sizes[k];
            }
            st
        };
        BatchPlan::strided(
            (a, &packed(a, mats.0)),
            (b, &packed(b, mats.1)),
            (out, &packed(out, mats.2)),
        )
    }

    /// The plan for operands whose batch axes have sizes and element strides `(a, sa)`,
    /// `(b, sb)` (broadcast to `out`) and `(out, sc)` for the result: a stream chunk of a
    /// batched tensor steps by its allocation's strides, not by its own matrices' size.
    fn strided(
        (a, sa): (&[usize], &[usize]),
        (b, sb): (&[usize], &[usize]),
        (out, sc): (&[usize], &[usize]),
    ) -> BatchPlan {
        // Per output batch axis: its size and each operand's element stride (0 where the
        // operand is missing the axis or has size 1 there).
        let strides = |sizes: &[usize], steps: &[usize]| {
            let off = out.len() - sizes.len();
            let mut st = vec![0usize; out.len()];
            for k in 0..sizes.len() {
                if sizes[k] != 1 {
                    st[k + off] = steps[k];
                }
            }
            st
        };
        let (sa, sb, sc) = (strides(a, sa), strides(b, sb), strides(out, sc));
        // Axes of size 1 do not step; merge an axis into the one inside it when every operand
        // steps across the pair uniformly.
        let mut axes: Vec<(usize, [usize; 3])> = Vec::new();
        for k in 0..out.len() {
            if out[k] != 1 {
                axes.push((out[k], [sa[k], sb[k], sc[k]]));
            }
        }
        let mut merged: Vec<(usize, [usize; 3])> = Vec::new();
        for (n, st) in axes.into_iter().rev() {
            match merged.last_mut() {
                Some((ni, si)) if (0..3).all(|o| st[o] == si[o] * *ni) => *ni *= n,
                _ => merged.push((n, st)),
            }
        }
        // `merged` runs inner to outer: the innermost is the strided batch, the rest are posts.
        let Some(&(count, inner)) = merged.first() else {
            return BatchPlan::single();
        };
        let mut offsets = vec![(0usize, 0usize, 0usize)];
        for &(n, st) in merged.iter().skip(1).rev() {
            offsets = offsets
                .iter()
                .flat_map(|&(x, y, z)| {
                    (0..n).map(move |i| (x + i * st[0], y + i * st[1], z + i * st[2]))
                })
                .collect();
        }
        BatchPlan {
            count,
            stride: (inner[0], inner[1], inner[2]),
            offsets,
        }
    }
}

impl Backend for CudaBackend {
    type Buffer = DeviceTensor;
    type Stream = GpuStream;
    type Event = GpuEvent;
    type CommStream = GpuStream;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn stream(&self, key: StreamKey) -> Result<GpuStream, ExecError> {
        let mut streams = self.streams.lock().unwrap();
        if let Some(s) = streams.get(&key) {
            return Ok(s.clone());
        }
        let priority = match key {
            StreamKey::Pool(_) if self.options.pool_priority_high => Priority::High,
            _ => Priority::Normal,
        };
        let s = self.gpu.new_stream(priority)?;
        streams.insert(key, s.clone());
        Ok(s)
    }

    fn comm_stream<'s>(&self, stream: &'s GpuStream) -> &'s GpuStream {
        stream
    }

    fn traced_post<R>(&self, stream: &GpuStream, label: &str, post: impl FnOnce() -> R) -> R {
        if !self.options.trace {
            return post();
        }
        let start = self.gpu.new_event(true).ok();
        if let Some(e) = &start {
            let _ = stream.record(e);
        }
        let r = post();
        let end = self.gpu.new_event(true).ok();
        if let (Some(start), Some(end)) = (start, end) {
            if stream.record(&end).is_ok() {
                self.spans.lock().unwrap().push(PendingSpan {
                    stream: self.key_of(stream),
                    label: label.to_string(),
                    start,
                    end,
                });
            }
        }
        r
    }

    fn record_event(&self, stream: &GpuStream) -> GpuEvent {
        match self
            .pooled_event()
            .and_then(|e| stream.record(&e).map(|()| e))
        {
            Ok(e) => Some(e),
            Err(e) => {
                self.fail(e.into());
                None
            }
        }
    }

    fn wait_event(&self, stream: &GpuStream, event: &GpuEvent, _label: &str) {
        if let Some(e) = event {
            if let Err(e) = stream.wait(e) {
                self.fail(e.into());
            }
        }
    }

    fn allocate(
        &self,
        dtype: DType,
        sizes: &[usize],
        zero: bool,
        stream: &GpuStream,
    ) -> Result<DeviceTensor, ExecError> {
        let n = sizes
            .iter()
            .try_fold(1usize, |a, s| a.checked_mul(*s))
            .and_then(|n| n.checked_mul(elem_bytes(dtype)))
            .ok_or_else(|| ExecError::Program(format!("sizes {sizes:?} overflow")))?;
        if n as u64 >= crate::memory::CHECK_ABOVE_BYTES {
            if let Some(have) = self.gpu.available_bytes() {
                if n as u64 > have {
                    return Err(ExecError::Compute {
                        stmt: "Allocate".into(),
                        message: format!(
                            "a {dtype} buffer of sizes {sizes:?} needs {n} bytes ({}) of device \
                             memory on GPU {}, but only {have} bytes ({}) are available",
                            crate::memory::human(n as u64),
                            self.gpu.ordinal(),
                            crate::memory::human(have)
                        ),
                    });
                }
            }
        }
        let mem = self.gpu.alloc(n, stream)?;
        if zero {
            self.gpu.zero(mem.ptr(), n, stream)?;
        }
        {
            let mut a = self.allocations.lock().unwrap();
            a.retain(|w| w.strong_count() > 0);
            a.push(Arc::downgrade(&mem));
        }
        Ok(DeviceTensor {
            mem,
            dtype,
            shape: Arc::new(sizes.to_vec()),
            ranges: sizes.iter().map(|&s| 0..s).collect(),
        })
    }

    fn zero(&self, buffer: &DeviceTensor, stream: &GpuStream) -> Result<(), ExecError> {
        if !buffer.contiguous() {
            return Err(ExecError::Program(
                "only a whole buffer is zero-filled, not a view".into(),
            ));
        }
        let bytes = buffer.numel() * elem_bytes(buffer.dtype);
        self.gpu.zero(buffer.ptr(), bytes, stream)?;
        Ok(())
    }

    fn deallocate(&self, buffer: DeviceTensor, stream: &GpuStream) {
        if let Err(e) = buffer.mem.free_on(stream) {
            self.fail(e.into());
        }
    }

    fn staging(
        &self,
        buffer: &DeviceTensor,
        stream: &GpuStream,
    ) -> Result<Option<DeviceTensor>, ExecError> {
        if buffer.contiguous() {
            return Ok(None);
        }
        self.allocate(buffer.dtype, &buffer.sizes(), false, stream)
            .map(Some)
    }

    fn copy(
        &self,
        label: &str,
        src: &DeviceTensor,
        dst: &DeviceTensor,
        stream: &GpuStream,
    ) -> Result<(), ExecError> {
        let err = |m: String| ExecError::Compute {
            stmt: label.to_string(),
            message: m,
        };
        if src.dtype != dst.dtype || src.numel() != dst.numel() {
            return Err(err(format!(
                "cannot copy {:?} of {} into {:?} of {}",
                src.sizes(),
                src.dtype,
                dst.sizes(),
                dst.dtype
            )));
        }
        let eb = elem_bytes(src.dtype);
        // The strided side's rows, against runs of the contiguous side.
        let (strided, into_strided) = match (src.contiguous(), dst.contiguous()) {
            (_, true) => (src, false),
            (true, false) => (dst, true),
            (false, false) => {
                return Err(err(format!(
                    "cannot copy between two strided views ({:?} and {:?})",
                    src.sizes(),
                    dst.sizes()
                )))
            }
        };
        let rows = BoxRows::of(&strided.sizes(), &strided.strides());
        let block = rows.width * rows.height;
        self.compute(stream, || {
            for (j, off) in rows.offsets.iter().enumerate() {
                let (view, packed) = (
                    strided.ptr() + (off * eb) as u64,
                    if into_strided { src.ptr() } else { dst.ptr() } + (j * block * eb) as u64,
                );
                let (to, to_pitch, from, from_pitch) = if into_strided {
                    (view, rows.pitch * eb, packed, rows.width * eb)
                } else {
                    (packed, rows.width * eb, view, rows.pitch * eb)
                };
                self.gpu.copy_2d(
                    to,
                    to_pitch,
                    from,
                    from_pitch,
                    rows.width * eb,
                    rows.height,
                    stream,
                )?;
            }
            Ok(())
        })
    }

    fn chunk(
        &self,
        buffer: &DeviceTensor,
        axis: usize,
        chunks: usize,
        index: usize,
    ) -> Result<DeviceTensor, String> {
        let ranges = weave_comm::host::chunk_ranges(&buffer.ranges, axis, chunks, index)?;
        Ok(DeviceTensor {
            ranges,
            ..buffer.clone()
        })
    }

    fn narrow(
        &self,
        buffer: &DeviceTensor,
        axis: usize,
        len: usize,
    ) -> Result<DeviceTensor, String> {
        let ranges = weave_comm::host::narrow_ranges(&buffer.ranges, axis, len)?;
        Ok(DeviceTensor {
            ranges,
            ..buffer.clone()
        })
    }

    fn sizes(&self, buffer: &DeviceTensor) -> Vec<usize> {
        buffer.sizes()
    }

    fn dtype(&self, buffer: &DeviceTensor) -> DType {
        buffer.dtype
    }

    fn region(&self, buffer: &DeviceTensor) -> Region {
        Region {
            allocation: buffer.mem.id(),
            ranges: buffer.ranges.clone(),
        }
    }

    fn launch_kernel(
        &self,
        label: &str,
        kernel: KernelId,
        fusion: &Arc<Fusion>,
        inputs: &[DeviceTensor],
        outputs: &[DeviceTensor],
        stream: &GpuStream,
    ) -> Result<(), ExecError> {
        // A launch on the empty last chunk of an axis that the stream chunks do not divide
        // writes nothing; a grid of zero blocks is not a valid launch.
        if outputs.iter().all(|o| o.numel() == 0) {
            return Ok(());
        }
        // Generated kernels take their buffers as `__restrict__`: an output may share no
        // allocation with an input or another output.
        for (k, o) in outputs.iter().enumerate() {
            let id = o.mem.id();
            if inputs.iter().any(|i| i.mem.id() == id)
                || outputs[k + 1..].iter().any(|p| p.mem.id() == id)
            {
                return Err(ExecError::Compute {
                    stmt: label.to_string(),
                    message: format!(
                        "output {k} of the kernel shares its allocation with another of its \
                         buffers; a kernel's outputs must not overlap its inputs or each other"
                    ),
                });
            }
        }
        let ins: Vec<TensorArg> = inputs.iter().map(DeviceTensor::arg).collect();
        let outs: Vec<TensorArg> = outputs.iter().map(DeviceTensor::arg).collect();
        let key = (Arc::as_ptr(fusion) as usize, kernel, ins, outs);
        let sms = self.gpu.sm_count().max(1) as usize;
        let cached = self.plans.lock().unwrap().get(&key).cloned();
        let planned = match cached {
            Some(p) => p,
            None => {
                let name = format!("weave_kernel_{}", fusion.name);
                let plan = codegen::plan(fusion, &name, &key.2, &key.3, sms).map_err(|m| {
                    ExecError::Compute {
                        stmt: label.to_string(),
                        message: m,
                    }
                })?;
                let loaded = plan.launches.iter().map(|_| Default::default()).collect();
                let p = Arc::new(Planned {
                    _fusion: fusion.clone(),
                    plan,
                    loaded,
                });
                self.plans.lock().unwrap().insert(key, p.clone());
                p
            }
        };
        let plan = &planned.plan;
        let temps: Vec<Arc<DeviceMemory>> = plan
            .temps
            .iter()
            .map(|(d, n)| self.gpu.alloc(n * elem_bytes(*d), stream))
            .collect::<Result<_, _>>()?;
        let address = |b: &Buf| match b {
            Buf::Input(i) => inputs[*i].ptr(),
            Buf::Output(i) => outputs[*i].ptr(),
            Buf::Temp(i) => temps[*i].ptr(),
        };
        self.compute(stream, || {
            self.timed(stream, label, || {
                launch_planned(&self.gpu, &planned, &address, stream, sms)
            })
        })?;
        for t in temps {
            t.free_on(stream)?;
        }
        Ok(())
    }

    fn matmul(
        &self,
        label: &str,
        a: &DeviceTensor,
        b: &DeviceTensor,
        out: &DeviceTensor,
        stream: &GpuStream,
    ) -> Result<(), ExecError> {
        self.gemm(label, a, b, false, None, out, stream)
    }

    fn linear(
        &self,
        label: &str,
        input: &DeviceTensor,
        weight: &DeviceTensor,
        bias: Option<&DeviceTensor>,
        out: &DeviceTensor,
        stream: &GpuStream,
    ) -> Result<(), ExecError> {
        if weight.sizes().len() != 2 {
            return Err(ExecError::Compute {
                stmt: label.to_string(),
                message: format!(
                    "the weight must have rank 2 ([n, k]), got sizes {:?}",
                    weight.sizes()
                ),
            });
        }
        self.gemm(label, input, weight, true, bias, out, stream)
    }

    fn upload(&self, data: &Dense) -> Result<DeviceTensor, ExecError> {
        let t = self.empty(data.dtype, &data.sizes)?;
        let bytes = data.to_le_bytes();
        let main = self.stream(StreamKey::Main)?;
        self.gpu.upload(t.ptr(), &bytes, &main)?;
        Ok(t)
    }

    fn download(&self, buffer: &DeviceTensor, stream: &GpuStream) -> Result<Dense, ExecError> {
        self.wait_stream(stream, "reading the outputs")?;
        self.take_error()?;
        // Copy the whole allocation and cut the box out on the host.
        let full: usize = buffer.shape.iter().product();
        let mut bytes = vec![0u8; full * elem_bytes(buffer.dtype)];
        self.gpu
            .download(&mut bytes, buffer.mem.ptr(), stream, self.options.timeout)?;
        let all = Dense::from_le_bytes(buffer.dtype, vec![full], &bytes)
            .map_err(ExecError::Program)?
            .data;
        let strides = buffer.strides();
        let sizes = buffer.sizes();
        let n = buffer.numel();
        let mut data = Vec::with_capacity(n);
        let mut idx = vec![0usize; sizes.len()];
        for _ in 0..n {
            let off: usize = idx
                .iter()
                .zip(&buffer.ranges)
                .zip(&strides)
                .map(|((i, r), s)| (r.start + i) * s)
                .sum();
            data.push(all[off]);
            for a in (0..sizes.len()).rev() {
                idx[a] += 1;
                if idx[a] < sizes[a] {
                    break;
                }
                idx[a] = 0;
            }
        }
        Ok(Dense {
            dtype: buffer.dtype,
            sizes,
            data,
        })
    }

    fn synchronize(&self) -> Result<(), ExecError> {
        let streams: Vec<(StreamKey, GpuStream)> = self
            .streams
            .lock()
            .unwrap()
            .iter()
            .map(|(k, s)| (*k, s.clone()))
            .collect();
        for (k, s) in &streams {
            self.wait_stream(s, &format!("synchronizing the {k}"))?;
        }
        self.gpu.collect();
        self.take_error()
    }

    fn spans(&self) -> Vec<Span> {
        let origin = self.origin.lock().unwrap();
        let spans = self.spans.lock().unwrap();
        let Some(origin) = origin.as_ref().or(spans.first().map(|s| &s.start)) else {
            return Vec::new();
        };
        // Times count from this rank's first span: GPUs' clocks are not comparable across
        // ranks, and the host work before the first span (input uploads) is not GPU work.
        let mut out: Vec<Span> = spans
            .iter()
            .filter_map(|s| {
                let start = origin.elapsed_ms(&s.start).ok()? as f64 * 1000.0;
                let end = origin.elapsed_ms(&s.end).ok()? as f64 * 1000.0;
                Some(Span {
                    stream: s.stream,
                    label: s.label.clone(),
                    start_us: start,
                    dur_us: (end - start).max(0.0),
                })
            })
            .collect();
        let first = out.iter().map(|s| s.start_us).fold(f64::INFINITY, f64::min);
        if first.is_finite() {
            for s in &mut out {
                s.start_us -= first;
            }
        }
        out
    }

    fn streams(&self) -> Vec<StreamKey> {
        self.streams.lock().unwrap().keys().copied().collect()
    }

    fn live_allocations(&self) -> usize {
        let mut a = self.allocations.lock().unwrap();
        a.retain(|w| w.strong_count() > 0);
        a.len()
    }
}

#[cfg(test)]
mod tests {
    use super::{matrix_of, split_rows, BatchPlan, BoxRows};

    #[test]
    fn strided_boxes_copy_as_rows() {
        // [b = 6, chunk 4 of t = 12, h = 3, 1]: 6 rows of 12 contiguous elements, 36 apart.
        let rows = BoxRows::of(&[6, 4, 3, 1], &[36, 3, 1, 1]);
        assert_eq!((rows.width, rows.height, rows.pitch), (12, 6, 36));
        assert_eq!(rows.offsets, vec![0]);
        // A chunk of the last axis of [2, 3, 8]: rows of 2, 8 apart, one copy per outer index.
        let rows = BoxRows::of(&[2, 3, 2], &[24, 8, 1]);
        assert_eq!((rows.width, rows.height, rows.pitch), (2, 3, 8));
        assert_eq!(rows.offsets, vec![0, 24]);
        // Every element of the box is covered exactly once, in row-major order.
        let covered: Vec<usize> = rows
            .offsets
            .iter()
            .flat_map(|&o| {
                (0..rows.height)
                    .flat_map(move |h| (0..rows.width).map(move |w| o + h * rows.pitch + w))
            })
            .collect();
        let expected: Vec<usize> = (0..2)
            .flat_map(|i| (0..3).flat_map(move |j| (0..2).map(move |k| i * 24 + j * 8 + k)))
            .collect();
        assert_eq!(covered, expected);
        // A contiguous box is one row; an empty one copies nothing.
        let rows = BoxRows::of(&[4, 5], &[5, 1]);
        assert_eq!((rows.width, rows.height, rows.offsets.len()), (20, 1, 1));
        assert_eq!(BoxRows::of(&[0, 5], &[5, 1]).width, 0);
    }

    #[test]
    fn chunks_of_a_middle_axis_are_gemms_per_block_of_rows() {
        // a = [6, 12, 16][:, 4..8, :] and c = [6, 12, 3, 1][:, 4..8, :, :]: 6 blocks of 4 rows.
        let blocks = split_rows(
            (&[6, 4, 16], &[192, 16, 1]),
            16,
            (&[6, 4, 3, 1], &[36, 3, 1, 1]),
            3,
        )
        .unwrap();
        assert_eq!(blocks.rows, 4);
        assert_eq!((blocks.lda, blocks.ldc), (16, 3));
        assert_eq!(
            blocks.offsets,
            (0..6).map(|i| (i * 192, i * 36)).collect::<Vec<_>>()
        );
        // Whole rows merge into one block.
        let one = split_rows(
            (&[6, 12, 16], &[192, 16, 1]),
            16,
            (&[6, 12, 3], &[36, 3, 1]),
            3,
        );
        assert_eq!(one.unwrap().offsets, vec![(0, 0)]);
        // Different rows, or a strided last axis, are no GEMM.
        let rows_differ = split_rows(
            (&[6, 4, 16], &[192, 16, 1]),
            16,
            (&[5, 4, 3], &[12, 3, 1]),
            3,
        );
        assert!(rows_differ.is_none());
        let strided = split_rows(
            (&[6, 4, 16], &[192, 32, 2]),
            16,
            (&[6, 4, 3], &[12, 3, 1]),
            3,
        );
        assert!(strided.is_none());
    }

    /// Runs `a @ b` the way the GPU does under `BatchPlan` (one strided batch of GEMMs per
    /// offset), on the CPU, and compares it with the reference matmul; every result matrix
    /// must be written exactly once.
    fn planned_matmul_matches_the_reference(a_sizes: &[usize], b_sizes: &[usize]) {
        use crate::dense::Dense;
        let (m, k, n) = (2, 3, 2);
        let full = |batch: &[usize], r: usize, c: usize| {
            let mut sz = batch.to_vec();
            sz.extend([r, c]);
            let len: usize = sz.iter().product();
            let data = (0..len).map(|i| ((i * 7) % 5) as f64 - 2.0).collect();
            Dense::new(weave_ir::DType::F64, sz, data).unwrap()
        };
        let (a, b) = (full(a_sizes, m, k), full(b_sizes, k, n));
        let want = crate::interp::matmul_dense(&a, &b).unwrap();
        let out = crate::interp::broadcast_shapes(&[a_sizes, b_sizes]).unwrap();
        let plan = BatchPlan::new(a_sizes, b_sizes, &out, (m * k, k * n, m * n));
        let mut c = vec![f64::NAN; want.data.len()];
        let mut writes = vec![0usize; c.len() / (m * n)];
        for (oa, ob, oc) in &plan.offsets {
            for t in 0..plan.count {
                let (pa, pb, pc) = (
                    oa + t * plan.stride.0,
                    ob + t * plan.stride.1,
                    oc + t * plan.stride.2,
                );
                writes[pc / (m * n)] += 1;
                for i in 0..m {
                    for j in 0..n {
                        c[pc + i * n + j] = (0..k)
                            .map(|p| a.data[pa + i * k + p] * b.data[pb + p * n + j])
                            .sum();
                    }
                }
            }
        }
        assert!(
            writes.iter().all(|w| *w == 1),
            "{a_sizes:?} x {b_sizes:?}: {writes:?}"
        );
        assert_eq!(c, want.data, "{a_sizes:?} x {b_sizes:?}");
    }

    #[test]
    fn planned_batches_compute_the_broadcast_product() {
        for (a, b) in [
            (&[4][..], &[][..]),
            (&[][..], &[4][..]),
            (&[3, 2][..], &[2][..]),
            (&[3, 1][..], &[4][..]),
            (&[3, 1][..], &[1, 4][..]),
            (&[1, 4][..], &[3, 1][..]),
            (&[2, 1, 3][..], &[4, 1][..]),
            (&[2, 3, 4][..], &[2, 3, 4][..]),
            (&[2, 1, 4][..], &[1, 3, 1][..]),
            (&[1, 1][..], &[1][..]),
        ] {
            planned_matmul_matches_the_reference(a, b);
        }
    }

    #[test]
    fn broadcast_batches_become_strided_batches_with_zero_strides() {
        // [4, m, k] x [k, n] written as batched: b is shared (stride 0).
        assert_eq!(
            BatchPlan::new(&[4], &[], &[4], (6, 12, 8)),
            BatchPlan {
                count: 4,
                stride: (6, 0, 8),
                offsets: vec![(0, 0, 0)]
            }
        );
        // [S=3, D=2, m, k] x [D=2, k, n]: b steps with D but not with S, so D is the strided
        // batch and S becomes 3 posts.
        assert_eq!(
            BatchPlan::new(&[3, 2], &[2], &[3, 2], (6, 12, 8)),
            BatchPlan {
                count: 2,
                stride: (6, 12, 8),
                offsets: vec![(0, 0, 0), (12, 0, 16), (24, 0, 32)]
            }
        );
        // [3, 2, m, k] x [1, 2, k, n] (a broadcast axis of size 1) is the same plan.
        assert_eq!(
            BatchPlan::new(&[3, 2], &[1, 2], &[3, 2], (6, 12, 8)),
            BatchPlan::new(&[3, 2], &[2], &[3, 2], (6, 12, 8))
        );
        // Equal batches merge into one strided batch; size-1 axes vanish.
        assert_eq!(
            BatchPlan::new(&[2, 1, 3], &[2, 1, 3], &[2, 1, 3], (6, 12, 8)),
            BatchPlan {
                count: 6,
                stride: (6, 12, 8),
                offsets: vec![(0, 0, 0)]
            }
        );
        // All batch sizes 1: one problem.
        assert_eq!(
            BatchPlan::new(&[1, 1], &[1], &[1, 1], (6, 12, 8)),
            BatchPlan::single()
        );
        // A stream chunk of queries, `[h=4, t/s=2, d=3]` in an allocation `[4, 8, 3]`, times
        // whole keys `[4, 3, 8]`, into a chunk `[4, 2, 8]` of a slot buffer `[4, 4, 8]`: the
        // batches step by the allocations' strides.
        assert_eq!(
            BatchPlan::strided((&[4], &[24]), (&[4], &[24]), (&[4], &[32])),
            BatchPlan {
                count: 4,
                stride: (24, 24, 32),
                offsets: vec![(0, 0, 0)]
            }
        );
        // Heads in groups `[2, 2]` of such chunks merge into one strided batch when they step
        // uniformly, and stay posts when they do not.
        assert_eq!(
            BatchPlan::strided(
                (&[2, 2], &[48, 24]),
                (&[2, 2], &[48, 24]),
                (&[2, 2], &[64, 32])
            )
            .count,
            4
        );
        let posts = BatchPlan::strided(
            (&[2, 2], &[50, 24]),
            (&[2, 2], &[48, 24]),
            (&[2, 2], &[64, 32]),
        );
        assert_eq!((posts.count, posts.offsets.len()), (2, 2));
        assert_eq!(posts.offsets[1], (50, 48, 64));
    }

    #[test]
    fn matrices_of_chunks_ignore_size_one_axes() {
        // A chunk of rows of a [512, 512, 1] buffer (a linear's partial result).
        assert_eq!(
            matrix_of(&[256, 512, 1], &[512, 1, 1], 512),
            Some((256, 512))
        );
        // A chunk of columns: rows keep the allocation's stride.
        assert_eq!(matrix_of(&[8, 4], &[12, 1], 4), Some((8, 12)));
        // Leading axes merge when they are contiguous, not otherwise.
        assert_eq!(matrix_of(&[2, 3, 4], &[12, 4, 1], 4), Some((6, 4)));
        assert_eq!(matrix_of(&[2, 3, 4], &[24, 4, 1], 4), None);
        // One column.
        assert_eq!(matrix_of(&[6, 1], &[1, 1], 1), Some((6, 1)));
        // The last axis is not the columns.
        assert_eq!(matrix_of(&[4, 3], &[3, 1], 4), None);
    }
}
