//! `segment`: partitions the fusion into communication, library and kernel segments.
//!
//! Contract
//! * Input: `Ir::Fusion` after the pre-segmentation pipeline (every expr is pure compute or
//!   exactly one communication).
//! * Output: `Ir::Segmented`: every resharding expr alone in a Communication segment, every
//!   matmul/linear alone in a Library segment, the remaining exprs fused into Kernel segments
//!   by [`DefaultMergeRule`]; a topological run order. The fusion itself is unchanged.
//! * A [`Lowering`]: it changes the IR form.

use weave_ir::{ExprId, Fusion};
use weave_segmenter::{compute_kind, segment, DefaultMergeRule, SegmentKind, SegmentedFusion};

use crate::pass::{Lowering, Pass, PassError};
use crate::resharding::is_resharding;

/// The `segment` pass.
#[derive(Clone, Copy, Debug, Default)]
pub struct Segment;

/// Communication for resharding exprs, otherwise library or kernel.
pub fn classify(f: &Fusion, e: ExprId) -> SegmentKind {
    if is_resharding(f, e) {
        SegmentKind::Communication
    } else {
        compute_kind(f, e)
    }
}

impl Pass for Segment {
    fn name(&self) -> &'static str {
        "segment"
    }

    fn summary(&self) -> &'static str {
        "fusion -> segmented fusion: one segment per communication and per matmul/linear, fused kernels for the rest"
    }
}

impl Lowering<Fusion, SegmentedFusion> for Segment {
    fn run(&self, f: Fusion) -> Result<SegmentedFusion, PassError> {
        Ok(segment(f, &classify, &DefaultMergeRule::new()))
    }
}
