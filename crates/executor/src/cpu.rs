//! The CPU backend: host-memory buffers, and streams that are real worker threads with FIFO
//! queues and events, so that a program with a missing synchronization really races.
//!
//! Each stream owns one thread that runs its queue in order. An event is a ticket — the
//! number of jobs enqueued on a stream so far — and waiting for it enqueues a job that blocks
//! its own stream (never the host) until the other stream has completed that many jobs, for
//! at most the timeout. A job that fails poisons its stream: later jobs there are skipped,
//! and [`Backend::synchronize`] returns the first error.
//!
//! Memory is stream-ordered as on a GPU: an input's upload runs on the main stream, and an
//! allocation fills its buffer (zeros, or the poison of uninitialised memory) on the
//! allocating stream, so a stream that uses either without synchronizing with that stream
//! can see the poison or lose its write.
//!
//! Compute runs in f64 (the fusion interpreter and `matrixmultiply`'s GEMM) and is rounded to
//! the output's element type when written, as a fused GPU kernel rounds only its outputs.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use weave_comm::host::Storage;
use weave_comm::{DataType, HostView, TaskQueue};
use weave_host_ir::KernelId;
use weave_ir::{DType, Fusion};

use crate::backend::{Backend, Region, Span, StreamKey};
use crate::dense::Dense;
use crate::error::ExecError;
use crate::interp::{self, Precision};

/// How a [`CpuBackend`] behaves.
#[derive(Clone, Debug)]
pub struct CpuOptions {
    /// How long a stream waits for another stream's event, and the host for the streams.
    pub timeout: Duration,
    /// Whether to record a [`Span`] for every job.
    pub trace: bool,
    /// Streams that sleep this long before each of their jobs: a test's way of making an
    /// unsynchronized access lose its race deterministically.
    pub delays: Vec<(StreamKey, Duration)>,
}

impl Default for CpuOptions {
    fn default() -> CpuOptions {
        CpuOptions {
            timeout: Duration::from_secs(60),
            trace: false,
            delays: Vec::new(),
        }
    }
}

/// The element type of the communication layer for an IR element type.
pub fn data_type(dtype: DType) -> DataType {
    match dtype {
        DType::BF16 => DataType::Bf16,
        DType::F16 => DataType::F16,
        DType::F32 => DataType::F32,
        DType::F64 => DataType::F64,
        DType::I64 => DataType::I64,
        DType::Bool => DataType::Bool,
    }
}

/// The IR element type of a communication-layer element type.
pub fn ir_dtype(dtype: DataType) -> DType {
    match dtype {
        DataType::Bf16 => DType::BF16,
        DataType::F16 => DType::F16,
        DataType::F32 => DType::F32,
        DataType::F64 => DType::F64,
        DataType::I64 => DType::I64,
        DataType::Bool => DType::Bool,
    }
}

type Job = Box<dyn FnOnce() -> Result<(), ExecError> + Send>;

struct Progress {
    completed: u64,
    error: Option<ExecError>,
}

/// The most jobs a CPU stream holds queued before the issuing thread waits
/// ([`CpuStream`]'s backpressure).
pub const MAX_QUEUED: u64 = 1024;

struct StreamInner {
    key: StreamKey,
    /// How long the issuing thread waits for room in the queue ([`CpuOptions::timeout`]).
    backpressure: Duration,
    sender: Mutex<Option<Sender<(String, Job)>>>,
    enqueued: AtomicU64,
    progress: Mutex<Progress>,
    done: Condvar,
}

