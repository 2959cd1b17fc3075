//! Which collective a resharding expr is (reference/nvfuser-host-ir.md §4.2, nvFuser's
//! `getCommunicationInfo`), with its teams and roots (§4.3, `convertSingleOpToCommunication`).
//!
//! Contract: an analysis, not a pass. It reads a [`Fusion`] after `decompose-reshardings`
//! (every resharding expr is a `set`, a `sum`/`max` or a `squeeze` with one tensor operand)
//! and changes nothing. Sharding changes are compared on the loop domains.
//!
//! For a `set`, per device parallel type whose sharding changes (at most one may):
//!
//! | producer sharded | consumer sharded | condition | type |
//! |---|---|---|---|
//! | no | no | meshes differ | Broadcast (root = the sender mesh's first device) |
//! | yes | no | the consumer's Stream axis cuts the producer's sharded axis (same mesh), one chunk per device or with factors that nest | Broadcast (root from the stream loop index; lowering may use a P2P ring) |
//! | yes | no | the consumer's Stream axis cuts the producer's sharded axis (same mesh), factors that neither match nor nest | none: decompose-reshardings gathers first ([`is_unnested_did_to_stream`]) |
//! | yes | no | same mesh (also a producer `[s, d, ..]` whose stream chunks the consumer's match: per chunk) | Allgather |
//! | yes | no | different mesh | Gather (one per receiver) |
//! | no | yes | – | Scatter |
//! | yes | yes | same logical axis, same index per device, meshes of one size | SendRecv (one per sender/receiver pair) |
//! | yes | yes | same logical axis, meshes of different sizes | none: decompose-reshardings gathers first ([`is_layout_change`]) |
//! | yes | yes | same logical axis laid out differently (`[s, d, ..]` against `[d, ..]`) | none: decompose-reshardings gathers first ([`is_layout_change`]) |
//! | yes | yes | different axes, each device split outermost on its axis | AllToAll |
//! | yes | yes | different axes, a device split inside another split of its axis (`[s, d, ..]`) | none: decompose-reshardings gathers first ([`is_nested_all_to_all`]) |
//!
//! For a reduction (`sum`, `max`; a `squeeze` counts as a sum) the producer must be sharded
//! on a reduced axis: Allreduce (consumer not sharded, same mesh), Reduce (consumer not
//! sharded, different mesh; one per receiver), ReduceScatter (consumer sharded on another
//! axis; same mesh required).
//!
//! Teams: Allgather, Allreduce, ReduceScatter, AllToAll and the stream Broadcast run within
//! each 1-D slice of the mesh along the changing type (one [`TeamInstance`] per slice; each
//! device takes the one it belongs to; lowering puts them in one host `Communication` whose
//! teams are the slices). Gather and Reduce post one communication per receiver, whose
//! team is the sender mesh plus the receiver. A cross-mesh Broadcast's team is the receiver
//! mesh plus the root. A Scatter on one mesh runs within each slice along the changing type,
//! rooted at the slice's first member (every member holds the whole tensor); across meshes its
//! team is the (1-D) receiver mesh, its root the first sender that is also a receiver, or,
//! when no sender is a receiver, one pair (first sender, receiver `i`) per receiver, which
//! lowering posts as a SendRecv of piece `i` ([`CommunicationInfo::root_sends_pieces`]).
//! Roots are indices into the team.
//!
//! nvFuser's CollectivePermute (a DID→Stream `set` whose stream axis is a `Swizzle1D`) is not
//! derived: the IR has no swizzle.

use weave_host_ir::CommunicationType;
use weave_ir::{
    DeviceMesh, Diagnostic, ExprId, ExprKind, Fusion, IdExpr, IterDomainId, IterType, ParallelType,
    ReduceOp, TensorId,
};
use weave_transform::logical_map::pairwise_map;
use weave_transform::DomainKind;

use crate::resharding::{have_different_shardings, parallel_axis, same_index, DEVICE_TYPES};

