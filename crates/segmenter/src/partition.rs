//! The segmentation algorithm: one segment per expr, then greedy merges of kernel segments
//! along producer→consumer edges (and, if the rule asks, between siblings) while the merge
//! rule allows it and the segment graph stays acyclic.
//!
//! Cycle safety: merging segments `a` and `b` of a DAG gives a cycle exactly when a path
//! `a ⇝ x ⇝ b` or `b ⇝ x ⇝ a` passes through a third segment `x`; such merges are refused,
//! so the graph is a DAG after every step. The work graph is a petgraph `StableDiGraph`, so
//! node indices survive the removal of merged nodes; the final graph is renumbered in run
//! order (see [`SegmentedFusion`]).
//!
//! Cost: a candidate merge asks the rule (constant time for the default rule, whatever the
//! segments' sizes), appends one segment's exprs to the other's, and searches for a path
//! only from the side that can have one: with an edge `a → b` the acyclic graph has no path
//! `b ⇝ a`, so a producer merging with its consumer searches from the producer's other
//! successors only. A chain of pointwise ops therefore segments in near-linear time; the
//! worst case (many siblings, repeated passes) stays polynomial.
//!
//! A partition written by hand is checked instead: [`SegmentedFusion::from_partition`] builds
//! it and runs [`verify()`].

use petgraph::algo::{has_path_connecting, DfsSpace};
use petgraph::graph::NodeIndex;
use petgraph::stable_graph::StableDiGraph;
use petgraph::visit::EdgeRef;
use petgraph::Direction;
use slotmap::SecondaryMap;
use weave_ir::{ExprId, Fusion, TensorId};

pub use crate::error::PartitionError;
use crate::rule::{MergeContext, MergeRule};
use crate::segment::{build, FusionIndex, Segment, SegmentKind, SegmentedFusion};

use crate::verify::verify;

type WorkGraph = StableDiGraph<Segment, TensorId>;

/// The classification of one expr into the kind of segment it starts in; supplied by the
/// caller (weave-passes knows which exprs are resharding). See [`compute_kind`] for the
/// non-communication part.
pub type Classifier<'a> = &'a dyn Fn(&Fusion, ExprId) -> SegmentKind;

/// The kind of a compute (non-communication) expr: [`SegmentKind::Library`] for matmul and
/// linear, [`SegmentKind::Kernel`] for everything else. A classifier is typically
/// `|f, e| if is_resharding(f, e) { Communication } else { compute_kind(f, e) }`.
pub fn compute_kind(fusion: &Fusion, e: ExprId) -> SegmentKind {
    match fusion.expr(e).kind {
        weave_ir::ExprKind::Matmul | weave_ir::ExprKind::Linear => SegmentKind::Library,
        _ => SegmentKind::Kernel,
    }
}

