//! The fusion verifier: structural invariants every pass must keep (definitions before
//! uses, dtype and shape agreement, reduction axes, meshes, the outer-split rule for device
//! and stream axes, loop and allocation domains derived from the logical domain).
//!
//! Errors name the tensor (by its user name), the axis, and carry the span of the statement
//! that introduced the problem when the fusion came from text.

use std::collections::HashSet;

use crate::diag::{Diagnostic, IrResult};
use crate::domain::{IdExpr, IterType, ParallelType, SplitKind};
use crate::dtype::DType;
use crate::expr::ExprKind;
use crate::fusion::Fusion;
use crate::ids::{IterDomainId, TensorId};

/// Checks every invariant; returns the first violation.
pub fn verify(f: &Fusion) -> IrResult<()> {
    check_definitions(f)?;
    for e in f.exprs() {
        check_expr(f, *e).map_err(|d| d.or_at(f.expr(*e).span))?;
    }
    for t in f.tensors_in_order() {
        check_tensor(f, t).map_err(|d| d.or_at(f.tensor(t).span))?;
    }
    Ok(())
}

/// The load-time check of `iota`, `slice` and `concat`: they index their axis globally, so no
/// schedule may cut that axis of an operand or of the result (a device, stream or serial
/// split, a `parallelize`, or a merge). The error is at the op and names the tensor, the axis
/// and what to write instead. An `index_select`'s table may cut the axis its ids index by
/// one device split only (each device looks up its block of rows).
pub fn check_indexed_axes(f: &Fusion) -> IrResult<()> {
    indexed_axes_whole(f, false)
}

/// [`check_indexed_axes`] on a fusion whose shardings were propagated: a split there came
/// from the neighbours' schedules, and the message says so and what to write instead.
pub fn check_indexed_axes_propagated(f: &Fusion) -> IrResult<()> {
    indexed_axes_whole(f, true)
}

fn indexed_axes_whole(f: &Fusion, propagated: bool) -> IrResult<()> {
    for e in f.exprs() {
        let expr = f.expr(*e);
        if let ExprKind::IndexSelect { axis, .. } = &expr.kind {
            lookup_rows_split_by_devices_only(f, expr, *axis, propagated)?;
            continue;
        }
        let (ExprKind::Iota { axis } | ExprKind::Slice { axis, .. } | ExprKind::Concat { axis }) =
            &expr.kind
        else {
            continue;
        };
        let op = expr.kind.op_name();
        for t in expr.inputs.iter().chain(&expr.outputs) {
            let tv = f.tensor(*t);
            let Some(l) = f.visible_axes(*t).get(*axis).copied() else {
                continue;
            };
            let whole = tv.loop_domain.contains(&l) && f.id(l).parallel == ParallelType::Serial;
            if !whole {
                let message = if propagated {
                    format!(
                        "{op}: sharding propagation carries a device or stream split from the schedules around it onto axis {axis} of `{}`, which `{op}` indexes globally; this op needs that axis whole on every device and in every stream chunk: split another axis in those schedules",
                        tv.name
                    )
                } else {
                    format!(
                        "{op}: the schedule of `{}` cuts axis {axis}, which `{op}` indexes globally; this op needs that axis whole on every device and in every stream chunk: split another axis of `{}`, or leave it unscheduled",
                        tv.name, tv.name
                    )
                };
                return Err(Diagnostic::new(message).or_at(expr.span));
            }
        }
    }
    Ok(())
}

