//! `segment`: partitions the fusion into communication, library and kernel segments.
//!
//! Contract
//! * Input: `Ir::Fusion` after the pre-segmentation pipeline (every expr is pure compute or
//!   exactly one communication).
//! * Output: `Ir::Segmented`: every resharding expr alone in a Communication segment, every
//!   matmul/linear alone in a Library segment, the remaining exprs fused into Kernel segments
//!   by [`DefaultMergeRule`]; a topological run order. The fusion itself is unchanged.
//! * Not idempotent: it changes the IR form.

use weave_ir::{ExprId, Fusion};
use weave_segmenter::{compute_kind, segment, DefaultMergeRule, SegmentKind};

use crate::pass::{Changed, Ir, Pass, PassError};
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

    fn run(&self, ir: &mut Ir) -> Result<Changed, PassError> {
        match std::mem::replace(ir, Ir::Fusion(Fusion::default())) {
            Ir::Fusion(f) => {
                *ir = Ir::Segmented(segment(f, &classify, &DefaultMergeRule::new()));
            }
            other => {
                let found = other.form();
                *ir = other;
                return Err(PassError::WrongForm {
                    pass: self.name(),
                    expected: "fusion",
                    found,
                });
            }
        }
        Ok(Changed::Yes)
    }
}
