//! The segmentation verifier: the invariants every [`SegmentedFusion`] keeps.

use std::collections::HashMap;

use petgraph::algo::is_cyclic_directed;
use petgraph::graph::NodeIndex;
use petgraph::visit::EdgeRef;

use crate::segment::{dependence_edges, names_of, FusionIndex, Segment, SegmentedFusion};

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
pub fn verify(sf: &SegmentedFusion) -> Result<(), String> {
    let f = sf.fusion();
    let g = sf.graph();
    let idx = FusionIndex::new(f);
    let desc = |n: NodeIndex| format!("segment {} ({})", n.index(), g[n].kind());

    // Partition.
    let mut seg_of: HashMap<_, usize> = HashMap::new();
    for n in g.node_indices() {
        let s = &g[n];
        if s.exprs().is_empty() {
            return Err(format!("{} is empty", desc(n)));
        }
        if s.kind().is_single_expr() && s.exprs().len() != 1 {
            return Err(format!(
                "{} holds {} exprs; a {} segment holds exactly one",
                desc(n),
                s.exprs().len(),
                s.kind()
            ));
        }
        for w in s.exprs().windows(2) {
            if idx.position(w[0]) >= idx.position(w[1]) {
                return Err(format!("{}: exprs are not in program order", desc(n)));
            }
        }
        for e in s.exprs() {
            if !idx.pos.contains_key(*e) {
                return Err(format!("{} holds an expr not in the fusion", desc(n)));
            }
            if let Some(prev) = seg_of.insert(*e, n.index()) {
                return Err(format!(
                    "{} `{}` is in segments {prev} and {}",
                    f.expr(*e).kind.op_name(),
                    names_of(f, &f.expr(*e).outputs),
                    n.index()
                ));
            }
        }
        let fresh = Segment::with_index(f, &idx, s.kind(), s.exprs().to_vec());
        if fresh.inputs() != s.inputs() {
            return Err(format!(
                "{}: inputs ({}) should be ({})",
                desc(n),
                names_of(f, s.inputs()),
                names_of(f, fresh.inputs())
            ));
        }
        if fresh.outputs() != s.outputs() {
            return Err(format!(
                "{}: outputs ({}) should be ({})",
                desc(n),
                names_of(f, s.outputs()),
                names_of(f, fresh.outputs())
            ));
        }
    }
    for e in f.exprs() {
        match (seg_of.get(e), sf.segment_of(*e)) {
            (None, _) => {
                return Err(format!(
                    "{} `{}` is in no segment",
                    f.expr(*e).kind.op_name(),
                    names_of(f, &f.expr(*e).outputs)
                ))
            }
            (Some(k), Some(s)) if *k == s.index() => {}
            _ => {
                return Err(format!(
                    "segment_of({} `{}`) disagrees with the graph",
                    f.expr(*e).kind.op_name(),
                    names_of(f, &f.expr(*e).outputs)
                ))
            }
        }
    }
    if sf.expr_segment_map().len() != seg_of.len() {
        return Err("segment_of knows exprs that no segment holds".to_string());
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
            (Some((a, b, t)), _) => format!(
                "no edge segment {a} -> segment {b} for `{}`",
                f.tensor(*t).name
            ),
            (_, Some((a, b, t))) => format!(
                "edge segment {a} -> segment {b} for `{}` is not a data dependence",
                f.tensor(*t).name
            ),
            _ => "the graph has duplicate edges".to_string(),
        });
    }
    if is_cyclic_directed(g) {
        return Err("the segment graph has a cycle".to_string());
    }

    // Run order.
    let order = sf.run_order();
    if order.len() != g.node_count() {
        return Err(format!(
            "the run order has {} entries for {} segments",
            order.len(),
            g.node_count()
        ));
    }
    for (pos, n) in order.iter().enumerate() {
        if n.index() != pos {
            return Err(format!(
                "run order position {pos} holds segment {}; node indices must equal run positions",
                n.index()
            ));
        }
    }
    for (a, b, t) in &have {
        if a >= b {
            return Err(format!(
                "the run order puts segment {b} before segment {a}, which produces `{}` for it",
                f.tensor(*t).name
            ));
        }
    }
    Ok(())
}
