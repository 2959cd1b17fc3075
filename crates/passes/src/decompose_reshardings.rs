//! `decompose-reshardings`: make every expr either pure compute or exactly one communication
//! (reference/nvfuser-host-ir.md §4.2, nvFuser's `DecomposeReshardingsPass`).
//!
//! Contract.
//!
//! * Input: an [`crate::Ir::Fusion`] after `propagate-shardings` (every sharded tensor has a mesh).
//!   Output: the same computation where every expr that changes the device sharding
//!   ([`is_resharding`]) is a `set`, `sum`/`max` or `squeeze` whose collective
//!   [`derive_communication`] names, and every other expr is local. Tensor ids of existing
//!   tensors, fusion inputs and outputs are kept; new tensors are named `<out>_partial`,
//!   `<out>_nobias`, `<bias>_broadcast`, `<out>_reduced`, `<in>_gathered` and `<in>_resharded`
//!   (made unique).
//! * Idempotent: a second run finds nothing to decompose.
//!
//! Steps, in order:
//!
//! 1. **Device-reduced axes are marked.** When an operand of a reduction, `matmul` or `linear`
//!    is device-sharded on an axis the expr reduces and the output's reduction axis is still
//!    unscheduled (a user-annotated output), the operand's split is replayed onto that
//!    reduction axis and parallelized (`rDIDx`). When the output's mesh does not have that
//!    many devices along the type (a reduction to a root mesh), the axis is only marked for
//!    step 2, which rfactors it or takes the mark back.
//!    A `linear(x, w, bias)` whose output is then device-reduced is split first:
//!    `<out>_nobias = linear(x, w)` takes the output's sharding, and `out = add(<out>_nobias,
//!    <bias>_broadcast)` with `<bias>_broadcast = broadcast(bias, [0, ..])`, so that step 2
//!    reduces the products over devices and the bias is added once, after the Allreduce or
//!    ReduceScatter (inside the stream loop when the output is stream-split).
//! 2. **rfactor.** A reduction, `matmul`, `linear` or `index_select` (whose output keeps the
//!    table's rows as a reduction axis) whose output reduces over a device axis
//!    (`rDIDx`) and also over local axes (`linear`/`matmul` always have local work) is split
//!    in two: `<out>_partial = op(inputs)` keeps the device axis as an iteration axis
//!    (`ideviceIdx.x…rf`: its root reduction axis `r{k}` is outer-split by the device count
//!    into `iDIDx{d}rf, r{k/d}rf`) and reduces locally; the original expr becomes
//!    `out = sum(partial)` (or `max`) over that device axis only, which is an Allreduce,
//!    Reduce or ReduceScatter. The partial takes the output's `Stream` split and the operands'
//!    device shardings; it lives on the output's mesh, or for a reduction to another mesh
//!    (a Reduce to a root) on the mesh of the operand whose devices split the reduced axis,
//!    and the output then reduces the partial's device axis as a plain axis. E.g. the row-parallel `out = linear(inp, w)` with a DIDx-split
//!    contraction becomes `out_partial = linear(inp, w)` (local) and `out = sum(out_partial)`
//!    (Allreduce). A vocabulary-parallel lookup `y = index_select(table, ids, 0)` with the
//!    table's rows on DIDx becomes `y_partial = index_select(table, ids, 0, base)` (each
//!    device looks up the ids that fall in its block of rows, `base` the block's first row as
//!    a size over `rank`; other ids give zero rows) and `y = sum(y_partial)` (Allreduce), as
//!    Megatron's vocabulary-parallel embedding does.
//! 3. **Resharding sets.** A remaining resharding expr that is not a communication gets, for
//!    each operand sharded differently from its output, `x_resharded = set(x)` inserted right
//!    before it, on the output's mesh and sharded like the output (device and stream types,
//!    replayed with [`weave_transform::replay_loop_like`]); the expr then reads the copy
//!    (nvFuser's `insertReshardingSetsBefore`). A `set` or `squeeze` that is not a valid
//!    communication, or a reduction over a device-sharded axis that is not, is refused with
//!    the diagnostic of [`derive_communication`] (e.g. "expected at most one sharding change
//!    in `x = set(y)`: DIDx and DIDy both change"). A `set` that only changes how a device
//!    split lays out its axis (`[s, d, ..]` against `[d, ..]`), moves the shards of one
//!    axis between meshes of different sizes, or moves a device split to another axis from or
//!    into stream chunks (an AllToAll whose pieces would not be blocks), becomes an allgather into `<in>_gathered`
//!    (replicated on the input's mesh, stream-split like the output or the input) and a
//!    scatter.
//!    A DID → Stream `set` whose stream chunks and device shards neither match nor nest
//!    ([`is_unnested_did_to_stream`]) becomes an Allgather into `<in>_gathered` (replicated,
//!    not stream-split) and a local copy into the chunks (`gather_then_slice`).
//!    A `set` from another mesh onto a 2-D mesh that splits it (a Scatter onto it), or that
//!    changes both DIDx and DIDy between two meshes ([`copies_onto_another_mesh_in_two`]),
//!    first copies its input whole onto the receiver mesh (`<in>_resharded`), then splits
//!    that copy on one mesh.
//!    A `set` on one (2-D) mesh whose DIDx and DIDy shardings both change becomes a chain of
//!    sets that each change one type (`one_change_per_set`); the gathered copy of a layout
//!    change keeps the input's splits of the other device types. A reduction over a device
//!    axis that also changes the sharding of other axes (its output lays out a DIDy split
//!    inside stream chunks) becomes `<out>_reduced = op(x)`, the collective keeping `x`'s
//!    sharding of the other axes, then `out = set(<out>_reduced)` (`reduce_then_reshard`).
//! 4. **Receivers outside the senders.** A Gather or Reduce to a mesh with a device outside
//!    the sender mesh becomes an Allgather or Allreduce on the sender mesh followed by a
//!    Broadcast `set` to the receivers (a member of a Gather or Reduce contributes its own
//!    piece, which a device outside the sender mesh does not have).
//!
//! The partial of step 2 takes the output's Stream split unless that drops an operand's device
//! split (`[s, d, ..]` on the output against `[d, ..]` on the operand); it then keeps the
//! operand's split unstreamed, and step 3 splits the reduction from the layout change.
//!
//! The rfactor of step 2 also takes a device axis nested inside outer splits of the reduced
//! axis (`outer_split(k, s); outer_split(k + 1, d) -> DIDx`): the partial cuts its reduction
//! axis the same way and keeps only the device output as an iteration axis.

