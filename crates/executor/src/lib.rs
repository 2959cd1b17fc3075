//! weave-executor: runs host programs.
//!
//! * [`eval`]: the evaluator, which walks a [`weave_host_ir::HostProgram`] once per rank,
//!   binding scalars (`rank`, `numberOfStreams`, the fusion's parameters) and tensors, and
//!   issues every statement to a [`Backend`] and a [`weave_comm::Communicator`];
//! * [`backend`]: the `Backend` interface; [`cpu`]: the CPU backend, whose streams are worker
//!   threads with FIFO queues and events, so that a missing synchronization is a real race;
//!   [`cuda`]: the CUDA backend (cuBLASLt GEMMs, generated NVRTC kernels, CUDA-event spans);
//! * [`interp`]: the fusion interpreter that CPU kernel segments and the reference run;
//!   [`reference`](mod@reference): the unsharded reference evaluation and dtype-aware comparison;
//!   [`memory`]: sizes checked before allocation (overflow, the host memory available);
//! * [`meter`]: a backend and communicator that do no work and count it (the evaluator's
//!   host cost alone; the workload a cost model needs);
//! * [`kernels`]: the kernel table, every generated kernel a program's ranks launch,
//!   planned before it runs (from a meter run of each rank); the CUDA backend launches
//!   what it holds;
//! * [`race`]: the race checker (vector clocks per stream, advanced by `Synchronize` and
//!   `Wait`);
//! * [`timeline`]: per-rank, per-stream spans in Chrome trace format and as an SVG picture.
//!
//! Without the `cuda` feature (on by default; every version feature turns it on) there is no
//! CUDA backend and no dependency on cudarc: [`cuda`] holds only the kernel code generator.
//!
//! Architecture Invariant: the executor runs host programs as given; it never rewrites them.
//! It knows nothing of fusions' schedules, segmentation or passes (a kernel segment's fusion
//! is interpreted for its logical semantics only); anything a program needs is decided before
//! it reaches here.

pub mod backend;
mod collective;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(not(feature = "cuda"))]
#[path = "cuda_codegen_only.rs"]
pub mod cuda;
pub mod dense;
pub mod error;
pub mod eval;
pub mod interp;
pub mod kernels;
pub mod memory;
pub mod meter;
pub mod race;
pub mod reference;
pub mod timeline;

pub use backend::{Backend, Region, Span, StreamKey};
pub use cpu::{CpuBackend, CpuOptions};
#[cfg(feature = "cuda")]
pub use cuda::{time_back_to_back, BlockSums, CudaBackend, CudaOptions, DeviceTensor, Replay};
pub use dense::Dense;
pub use error::ExecError;
pub use eval::{
    check_inputs, producers, program_teams, run_rank, run_rank_buffers, run_rank_into, BufferRun,
    Deadline, IntoRun, RankRun, RunConfig, MAX_TRIP_COUNT,
};
pub use kernels::{KernelEntry, KernelTable, KernelTableError};
pub use race::{RaceChecker, RaceReport};
