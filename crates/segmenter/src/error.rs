//! Why a segmentation is refused: the invariant a segmented fusion breaks ([`VerifyError`])
//! and why a partition cannot be built into one ([`PartitionError`]). Data only, so the
//! segments, the verifier and the partitioner all name them without importing each other.

use crate::kind::SegmentKind;

/// The first invariant a [`SegmentedFusion`](crate::SegmentedFusion) breaks, as
/// [`verify()`](crate::verify()) finds it. A segment is
/// named by its node index and kind, an expr by its op and output tensors, a tensor by its
/// name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// A segment holds no expr.
    #[error("segment {segment} ({kind}) is empty")]
    Empty {
        /// The segment's node index.
        segment: usize,
        /// Its kind.
        kind: SegmentKind,
    },
    /// A communication or library segment holds more than one expr.
    #[error("segment {segment} ({kind}) holds {count} exprs; a {kind} segment holds exactly one")]
    NotSingleExpr {
        /// The segment's node index.
        segment: usize,
        /// Its kind.
        kind: SegmentKind,
        /// How many exprs it holds.
        count: usize,
    },
    /// A segment's exprs are not in program order.
    #[error("segment {segment} ({kind}): exprs are not in program order")]
    OutOfOrder {
        /// The segment's node index.
        segment: usize,
        /// Its kind.
        kind: SegmentKind,
    },
    /// A segment holds an expr that is not in the fusion.
    #[error("segment {segment} ({kind}) holds an expr not in the fusion")]
    ForeignExpr {
        /// The segment's node index.
        segment: usize,
        /// Its kind.
        kind: SegmentKind,
    },
    /// An expr is in two segments.
    #[error("{op} `{outputs}` is in segments {first} and {second}")]
    InTwoSegments {
        /// The expr's op.
        op: &'static str,
        /// Its outputs, comma-separated.
        outputs: String,
        /// The first segment holding it.
        first: usize,
        /// The second.
        second: usize,
    },
    /// A segment's inputs are not what its exprs imply.
    #[error("segment {segment} ({kind}): inputs ({have}) should be ({want})")]
    Inputs {
        /// The segment's node index.
        segment: usize,
        /// Its kind.
        kind: SegmentKind,
        /// The inputs it records, comma-separated.
        have: String,
        /// The inputs its exprs imply.
        want: String,
    },
    /// A segment's outputs are not what its exprs imply.
    #[error("segment {segment} ({kind}): outputs ({have}) should be ({want})")]
    Outputs {
        /// The segment's node index.
        segment: usize,
        /// Its kind.
        kind: SegmentKind,
        /// The outputs it records, comma-separated.
        have: String,
        /// The outputs its exprs imply.
        want: String,
    },
    /// An expr of the fusion is in no segment.
    #[error("{op} `{outputs}` is in no segment")]
    Unassigned {
        /// The expr's op.
        op: &'static str,
        /// Its outputs, comma-separated.
        outputs: String,
    },
    /// `segment_of` names another segment for an expr than the graph.
    #[error("segment_of({op} `{outputs}`) disagrees with the graph")]
    SegmentOfDisagrees {
        /// The expr's op.
        op: &'static str,
        /// Its outputs, comma-separated.
        outputs: String,
    },
    /// `segment_of` maps exprs that no segment holds.
    #[error("segment_of knows exprs that no segment holds")]
    StaleSegmentOf,
    /// A data dependence between segments has no edge.
    #[error("no edge segment {from} -> segment {to} for `{tensor}`")]
    MissingEdge {
        /// The producing segment.
        from: usize,
        /// The consuming segment.
        to: usize,
        /// The tensor passed.
        tensor: String,
    },
    /// An edge is no data dependence.
    #[error("edge segment {from} -> segment {to} for `{tensor}` is not a data dependence")]
    ExtraEdge {
        /// The edge's source segment.
        from: usize,
        /// Its target segment.
        to: usize,
        /// Its tensor.
        tensor: String,
    },
    /// The graph has an edge twice.
    #[error("the graph has duplicate edges")]
    DuplicateEdges,
    /// The segment graph has a cycle.
    #[error("the segment graph has a cycle")]
    Cycle,
    /// The run order does not hold every segment once.
    #[error("the run order has {entries} entries for {segments} segments")]
    RunOrderLength {
        /// Its length.
        entries: usize,
        /// The number of segments.
        segments: usize,
    },
    /// A node index differs from the segment's run-order position.
    #[error(
        "run order position {position} holds segment {segment}; node indices must equal run positions"
    )]
    RunOrderPosition {
        /// The run-order position.
        position: usize,
        /// The node index of the segment there.
        segment: usize,
    },
    /// The run order puts a consumer before its producer.
    #[error("the run order puts segment {consumer} before segment {producer}, which produces `{tensor}` for it")]
    RunOrderBackwards {
        /// The producing segment.
        producer: usize,
        /// The consuming segment.
        consumer: usize,
        /// The tensor passed.
        tensor: String,
    },
}

/// Why [`SegmentedFusion::from_partition`](crate::SegmentedFusion::from_partition) refuses a
/// partition.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PartitionError {
    /// A segment holds no expr.
    #[error("an empty {kind} segment")]
    EmptySegment {
        /// Its kind.
        kind: SegmentKind,
    },
    /// A segment holds an expr that is not in the fusion.
    #[error("segment {segment} holds an expr that is not in the fusion")]
    ForeignExpr {
        /// The segment, by its position in first-expr order.
        segment: usize,
    },
    /// An expr is in two segments.
    #[error("{op} `{outputs}` is in two segments ({first} and {second})")]
    InTwoSegments {
        /// The expr's op.
        op: &'static str,
        /// Its outputs, comma-separated.
        outputs: String,
        /// The first segment holding it, by position in first-expr order.
        first: usize,
        /// The second.
        second: usize,
    },
    /// The segment graph has a cycle through a segment.
    #[error("the segment graph has a cycle through the {kind} segment of {outputs}")]
    Cycle {
        /// The segment's kind.
        kind: SegmentKind,
        /// The outputs of its exprs, comma-separated.
        outputs: String,
    },
    /// The built segmentation fails [`verify()`](crate::verify()).
    #[error(transparent)]
    Invalid(#[from] VerifyError),
}