use std::collections::HashSet;

use weave_ir::{
    BinaryOp, Diagnostic, ExprId, ExprKind, Fusion, IdExpr, IrResult, IterDomain, IterDomainId,
    IterType, ParallelType, ReduceOp, Scalar, SplitKind, TensorId,
};
use weave_transform::logical_map::pairwise_map;
use weave_transform::schedule::{self, DomainKind};
use weave_transform::IdGraph;

use weave_host_ir::CommunicationType;

use crate::communication::{
    ancestor, derive_communication, expr_desc, is_layout_change, is_nested_all_to_all,
    is_unnested_did_to_stream,
};
use crate::pass::{Changed, FusionPass, Pass, PassError};
use crate::propagate_shardings::{reference_inputs, replay};
use crate::resharding::{
    have_different_shardings, is_resharding, parallel_axis, DEVICE_AND_STREAM_TYPES, DEVICE_TYPES,
};
use crate::shared::run_on_fusion;

/// The `decompose-reshardings` pass (see the module doc).
#[derive(Clone, Copy, Debug, Default)]
pub struct DecomposeReshardings;

impl Pass for DecomposeReshardings {
    fn name(&self) -> &'static str {
        "decompose-reshardings"
    }

    fn summary(&self) -> &'static str {
        "rfactor device-split reductions and insert sets so each expr is compute or one communication"
    }
}

impl FusionPass for DecomposeReshardings {
    fn run(&self, f: &mut Fusion) -> Result<Changed, PassError> {
        run_on_fusion(self.name(), f, decompose_reshardings)
    }
}

/// Runs the three steps of the module doc.
pub fn decompose_reshardings(f: &mut Fusion) -> IrResult<()> {
    let exprs: Vec<ExprId> = f.exprs().to_vec();
    for &e in &exprs {
        if is_reducing(&f.expr(e).kind) {
            let span = f.expr(e).span;
            mark_device_reduced_axes(f, e).map_err(|d| d.or_at(span))?;
            let e = split_device_reduced_bias(f, e).map_err(|d| d.or_at(span))?;
            rfactor_device_reduction(f, e).map_err(|d| d.or_at(span))?;
        }
    }
    let exprs: Vec<ExprId> = f.exprs().to_vec();
    for &e in &exprs {
        insert_resharding_sets(f, e).map_err(|d| d.or_at(f.expr(e).span))?;
    }
    let exprs: Vec<ExprId> = f.exprs().to_vec();
    for &e in &exprs {
        route_through_the_senders(f, e).map_err(|d| d.or_at(f.expr(e).span))?;
    }
    // Postcondition.
    for &e in f.exprs() {
        if is_resharding(f, e) {
            derive_communication(f, e)?;
        }
    }
    Ok(())
}

fn is_reducing(kind: &ExprKind) -> bool {
    matches!(
        kind,
        ExprKind::Reduction { .. }
            | ExprKind::Matmul
            | ExprKind::Linear
            | ExprKind::IndexSelect { .. }
    )
}

/// The split that makes `id` the outer output of an outer split of `input`, if it is one.
fn outer_split_of(f: &Fusion, id: IterDomainId) -> Option<(IterDomainId, Scalar)> {
    match f.id_expr(f.id(id).definition?) {
        IdExpr::Split {
            input,
            outer,
            factor,
            kind: SplitKind::Outer,
            ..
        } if *outer == id => Some((*input, factor.clone())),
        _ => None,
    }
}

/// Step 1: an operand's device split on a reduced axis is replayed onto the output's
/// unscheduled reduction axis.
fn mark_device_reduced_axes(f: &mut Fusion, e: ExprId) -> IrResult<()> {
    let out = f.expr(e).outputs[0];
    let mut inputs = f.expr(e).inputs.clone();
    let mut seen = HashSet::new();
    inputs.retain(|x| seen.insert(*x));
    for x in inputs {
        let pairs = pairwise_map(f, e, x);
        for pt in DEVICE_TYPES {
            let Some(xid) = parallel_axis(f, &f.tensor(x).loop_domain, pt) else {
                continue;
            };
            let xl = &f.tensor(x).logical;
            let (logical, factor) = if xl.contains(&xid) {
                (xid, None)
            } else {
                match outer_split_of(f, xid) {
                    Some((input, factor)) if xl.contains(&input) => (input, Some(factor)),
                    _ => continue,
                }
            };
            let Some(&(_, cr)) = pairs.iter().find(|(p, _)| *p == logical) else {
                continue;
            };
            let out_loop = f.tensor(out).loop_domain.clone();
            let already = out_loop.iter().any(|i| {
                let d = f.id(*i);
                d.parallel == pt && d.iter_type == IterType::Reduction
            });
            let same_size = f.mesh_of(x).and_then(|m| m.size_of(pt))
                == f.mesh_of(out).and_then(|m| m.size_of(pt));
            let Some(pos) = out_loop.iter().position(|i| *i == cr) else {
                continue;
            };
            if already
                || f.mesh_of(out).is_none()
                || f.id(cr).iter_type != IterType::Reduction
                || f.id(cr).parallel != ParallelType::Serial
            {
                continue;
            }
            if let Some(factor) = factor {
                schedule::split(f, out, DomainKind::Loop, pos, factor, SplitKind::Outer)?;
            }
            if same_size {
                schedule::parallelize(f, out, pos, pt)?;
            } else {
                // The output lives on another mesh (a Reduce to a root mesh): the mark only
                // tells step 2 which axis the operand's devices split. Step 2 rfactors it or
                // takes the mark back, so the output never keeps a device axis its mesh
                // does not have.
                let o = f.tensor(out).loop_domain[pos];
                f.id_mut(o).parallel = pt;
            }
        }
    }
    Ok(())
}

