//! weave-segmenter: partitions a fully sharded fusion into segments that each run as one
//! unit — one communication, one library call (matmul, linear), or one generated kernel.
//!
//! Input phase: the fusion after the pre-segmentation pipeline of `weave-passes`
//! (`propagate-shardings → decompose-reshardings → reorder-sharded-axis →
//! finalize-multidevice-domains`), in which every tensor is sharded and every expr is either
//! pure compute or exactly one communication. Output: a [`SegmentedFusion`], a DAG of
//! [`Segment`]s (petgraph) whose edges are the tensors passed between them, with a
//! deterministic topological run order, which `lower-to-host` turns into a host program.
//!
//! [`segment()`] starts from one segment per expr, of the kind a caller-supplied classifier
//! gives ([`SegmentKind`]; this crate does not decide what is resharding), and merges kernel
//! segments along producer→consumer edges while a pluggable [`MergeRule`]
//! ([`DefaultMergeRule`], [`NoMergeRule`], or the caller's) allows it and the segment graph
//! stays acyclic. [`verify()`] checks the result; `Display` prints it one line per segment.
//!
//! ```
//! use weave_ir::{BinaryOp, DType, Fusion, Scalar};
//! use weave_segmenter::{compute_kind, segment, verify, DefaultMergeRule};
//!
//! let mut f = Fusion::new("example");
//! let a = f.add_input("a", DType::F32, vec![Scalar::c(4), Scalar::c(4)], None).unwrap();
//! let w = f.add_input("w", DType::F32, vec![Scalar::c(4), Scalar::c(4)], None).unwrap();
//! let b = f.binary("b", BinaryOp::Add, a, a).unwrap();
//! let m = f.matmul("m", b, w).unwrap();
//! let c = f.set("c", m).unwrap();
//! f.add_output(c).unwrap();
//!
//! let sf = segment(f, &compute_kind, &DefaultMergeRule::new());
//! verify(&sf).unwrap();
//! assert_eq!(
//!     sf.to_string(),
//!     "segment 0 (kernel): exprs [add] inputs (a) outputs (b)\n\
//!      segment 1 (library): exprs [matmul] inputs (b, w) outputs (m)\n\
//!      segment 2 (kernel): exprs [set] inputs (m) outputs (c)\n"
//! );
//! ```
//!
//! Architecture Invariant: the segmenter decides grouping only. It never adds, removes or
//! rewrites exprs or tensors, so every expr of the fusion belongs to exactly one segment, and
//! the segment graph is acyclic. It knows nothing of host programs, streams at run time or
//! CUDA, and does not depend on weave-passes.

mod error;
mod kind;
mod partition;
mod rule;
mod segment;
mod verify;

#[cfg(test)]
mod tests;

pub use partition::{compute_kind, segment, Classifier, PartitionError};
pub use rule::{
    parallel_signature, same_parallel_structure, same_stream_axis, DefaultMergeRule, MergeContext,
    MergeRule, NoMergeRule,
};
pub use segment::{Segment, SegmentEdge, SegmentId, SegmentKind, SegmentedFusion};
pub use verify::{verify, VerifyError};
