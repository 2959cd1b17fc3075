//! weave-cuda: the CUDA side of execution, built on cudarc.
//!
//! What this crate will own, as the CUDA backend issue lands:
//!
//! * **contexts**: one primary context per local GPU, selected by local rank;
//! * **stream pool**: the pool streams that host programs name by index
//!   (`Stream ( i5 % numberOfStreams )`), created on first use, plus the caller's stream;
//! * **events**: placed by the evaluator for `Synchronize` and `Wait` (cudarc's own event
//!   tracking is turned off so that only the host program orders streams), and timed spans
//!   for the timeline;
//! * **allocator**: device buffers for `Allocate`, with reuse once every stream that touched a
//!   buffer is ordered after its `Deallocate`;
//! * **cuBLASLt**: one handle per stream for `Matmul` and `Linear`, with an SM-count target so
//!   GEMMs leave room for concurrent NCCL kernels;
//! * **NVRTC**: generated kernels compiled at run time and cached by segment hash.
//!
//! This version defines the error type those parts share and nothing else: no CUDA
//! binding is linked yet, and nothing here pretends to run on a device.
//!
//! Architecture Invariant: weave-cuda knows nothing of fusions, host programs or passes; it
//! exposes device resources to `weave-comm` and `weave-executor`. It and `weave-comm` (for
//! NCCL) are the only crates that bind CUDA libraries directly, and both must always compile:
//! on a machine without CUDA their entry points return [`CudaError::Unavailable`] instead of
//! failing to build.

pub mod error;

pub use error::CudaError;
