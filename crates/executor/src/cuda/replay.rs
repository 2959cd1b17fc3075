//! Replaying a rank's program as one CUDA graph: one run captured on the main stream and
//! launched again with a single call, so that repeated runs pay no per-statement host cost
//! (no kernel launch, event or stream switch issued from the host per chunk).
//!
//! The captured run allocates its intermediates and outputs inside the graph and frees them
//! there too: a replay leaves nothing behind, and its outputs are not readable. It is how
//! repeated runs are *timed* (`weave run --iters`, the benchmarks); a run whose outputs are
//! read is an eager one ([`run_rank_buffers`]).
//!
//! What a capture needs of the program and the communicator: no host wait while it issues
//! (the CUDA backend issues none; NCCL collectives capture; the copy-engine windows of
//! `weave_comm::IpcCopy` replay because every post leaves its flags at rest; the in-process
//! `PeerCopy` waits on the host for its peers and cannot be captured), and the inputs stay
//! where they were when it was captured.

use weave_comm::Communicator;
use weave_cuda::{CudaGraph, GpuStream};
use weave_host_ir::HostProgram;

use super::{CudaBackend, DeviceTensor};
use crate::backend::{Backend, StreamKey};
use crate::error::ExecError;
use crate::eval::{run_rank_buffers, RunConfig};

/// One run of a program on one rank, captured as a CUDA graph.
pub struct Replay {
    graph: CudaGraph,
    main: GpuStream,
}

impl std::fmt::Debug for Replay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Replay({:?})", self.graph)
    }
}

impl Replay {
    /// Runs `program` once eagerly (kernels compile, GEMM plans and NCCL connections are
    /// made, the memory pool grows), waits for it, then captures one more run on `inputs`
    /// with its outputs freed inside the graph.
    ///
    /// The capture's failure (a statement that cannot be captured, a communicator that
    /// waits on the host) is an error naming the capture; the backend's streams are idle
    /// afterwards either way.
    pub fn capture<C>(
        program: &HostProgram,
        backend: &CudaBackend,
        comm: &C,
        inputs: &[DeviceTensor],
        config: &RunConfig,
    ) -> Result<Replay, ExecError>
    where
        C: Communicator<Buffer = DeviceTensor, Stream = GpuStream>,
    {
        let main = backend.stream(StreamKey::Main)?;
        let once = || -> Result<(), ExecError> {
            for o in run_rank_buffers(program, backend, comm, inputs, config)?.outputs {
                backend.deallocate(o, &main);
            }
            Ok(())
        };
        once()?;
        backend.synchronize()?;
        // Events recorded before the capture cannot be waited for inside it, nor events
        // recorded inside it outside the graph.
        backend.reset_compute_order();
        backend.set_capturing(true);
        let captured = main.capture(|| once().map_err(CaptureError::Run));
        backend.set_capturing(false);
        backend.reset_compute_order();
        match captured {
            Ok(((), graph)) => Ok(Replay { graph, main }),
            Err(e) => {
                // Whatever the partial capture left queued is discarded with the graph; the
                // streams carry no captured work, so waiting for them is safe.
                let _ = backend.synchronize();
                Err(ExecError::Program(format!(
                    "capturing one run as a CUDA graph failed: {e}"
                )))
            }
        }
    }

    /// Replays the captured run on the main stream, after the work already queued there.
    pub fn launch(&self) -> Result<(), ExecError> {
        Ok(self.graph.launch(&self.main)?)
    }

    /// The graph's node count (kernels, copies, allocations, event records and waits…).
    pub fn nodes(&self) -> usize {
        self.graph.nodes()
    }
}

/// Why a capture failed: the captured run's error or the capture's own.
enum CaptureError {
    Run(ExecError),
    Cuda(weave_cuda::CudaError),
}

impl From<weave_cuda::CudaError> for CaptureError {
    fn from(e: weave_cuda::CudaError) -> CaptureError {
        CaptureError::Cuda(e)
    }
}

impl std::fmt::Display for CaptureError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CaptureError::Run(e) => write!(f, "{e}"),
            CaptureError::Cuda(e) => write!(f, "{e}"),
        }
    }
}
