//! `propagate-shardings`: give every tensor the device (`DIDx`, `DIDy`) and `Stream`
//! parallelization its neighbours imply (reference/nvfuser-host-ir.md §2.5, nvFuser's
//! `PropagateShardingsPass`).
//!
//! Contract.
//!
//! * Input: an [`crate::Ir::Fusion`] as loaded (schedules applied, verified). Output: the same
//!   fusion, with loop domains split and parallelized and meshes inherited; no expr or tensor
//!   is added or removed, and allocation domains are untouched.
//! * A tensor is *user-sharded* when the user wrote a schedule block for it (its
//!   [`weave_ir::TensorView::schedule`] is not empty). User-sharded tensors keep their
//!   sharding, except that fusion inputs may still receive `Stream`, and that a user-sharded
//!   op output without a mesh (a schedule of stream splits only, no `mesh = …`) chose its
//!   streams but not its devices: it still receives the device types and the mesh.
//! * `Stream` never lands on a reduction axis ([`weave_transform::SkipReason::StreamOnReduction`]):
//!   a consumer that reduces over a stream-split axis of its operand stays unstreamed (its own
//!   segment, outside that loop), since chunking the reduction would need an accumulation
//!   across chunks.
//! * A device split crosses a `reshape` only where its shards are blocks of one axis on both
//!   sides ([`weave_transform::SkipReason::NotABlockAcrossReshape`]): a split of `b * t` by
//!   `d` reaches `b` only when `d` divides `b`; otherwise the other side stays unsplit and
//!   decompose-reshardings reshapes whole, then splits the result.
//! * Idempotent: a second run finds every parallel type in place and changes nothing.
//!
//! Algorithm, with [`weave_transform::replay_loop_like`] doing each replay (it skips a type
//! the target already has, an axis the target has no mapping for, or meshes of different
//! sizes, and gives a target without a mesh the reference's):
//!
//! 1. **Forward**, exprs in program order. The reference inputs are ordered `linear`: weight,
//!    bias, input; `matmul`: B then A; otherwise by the number of device/stream loop axes,
//!    most first (ties: the larger mesh first, then operand order). Each output that is not
//!    user-sharded receives, from each reference in turn, the parallel types it lacks. Taking
//!    the weight first means a linear whose input is sharded on M and weight on N gets
//!    `DIDx` on N only, never twice. `Stream` alone comes first from A (the input of a
//!    `linear`): chunks of the rows, M, are what a loop overlaps, and in attention's
//!    `scores = matmul(q, kᵀ)` with `q` and `k` both chunked by tokens, chunking the scores
//!    by keys would leave the softmax, which reduces over the keys, outside the loop.
//! 2. **Backward**, exprs in reverse order. The most parallel output is the reference. Inputs
//!    that are intermediates and not user-sharded receive every missing type; fusion inputs
//!    receive `Stream` only (nvFuser: "allow inputs to be stream parallelized"), so a stream
//!    split on an output reaches back to the fusion inputs.

use std::collections::{HashMap, HashSet};

use weave_host_ir::ids::SecondaryMap;
use weave_ir::{print, Diagnostic, ExprId, ExprKind, Fusion, IrResult, ParallelType, TensorId};
use weave_transform::{replay_loop_like, IdGraph};

use crate::resharding::{DEVICE_AND_STREAM_TYPES, DEVICE_TYPES};
use crate::shared::FusionRewrite;

/// The `propagate-shardings` pass (see the module doc).
#[derive(Clone, Copy, Debug, Default)]
pub struct PropagateShardings;

impl FusionRewrite for PropagateShardings {
    const NAME: &'static str = "propagate-shardings";
    const SUMMARY: &'static str =
        "give every tensor the DID/Stream shardings its neighbours imply (forward, then backward)";
    const REWRITE: fn(&mut Fusion) -> IrResult<()> = propagate_shardings;
}

/// True if the user wrote a schedule block for `t`.
pub fn is_user_sharded(f: &Fusion, t: TensorId) -> bool {
    !f.tensor(t).schedule.is_empty()
}

/// The number of device and stream axes among `t`'s loop axes.
pub fn num_parallel_axes(f: &Fusion, t: TensorId) -> usize {
    f.tensor(t)
        .loop_domain
        .iter()
        .filter(|i| f.id(**i).parallel.is_device_or_stream())
        .count()
}

/// The inputs of `expr` in the order forward propagation takes them as references (see the
/// module doc), each once.
pub fn reference_inputs(f: &Fusion, expr: ExprId) -> Vec<TensorId> {
    let e = f.expr(expr);
    let mut refs: Vec<TensorId> = match e.kind {
        ExprKind::Linear => {
            let mut v = vec![e.inputs[1]];
            v.extend(e.inputs.get(2));
            v.push(e.inputs[0]);
            v
        }
        ExprKind::Matmul => vec![e.inputs[1], e.inputs[0]],
        _ => {
            let mut v = e.inputs.clone();
            let mesh_size = |t: TensorId| f.mesh_of(t).map(|m| m.shape().len()).unwrap_or(0);
            v.sort_by_key(|t| std::cmp::Reverse((num_parallel_axes(f, *t), mesh_size(*t))));
            v
        }
    };
    let mut seen = HashSet::new();
    refs.retain(|t| seen.insert(*t));
    refs
}

