//! Steps 1 and 2 of `decompose-reshardings`: marking device-reduced axes (and splitting the
//! bias off a device-reduced `linear`), then rfactoring a reduction over a device axis into a
//! local partial and a collective `sum`/`max`.

use std::collections::HashSet;

use weave_ir::{
    BinaryOp, Diagnostic, ExprId, ExprKind, Fusion, IdExpr, IrResult, IterDomain, IterDomainId,
    IterType, ParallelType, ReduceOp, Scalar, SplitKind, TensorId,
};
use weave_transform::logical_map::pairwise_map;
use weave_transform::schedule::{self, DomainKind};
use weave_transform::IdGraph;

use super::{drop_reduction_axes, scattered_mesh, set_domains, source_in};
use crate::communication::expr_desc;
use crate::propagate_shardings::{reference_inputs, replay};
use crate::resharding::{parallel_axis, DEVICE_AND_STREAM_TYPES, DEVICE_TYPES};

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
pub(super) fn mark_device_reduced_axes(f: &mut Fusion, e: ExprId) -> IrResult<()> {
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
pub(super) fn split_device_reduced_bias(f: &mut Fusion, e: ExprId) -> IrResult<ExprId> {
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
pub(super) fn rfactor_device_reduction(f: &mut Fusion, e: ExprId) -> IrResult<()> {
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
        // A GEMM's contraction, and the rows of a lookup that other devices hold (zeros
        // here), add up.
        ExprKind::Matmul | ExprKind::Linear | ExprKind::IndexSelect { .. } => ReduceOp::Sum,
        other => {
            return Err(Diagnostic::new(format!(
                "cannot rfactor {desc}: a `{other:?}` has no reduction to split across devices"
            )))
        }
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
    set_domains(f, out, new_logical, new_loop, new_alloc);
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
    let flat = Scalar::builtin(weave_ir::Builtin::Rank).sub(first);
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

/// Step 2b: a device reduction whose stream chunks are the device blocks of the one `set`
/// that reads it (`p = sum(p_partial)` over DIDx, stream-split on an axis in `d` chunks, and
/// `out = set(p)` split over the same `d` devices on that axis, cut alike) becomes one
/// reduction, `out = sum(p_partial)`: iteration `i` of the stream loop reduces its chunk onto
/// device `i` (a Reduce rooted at the iteration's device), instead of an Allreduce of every
/// chunk into a replicated copy that a Scatter then cuts. `p` leaves the program. A bias added
/// between the two (`p = add(p_nobias, bias_broadcast)`, as step 1b splits a row-parallel
/// `linear` with a bias) is added after the reduction instead: `out_nobias = sum(p_partial)`,
/// `out = add(out_nobias, bias_broadcast)`, when the bias is replicated. The same pair with
/// neither `p` nor `out` stream-split folds into one ReduceScatter. Does nothing unless the
/// folded expr is exactly that Reduce (or ReduceScatter); works on a copy, so a fold that
/// fails leaves the fusion as it was.
pub(super) fn fold_reduction_into_stream_scatter(f: &mut Fusion, e: ExprId) -> IrResult<()> {
    if let Some(g) = folded(f, e).or_else(|| folded_through_a_bias(f, e)) {
        *f = g;
    }
    Ok(())
}

/// The fusion with `z = set(y)`, `y = sum(p_partial)` folded into `z = sum(p_partial)` (see
/// [`fold_reduction_into_stream_scatter`]), if that is a Reduce rooted at each iteration's
/// device (`y` stream-split) or a ReduceScatter (neither stream-split).
fn folded(f: &Fusion, e: ExprId) -> Option<Fusion> {
    use crate::communication::{derive_communication, RootKind};
    use weave_host_ir::CommunicationType;
    let (y, z, ey) = set_of_a_result(f, e)?;
    let streamed = |t: TensorId| parallel_axis(f, &f.tensor(t).loop_domain, ParallelType::Stream);
    // Stream-split `y` folds into a Reduce per chunk; unstreamed `y` and `z` into one
    // ReduceScatter (the same program with its Stream axes run serially).
    let per_chunk = match (streamed(y), streamed(z)) {
        (Some(_), None) => true,
        (None, None) => false,
        _ => return None,
    };
    if !matches!(f.expr(ey).kind, ExprKind::Reduction { .. })
        || f.is_output(y)
        || f.uses(y) != vec![e]
        || f.mesh_of(y) != f.mesh_of(z)
    {
        return None;
    }
    if derive_communication(f, ey).ok()?.kind != CommunicationType::Allreduce {
        return None;
    }
    let mut g = f.clone();
    let yt = g.tensor(y).clone();
    let reduced = |g: &Fusion, dom: &[IterDomainId]| -> Vec<IterDomainId> {
        dom.iter()
            .copied()
            .filter(|i| g.id(*i).iter_type == IterType::Reduction)
            .collect()
    };
    let (r_logical, r_loop) = (reduced(&g, &yt.logical), reduced(&g, &yt.loop_domain));
    {
        let zt = g.tensor_mut(z);
        zt.logical.extend(r_logical);
        zt.loop_domain.extend(r_loop);
    }
    let kind = g.expr(ey).kind.clone();
    let inputs = g.expr(ey).inputs.clone();
    {
        let ez = g.expr_mut(e);
        ez.kind = kind;
        ez.inputs = inputs;
    }
    g.remove_expr(ey);
    derive_communication(&g, e)
        .is_ok_and(|i| match per_chunk {
            true => i.kind == CommunicationType::Reduce && i.root == Some(RootKind::StreamIndex),
            false => i.kind == CommunicationType::ReduceScatter,
        })
        .then_some(g)
}

/// The fusion with `z = set(y)`, `y = add(s, bias)` (`s` a device sum read only there, `bias`
/// without any parallel axis) rewritten as `z_nobias = set(s)` sharded like `z`, then `z =
/// add(z_nobias, bias)`, and `z_nobias = set(s)` [`folded`]; `None` unless all of it holds.
fn folded_through_a_bias(f: &Fusion, e: ExprId) -> Option<Fusion> {
    let (y, z, ey) = set_of_a_result(f, e)?;
    let add = f.expr(ey);
    if add.kind != ExprKind::Binary(BinaryOp::Add) || add.inputs.len() != 2 {
        return None;
    }
    let is_sum = |t: TensorId| {
        f.tensor(t)
            .definition
            .is_some_and(|d| matches!(f.expr(d).kind, ExprKind::Reduction { .. }))
    };
    let at = add.inputs.iter().position(|t| is_sum(*t))?;
    let (s, bias) = (add.inputs[at], add.inputs[1 - at]);
    let replicated = f
        .tensor(bias)
        .loop_domain
        .iter()
        .all(|i| f.id(*i).parallel == ParallelType::Serial);
    if is_sum(bias)
        || !replicated
        || f.is_output(y)
        || f.is_output(s)
        || f.uses(y) != vec![e]
        || f.uses(s) != vec![ey]
    {
        return None;
    }
    let mut g = f.clone();
    let name = g.fresh_name(&format!("{}_nobias", g.tensor(z).name));
    let mesh = g.tensor(z).mesh;
    let (mid, me) = super::insert_before(&mut g, e, &name, ExprKind::Set, &[s], mesh, z).ok()?;
    let graph = IdGraph::build(&g);
    replay(&mut g, z, mid, &graph, &DEVICE_AND_STREAM_TYPES).ok()?;
    let mut inputs = vec![mid, bias];
    if at == 1 {
        inputs.reverse();
    }
    {
        let ez = g.expr_mut(e);
        ez.kind = ExprKind::Binary(BinaryOp::Add);
        ez.inputs = inputs;
    }
    g.remove_expr(ey);
    folded(&g, me)
}

/// `(y, z, ey)` when `e` is `z = set(y)` and `ey` defines `y` (no fusion input).
fn set_of_a_result(f: &Fusion, e: ExprId) -> Option<(TensorId, TensorId, ExprId)> {
    let ex = f.expr(e);
    if ex.kind != ExprKind::Set || ex.inputs.len() != 1 {
        return None;
    }
    let (y, z) = (ex.inputs[0], ex.outputs[0]);
    Some((y, z, f.tensor(y).definition?))
}