/// Step 1b: a `linear(x, w, bias)` whose contraction axis is device-reduced becomes
/// `out_nobias = linear(x, w)`, `bias_broadcast = broadcast(bias, [0, ..])` and
/// `out = add(out_nobias, bias_broadcast)`, so that the reduction over devices (step 2) sums
/// products without the bias and the bias is added once, after it (nvFuser's decomposition).
/// `out` keeps its id and its sharding minus the reduction axes; `out_nobias` takes `out`'s
/// whole loop sharding (Stream, DID, the device-reduced axis) and the broadcast the bias'.
/// Returns the expr that step 2 rfactors: the new product, or `e` itself when there is
/// nothing to split.
fn split_device_reduced_bias(f: &mut Fusion, e: ExprId) -> IrResult<ExprId> {
    let ex = f.expr(e).clone();
    if ex.kind != ExprKind::Linear || ex.inputs.len() != 3 {
        return Ok(e);
    }
    let out = ex.outputs[0];
    let out_tv = f.tensor(out).clone();
    let device_reduced = out_tv.loop_domain.iter().any(|i| {
        let d = f.id(*i);
        d.parallel.is_device() && d.iter_type == IterType::Reduction
    });
    if !device_reduced {
        return Ok(e);
    }
    let (x, w, bias) = (ex.inputs[0], ex.inputs[1], ex.inputs[2]);
    let rank = f.visible_axes(out).len();

    let bname = f.fresh_name(&format!("{}_broadcast", f.tensor(bias).name));
    let bb = f.add_op(
        &bname,
        ExprKind::Broadcast {
            axes: (0..rank - 1).collect(),
        },
        &[bias],
    )?;
    let be = f.tensor(bb).definition.expect("just defined");
    f.move_expr_before(be, e);
    f.expr_mut(be).span = ex.span;
    f.tensor_mut(bb).mesh = f.tensor(bias).mesh.or(out_tv.mesh);
    f.tensor_mut(bb).span = f.tensor(bias).span;

    let name = f.fresh_name(&format!("{}_nobias", out_tv.name));
    let prod = f.add_op(&name, ExprKind::Linear, &[x, w])?;
    let pe = f.tensor(prod).definition.expect("just defined");
    f.move_expr_before(pe, e);
    f.expr_mut(pe).span = ex.span;
    f.tensor_mut(prod).mesh = out_tv.mesh;
    f.tensor_mut(prod).span = out_tv.span;

    let graph = IdGraph::build(f);
    replay(f, out, prod, &graph, &DEVICE_AND_STREAM_TYPES)?;
    replay(f, bias, bb, &graph, &DEVICE_AND_STREAM_TYPES)?;

    // `out` is now the pointwise add.
    drop_reduction_axes(f, out);
    let ex = f.expr_mut(e);
    ex.kind = ExprKind::Binary(BinaryOp::Add);
    ex.inputs = vec![prod, bb];
    Ok(pe)
}

/// A device-parallel reduction axis of an output to rfactor.
struct DeviceReduction {
    parallel: ParallelType,
    /// The loop axis (`rDIDx`).
    loop_id: IterDomainId,
    /// Its position in the output's logical domain.
    logical_pos: usize,
    /// The device count (the loop axis' extent).
    factor: i64,
    /// The outer splits from the logical axis down to the device axis: each split's factor
    /// and whether the path goes on into its inner output (a device split inside stream
    /// chunks, `[s, d, ..]`) or its outer one. The last step's outer output is the device
    /// axis.
    path: Vec<(Scalar, bool)>,
}

/// The outer splits from a logical axis of `within` down to `id` (see
/// [`DeviceReduction::path`]), and that logical axis; `None` when `id` does not come from one
/// through outer splits whose last step takes the outer output.
fn split_path(
    f: &Fusion,
    id: IterDomainId,
    within: &[IterDomainId],
) -> Option<(IterDomainId, Vec<(Scalar, bool)>)> {
    let mut path = Vec::new();
    let mut cur = id;
    while !within.contains(&cur) {
        match f.id_expr(f.id(cur).definition?) {
            IdExpr::Split {
                input,
                outer,
                factor,
                kind: SplitKind::Outer,
                ..
            } => {
                if path.is_empty() && *outer != cur {
                    return None;
                }
                path.push((factor.clone(), *outer != cur));
                cur = *input;
            }
            _ => return None,
        }
    }
    path.reverse();
    Some((cur, path))
}

