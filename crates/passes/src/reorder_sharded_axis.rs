//! `reorder-sharded-axis`: make the buffers of Allgather, Gather, Scatter, ReduceScatter and
//! AllToAll contiguous per device (reference/nvfuser-host-ir.md §4.2, nvFuser's
//! `ReorderShardedAxisPass`).
//!
//! NCCL gathers and scatters whole contiguous blocks: the block of member `i` is the `i`-th
//! slice of the flat buffer. That matches the tensor only when the gathered (or scattered)
//! axis is the outermost allocation axis whose local size is not 1 (device- and
//! stream-parallel, broadcast, reduction and extent-1 axes have local size 1), on both sides
//! of the collective. An AllToAll needs both: its scattered axis outermost in the input and
//! its gathered axis outermost in the output, and it is packed by a reshape and a permute
//! when they are not (see `rewrite_all_to_all_if_needed`). Reduce, Allreduce, Broadcast
//! and SendRecv need contiguity only and are left alone.
//!
//! What this pass does (the permute/set pairs of nvFuser's original pass, not allocation
//! reordering): a non-compliant `y = set(x)` whose sharded axis is `k` becomes
//!
//! ```text
//! x_reordered = permute(x, [k, 0, .., k-1, k+1, ..])   // local, keeps x's sharding
//! y_reordered = set(x_reordered)                         // the collective, axis k now outermost
//! y           = permute(y_reordered, inverse)            // local, y keeps its id and sharding
//! ```
//!
//! and a non-compliant ReduceScatter `y = sum(x, axes)` becomes `permute`, `sum` over the
//! permuted axes, `permute` back (`y` then loses its reduction axes, which the new `sum`
//! holds). The permuted tensors are fresh, so their allocation is their logical domain, with
//! the sharded axis first. Allocation domains of fusion inputs and outputs are never changed,
//! which is why permutes are inserted rather than allocations reordered.
//!
//! Contract. Input: an [`crate::Ir::Fusion`] after `decompose-reshardings`. Output: the same
//! computation, every layout-sensitive collective compliant, still compute XOR one
//! communication per expr. Existing tensor ids are kept. Idempotent: compliant collectives
//! are left as they are.

use weave_host_ir::CommunicationType;
use weave_ir::{
    Diagnostic, ExprId, ExprKind, Fusion, IrResult, IterDomainId, IterType, ParallelType, Scalar,
    TensorId,
};
use weave_transform::IdGraph;

use crate::communication::derive_communication;
use crate::propagate_shardings::replay;
use crate::resharding::{is_resharding, parallel_axis, DEVICE_AND_STREAM_TYPES, DEVICE_TYPES};
use crate::shared::FusionRewrite;

/// The `reorder-sharded-axis` pass (see the module doc).
#[derive(Clone, Copy, Debug, Default)]
pub struct ReorderShardedAxis;

impl FusionRewrite for ReorderShardedAxis {
    const NAME: &'static str = "reorder-sharded-axis";
    const SUMMARY: &'static str =
        "permute around gathers, scatters and all-to-alls so the sharded axis is outermost in memory";
    const REWRITE: fn(&mut Fusion) -> IrResult<()> = reorder_sharded_axis;
}

/// Rewrites every non-compliant collective (see the module doc).
pub fn reorder_sharded_axis(f: &mut Fusion) -> IrResult<()> {
    let exprs: Vec<ExprId> = f.exprs().to_vec();
    for e in exprs {
        if !is_resharding(f, e) {
            continue;
        }
        let info = derive_communication(f, e)?;
        if info.kind == CommunicationType::AllToAll {
            rewrite_all_to_all_if_needed(f, e, &info).map_err(|d| d.or_at(f.expr(e).span))?;
            continue;
        }
        if !matches!(
            info.kind,
            CommunicationType::Allgather
                | CommunicationType::Gather
                | CommunicationType::Scatter
                | CommunicationType::ReduceScatter
        ) {
            continue;
        }
        let (Some(pa), Some(ca)) = (info.producer_axis, info.consumer_axis) else {
            continue;
        };
        let (x, y) = (f.expr(e).inputs[0], f.expr(e).outputs[0]);
        if is_layout_compliant(f, x, pa.id) && is_layout_compliant(f, y, ca.id) {
            continue;
        }
        let Some(k) = pa.axis else {
            continue;
        };
        rewrite(f, e, k).map_err(|d| d.or_at(f.expr(e).span))?;
    }
    Ok(())
}

