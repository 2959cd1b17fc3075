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
//!
//! Where a buffer's elements lie ([`DeviceTensor`], as matrices for GEMMs and as rows of 2-D
//! copies) is the `layout` module; how `matmul` and `linear` become cuBLASLt strided batches
//! is the `gemm` module. The kernels of kernel segments are weave-codegen's ([`codegen`]),
//! planned before the program runs into the kernel table the backend is given
//! ([`CudaBackend::with_kernels`]): the `launch` module looks each launch's plan up by its
//! segment and layouts, compiles its CUDA C with NVRTC on first use and launches it. The
//! backend plans only its own reductions ([`BlockSums`]).

/// The kernel code generator (the weave-codegen crate), under its path in this crate.
pub use weave_codegen as codegen;

mod gemm;
mod launch;
mod layout;
mod reduce;
mod replay;
mod timer;

pub use layout::DeviceTensor;
pub use reduce::BlockSums;
pub use replay::Replay;
pub use timer::{time_back_to_back, IN_FLIGHT};

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use weave_cuda::cudarc::driver::CudaEvent;
use weave_cuda::{wait_event, CudaError, DeviceMemory, Gpu, GpuStream, Priority};
use weave_host_ir::KernelId;
use weave_ir::{DType, Fusion};

use crate::backend::{Backend, Region, Span, StreamKey};
use crate::dense::{elem_bytes, Dense};
use crate::error::ExecError;
use launch::Planned;
use layout::BoxRows;

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
    /// Post every communication (except a linear's computed into windows) from a stream of
    /// its own, one beside each stream that issues communications, at the highest priority:
    /// it waits for its stream's work so far and its stream waits for it, so the order is
    /// the program's, but a collective's kernels are scheduled ahead of the GEMM blocks other
    /// chunks' streams queue at normal priority ([`Backend::post_comm`]).
    pub comm_priority_high: bool,
    /// Run compute (GEMMs and generated kernels) in issue order across streams: each waits,
    /// on the GPU, for the one issued before it on another stream. Chunks of a stream loop
    /// then compute one after another while their collectives overlap the next chunk's
    /// compute, instead of every worker stream's GEMM starting at once and sharing the SMs
    /// (which delays the first collective until most of the compute is done).
    pub ordered_compute: bool,
    /// A linear whose output only feeds a sum reduce-scatter or allreduce of a copy-engine
    /// communicator is computed by that communicator, block by block, straight into the
    /// peers' receive windows ([`Backend::produces_into_windows`]).
    pub produce_into_windows: bool,
    /// The bytes of a window slot of that communicator (0: unknown): the pieces it has a
    /// linear compute are whole rows that fit one, which the GEMM warm-up of
    /// [`CudaBackend::load_kernels`] launches once each.
    pub produce_slot_bytes: usize,
}

impl Default for CudaOptions {
    fn default() -> CudaOptions {
        CudaOptions {
            timeout: Duration::from_secs(60),
            trace: false,
            tf32: false,
            gemm_sm_count: 0,
            pool_priority_high: false,
            comm_priority_high: false,
            ordered_compute: false,
            produce_into_windows: false,
            produce_slot_bytes: 0,
        }
    }
}

/// An event placed by the evaluator; `None` when recording failed (the failure is reported at
/// the next host wait), or when there is nothing to wait for (a stream outside the capture of
/// [`CudaBackend::set_capturing`]).
pub type GpuEvent = Option<Arc<CudaEvent>>;

struct PendingSpan {
    stream: StreamKey,
    label: String,
    start: CudaEvent,
    end: CudaEvent,
}