impl StreamInner {
    fn progress(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Blocks until `ticket` jobs have completed, for at most `timeout`.
    fn wait_for(&self, ticket: u64, timeout: Duration) -> bool {
        // A timeout past the end of time waits without a deadline.
        let deadline = Instant::now().checked_add(timeout);
        let mut p = self.progress();
        while p.completed < ticket {
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return false;
            }
            let left = deadline.map_or(timeout, |d| d - now);
            p = self
                .done
                .wait_timeout(p, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }
}

/// A CPU stream: a worker thread running its queue in order.
#[derive(Clone)]
pub struct CpuStream {
    inner: Arc<StreamInner>,
}

impl CpuStream {
    /// Which stream this is.
    pub fn key(&self) -> StreamKey {
        self.inner.key
    }

    fn push(&self, label: String, job: Job) {
        // Backpressure: the issuing thread keeps at most `MAX_QUEUED` jobs ahead of the
        // worker (waiting for at most the stream's timeout), so memory stays bounded and a run
        // that times out or fails leaves little behind to skip. Every job depends only on
        // work issued before it (on any stream or rank), so the oldest unfinished job can
        // always run: the wait cannot deadlock.
        let ticket = self.inner.enqueued.load(Ordering::SeqCst);
        if ticket >= MAX_QUEUED {
            self.inner
                .wait_for(ticket + 1 - MAX_QUEUED, self.inner.backpressure);
        }
        let sender = self.inner.sender.lock().unwrap_or_else(|e| e.into_inner());
        self.inner.enqueued.fetch_add(1, Ordering::SeqCst);
        let sent = sender.as_ref().map(|s| s.send((label, job)));
        if !matches!(sent, Some(Ok(()))) {
            // The worker is gone (the backend is shutting down): count the job as done so
            // that nobody waits for it.
            let mut p = self.inner.progress();
            p.completed += 1;
            p.error.get_or_insert(ExecError::Program(format!(
                "{} was shut down while work was still being queued",
                self.inner.key
            )));
            self.inner.done.notify_all();
        }
    }
}

impl TaskQueue for CpuStream {
    fn enqueue(&self, label: String, task: weave_comm::Task) {
        self.push(label, Box::new(move || task().map_err(ExecError::from)));
    }
}

/// A point in a CPU stream's queue.
pub struct CpuEvent {
    stream: Arc<StreamInner>,
    ticket: u64,
}

/// The CPU backend of one rank.
pub struct CpuBackend {
    options: CpuOptions,
    epoch: Instant,
    streams: Mutex<HashMap<StreamKey, CpuStream>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
    spans: Arc<Mutex<Vec<Span>>>,
    allocations: Mutex<Vec<Weak<Storage>>>,
    /// Set when the backend is dropped: the workers skip what is still queued (a run that
    /// failed or timed out leaves no work running on after it).
    halted: Arc<std::sync::atomic::AtomicBool>,
}

impl CpuBackend {
    /// The same backend timing its spans from `epoch` instead of its creation: the ranks of
    /// one run given one epoch have their spans on one clock (the process's).
    pub fn with_epoch(mut self, epoch: Instant) -> CpuBackend {
        self.epoch = epoch;
        self
    }

    /// A backend with no streams yet; they start on first use.
    pub fn new(options: CpuOptions) -> CpuBackend {
        CpuBackend {
            options,
            epoch: Instant::now(),
            streams: Mutex::new(HashMap::new()),
            workers: Mutex::new(Vec::new()),
            spans: Arc::new(Mutex::new(Vec::new())),
            allocations: Mutex::new(Vec::new()),
            halted: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        }
    }

    fn start_stream(&self, key: StreamKey) -> Result<CpuStream, ExecError> {
        let (tx, rx) = channel::<(String, Job)>();
        let inner = Arc::new(StreamInner {
            key,
            backpressure: self.options.timeout,
            sender: Mutex::new(Some(tx)),
            enqueued: AtomicU64::new(0),
            progress: Mutex::new(Progress {
                completed: 0,
                error: None,
            }),
            done: Condvar::new(),
        });
        let delay = self
            .options
            .delays
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, d)| *d);
        let worker_inner = inner.clone();
        let halted = self.halted.clone();
        let spans = self.options.trace.then(|| self.spans.clone());
        let epoch = self.epoch;
        let name = match key {
            StreamKey::Main => "weave-cpu-main".to_string(),
            StreamKey::Pool(n) => format!("weave-cpu-s{n}"),
        };
        let handle = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                for (label, job) in rx {
                    if let Some(d) = delay {
                        std::thread::sleep(d);
                    }
                    let failed =
                        halted.load(Ordering::SeqCst) || worker_inner.progress().error.is_some();
                    let start = Instant::now();
                    let result = if failed { Ok(()) } else { job() };
                    if let Some(spans) = &spans {
                        let s = Span {
                            stream: key,
                            label,
                            start_us: (start - epoch).as_secs_f64() * 1e6,
                            dur_us: start.elapsed().as_secs_f64() * 1e6,
                        };
                        spans.lock().unwrap_or_else(|e| e.into_inner()).push(s);
                    }
                    let mut p = worker_inner.progress();
                    p.completed += 1;
                    if let Err(e) = result {
                        p.error.get_or_insert(e);
                    }
                    drop(p);
                    worker_inner.done.notify_all();
                }
            })
            .map_err(|e| ExecError::Program(format!("cannot start a thread for {key}: {e}")))?;
        self.workers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(handle);
        Ok(CpuStream { inner })
    }

    fn enqueue_compute(
        &self,
        stream: &CpuStream,
        label: &str,
        job: impl FnOnce() -> Result<(), String> + Send + 'static,
    ) {
        let stmt = label.to_string();
        stream.push(
            label.to_string(),
            Box::new(move || job().map_err(|message| ExecError::Compute { stmt, message })),
        );
    }

    fn all_streams(&self) -> Vec<CpuStream> {
        let mut v: Vec<CpuStream> = self
            .streams
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        v.sort_by_key(|s| s.key());
        v
    }

    /// Blocks the host until `stream` has run everything enqueued so far, then reports the
    /// stream's first error. The host waits longer than any single job may (twice the timeout
    /// and a second), so that a job that gives up reports its own, more precise error first.
    fn wait_idle(&self, stream: &CpuStream) -> Result<(), ExecError> {
        let ticket = stream.inner.enqueued.load(Ordering::SeqCst);
        let patience = self
            .options
            .timeout
            .saturating_mul(2)
            .saturating_add(Duration::from_secs(1));
        if stream.inner.wait_for(ticket, patience) {
            match stream.inner.progress().error.clone() {
                Some(e) => Err(e),
                None => Ok(()),
            }
        } else {
            Err(ExecError::Timeout {
                what: format!("the host waited for {} to finish", stream.key()),
                millis: patience.as_millis() as u64,
            })
        }
    }
}