/// The root of a rooted communication.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RootKind {
    /// A fixed member: its index in the team and its device id.
    Member {
        /// Index into the team (what a `Communication` node stores).
        index: usize,
        /// The device id at that index.
        device: i64,
    },
    /// The index of the host stream loop the communication runs in, as an index into the
    /// team: iteration `i` broadcasts the shard of the team's `i`-th member (DID → Stream),
    /// or reduces its chunk onto that member (a device sum whose stream chunks are the
    /// output's device blocks, Stream → DID).
    StreamIndex,
}

/// One communication node that lowering posts: its team and root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TeamInstance {
    /// Member devices, in team order.
    pub team: Vec<i64>,
    /// The root, for the rooted types.
    pub root: Option<RootKind>,
}

/// A sharded (or gathered, scattered, reduced) axis of one side of a communication.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardedAxis {
    /// The producer's logical axis, or the consumer's root (or logical) axis.
    pub id: IterDomainId,
    /// Its position among the tensor's materialized axes (reductions excluded): the tensor
    /// axis a runtime buffer has. `None` for a reduction axis.
    pub axis: Option<usize>,
}

/// What a resharding expr communicates, and among whom.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommunicationInfo {
    /// The collective.
    pub kind: CommunicationType,
    /// The team of the first instance (the only one for most types).
    pub team: Vec<i64>,
    /// The root of the first instance, for rooted types.
    pub root: Option<RootKind>,
    /// The reduction, for Allreduce, Reduce and ReduceScatter.
    pub red_op: Option<ReduceOp>,
    /// The device type whose sharding changes; `None` for a Broadcast between meshes of
    /// unsharded tensors.
    pub parallel: Option<ParallelType>,
    /// The producer's axis involved: the sharded one (Allgather, Gather, SendRecv, AllToAll,
    /// stream Broadcast, Allreduce, Reduce) or the one the consumer scatters (Scatter,
    /// ReduceScatter).
    pub producer_axis: Option<ShardedAxis>,
    /// The consumer's axis involved: the gathered one (Allgather, Gather), the sharded one
    /// (Scatter, SendRecv, AllToAll, ReduceScatter), the stream axis (stream Broadcast) or
    /// the reduced one (Allreduce, Reduce).
    pub consumer_axis: Option<ShardedAxis>,
    /// Every communication lowering posts, with its team and root; `team`/`root` repeat
    /// the first. Several for Gather and Reduce with several receivers, for SendRecv pairs,
    /// and for collectives over a slice of a multi-dimensional mesh.
    pub instances: Vec<TeamInstance>,
    /// A Scatter to a mesh without any sender: instance `i` is the pair (root, receiver
    /// `i`), and lowering posts it as a SendRecv of piece `i` of the root's input.
    pub root_sends_pieces: bool,
}

impl CommunicationInfo {
    /// The instance `device` takes part in first, if any.
    pub fn instance_for(&self, device: i64) -> Option<&TeamInstance> {
        self.instances.iter().find(|i| i.team.contains(&device))
    }
}

/// `` `out = set(inp)` `` for messages.
pub fn expr_desc(f: &Fusion, expr: ExprId) -> String {
    let e = f.expr(expr);
    let names = |ts: &[TensorId]| {
        let names: Vec<&str> = ts.iter().map(|t| f.tensor(*t).name.as_str()).collect();
        names.join(", ")
    };
    format!(
        "`{} = {}({})`",
        names(&e.outputs),
        e.kind.op_name(),
        names(&e.inputs)
    )
}

/// True if `expr` is a `set`, reduction or `squeeze` that [`derive_communication`] accepts.
pub fn is_lowerable_to_communication(f: &Fusion, expr: ExprId) -> bool {
    derive_communication(f, expr).is_ok()
}

/// Derives the collective `expr` performs (see the module doc). Errors name the expr; the
/// span is the expr's.
pub fn derive_communication(f: &Fusion, expr: ExprId) -> Result<CommunicationInfo, Diagnostic> {
    derive(f, expr).map_err(|d| d.or_at(f.expr(expr).span))
}