/// Step 2: rfactor (see the module doc).
fn rfactor_device_reduction(f: &mut Fusion, e: ExprId) -> IrResult<()> {
    let out = f.expr(e).outputs[0];
    let out_tv = f.tensor(out).clone();
    let desc = expr_desc(f, e);
    let mut devs: Vec<DeviceReduction> = Vec::new();
    let mut local_work = false;
    for &l in &out_tv.loop_domain {
        let d = f.id(l);
        if d.iter_type != IterType::Reduction {
            continue;
        }
        if !d.parallel.is_device() {
            local_work = true;
            continue;
        }
        let Some((logical, path)) = split_path(f, l, &out_tv.logical) else {
            return Err(Diagnostic::new(format!(
                "cannot rfactor {desc}: the {} reduction axis of `{}` is neither a logical axis nor the outer output of outer splits of one",
                d.parallel, out_tv.name
            )));
        };
        let Some(factor) = f.eval(&d.extent) else {
            return Err(Diagnostic::new(format!(
                "cannot rfactor {desc}: the {} axis of `{}` has no constant extent",
                d.parallel, out_tv.name
            )));
        };
        devs.push(DeviceReduction {
            parallel: d.parallel,
            loop_id: l,
            logical_pos: out_tv
                .logical
                .iter()
                .position(|x| *x == logical)
                .expect("a logical axis"),
            factor,
            path,
        });
    }
    let kind = f.expr(e).kind.clone();
    let must = matches!(
        kind,
        ExprKind::Matmul | ExprKind::Linear | ExprKind::IndexSelect { .. }
    );
    // A marked axis whose device count the output's mesh does not have (step 1's cross-mesh
    // mark) is taken back when nothing is rfactored.
    let off_mesh = |f: &Fusion, d: &DeviceReduction| {
        f.mesh_of(out).and_then(|m| m.size_of(d.parallel)) != Some(d.factor as usize)
    };
    if devs.is_empty() || !(local_work || must) {
        for d in &devs {
            if off_mesh(f, d) {
                f.id_mut(d.loop_id).parallel = ParallelType::Serial;
            }
        }
        return Ok(());
    }
    // The operand whose devices split the reduced axis. When it lives on another mesh than
    // the output, the partial lives with it, and the output reduces the partial's device
    // axis as a plain axis (a Reduce to the output's mesh).
    let sender = devs.first().and_then(|d| {
        f.expr(e)
            .inputs
            .iter()
            .copied()
            .find(|x| parallel_axis(f, &f.tensor(*x).loop_domain, d.parallel).is_some())
    });
    let cross = sender.is_some_and(|x| f.mesh_of(x) != f.mesh_of(out));
    if !cross {
        if let Some(d) = devs.iter().find(|d| off_mesh(f, d)) {
            return Err(Diagnostic::new(format!(
                "cannot rfactor {desc}: no operand lives on a mesh with {} devices along {}",
                d.factor, d.parallel
            )));
        }
    }
    let partial_mesh = match sender {
        Some(x) if cross => f.tensor(x).mesh.or(out_tv.mesh),
        _ => out_tv.mesh,
    };
    let off: Vec<bool> = vec![cross; devs.len()];
    if matches!(kind, ExprKind::Linear) && f.expr(e).inputs.len() == 3 {
        // Step 1b takes the bias out first: each device's partial product would add it, and
        // the reduction over devices would then add it once per device.
        return Err(Diagnostic::new(format!(
            "internal: cannot rfactor {desc}: its bias is still part of the product"
        )));
    }
    if out_tv.root.is_some() {
        return Err(Diagnostic::new(format!(
            "cannot rfactor {desc}: `{}` already has a root domain",
            out_tv.name
        )));
    }

    // The partial: the same op, keeping the device axes as iteration axes. A lookup's
    // partial reads its device's block of rows, which starts at the device's shard offset.
    let inputs = f.expr(e).inputs.clone();
    let name = f.fresh_name(&format!("{}_partial", out_tv.name));
    let partial_kind = match &kind {
        ExprKind::IndexSelect { axis, .. } => ExprKind::IndexSelect {
            axis: *axis,
            base: Some(lookup_shard_base(f, e, *axis, &devs, &desc)?),
        },
        other => other.clone(),
    };
    let partial = f.add_op(&name, partial_kind, &inputs)?;
    let pe = f.tensor(partial).definition.expect("just defined");
    f.move_expr_before(pe, e);
    f.expr_mut(pe).span = f.expr(e).span;
    let root = f.tensor(partial).logical.clone();
    let mut logical: Vec<IterDomainId> = Vec::new();
    let mut device_axes: Vec<(ParallelType, IterDomainId)> = Vec::new();
    for (j, &r) in root.iter().enumerate() {
        match devs.iter().find(|d| d.logical_pos == j) {
            Some(d) => {
                // The reduction axis cut like the device axis of the output: the device
                // output becomes an iteration axis, the other outputs stay local reductions.
                let mut leaves_after = Vec::new();
                let mut cur = r;
                let last = d.path.len().saturating_sub(1);
                let path = if d.path.is_empty() {
                    vec![(Scalar::c(d.factor), false)]
                } else {
                    d.path.clone()
                };
                for (k, (factor, into_inner)) in path.iter().enumerate() {
                    let factor = if k == last {
                        Scalar::c(d.factor)
                    } else {
                        factor.clone()
                    };
                    let (o, i) = f.split_id(cur, factor, SplitKind::Outer);
                    f.id_mut(o).rfactor = true;
                    f.id_mut(i).rfactor = true;
                    if *into_inner {
                        logical.push(o);
                        cur = i;
                    } else {
                        leaves_after.push(i);
                        cur = o;
                    }
                }
                f.id_mut(cur).iter_type = IterType::Iteration;
                logical.push(cur);
                logical.extend(leaves_after.into_iter().rev());
                device_axes.push((d.parallel, cur));
            }
            None => logical.push(r),
        }
    }
    {
        let tv = f.tensor_mut(partial);
        tv.root = Some(root);
        tv.logical = logical.clone();
        tv.loop_domain = logical;
        tv.mesh = partial_mesh;
        tv.span = out_tv.span;
    }
    for &(pt, o) in &device_axes {
        let pos = f
            .tensor(partial)
            .loop_domain
            .iter()
            .position(|x| *x == o)
            .expect("a loop axis");
        schedule::parallelize(f, partial, pos, pt)?;
    }
    let graph = IdGraph::build(f);
    let unsplit = f.tensor(partial).loop_domain.clone();
    replay(f, out, partial, &graph, &[ParallelType::Stream])?;
    let refs = reference_inputs(f, pe);
    for &r in &refs {
        replay(f, r, partial, &graph, &DEVICE_TYPES)?;
    }
    // The output's stream chunks may cut an axis that an operand splits over devices in
    // another layout (`[s, d, ..]` against `[d, ..]`): the partial then keeps the operand's
    // split and no stream split, and step 3 splits `out = sum(partial)` into the reduction
    // over devices and the layout change.
    let lost = |f: &Fusion| {
        DEVICE_TYPES.into_iter().any(|pt| {
            parallel_axis(f, &f.tensor(partial).loop_domain, pt).is_none()
                && refs
                    .iter()
                    .any(|r| parallel_axis(f, &f.tensor(*r).loop_domain, pt).is_some())
        })
    };
    if lost(f) {
        f.tensor_mut(partial).loop_domain = unsplit;
        for &r in &refs {
            replay(f, r, partial, &graph, &DEVICE_TYPES)?;
        }
    }

    // The original expr reduces the partial over its device axes only.
    let visible = f.visible_axes(partial);
    let axes: Vec<usize> = device_axes
        .iter()
        .map(|(_, o)| visible.iter().position(|x| x == o).expect("visible"))
        .collect();
    let op = match kind {
        ExprKind::Reduction { op, .. } => op,
        _ => ReduceOp::Sum,
    };
    let mut new_logical = Vec::new();
    let mut replaced: Vec<(IterDomainId, IterDomainId)> = Vec::new();
    for (j, &l) in out_tv.logical.iter().enumerate() {
        if let Some(k) = devs.iter().position(|d| d.logical_pos == j) {
            let d = &devs[k];
            let r = f.new_id(IterDomain {
                extent: Scalar::c(d.factor),
                iter_type: IterType::Reduction,
                parallel: if off[k] {
                    ParallelType::Serial
                } else {
                    d.parallel
                },
                rfactor: false,
                swizzle: None,
                definition: None,
            });
            new_logical.push(r);
            replaced.push((d.loop_id, r));
        } else if f.id(l).iter_type != IterType::Reduction {
            new_logical.push(l);
        }
    }
    let remap = |f: &Fusion, dom: &[IterDomainId]| -> Vec<IterDomainId> {
        dom.iter()
            .filter_map(|id| {
                if let Some((_, r)) = replaced.iter().find(|(l, _)| l == id) {
                    return Some(*r);
                }
                let src = source_in(f, *id, &out_tv.logical)?;
                (f.id(src).iter_type != IterType::Reduction).then_some(*id)
            })
            .collect()
    };
    let new_loop = remap(f, &out_tv.loop_domain);
    let new_alloc = out_tv.allocation.as_ref().map(|a| remap(f, a));
    {
        let tv = f.tensor_mut(out);
        tv.logical = new_logical;
        tv.loop_domain = new_loop;
        tv.allocation = new_alloc;
    }
    let ex = f.expr_mut(e);
    ex.kind = ExprKind::Reduction { op, axes };
    ex.inputs = vec![partial];
    Ok(())
}

