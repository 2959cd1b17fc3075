//! Merge rules: the policy deciding which two kernel segments may become one.
//!
//! The segmenter asks a rule only about pairs of [`SegmentKind::Kernel`] segments, and only
//! when the merge would keep the segment graph acyclic; communication and library segments are
//! never merged whatever the rule says.

use weave_ir::{ExprKind, Fusion, IterDomainId, IterType, ParallelType, Scalar, TensorId};
use weave_transform::IdGraph;

use crate::segment::{Segment, SegmentKind};

/// Decides whether two segments may become one. Segmentation is parameterised by the rule
/// so that tests and experiments can swap policies without touching the graph algorithm.
pub trait MergeRule {
    /// A short name for logs and dumps.
    fn name(&self) -> &'static str;

    /// Whether kernel segments `a` and `b` may be merged into one. `a`'s first expr comes
    /// before `b`'s in program order. For a producer→consumer merge `b` reads an output of
    /// `a`; for a sibling merge (see [`MergeRule::merge_siblings`]) both read a common tensor.
    /// The segmenter separately refuses merges that would make the segment graph cyclic, so a
    /// rule judges the pair alone.
    fn can_merge(&self, fusion: &Fusion, a: &Segment, b: &Segment) -> bool;

    /// Whether the segmenter should also try to merge kernel segments that are not
    /// producer and consumer but read a common tensor (horizontal fusion). Off by default.
    fn merge_siblings(&self) -> bool {
        false
    }
}

/// One expr per segment: no merge is ever allowed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NoMergeRule;

impl MergeRule for NoMergeRule {
    fn name(&self) -> &'static str {
        "no-merge"
    }

    fn can_merge(&self, _fusion: &Fusion, _a: &Segment, _b: &Segment) -> bool {
        false
    }
}

/// The default policy: merges two kernel segments when every expr of both is fusable into a
/// generated kernel ([`DefaultMergeRule::is_fusable`]: pointwise ops, reductions, broadcast,
/// squeeze) and every tensor either segment defines has the same device mesh and the same
/// Stream/DID parallel structure ([`same_parallel_structure`]) with mapped Stream axes
/// ([`same_stream_axis`]), so that a merged kernel never mixes chunked and unchunked (or
/// differently sharded, or chunked along different axes) iteration spaces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DefaultMergeRule {
    /// Also merge sibling kernels that read a common tensor (see [`MergeRule::merge_siblings`]).
    pub merge_siblings: bool,
}

impl DefaultMergeRule {
    /// The default rule, producer→consumer merges only.
    pub fn new() -> DefaultMergeRule {
        DefaultMergeRule::default()
    }

    /// The default rule that also merges siblings.
    pub fn with_siblings() -> DefaultMergeRule {
        DefaultMergeRule {
            merge_siblings: true,
        }
    }

    /// True for ops a generated kernel can hold together with others: pointwise ops (set,
    /// cast, unary, binary, where), reductions, and the metadata-only broadcast and squeeze.
    /// Permute, reshape, matmul and linear stay alone.
    pub fn is_fusable(kind: &ExprKind) -> bool {
        kind.is_pointwise()
            || matches!(
                kind,
                ExprKind::Reduction { .. } | ExprKind::Broadcast { .. } | ExprKind::Squeeze { .. }
            )
    }
}

impl MergeRule for DefaultMergeRule {
    fn name(&self) -> &'static str {
        if self.merge_siblings {
            "default+siblings"
        } else {
            "default"
        }
    }

    fn can_merge(&self, fusion: &Fusion, a: &Segment, b: &Segment) -> bool {
        if a.kind() != SegmentKind::Kernel || b.kind() != SegmentKind::Kernel {
            return false;
        }
        let fusable = |s: &Segment| {
            s.exprs()
                .iter()
                .all(|e| DefaultMergeRule::is_fusable(&fusion.expr(*e).kind))
        };
        if !fusable(a) || !fusable(b) {
            return false;
        }
        // A `segment_set` starts a segment: it never joins the segment that produces its
        // input (in either merge direction).
        let cuts = |x: &Segment, y: &Segment| {
            let made = x.produced(fusion);
            y.exprs().iter().any(|e| {
                let ex = fusion.expr(*e);
                ex.kind == ExprKind::SegmentSet && ex.inputs.iter().any(|i| made.contains(i))
            })
        };
        if cuts(a, b) || cuts(b, a) {
            return false;
        }
        let produced: Vec<TensorId> = a
            .produced(fusion)
            .into_iter()
            .chain(b.produced(fusion))
            .collect();
        let Some((&t0, rest)) = produced.split_first() else {
            return true;
        };
        if !rest.iter().all(|t| {
            fusion.mesh_of(t0) == fusion.mesh_of(*t) && same_parallel_structure(fusion, t0, *t)
        }) {
            return false;
        }
        same_stream_axis(fusion, &produced)
    }

    fn merge_siblings(&self) -> bool {
        self.merge_siblings
    }
}

/// True if the Stream axes of all `tensors` (reduction axes aside) index the same elements:
/// exactly mapped in the fusion's [`IdGraph`]. One kernel runs inside one stream loop, which
/// chunks one axis; two tensors stream-split on unrelated axes (an add chunked by rows
/// feeding a sum chunked by columns) need two loops, however equal their chunk counts.
pub fn same_stream_axis(fusion: &Fusion, tensors: &[TensorId]) -> bool {
    let stream_axes: Vec<IterDomainId> = tensors
        .iter()
        .flat_map(|t| fusion.tensor(*t).loop_domain.iter().copied())
        .filter(|id| {
            let d = fusion.id(*id);
            d.parallel == ParallelType::Stream && d.iter_type != IterType::Reduction
        })
        .collect();
    let Some((&first, rest)) = stream_axes.split_first() else {
        return true;
    };
    if rest.iter().all(|id| *id == first) {
        return true;
    }
    let graph = IdGraph::build(fusion);
    rest.iter().all(|id| graph.are_mapped(first, *id))
}

/// The Stream and DID axes of `t`'s loop domain as `(parallel type, extent)`, sorted by
/// parallel type (DIDx, DIDy, Stream); axes of the same type keep their loop order. Serial
/// axes are left out.
pub fn parallel_signature(fusion: &Fusion, t: TensorId) -> Vec<(ParallelType, Scalar)> {
    let mut sig: Vec<(ParallelType, Scalar)> = fusion
        .tensor(t)
        .loop_domain
        .iter()
        .map(|id| fusion.id(*id))
        .filter(|d| d.parallel != ParallelType::Serial)
        .map(|d| (d.parallel, d.extent.clone()))
        .collect();
    sig.sort_by_key(|(p, _)| *p);
    sig
}

/// True if `a` and `b` have the same Stream/DID parallel structure: the same parallel types
/// on their loop domains with provably equal extents (structurally, or equal under the
/// fusion's parameter values; see [`Fusion::same_extent`]). Positions in the loop domain do
/// not matter.
pub fn same_parallel_structure(fusion: &Fusion, a: TensorId, b: TensorId) -> bool {
    let (sa, sb) = (parallel_signature(fusion, a), parallel_signature(fusion, b));
    sa.len() == sb.len()
        && sa
            .iter()
            .zip(&sb)
            .all(|((pa, ea), (pb, eb))| pa == pb && fusion.same_extent(ea, eb))
}