fn derive(f: &Fusion, expr: ExprId) -> Result<CommunicationInfo, Diagnostic> {
    let e = f.expr(expr);
    let desc = expr_desc(f, expr);
    let red_op = match &e.kind {
        ExprKind::Set | ExprKind::SegmentSet => None,
        ExprKind::Reduction { op, .. } => Some(*op),
        ExprKind::Squeeze { .. } => Some(ReduceOp::Sum),
        _ => {
            return Err(Diagnostic::new(format!(
                "{desc} cannot be a communication: only set, sum, max and squeeze can"
            )))
        }
    };
    if e.inputs.len() != 1 || e.outputs.len() != 1 {
        return Err(Diagnostic::new(format!(
            "{desc} cannot be a communication: it needs one tensor operand and one output"
        )));
    }
    let (p, c) = (e.inputs[0], e.outputs[0]);
    let mesh = |t: TensorId| {
        f.mesh_of(t).cloned().ok_or_else(|| {
            Diagnostic::new(format!(
                "{desc}: `{}` has no device mesh (run propagate-shardings first)",
                f.tensor(t).name
            ))
        })
    };
    let (pm, cm) = (mesh(p)?, mesh(c)?);
    let same_mesh = pm == cm;
    let (p_loop, c_loop) = (&f.tensor(p).loop_domain, &f.tensor(c).loop_domain);
    let mut changes: Vec<(ParallelType, Option<IterDomainId>, Option<IterDomainId>)> = Vec::new();
    for pt in DEVICE_TYPES {
        let (pi, ci) = (parallel_axis(f, p_loop, pt), parallel_axis(f, c_loop, pt));
        if pi.is_none() && ci.is_none() {
            continue;
        }
        if have_different_shardings(f, p, DomainKind::Loop, c, DomainKind::Loop, &[pt]) {
            changes.push((pt, pi, ci));
        }
    }
    if changes.len() > 1 {
        let names: Vec<&str> = changes.iter().map(|(pt, _, _)| pt.name()).collect();
        return Err(Diagnostic::new(format!(
            "expected at most one sharding change in {desc}: {} both change",
            names.join(" and ")
        )));
    }
    let pairs = pairwise_map(f, expr, p);
    let p2c = |pid: IterDomainId| pairs.iter().find(|(a, _)| *a == pid).map(|(_, b)| *b);
    let c2p = |cid: IterDomainId| pairs.iter().find(|(_, b)| *b == cid).map(|(a, _)| *a);
    let info = |kind, pt, pa: Option<IterDomainId>, ca: Option<IterDomainId>, instances| {
        build(f, kind, red_op, pt, (p, pa), (c, ca), instances)
    };

    let Some(&(pt, p_id, c_id)) = changes.first() else {
        if red_op.is_some() {
            return Err(Diagnostic::new(format!(
                "{desc} cannot be a communication: `{}` is not device-sharded on a reduced axis",
                f.tensor(p).name
            )));
        }
        if same_mesh {
            return Err(Diagnostic::new(format!(
                "{desc} does not reshard: producer and consumer are sharded alike on one mesh"
            )));
        }
        let root = pm.devices()[0];
        return Ok(info(
            CommunicationType::Broadcast,
            None,
            None,
            None,
            vec![with_root(cm.devices().to_vec(), root)],
        ));
    };
    let p_log = p_id.and_then(|i| ancestor(f, i, &f.tensor(p).logical));
    let c_root = c_id.and_then(|i| ancestor(f, i, f.tensor(c).root_domain()));
    let need_same_mesh = |what: &str| -> Result<(), Diagnostic> {
        if same_mesh {
            Ok(())
        } else {
            Err(Diagnostic::new(format!(
                "{what} needs the same mesh on both sides of {desc}, got {pm} and {cm}"
            )))
        }
    };

    if red_op.is_some() {
        // The producer must be sharded on an axis the expr reduces (or squeezes away).
        let reduced = match p_log {
            Some(pl) => match p2c(pl) {
                Some(cid) => f.id(cid).iter_type == IterType::Reduction,
                None => matches!(e.kind, ExprKind::Squeeze { .. }),
            },
            None => false,
        };
        if !reduced {
            return Err(Diagnostic::new(format!(
                "{desc} cannot be a communication: the {pt} change is not a reduction over a {pt}-sharded axis of `{}`",
                f.tensor(p).name
            )));
        }
        let p_reduced = p_log.and_then(p2c);
        return match c_id {
            None if same_mesh => Ok(info(
                CommunicationType::Allreduce,
                Some(pt),
                p_log,
                p_reduced,
                slices(&pm, pt, None),
            )),
            None => Ok(info(
                CommunicationType::Reduce,
                Some(pt),
                p_log,
                p_reduced,
                per_receiver(&pm, &cm),
            )),
            Some(cd) => {
                need_same_mesh("ReduceScatter")
                    .map_err(|d| Diagnostic::new(format!("{}: insert a set before or after the reduction to reshard to another device mesh", d.message)))?;
                // Stream → DID: the producer's stream chunks are the consumer's device blocks
                // (one chunk per device, cut alike), so iteration i reduces its chunk onto
                // device i.
                let p_axis = c_root.and_then(c2p);
                let stream_chunks_are_blocks = parallel_axis(f, p_loop, ParallelType::Stream)
                    .is_some_and(|ps| {
                        p_axis.is_some()
                            && ancestor(f, ps, &f.tensor(p).logical) == p_axis
                            && same_index(f, p, ps, c, cd)
                    });
                if stream_chunks_are_blocks {
                    return Ok(info(
                        CommunicationType::Reduce,
                        Some(pt),
                        p_axis,
                        c_root,
                        slices(&pm, pt, Some(RootKind::StreamIndex)),
                    ));
                }
                Ok(info(
                    CommunicationType::ReduceScatter,
                    Some(pt),
                    c_root.and_then(c2p),
                    c_root,
                    slices(&pm, pt, None),
                ))
            }
        };
    }

    match (p_log, c_root) {
        (Some(pl), None) => {
            // DID → Stream: the consumer's stream axis cuts the producer's sharded axis.
            let c_stream_axis = parallel_axis(f, c_loop, ParallelType::Stream);
            let c_stream = c_stream_axis.and_then(|i| ancestor(f, i, f.tensor(c).root_domain()));
            // The producer cut into the same stream chunks, its device split inside each
            // chunk (`outer_split(0, s) -> Stream; outer_split(1, d) -> DIDx`): every rank holds
            // a block of every chunk, so each chunk is an Allgather of its blocks.
            let p_stream_axis = parallel_axis(f, p_loop, ParallelType::Stream);
            let chunked_alike = match (p_stream_axis, c_stream_axis) {
                (Some(ps), Some(cs)) => same_index(f, p, ps, c, cs),
                _ => false,
            };
            if let Some(cs) = c_stream.filter(|cs| p2c(pl) == Some(*cs) && !chunked_alike) {
                need_same_mesh("a DID → Stream set")?;
                // Iteration i must hold exactly device i's shard.
                let (pd, sd) = (p_id.expect("sharded"), c_stream_axis.expect("stream"));
                if !same_index(f, p, pd, c, sd) && !nests_evenly(f, (pl, pd), (cs, sd)) {
                    return Err(Diagnostic::new(format!(
                        "a DID → Stream set needs the stream split of `{}` to match the {pt} split of `{}` in {desc}, or both to be outer splits of the axis by factors that divide it and one of which divides the other",
                        f.tensor(c).name,
                        f.tensor(p).name
                    )));
                }
                return Ok(info(
                    CommunicationType::Broadcast,
                    Some(pt),
                    Some(pl),
                    Some(cs),
                    slices(&pm, pt, Some(RootKind::StreamIndex)),
                ));
            }
            if same_mesh {
                Ok(info(
                    CommunicationType::Allgather,
                    Some(pt),
                    Some(pl),
                    p2c(pl),
                    slices(&pm, pt, None),
                ))
            } else {
                Ok(info(
                    CommunicationType::Gather,
                    Some(pt),
                    Some(pl),
                    p2c(pl),
                    per_receiver(&pm, &cm),
                ))
            }
        }
        (None, Some(cr)) => {
            if same_mesh {
                // Every member has the whole tensor: within each slice along the type, the
                // first member scatters.
                let root = RootKind::Member {
                    index: 0,
                    device: cm.devices()[0],
                };
                return Ok(info(
                    CommunicationType::Scatter,
                    Some(pt),
                    c2p(cr),
                    Some(cr),
                    slices(&cm, pt, Some(root)),
                ));
            }
            if cm.shape().len() != 1 {
                return Err(Diagnostic::new(format!(
                    "Scatter needs a 1-D receiver mesh in {desc}, got {cm}"
                )));
            }
            let Some(root) = pm.devices().iter().copied().find(|d| cm.has(*d)) else {
                // No sender receives a piece: the first sender sends piece `i` to receiver
                // `i`, one pair each.
                let root = pm.devices()[0];
                let pairs = cm
                    .devices()
                    .iter()
                    .map(|r| with_root(vec![root, *r], root))
                    .collect();
                let mut scatter = info(
                    CommunicationType::Scatter,
                    Some(pt),
                    c2p(cr),
                    Some(cr),
                    pairs,
                );
                scatter.root_sends_pieces = true;
                return Ok(scatter);
            };
            Ok(info(
                CommunicationType::Scatter,
                Some(pt),
                c2p(cr),
                Some(cr),
                vec![with_root(cm.devices().to_vec(), root)],
            ))
        }
        (Some(pl), Some(cr)) => {
            if p2c(pl) == Some(cr) {
                if !same_index(f, p, p_id.expect("sharded"), c, c_id.expect("sharded")) {
                    // Not whole shards moving between devices: the elements of one device
                    // are spread over several (a device split inside stream chunks on one
                    // side only). decompose-reshardings gathers first
                    // (`is_layout_change`).
                    return Err(Diagnostic::new(format!(
                        "{desc} changes how the {pt} split lays out the axis (a device split inside stream chunks on one side only), which no single communication does"
                    )));
                }
                if pm.size() != cm.size() {
                    return Err(Diagnostic::new(format!(
                        "SendRecv needs meshes of one size in {desc}, got {pm} and {cm}"
                    )));
                }
                let instances = pm
                    .devices()
                    .iter()
                    .zip(cm.devices())
                    .map(|(s, r)| {
                        let team = if s == r { vec![*s] } else { vec![*s, *r] };
                        with_root(team, *s)
                    })
                    .collect();
                Ok(info(
                    CommunicationType::SendRecv,
                    Some(pt),
                    Some(pl),
                    Some(cr),
                    instances,
                ))
            } else {
                need_same_mesh("AllToAll")?;
                Ok(info(
                    CommunicationType::AllToAll,
                    Some(pt),
                    Some(pl),
                    Some(cr),
                    slices(&pm, pt, None),
                ))
            }
        }
        (None, None) => Err(Diagnostic::new(format!(
            "{desc}: the {pt} axis does not derive from a logical axis through outer splits"
        ))),
    }
}

