//! weave-cuda: the CUDA side of execution, built on cudarc.
//!
//! * [`device`]: one primary context per local GPU ([`Gpu`]), streams with priorities
//!   ([`GpuStream`]), events, and a stream-ordered caching allocator ([`DeviceMemory`]) over
//!   the device memory pool; cudarc's own event tracking is turned off so that only the host
//!   program orders streams;
//! * [`gemm`]: cuBLASLt GEMMs with one handle and workspace per stream, plans cached per
//!   shape, an SM-count target, TF32 only when asked;
//! * [`nvrtc`]: generated kernels compiled at run time and cached by name and source text;
//! * [`graph`]: a stream's work captured once into a CUDA graph ([`CudaGraph`], capture in
//!   relaxed mode, instantiated to free its leftover allocations on relaunch) and replayed
//!   with one launch;
//! * [`peer`]: peer access between the GPUs of this process and stream-ordered peer copies
//!   done by the copy engines;
//! * [`ipc`]: device memory shared with other processes on the host (CUDA IPC handles) and
//!   32-bit flags written and waited for in stream order, so GPUs signal each other without
//!   the host.
//!
//! Every entry point checks that its CUDA library can be loaded first and returns
//! [`CudaError::Unavailable`] otherwise: a machine without CUDA builds and runs everything
//! else, and a missing library is an error, never a panic.
//!
//! # CUDA versions
//!
//! cudarc's bindings follow one CUDA toolkit version, chosen by exactly one feature of this
//! crate: `cuda-13000` (CUDA 13.0, the default), or `cuda-12000`, `cuda-12010`, …,
//! `cuda-12090`, `cuda-13010`, …, `cuda-13040`, forwarded to cudarc. The libraries are
//! loaded at run time, so the choice only has to match the driver API the code may call: a
//! machine with CUDA 12.8 builds with `--no-default-features --features cuda-12080`.
//! `weave-comm`, `weave-executor` and `streamweave` forward the same features (with NCCL's,
//! see `weave-comm`); two versions at once do not build.
//!
//! Architecture Invariant: weave-cuda knows nothing of fusions, host programs or passes; it
//! exposes device resources to `weave-comm` and `weave-executor`. It and `weave-comm` (for
//! NCCL) are the only crates that bind CUDA libraries directly, and both must always compile:
//! on a machine without CUDA their entry points return [`CudaError::Unavailable`] instead of
//! failing to build.

pub mod device;
pub mod error;
pub mod gemm;
pub mod graph;
pub mod ipc;
pub mod nvrtc;
pub mod peer;

pub use cudarc;
pub use device::{
    ask_for_hardware_queues, device_count, wait_event, Backoff, DeviceMemory, ForeignStream, Gpu,
    GpuStream, Priority, MAX_CONNECTIONS, MAX_CONNECTIONS_VAR,
};
pub use error::CudaError;
pub use gemm::{GemmOperands, GemmShape, GemmType};
pub use graph::CudaGraph;
pub use ipc::{PeerRegion, SharedRegion, IPC_HANDLE_BYTES};
pub use nvrtc::Kernel;
