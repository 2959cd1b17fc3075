//! Segments, the segmented fusion (a petgraph DAG of segments plus a run order) and its
//! printer.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::fmt;

use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::visit::EdgeRef;
use petgraph::Direction;
use slotmap::SecondaryMap;
use weave_ir::{ExprId, Fusion, TensorId};

pub use crate::error::PartitionError;
pub use crate::kind::SegmentKind;

/// A segment's node in [`SegmentedFusion::graph`]. In a finished [`SegmentedFusion`] the
/// node indices are the positions in the run order: `run_order()[i].index() == i`.
pub type SegmentId = NodeIndex;

/// Lookups over a fusion that segmentation needs often: program positions, definitions and
/// uses of tensors.
#[derive(Clone, Debug, Default)]
pub(crate) struct FusionIndex {
    /// Position of each expr in [`Fusion::exprs`].
    pub pos: SecondaryMap<ExprId, usize>,
    /// The expr that defines each tensor (fusion inputs have none).
    pub def: SecondaryMap<TensorId, ExprId>,
    /// The exprs reading each tensor, in program order, each once.
    pub uses: SecondaryMap<TensorId, Vec<ExprId>>,
}

impl FusionIndex {
    pub fn new(fusion: &Fusion) -> FusionIndex {
        let mut idx = FusionIndex::default();
        for (k, e) in fusion.exprs().iter().enumerate() {
            idx.pos.insert(*e, k);
            let expr = fusion.expr(*e);
            for t in &expr.inputs {
                match idx.uses.get_mut(*t) {
                    Some(u) if u.last() == Some(e) => {}
                    Some(u) => u.push(*e),
                    None => {
                        idx.uses.insert(*t, vec![*e]);
                    }
                }
            }
            for t in &expr.outputs {
                idx.def.insert(*t, *e);
            }
        }
        idx
    }

    /// Program position of `e`; exprs not in the fusion sort last.
    pub fn position(&self, e: ExprId) -> usize {
        self.pos.get(e).copied().unwrap_or(usize::MAX)
    }
}

/// A set of exprs of the fusion that run as one unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    kind: SegmentKind,
    exprs: Vec<ExprId>,
    inputs: Vec<TensorId>,
    outputs: Vec<TensorId>,
}

impl Segment {
    /// A segment of `kind` holding `exprs` (put into program order, duplicates dropped), with
    /// its inputs and outputs computed against `fusion`. The segment is not checked for
    /// validity (see [`crate::verify()`]).
    pub fn new(fusion: &Fusion, kind: SegmentKind, exprs: Vec<ExprId>) -> Segment {
        Segment::with_index(fusion, &FusionIndex::new(fusion), kind, exprs)
    }

    pub(crate) fn with_index(
        fusion: &Fusion,
        idx: &FusionIndex,
        kind: SegmentKind,
        mut exprs: Vec<ExprId>,
    ) -> Segment {
        exprs.sort_by_key(|e| idx.position(*e));
        exprs.dedup();
        let members: HashSet<ExprId> = exprs.iter().copied().collect();
        let mut inputs = Vec::new();
        let mut outputs = Vec::new();
        for e in &exprs {
            let expr = fusion.expr(*e);
            for t in &expr.inputs {
                let inside = idx.def.get(*t).is_some_and(|d| members.contains(d));
                if !inside && !inputs.contains(t) {
                    inputs.push(*t);
                }
            }
            for t in &expr.outputs {
                let used_outside = idx
                    .uses
                    .get(*t)
                    .is_some_and(|us| us.iter().any(|u| !members.contains(u)));
                if (used_outside || fusion.is_output(*t)) && !outputs.contains(t) {
                    outputs.push(*t);
                }
            }
        }
        Segment {
            kind,
            exprs,
            inputs,
            outputs,
        }
    }

    /// Moves `other`'s exprs to the end of this segment's, leaving the inputs and outputs to
    /// be recomputed ([`Segment::with_index`]) once merging is over.
    pub(crate) fn absorb(&mut self, other: Segment) {
        self.exprs.extend(other.exprs);
        self.inputs.clear();
        self.outputs.clear();
    }

    /// How the segment runs.
    pub fn kind(&self) -> SegmentKind {
        self.kind
    }

    /// The segment's exprs, in fusion program order (never empty in a verified segmentation).
    pub fn exprs(&self) -> &[ExprId] {
        &self.exprs
    }