/// An AllToAll `y = set(x)` from `x` split on axis `A` to `y` split on axis `B` moves, from
/// member `i` to member `j`, the block of `x`'s rows `A_i` and columns `B_j`. The collective
/// sends flat piece `j` of the input to member `j` and stores what member `i` sent as flat
/// piece `i` of the output, so it is right as it stands only when `B` is the outermost
/// non-unit axis of `x` in memory and `A` that of `y` (e.g. `A` has exactly one element per
/// device). Otherwise it becomes
///
/// ```text
/// x_reordered   = reshape(x, [.., d, B/d, ..])             // B cut into one block per member
///                                                            // (left out when B == d)
/// x_reordered_1 = permute(x_reordered, [d, A, others..])   // local pack: piece j is block j
/// y_reordered   = set(x_reordered_1)                         // the AllToAll, d axis on devices
/// y_reordered_1 = permute(y_reordered, inverse)            // back to x_reordered's order
/// y_reordered_2 = reshape(y_reordered_1, y's shape)         // d and B/d merged into B
/// y             = set(y_reordered_2)                         // local: y keeps its id
/// ```
///
/// where every piece is `[A/d, B/d, others..]` on both sides, with `A` whole and outermost in
/// the output.
fn rewrite_all_to_all_if_needed(
    f: &mut Fusion,
    e: ExprId,
    info: &crate::communication::CommunicationInfo,
) -> IrResult<()> {
    let (Some(pa), Some(ca), Some(pt)) = (info.producer_axis, info.consumer_axis, info.parallel)
    else {
        return Ok(());
    };
    let (Some(a), Some(b)) = (pa.axis, ca.axis) else {
        return Ok(());
    };
    let (x, y) = (f.expr(e).inputs[0], f.expr(e).outputs[0]);
    let (xv, yv) = (f.visible_axes(x), f.visible_axes(y));
    if a == b || a >= xv.len() || b >= xv.len() || xv.len() != yv.len() {
        return Ok(());
    }
    if outermost_in_memory(f, x, xv[b]) && outermost_in_memory(f, y, yv[a]) {
        return Ok(());
    }
    let desc = crate::communication::expr_desc(f, e);
    let Some(d) = f.mesh_of(x).and_then(|m| m.size_of(pt)) else {
        return Err(Diagnostic::new(format!(
            "AllToAll in {desc}: the mesh of `{}` has no {pt} axis",
            f.tensor(x).name
        )));
    };
    let d = d as i64;
    // Another device type on the axis the exchange cuts would have to follow the reshape
    // that cuts it, which replay does not do (one of extent 1 splits nothing and may stay).
    let mesh = f.mesh_of(x).cloned();
    let splits = |o: ParallelType| mesh.as_ref().and_then(|m| m.size_of(o)).unwrap_or(1) > 1;
    for (t, axes) in [(x, [xv[b]]), (y, [yv[b]])] {
        for o in DEVICE_TYPES.into_iter().filter(|o| *o != pt && splits(*o)) {
            let Some(id) = parallel_axis(f, &f.tensor(t).loop_domain, o) else {
                continue;
            };
            if axes.iter().any(|ax| derives_from(f, id, *ax)) {
                return Err(Diagnostic::new(format!(
                    "AllToAll over {pt} in {desc}: `{}` is also split by {o} on an axis the \
                     exchange moves; split that axis by {pt} only, or reshard {o} in a set of \
                     its own",
                    f.tensor(t).name
                )));
            }
        }
    }
    let shape: Vec<Scalar> = xv.iter().map(|i| f.id(*i).extent.clone()).collect();
    let eb = f.eval(&shape[b]);
    if eb.is_none_or(|v| v % d != 0) {
        return Err(Diagnostic::new(format!(
            "AllToAll in {desc}: axis {b} of `{}` ({}) must be a multiple of the {d} devices along {pt}",
            f.tensor(y).name,
            shape[b]
        )));
    }
    // When `B` has exactly one element per member it is cut already: no reshape.
    let cut = eb != Some(d);
    let (b2, a2) = match (cut, a > b) {
        (true, true) => (b, a + 1),
        _ => (b, a),
    };
    let rank = if cut { xv.len() + 1 } else { xv.len() };
    let mut perm = vec![b2, a2];
    perm.extend((0..rank).filter(|j| *j != b2 && *j != a2));
    let inverse = inverse(&perm);

    // A device type of extent 1 (it splits nothing) on the axis the exchange cuts cannot
    // follow the reshape, nor share the devices' axis of the exchange: the chain leaves it
    // out, a copy before it drops it from `x` and the final copy gives it back to `y`
    // (one-member collectives, that is, local copies).
    let on = |f: &Fusion, t: TensorId, o: ParallelType, axis: IterDomainId| {
        parallel_axis(f, &f.tensor(t).loop_domain, o).is_some_and(|id| derives_from(f, id, axis))
    };
    let dropped: Vec<ParallelType> = DEVICE_TYPES
        .into_iter()
        .filter(|o| *o != pt && !splits(*o))
        .filter(|o| on(f, x, *o, xv[b]) || on(f, y, *o, yv[b]))
        .collect();
    let chain: Vec<ParallelType> = DEVICE_TYPES
        .into_iter()
        .filter(|o| !dropped.contains(o))
        .collect();
    let x1 = if dropped
        .iter()
        .any(|o| parallel_axis(f, &f.tensor(x).loop_domain, *o).is_some())
    {
        Some(add_before(f, e, x, ExprKind::Set, x)?)
    } else {
        None
    };
    let src = x1.unwrap_or(x);
    let x2 = if cut {
        let mut split_shape = shape.clone();
        split_shape.splice(b..=b, [Scalar::c(d), shape[b].clone().div(Scalar::c(d))]);
        Some(add_before(
            f,
            e,
            x,
            ExprKind::Reshape { shape: split_shape },
            src,
        )?)
    } else {
        None
    };
    let x3 = add_before(
        f,
        e,
        x,
        ExprKind::Permute { perm: perm.clone() },
        x2.unwrap_or(src),
    )?;
    let y3 = add_before(f, e, y, ExprKind::Set, x3)?;
    let y4 = add_before(f, e, y, ExprKind::Permute { perm: inverse }, y3)?;
    let y5 = if cut {
        Some(add_before(f, e, y, ExprKind::Reshape { shape }, y4)?)
    } else {
        None
    };
    f.expr_mut(e).inputs = vec![y5.unwrap_or(y4)];

    // Device splits only: the exchange and its packing run on whole tensors, after any stream
    // loop that produces `x` and before any that reads `y` (a Stream split of `A` or `B`
    // could not follow the reshape anyway).
    let graph = IdGraph::build(f);
    if let Some(x1) = x1 {
        replay(f, x, x1, &graph, &chain)?;
    }
    if let Some(x2) = x2 {
        replay(f, src, x2, &graph, &chain)?;
    }
    replay(f, x2.unwrap_or(src), x3, &graph, &chain)?;
    // The other device types keep `y`'s splits; one of extent 1 keeps the producer's
    // placement instead.
    let (others, trivial): (Vec<ParallelType>, Vec<ParallelType>) = chain
        .iter()
        .copied()
        .filter(|t| *t != pt)
        .partition(|t| splits(*t));
    replay(f, y, y3, &graph, &others)?;
    replay(f, x3, y3, &graph, &trivial)?;
    weave_transform::schedule::parallelize(f, y3, 0, pt)?;
    let graph = IdGraph::build(f);
    replay(f, y3, y4, &graph, &chain)?;
    if let Some(y5) = y5 {
        replay(f, y, y5, &graph, &chain)?;
    }
    Ok(())
}