/// True if the device axis `pd` of the producer and the stream axis `sd` of the consumer are
/// each the logical axis (`pl`, `cs`, mapped to each other) or one outer split of it, by
/// factors `d` and `s` that divide its extent, and one of `d`, `s` divides the other: then
/// stream chunk `i` lies within the shard of device `i / (s / d)` (s ≥ d) or is the shards of
/// devices `i * (d / s) + j` (d > s), which lowering broadcasts piece by piece.
pub(crate) fn nests_evenly(
    f: &Fusion,
    (pl, pd): (IterDomainId, IterDomainId),
    (cs, sd): (IterDomainId, IterDomainId),
) -> bool {
    let direct = |id: IterDomainId, logical: IterDomainId| {
        id == logical
            || f.id(id).definition.is_some_and(|e| {
                matches!(
                    f.id_expr(e),
                    IdExpr::Split { input, outer, kind: weave_ir::SplitKind::Outer, .. }
                        if *input == logical && *outer == id
                )
            })
    };
    let ev = |id: IterDomainId| f.eval(&f.id(id).extent).filter(|v| *v > 0);
    let (Some(t), Some(d), Some(s)) = (ev(pl), ev(pd), ev(sd)) else {
        return false;
    };
    direct(pd, pl) && direct(sd, cs) && t % d == 0 && t % s == 0 && (s % d == 0 || d % s == 0)
}