impl Drop for CpuBackend {
    fn drop(&mut self) {
        // What is still queued is skipped: nobody will read its results.
        self.halted.store(true, Ordering::SeqCst);
        for s in self.all_streams() {
            s.inner
                .sender
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
        }
        let workers = std::mem::take(&mut *self.workers.lock().unwrap_or_else(|e| e.into_inner()));
        for w in workers {
            // A worker blocked in a wait gives up at its timeout; never join forever on one
            // that is stuck past that.
            let _ = w.join();
        }
    }
}

/// Reads a view as a dense tensor.
fn dense_of(view: &HostView) -> Result<Dense, String> {
    Ok(Dense {
        dtype: ir_dtype(view.dtype()),
        sizes: view.sizes(),
        data: view.try_read().map_err(|e| e.to_string())?,
    })
}

/// `value += out` element for element: an accumulating GEMM's partial sum so far (the sizes
/// differ at most by axes of size 1, which leave the order alone).
fn add_what_it_holds(out: &HostView, value: &mut Dense) -> Result<(), String> {
    let sum = out.try_read().map_err(|e| e.to_string())?;
    if sum.len() != value.data.len() {
        return Err(format!(
            "the product has sizes {:?} but the accumulated output has sizes {:?}",
            value.sizes,
            out.sizes()
        ));
    }
    for (v, s) in value.data.iter_mut().zip(sum) {
        *v += s;
    }
    Ok(())
}