/// [`is_layout_compliant`] before `finalize-multidevice-domains` has placed the device
/// splits in the allocation domain: the loop domain stands for it when none is set.
fn outermost_in_memory(f: &Fusion, t: TensorId, axis: IterDomainId) -> bool {
    let tv = f.tensor(t);
    let order = tv.allocation.as_ref().unwrap_or(&tv.loop_domain);
    let Some(pos) = order.iter().position(|a| derives_from(f, *a, axis)) else {
        return true;
    };
    order[..pos].iter().all(|a| local_size_one(f, *a))
}

/// True if no allocation axis of `t` before the first one derived from `axis` (a logical or
/// root axis of `t`) has a local size other than 1.
pub fn is_layout_compliant(f: &Fusion, t: TensorId, axis: IterDomainId) -> bool {
    let alloc = f.tensor(t).allocation_domain();
    let Some(pos) = alloc.iter().position(|a| derives_from(f, *a, axis)) else {
        return true;
    };
    alloc[..pos].iter().all(|a| local_size_one(f, *a))
}

fn derives_from(f: &Fusion, id: IterDomainId, axis: IterDomainId) -> bool {
    let mut cur = id;
    loop {
        if cur == axis {
            return true;
        }
        let Some(e) = f.id(cur).definition else {
            return false;
        };
        cur = f.id_expr(e).inputs()[0];
    }
}

