//! Transform replay: make a target tensor's loop domain parallel "like" a reference's
//! (nvFuser's `shardLoopLike`), the building block of sharding propagation.
//!
//! For every reference loop axis whose parallel type is selected, [`replay_loop_like`]
//!
//! 1. walks the axis' chain of splits back to a reference logical axis, or through a
//!    reshape's split to a root axis (a chain through any other merge is not replayed);
//! 2. finds the most derived id of that chain that the [`IdGraph`] maps to a target logical
//!    axis; failing that, maps the chain's start — a reshape-merged logical axis by the
//!    merge's outer root axis — to a target logical axis, or to a target root axis and from
//!    there to the outermost target logical axis made from it (nvFuser's rule across
//!    reshapes); a device split is carried across a reshape only where its shards are blocks
//!    of one axis on both sides (one outer split whose factor divides the outer axis `b` of
//!    `b * t`, never the inner axis `t`), else it is skipped
//!    ([`SkipReason::NotABlockAcrossReshape`]);
//! 3. replays the rest of the chain (same kinds and factors) onto the target's loop domain,
//!    reusing splits already replayed in this call or identical splits the target already
//!    has;
//! 4. parallelizes the target axis that corresponds to the reference axis, with the checks
//!    of [`crate::schedule::parallelize`].
//!
//! An axis is skipped, with the reason recorded in the [`ReplayReport`], when the target has
//! no mapped axis (a broadcast, say), the target axis is a reduction axis and the type is
//! `Stream` (a reduction is never chunked over streams), the target axis is already parallel or was
//! transformed differently, the target already has that parallel type, or the meshes differ
//! in size along a device type. A target without a mesh inherits the reference's.
//!
//! The graph may predate earlier replays: only logical and root axes are looked up in it.

use std::collections::HashMap;

use weave_ir::{
    Fusion, IdExpr, IdExprId, IrResult, IterDomainId, IterType, ParallelType, TensorId,
};

use crate::id_graph::IdGraph;
use crate::schedule::{self, DomainKind};

/// A reference axis whose parallelization was replayed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayedAxis {
    /// The parallel type given to `target`.
    pub parallel: ParallelType,
    /// The reference loop axis.
    pub reference: IterDomainId,
    /// The target loop axis now parallelized.
    pub target: IterDomainId,
}

/// A reference axis that was not replayed, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkippedAxis {
    /// The reference axis' parallel type.
    pub parallel: ParallelType,
    /// The reference loop axis.
    pub reference: IterDomainId,
    /// Why it was skipped.
    pub reason: SkipReason,
}

/// Why a reference axis was not replayed onto the target.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SkipReason {
    /// The reference axis comes from a merge; only split chains are replayed.
    #[error("the reference axis derives from a merge; only split chains are replayed")]
    ThroughMerge,
    /// No target logical axis is mapped to the reference's logical axis.
    #[error("no target axis maps to the reference's logical axis (a broadcast, or unrelated)")]
    NoMappedAxis,
    /// The reference has a device axis but no mesh.
    #[error("the reference has a device axis but no mesh")]
    ReferenceHasNoMesh,
    /// The two meshes differ in size along a device type (`None`: the mesh lacks that axis).
    #[error("the meshes differ along {parallel}: {reference:?} devices in the reference, {target:?} in the target")]
    MeshSizeMismatch {
        /// The device type.
        parallel: ParallelType,
        /// The reference mesh size along it.
        reference: Option<usize>,
        /// The target mesh size along it.
        target: Option<usize>,
    },
    /// The target already has an axis of this parallel type (among axes of the same
    /// reduction-ness as the mapped one).
    #[error("the target already has a {0} axis")]
    TargetHasParallelType(ParallelType),
    /// The target axis to split or parallelize is already parallel.
    #[error("the target axis is already parallelized as {0}")]
    TargetAxisParallelized(ParallelType),
    /// The target axis was transformed differently (it is no longer in the loop domain).
    #[error("the target axis is no longer in the target's loop domain (scheduled differently)")]
    NotInLoopDomain,
    /// A `Stream` split would land on a reduction axis of the target: a reduction chunked
    /// over streams needs an accumulation across chunks, so the target stays unstreamed.
    #[error("the target axis is a reduction axis, which is never stream-parallel")]
    StreamOnReduction,
    /// A device split would cross a `reshape` (a merge or split of the axis) where its shards
    /// are not blocks of one axis on both sides: a split of `b * t` whose factor does not
    /// divide `b`, a split of the inner axis `t` of `[b, t]`, or a split nested in another
    /// split. The target stays unsplit; decompose-reshardings reshapes whole and then
    /// reshards.
    #[error(
        "the device split's shards would not be blocks of one axis on the other side of a reshape"
    )]
    NotABlockAcrossReshape,
}