    /// The first expr in program order; `None` only for an empty segment.
    pub fn first_expr(&self) -> Option<ExprId> {
        self.exprs.first().copied()
    }

    /// Tensors the segment reads that it does not produce (fusion inputs or outputs of other
    /// segments), each once, in first-use order.
    pub fn inputs(&self) -> &[TensorId] {
        &self.inputs
    }

    /// Tensors the segment produces that are fusion outputs or read by another segment, each
    /// once, in definition order.
    pub fn outputs(&self) -> &[TensorId] {
        &self.outputs
    }

    /// Every tensor the segment's exprs define (outputs and intermediates), in definition
    /// order.
    pub fn produced(&self, fusion: &Fusion) -> Vec<TensorId> {
        self.exprs
            .iter()
            .flat_map(|e| fusion.expr(*e).outputs.iter().copied())
            .collect()
    }

    /// True if `e` belongs to this segment.
    pub fn contains(&self, e: ExprId) -> bool {
        self.exprs.contains(&e)
    }
}

/// One edge of the segment graph: `tensor` is produced by `from` and read by `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SegmentEdge {
    /// The producing segment.
    pub from: SegmentId,
    /// The consuming segment.
    pub to: SegmentId,
    /// The tensor passed along the edge (an output of `from`, an input of `to`).
    pub tensor: TensorId,
}

/// A fusion partitioned into segments: a DAG of segments (petgraph) whose edges are the
/// tensors passed between them, and a deterministic topological run order.
///
/// Built by [`crate::segment()`] or, for hand-written partitions, [`SegmentedFusion::from_partition`].
/// Node indices equal run-order positions, so `SegmentId`s print as `segment 0, 1, ...` in the
/// order lowering emits them.
#[derive(Clone, Debug)]
pub struct SegmentedFusion {
    fusion: Fusion,
    graph: DiGraph<Segment, TensorId>,
    run_order: Vec<SegmentId>,
    expr_segment: SecondaryMap<ExprId, SegmentId>,
}

impl SegmentedFusion {
    /// The fusion that the segments partition.
    pub fn fusion(&self) -> &Fusion {
        &self.fusion
    }

    /// The fusion, mutably: for changes that keep the partition valid (schedules, domains,
    /// meshes). Adding, removing or rewiring exprs invalidates the segmentation.
    pub fn fusion_mut(&mut self) -> &mut Fusion {
        &mut self.fusion
    }

    /// Gives the fusion back, dropping the segmentation.
    pub fn into_fusion(self) -> Fusion {
        self.fusion
    }

    /// The segment graph: nodes are segments, an edge `a → b` carries a tensor that `a`
    /// produces and `b` reads (one edge per such tensor and pair).
    pub fn graph(&self) -> &DiGraph<Segment, TensorId> {
        &self.graph
    }

    /// The number of segments.
    pub fn len(&self) -> usize {
        self.graph.node_count()
    }

    /// True when the fusion has no exprs.
    pub fn is_empty(&self) -> bool {
        self.graph.node_count() == 0
    }

    /// A segment. Panics for an id not of this segmentation.
    pub fn segment(&self, id: SegmentId) -> &Segment {
        &self.graph[id]
    }

    /// Every segment once, in a topological order of the graph (the order lowering emits
    /// them); ties are broken by the program position of the segments' first exprs.
    pub fn run_order(&self) -> &[SegmentId] {
        &self.run_order
    }

