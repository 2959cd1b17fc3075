//! The seed-style printer: `T3_g_bf16[istreamIdx7{3}, ideviceIdx.x8{2}, iS9{( ceilDiv(t, 3) )}] (DeviceMesh{0 1})`.
//!
//! Names (`T0`, `iS1`) are assigned by the printer in traversal order — tensors in program
//! order, and for each tensor its root, logical, transform outputs, then loop and
//! allocation axes — never from arena keys, so a pass that frees or adds a node elsewhere does
//! not renumber unrelated lines of a snapshot.

use std::collections::HashSet;
use std::fmt::Write as _;

use slotmap::SecondaryMap;

use crate::domain::{IdExpr, SplitKind};
use crate::expr::ExprKind;
use crate::fusion::Fusion;
use crate::ids::{IdExprId, IterDomainId, TensorId};

/// Assigns printer names to tensors and iter domains.
#[derive(Debug, Default)]
pub struct Namer {
    tensors: SecondaryMap<TensorId, usize>,
    ids: SecondaryMap<IterDomainId, usize>,
}

impl Namer {
    /// Names every tensor of `fusion` (program order) and all of their axes.
    pub fn for_fusion(fusion: &Fusion) -> Namer {
        let mut n = Namer::default();
        for t in fusion.tensors_in_order() {
            n.name_tensor(fusion, t);
        }
        n
    }

    /// Names `t` and its axes if not yet named.
    pub fn name_tensor(&mut self, fusion: &Fusion, t: TensorId) {
        if !self.tensors.contains_key(t) {
            let k = self.tensors.len();
            self.tensors.insert(t, k);
        }
        let tv = fusion.tensor(t);
        let mut ordered: Vec<IterDomainId> = Vec::new();
        ordered.extend(tv.root_domain());
        ordered.extend(&tv.logical);
        for e in transform_order(fusion, t) {
            ordered.extend(fusion.id_expr(e).outputs());
        }
        ordered.extend(&tv.loop_domain);
        ordered.extend(tv.allocation_domain());
        for id in ordered {
            self.name_id(id);
        }
    }

    fn name_id(&mut self, id: IterDomainId) -> usize {
        if let Some(&n) = self.ids.get(id) {
            return n;
        }
        let k = self.ids.len();
        self.ids.insert(id, k);
        k
    }

    /// `T{n}` number of a tensor (naming it on first sight).
    pub fn tensor_number(&mut self, t: TensorId) -> usize {
        if let Some(&n) = self.tensors.get(t) {
            return n;
        }
        let k = self.tensors.len();
        self.tensors.insert(t, k);
        k
    }

    /// `iS{n}` style name of an axis: `{i|r|b}{S|deviceIdx.x|streamIdx}{n}{extent}[rf]`.
    pub fn id(&mut self, fusion: &Fusion, id: IterDomainId) -> String {
        let n = self.name_id(id);
        let d = fusion.id(id);
        format!(
            "{}{}{}{{{}}}{}",
            d.iter_type.prefix(),
            d.parallel.print_name(),
            n,
            d.extent,
            if d.rfactor { "rf" } else { "" }
        )
    }

    /// `(a, b, c)` list of axes.
    pub fn ids(&mut self, fusion: &Fusion, ids: &[IterDomainId]) -> String {
        let v: Vec<String> = ids.iter().map(|i| self.id(fusion, *i)).collect();
        v.join(", ")
    }

    /// `T2_g_bf16[<loop axes>] (DeviceMesh{0 1})`.
    pub fn tensor(&mut self, fusion: &Fusion, t: TensorId) -> String {
        let n = self.tensor_number(t);
        let tv = fusion.tensor(t);
        let mut s = format!(
            "T{n}_{}_{}[{}]",
            tv.memory.short(),
            tv.dtype,
            self.ids(fusion, &tv.loop_domain)
        );
        if let Some(mesh) = fusion.mesh_of(t) {
            let _ = write!(s, " ({mesh})");
        }
        s
    }
}