/// What [`replay_loop_like`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Replayed axes, in reference loop order.
    pub applied: Vec<ReplayedAxis>,
    /// Skipped axes, in reference loop order.
    pub skipped: Vec<SkippedAxis>,
    /// True if the target took the reference's mesh.
    pub inherited_mesh: bool,
}

/// One split of a reference chain: the expr and the output the chain continues with.
struct ChainStep {
    expr: IdExprId,
    taken: IterDomainId,
}

/// Replays the split chains of `reference`'s loop axes parallelized with one of
/// `parallel_types` onto `target`'s loop domain and parallelizes the matching target axes
/// (see the module doc). `graph` maps logical axes between the two; build it with
/// [`IdGraph::build`] on the fusion before replay. `Serial` in `parallel_types` is ignored.
/// Errors come from the parallelization checks (a target axis that does not divide by the
/// mesh size, say); skips are not errors.
pub fn replay_loop_like(
    f: &mut Fusion,
    reference: TensorId,
    target: TensorId,
    graph: &IdGraph,
    parallel_types: &[ParallelType],
) -> IrResult<ReplayReport> {
    let mut report = ReplayReport::default();
    if f.tensor(target).mesh.is_none() {
        if let Some(m) = f.tensor(reference).mesh {
            f.tensor_mut(target).mesh = Some(m);
            report.inherited_mesh = true;
        }
    }
    // Reference ids → target ids, shared by all axes of this call so that a chain prefix
    // (the stream split before a device split of its inner output) is replayed once.
    let mut ref2tgt: HashMap<IterDomainId, IterDomainId> = HashMap::new();
    let ref_loop = f.tensor(reference).loop_domain.clone();
    for rid in ref_loop {
        let pt = f.id(rid).parallel;
        if pt == ParallelType::Serial || !parallel_types.contains(&pt) {
            continue;
        }
        let mut skip = |reason: SkipReason| {
            report.skipped.push(SkippedAxis {
                parallel: pt,
                reference: rid,
                reason,
            })
        };
        let (logical, chain) = match split_chain(f, reference, rid) {
            Ok(c) => c,
            Err(reason) => {
                skip(reason);
                continue;
            }
        };
        if pt.is_device() {
            let Some(rm) = f.mesh_of(reference) else {
                skip(SkipReason::ReferenceHasNoMesh);
                continue;
            };
            let rs = rm.size_of(pt);
            let ts = f.mesh_of(target).and_then(|m| m.size_of(pt));
            if rs.is_none() || rs != ts {
                skip(SkipReason::MeshSizeMismatch {
                    parallel: pt,
                    reference: rs,
                    target: ts,
                });
                continue;
            }
        }
        // The most derived chain id with a mapped target logical axis starts the replay.
        let mut ids = vec![logical];
        ids.extend(chain.iter().map(|c| c.taken));
        let start = (0..ids.len()).rev().find_map(|k| {
            if let Some(t) = ref2tgt.get(&ids[k]) {
                return Some((k, *t));
            }
            let tv = f.tensor(target);
            tv.logical
                .iter()
                .find(|t| graph.are_mapped(ids[k], **t))
                .map(|t| (k, *t))
        });
        let (start, crossing) = match start {
            Some(s) => (Some(s), Crossing::None),
            None => match map_logical(f, graph, reference, logical, target) {
                Some((t, c)) => (Some((0, t)), c),
                None => (None, Crossing::None),
            },
        };
        let Some((k0, tl)) = start else {
            skip(SkipReason::NoMappedAxis);
            continue;
        };
        let chain = &chain[k0..];
        if pt.is_device() && !device_blocks_across_reshape(f, reference, chain, &crossing) {
            skip(SkipReason::NotABlockAcrossReshape);
            continue;
        }
        let logical = ids[k0];
        ref2tgt.insert(logical, tl);
        let reduction = f.id(tl).iter_type == IterType::Reduction;
        if reduction && pt == ParallelType::Stream {
            skip(SkipReason::StreamOnReduction);
            continue;
        }
        let has_pt = f.tensor(target).loop_domain.iter().any(|i| {
            let d = f.id(*i);
            d.parallel == pt && (d.iter_type == IterType::Reduction) == reduction
        });
        if has_pt {
            skip(SkipReason::TargetHasParallelType(pt));
            continue;
        }
        // Replay the chain.
        let mut cur = tl;
        let mut failed = None;
        for step in chain {
            let IdExpr::Split {
                input,
                outer,
                inner,
                factor,
                kind,
            } = f.id_expr(step.expr).clone()
            else {
                unreachable!("chains hold splits only");
            };
            debug_assert_eq!(ref2tgt.get(&input), Some(&cur));
            if let (Some(to), Some(ti)) = (ref2tgt.get(&outer), ref2tgt.get(&inner)) {
                cur = if step.taken == outer { *to } else { *ti };
                continue;
            }
            let (to, ti) = match existing_split(f, target, cur, &factor, kind) {
                Some(pair) => pair,
                None => {
                    let Some(pos) = f.tensor(target).loop_domain.iter().position(|i| *i == cur)
                    else {
                        failed = Some(SkipReason::NotInLoopDomain);
                        break;
                    };
                    let p = f.id(cur).parallel;
                    if p != ParallelType::Serial {
                        failed = Some(SkipReason::TargetAxisParallelized(p));
                        break;
                    }
                    schedule::split(f, target, DomainKind::Loop, pos, factor, kind)?
                }
            };
            ref2tgt.insert(outer, to);
            ref2tgt.insert(inner, ti);
            cur = if step.taken == outer { to } else { ti };
        }
        if let Some(reason) = failed {
            skip(reason);
            continue;
        }
        let Some(pos) = f.tensor(target).loop_domain.iter().position(|i| *i == cur) else {
            skip(SkipReason::NotInLoopDomain);
            continue;
        };
        let p = f.id(cur).parallel;
        if p != ParallelType::Serial {
            skip(SkipReason::TargetAxisParallelized(p));
            continue;
        }
        schedule::parallelize(f, target, pos, pt)?;
        report.applied.push(ReplayedAxis {
            parallel: pt,
            reference: rid,
            target: cur,
        });
    }
    Ok(report)
}