/// True if `expr` is a `set` on one mesh from a tensor split across devices on an axis to a
/// tensor that is not split across devices but stream-split on that axis, whose stream chunks
/// neither match the device shards nor nest with them (`t = 20`, `d = 4`, `s = 3` or `5`: a
/// chunk spans two shards unevenly), so that no Broadcast per chunk obtains it.
/// decompose-reshardings gathers first (an Allgather into a replicated copy outside the stream
/// loop) and the chunks are then local slices of the copy.
pub fn is_unnested_did_to_stream(f: &Fusion, expr: ExprId) -> bool {
    let Some((p, c)) = copy_of(f, expr) else {
        return false;
    };
    if f.mesh_of(p).is_none() || f.mesh_of(p) != f.mesh_of(c) {
        return false;
    }
    let (p_loop, c_loop) = (&f.tensor(p).loop_domain, &f.tensor(c).loop_domain);
    let Some(sd) = parallel_axis(f, c_loop, ParallelType::Stream) else {
        return false;
    };
    if parallel_axis(f, p_loop, ParallelType::Stream).is_some_and(|ps| same_index(f, p, ps, c, sd))
    {
        return false;
    }
    let Some(cs) = ancestor(f, sd, f.tensor(c).root_domain()) else {
        return false;
    };
    let pairs = pairwise_map(f, expr, p);
    DEVICE_TYPES.iter().any(|&pt| {
        let Some(pd) = parallel_axis(f, p_loop, pt) else {
            return false;
        };
        let Some(pl) = ancestor(f, pd, &f.tensor(p).logical) else {
            return false;
        };
        pairs.contains(&(pl, cs))
            && parallel_axis(f, c_loop, pt).is_none()
            && !same_index(f, p, pd, c, sd)
            && !nests_evenly(f, (pl, pd), (cs, sd))
    })
}