/// The split/merge transforms reachable backward from `t`'s logical, loop and allocation
/// axes, ordered so that every transform comes after those producing its inputs, and stopping
/// at `t`'s root (or logical, when there is no root).
pub fn transform_order(fusion: &Fusion, t: TensorId) -> Vec<IdExprId> {
    let tv = fusion.tensor(t);
    let stop: HashSet<IterDomainId> = tv.root_domain().iter().copied().collect();
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    fn visit(
        f: &Fusion,
        id: IterDomainId,
        stop: &HashSet<IterDomainId>,
        seen: &mut HashSet<IdExprId>,
        out: &mut Vec<IdExprId>,
    ) {
        if stop.contains(&id) {
            return;
        }
        if let Some(e) = f.id(id).definition {
            if seen.insert(e) {
                for i in f.id_expr(e).inputs() {
                    visit(f, i, stop, seen, out);
                }
                out.push(e);
            }
        }
    }
    let starts: Vec<IterDomainId> = tv
        .logical
        .iter()
        .chain(&tv.loop_domain)
        .chain(tv.allocation_domain())
        .copied()
        .collect();
    for id in starts {
        visit(fusion, id, &stop, &mut seen, &mut out);
    }
    out
}

fn expr_attrs(kind: &ExprKind) -> Option<String> {
    let list = |v: &[usize]| {
        v.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match kind {
        ExprKind::Cast(d) => Some(format!("dtype={d}")),
        ExprKind::BinaryLit { lit, lit_first, .. } => Some(format!(
            "literal={}{}",
            lit.to_source(),
            if *lit_first { ", first" } else { "" }
        )),
        ExprKind::WhereLit { a, b } => Some(format!(
            "a={}, b={}",
            a.map_or("tensor".to_string(), |l| l.to_source()),
            b.map_or("tensor".to_string(), |l| l.to_source())
        )),
        ExprKind::Reduction { axes, .. } => Some(format!("axes={{{}}}", list(axes))),
        ExprKind::Broadcast { axes } => Some(format!("new_axes={{{}}}", list(axes))),
        ExprKind::Squeeze { axes } => Some(format!("axes={{{}}}", list(axes))),
        ExprKind::Permute { perm } => Some(format!("perm={{{}}}", list(perm))),
        ExprKind::Iota { axis } | ExprKind::Concat { axis } => Some(format!("axis={axis}")),
        ExprKind::Slice { axis, start, stop } => {
            Some(format!("axis={axis}, start={start}, stop={stop}"))
        }
        ExprKind::IndexSelect { axis, base: None } => Some(format!("axis={axis}")),
        ExprKind::IndexSelect {
            axis,
            base: Some(b),
        } => Some(format!("axis={axis}, base={b}")),
        ExprKind::Reshape { shape } => {
            let v: Vec<String> = shape.iter().map(|s| s.to_string()).collect();
            Some(format!("shape={{{}}}", v.join(", ")))
        }
        _ => None,
    }
}

/// Prints the whole fusion: header, inputs, outputs, the ops (`%kernel_math`) and every
/// tensor's domains and transforms (`%transforms`).
pub fn fusion_to_string(fusion: &Fusion) -> String {
    let mut n = Namer::for_fusion(fusion);
    let mut s = String::new();
    let params: Vec<String> = fusion
        .params()
        .iter()
        .map(|p| match p.value {
            Some(v) => format!("{} = {v}", p.name),
            None => p.name.clone(),
        })
        .collect();
    let _ = writeln!(s, "Fusion {}({})", fusion.name, params.join(", "));
    s.push_str("Inputs:\n");
    for t in fusion.inputs() {
        let _ = writeln!(s, "  {}", n.tensor(fusion, *t));
    }
    s.push_str("Outputs:\n");
    for t in fusion.outputs() {
        let _ = writeln!(s, "  {}", n.tensor(fusion, *t));
    }
    s.push_str("\n%kernel_math {\n");
    for e in fusion.exprs() {
        s.push_str(&expr_to_string(fusion, &mut n, *e));
    }
    s.push_str("} // %kernel_math\n\n%transforms {\n");
    for t in fusion.tensors_in_order() {
        s.push_str(&domains_to_string(fusion, &mut n, t));
    }
    s.push_str("} // %transforms\n");
    s
}

/// One op in the seed style:
/// ```text
/// T2_g_bf16[...]
///    = linear(T0_g_bf16[...],
///             T1_g_bf16[...])
/// ```
pub fn expr_to_string(fusion: &Fusion, n: &mut Namer, e: crate::ids::ExprId) -> String {
    let expr = fusion.expr(e);
    let outs: Vec<String> = expr.outputs.iter().map(|t| n.tensor(fusion, *t)).collect();
    let name = expr.kind.op_name();
    let indent = " ".repeat(name.len() + 6);
    let mut args: Vec<String> = expr.inputs.iter().map(|t| n.tensor(fusion, *t)).collect();
    args.extend(expr_attrs(&expr.kind));
    format!(
        "{}\n   = {name}({})\n",
        outs.join(", "),
        args.join(&format!(",\n{indent}"))
    )
}

/// A tensor's domains: logical (and root), each transform, loop and allocation.
pub fn domains_to_string(fusion: &Fusion, n: &mut Namer, t: TensorId) -> String {
    let tv = fusion.tensor(t);
    let mut s = format!("{}\n", n.tensor(fusion, t));
    if let Some(root) = &tv.root {
        let _ = writeln!(s, " root domain : ({})", n.ids(fusion, root));
    }
    let _ = writeln!(s, " logical domain : ({})", n.ids(fusion, &tv.logical));
    for e in transform_order(fusion, t) {
        match fusion.id_expr(e).clone() {
            IdExpr::Split {
                input,
                outer,
                inner,
                factor,
                kind,
            } => {
                let k = match kind {
                    SplitKind::Outer => "Outer",
                    SplitKind::Inner => "Inner",
                };
                let _ = writeln!(
                    s,
                    "  {k} split: {} by factor {factor} -> {}, {}",
                    n.id(fusion, input),
                    n.id(fusion, outer),
                    n.id(fusion, inner)
                );
            }
            IdExpr::Merge {
                outer,
                inner,
                output,
            } => {
                let _ = writeln!(
                    s,
                    "  Merge: {} and {} -> {}",
                    n.id(fusion, outer),
                    n.id(fusion, inner),
                    n.id(fusion, output)
                );
            }
        }
    }
    let _ = writeln!(s, " loop domain : ({})", n.ids(fusion, &tv.loop_domain));
    for id in &tv.loop_domain {
        if let Some(pt) = fusion.id(*id).swizzle {
            let _ = writeln!(
                s,
                "  Swizzle1D: {} by {}",
                n.id(fusion, *id),
                pt.print_name()
            );
        }
    }
    if let Some(a) = &tv.allocation {
        let _ = writeln!(s, " allocation domain : ({})", n.ids(fusion, a));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, ParallelType, Scalar};

    #[test]
    fn prints_split_axes_like_the_seeds() {
        let mut f = Fusion::new("t");
        f.add_param("t", Some(12)).unwrap();
        let a = f
            .add_input(
                "a",
                DType::BF16,
                vec![Scalar::named("t"), Scalar::c(4)],
                None,
            )
            .unwrap();
        let id0 = f.tensor(a).logical[0];
        let (o, i) = f.split_id(id0, Scalar::c(3), SplitKind::Outer);
        f.id_mut(o).parallel = ParallelType::Stream;
        let l1 = f.tensor(a).logical[1];
        f.tensor_mut(a).loop_domain = vec![o, i, l1];
        let mut n = Namer::for_fusion(&f);
        assert_eq!(
            n.tensor(&f, a),
            "T0_g_bf16[istreamIdx2{3}, iS3{( ceilDiv(t, 3) )}, iS1{4}]"
        );
    }
}
