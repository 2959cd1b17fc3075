//! weave-comm: how ranks talk to each other.
//!
//! * [`Communicator`], through which the executor posts the collectives and point-to-point
//!   transfers of a host program on a stream, with [`CommOp`], [`Collective`] and [`P2p`]
//!   describing them over any kind of buffer;
//! * [`host`]: typed host-memory buffers and rectangular views, the buffers of the CPU
//!   backend;
//! * [`local`]: `Local`, where ranks are threads of one process exchanging host views through
//!   rendezvous slots; always available, and the communicator of every CPU test. Every wait
//!   has a timeout, and a failed rank makes its peers fail instead of hang;
//! * [`nccl`]: `Nccl`, one NCCL communicator per rank (plus one per team that needs its
//!   own), collectives and point-to-point groups posted on the caller's stream, every wait
//!   bounded by a timeout;
//! * [`copy`]: `CopyComm`, the copy-engine communicator: an `Nccl` whose allgathers and
//!   point-to-point transfers over contiguous buffers go through a [`CopyTransport`] (the
//!   copy engines, no SMs taken from the GEMMs they overlap), everything else through NCCL;
//! * [`peer`]: `PeerTransport` and `PeerCopy`, peer copies between the GPUs of one process,
//!   pulled by the receiver and ordered by events on both sides;
//! * [`ipc`]: `IpcTransport` and `IpcCopy`, pushes into receive windows that ranks share
//!   through CUDA IPC handles (ranks in different processes of one host, or threads),
//!   signalled by flags the GPUs write and wait on: no host waits, and replayable from a CUDA
//!   graph;
//! * [`bootstrap`]: rank and world size from launcher variables (torchrun, Open MPI, PMI,
//!   Slurm), and a TCP store through which rank 0 hands out the NCCL unique id (and ranks
//!   all-gather set-up messages).
//!
//! # CUDA and NCCL versions
//!
//! The NCCL bindings follow one NCCL version, chosen by exactly one feature: `nccl-02028`
//! (NCCL 2.28, the default), or `nccl-02024` … `nccl-02027`, `nccl-02029`,
//! `nccl-02030`, forwarded to cudarc; the `ncclConfig_t` a rank builds has the fields of that
//! version (a newer loaded library keeps its defaults for the fields that layout lacks; the
//! library must be 2.18 or newer, which loading checks). The CUDA version is a
//! feature too (`cuda-13000` by default, `cuda-12080`, …), forwarded to `weave-cuda`: a
//! CUDA 12.8 machine with NCCL 2.27 builds with `--no-default-features --features
//! cuda-12080,nccl-02027`.
//!
//! Without the `cuda` feature (on by default; every version feature turns it on) the crate
//! has no CUDA side: no `nccl`, `copy`, `peer` or `ipc` module and no dependency on cudarc,
//! leaving the in-process communicator, host buffers and the bootstrap.
//!
//! Architecture Invariant: weave-comm knows nothing of fusions, host programs or passes; it
//! moves buffers between ranks. It depends on `weave-cuda` for devices and streams and on
//! nothing above it; its element types and reduction operators are its own ([`DataType`],
//! [`RedOp`]), as NCCL's are.

pub mod bootstrap;
pub mod communicator;
#[cfg(feature = "cuda")]
pub mod copy;
pub mod dtype;
pub mod error;
pub mod host;
#[cfg(feature = "cuda")]
pub mod ipc;
pub mod local;
#[cfg(feature = "cuda")]
pub mod nccl;
#[cfg(feature = "cuda")]
pub mod peer;

pub use bootstrap::{all_gather, exchange_id, gather, LaunchEnv, TcpStore};
pub use communicator::{
    Collective, CommOp, Communicator, P2p, Produce, ReductionShape, Task, TaskQueue,
};
#[cfg(feature = "cuda")]
pub use copy::{
    reduce_plan, sum_kernels, CopyComm, CopyTransport, ProduceAt, ReducePlan, Reducer, SumKernel,
    Transfers, WindowSum,
};
pub use dtype::{DataType, RedOp};
pub use error::CommError;
pub use host::{HostError, HostView};
#[cfg(feature = "cuda")]
pub use ipc::{IpcCopy, IpcOptions, IpcTransport, WindowsError};
pub use local::{Local, LocalWorld};
#[cfg(feature = "cuda")]
pub use nccl::{CtaPolicy, DeviceBuffer, Nccl, NcclId, NcclOptions};
#[cfg(feature = "cuda")]
pub use peer::{PeerCopy, PeerHub, PeerTransport};