/// Replays `types` from `reference` onto `target`, naming both in errors.
pub(crate) fn replay(
    f: &mut Fusion,
    reference: TensorId,
    target: TensorId,
    graph: &IdGraph,
    types: &[ParallelType],
) -> IrResult<()> {
    replay_loop_like(f, reference, target, graph, types)
        .map(|_| ())
        .map_err(|d| {
            Diagnostic::new(format!(
                "propagating shardings from `{}` to `{}`: {}",
                f.tensor(reference).name,
                f.tensor(target).name,
                d.message
            ))
            .or_at(d.span)
        })
}

/// Propagates shardings forward, then backward (see the module doc), and repeats both until
/// nothing changes: a mesh or stream split that the backward phase gives a fusion input
/// reaches that input's other consumers in the next forward phase.
pub fn propagate_shardings(f: &mut Fusion) -> IrResult<()> {
    let user = UserSharded {
        all: f
            .tensors_in_order()
            .into_iter()
            .filter(|t| is_user_sharded(f, *t))
            .map(|t| (t, ()))
            .collect(),
        streams_only: f
            .tensors_in_order()
            .into_iter()
            .filter(|t| is_user_sharded(f, *t) && !f.is_input(*t) && f.tensor(*t).mesh.is_none())
            .map(|t| (t, ()))
            .collect(),
    };
    // Each replay runs between one expr's operands and outputs, so it maps axes by that expr
    // alone: the whole fusion's graph may put two axes of one tensor in one class (the query
    // and key axes of attention scores both come from one token axis), and a replay through
    // it would parallelize the wrong one.
    let graphs: HashMap<ExprId, IdGraph> = f
        .exprs()
        .iter()
        .map(|e| (*e, IdGraph::build_for_exprs(f, &[*e])))
        .collect();
    // Every round adds a parallel type or a mesh somewhere, so this terminates; the bound is
    // a safety net.
    let rounds = 2 + 3 * f.tensors_in_order().len();
    for _ in 0..rounds {
        let before = print::fusion_to_string(f);
        propagate_once(f, &user, &graphs)?;
        if print::fusion_to_string(f) == before {
            break;
        }
    }
    Ok(())
}

/// The tensors the user scheduled, and among them the op outputs that chose only streams.
struct UserSharded {
    all: SecondaryMap<TensorId, ()>,
    streams_only: SecondaryMap<TensorId, ()>,
}

impl UserSharded {
    /// The parallel types an intermediate `t` may still receive from its neighbours.
    fn receivable(&self, t: TensorId) -> &'static [ParallelType] {
        if self.streams_only.contains_key(t) {
            &DEVICE_TYPES
        } else if self.all.contains_key(t) {
            &[]
        } else {
            &DEVICE_AND_STREAM_TYPES
        }
    }
}

fn propagate_once(
    f: &mut Fusion,
    user: &UserSharded,
    graphs: &HashMap<ExprId, IdGraph>,
) -> IrResult<()> {
    let exprs: Vec<ExprId> = f.exprs().to_vec();

    for &e in &exprs {
        let targets: Vec<(TensorId, &[ParallelType])> = f
            .expr(e)
            .outputs
            .iter()
            .map(|o| (*o, user.receivable(*o)))
            .filter(|(_, types)| !types.is_empty())
            .collect();
        if targets.is_empty() {
            continue;
        }
        let graph = &graphs[&e];
        if matches!(f.expr(e).kind, ExprKind::Matmul | ExprKind::Linear) {
            let a = f.expr(e).inputs[0];
            for &(t, types) in &targets {
                if types.contains(&ParallelType::Stream) {
                    replay(f, a, t, graph, &[ParallelType::Stream])
                        .map_err(|d| d.or_at(f.expr(e).span))?;
                }
            }
        }
        for r in reference_inputs(f, e) {
            for &(t, types) in &targets {
                replay(f, r, t, graph, types).map_err(|d| d.or_at(f.expr(e).span))?;
            }
        }
    }

    for &e in exprs.iter().rev() {
        let outputs = f.expr(e).outputs.clone();
        // The most parallel output; the first among equals.
        let Some(r) = outputs
            .iter()
            .copied()
            .rev()
            .max_by_key(|o| num_parallel_axes(f, *o))
        else {
            continue;
        };
        let mut inputs = f.expr(e).inputs.clone();
        let mut seen = HashSet::new();
        inputs.retain(|t| seen.insert(*t));
        for x in inputs {
            let types: &[ParallelType] = if f.is_input(x) {
                &[ParallelType::Stream]
            } else {
                user.receivable(x)
            };
            if types.is_empty() {
                continue;
            }
            replay(f, r, x, &graphs[&e], types).map_err(|d| d.or_at(f.expr(e).span))?;
        }
    }
    Ok(())
}