/// A check the backend runs while the host waits: the communicator's asynchronous error.
pub type ErrorCheck = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// One rank's GPU.
pub struct CudaBackend {
    gpu: Gpu,
    options: CudaOptions,
    streams: Mutex<BTreeMap<StreamKey, GpuStream>>,
    /// With [`CudaOptions::comm_priority_high`]: the high-priority stream beside each stream
    /// that posts communications.
    comm_streams: Mutex<BTreeMap<StreamKey, GpuStream>>,
    error: Mutex<Option<ExecError>>,
    check: Mutex<Option<ErrorCheck>>,
    /// The kernel table kernel segments are launched from ([`CudaBackend::with_kernels`]).
    kernels: launch::Kernels,
    spans: Mutex<Vec<PendingSpan>>,
    origin: Mutex<Option<CudaEvent>>,
    allocations: Mutex<Vec<std::sync::Weak<DeviceMemory>>>,
    /// With [`CudaOptions::ordered_compute`]: the stream (as an address) and completion
    /// event of the last compute operation issued.
    last_compute: Mutex<Option<(usize, Arc<CudaEvent>)>>,
    /// Events for [`Backend::record_event`], reused once nothing else holds them.
    events: Mutex<Vec<Arc<CudaEvent>>>,
    /// Whether a run is being captured as a CUDA graph ([`CudaBackend::set_capturing`]).
    capturing: std::sync::atomic::AtomicBool,
}

/// The most events a backend keeps for reuse.
const EVENT_POOL: usize = 256;

