//! weave-passes: every transformation between a user's fusion and the host program each rank
//! runs, as named passes in named pipelines.
//!
//! The pipelines (DESIGN.md §1, §5), each pass verifying its output:
//!
//! * pre-segmentation, on a [`weave_ir::Fusion`]: `propagate-shardings →
//!   decompose-reshardings → reorder-sharded-axis → finalize-multidevice-domains`; afterwards
//!   every tensor is sharded and every expr is pure compute or exactly one communication;
//! * segmentation (`weave-segmenter`) into a [`weave_segmenter::SegmentedFusion`];
//! * `lower-to-host` into a [`weave_host_ir::HostProgram`] (stream loops, `ShardByStream`,
//!   `Communication` + `Wait`);
//! * host passes: `merge-kernel-chunks → assign-streams → allocate-and-deallocate →
//!   prefetch-communications`.
//!
//! Before any pass, [`load_checks`] (run by `streamweave::load`) refuses user shardings the
//! pipeline cannot lower, at the user's source position.
//!
//! Every pass is typed by the IR it runs on: a [`FusionPass`] over a fusion, a [`Lowering`]
//! from one form to the next (`segment`, `lower-to-host`), a [`HostPass`] over a host
//! program. [`Registry`] names them (one table, `STANDARD_PASSES`), [`Pipeline`] orders them
//! as [`Stage`]s, refusing a stage out of form order when it is built or parsed, and
//! [`PassManager`] runs them on the [`Ir`] a pipeline carries, verifying after each pass and
//! dumping on request. Each pass module opens with its contract: input and output phase, what
//! it preserves, whether it is idempotent.
//!
//! Architecture Invariant: passes transform IR; they never execute it. weave-passes knows
//! nothing of CUDA, NCCL or the executor, and runs the same on a machine without a GPU.

pub mod allocate_and_deallocate;
pub mod assign_streams;
pub mod attach_definition;
pub mod communication;
pub mod decompose_reshardings;
pub mod finalize_multidevice_domains;
pub mod load_checks;
pub mod lower_to_host;
pub mod manager;
pub mod merge_kernel_chunks;
pub mod pass;
pub mod pipeline;
pub mod prefetch_communications;
pub mod propagate_shardings;
pub mod registry;
pub mod reorder_sharded_axis;
pub mod resharding;
pub mod ring_form;
pub mod segment;
pub mod shared;

pub use allocate_and_deallocate::AllocateAndDeallocate;
pub use assign_streams::{AssignStreams, SyncVariant};
pub use lower_to_host::{LowerToHost, StreamAllgather};
pub use manager::{
    DumpFlags, DumpOptions, DumpSpecError, PassFailure, PassManager, PassSelection, PipelineError,
    DUMP_ENV,
};
pub use merge_kernel_chunks::MergeKernelChunks;
pub use pass::{
    Changed, Form, FusionPass, HostPass, IntoStage, Ir, Lowering, Pass, PassError, PassOptionError,
    PassOptions, Stage,
};
pub use pipeline::{Pipeline, PipelineParseError};
pub use prefetch_communications::PrefetchCommunications;
pub use registry::{BadOptions, ItemError, PassInfo, Registry, UnknownPass};