/// True if `expr` is a `set` between tensors sharded on the same logical axis by the same
/// device type, but laid out differently along it (`[s, d, ..]` against `[d, ..]`: a device
/// split inside stream chunks on one side only), so that no device's shard moves whole to one
/// other device; or alike, but between meshes of different sizes (whole shards, but not one
/// per receiver). decompose-reshardings makes such a copy an allgather into a replicated
/// tensor on the sender mesh followed by a scatter.
pub fn is_layout_change(f: &Fusion, expr: ExprId) -> bool {
    let Some((p, c)) = copy_of(f, expr) else {
        return false;
    };
    let pairs = pairwise_map(f, expr, p);
    let sizes_differ = match (f.mesh_of(p), f.mesh_of(c)) {
        (Some(pm), Some(cm)) => pm.size() != cm.size(),
        _ => false,
    };
    DEVICE_TYPES.iter().any(|&pt| {
        let Some((pi, ci, axes)) = split_on_both_sides(f, p, c, pt) else {
            return false;
        };
        let same_axis = axes.is_some_and(|axes| pairs.contains(&axes));
        same_axis && (sizes_differ || !same_index(f, p, pi, c, ci))
    })
}

/// A producer axis and the consumer axis it pairs with.
type AxisPair = (IterDomainId, IterDomainId);

