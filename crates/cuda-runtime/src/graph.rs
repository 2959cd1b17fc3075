//! CUDA graphs: a stream's work captured once ([`GpuStream::capture`]) and replayed with one
//! launch ([`CudaGraph::launch`]).
//!
//! Capture runs in relaxed mode, since other threads drive other GPUs meanwhile. Streams
//! other than the capturing one join the capture by waiting on an event recorded in it, and
//! must be joined back (the capturing stream waits on an event recorded in them) before the
//! capture ends. The graph is instantiated with `AUTO_FREE_ON_LAUNCH`: memory allocated
//! inside the capture and not freed in it is freed automatically when the graph is launched
//! again.
#![allow(unsafe_code)]

use cudarc::driver::{sys, DriverError};

use crate::device::{require_driver, Gpu, GpuStream};
use crate::error::{driver, CudaError};

/// The capture mode: relaxed, so that calls made by other threads (driving other GPUs)
/// while this stream captures neither fail nor invalidate the capture.
const CAPTURE_MODE: sys::CUstreamCaptureMode =
    sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;

/// The instantiation flags: allocations the graph makes and does not free are freed when it
/// is launched again, so that it can be replayed any number of times.
const INSTANTIATE_FLAGS: sys::CUgraphInstantiate_flags =
    sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH;

/// A captured and instantiated CUDA graph of one GPU. Destroyed on drop.
pub struct CudaGraph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    gpu: Gpu,
    nodes: usize,
}

// SAFETY: the handles are plain driver objects, usable from any thread once the owning
// context is bound (every use binds it first). `CudaGraph` is not `Sync`: CUDA graph
// objects are not internally synchronized, and `&mut`/ownership serializes their use.
unsafe impl Send for CudaGraph {}

impl std::fmt::Debug for CudaGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CudaGraph(GPU {}, {} nodes)",
            self.gpu.ordinal(),
            self.nodes
        )
    }
}

impl CudaGraph {
    /// Replays the captured work on `stream`, ordered after the work enqueued there so far
    /// and after earlier launches of this graph. `stream` should belong to the graph's GPU.
    pub fn launch(&self, stream: &GpuStream) -> Result<(), CudaError> {
        require_driver()?;
        self.gpu.bind()?;
        let _span = tracing::trace_span!("graph_launch", device = self.gpu.ordinal()).entered();
        // SAFETY: `exec` is a live executable graph (instantiated before `CudaGraph` is
        // handed out, destroyed only on drop) and the stream is alive while borrowed.
        unsafe { sys::cuGraphLaunch(self.exec, stream.cu_stream()) }
            .result()
            .map_err(driver("cuGraphLaunch"))
    }

    /// The number of nodes (kernels, copies, memsets, event records and waits, allocations…)
    /// in the graph.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// The GPU whose context the graph belongs to.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Instantiates the captured graph and counts its nodes.
    fn instantiate(&mut self) -> Result<(), CudaError> {
        let _span =
            tracing::debug_span!("graph_instantiate", device = self.gpu.ordinal()).entered();
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: `graph` is the live graph returned by the capture; `exec` is an out-pointer
        // to a local.
        unsafe {
            sys::cuGraphInstantiateWithFlags(&mut exec, self.graph, u64::from(INSTANTIATE_FLAGS.0))
        }
        .result()
        .map_err(driver("cuGraphInstantiateWithFlags"))?;
        self.exec = exec;
        let mut nodes = 0usize;
        // SAFETY: with a null node array the call only writes the count into the local.
        unsafe { sys::cuGraphGetNodes(self.graph, std::ptr::null_mut(), &mut nodes) }
            .result()
            .map_err(driver("cuGraphGetNodes"))?;
        self.nodes = nodes;
        Ok(())
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        // Errors are ignored: nothing can be done about them while dropping, and destroying
        // does not depend on the context being current.
        let _ = self.gpu.bind();
        if !self.exec.is_null() {
            // SAFETY: `exec` was instantiated by this object and is destroyed once.
            let _ = unsafe { sys::cuGraphExecDestroy(self.exec) };
            self.exec = std::ptr::null_mut();
        }
        if !self.graph.is_null() {
            // SAFETY: `graph` came from this object's capture and is destroyed once, after
            // its executable graph.
            let _ = unsafe { sys::cuGraphDestroy(self.graph) };
            self.graph = std::ptr::null_mut();
        }
    }
}

