//! The `Backend` interface: what the evaluator asks of a device — buffers, streams, events,
//! kernel segments and GEMMs — independent of whether the device is the CPU or a GPU.

use std::ops::Range;
use std::sync::Arc;

use weave_host_ir::KernelId;
use weave_ir::{DType, Fusion};

use crate::dense::Dense;
use crate::error::ExecError;

/// Which stream a statement runs on: the caller's stream, or a pool stream by index
/// (`Stream ( i0 % numberOfStreams )` evaluates to a pool index).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StreamKey {
    /// The stream that was current when the program started.
    #[default]
    Main,
    /// Pool stream `n`, created on first use.
    Pool(usize),
}

impl std::fmt::Display for StreamKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StreamKey::Main => f.write_str("main stream"),
            StreamKey::Pool(n) => write!(f, "pool stream {n}"),
        }
    }
}

/// The part of a buffer a statement touches, for the race checker: a box of one allocation,
/// one range per axis of the allocation's shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Region {
    /// The allocation, unique for the run.
    pub allocation: u64,
    /// The box.
    pub ranges: Vec<Range<usize>>,
}

impl Region {
    /// Whether the two regions share an element.
    pub fn overlaps(&self, other: &Region) -> bool {
        self.allocation == other.allocation
            && self.ranges.len() == other.ranges.len()
            && self
                .ranges
                .iter()
                .zip(&other.ranges)
                .all(|(a, b)| a.start < b.end && b.start < a.end)
    }
}

/// A span of device work on one stream, for the timeline.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    /// The stream it ran on.
    pub stream: StreamKey,
    /// What ran (the host statement, as printed).
    pub label: String,
    /// Start, in microseconds since the backend was created.
    pub start_us: f64,
    /// Duration in microseconds.
    pub dur_us: f64,
}

/// A device the evaluator can run a host program on.
///
/// Every method that takes a stream only *enqueues* work there; work on different streams
/// is ordered only through [`Backend::record_event`] and [`Backend::wait_event`]. Errors of
/// enqueued work surface at [`Backend::synchronize`].
pub trait Backend: Send + Sync {
    /// A tensor: a buffer or an aliasing view of one.
    type Buffer: Clone + Send + Sync + 'static;
    /// A stream handle.
    type Stream: Clone;
    /// A point in a stream's work.
    type Event;
    /// The stream type the backend's communicator posts on.
    type CommStream: ?Sized;

    /// `cpu`, `cuda`.
    fn name(&self) -> &'static str;

    /// The stream the program starts on.
    fn stream(&self, key: StreamKey) -> Result<Self::Stream, ExecError>;