/// An `index_select`'s table may split the axis its ids index across devices, one outer
/// split straight into a device axis (`outer_split(a, d) -> DIDx`): each device looks up the
/// ids in its block of rows and the partial results are added across the devices. Any other
/// cut of that axis (stream or serial chunks, a split inside a split, a merge) would leave
/// partial lookups that nothing adds up, and is refused at the op.
fn lookup_rows_split_by_devices_only(
    f: &Fusion,
    expr: &crate::expr::Expr,
    axis: usize,
    propagated: bool,
) -> IrResult<()> {
    let Some(&table) = expr.inputs.first() else {
        return Ok(());
    };
    let tv = f.tensor(table);
    let Some(l) = f.visible_axes(table).get(axis).copied() else {
        return Ok(());
    };
    let from_l = |id: IterDomainId| derives_from(f, id, l);
    let cut: Vec<IterDomainId> = tv
        .loop_domain
        .iter()
        .copied()
        .filter(|i| from_l(*i))
        .collect();
    let whole = cut == [l] && f.id(l).parallel == ParallelType::Serial;
    let device_split = match cut.as_slice() {
        [o, i] => match f.id(*o).definition.map(|d| f.id_expr(d)) {
            Some(IdExpr::Split {
                input,
                outer,
                inner,
                kind: SplitKind::Outer,
                ..
            }) => {
                *input == l
                    && outer == o
                    && inner == i
                    && f.id(*o).parallel.is_device()
                    && f.id(*i).parallel == ParallelType::Serial
            }
            _ => false,
        },
        _ => false,
    };
    if whole || device_split {
        return Ok(());
    }
    let message = if propagated {
        format!(
            "index_select: sharding propagation carries a stream or serial split from the schedules around it onto axis {axis} of `{}`, the rows the ids index; a lookup's rows may only be split across devices (`outer_split({axis}, d) -> DIDx`, each device looking up the ids in its block): split another axis in those schedules",
            tv.name
        )
    } else {
        format!(
            "index_select: the schedule of `{}` cuts axis {axis}, the rows the ids index, other than by one device split; a lookup's rows may only be split across devices (`outer_split({axis}, d) -> DIDx`, each device looking up the ids in its block, the partial rows added across devices), not into stream or serial chunks: split the rows across devices, or split another axis",
            tv.name
        )
    };
    Err(Diagnostic::new(message).or_at(expr.span))
}

/// Whether `id` is `target` or derives from it through splits and merges.
fn derives_from(f: &Fusion, id: IterDomainId, target: IterDomainId) -> bool {
    if id == target {
        return true;
    }
    match f.id(id).definition {
        Some(e) => f
            .id_expr(e)
            .inputs()
            .iter()
            .any(|i| derives_from(f, *i, target)),
        None => false,
    }
}

fn name(f: &Fusion, t: TensorId) -> &str {
    &f.tensor(t).name
}

fn check_definitions(f: &Fusion) -> IrResult<()> {
    let mut defined: HashSet<TensorId> = HashSet::new();
    let mut names: HashSet<&str> = HashSet::new();
    for t in f.inputs() {
        if f.tensor(*t).definition.is_some() {
            return Err(Diagnostic::new(format!(
                "fusion input `{}` has a defining op",
                name(f, *t)
            )));
        }
        defined.insert(*t);
    }
    for e in f.exprs() {
        let expr = f.expr(*e);
        for i in &expr.inputs {
            if !defined.contains(i) {
                return Err(Diagnostic::new(format!(
                    "{} reads `{}` before it is defined",
                    expr.kind.op_name(),
                    name(f, *i)
                ))
                .or_at(expr.span));
            }
        }
        for o in &expr.outputs {
            if !defined.insert(*o) {
                return Err(
                    Diagnostic::new(format!("`{}` is defined twice", name(f, *o))).or_at(expr.span),
                );
            }
            if f.tensor(*o).definition != Some(*e) {
                return Err(Diagnostic::new(format!(
                    "`{}` does not record {} as its definition",
                    name(f, *o),
                    expr.kind.op_name()
                ))
                .or_at(expr.span));
            }
        }
    }
    for t in f.tensors_in_order() {
        if !names.insert(&f.tensor(t).name) {
            return Err(Diagnostic::new(format!(
                "duplicate tensor name `{}`",
                name(f, t)
            )));
        }
    }
    for o in f.outputs() {
        if !defined.contains(o) {
            return Err(Diagnostic::new(format!(
                "output `{}` is never defined",
                name(f, *o)
            )));
        }
    }
    Ok(())
}