    /// `(id, segment)` pairs in run order.
    pub fn segments(&self) -> impl Iterator<Item = (SegmentId, &Segment)> + '_ {
        self.run_order.iter().map(move |id| (*id, &self.graph[*id]))
    }

    /// The segment holding expr `e`; `None` if `e` is not an expr of the fusion.
    pub fn segment_of(&self, e: ExprId) -> Option<SegmentId> {
        self.expr_segment.get(e).copied()
    }

    /// The segment producing tensor `t`; `None` for fusion inputs (and unknown tensors).
    pub fn producer_of(&self, t: TensorId) -> Option<SegmentId> {
        self.fusion
            .tensor(t)
            .definition
            .and_then(|e| self.segment_of(e))
    }

    /// Every edge, ordered by producer, then consumer (run order), then tensor definition
    /// order.
    pub fn edges(&self) -> Vec<SegmentEdge> {
        self.graph
            .edge_references()
            .map(|e| SegmentEdge {
                from: e.source(),
                to: e.target(),
                tensor: *e.weight(),
            })
            .collect()
    }

    /// Edges leaving `id`, ordered by consumer then tensor.
    pub fn out_edges(&self, id: SegmentId) -> Vec<SegmentEdge> {
        self.edges().into_iter().filter(|e| e.from == id).collect()
    }

    /// Edges entering `id`, ordered by producer then tensor.
    pub fn in_edges(&self, id: SegmentId) -> Vec<SegmentEdge> {
        self.edges().into_iter().filter(|e| e.to == id).collect()
    }

    /// The segments `id` reads from, each once, in run order.
    pub fn producers(&self, id: SegmentId) -> Vec<SegmentId> {
        sorted_unique(self.graph.neighbors_directed(id, Direction::Incoming))
    }

    /// The segments that read from `id`, each once, in run order.
    pub fn consumers(&self, id: SegmentId) -> Vec<SegmentId> {
        sorted_unique(self.graph.neighbors_directed(id, Direction::Outgoing))
    }

    /// Prints one segment the way [`fmt::Display`] does, without the trailing newline;
    /// `detailed` spells each expr as `out = op(in, ...)` instead of its op name.
    pub fn segment_to_string(&self, id: SegmentId, detailed: bool) -> String {
        let f = &self.fusion;
        let seg = &self.graph[id];
        let names = |ts: &[TensorId]| {
            ts.iter()
                .map(|t| f.tensor(*t).name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let exprs: Vec<String> = seg
            .exprs
            .iter()
            .map(|e| {
                let expr = f.expr(*e);
                let op = expr.kind.op_name();
                if detailed {
                    format!("{} = {op}({})", names(&expr.outputs), names(&expr.inputs))
                } else {
                    op.to_string()
                }
            })
            .collect();
        format!(
            "segment {} ({}): exprs [{}] inputs ({}) outputs ({})",
            id.index(),
            seg.kind,
            exprs.join(", "),
            names(&seg.inputs),
            names(&seg.outputs)
        )
    }

    pub(crate) fn expr_segment_map(&self) -> &SecondaryMap<ExprId, SegmentId> {
        &self.expr_segment
    }
}

fn sorted_unique(it: impl Iterator<Item = SegmentId>) -> Vec<SegmentId> {
    let mut v: Vec<SegmentId> = it.collect();
    v.sort();
    v.dedup();
    v
}

/// Prints one line per segment in run order, tensors by their user names:
///
/// ```text
/// segment 0 (kernel): exprs [add, set] inputs (a, b) outputs (d)
/// segment 1 (library): exprs [matmul] inputs (d, w) outputs (m)
/// ```
///
/// The alternate form (`{:#}`) spells each expr as `d = set(c)`.
impl fmt::Display for SegmentedFusion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for id in &self.run_order {
            writeln!(f, "{}", self.segment_to_string(*id, f.alternate()))?;
        }
        Ok(())
    }
}

/// Data-dependence edges between `segments` (one per producer, consumer and tensor), in
/// consumer-expr program order.
pub(crate) fn dependence_edges(
    fusion: &Fusion,
    idx: &FusionIndex,
    seg_of: &HashMap<ExprId, usize>,
) -> Vec<(usize, usize, TensorId)> {
    let mut out = Vec::new();
    for e in fusion.exprs() {
        let Some(&b) = seg_of.get(e) else { continue };
        for t in &fusion.expr(*e).inputs {
            let Some(&a) = idx.def.get(*t).and_then(|d| seg_of.get(d)) else {
                continue;
            };
            if a != b && !out.contains(&(a, b, *t)) {
                out.push((a, b, *t));
            }
        }
    }
    out
}

