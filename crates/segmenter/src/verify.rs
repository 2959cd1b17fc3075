//! The segmentation verifier: the invariants every [`SegmentedFusion`] keeps.

use std::collections::HashMap;

use petgraph::algo::is_cyclic_directed;
use petgraph::graph::NodeIndex;
use petgraph::visit::EdgeRef;

use crate::segment::{dependence_edges, names_of, FusionIndex, Segment, SegmentedFusion};

pub use crate::error::VerifyError;

/// Checks a segmentation and returns the first violation found:
///
/// * every expr of the fusion is in exactly one segment, and segments hold only exprs of the
///   fusion, in program order, and are never empty;
/// * communication and library segments hold exactly one expr;
/// * each segment's inputs and outputs are what its exprs imply;
/// * the graph's edges are exactly the cross-segment data dependences (one per producer,
///   consumer and tensor), and the graph has no cycle;
/// * the run order holds every segment once, respects every edge, and node indices equal
///   run-order positions.
pub fn verify(sf: &SegmentedFusion) -> Result<(), VerifyError> {
    let f = sf.fusion();
    let g = sf.graph();
    let idx = FusionIndex::new(f);
    let at = |n: NodeIndex| (n.index(), g[n].kind());
    let expr = |e: weave_ir::ExprId| (f.expr(e).kind.op_name(), names_of(f, &f.expr(e).outputs));

    // Partition.
    let mut seg_of: HashMap<_, usize> = HashMap::new();
    for n in g.node_indices() {
        let s = &g[n];
        let (segment, kind) = at(n);
        if s.exprs().is_empty() {
            return Err(VerifyError::Empty { segment, kind });
        }
        if s.kind().is_single_expr() && s.exprs().len() != 1 {
            return Err(VerifyError::NotSingleExpr {
                segment,
                kind,
                count: s.exprs().len(),
            });
        }
        for w in s.exprs().windows(2) {
            if idx.position(w[0]) >= idx.position(w[1]) {
                return Err(VerifyError::OutOfOrder { segment, kind });
            }
        }
        for e in s.exprs() {
            if !idx.pos.contains_key(*e) {
                return Err(VerifyError::ForeignExpr { segment, kind });
            }
            if let Some(first) = seg_of.insert(*e, n.index()) {
                let (op, outputs) = expr(*e);
                return Err(VerifyError::InTwoSegments {
                    op,
                    outputs,
                    first,
                    second: n.index(),
                });
            }
        }
        let fresh = Segment::with_index(f, &idx, s.kind(), s.exprs().to_vec());
        if fresh.inputs() != s.inputs() {
            return Err(VerifyError::Inputs {
                segment,
                kind,
                have: names_of(f, s.inputs()),
                want: names_of(f, fresh.inputs()),
            });
        }
        if fresh.outputs() != s.outputs() {
            return Err(VerifyError::Outputs {
                segment,
                kind,
                have: names_of(f, s.outputs()),
                want: names_of(f, fresh.outputs()),
            });
        }
    }
    for e in f.exprs() {
        match (seg_of.get(e), sf.segment_of(*e)) {
            (None, _) => {
                let (op, outputs) = expr(*e);
                return Err(VerifyError::Unassigned { op, outputs });
            }
            (Some(k), Some(s)) if *k == s.index() => {}
            _ => {
                let (op, outputs) = expr(*e);
                return Err(VerifyError::SegmentOfDisagrees { op, outputs });
            }
        }
    }
    if sf.expr_segment_map().len() != seg_of.len() {
        return Err(VerifyError::StaleSegmentOf);
    }

    // Edges.
    let mut want = dependence_edges(f, &idx, &seg_of);
    let mut have: Vec<(usize, usize, weave_ir::TensorId)> = g
        .edge_references()
        .map(|e| (e.source().index(), e.target().index(), *e.weight()))
        .collect();
    let key = |x: &(usize, usize, weave_ir::TensorId)| {
        (x.0, x.1, idx.def.get(x.2).map(|d| idx.position(*d)))
    };
    want.sort_by_key(key);
    have.sort_by_key(key);
    if want != have {
        let missing = want.iter().find(|w| !have.contains(w));
        let extra = have.iter().find(|h| !want.contains(h));
        return Err(match (missing, extra) {
            (Some((a, b, t)), _) => VerifyError::MissingEdge {
                from: *a,
                to: *b,
                tensor: f.tensor(*t).name.clone(),
            },
            (_, Some((a, b, t))) => VerifyError::ExtraEdge {
                from: *a,
                to: *b,
                tensor: f.tensor(*t).name.clone(),
            },
            _ => VerifyError::DuplicateEdges,
        });
    }
    if is_cyclic_directed(g) {
        return Err(VerifyError::Cycle);
    }

    // Run order.
    let order = sf.run_order();
    if order.len() != g.node_count() {
        return Err(VerifyError::RunOrderLength {
            entries: order.len(),
            segments: g.node_count(),
        });
    }
    for (pos, n) in order.iter().enumerate() {
        if n.index() != pos {
            return Err(VerifyError::RunOrderPosition {
                position: pos,
                segment: n.index(),
            });
        }
    }
    for (a, b, t) in &have {
        if a >= b {
            return Err(VerifyError::RunOrderBackwards {
                producer: *a,
                consumer: *b,
                tensor: f.tensor(*t).name.clone(),
            });
        }
    }
    Ok(())
}