/// The first row of the block of a table that the running device holds, for the partial of
/// `e = index_select(table, ids, axis)` whose rows are split over the devices of `devs` (one
/// outer split, which load checks): `index * rows`, with `rows` the block's length and
/// `index` the device's position along the split's parallel type, a size over the host
/// programs' built-in `rank`. The mesh's devices must be consecutive ids (`devices(..)`), so
/// that the position is arithmetic on `rank`.
fn lookup_shard_base(
    f: &Fusion,
    e: ExprId,
    axis: usize,
    devs: &[DeviceReduction],
    desc: &str,
) -> IrResult<Scalar> {
    let table = f.expr(e).inputs[0];
    let name = &f.tensor(table).name;
    let [d] = devs else {
        return Err(Diagnostic::new(format!(
            "cannot split {desc} across devices: the rows of `{name}` are split by {} device types; split them by one",
            devs.len()
        )));
    };
    let rows_axis = f.visible_axes(table)[axis];
    let extent = f.eval(&f.id(rows_axis).extent).ok_or_else(|| {
        Diagnostic::new(format!(
            "cannot split {desc} across devices: axis {axis} of `{name}` has no value"
        ))
    })?;
    if d.path.len() > 1 || d.factor <= 0 || extent % d.factor != 0 {
        return Err(Diagnostic::new(format!(
            "cannot split {desc} across devices: axis {axis} of `{name}` ({extent} rows) must be split once, into {} equal blocks",
            d.factor
        )));
    }
    let mesh = f
        .mesh_of(table)
        .or_else(|| f.mesh_of(f.expr(e).outputs[0]))
        .ok_or_else(|| {
            Diagnostic::new(format!(
                "cannot split {desc} across devices: `{name}` has no mesh"
            ))
        })?;
    if let Some(d) = scattered_mesh(name, mesh) {
        return Err(d);
    }
    let first = mesh.devices().first().copied().unwrap_or(0);
    let flat = Scalar::named(weave_ir::RANK).sub(first);
    let shape = mesh.shape();
    let cols = *shape.last().unwrap_or(&1) as i64;
    // Row-major: DIDx indexes the last mesh axis, DIDy the one before it. `x % c` is written
    // `x - x / c * c`, which the text format's tensor expressions can say.
    let index = match (d.parallel, shape.len()) {
        (_, 1) => flat,
        (ParallelType::DIDx, _) => flat.clone().sub(flat.div(cols).mul(cols)),
        _ => flat.div(cols),
    };
    Ok(index.mul(extent / d.factor))
}

/// The refusal of a vocabulary-parallel lookup whose table `name` is split over `mesh` when
/// the mesh's devices are not consecutive ids: a device finds its block's first row by
/// arithmetic on its rank, which a permuted or gapped device list does not allow.
pub(crate) fn scattered_mesh(name: &str, mesh: &weave_ir::DeviceMesh) -> Option<Diagnostic> {
    let devices = mesh.devices();
    let first = devices.first().copied().unwrap_or(0);
    devices
        .iter()
        .enumerate()
        .any(|(k, v)| *v != first + k as i64)
        .then(|| {
            Diagnostic::new(format!(
                "index_select: the rows of `{name}` are split across the devices of {mesh}, which are not consecutive ids; a vocabulary-parallel lookup needs a mesh of consecutive devices (`devices(d)`, or a list such as `[2, 3]`), from whose rank each device finds its block of rows"
            ))
        })
}

/// The axis of `within` that `id` derives from (through any split or merge input).
fn source_in(f: &Fusion, id: IterDomainId, within: &[IterDomainId]) -> Option<IterDomainId> {
    let mut cur = id;
    loop {
        if within.contains(&cur) {
            return Some(cur);
        }
        let e = f.id(cur).definition?;
        cur = f.id_expr(e).inputs()[0];
    }
}