/// Partitions `fusion` into segments.
///
/// Every expr starts in its own segment of kind `classify(&fusion, e)`. Communication and
/// library segments keep exactly one expr. Kernel segments are merged greedily: for each expr
/// in program order and each of its operands in order, the operand's producing segment and
/// the expr's segment are merged when both are kernels, `rule.can_merge` allows it (earlier
/// segment first) and no path through a third segment connects them. If
/// `rule.merge_siblings()`, kernel segments that read a common tensor are tried the same way
/// (tensors in definition order, readers in program order). The passes repeat until nothing
/// changes. The result is deterministic for a given fusion, classifier and rule; its run order
/// is topological with ties broken by the program position of each segment's first expr.
pub fn segment(fusion: Fusion, classify: Classifier<'_>, rule: &dyn MergeRule) -> SegmentedFusion {
    let idx = FusionIndex::new(&fusion);
    let mut g = WorkGraph::default();
    let mut seg_of: SecondaryMap<ExprId, NodeIndex> = SecondaryMap::new();
    for e in fusion.exprs() {
        let kind = classify(&fusion, *e);
        let n = g.add_node(Segment::with_index(&fusion, &idx, kind, vec![*e]));
        seg_of.insert(*e, n);
    }
    for e in fusion.exprs() {
        for t in &fusion.expr(*e).inputs {
            if let Some(&d) = idx.def.get(*t) {
                add_edge_unique(&mut g, seg_of[d], seg_of[*e], *t);
            }
        }
    }

    let ctx = MergeContext::new(&fusion);
    let mut m = Merger {
        ctx: &ctx,
        idx: &idx,
        rule,
        g,
        seg_of,
        space: None,
    };
    loop {
        let mut changed = false;
        for e in fusion.exprs() {
            for t in &fusion.expr(*e).inputs {
                if let Some(&d) = idx.def.get(*t) {
                    changed |= m.try_merge(m.seg_of[d], m.seg_of[*e]);
                }
            }
        }
        if rule.merge_siblings() {
            for t in fusion.tensors_in_order() {
                let users = idx.uses.get(t).map(Vec::as_slice).unwrap_or_default();
                for (i, u) in users.iter().enumerate() {
                    for v in &users[i + 1..] {
                        changed |= m.try_merge(m.seg_of[*u], m.seg_of[*v]);
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }

    if rule.fold_replicated_views() {
        fold_replicated_views(&mut m, &fusion);
    }

    let Merger { g, .. } = m;
    // Merged segments hold their exprs as merged; put each in program order with its
    // inputs and outputs once, at the end.
    let mut segments: Vec<Segment> = g
        .node_indices()
        .map(|n| Segment::with_index(&fusion, &idx, g[n].kind(), g[n].exprs().to_vec()))
        .collect();
    segments.sort_by_key(|s| idx.position(s.exprs()[0]));
    build(fusion, &idx, segments).expect("segmentation keeps a valid acyclic partition")
}

impl SegmentedFusion {
    /// Builds a segmented fusion from an explicit partition: one `(kind, exprs)` per segment,
    /// in any order. Computes each segment's inputs and outputs, the edges, and the run order
    /// (topological; ties go to the segment whose first expr comes first in program order),
    /// then runs [`verify()`]. Fails if the partition misses or repeats an expr, has an
    /// empty segment or a communication/library segment of more than one expr, or if the
    /// segment graph has a cycle.
    pub fn from_partition(
        fusion: Fusion,
        parts: Vec<(SegmentKind, Vec<ExprId>)>,
    ) -> Result<SegmentedFusion, PartitionError> {
        let idx = FusionIndex::new(&fusion);
        let mut segments: Vec<Segment> = parts
            .into_iter()
            .map(|(k, es)| Segment::with_index(&fusion, &idx, k, es))
            .collect();
        if let Some(s) = segments.iter().find(|s| s.exprs().is_empty()) {
            return Err(PartitionError::EmptySegment { kind: s.kind() });
        }
        segments.sort_by_key(|s| idx.position(s.exprs()[0]));
        let sf = build(fusion, &idx, segments)?;
        verify(&sf)?;
        Ok(sf)
    }
}

/// Folds each kernel segment that only re-views or casts tensors split across neither
/// streams nor devices, into tensors that are not split either (a broadcast constant, a cast
/// weight; a copy the schedule keeps whole between split ones stays), into the one kernel
/// segment that
/// reads it, when none of its tensors is a fusion output and the merge closes no cycle: the
/// reader recomputes the view per element for free, where a segment of its own costs a
/// launch and a buffer before the stream loop (the parallel structures differ, so the merge
/// rule keeps them apart). Runs once merging is over, so merged segments need no uniform
/// representative.
fn fold_replicated_views(m: &mut Merger<'_>, fusion: &Fusion) {
    let cheap = |k: &weave_ir::ExprKind| {
        matches!(
            k,
            weave_ir::ExprKind::Set
                | weave_ir::ExprKind::Cast(_)
                | weave_ir::ExprKind::Broadcast { .. }
                | weave_ir::ExprKind::Squeeze { .. }
        )
    };
    let nodes: Vec<NodeIndex> = m.g.node_indices().collect();
    for p in nodes {
        if !m.g.contains_node(p) || m.g[p].kind() != SegmentKind::Kernel {
            continue;
        }
        let foldable = m.g[p].exprs().iter().all(|e| {
            let ex = fusion.expr(*e);
            let whole = |t: &TensorId| crate::rule::parallel_signature(fusion, *t).is_empty();
            cheap(&ex.kind)
                && ex.inputs.iter().all(whole)
                && ex.outputs.iter().all(|t| !fusion.is_output(*t) && whole(t))
        });
        if !foldable {
            continue;
        }
        let mut readers: Vec<NodeIndex> = m.g.neighbors_directed(p, Direction::Outgoing).collect();
        readers.sort();
        readers.dedup();
        let [c] = readers[..] else { continue };
        if m.g[c].kind() != SegmentKind::Kernel {
            continue;
        }
        let mesh = |n: NodeIndex| {
            let e = m.g[n].exprs()[0];
            fusion.expr(e).outputs.first().map(|t| fusion.mesh_of(*t))
        };
        if mesh(p) != mesh(c) || m.creates_cycle(c, p) {
            continue;
        }
        m.merge(c, p);
    }
}

struct Merger<'a> {
    ctx: &'a MergeContext<'a>,
    idx: &'a FusionIndex,
    rule: &'a dyn MergeRule,
    g: WorkGraph,
    seg_of: SecondaryMap<ExprId, NodeIndex>,
    space: Option<DfsSpace<NodeIndex, <WorkGraph as petgraph::visit::Visitable>::Map>>,
}

impl Merger<'_> {
    /// Merges the segments `a` and `b` if allowed; returns whether it did.
    fn try_merge(&mut self, a: NodeIndex, b: NodeIndex) -> bool {
        if a == b {
            return false;
        }
        let first = |n: NodeIndex| self.idx.position(self.g[n].exprs()[0]);
        let (a, b) = if first(a) <= first(b) { (a, b) } else { (b, a) };
        if self.g[a].kind() != SegmentKind::Kernel || self.g[b].kind() != SegmentKind::Kernel {
            return false;
        }
        if !self.rule.can_merge_in(self.ctx, &self.g[a], &self.g[b]) {
            return false;
        }
        // With an edge `a → b` the graph (acyclic) has no path `b ⇝ a`, so only the paths
        // from `a` need looking at (and the other way round): a producer merging with its
        // consumer costs one search, not a walk over everything downstream of both.
        let (ab, ba) = (self.g.contains_edge(a, b), self.g.contains_edge(b, a));
        if (!ba && self.creates_cycle(a, b)) || (!ab && self.creates_cycle(b, a)) {
            return false;
        }
        self.merge(a, b);
        true
    }

    /// True if a path `from → x ⇝ to` exists with `x ≠ to`: merging `from` and `to` would
    /// close it into a cycle.
    fn creates_cycle(&mut self, from: NodeIndex, to: NodeIndex) -> bool {
        let mut succ: Vec<NodeIndex> = self
            .g
            .neighbors_directed(from, Direction::Outgoing)
            .filter(|x| *x != to)
            .collect();
        succ.sort();
        succ.dedup();
        let space = self.space.get_or_insert_with(|| DfsSpace::new(&self.g));
        succ.into_iter()
            .any(|x| has_path_connecting(&self.g, x, to, Some(space)))
    }

    /// Moves `b`'s exprs and edges into `a` and removes `b`.
    fn merge(&mut self, a: NodeIndex, b: NodeIndex) {
        let incoming: Vec<(NodeIndex, TensorId)> = self
            .g
            .edges_directed(b, Direction::Incoming)
            .map(|e| (e.source(), *e.weight()))
            .collect();
        let outgoing: Vec<(NodeIndex, TensorId)> = self
            .g
            .edges_directed(b, Direction::Outgoing)
            .map(|e| (e.target(), *e.weight()))
            .collect();
        let removed = self.g.remove_node(b).expect("merged segment exists");
        for e in removed.exprs() {
            self.seg_of.insert(*e, a);
        }
        // `a`'s first expr stays first (it comes before `b`'s); the order of the rest, and
        // the inputs and outputs, are settled once segmentation ends.
        self.g[a].absorb(removed);
        // Edges between `a` and `b` become internal; the rest now attach to `a`.
        for (src, t) in incoming {
            if src != a {
                add_edge_unique(&mut self.g, src, a, t);
            }
        }
        for (dst, t) in outgoing {
            if dst != a {
                add_edge_unique(&mut self.g, a, dst, t);
            }
        }
    }
}

/// Adds edge `a → b` carrying `t` unless it is there already.
fn add_edge_unique(g: &mut WorkGraph, a: NodeIndex, b: NodeIndex, t: TensorId) {
    if a != b && !g.edges_connecting(a, b).any(|e| *e.weight() == t) {
        g.add_edge(a, b, t);
    }
}