impl CudaBackend {
    /// A backend on `gpu`, with no kernel table: it runs GEMMs, copies and communications,
    /// and a program's kernel segments once given the program's table
    /// ([`CudaBackend::with_kernels`]).
    pub fn new(gpu: Gpu, options: CudaOptions) -> Result<CudaBackend, ExecError> {
        gpu.bind()?;
        let backend = CudaBackend {
            gpu,
            options,
            streams: Mutex::new(BTreeMap::new()),
            comm_streams: Mutex::new(BTreeMap::new()),
            capturing: std::sync::atomic::AtomicBool::new(false),
            error: Mutex::new(None),
            check: Mutex::new(None),
            kernels: launch::Kernels::none(),
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

    /// Says that a run is (or no longer is) being captured as a CUDA graph, which starts
    /// with every stream idle: while it is, [`Backend::record_event`] on a stream that has
    /// not joined the capture gives no event, since that stream holds no work of the run and
    /// a captured stream must not wait on an event recorded outside the capture (a
    /// `Synchronize` of the pool stream of the previous chunk, in the first chunk of a loop
    /// that adds up across chunks, would invalidate the capture).
    pub fn set_capturing(&self, capturing: bool) {
        self.capturing
            .store(capturing, std::sync::atomic::Ordering::SeqCst);
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
        let bytes = crate::memory::numel(sizes)
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

    /// The high-priority stream beside `stream` that its communications are posted from
    /// ([`CudaOptions::comm_priority_high`]), created on first use.
    fn comm_side(&self, stream: &GpuStream) -> Result<GpuStream, CudaError> {
        let key = self.key_of(stream);
        let mut sides = self.comm_streams.lock().unwrap();
        if let Some(s) = sides.get(&key) {
            return Ok(s.clone());
        }
        let s = self.gpu.new_stream(Priority::High)?;
        sides.insert(key, s.clone());
        Ok(s)
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

    fn post_comm<R>(&self, stream: &GpuStream, post: impl FnOnce(&GpuStream) -> R) -> R {
        if !self.options.comm_priority_high {
            return post(stream);
        }
        // The side stream enters after `stream`'s work so far; `stream` leaves after the
        // side stream's communication. A failure to set the side stream up posts on `stream`
        // itself and is reported at the next host wait.
        let entered = self.comm_side(stream).and_then(|side| {
            let e = self.pooled_event()?;
            stream.record(&e)?;
            side.wait(&e)?;
            Ok(side)
        });
        match entered {
            Ok(side) => {
                let r = post(&side);
                if let Err(e) = self
                    .pooled_event()
                    .and_then(|e| side.record(&e).and_then(|()| stream.wait(&e)))
                {
                    self.fail(e.into());
                }
                r
            }
            Err(e) => {
                self.fail(e.into());
                post(stream)
            }
        }
    }

    fn tracing(&self) -> bool {
        self.options.trace
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
        if self.capturing.load(std::sync::atomic::Ordering::SeqCst) {
            match stream.is_capturing() {
                // Not in the capture: no work of this run to wait for.
                Ok(false) => return None,
                Ok(true) => {}
                Err(e) => {
                    self.fail(e.into());
                    return None;
                }
            }
        }
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
        let n = crate::memory::numel(sizes)
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
        let ranges = weave_comm::host::chunk_ranges(&buffer.ranges, axis, chunks, index)
            .map_err(|e| e.to_string())?;
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
        let ranges = weave_comm::host::narrow_ranges(&buffer.ranges, axis, len)
            .map_err(|e| e.to_string())?;
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
        _kernel: KernelId,
        fusion: &Arc<Fusion>,
        inputs: &[DeviceTensor],
        outputs: &[DeviceTensor],
        stream: &GpuStream,
    ) -> Result<(), ExecError> {
        self.launch_segment(label, fusion, inputs, outputs, stream)
    }

    fn matmul(
        &self,
        label: &str,
        a: &DeviceTensor,
        b: &DeviceTensor,
        out: &DeviceTensor,
        accumulate: bool,
        stream: &GpuStream,
    ) -> Result<(), ExecError> {
        self.gemm(label, a, b, false, None, out, accumulate, stream)
    }

    fn linear(
        &self,
        label: &str,
        input: &DeviceTensor,
        weight: &DeviceTensor,
        bias: Option<&DeviceTensor>,
        out: &DeviceTensor,
        accumulate: bool,
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
        self.gemm(label, input, weight, true, bias, out, accumulate, stream)
    }

    fn produces_into_windows(&self) -> bool {
        self.options.produce_into_windows
    }

    fn linear_rows_into(
        &self,
        label: &str,
        input: &DeviceTensor,
        weight: &DeviceTensor,
        bias: Option<&DeviceTensor>,
        rows: std::ops::Range<usize>,
        at: u64,
        stream: &GpuStream,
    ) -> Result<(), ExecError> {
        let fail = |message: String| ExecError::Compute {
            stmt: label.to_string(),
            message,
        };
        let (sizes, wsizes) = (input.sizes(), weight.sizes());
        if sizes.len() != 2 || wsizes.len() != 2 || rows.end > sizes[0] || rows.start > rows.end {
            return Err(fail(format!(
                "rows {rows:?} of a linear of a {sizes:?} input and a {wsizes:?} weight"
            )));
        }
        let n = wsizes[0];
        let mut part = input.clone();
        let first = part.ranges[0].start;
        part.ranges[0] = first + rows.start..first + rows.end;
        let bytes = rows.len() * n * elem_bytes(input.dtype);
        // SAFETY: `at` is the start of `bytes` bytes of device memory mapped in this GPU's
        // context (a window slot of a peer, or this rank's own buffer) that the
        // communicator keeps allocated until the stream's work on it is done (the
        // contract of `weave_comm::Communicator::post_produced`'s producer).
        #[allow(unsafe_code)]
        let mem = unsafe { self.gpu.borrow(at, bytes) };
        let out = self.adopt(mem, input.dtype, &[rows.len(), n])?;
        self.linear(label, &part, weight, bias, &out, false, stream)
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
            .map_err(|e| ExecError::Program(e.to_string()))?
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
        // Times count from the trace's origin (`start_trace`: the runs of a world record it
        // behind an allgather of every rank, so the ranks' origins coincide), else from this
        // rank's first span: GPUs' clocks are not comparable across ranks.
        let Some(origin) = origin.as_ref().or(spans.first().map(|s| &s.start)) else {
            return Vec::new();
        };
        spans
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
            .collect()
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