fn local_size_one(f: &Fusion, id: IterDomainId) -> bool {
    let d = f.id(id);
    d.parallel.is_device_or_stream()
        || d.iter_type != IterType::Iteration
        || f.eval(&d.extent) == Some(1)
}

/// The permutation that undoes `perm`.
fn inverse(perm: &[usize]) -> Vec<usize> {
    (0..perm.len())
        .map(|j| perm.iter().position(|q| *q == j).expect("a permutation"))
        .collect()
}

/// Adds `input`'s copy by `kind` just before `e`, as a fresh tensor named after `base`
/// (`{base}_reordered`) with `base`'s mesh and span; the new expression has `e`'s span.
fn add_before(
    f: &mut Fusion,
    e: ExprId,
    base: TensorId,
    kind: ExprKind,
    input: TensorId,
) -> IrResult<TensorId> {
    let span = f.expr(e).span;
    let name = f.fresh_name(&format!("{}_reordered", f.tensor(base).name));
    let t = f.add_op(&name, kind, &[input])?;
    let def = f.tensor(t).definition.expect("just defined");
    f.move_expr_before(def, e);
    f.expr_mut(def).span = span;
    f.tensor_mut(t).mesh = f.tensor(base).mesh;
    f.tensor_mut(t).span = f.tensor(base).span;
    Ok(t)
}

/// Wraps the collective `e` in permutes that move operand axis `k` to the front.
fn rewrite(f: &mut Fusion, e: ExprId, k: usize) -> IrResult<()> {
    let (x, y) = (f.expr(e).inputs[0], f.expr(e).outputs[0]);
    let kind = f.expr(e).kind.clone();
    let n = f.visible_axes(x).len();
    let mut perm = vec![k];
    perm.extend((0..n).filter(|j| *j != k));
    let xp = add_before(f, e, x, ExprKind::Permute { perm: perm.clone() }, x)?;
    let (yp, back) = match kind {
        ExprKind::Set => (add_before(f, e, y, ExprKind::Set, xp)?, inverse(&perm)),
        ExprKind::Reduction { op, axes } => {
            if f.tensor(y).root.is_some() {
                return Err(Diagnostic::new(format!(
                    "reorder-sharded-axis: `{}` has a root domain",
                    f.tensor(y).name
                )));
            }
            let inv = inverse(&perm);
            let mut paxes: Vec<usize> = axes.iter().map(|a| inv[*a]).collect();
            paxes.sort_unstable();
            let yp = add_before(f, e, y, ExprKind::Reduction { op, axes: paxes }, xp)?;
            // yp's materialized axes are x's, permuted, minus the reduced ones.
            let yp_order: Vec<usize> = perm.iter().copied().filter(|a| !axes.contains(a)).collect();
            let back = (0..n)
                .filter(|j| !axes.contains(j))
                .map(|j| yp_order.iter().position(|q| *q == j).expect("kept"))
                .collect();
            (yp, back)
        }
        other => {
            return Err(Diagnostic::new(format!(
                "reorder-sharded-axis: cannot reorder a {} collective",
                other.op_name()
            )))
        }
    };
    let graph = IdGraph::build(f);
    replay(f, x, xp, &graph, &DEVICE_AND_STREAM_TYPES)?;
    replay(f, y, yp, &graph, &DEVICE_AND_STREAM_TYPES)?;

    // y = permute(yp): y keeps its materialized axes and their schedule, without reductions.
    let tv = f.tensor(y).clone();
    let keep = |f: &Fusion, id: &IterDomainId| {
        let mut cur = *id;
        loop {
            if tv.logical.contains(&cur) {
                return f.id(cur).iter_type != IterType::Reduction;
            }
            match f.id(cur).definition {
                Some(d) => cur = f.id_expr(d).inputs()[0],
                None => return true,
            }
        }
    };
    let logical: Vec<IterDomainId> = tv.logical.iter().copied().filter(|i| keep(f, i)).collect();
    let loop_domain: Vec<IterDomainId> = tv
        .loop_domain
        .iter()
        .copied()
        .filter(|i| keep(f, i))
        .collect();
    let allocation = tv
        .allocation
        .as_ref()
        .map(|a| a.iter().copied().filter(|i| keep(f, i)).collect());
    let t = f.tensor_mut(y);
    t.logical = logical;
    t.loop_domain = loop_domain;
    t.allocation = allocation;
    let ex = f.expr_mut(e);
    ex.kind = ExprKind::Permute { perm: back };
    ex.inputs = vec![yp];
    Ok(())
}