/// Step 4: a Gather or Reduce whose receiver is not a device of the sender mesh would make
/// the receiver a member that contributes a piece (or a term) it does not have. It goes
/// through the senders instead: `mid = op(x)` on the sender mesh, replicated there (an
/// Allgather or Allreduce), then `y = set(mid)`, a Broadcast from the first sender to the
/// receivers.
fn route_through_the_senders(f: &mut Fusion, e: ExprId) -> IrResult<()> {
    if !is_resharding(f, e) {
        return Ok(());
    }
    let Ok(info) = derive_communication(f, e) else {
        return Ok(());
    };
    if !matches!(
        info.kind,
        CommunicationType::Gather | CommunicationType::Reduce
    ) {
        return Ok(());
    }
    let (x, y) = (f.expr(e).inputs[0], f.expr(e).outputs[0]);
    let (Some(pm), Some(cm)) = (f.mesh_of(x).cloned(), f.mesh_of(y).cloned()) else {
        return Ok(());
    };
    if cm.devices().iter().all(|d| pm.has(*d)) || f.tensor(y).root.is_some() {
        return Ok(());
    }
    let kind = f.expr(e).kind.clone();
    let name = f.fresh_name(&format!("{}_on_senders", f.tensor(y).name));
    let mid = f.add_op(&name, kind, &[x])?;
    let me = f.tensor(mid).definition.expect("just defined");
    f.move_expr_before(me, e);
    f.expr_mut(me).span = f.expr(e).span;
    f.tensor_mut(mid).mesh = f.tensor(x).mesh;
    f.tensor_mut(mid).span = f.tensor(y).span;
    let graph = IdGraph::build(f);
    replay(f, y, mid, &graph, &[ParallelType::Stream])?;
    make_set_of(f, e, mid);
    Ok(())
}

/// The device types whose sharding differs between `x` and `y`.
fn changing_types(f: &Fusion, x: TensorId, y: TensorId) -> Vec<ParallelType> {
    DEVICE_TYPES
        .into_iter()
        .filter(|pt| {
            let (xl, yl) = (&f.tensor(x).loop_domain, &f.tensor(y).loop_domain);
            (parallel_axis(f, xl, *pt).is_some() || parallel_axis(f, yl, *pt).is_some())
                && have_different_shardings(f, x, DomainKind::Loop, y, DomainKind::Loop, &[*pt])
        })
        .collect()
}

/// `(input, output)` of `e` when it is a `set` (or `segment_set`) of one tensor.
fn single_set(f: &Fusion, e: ExprId) -> Option<(TensorId, TensorId)> {
    let ex = f.expr(e);
    (matches!(ex.kind, ExprKind::Set | ExprKind::SegmentSet)
        && ex.inputs.len() == 1
        && ex.outputs.len() == 1)
        .then(|| (ex.inputs[0], ex.outputs[0]))
}

/// True if `e` is a `set` on one mesh whose DIDx and DIDy shardings both change: step 3
/// turns it into one set per change (`one_change_per_set`).
pub fn changes_several_device_types(f: &Fusion, e: ExprId) -> bool {
    let Some((x, y)) = single_set(f, e) else {
        return false;
    };
    f.mesh_of(x).is_some() && f.mesh_of(x) == f.mesh_of(y) && changing_types(f, x, y).len() > 1
}

/// True if `e` is a `set` from one mesh to another whose output is split across devices and
/// that no single communication performs, because the receiver mesh is 2-D (a Scatter onto
/// it) or because DIDx and DIDy both change: step 3 first copies the input whole onto the
/// receiver mesh (`replicate_on_the_receivers`), then splits it there, one set per type.
pub fn copies_onto_another_mesh_in_two(f: &Fusion, e: ExprId) -> bool {
    let Some((x, y)) = single_set(f, e) else {
        return false;
    };
    let (Some(xm), Some(ym)) = (f.mesh_of(x), f.mesh_of(y)) else {
        return false;
    };
    let y_split = DEVICE_TYPES
        .iter()
        .any(|pt| parallel_axis(f, &f.tensor(y).loop_domain, *pt).is_some());
    xm != ym
        && y_split
        && (ym.shape().len() > 1 || changing_types(f, x, y).len() > 1)
        && derive_communication(f, e).is_err()
}

/// Step 3 for a `set` of [`copies_onto_another_mesh_in_two`]: `<in>_resharded = set(in)`,
/// whole (replicated) on the output's mesh (a Broadcast, or a gather on the senders and a
/// Broadcast), is inserted before it, and the `set` then splits that copy on one mesh.
fn replicate_on_the_receivers(f: &mut Fusion, e: ExprId) -> IrResult<()> {
    let (x, y) = (f.expr(e).inputs[0], f.expr(e).outputs[0]);
    let name = f.fresh_name(&format!("{}_resharded", f.tensor(x).name));
    let mid = f.add_op(&name, ExprKind::Set, &[x])?;
    let se = f.tensor(mid).definition.expect("just defined");
    f.move_expr_before(se, e);
    f.expr_mut(se).span = f.expr(e).span;
    f.tensor_mut(mid).mesh = f.tensor(y).mesh;
    f.tensor_mut(mid).span = f.tensor(x).span;
    f.expr_mut(e).inputs = vec![mid];
    ensure_communication(f, se)
}

/// The materialized axis of `t` that its `pt` loop axis splits, if any.
fn sharded_position(f: &Fusion, t: TensorId, pt: ParallelType) -> Option<usize> {
    let id = parallel_axis(f, &f.tensor(t).loop_domain, pt)?;
    let logical = ancestor(f, id, &f.tensor(t).logical)?;
    f.visible_axes(t).iter().position(|a| *a == logical)
}

/// Step 3 for a `y = set(x)` on one mesh whose DIDx and DIDy shardings both change (a 2-D
/// mesh): a chain of sets, each changing one device type, is inserted before it. Each step
/// takes one changing type to `y`'s sharding while keeping `x`'s others, unless `y` splits
/// that type on an axis that `x` splits by another type; when every changing type clashes
/// like that, the step gathers one type instead (e.g. swapping the DIDx and DIDy axes:
/// Allgather over DIDx, AllToAll over DIDy, then the DIDx split of the replicated axis).
fn one_change_per_set(f: &mut Fusion, e: ExprId) -> IrResult<()> {
    let y = f.expr(e).outputs[0];
    for _ in 0..2 * DEVICE_TYPES.len() {
        let x = f.expr(e).inputs[0];
        if f.mesh_of(x) != f.mesh_of(y) {
            return Ok(());
        }
        let changes = changing_types(f, x, y);
        if changes.len() < 2 {
            return Ok(());
        }
        let clashes = |f: &Fusion, pt: ParallelType| {
            let Some(at) = sharded_position(f, y, pt) else {
                return false;
            };
            DEVICE_TYPES
                .into_iter()
                .filter(|o| *o != pt)
                .any(|o| sharded_position(f, x, o) == Some(at))
        };
        // Gathering needs a split of `x` to gather; a clash means `x` has one.
        let gatherable =
            |pt: &&ParallelType| parallel_axis(f, &f.tensor(x).loop_domain, **pt).is_some();
        let (pt, take) = match changes.iter().find(|pt| !clashes(f, **pt)) {
            Some(pt) => (*pt, true),
            None => match changes.iter().find(gatherable) {
                Some(pt) => (*pt, false),
                None => return Ok(()),
            },
        };
        let name = f.fresh_name(&format!("{}_resharded", f.tensor(x).name));
        let mid = f.add_op(&name, ExprKind::Set, &[x])?;
        let se = f.tensor(mid).definition.expect("just defined");
        f.move_expr_before(se, e);
        f.expr_mut(se).span = f.expr(e).span;
        f.tensor_mut(mid).mesh = f.tensor(y).mesh;
        f.tensor_mut(mid).span = f.tensor(x).span;
        let keep: Vec<ParallelType> = DEVICE_AND_STREAM_TYPES
            .into_iter()
            .filter(|t| *t != pt)
            .collect();
        let graph = IdGraph::build(f);
        replay(f, x, mid, &graph, &keep)?;
        if take {
            replay(f, y, mid, &graph, &[pt])?;
        }
        f.expr_mut(e).inputs = vec![mid];
        derive_communication(f, se)?;
    }
    Ok(())
}