/// The axis `id` derives from through splits, and the splits from it to `id` in application
/// order. The walk goes through the root→logical splits of a reshape (so the chain may start
/// at a root axis) and stops at a logical axis made by a reshape's merge; any other merge
/// makes the chain unreplayable.
fn split_chain(
    f: &Fusion,
    t: TensorId,
    id: IterDomainId,
) -> Result<(IterDomainId, Vec<ChainStep>), SkipReason> {
    let logical = &f.tensor(t).logical;
    let mut chain = Vec::new();
    let mut cur = id;
    while let Some(e) = f.id(cur).definition {
        match f.id_expr(e) {
            IdExpr::Split { input, .. } => {
                chain.push(ChainStep {
                    expr: e,
                    taken: cur,
                });
                cur = *input;
            }
            IdExpr::Merge { .. } if logical.contains(&cur) => break,
            IdExpr::Merge { .. } => return Err(SkipReason::ThroughMerge),
        }
    }
    chain.reverse();
    Ok((cur, chain))
}

/// How [`map_logical`] reached the target axis.
enum Crossing {
    /// Directly: the start axis and the target axis are mapped.
    None,
    /// Across a reshape, between an outer axis `b` and a merge `b * t` (either way): a split
    /// of the start by `f` cuts the same blocks on both sides when `f` divides the extents
    /// of all these axes (`b` among them).
    Outer(Vec<IterDomainId>),
    /// Across a reshape from the inner axis `t` of a merge `b * t`: a block of `t` is no
    /// block of the merge.
    Inner,
}

