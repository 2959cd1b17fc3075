//! Segments, the segmented fusion and the merge-rule interface.

use petgraph::graph::{DiGraph, NodeIndex};
use weave_ir::{ExprId, Fusion, TensorId};

/// A segment's node in [`SegmentedFusion::graph`].
pub type SegmentId = NodeIndex;

/// How a segment is executed, which decides what `lower-to-host` emits for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SegmentKind {
    /// Exactly one resharding expr, lowered to one `Communication` (or a decomposition into
    /// point-to-point communications) followed by a `Wait`.
    Communication,
    /// Exactly one matmul or linear, run by the GEMM library into a preallocated output.
    Library,
    /// One or more compute exprs fused into one generated kernel.
    Kernel,
}

/// A set of exprs of the fusion that run as one unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// How the segment runs.
    pub kind: SegmentKind,
    /// The segment's exprs, in fusion program order.
    pub exprs: Vec<ExprId>,
    /// Tensors the segment reads that it does not produce, in first-use order.
    pub inputs: Vec<TensorId>,
    /// Tensors the segment produces that are fusion outputs or read by another segment, in
    /// definition order.
    pub outputs: Vec<TensorId>,
}

/// A fusion partitioned into segments.
#[derive(Clone, Debug)]
pub struct SegmentedFusion {
    /// The fusion that the segments partition.
    pub fusion: Fusion,
    /// Segments as nodes; an edge `a → b` carries a tensor that `a` produces and `b` reads.
    pub graph: DiGraph<Segment, TensorId>,
    /// Every segment once, in a topological order of `graph`: the order lowering emits them.
    pub order: Vec<SegmentId>,
}

/// Decides whether two segments may become one. Segmentation is parameterised by the rule
/// so that tests and experiments can swap policies without touching the graph algorithm.
pub trait MergeRule {
    /// A short name for logs and dumps.
    fn name(&self) -> &'static str;

    /// Whether `producer` and `consumer`, where `consumer` reads an output of `producer`, may
    /// be merged into one segment. The segmenter separately refuses merges that would make
    /// the segment graph cyclic, so a rule judges the pair alone.
    fn can_merge(&self, fusion: &Fusion, producer: &Segment, consumer: &Segment) -> bool;
}