    /// The communicator's view of `stream`.
    fn comm_stream<'s>(&self, stream: &'s Self::Stream) -> &'s Self::CommStream;

    /// Runs `post`, which enqueues a communication, on the stream a communication issued on
    /// `stream` goes to: by default `stream` itself ([`Backend::comm_stream`]). A backend may
    /// give it a stream of its own that waits, on the device, for everything enqueued on
    /// `stream` so far, and that `stream` then waits for (the CUDA backend's high-priority
    /// communication streams): `stream`'s order is the same either way.
    fn post_comm<R>(&self, stream: &Self::Stream, post: impl FnOnce(&Self::CommStream) -> R) -> R {
        post(self.comm_stream(stream))
    }

    /// Whether [`Backend::traced_post`] records spans (labels are worth making).
    fn tracing(&self) -> bool {
        false
    }

    /// Runs `post`, which enqueues a communication on `stream`, and records the span the
    /// communication takes on the device when the backend traces. Backends whose
    /// communicator reports its own spans (the CPU's task queues) just run `post`.
    fn traced_post<R>(&self, stream: &Self::Stream, label: &str, post: impl FnOnce() -> R) -> R {
        let _ = (stream, label);
        post()
    }

    /// An event marking everything enqueued on `stream` so far.
    fn record_event(&self, stream: &Self::Stream) -> Self::Event;

    /// Makes `stream` wait, without blocking the host, until `event` has happened.
    fn wait_event(&self, stream: &Self::Stream, event: &Self::Event, label: &str);

    /// A fresh buffer; zero-filled (on `stream`) when `zero`.
    fn allocate(
        &self,
        dtype: DType,
        sizes: &[usize],
        zero: bool,
        stream: &Self::Stream,
    ) -> Result<Self::Buffer, ExecError>;

    /// Fills `buffer` with zeros on `stream`: what `allocate(.., zero: true, ..)` does to a
    /// fresh buffer, for a buffer the caller gave (an output written in place).
    fn zero(&self, buffer: &Self::Buffer, stream: &Self::Stream) -> Result<(), ExecError>;

    /// Releases `buffer` once the work enqueued on `stream` so far is done.
    fn deallocate(&self, buffer: Self::Buffer, stream: &Self::Stream);

    /// A contiguous buffer that stands in for `buffer` in a communication, when the backend's
    /// communicator moves contiguous memory only and `buffer` is a strided view (a stream
    /// chunk of an inner axis); `None` when `buffer` can be posted as it is. The evaluator
    /// copies into the stand-in before the post and out of it after, on the posting stream.
    fn staging(
        &self,
        buffer: &Self::Buffer,
        stream: &Self::Stream,
    ) -> Result<Option<Self::Buffer>, ExecError> {
        let _ = (buffer, stream);
        Ok(None)
    }

    /// Copies `src` into `dst` (one size and type) on `stream`; only called for the buffers
    /// [`Backend::staging`] returns.
    fn copy(
        &self,
        label: &str,
        src: &Self::Buffer,
        dst: &Self::Buffer,
        stream: &Self::Stream,
    ) -> Result<(), ExecError> {
        let _ = (src, dst, stream);
        Err(ExecError::Program(format!(
            "`{label}`: the {} backend stages no buffers",
            self.name()
        )))
    }

    /// The `index`-th of `chunks` chunks of `buffer` along `axis`: an aliasing view.
    fn chunk(
        &self,
        buffer: &Self::Buffer,
        axis: usize,
        chunks: usize,
        index: usize,
    ) -> Result<Self::Buffer, String>;

    /// The first `len` elements of `buffer` along `axis`: an aliasing view.
    fn narrow(
        &self,
        buffer: &Self::Buffer,
        axis: usize,
        len: usize,
    ) -> Result<Self::Buffer, String>;

    /// The buffer's sizes.
    fn sizes(&self, buffer: &Self::Buffer) -> Vec<usize>;

    /// The buffer's element type.
    fn dtype(&self, buffer: &Self::Buffer) -> DType;

    /// The region of its allocation that `buffer` covers.
    fn region(&self, buffer: &Self::Buffer) -> Region;

    /// Runs the kernel segment `fusion` (the program's kernel `kernel`) on `stream`. The
    /// fusion is shared so that queuing a launch per chunk copies nothing.
    fn launch_kernel(
        &self,
        label: &str,
        kernel: KernelId,
        fusion: &Arc<Fusion>,
        inputs: &[Self::Buffer],
        outputs: &[Self::Buffer],
        stream: &Self::Stream,
    ) -> Result<(), ExecError>;

    /// `out = a @ b` on `stream`.
    fn matmul(
        &self,
        label: &str,
        a: &Self::Buffer,
        b: &Self::Buffer,
        out: &Self::Buffer,
        accumulate: bool,
        stream: &Self::Stream,
    ) -> Result<(), ExecError>;

    /// `out = input @ weightᵀ (+ bias)` on `stream`; with `accumulate`, `out += input @
    /// weightᵀ (+ bias)`.
    #[allow(clippy::too_many_arguments)]
    fn linear(
        &self,
        label: &str,
        input: &Self::Buffer,
        weight: &Self::Buffer,
        bias: Option<&Self::Buffer>,
        out: &Self::Buffer,
        accumulate: bool,
        stream: &Self::Stream,
    ) -> Result<(), ExecError>;

    /// Whether [`Backend::linear_rows_into`] works and a linear feeding a sum
    /// reduce-scatter or allreduce should be computed by the communicator where it wants
    /// each block ([`weave_comm::Communicator::post_produced`]): a backend option.
    fn produces_into_windows(&self) -> bool {
        false
    }

    /// Rows `rows` of `input @ weightᵀ (+ bias)` (a 2-D input, `[rows, n]` out), written
    /// row-major at device address `at` (this rank's memory or a peer's mapped here), on
    /// `stream`. Only called where [`Backend::produces_into_windows`] is true.
    #[allow(clippy::too_many_arguments)]
    fn linear_rows_into(
        &self,
        label: &str,
        input: &Self::Buffer,
        weight: &Self::Buffer,
        bias: Option<&Self::Buffer>,
        rows: Range<usize>,
        at: u64,
        stream: &Self::Stream,
    ) -> Result<(), ExecError> {
        let _ = (input, weight, bias, rows, at, stream);
        Err(ExecError::Compute {
            stmt: label.to_string(),
            message: format!(
                "the {} backend cannot write a GEMM's rows elsewhere",
                self.name()
            ),
        })
    }

    /// A buffer holding `data`, ready for every stream.
    fn upload(&self, data: &Dense) -> Result<Self::Buffer, ExecError>;

    /// Blocks the host until the work enqueued on `stream` so far is done, then copies
    /// `buffer` out.
    fn download(&self, buffer: &Self::Buffer, stream: &Self::Stream) -> Result<Dense, ExecError>;

    /// Blocks the host until every stream is idle; returns the first error any enqueued work
    /// reported.
    fn synchronize(&self) -> Result<(), ExecError>;

    /// The spans recorded so far (empty unless the backend was asked to trace).
    fn spans(&self) -> Vec<Span>;

    /// The streams created so far (the main stream and every pool stream used).
    fn streams(&self) -> Vec<StreamKey>;

    /// How many buffers made by [`Backend::allocate`] are still alive.
    fn live_allocations(&self) -> usize;
}
