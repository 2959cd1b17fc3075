//! The canonical `.weave` printer (docs/fusion-format.md §Printing): header with current
//! parameter values, meshes, inputs, ops, outputs, then one schedule block per scheduled
//! tensor; the output parses back to a fusion that prints the same.

use crate::expr::{Expr, ExprKind};
use crate::fusion::{Fusion, MeshSpec};
use crate::scalar::Scalar;
use crate::tensor::ScheduleOp;

/// Prints `fusion` in canonical `.weave` form; see [`super::print`].
pub(crate) fn print(f: &Fusion) -> String {
    let mut lines = Vec::new();
    let params: Vec<String> = f
        .params()
        .iter()
        .map(|p| {
            let name = match p.role {
                Some(r) => format!("{}: {}", p.name, r.keyword()),
                None => p.name.clone(),
            };
            match p.value {
                Some(v) => format!("{name} = {v}"),
                None => name,
            }
        })
        .collect();
    lines.push(format!("fusion {}({}) {{", f.name, params.join(", ")));
    for m in f.meshes() {
        let decl = f.mesh(*m);
        lines.push(format!("  mesh {} = {}", decl.name, mesh_spec(&decl.spec)));
    }
    for t in f.inputs() {
        let tv = f.tensor(*t);
        let extents: Vec<String> = tv
            .logical
            .iter()
            .map(|i| scalar_source(&f.id(*i).extent))
            .collect();
        let on = match tv.mesh {
            Some(m) if f.meshes().contains(&m) => format!(" on {}", f.mesh(m).name),
            _ => String::new(),
        };
        let drawn = f
            .draw(*t)
            .map(|d| format!(" drawn {}", d.source()))
            .unwrap_or_default();
        lines.push(format!(
            "  tensor {}: {}[{}]{on}{drawn}",
            tv.name,
            tv.dtype,
            extents.join(", ")
        ));
    }
    for e in f.exprs() {
        let expr = f.expr(*e);
        if let Some(out) = expr.outputs.first() {
            lines.push(format!("  {} = {}", f.tensor(*out).name, op_call(f, expr)));
        }
    }
    if !f.outputs().is_empty() {
        let names: Vec<&str> = f
            .outputs()
            .iter()
            .map(|t| f.tensor(*t).name.as_str())
            .collect();
        lines.push(format!("  output {}", names.join(", ")));
    }
    for t in f.tensors_in_order() {
        let tv = f.tensor(t);
        if tv.schedule.is_empty() {
            continue;
        }
        let steps: Vec<String> = tv.schedule.iter().map(|s| step(f, &s.op)).collect();
        lines.push(format!("  schedule {} {{ {} }}", tv.name, steps.join("; ")));
    }
    lines.push("}".to_string());
    let mut out = lines.join("\n");
    out.push('\n');
    out
}

fn mesh_spec(spec: &MeshSpec) -> String {
    match spec {
        MeshSpec::Devices(dims) => {
            let d: Vec<String> = dims.iter().map(scalar_source).collect();
            format!("devices({})", d.join(", "))
        }
        MeshSpec::Explicit { shape, devices } => nested_list(shape, devices),
    }
}

/// `[0, 1]` for one axis, `[[0, 1], [2, 3]]` for two, and so on.
fn nested_list(shape: &[usize], devices: &[i64]) -> String {
    match shape {
        [] | [_] => int_list(devices),
        [rows, rest @ ..] => {
            let chunk = devices.len().checked_div(*rows).unwrap_or(0).max(1);
            let parts: Vec<String> = devices
                .chunks(chunk)
                .map(|c| nested_list(rest, c))
                .collect();
            format!("[{}]", parts.join(", "))
        }
    }
}

fn int_list<T: ToString>(v: &[T]) -> String {
    let items: Vec<String> = v.iter().map(|x| x.to_string()).collect();
    format!("[{}]", items.join(", "))
}