/// Step 3 for a reduction `out = op(x)` on one mesh over a device-sharded axis that also
/// changes the sharding of other axes (e.g. `x`'s DIDy split `[d, ..]` against `out`'s
/// `[s, d, ..]`): `<out>_reduced = op(x)` reduces over the devices keeping `x`'s sharding of
/// the other axes (an Allreduce, Reduce or ReduceScatter), then `out = set(<out>_reduced)`
/// makes the other changes (one set per change, a layout change as a gather and a scatter).
/// `Err(None)` when `out` is on another mesh or the reduction over devices alone is no
/// communication either: the expr's own diagnostic then stands.
fn reduce_then_reshard(f: &mut Fusion, e: ExprId) -> Result<(), Option<Diagnostic>> {
    let (x, out) = (f.expr(e).inputs[0], f.expr(e).outputs[0]);
    // A reduction to another mesh keeps its own diagnostic.
    if f.mesh_of(x) != f.mesh_of(out) {
        return Err(None);
    }
    let kind = f.expr(e).kind.clone();
    let name = f.fresh_name(&format!("{}_reduced", f.tensor(out).name));
    let mid = f.add_op(&name, kind, &[x]).map_err(Some)?;
    let me = f.tensor(mid).definition.expect("just defined");
    f.move_expr_before(me, e);
    f.expr_mut(me).span = f.expr(e).span;
    f.tensor_mut(mid).mesh = f.tensor(out).mesh;
    f.tensor_mut(mid).span = f.tensor(out).span;
    let graph = IdGraph::build(f);
    replay(f, x, mid, &graph, &DEVICE_AND_STREAM_TYPES).map_err(Some)?;
    // The pass works on a copy: a failure leaves the user's fusion as it was.
    if !is_resharding(f, me) || derive_communication(f, me).is_err() {
        return Err(None);
    }
    make_set_of(f, e, mid);
    one_change_per_set(f, e).map_err(Some)?;
    ensure_communication(f, e).map_err(Some)
}

/// Makes the reduction `e` a `set` of `mid`: its output keeps its materialized axes, without
/// the reduction ones.
fn make_set_of(f: &mut Fusion, e: ExprId, mid: TensorId) {
    let y = f.expr(e).outputs[0];
    drop_reduction_axes(f, y);
    let ex = f.expr_mut(e);
    ex.kind = ExprKind::Set;
    ex.inputs = vec![mid];
}

/// Drops `y`'s reduction axes, and the loop and allocation axes made from them, when the expr
/// that defines it stops reducing (it becomes a copy or a pointwise op).
fn drop_reduction_axes(f: &mut Fusion, y: TensorId) {
    let tv = f.tensor(y).clone();
    let reduced = |f: &Fusion, id: IterDomainId| {
        source_in(f, id, &tv.logical).is_some_and(|l| f.id(l).iter_type == IterType::Reduction)
    };
    let keep = |f: &Fusion, dom: &[IterDomainId]| -> Vec<IterDomainId> {
        dom.iter().copied().filter(|i| !reduced(f, *i)).collect()
    };
    let logical = keep(f, &tv.logical);
    let loop_domain = keep(f, &tv.loop_domain);
    let allocation = tv.allocation.as_ref().map(|a| keep(f, a));
    let t = f.tensor_mut(y);
    t.logical = logical;
    t.loop_domain = loop_domain;
    t.allocation = allocation;
}