fn check_expr(f: &Fusion, e: crate::ids::ExprId) -> IrResult<()> {
    let expr = f.expr(e);
    let op = expr.kind.op_name();
    let out = expr.outputs[0];
    let out_tv = f.tensor(out);
    let vis_out = f.visible_axes(out);
    let in_dtypes: Vec<DType> = expr.inputs.iter().map(|t| f.tensor(*t).dtype).collect();
    // Dtype rules.
    match &expr.kind {
        ExprKind::Binary(b) | ExprKind::BinaryLit { op: b, .. } => {
            // Two tensor operands must have the same dtype.
            if matches!(expr.kind, ExprKind::Binary(_)) && in_dtypes[0] != in_dtypes[1] {
                return Err(Diagnostic::new(format!(
                    "dtype mismatch in {op}: `{}` is {} but `{}` is {}",
                    name(f, expr.inputs[0]),
                    in_dtypes[0],
                    name(f, expr.inputs[1]),
                    in_dtypes[1]
                )));
            }
            let want = if b.is_comparison() {
                DType::Bool
            } else {
                in_dtypes[0]
            };
            if out_tv.dtype != want {
                return Err(Diagnostic::new(format!(
                    "{op} output `{}` is {} but should be {want}",
                    out_tv.name, out_tv.dtype
                )));
            }
        }
        ExprKind::WhereLit { .. } => {
            if in_dtypes.len() != 2 || in_dtypes[0] != DType::Bool || out_tv.dtype != in_dtypes[1] {
                return Err(Diagnostic::new(format!(
                    "where `{}` needs a bool condition and one tensor operand of its dtype",
                    out_tv.name
                )));
            }
        }
        ExprKind::Cast(d) => {
            if out_tv.dtype != *d {
                return Err(Diagnostic::new(format!(
                    "cast output `{}` is {} but the cast is to {d}",
                    out_tv.name, out_tv.dtype
                )));
            }
        }
        ExprKind::Where => {
            if in_dtypes[0] != DType::Bool || in_dtypes[1] != in_dtypes[2] {
                return Err(Diagnostic::new(format!(
                    "where `{}` needs a bool condition and operands of one dtype",
                    out_tv.name
                )));
            }
        }
        ExprKind::Iota { .. } => {
            if out_tv.dtype != DType::I64 {
                return Err(Diagnostic::new(format!(
                    "iota output `{}` is {} but should be i64",
                    out_tv.name, out_tv.dtype
                )));
            }
        }
        ExprKind::IndexSelect { .. } => {
            if in_dtypes[1] != DType::I64 || out_tv.dtype != in_dtypes[0] {
                return Err(Diagnostic::new(format!(
                    "index_select `{}` needs i64 ids and the table's dtype ({}), got ids of {} and a result of {}",
                    out_tv.name, in_dtypes[0], in_dtypes[1], out_tv.dtype
                )));
            }
        }
        ExprKind::Matmul | ExprKind::Linear | ExprKind::Concat { .. } => {
            if in_dtypes.iter().any(|d| *d != in_dtypes[0]) || out_tv.dtype != in_dtypes[0] {
                return Err(Diagnostic::new(format!(
                    "dtype mismatch in {op} defining `{}`",
                    out_tv.name
                )));
            }
        }
        _ => {
            if out_tv.dtype != in_dtypes[0] {
                return Err(Diagnostic::new(format!(
                    "{op} output `{}` is {} but its input `{}` is {}",
                    out_tv.name,
                    out_tv.dtype,
                    name(f, expr.inputs[0]),
                    in_dtypes[0]
                )));
            }
        }
    }
    // Shape rules.
    if expr.kind.is_pointwise() {
        for i in &expr.inputs {
            let vis = f.visible_axes(*i);
            if vis.len() != vis_out.len() {
                return Err(Diagnostic::new(format!(
                    "{op}: `{}` has rank {} but its output `{}` has rank {}",
                    name(f, *i),
                    vis.len(),
                    out_tv.name,
                    vis_out.len()
                )));
            }
            for (axis, (a, b)) in vis.iter().zip(&vis_out).enumerate() {
                let (a, b) = (f.id(*a), f.id(*b));
                if a.iter_type != IterType::Broadcast && !f.same_extent(&a.extent, &b.extent) {
                    return Err(Diagnostic::new(format!(
                        "{op}: axis {axis} of `{}` has extent `{}` but axis {axis} of `{}` has extent `{}`",
                        name(f, *i),
                        a.extent.to_source(),
                        out_tv.name,
                        b.extent.to_source()
                    )));
                }
            }
        }
    }
    // Reduction positions are read from the root domain (the op's direct output) when there
    // is one: an rfactor split moves reduction axes in the logical domain.
    let reductions: Vec<usize> = out_tv
        .root_domain()
        .iter()
        .enumerate()
        .filter(|(_, i)| f.id(**i).iter_type == IterType::Reduction)
        .map(|(k, _)| k)
        .collect();
    match &expr.kind {
        ExprKind::Reduction { axes, .. } => {
            if &reductions != axes {
                return Err(Diagnostic::new(format!(
                    "{op} over axes {axes:?}: output `{}` has reduction axes at {reductions:?}",
                    out_tv.name
                )));
            }
        }
        ExprKind::Matmul | ExprKind::Linear | ExprKind::IndexSelect { .. } => {
            if reductions != [out_tv.root_domain().len() - 1] {
                return Err(Diagnostic::new(format!(
                    "{op}: output `{}` must end in exactly one reduction axis (the contraction, or the table's rows)",
                    out_tv.name
                )));
            }
        }
        _ => {
            if !reductions.is_empty() && out_tv.root.is_none() {
                return Err(Diagnostic::new(format!(
                    "{op}: output `{}` has reduction axis {} but {op} reduces nothing",
                    out_tv.name, reductions[0]
                )));
            }
        }
    }
    Ok(())
}