/// The loop axes of `p` and `c` parallelized `pt`, when both sides have one, with the pair of
/// axes they split (`p`'s logical axis, `c`'s root axis) when both are found.
fn split_on_both_sides(
    f: &Fusion,
    p: TensorId,
    c: TensorId,
    pt: ParallelType,
) -> Option<(IterDomainId, IterDomainId, Option<AxisPair>)> {
    let pi = parallel_axis(f, &f.tensor(p).loop_domain, pt)?;
    let ci = parallel_axis(f, &f.tensor(c).loop_domain, pt)?;
    let pl = ancestor(f, pi, &f.tensor(p).logical);
    let cr = ancestor(f, ci, f.tensor(c).root_domain());
    Some((pi, ci, pl.zip(cr)))
}

/// The producer and consumer of `expr` when it is a one-to-one copy (`set`, `segment_set`).
pub(crate) fn copy_of(f: &Fusion, expr: ExprId) -> Option<(TensorId, TensorId)> {
    let e = f.expr(expr);
    (matches!(e.kind, ExprKind::Set | ExprKind::SegmentSet)
        && e.inputs.len() == 1
        && e.outputs.len() == 1)
        .then(|| (e.inputs[0], e.outputs[0]))
}

/// True if `expr` is a `set` that moves a device split from one logical axis to another (an
/// AllToAll) that cannot run as one AllToAll, or one per stream chunk: on either side the
/// split cuts the inside of another split of its axis (`[s, d, ..]`, a device split of stream
/// chunks), so the pieces are not blocks of both axes; or one side is stream-split on the axis
/// the other side splits across devices, so a chunk of the stream axis is not a chunk of every
/// device's shard. decompose-reshardings gathers first (an allgather, per stream chunk where
/// it can), and the copy from the gathered tensor is a local slice.
pub fn is_nested_all_to_all(f: &Fusion, expr: ExprId) -> bool {
    let Some((p, c)) = copy_of(f, expr) else {
        return false;
    };
    let pairs = pairwise_map(f, expr, p);
    // The split that makes `id` cuts another split's output (not an axis of `within`), and
    // every split above it is by stream or serial chunks: a device split nested in another
    // device split is a different exchange (`reorder-sharded-axis` names it).
    let nested = |id: IterDomainId, within: &[IterDomainId]| {
        let mut cur = id;
        let mut depth = 0;
        while !within.contains(&cur) {
            let Some(def) = f.id(cur).definition else {
                return false;
            };
            let IdExpr::Split {
                input,
                outer,
                inner,
                ..
            } = f.id_expr(def)
            else {
                return false;
            };
            let sibling = if *outer == cur { *inner } else { *outer };
            if depth > 0 && f.id(sibling).parallel.is_device() {
                return false;
            }
            cur = *input;
            depth += 1;
        }
        depth > 1
    };
    DEVICE_TYPES.iter().any(|&pt| {
        let Some((pi, ci, Some((pl, cr)))) = split_on_both_sides(f, p, c, pt) else {
            return false;
        };
        let moved = !pairs.contains(&(pl, cr));
        // The logical axis a side is stream-split on.
        let stream_axis = |t: TensorId, within: &[IterDomainId]| {
            parallel_axis(f, &f.tensor(t).loop_domain, ParallelType::Stream)
                .and_then(|id| ancestor(f, id, within))
        };
        let streams_the_other_side = stream_axis(c, f.tensor(c).root_domain())
            .is_some_and(|cs| pairs.contains(&(pl, cs)))
            || stream_axis(p, &f.tensor(p).logical).is_some_and(|ps| pairs.contains(&(ps, cr)));
        moved
            && (nested(pi, &f.tensor(p).logical)
                || nested(ci, f.tensor(c).root_domain())
                || streams_the_other_side)
    })
}

fn build(
    f: &Fusion,
    kind: CommunicationType,
    red_op: Option<ReduceOp>,
    parallel: Option<ParallelType>,
    (p, pa): (TensorId, Option<IterDomainId>),
    (c, ca): (TensorId, Option<IterDomainId>),
    instances: Vec<TeamInstance>,
) -> CommunicationInfo {
    let first = instances.first().cloned().unwrap_or(TeamInstance {
        team: Vec::new(),
        root: None,
    });
    CommunicationInfo {
        kind,
        team: first.team,
        root: first.root,
        red_op: if kind.is_reduction() { red_op } else { None },
        parallel,
        producer_axis: pa.map(|id| sharded_axis(f, p, id)),
        consumer_axis: ca.map(|id| sharded_axis(f, c, id)),
        instances,
        root_sends_pieces: false,
    }
}

