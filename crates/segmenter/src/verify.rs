//! The segmentation verifier: the invariants every [`SegmentedFusion`] keeps.

use std::collections::HashMap;

use petgraph::algo::is_cyclic_directed;
use petgraph::graph::NodeIndex;
use petgraph::visit::EdgeRef;

use crate::segment::{
    dependence_edges, names_of, FusionIndex, Segment, SegmentKind, SegmentedFusion,
};

/// The first invariant a [`SegmentedFusion`] breaks, as [`verify()`] finds it. A segment is
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