/// True when replaying `chain` (the splits from the start axis to a device axis) across the
/// reshape `crossing` describes, and through the reshape splits in `chain` itself, gives
/// device shards that are blocks of one axis on both sides. A mapping across a merge takes
/// one outer split whose factor divides the outer axis; a chain through a reshape's split
/// of the reference (root `b * t` into `[b, t]`) must take its outer output.
fn device_blocks_across_reshape(
    f: &Fusion,
    reference: TensorId,
    chain: &[ChainStep],
    crossing: &Crossing,
) -> bool {
    let logical = &f.tensor(reference).logical;
    let through_inner = chain.iter().any(|step| {
        matches!(f.id_expr(step.expr), IdExpr::Split { inner, .. } if *inner == step.taken)
            && logical.contains(&step.taken)
            && f.tensor(reference).root.is_some()
    });
    if through_inner {
        return false;
    }
    match crossing {
        Crossing::None => true,
        Crossing::Inner => false,
        Crossing::Outer(axes) => {
            let [step] = chain else {
                return false;
            };
            let IdExpr::Split {
                outer,
                factor,
                kind: weave_ir::SplitKind::Outer,
                ..
            } = f.id_expr(step.expr)
            else {
                return false;
            };
            if *outer != step.taken {
                return false;
            }
            let Some(fv) = f.eval(factor) else {
                return true;
            };
            axes.iter().all(|a| match f.eval(&f.id(*a).extent) {
                Some(e) => fv > 0 && e % fv == 0,
                None => true,
            })
        }
    }
}

/// The target logical axis mapped to the start `logical` of a reference chain (a logical or
/// root axis), looking through reshapes on both sides, and how it was reached.
fn map_logical(
    f: &Fusion,
    graph: &IdGraph,
    reference: TensorId,
    logical: IterDomainId,
    target: TensorId,
) -> Option<(IterDomainId, Crossing)> {
    // A logical axis merged by a reshape of the reference stands for its outer root axis.
    let mut candidates = vec![(logical, false)];
    if let Some(e) = f.id(logical).definition {
        let root = f.tensor(reference).root_domain();
        if let IdExpr::Merge { outer, .. } = f.id_expr(e) {
            if root.contains(outer) {
                candidates.push((*outer, true));
            }
        }
    }
    let tv = f.tensor(target);
    for (c, merged) in candidates {
        if let Some(t) = tv.logical.iter().find(|t| graph.are_mapped(c, **t)) {
            let crossing = if merged {
                Crossing::Outer(vec![c, *t])
            } else {
                Crossing::None
            };
            return Some((*t, crossing));
        }
        // Across a reshape of the target: the outermost logical axis made from a mapped root.
        let Some(root) = &tv.root else { continue };
        for r in root.iter().filter(|r| graph.are_mapped(c, **r)) {
            for l in &tv.logical {
                let Some(e) = f.id(*l).definition else {
                    continue;
                };
                match f.id_expr(e) {
                    IdExpr::Split { input, outer, .. } if input == r && outer == l => {
                        return Some((*l, Crossing::Outer(vec![c, *l])))
                    }
                    IdExpr::Merge { outer, .. } if outer == r => {
                        return Some((*l, Crossing::Outer(vec![c, *r])))
                    }
                    IdExpr::Merge { inner, .. } if inner == r => {
                        return Some((*l, Crossing::Inner))
                    }
                    _ => {}
                }
            }
        }
    }
    None
}