fn op_call(f: &Fusion, expr: &Expr) -> String {
    let mut args: Vec<String> = expr
        .inputs
        .iter()
        .map(|t| f.tensor(*t).name.clone())
        .collect();
    match &expr.kind {
        ExprKind::Cast(d) => args.push(d.name().to_string()),
        ExprKind::Reduction { axes, .. }
        | ExprKind::Broadcast { axes }
        | ExprKind::Squeeze { axes } => args.push(int_list(axes)),
        ExprKind::Permute { perm } => args.push(int_list(perm)),
        ExprKind::Iota { axis } | ExprKind::Concat { axis } => args.push(axis.to_string()),
        ExprKind::Slice { axis, start, stop } => {
            args.push(axis.to_string());
            args.push(scalar_source(start));
            args.push(scalar_source(stop));
        }
        ExprKind::IndexSelect { axis, base } => {
            args.push(axis.to_string());
            args.extend(base.as_ref().map(scalar_source));
        }
        ExprKind::Reshape { shape } => {
            let s: Vec<String> = shape.iter().map(scalar_source).collect();
            args.push(format!("[{}]", s.join(", ")));
        }
        ExprKind::BinaryLit { lit, lit_first, .. } => {
            let at = if *lit_first { 0 } else { args.len() };
            args.insert(at, lit.to_source());
        }
        ExprKind::WhereLit { a, b } => {
            if let Some(a) = a {
                args.insert(1.min(args.len()), a.to_source());
            }
            if let Some(b) = b {
                args.push(b.to_source());
            }
        }
        ExprKind::Set
        | ExprKind::SegmentSet
        | ExprKind::Unary(_)
        | ExprKind::Binary(_)
        | ExprKind::Where
        | ExprKind::Matmul
        | ExprKind::Linear => {}
    }
    format!("{}({})", expr.kind.op_name(), args.join(", "))
}

fn step(f: &Fusion, op: &ScheduleOp) -> String {
    op.source_with(scalar_source, |m| {
        if f.meshes().contains(&m) {
            f.mesh(m).name.clone()
        } else {
            // A mesh id from another fusion: nothing in this one to name.
            "<undeclared>".to_string()
        }
    })
}

/// [`Scalar::to_source`], except that a negative constant (which the grammar cannot spell
/// directly) prints as `(0 - 5)`, which parses back to the same constant.
pub(crate) fn scalar_source(s: &Scalar) -> String {
    s.to_source_with(&|v| {
        if v == i64::MIN {
            "(0 - 9223372036854775807 - 1)".to_string()
        } else if v < 0 {
            format!("(0 - {})", v.unsigned_abs())
        } else {
            v.to_string()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> Scalar {
        Scalar::named(s)
    }

    #[test]
    fn matches_to_source_without_negative_constants() {
        let cases = [
            n("t").add(1).mul(n("h")),
            n("a").sub(n("b").sub(n("c"))),
            n("t").ceil_div(n("s")),
            n("h").mul(4),
            n("a").div(n("b").mul(n("c"))).rem(n("d")),
            n("a").add(n("b")).ceil_div(n("c").sub(1)),
        ];
        for c in cases {
            assert_eq!(scalar_source(&c), c.to_source());
        }
    }

    #[test]
    fn negative_constants_are_spelled_with_zero_minus() {
        assert_eq!(scalar_source(&Scalar::c(-5)), "(0 - 5)");
        assert_eq!(scalar_source(&n("t").add(Scalar::c(-5))), "t + (0 - 5)");
        assert_eq!(
            scalar_source(&Scalar::c(i64::MIN)),
            "(0 - 9223372036854775807 - 1)"
        );
    }

    #[test]
    fn nested_device_lists() {
        assert_eq!(nested_list(&[3], &[0, 1, 2]), "[0, 1, 2]");
        assert_eq!(nested_list(&[2, 2], &[0, 1, 2, 3]), "[[0, 1], [2, 3]]");
    }
}