/// A capture in progress; ends it on drop (also when the closure panics), so that the
/// stream is never left capturing.
struct Capture<'a> {
    stream: &'a GpuStream,
    open: bool,
}

impl Capture<'_> {
    /// Ends the capture: the captured (not yet instantiated) graph, or why there is none.
    fn end(&mut self) -> Result<CudaGraph, CudaError> {
        self.open = false;
        let gpu = self.stream.gpu();
        // The closure may have bound other GPUs' contexts; a failure here shows up in the
        // end-capture call itself.
        let _ = gpu.bind();
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: the stream is alive and capturing (begun by `GpuStream::capture`); `graph`
        // is an out-pointer to a local.
        let ended =
            unsafe { sys::cuStreamEndCapture(self.stream.cu_stream(), &mut graph) }.result();
        // Owned from here on, so that a partial graph is destroyed on every error path.
        let captured = (!graph.is_null()).then(|| CudaGraph {
            graph,
            exec: std::ptr::null_mut(),
            gpu: gpu.clone(),
            nodes: 0,
        });
        ended.map_err(end_capture_error)?;
        captured.ok_or_else(|| CudaError::Driver {
            call: "cuStreamEndCapture",
            message: "the capture ended without a graph".into(),
        })
    }
}

impl Drop for Capture<'_> {
    fn drop(&mut self) {
        if self.open {
            let _ = self.end();
        }
    }
}

impl GpuStream {
    /// Captures the work that `f` enqueues into a CUDA graph instead of running it, and
    /// returns `f`'s value with the instantiated graph.
    ///
    /// `f` enqueues work on this stream, and may enqueue work on other streams that join the
    /// capture by waiting on an event recorded here; each of them must be joined back (this
    /// stream waits on an event recorded in it) before `f` returns. While capturing, nothing
    /// may wait on the host (synchronous copies, stream or event synchronization, event
    /// queries; see [`GpuStream::is_capturing`]) and no captured stream may wait on an event
    /// recorded outside the capture: either invalidates the capture.
    ///
    /// The capture always ends, also when `f` fails (its error is returned and the partial
    /// graph destroyed) or panics. Memory allocated inside the capture is allocated by the
    /// graph at each launch; what the graph does not free is freed automatically at its next
    /// launch (`AUTO_FREE_ON_LAUNCH`).
    pub fn capture<R, E: From<CudaError>>(
        &self,
        f: impl FnOnce() -> Result<R, E>,
    ) -> Result<(R, CudaGraph), E> {
        require_driver()?;
        self.gpu().bind()?;
        // SAFETY: the stream is alive and belongs to the current context.
        unsafe { sys::cuStreamBeginCapture_v2(self.cu_stream(), CAPTURE_MODE) }
            .result()
            .map_err(driver("cuStreamBeginCapture"))?;
        let mut capture = Capture {
            stream: self,
            open: true,
        };
        let value = f();
        let ended = capture.end();
        // On `f`'s failure its error wins; `ended` (a partial graph or an end-capture error)
        // is dropped, destroying the graph.
        let value = value?;
        let mut graph = ended?;
        graph.instantiate()?;
        Ok((value, graph))
    }