/// An identical split of `id` (same kind, equal factor) already among the ancestors of the
/// target's loop domain.
fn existing_split(
    f: &Fusion,
    t: TensorId,
    id: IterDomainId,
    factor: &weave_ir::Scalar,
    kind: weave_ir::SplitKind,
) -> Option<(IterDomainId, IterDomainId)> {
    let mut stack: Vec<IterDomainId> = f.tensor(t).loop_domain.clone();
    let mut seen = std::collections::HashSet::new();
    while let Some(x) = stack.pop() {
        if !seen.insert(x) {
            continue;
        }
        let Some(e) = f.id(x).definition else {
            continue;
        };
        match f.id_expr(e) {
            IdExpr::Split {
                input,
                outer,
                inner,
                factor: g,
                kind: k,
            } => {
                if *input == id && *k == kind && f.same_extent(g, factor) {
                    return Some((*outer, *inner));
                }
                stack.push(*input);
            }
            IdExpr::Merge { outer, inner, .. } => {
                stack.push(*outer);
                stack.push(*inner);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{
        devices, f32_input, loop_of, n, outer, reshape, row_parallel_unscheduled, split_on,
    };
    use weave_ir::{ExprKind, Scalar};

    const STREAM_AND_DIDX: [ParallelType; 2] = [ParallelType::Stream, ParallelType::DIDx];

    /// The row-parallel linear with only the inputs scheduled.
    fn row_parallel() -> (Fusion, TensorId, TensorId, TensorId) {
        let (mut f, inp, w, out) = row_parallel_unscheduled();
        f.tensor_mut(inp).schedule = vec![
            outer(0, n("s"), Some(ParallelType::Stream)),
            outer(2, n("d"), Some(ParallelType::DIDx)),
        ];
        f.tensor_mut(w).schedule = vec![outer(1, n("d"), Some(ParallelType::DIDx))];
        schedule::apply_schedules(&mut f).unwrap();
        (f, inp, w, out)
    }

    /// Replays the DIDx axis of `reference` onto `target`, which must take it once: the loop
    /// of `target` afterwards.
    fn replay_did_once(
        f: &mut Fusion,
        reference: TensorId,
        target: TensorId,
    ) -> Vec<(ParallelType, Scalar)> {
        let g = IdGraph::build(f);
        let rep = replay_loop_like(f, reference, target, &g, &[ParallelType::DIDx]).unwrap();
        assert_eq!(rep.applied.len(), 1, "{:?}", rep.skipped);
        loop_of(f, target)
    }

    #[test]
    fn linear_output_takes_stream_and_reduction_sharding() {
        let (mut f, inp, _, out) = row_parallel();
        let g = IdGraph::build(&f);
        let rep = replay_loop_like(&mut f, inp, out, &g, &STREAM_AND_DIDX).unwrap();
        assert!(rep.inherited_mesh);
        assert!(rep.skipped.is_empty(), "{:?}", rep.skipped);
        assert_eq!(rep.applied.len(), 2);
        assert_eq!(
            loop_of(&f, out),
            vec![
                (ParallelType::Stream, Scalar::c(4)),
                (ParallelType::Serial, n("t").ceil_div(Scalar::c(4))),
                (ParallelType::Serial, n("h")),
                (ParallelType::DIDx, Scalar::c(2)),
                (ParallelType::Serial, n("h").mul(4).ceil_div(Scalar::c(2))),
            ]
        );
        let l = f.tensor(out).loop_domain[3];
        assert_eq!(f.id(l).iter_type, IterType::Reduction);
        // Replaying again changes nothing: every type is already there.
        let again = replay_loop_like(&mut f, inp, out, &g, &STREAM_AND_DIDX).unwrap();
        assert!(again.applied.is_empty());
        assert_eq!(
            again
                .skipped
                .iter()
                .map(|s| s.reason.clone())
                .collect::<Vec<_>>(),
            vec![
                SkipReason::TargetHasParallelType(ParallelType::Stream),
                SkipReason::TargetHasParallelType(ParallelType::DIDx)
            ]
        );
    }

    #[test]
    fn only_selected_types_are_replayed() {
        let (mut f, _, w, out) = row_parallel();
        let g = IdGraph::build(&f);
        // w's DIDx is on its k axis, which maps to the output's reduction axis.
        let rep = replay_loop_like(&mut f, w, out, &g, &[ParallelType::Stream]).unwrap();
        assert!(rep.applied.is_empty() && rep.skipped.is_empty());
        assert_eq!(f.tensor(out).loop_domain, f.tensor(out).logical);
        let rep = replay_loop_like(&mut f, w, out, &g, &[ParallelType::DIDx]).unwrap();
        assert_eq!(rep.applied.len(), 1);
        assert_eq!(f.id(rep.applied[0].target).iter_type, IterType::Reduction);
    }

    #[test]
    fn stream_never_lands_on_a_reduction_axis() {
        // x [4, 6] stream-split on axis 1; r = sum(x, [1]) reduces that axis.
        let mut f = Fusion::new("stream_reduction");
        let x = f32_input(&mut f, "x", vec![Scalar::c(4), Scalar::c(6)], None);
        let r = f.sum("r", x, &[1]).unwrap();
        f.tensor_mut(x).schedule = vec![outer(1, Scalar::c(2), Some(ParallelType::Stream))];
        schedule::apply_schedules(&mut f).unwrap();
        let g = IdGraph::build(&f);
        let rep = replay_loop_like(&mut f, x, r, &g, &[ParallelType::Stream]).unwrap();
        assert!(rep.applied.is_empty());
        assert_eq!(rep.skipped[0].reason, SkipReason::StreamOnReduction);
        assert_eq!(f.tensor(r).loop_domain, f.tensor(r).logical);
    }

    #[test]
    fn chains_through_an_inner_output_reuse_the_replayed_prefix() {
        // a: [12, 6]; outer_split(0, 3) -> Stream; outer_split(1, 2) -> DIDx on the inner 4.
        let mut f = Fusion::new("chain");
        let m = devices(&mut f, "m", 2);
        let a = f32_input(&mut f, "a", vec![Scalar::c(12), Scalar::c(6)], Some(m));
        let b = f.set("b", a).unwrap();
        f.tensor_mut(a).schedule = vec![
            outer(0, Scalar::c(3), Some(ParallelType::Stream)),
            outer(1, Scalar::c(2), Some(ParallelType::DIDx)),
        ];
        schedule::apply_schedules(&mut f).unwrap();
        let g = IdGraph::build(&f);
        let rep = replay_loop_like(&mut f, a, b, &g, &STREAM_AND_DIDX).unwrap();
        assert_eq!(rep.applied.len(), 2, "{:?}", rep.skipped);
        assert_eq!(loop_of(&f, b), loop_of(&f, a));
        // DIDx alone replays the whole chain, leaving the stream split serial.
        let c = f.set("c", a).unwrap();
        let g = IdGraph::build(&f);
        replay_loop_like(&mut f, a, c, &g, &[ParallelType::DIDx]).unwrap();
        assert_eq!(
            loop_of(&f, c),
            vec![
                (ParallelType::Serial, Scalar::c(3)),
                (ParallelType::DIDx, Scalar::c(2)),
                (ParallelType::Serial, Scalar::c(2)),
                (ParallelType::Serial, Scalar::c(6)),
            ]
        );
    }

    #[test]
    fn backward_replay_from_a_consumer() {
        // b = set(a); b is scheduled, a receives it.
        let mut f = Fusion::new("back");
        f.add_param("t", Some(10)).unwrap();
        let a = f32_input(&mut f, "a", vec![n("t")], None);
        let b = f.set("b", a).unwrap();
        f.tensor_mut(b).schedule = vec![outer(0, Scalar::c(4), Some(ParallelType::Stream))];
        schedule::apply_schedules(&mut f).unwrap();
        let g = IdGraph::build(&f);
        let rep = replay_loop_like(&mut f, b, a, &g, &[ParallelType::Stream]).unwrap();
        assert!(!rep.inherited_mesh);
        assert_eq!(loop_of(&f, a), loop_of(&f, b));
        assert_eq!(
            loop_of(&f, a)[1].1,
            n("t").ceil_div(4),
            "a ragged stream split replays as ceilDiv"
        );
    }

    #[test]
    fn skips_broadcasts_mesh_mismatches_and_differently_scheduled_targets() {
        let mut f = Fusion::new("skips");
        let m2 = devices(&mut f, "m2", 2);
        let m4 = devices(&mut f, "m4", 4);
        let a = f32_input(&mut f, "a", vec![Scalar::c(8), Scalar::c(8)], Some(m2));
        let x = f32_input(&mut f, "x", vec![Scalar::c(8)], Some(m2));
        let xb = f
            .add_op("xb", ExprKind::Broadcast { axes: vec![0] }, &[x])
            .unwrap();
        let s = f.binary("s", weave_ir::BinaryOp::Add, a, xb).unwrap();
        let other = f.set("other", a).unwrap();
        f.tensor_mut(other).mesh = Some(m4);
        let diff = f.set("diff", a).unwrap();
        f.tensor_mut(a).schedule = vec![outer(0, Scalar::c(2), Some(ParallelType::DIDx))];
        f.tensor_mut(diff).schedule = vec![outer(0, Scalar::c(4), None)];
        schedule::apply_schedules(&mut f).unwrap();
        let g = IdGraph::build(&f);

        // s → xb: s's axis 0 maps to a's, not to xb's broadcast.
        f.tensor_mut(s).schedule.clear();
        replay_loop_like(&mut f, a, s, &g, &[ParallelType::DIDx]).unwrap();
        let rep = replay_loop_like(&mut f, s, xb, &g, &[ParallelType::DIDx]).unwrap();
        assert_eq!(rep.skipped[0].reason, SkipReason::NoMappedAxis);

        let rep = replay_loop_like(&mut f, a, other, &g, &[ParallelType::DIDx]).unwrap();
        assert_eq!(
            rep.skipped[0].reason,
            SkipReason::MeshSizeMismatch {
                parallel: ParallelType::DIDx,
                reference: Some(2),
                target: Some(4)
            }
        );
        assert_eq!(
            rep.skipped[0].reason.to_string(),
            "the meshes differ along DIDx: Some(2) devices in the reference, Some(4) in the target"
        );

        let rep = replay_loop_like(&mut f, a, diff, &g, &[ParallelType::DIDx]).unwrap();
        assert_eq!(rep.skipped[0].reason, SkipReason::NotInLoopDomain);
    }

    #[test]
    fn merged_reference_axes_are_skipped() {
        let mut f = Fusion::new("merged");
        let a = f32_input(&mut f, "a", vec![Scalar::c(4), Scalar::c(6)], None);
        let b = f.set("b", a).unwrap();
        schedule::merge(&mut f, a, DomainKind::Loop, 0, 1).unwrap();
        split_on(&mut f, a, 0, Scalar::c(3), ParallelType::Stream);
        let g = IdGraph::build(&f);
        let rep = replay_loop_like(&mut f, a, b, &g, &[ParallelType::Stream]).unwrap();
        assert_eq!(rep.skipped[0].reason, SkipReason::ThroughMerge);
    }

    #[test]
    fn replay_across_a_reshape_uses_the_outermost_logical_axis() {
        // a [2h, 3] -> r = reshape(a, [2, h, 3]); a DIDx-split on axis 0 maps onto r's outer 2.
        let mut f = Fusion::new("reshape");
        f.add_param("h", Some(4)).unwrap();
        let m = devices(&mut f, "m", 2);
        let a = f32_input(&mut f, "a", vec![n("h").mul(2), Scalar::c(3)], Some(m));
        let r = reshape(&mut f, "r", a, vec![Scalar::c(2), n("h"), Scalar::c(3)]);
        f.tensor_mut(a).schedule = vec![outer(0, Scalar::c(2), Some(ParallelType::DIDx))];
        schedule::apply_schedules(&mut f).unwrap();
        let g = IdGraph::build(&f);
        // The id graph maps a's DIDx split output to r's outer logical axis (extent 2),
        // which is parallelized as it is.
        let rep = replay_loop_like(&mut f, a, r, &g, &[ParallelType::DIDx]).unwrap();
        assert_eq!(rep.applied.len(), 1, "{:?}", rep.skipped);
        assert_eq!(rep.applied[0].target, f.tensor(r).logical[0]);
        assert_eq!(f.tensor(r).loop_domain, f.tensor(r).logical);

        // And back: r's outer logical axis is the reshape's split of its root axis, which
        // maps to a's axis 0; the reshape split is replayed onto a.
        let mut f2 = Fusion::new("reshape_back");
        f2.add_param("h", Some(4)).unwrap();
        let m = devices(&mut f2, "m", 2);
        let a = f32_input(&mut f2, "a", vec![n("h").mul(2), Scalar::c(3)], Some(m));
        let r = reshape(&mut f2, "r", a, vec![Scalar::c(2), n("h"), Scalar::c(3)]);
        f2.tensor_mut(r).mesh = Some(m);
        schedule::parallelize(&mut f2, r, 0, ParallelType::DIDx).unwrap();
        assert_eq!(
            replay_did_once(&mut f2, r, a),
            vec![
                (ParallelType::DIDx, Scalar::c(2)),
                (ParallelType::Serial, n("h")),
                (ParallelType::Serial, Scalar::c(3)),
            ]
        );

        // A reshape whose factor differs from the device split: a [4h] split by 2 devices,
        // r = reshape(a, [4, h]): the split is replayed on r's outermost logical axis.
        let mut f3 = Fusion::new("reshape_outermost");
        f3.add_param("h", Some(4)).unwrap();
        let m = devices(&mut f3, "m", 2);
        let a = f32_input(&mut f3, "a", vec![n("h").mul(4)], Some(m));
        let r = reshape(&mut f3, "r", a, vec![Scalar::c(4), n("h")]);
        split_on(&mut f3, a, 0, Scalar::c(2), ParallelType::DIDx);
        assert_eq!(
            replay_did_once(&mut f3, a, r),
            vec![
                (ParallelType::DIDx, Scalar::c(2)),
                (ParallelType::Serial, Scalar::c(2)),
                (ParallelType::Serial, n("h")),
            ]
        );
    }
}