/// Step 3: sets before the operands of a resharding expr that is not a communication.
fn insert_resharding_sets(f: &mut Fusion, e: ExprId) -> IrResult<()> {
    if !is_resharding(f, e) {
        return Ok(());
    }
    let kind = f.expr(e).kind.clone();
    match kind {
        ExprKind::Set | ExprKind::SegmentSet => {
            if copies_onto_another_mesh_in_two(f, e) {
                replicate_on_the_receivers(f, e)?;
            }
            one_change_per_set(f, e)?;
            return ensure_communication(f, e);
        }
        ExprKind::Squeeze { .. } => {
            return ensure_communication(f, e);
        }
        ExprKind::Reduction { .. } => match derive_communication(f, e) {
            Ok(_) => return Ok(()),
            Err(d) if reduces_device_axis(f, e) => {
                return reduce_then_reshard(f, e).map_err(|other| other.unwrap_or(d));
            }
            Err(_) => {}
        },
        _ => {}
    }
    let out = f.expr(e).outputs[0];
    // The user's expr as written, before its operands are replaced by copies.
    let user_desc = expr_desc(f, e);
    let mut inputs = f.expr(e).inputs.clone();
    let mut seen = HashSet::new();
    inputs.retain(|x| seen.insert(*x));
    for x in inputs {
        if !have_different_shardings(f, x, DomainKind::Loop, out, DomainKind::Loop, &DEVICE_TYPES) {
            continue;
        }
        if f.tensor(out).mesh.is_none() {
            // propagate-shardings gives every tensor next to a meshed one a mesh, so only a
            // pipeline that skipped it gets here; name the user's tensors, not the copy.
            return Err(Diagnostic::new(format!(
                "{user_desc}: `{}` has no device mesh while its operand `{}` is sharded across \
                 devices; give `{}` a mesh (`mesh = …` in its schedule)",
                f.tensor(out).name,
                f.tensor(x).name,
                f.tensor(out).name
            )));
        }
        let name = f.fresh_name(&format!("{}_resharded", f.tensor(x).name));
        let copy = f.add_op(&name, ExprKind::Set, &[x])?;
        let se = f.tensor(copy).definition.expect("just defined");
        f.move_expr_before(se, e);
        f.expr_mut(se).span = f.expr(e).span;
        f.tensor_mut(copy).mesh = f.tensor(out).mesh;
        f.tensor_mut(copy).span = f.tensor(x).span;
        for i in f.expr_mut(e).inputs.iter_mut() {
            if *i == x {
                *i = copy;
            }
        }
        let graph = IdGraph::build(f);
        replay(f, out, copy, &graph, &DEVICE_AND_STREAM_TYPES)?;
        one_change_per_set(f, se)?;
        ensure_communication(f, se).map_err(|d| {
            // The copy is the compiler's: name the user's tensor and expr instead.
            let copy_desc = expr_desc(f, se);
            let user = format!("the resharding of `{}` for {user_desc}", f.tensor(x).name);
            Diagnostic::new(d.message.replace(&copy_desc, &user)).or_at(f.expr(e).span)
        })?;
    }
    if is_resharding(f, e) {
        return Err(Diagnostic::new(format!(
            "decompose-reshardings could not make {user_desc} local: its operands still differ from its output in device sharding"
        )));
    }
    Ok(())
}

/// Checks that the `set` `e` is one communication; a copy that only changes how a device
/// split lays out its axis ([`is_layout_change`]), or that moves a device split to another
/// axis from or into stream chunks ([`is_nested_all_to_all`]), first becomes
/// `<in>_gathered = set(in)`,
/// replicated on the input's mesh (an allgather), and `e` then copies that (a scatter).
/// The gathered copy takes the Stream split of `e`'s output, so that gather and scatter run
/// chunk by chunk in the output's stream loop (a broadcast per chunk), or else that of the
/// input (an allgather per chunk when the input's device split sits inside its stream
/// chunks), or else none.
fn ensure_communication(f: &mut Fusion, e: ExprId) -> IrResult<()> {
    if is_unnested_did_to_stream(f, e) {
        return gather_then_slice(f, e);
    }
    if !is_layout_change(f, e) && !is_nested_all_to_all(f, e) {
        derive_communication(f, e)?;
        return Ok(());
    }
    let (x, gathered, ge) = insert_gather(f, e)?;
    let out = f.expr(e).outputs[0];
    let unsplit = f.tensor(gathered).loop_domain.clone();
    for reference in [out, x] {
        if parallel_axis(f, &f.tensor(reference).loop_domain, ParallelType::Stream).is_none() {
            continue;
        }
        let graph = IdGraph::build(f);
        replay(f, reference, gathered, &graph, &[ParallelType::Stream])?;
        if derive_communication(f, ge).is_ok() && derive_communication(f, e).is_ok() {
            return Ok(());
        }
        f.tensor_mut(gathered).loop_domain = unsplit.clone();
    }
    derive_communication(f, ge)?;
    derive_communication(f, e)?;
    Ok(())
}

/// A DID → Stream `set` whose stream chunks and device shards neither match nor nest
/// ([`is_unnested_did_to_stream`]) becomes `<in>_gathered = set(in)`, replicated on the
/// input's mesh and not stream-split (one Allgather before the stream loop; other device
/// types keep `in`'s splits), and `e` copies the gathered tensor chunk by chunk, locally.
fn gather_then_slice(f: &mut Fusion, e: ExprId) -> IrResult<()> {
    let (_, _, ge) = insert_gather(f, e)?;
    derive_communication(f, ge)?;
    if is_resharding(f, e) {
        derive_communication(f, e)?;
    }
    Ok(())
}

/// Inserts `<in>_gathered = set(in)` before the copy `e` (on the input's mesh, at `e`'s
/// place) and makes `e` read it; only the device types whose layout changes are gathered:
/// the others keep the input's splits, so that the gather and the scatter each change one
/// type (on a 2-D mesh). Returns the input, the gathered tensor and its `set`.
fn insert_gather(f: &mut Fusion, e: ExprId) -> IrResult<(TensorId, TensorId, ExprId)> {
    let x = f.expr(e).inputs[0];
    let changing = changing_types(f, x, f.expr(e).outputs[0]);
    let name = f.fresh_name(&format!("{}_gathered", f.tensor(x).name));
    let gathered = f.add_op(&name, ExprKind::Set, &[x])?;
    let ge = f.tensor(gathered).definition.expect("just defined");
    f.move_expr_before(ge, e);
    f.expr_mut(ge).span = f.expr(e).span;
    f.tensor_mut(gathered).mesh = f.tensor(x).mesh;
    f.tensor_mut(gathered).span = f.tensor(x).span;
    f.expr_mut(e).inputs = vec![gathered];
    let kept: Vec<ParallelType> = DEVICE_TYPES
        .into_iter()
        .filter(|t| !changing.contains(t))
        .collect();
    if !kept.is_empty() {
        let graph = IdGraph::build(f);
        replay(f, x, gathered, &graph, &kept)?;
    }
    Ok((x, gathered, ge))
}

/// True if an operand of the reduction `e` is device-sharded on an axis `e` reduces.
fn reduces_device_axis(f: &Fusion, e: ExprId) -> bool {
    let x = f.expr(e).inputs[0];
    let pairs = pairwise_map(f, e, x);
    DEVICE_TYPES.iter().any(|pt| {
        parallel_axis(f, &f.tensor(x).loop_domain, *pt)
            .and_then(|id| ancestor(f, id, &f.tensor(x).logical))
            .and_then(|l| pairs.iter().find(|(p, _)| *p == l).map(|(_, c)| *c))
            .is_some_and(|c| f.id(c).iter_type == IterType::Reduction)
    })
}
