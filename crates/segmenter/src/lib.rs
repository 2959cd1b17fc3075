//! weave-segmenter: partitions a fully sharded fusion into segments that each run as one
//! unit — one communication, one library call (matmul, linear), or one generated kernel.
//!
//! Input phase: the fusion after the pre-segmentation pipeline of `weave-passes`
//! (`propagate-shardings → decompose-reshardings → reorder-sharded-axis →
//! finalize-multidevice-domains`), in which every tensor is sharded and every expr is either
//! pure compute or exactly one communication. Output: a [`SegmentedFusion`], a DAG of
//! [`Segment`]s (petgraph) whose edges are the tensors passed between them, which
//! `lower-to-host` turns into a host program.
//!
//! Segmentation starts from one segment per expr and merges neighbours while a pluggable
//! [`MergeRule`] allows it and the segment graph stays acyclic. The algorithm arrives with the
//! segmenter issue; this version holds the types it produces and the rule interface.
//!
//! Architecture Invariant: the segmenter decides grouping only. It never adds, removes or
//! rewrites exprs or tensors, so every expr of the fusion belongs to exactly one segment. It
//! knows nothing of host programs, streams at run time or CUDA.

pub mod segment;

pub use segment::{MergeRule, Segment, SegmentId, SegmentKind, SegmentedFusion};