    /// Whether this stream is capturing into a graph (also when that capture has already
    /// been invalidated and waits to be ended). Work must not wait on the host meanwhile.
    pub fn is_capturing(&self) -> Result<bool, CudaError> {
        require_driver()?;
        self.gpu().bind()?;
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: the stream is alive; `status` is an out-pointer to a local.
        unsafe { sys::cuStreamIsCapturing(self.cu_stream(), &mut status) }
            .result()
            .map_err(driver("cuStreamIsCapturing"))?;
        Ok(is_capture_status(status))
    }
}

/// Whether a capture status means the stream is in a capture sequence.
fn is_capture_status(status: sys::CUstreamCaptureStatus) -> bool {
    match status {
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => false,
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE
        | sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED => true,
    }
}

/// The likely cause of a capture that ended with `code`, for the capture-specific codes.
fn capture_failure_cause(code: sys::CUresult) -> Option<&'static str> {
    use sys::CUresult as R;
    Some(match code {
        R::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED => {
            "an operation not allowed while capturing was enqueued or called: a synchronous \
             call (a synchronous copy, stream/event/context synchronization, an event query) or \
             a wait on an event recorded outside the capture"
        }
        R::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED => {
            "an operation that cannot be captured (a synchronous call, e.g. a synchronous copy \
             or a stream/context synchronization) was called on a capturing stream"
        }
        R::CUDA_ERROR_STREAM_CAPTURE_ISOLATION => {
            "a captured stream waited on an event recorded outside the capture"
        }
        R::CUDA_ERROR_STREAM_CAPTURE_UNJOINED => {
            "a stream that joined the capture was not joined back: record an event on it and \
             make the capturing stream wait on that event before the capture ends"
        }
        R::CUDA_ERROR_STREAM_CAPTURE_MERGE => {
            "work of two separate captures was merged (a stream waited on an event of another \
             capture)"
        }
        R::CUDA_ERROR_CAPTURED_EVENT => {
            "an event recorded in the capture was queried or synchronized from the host"
        }
        R::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT => {
            "the legacy default stream was used while capturing"
        }
        R::CUDA_ERROR_STREAM_CAPTURE_UNMATCHED => "the stream was not capturing",
        R::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD => {
            "the capture was ended from another thread than the one that began it"
        }
        _ => return None,
    })
}