/// Writes `value` into `out`, whose sizes may differ from the value's only by axes of
/// size 1 (a reduction's kept axis, a partial result's `rf` axis).
fn store(out: &HostView, value: &Dense, what: &str) -> Result<(), String> {
    let squeeze = |s: &[usize]| s.iter().copied().filter(|&n| n != 1).collect::<Vec<_>>();
    if squeeze(&out.sizes()) != squeeze(&value.sizes) {
        return Err(format!(
            "{what} has sizes {:?} but the preallocated output has sizes {:?}",
            value.sizes,
            out.sizes()
        ));
    }
    out.write(&value.data).map_err(|e| e.to_string())
}

impl Backend for CpuBackend {
    type Buffer = HostView;
    type Stream = CpuStream;
    type Event = CpuEvent;
    type CommStream = dyn TaskQueue;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn stream(&self, key: StreamKey) -> Result<CpuStream, ExecError> {
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = streams.get(&key) {
            return Ok(s.clone());
        }
        let s = self.start_stream(key)?;
        streams.insert(key, s.clone());
        Ok(s)
    }

    fn comm_stream<'s>(&self, stream: &'s CpuStream) -> &'s (dyn TaskQueue + 'static) {
        stream
    }

    fn record_event(&self, stream: &CpuStream) -> CpuEvent {
        CpuEvent {
            stream: stream.inner.clone(),
            ticket: stream.inner.enqueued.load(Ordering::SeqCst),
        }
    }

    fn wait_event(&self, stream: &CpuStream, event: &CpuEvent, label: &str) {
        if Arc::ptr_eq(&stream.inner, &event.stream) {
            return;
        }
        let other = event.stream.clone();
        let ticket = event.ticket;
        let timeout = self.options.timeout;
        let what = format!(
            "`{label}`: {} waited for {}",
            stream.key(),
            event.stream.key
        );
        stream.push(
            label.to_string(),
            Box::new(move || {
                if other.wait_for(ticket, timeout) {
                    Ok(())
                } else {
                    Err(ExecError::Timeout {
                        what,
                        millis: timeout.as_millis() as u64,
                    })
                }
            }),
        );
    }

    fn allocate(
        &self,
        dtype: DType,
        sizes: &[usize],
        zero: bool,
        stream: &CpuStream,
    ) -> Result<HostView, ExecError> {
        let view = crate::memory::allocate_host(
            &format!("a buffer of {dtype}"),
            sizes,
            crate::dense::elem_bytes(dtype),
            || HostView::try_allocate(data_type(dtype), sizes, false).ok(),
        )
        .map_err(|e| ExecError::Compute {
            stmt: "Allocate".into(),
            message: e.to_string(),
        })?;
        let mut allocations = self.allocations.lock().unwrap_or_else(|e| e.into_inner());
        allocations.retain(|w| w.strong_count() > 0);
        allocations.push(Arc::downgrade(view.storage()));
        drop(allocations);
        // A stream-ordered allocation: the memory is the buffer's only once the allocating
        // stream gets here, where it is filled (zeros, or the poison of uninitialised
        // memory), so a stream that uses it without synchronizing really races.
        let v = view.clone();
        let label = if zero { "zero fill" } else { "poison" };
        self.enqueue_compute(stream, label, move || {
            if zero {
                v.fill(0.0);
            } else {
                v.poison();
            }
            Ok(())
        });
        Ok(view)
    }

    fn zero(&self, buffer: &HostView, stream: &CpuStream) -> Result<(), ExecError> {
        let v = buffer.clone();
        self.enqueue_compute(stream, "zero fill", move || {
            v.fill(0.0);
            Ok(())
        });
        Ok(())
    }

    fn deallocate(&self, buffer: HostView, stream: &CpuStream) {
        // Host memory is freed when the last view drops; keep the buffer alive until the
        // stream gets here, as a stream-ordered allocator would.
        stream.push(
            "free".into(),
            Box::new(move || {
                drop(buffer);
                Ok(())
            }),
        );
    }

    fn chunk(
        &self,
        buffer: &HostView,
        axis: usize,
        chunks: usize,
        index: usize,
    ) -> Result<HostView, String> {
        buffer.chunk(axis, chunks, index).map_err(|e| e.to_string())
    }

    fn narrow(&self, buffer: &HostView, axis: usize, len: usize) -> Result<HostView, String> {
        buffer.narrow(axis, len).map_err(|e| e.to_string())
    }

    fn sizes(&self, buffer: &HostView) -> Vec<usize> {
        buffer.sizes()
    }

    fn dtype(&self, buffer: &HostView) -> DType {
        ir_dtype(buffer.dtype())
    }

    fn region(&self, buffer: &HostView) -> Region {
        Region {
            allocation: buffer.storage().id(),
            ranges: buffer.ranges().to_vec(),
        }
    }

    fn launch_kernel(
        &self,
        label: &str,
        _kernel: KernelId,
        fusion: &Arc<Fusion>,
        inputs: &[HostView],
        outputs: &[HostView],
        stream: &CpuStream,
    ) -> Result<(), ExecError> {
        let fusion = fusion.clone();
        let inputs = inputs.to_vec();
        let outputs = outputs.to_vec();
        self.enqueue_compute(stream, label, move || {
            let args: Vec<Dense> = inputs.iter().map(dense_of).collect::<Result<_, _>>()?;
            let results = interp::eval_fusion(&fusion, &args, Precision::RoundOutputs)
                .map_err(|e| e.to_string())?;
            if results.len() != outputs.len() {
                return Err(format!(
                    "the kernel produced {} outputs for {} buffers",
                    results.len(),
                    outputs.len()
                ));
            }
            for (k, (out, value)) in outputs.iter().zip(&results).enumerate() {
                store(out, value, &format!("output {k}"))?;
            }
            Ok(())
        });
        Ok(())
    }

    fn matmul(
        &self,
        label: &str,
        a: &HostView,
        b: &HostView,
        out: &HostView,
        accumulate: bool,
        stream: &CpuStream,
    ) -> Result<(), ExecError> {
        let (a, b, out) = (a.clone(), b.clone(), out.clone());
        self.enqueue_compute(stream, label, move || {
            let mut value =
                interp::matmul_dense(&dense_of(&a)?, &dense_of(&b)?).map_err(|e| e.to_string())?;
            if accumulate {
                add_what_it_holds(&out, &mut value)?;
            }
            store(&out, &value, "the product")
        });
        Ok(())
    }

    fn linear(
        &self,
        label: &str,
        input: &HostView,
        weight: &HostView,
        bias: Option<&HostView>,
        out: &HostView,
        accumulate: bool,
        stream: &CpuStream,
    ) -> Result<(), ExecError> {
        let (x, w, out) = (input.clone(), weight.clone(), out.clone());
        let bias = bias.cloned();
        self.enqueue_compute(stream, label, move || {
            let b = bias.as_ref().map(dense_of).transpose()?;
            let mut value = interp::linear_dense(&dense_of(&x)?, &dense_of(&w)?, b.as_ref())
                .map_err(|e| e.to_string())?;
            if accumulate {
                add_what_it_holds(&out, &mut value)?;
            }
            store(&out, &value, "the product")
        });
        Ok(())
    }

    fn upload(&self, data: &Dense) -> Result<HostView, ExecError> {
        let source = HostView::from_values(data_type(data.dtype), &data.sizes, &data.data)
            .map_err(|e| ExecError::Input(e.to_string()))?;
        // The copy lands in stream order on the main stream, as the CUDA backend's upload
        // does: a pool stream that reads an input before synchronizing with the main stream
        // really races.
        let view = crate::memory::allocate_host(
            &format!("an input of {:?}", data.sizes),
            &data.sizes,
            crate::dense::elem_bytes(data.dtype),
            || HostView::try_allocate(source.dtype(), &data.sizes, false).ok(),
        )
        .map_err(|e| ExecError::Input(e.to_string()))?;
        let v = view.clone();
        let main = self.stream(StreamKey::Main)?;
        self.enqueue_compute(&main, "upload", move || {
            v.write(&source.try_read().map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())
        });
        Ok(view)
    }

    fn download(&self, buffer: &HostView, stream: &CpuStream) -> Result<Dense, ExecError> {
        self.wait_idle(stream)?;
        dense_of(buffer).map_err(ExecError::Input)
    }

    fn synchronize(&self) -> Result<(), ExecError> {
        let streams = self.all_streams();
        for s in &streams {
            self.wait_idle(s)?;
        }
        for s in &streams {
            if let Some(e) = s.inner.progress().error.clone() {
                return Err(e);
            }
        }
        Ok(())
    }

    fn streams(&self) -> Vec<StreamKey> {
        self.all_streams().iter().map(CpuStream::key).collect()
    }

    fn live_allocations(&self) -> usize {
        self.allocations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|w| w.strong_count() > 0)
            .count()
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// A stream whose worker is stuck holds at most `MAX_QUEUED` jobs: the issuing thread
    /// waits for room (so a run that times out leaves at most that much to skip, and memory
    /// stays bounded), and goes on once the worker moves.
    #[test]
    fn the_issuing_thread_waits_when_a_stream_holds_max_queued_jobs() {
        let backend = CpuBackend::new(CpuOptions::default());
        let stream = backend.stream(StreamKey::Main).unwrap();
        let go = Arc::new(AtomicBool::new(false));
        let g = go.clone();
        stream.enqueue(
            "stuck".into(),
            Box::new(move || {
                while !g.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Ok(())
            }),
        );
        let pushed = Arc::new(AtomicU64::new(0));
        let (s, p) = (stream.clone(), pushed.clone());
        let issuer = std::thread::spawn(move || {
            for _ in 0..3 * MAX_QUEUED {
                s.enqueue("job".into(), Box::new(|| Ok(())));
                p.fetch_add(1, Ordering::SeqCst);
            }
        });
        std::thread::sleep(Duration::from_millis(300));
        // The stuck job and MAX_QUEUED - 1 more are queued; the next push waits.
        assert_eq!(pushed.load(Ordering::SeqCst), MAX_QUEUED - 1);
        go.store(true, Ordering::SeqCst);
        issuer.join().unwrap();
        assert_eq!(pushed.load(Ordering::SeqCst), 3 * MAX_QUEUED);
        backend.synchronize().unwrap();
    }

    /// Backends given one epoch time their spans on one clock: a backend made 30 ms after the
    /// epoch times its first job from the epoch (about 30 ms in), where one of its own would
    /// time it from its creation (about 0).
    #[test]
    fn backends_with_one_epoch_share_a_clock() {
        let epoch = Instant::now();
        std::thread::sleep(Duration::from_millis(30));
        let traced = CpuOptions {
            trace: true,
            ..CpuOptions::default()
        };
        let first_start = |backend: CpuBackend| {
            backend
                .stream(StreamKey::Main)
                .unwrap()
                .enqueue("job".into(), Box::new(|| Ok(())));
            backend.synchronize().unwrap();
            backend.spans()[0].start_us
        };
        let shared = first_start(CpuBackend::new(traced.clone()).with_epoch(epoch));
        let own = first_start(CpuBackend::new(traced));
        assert!(shared >= 30_000.0, "{shared} us");
        assert!(own < shared - 25_000.0, "{own} us against {shared} us");
    }
}