/// A topological order of `graph` in which, among the segments ready to run, the one with the
/// smallest `key` goes first (Kahn's algorithm with a priority queue). `Err` holds a node on a
/// cycle's side when the graph is cyclic.
pub(crate) fn stable_topological_order<N, E>(
    graph: &DiGraph<N, E>,
    key: impl Fn(NodeIndex) -> usize,
) -> Result<Vec<NodeIndex>, NodeIndex> {
    let mut indegree: Vec<usize> = graph
        .node_indices()
        .map(|n| graph.edges_directed(n, Direction::Incoming).count())
        .collect();
    let mut ready: BinaryHeap<Reverse<(usize, NodeIndex)>> = graph
        .node_indices()
        .filter(|n| indegree[n.index()] == 0)
        .map(|n| Reverse((key(n), n)))
        .collect();
    let mut order = Vec::with_capacity(graph.node_count());
    while let Some(Reverse((_, n))) = ready.pop() {
        order.push(n);
        for e in graph.edges_directed(n, Direction::Outgoing) {
            let m = e.target();
            indegree[m.index()] -= 1;
            if indegree[m.index()] == 0 {
                ready.push(Reverse((key(m), m)));
            }
        }
    }
    if order.len() == graph.node_count() {
        Ok(order)
    } else {
        let stuck = graph
            .node_indices()
            .find(|n| indegree[n.index()] > 0)
            .expect("some node was not ordered");
        Err(stuck)
    }
}

/// Builds the final graph from `segments` (sorted by first-expr position): computes the edges,
/// the stable run order, and renumbers nodes so that node index = run-order position.
pub(crate) fn build(
    fusion: Fusion,
    idx: &FusionIndex,
    segments: Vec<Segment>,
) -> Result<SegmentedFusion, PartitionError> {
    let mut seg_of: HashMap<ExprId, usize> = HashMap::new();
    for (k, s) in segments.iter().enumerate() {
        for e in &s.exprs {
            if !idx.pos.contains_key(*e) {
                return Err(PartitionError::ForeignExpr { segment: k });
            }
            if let Some(first) = seg_of.insert(*e, k) {
                return Err(PartitionError::InTwoSegments {
                    op: fusion.expr(*e).kind.op_name(),
                    outputs: names_of(&fusion, &fusion.expr(*e).outputs),
                    first,
                    second: k,
                });
            }
        }
    }
    let edges = dependence_edges(&fusion, idx, &seg_of);
    // Temporary graph in first-expr order, to compute the run order.
    let mut tmp: DiGraph<(), ()> = DiGraph::with_capacity(segments.len(), edges.len());
    for _ in &segments {
        tmp.add_node(());
    }
    for (a, b, _) in &edges {
        tmp.add_edge(NodeIndex::new(*a), NodeIndex::new(*b), ());
    }
    let first = |n: NodeIndex| idx.position(segments[n.index()].exprs[0]);
    let order = stable_topological_order(&tmp, first).map_err(|n| {
        let s = &segments[n.index()];
        PartitionError::Cycle {
            kind: s.kind,
            outputs: s
                .exprs
                .iter()
                .map(|e| names_of(&fusion, &fusion.expr(*e).outputs))
                .collect::<Vec<_>>()
                .join(", "),
        }
    })?;
    // Renumber: old index -> run position.
    let mut new_of = vec![0usize; segments.len()];
    for (pos, n) in order.iter().enumerate() {
        new_of[n.index()] = pos;
    }
    let mut slots: Vec<Option<Segment>> = segments.into_iter().map(Some).collect();
    let mut graph: DiGraph<Segment, TensorId> = DiGraph::with_capacity(slots.len(), edges.len());
    for n in &order {
        graph.add_node(slots[n.index()].take().expect("each segment once"));
    }
    let mut final_edges: Vec<(usize, usize, usize, TensorId)> = edges
        .iter()
        .map(|(a, b, t)| {
            let def_pos = idx.def.get(*t).map_or(usize::MAX, |d| idx.position(*d));
            (new_of[*a], new_of[*b], def_pos, *t)
        })
        .collect();
    final_edges.sort_by_key(|(a, b, p, _)| (*a, *b, *p));
    for (a, b, _, t) in final_edges {
        graph.add_edge(NodeIndex::new(a), NodeIndex::new(b), t);
    }
    let expr_segment = seg_of
        .into_iter()
        .map(|(e, k)| (e, NodeIndex::new(new_of[k])))
        .collect();
    Ok(SegmentedFusion {
        fusion,
        graph,
        run_order: (0..order.len()).map(NodeIndex::new).collect(),
        expr_segment,
    })
}

pub(crate) fn names_of(fusion: &Fusion, ts: &[TensorId]) -> String {
    ts.iter()
        .map(|t| fusion.tensor(*t).name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}