/// Maps a failed `cuStreamEndCapture` to an error naming the likely cause.
fn end_capture_error(e: DriverError) -> CudaError {
    match capture_failure_cause(e.0) {
        Some(cause) => CudaError::Driver {
            call: "cuStreamEndCapture",
            message: format!(
                "the stream capture was invalidated ({:?}); likely cause: {cause}",
                e.0
            ),
        },
        None => driver("cuStreamEndCapture")(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{device_count, Priority};

    #[test]
    fn capture_uses_relaxed_mode_and_auto_free() {
        assert_eq!(CAPTURE_MODE as u32, 2);
        assert_eq!(INSTANTIATE_FLAGS.0, 1);
    }

    #[test]
    fn capture_status_mapping() {
        use sys::CUstreamCaptureStatus as S;
        assert!(!is_capture_status(S::CU_STREAM_CAPTURE_STATUS_NONE));
        assert!(is_capture_status(S::CU_STREAM_CAPTURE_STATUS_ACTIVE));
        assert!(is_capture_status(S::CU_STREAM_CAPTURE_STATUS_INVALIDATED));
    }

    #[test]
    fn invalidated_capture_names_its_cause() {
        // Built without calling the driver (a `DriverError`'s Debug asks it for a string).
        let e = end_capture_error(DriverError(
            sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
        ));
        match e {
            CudaError::Driver { call, message } => {
                assert_eq!(call, "cuStreamEndCapture");
                assert!(message.contains("invalidated"), "{message}");
                assert!(
                    message.contains("CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"),
                    "{message}"
                );
                assert!(message.contains("synchronous"), "{message}");
                assert!(message.contains("outside the capture"), "{message}");
            }
            other => panic!("unexpected {other:?}"),
        }
        let unjoined = capture_failure_cause(sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
        assert!(unjoined.is_some_and(|c| c.contains("joined back")));
        assert_eq!(capture_failure_cause(sys::CUresult::CUDA_SUCCESS), None);
        assert_eq!(
            capture_failure_cause(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY),
            None
        );
    }

    #[test]
    fn no_driver_is_an_error_not_a_panic() {
        // SAFETY: only tries to dlopen the driver library.
        let present = unsafe { sys::is_culib_present() };
        assert_eq!(require_driver().is_ok(), present);
        if !present {
            assert!(matches!(device_count(), Err(CudaError::Unavailable(_))));
            assert!(matches!(Gpu::open(0), Err(CudaError::Unavailable(_))));
        }
        assert!(Gpu::open(usize::MAX).is_err());
    }

    /// On a machine with a GPU: a captured memset and copy replay on every launch, and a
    /// failing closure leaves the stream usable and not capturing.
    #[test]
    fn capture_and_replay_on_a_gpu() {
        if !matches!(device_count(), Ok(n) if n > 0) {
            return;
        }
        let gpu = Gpu::open(0).unwrap();
        let stream = gpu.new_stream(Priority::Normal).unwrap();
        let a = gpu.alloc(1024, &stream).unwrap();
        let b = gpu.alloc(1024, &stream).unwrap();
        gpu.upload(a.ptr(), &[7u8; 1024], &stream).unwrap();
        gpu.upload(b.ptr(), &[0u8; 1024], &stream).unwrap();
        assert!(!stream.is_capturing().unwrap());
        let (value, graph) = stream
            .capture(|| -> Result<u32, CudaError> {
                assert!(stream.is_capturing()?);
                gpu.copy(b.ptr(), a.ptr(), 1024, &stream)?;
                gpu.zero(a.ptr(), 512, &stream)?;
                Ok(42)
            })
            .unwrap();
        assert_eq!(value, 42);
        assert_eq!(graph.nodes(), 2);
        assert!(!stream.is_capturing().unwrap());
        let timeout = std::time::Duration::from_secs(60);
        let mut host = vec![0u8; 1024];
        // Nothing ran yet: capture only records.
        gpu.download(&mut host, b.ptr(), &stream, timeout).unwrap();
        assert!(host.iter().all(|&x| x == 0));
        for _ in 0..2 {
            gpu.upload(a.ptr(), &[9u8; 1024], &stream).unwrap();
            graph.launch(&stream).unwrap();
            gpu.download(&mut host, b.ptr(), &stream, timeout).unwrap();
            assert!(host.iter().all(|&x| x == 9));
            gpu.download(&mut host, a.ptr(), &stream, timeout).unwrap();
            assert!(host[..512].iter().all(|&x| x == 0));
            assert!(host[512..].iter().all(|&x| x == 9));
        }

        let failed = stream.capture(|| -> Result<(), CudaError> {
            gpu.zero(b.ptr(), 1024, &stream)?;
            Err(CudaError::Unavailable("test failure".into()))
        });
        assert_eq!(
            failed.err(),
            Some(CudaError::Unavailable("test failure".into()))
        );
        assert!(!stream.is_capturing().unwrap());
        // The failed capture's memset never ran.
        gpu.download(&mut host, b.ptr(), &stream, timeout).unwrap();
        assert!(host.iter().all(|&x| x == 9));

        // A host wait inside the capture invalidates it; the error says so.
        let invalid = stream.capture(|| -> Result<(), CudaError> {
            gpu.zero(b.ptr(), 1024, &stream)?;
            let _ = stream.cuda_stream().synchronize();
            Ok(())
        });
        match invalid {
            Err(CudaError::Driver { message, .. }) => {
                assert!(message.contains("invalidated"), "{message}")
            }
            other => panic!("expected an invalidated capture, got {other:?}"),
        }
        assert!(!stream.is_capturing().unwrap());
        drop(graph);
        a.free_on(&stream).unwrap();
        b.free_on(&stream).unwrap();
        stream.synchronize_timeout(timeout).unwrap();
    }

    /// On a machine with GPUs: a second stream forks from and joins back into the capture,
    /// a peer copy (from GPU 1 where there is one) is captured, and an allocation the graph
    /// never frees is freed on relaunch.
    #[test]
    fn fork_join_capture_with_peer_copy_and_allocation() {
        let count = match device_count() {
            Ok(n) if n > 0 => n,
            _ => return,
        };
        let timeout = std::time::Duration::from_secs(60);
        let gpu = Gpu::open(0).unwrap();
        let other = Gpu::open(count.min(2) - 1).unwrap();
        let main = gpu.new_stream(Priority::Normal).unwrap();
        let side = gpu.new_stream(Priority::High).unwrap();
        let other_stream = other.new_stream(Priority::Normal).unwrap();
        let src = other.alloc(2048, &other_stream).unwrap();
        other
            .upload(src.ptr(), &[5u8; 2048], &other_stream)
            .unwrap();
        let dst = gpu.alloc(2048, &main).unwrap();
        gpu.upload(dst.ptr(), &[1u8; 2048], &main).unwrap();
        if other.ordinal() != gpu.ordinal() {
            // Without peer access a copy between GPUs cannot be captured; the error says
            // what to enable, and the stream is left usable.
            let failed = main.capture(|| gpu.copy_peer(dst.ptr(), &other, src.ptr(), 16, &main));
            match failed {
                Err(CudaError::Driver { message, .. }) => {
                    assert!(message.contains("enable peer access"), "{message}")
                }
                other => panic!("expected a failed capture, got {other:?}"),
            }
            assert!(!main.is_capturing().unwrap());
            if !gpu.can_access_peer(&other).unwrap() {
                return;
            }
            gpu.enable_peer_access(&other).unwrap();
        }
        let fork = gpu.new_event(false).unwrap();
        let join = gpu.new_event(false).unwrap();
        let ((), graph) = main
            .capture(|| -> Result<(), CudaError> {
                main.record(&fork)?;
                side.wait(&fork)?;
                assert!(side.is_capturing()?);
                let scratch = gpu.alloc(1 << 20, &side)?;
                gpu.zero(scratch.ptr(), 1 << 20, &side)?;
                gpu.copy(dst.ptr() + 1024, scratch.ptr(), 1024, &side)?;
                // Never freed in the graph: AUTO_FREE_ON_LAUNCH frees it at the next launch.
                std::mem::forget(scratch);
                side.record(&join)?;
                gpu.copy_peer(dst.ptr(), &other, src.ptr(), 1024, &main)?;
                main.wait(&join)?;
                Ok(())
            })
            .unwrap();
        assert!(!side.is_capturing().unwrap());
        assert!(graph.nodes() >= 4, "{graph:?}");
        let mut host = vec![0u8; 2048];
        for _ in 0..3 {
            graph.launch(&main).unwrap();
            gpu.download(&mut host, dst.ptr(), &main, timeout).unwrap();
            assert!(host[..1024].iter().all(|&x| x == 5));
            assert!(host[1024..].iter().all(|&x| x == 0));
        }
        // A capture whose forked stream is never joined back fails and leaves no stream
        // capturing.
        let unjoined = main.capture(|| -> Result<(), CudaError> {
            main.record(&fork)?;
            side.wait(&fork)?;
            gpu.zero(dst.ptr(), 16, &side)?;
            Ok(())
        });
        match unjoined {
            Err(CudaError::Driver { message, .. }) => {
                eprintln!("{message}");
                assert!(message.contains("joined back"), "{message}")
            }
            other => panic!("expected an unjoined capture, got {other:?}"),
        }
        assert!(!main.is_capturing().unwrap());
        assert!(!side.is_capturing().unwrap());
        drop(graph);
        main.synchronize_timeout(timeout).unwrap();
        side.synchronize_timeout(timeout).unwrap();
    }
}