fn sharded_axis(f: &Fusion, t: TensorId, id: IterDomainId) -> ShardedAxis {
    ShardedAxis {
        id,
        axis: f.visible_axes(t).iter().position(|x| *x == id),
    }
}

/// A team rooted at `root`, which is appended when it is not a member.
fn with_root(mut team: Vec<i64>, root: i64) -> TeamInstance {
    if !team.contains(&root) {
        team.push(root);
    }
    let index = team.iter().position(|d| *d == root).expect("just added");
    TeamInstance {
        team,
        root: Some(RootKind::Member {
            index,
            device: root,
        }),
    }
}

/// One instance per receiver: the sender mesh plus that receiver, rooted at it.
fn per_receiver(senders: &DeviceMesh, receivers: &DeviceMesh) -> Vec<TeamInstance> {
    receivers
        .devices()
        .iter()
        .map(|r| with_root(senders.devices().to_vec(), *r))
        .collect()
}

/// The 1-D slices of `mesh` along the axis `pt` indexes (the whole mesh when 1-D), each a
/// team with root `root`.
pub fn slices(mesh: &DeviceMesh, pt: ParallelType, root: Option<RootKind>) -> Vec<TeamInstance> {
    let shape = mesh.shape();
    let rank = shape.len();
    let Some(from_end) = pt.mesh_axis_from_end().filter(|a| *a < rank) else {
        return vec![TeamInstance {
            team: mesh.devices().to_vec(),
            root,
        }];
    };
    let axis = rank - 1 - from_end;
    let stride: usize = shape[axis + 1..].iter().product();
    let (n, len) = (mesh.size(), shape[axis]);
    let mut out = Vec::new();
    for start in 0..n {
        // A slice starts at every flat index whose coordinate along `axis` is 0.
        if !(start / stride).is_multiple_of(len) {
            continue;
        }
        let team = (0..len)
            .map(|k| mesh.devices()[start + k * stride])
            .collect();
        out.push(TeamInstance { team, root });
    }
    out
}

/// The id of `within` that `id` derives from through split inputs and merge outer inputs
/// (nvFuser's `getShardedLogicalAxis` walk, which also passes through the inner output of a
/// stream split when a device split cuts each stream chunk), if any.
pub fn ancestor(f: &Fusion, id: IterDomainId, within: &[IterDomainId]) -> Option<IterDomainId> {
    let mut cur = id;
    loop {
        if within.contains(&cur) {
            return Some(cur);
        }
        let e = f.id(cur).definition?;
        cur = match f.id_expr(e) {
            IdExpr::Split { input, .. } => *input,
            IdExpr::Merge { outer, .. } => *outer,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_of_a_two_dimensional_mesh() {
        let m = DeviceMesh::new(vec![2, 3], vec![0, 1, 2, 3, 4, 5]).unwrap();
        let teams =
            |pt| -> Vec<Vec<i64>> { slices(&m, pt, None).into_iter().map(|t| t.team).collect() };
        assert_eq!(
            teams(ParallelType::DIDx),
            vec![vec![0, 1, 2], vec![3, 4, 5]]
        );
        assert_eq!(
            teams(ParallelType::DIDy),
            vec![vec![0, 3], vec![1, 4], vec![2, 5]]
        );
        let one = DeviceMesh::arange(4).unwrap();
        assert_eq!(
            slices(&one, ParallelType::DIDx, None)[0].team,
            vec![0, 1, 2, 3]
        );
    }

    #[test]
    fn roots_are_team_indices() {
        assert_eq!(
            with_root(vec![1, 2], 0),
            TeamInstance {
                team: vec![1, 2, 0],
                root: Some(RootKind::Member {
                    index: 2,
                    device: 0
                })
            }
        );
    }
}
