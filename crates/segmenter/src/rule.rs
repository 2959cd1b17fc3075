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

    /// [`MergeRule::can_merge`] with what the segmenter computes once per fusion (`ctx`):
    /// rules that need the fusion's id graph take it from there instead of building it per
    /// question. The segmenter asks this; by default it asks [`MergeRule::can_merge`].
    fn can_merge_in(&self, ctx: &MergeContext<'_>, a: &Segment, b: &Segment) -> bool {
        self.can_merge(ctx.fusion, a, b)
    }

    /// Whether the segmenter should also try to merge kernel segments that are not
    /// producer and consumer but read a common tensor (horizontal fusion). Off by default.
    fn merge_siblings(&self) -> bool {
        false
    }

    /// Whether, once merging is over, a kernel segment that only re-views or casts unsplit
    /// tensors folds into the one kernel segment that reads it (see [`crate::segment()`]).
    /// Off by default.
    fn fold_replicated_views(&self) -> bool {
        false
    }
}

/// What the segmenter knows of the fusion it partitions, computed at most once: the fusion
/// and, on first use, its exact id graph.
pub struct MergeContext<'a> {
    /// The fusion.
    pub fusion: &'a Fusion,
    ids: std::cell::OnceCell<IdGraph>,
}

impl<'a> MergeContext<'a> {
    /// The context of `fusion`.
    pub fn new(fusion: &'a Fusion) -> MergeContext<'a> {
        MergeContext {
            fusion,
            ids: std::cell::OnceCell::new(),
        }
    }

    /// The fusion's exact id graph, built on first use.
    pub fn id_graph(&self) -> &IdGraph {
        self.ids.get_or_init(|| IdGraph::build(self.fusion))
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
/// differently sharded, or chunked along different axes) iteration spaces; once merging is
/// over, views and casts of unsplit tensors fold into the kernel that reads them
/// ([`MergeRule::fold_replicated_views`]).
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
    /// cast, unary, binary, where), reductions, the metadata-only broadcast and squeeze, and
    /// `iota` (an index, no load). Permute, reshape, slice, concat, matmul and linear stay
    /// alone.
    pub fn is_fusable(kind: &ExprKind) -> bool {
        kind.is_pointwise()
            || matches!(
                kind,
                ExprKind::Reduction { .. }
                    | ExprKind::Broadcast { .. }
                    | ExprKind::Squeeze { .. }
                    | ExprKind::Iota { .. }
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
        self.can_merge_in(&MergeContext::new(fusion), a, b)
    }

    /// A segment of several exprs is one this rule accepted as a whole (the segmenter only
    /// merges what the rule allows), so it is uniform — fusable, one mesh, one parallel
    /// structure, mapped Stream axes — and its first expr stands for all of them; a segment
    /// of one expr stands for itself. A question therefore costs the same however long the
    /// segments have grown, which keeps segmentation near-linear in the number of exprs.
    fn can_merge_in(&self, ctx: &MergeContext<'_>, a: &Segment, b: &Segment) -> bool {
        let fusion = ctx.fusion;
        if a.kind() != SegmentKind::Kernel || b.kind() != SegmentKind::Kernel {
            return false;
        }
        let (ra, rb) = (
            &a.exprs()[..1.min(a.exprs().len())],
            &b.exprs()[..1.min(b.exprs().len())],
        );
        if !ra
            .iter()
            .chain(rb)
            .all(|e| DefaultMergeRule::is_fusable(&fusion.expr(*e).kind))
        {
            return false;
        }
        // A `segment_set` starts a segment: it never joins the segment that produces its
        // input (in either merge direction).
        let cuts = |x: &Segment, y: &Segment| {
            y.exprs().iter().any(|e| {
                let ex = fusion.expr(*e);
                ex.kind == ExprKind::SegmentSet
                    && ex
                        .inputs
                        .iter()
                        .any(|i| fusion.tensor(*i).definition.is_some_and(|d| x.contains(d)))
            })
        };
        if cuts(a, b) || cuts(b, a) {
            return false;
        }
        let produced: Vec<TensorId> = ra
            .iter()
            .chain(rb)
            .flat_map(|e| fusion.expr(*e).outputs.iter().copied())
            .collect();
        let Some((&t0, rest)) = produced.split_first() else {
            return true;
        };
        if !rest.iter().all(|t| {
            fusion.mesh_of(t0) == fusion.mesh_of(*t) && same_parallel_structure(fusion, t0, *t)
        }) {
            return false;
        }
        stream_axes_mapped(fusion, &produced, || ctx.id_graph())
    }

    fn merge_siblings(&self) -> bool {
        self.merge_siblings
    }

    fn fold_replicated_views(&self) -> bool {
        true
    }
}

/// True if the Stream axes of all `tensors` (reduction axes aside) index the same elements:
/// exactly mapped in the fusion's [`IdGraph`]. One kernel runs inside one stream loop, which
/// chunks one axis; two tensors stream-split on unrelated axes (an add chunked by rows
/// feeding a sum chunked by columns) need two loops, however equal their chunk counts.
pub fn same_stream_axis(fusion: &Fusion, tensors: &[TensorId]) -> bool {
    let mut built = None;
    stream_axes_mapped(fusion, tensors, || {
        built.get_or_insert_with(|| IdGraph::build(fusion))
    })
}

/// [`same_stream_axis`] with the id graph given by `graph` (asked only when the axes differ).
fn stream_axes_mapped<'g>(
    fusion: &Fusion,
    tensors: &[TensorId],
    graph: impl FnOnce() -> &'g IdGraph,
) -> bool {
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
    let graph = graph();
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