/// The ids an id derives from, following split/merge definitions back to `stop`.
fn reaches(f: &Fusion, id: IterDomainId, stop: &HashSet<IterDomainId>) -> bool {
    if stop.contains(&id) {
        return true;
    }
    match f.id(id).definition {
        Some(e) => f.id_expr(e).inputs().iter().all(|i| reaches(f, *i, stop)),
        None => false,
    }
}

fn check_tensor(f: &Fusion, t: TensorId) -> IrResult<()> {
    let tv = f.tensor(t);
    let n = &tv.name;
    if f.is_input(t)
        && tv
            .logical
            .iter()
            .any(|i| f.id(*i).iter_type == IterType::Reduction)
    {
        return Err(Diagnostic::new(format!(
            "fusion input `{n}` has a reduction axis"
        )));
    }
    if let Some(m) = tv.mesh {
        if !f.meshes().contains(&m) {
            return Err(Diagnostic::new(format!(
                "`{n}` refers to an undeclared mesh"
            )));
        }
    }
    // Root → logical must be derivable when there is a root.
    let root: HashSet<IterDomainId> = tv.root_domain().iter().copied().collect();
    for (axis, id) in tv.logical.iter().enumerate() {
        if !reaches(f, *id, &root) {
            return Err(Diagnostic::new(format!(
                "logical axis {axis} of `{n}` is not derived from its root domain"
            )));
        }
    }
    let logical: HashSet<IterDomainId> = tv.logical.iter().copied().collect();
    for (what, dom) in [
        ("loop", Some(&tv.loop_domain)),
        ("allocation", tv.allocation.as_ref()),
    ] {
        let Some(dom) = dom else { continue };
        let mut seen = HashSet::new();
        for (axis, id) in dom.iter().enumerate() {
            if !seen.insert(*id) {
                return Err(Diagnostic::new(format!(
                    "{what} axis {axis} of `{n}` appears twice in the {what} domain"
                )));
            }
            if !reaches(f, *id, &logical) {
                return Err(Diagnostic::new(format!(
                    "{what} axis {axis} of `{n}` is not derived from its logical domain"
                )));
            }
        }
    }
    // Parallel types: once each, device/stream axes from outer splits, meshes agree.
    let mut used: Vec<ParallelType> = Vec::new();
    for (axis, id) in tv.loop_domain.iter().enumerate() {
        let d = f.id(*id);
        let pt = d.parallel;
        if pt == ParallelType::Serial {
            continue;
        }
        if d.iter_type != IterType::Reduction {
            if used.contains(&pt) {
                return Err(Diagnostic::new(format!(
                    "loop domain of `{n}` has {pt} twice (again at axis {axis})"
                )));
            }
            used.push(pt);
        }
        if let Some(e) = d.definition {
            if !logical.contains(id) {
                match f.id_expr(e) {
                    IdExpr::Split {
                        outer,
                        kind: SplitKind::Outer,
                        ..
                    } if outer == id => {}
                    IdExpr::Split { .. } => {
                        return Err(Diagnostic::new(format!(
                            "loop axis {axis} of `{n}` is {pt} but is not the outer output of an outer split (device and stream axes must come from outer splits)"
                        )))
                    }
                    IdExpr::Merge { .. } => {
                        return Err(Diagnostic::new(format!(
                            "loop axis {axis} of `{n}` is {pt} but comes from a merge (device and stream axes must come from outer splits)"
                        )))
                    }
                }
            }
        }
        if pt.is_device() {
            let Some(mesh) = f.mesh_of(t) else {
                return Err(Diagnostic::new(format!(
                    "loop axis {axis} of `{n}` is {pt} but `{n}` has no device mesh"
                )));
            };
            let Some(size) = mesh.size_of(pt) else {
                return Err(Diagnostic::new(format!(
                    "loop axis {axis} of `{n}` is {pt} but mesh {mesh} has no such axis"
                )));
            };
            if let Some(v) = f.eval(&d.extent) {
                if v != size as i64 {
                    return Err(Diagnostic::new(format!(
                        "loop axis {axis} of `{n}` is {pt} with extent {v}, but the mesh has {size} devices along {pt}"
                    )));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MeshSpec, Scalar};

    fn base() -> (Fusion, TensorId, TensorId) {
        let mut f = Fusion::new("v");
        f.add_param("t", Some(8)).unwrap();
        let m = f
            .add_mesh("m", MeshSpec::Devices(vec![Scalar::c(2)]))
            .unwrap();
        let a = f
            .add_input(
                "a",
                DType::F32,
                vec![Scalar::named("t"), Scalar::c(4)],
                Some(m),
            )
            .unwrap();
        let b = f.set("b", a).unwrap();
        f.add_output(b).unwrap();
        (f, a, b)
    }

    #[test]
    fn a_well_formed_fusion_verifies() {
        let (f, _, _) = base();
        verify(&f).unwrap();
    }

    /// Splits `a`'s axis 0 by `factor`, makes the outer (`on_outer`) or inner output DIDx,
    /// and returns the verifier's message about the resulting loop domain.
    fn device_split_error(factor: i64, kind: SplitKind, on_outer: bool) -> String {
        let (mut f, a, _) = base();
        let id = f.tensor(a).logical[0];
        let (o, i) = f.split_id(id, Scalar::c(factor), kind);
        f.id_mut(if on_outer { o } else { i }).parallel = ParallelType::DIDx;
        let l1 = f.tensor(a).logical[1];
        f.tensor_mut(a).loop_domain = vec![o, i, l1];
        verify(&f).unwrap_err().message
    }

    #[test]
    fn inner_split_device_axis_is_rejected() {
        assert_eq!(
            device_split_error(2, SplitKind::Inner, false),
            "loop axis 1 of `a` is DIDx but is not the outer output of an outer split (device and stream axes must come from outer splits)"
        );
    }

    #[test]
    fn device_extent_must_match_the_mesh() {
        assert_eq!(
            device_split_error(4, SplitKind::Outer, true),
            "loop axis 0 of `a` is DIDx with extent 4, but the mesh has 2 devices along DIDx"
        );
    }

    #[test]
    fn loop_domain_must_derive_from_logical() {
        let (mut f, a, b) = base();
        let foreign = f.tensor(b).logical[0];
        f.tensor_mut(a).loop_domain[0] = foreign;
        assert_eq!(
            verify(&f).unwrap_err().message,
            "loop axis 0 of `a` is not derived from its logical domain"
        );
    }

    #[test]
    fn an_rfactor_split_of_a_reduction_keeps_its_root_positions() {
        // s = sum(a, [1]) with its root reduction split into [iDIDx{2}rf, r{2}rf]: the
        // reduction axes are read from the root, so the logical split verifies.
        let (mut f, a, _) = base();
        let s = f.sum("s", a, &[1]).unwrap();
        let root = f.tensor(s).logical.clone();
        let (o, i) = f.split_id(root[1], Scalar::c(2), SplitKind::Outer);
        f.id_mut(o).iter_type = IterType::Iteration;
        let tv = f.tensor_mut(s);
        tv.root = Some(root.clone());
        tv.logical = vec![root[0], o, i];
        tv.loop_domain = tv.logical.clone();
        verify(&f).unwrap();
    }

    #[test]
    fn moving_an_expr_before_its_producer_is_caught() {
        let (mut f, _, b) = base();
        let c = f.set("c", b).unwrap();
        let (eb, ec) = (
            f.tensor(b).definition.unwrap(),
            f.tensor(c).definition.unwrap(),
        );
        f.move_expr_before(ec, eb);
        assert_eq!(f.exprs(), [ec, eb]);
        assert_eq!(
            verify(&f).unwrap_err().message,
            "set reads `b` before it is defined"
        );
        f.move_expr_before(eb, ec);
        verify(&f).unwrap();
    }

    #[test]
    fn dtype_mismatch_after_a_rewrite_is_caught() {
        let (mut f, _, b) = base();
        f.tensor_mut(b).dtype = DType::BF16;
        assert_eq!(
            verify(&f).unwrap_err().message,
            "set output `b` is bf16 but its input `a` is f32"
        );
    }
}
