//! Resharding analysis: do a producer and a consumer place the same elements on the same
//! device (or stream chunk)? (reference/nvfuser-host-ir.md §2.6, nvFuser's
//! `haveDifferentShardings` / `isResharding`.)
//!
//! Contract: an analysis, not a pass. It reads a [`Fusion`] in any pre-segmentation phase and
//! changes nothing.
//!
//! # The symbolic proof
//!
//! [`have_different_shardings`] gives every producer logical axis a fresh index variable
//! `x_k` with `0 ≤ x_k < extent`, and gives each consumer root axis the variable of the
//! producer axis that [`weave_transform::logical_map::pairwise_map`] maps to it (a fresh one
//! when unmapped; broadcasts are never mapped to real axes). Indices flow forward through the
//! recorded transforms down to the compared domain (loop or allocation):
//!
//! * `Split`: `outer = idx / inner_extent`, `inner = idx % inner_extent`;
//! * `Merge`: `out = outer * inner_extent + inner`.
//!
//! For each requested parallel type, the producer and the consumer axis carrying it are
//! looked up (reduction axes are ignored: an `rDIDx` axis is *replicated*, so `iDIDx → rDIDx`
//! counts as resharding), keeping only axes that derive from at least one mapped axis. If
//! neither side has one, the type is unchanged; if exactly one side has one, it changed;
//! otherwise the two index expressions are simplified under the bounds above and compared.
//! **Anything the simplifier cannot prove equal is different.** The simplifier knows
//! `x / 1 = x`, `x % 1 = 0`, `x / e = 0` and `x % e = x` when `x < e`, `(x / a) / b =
//! x / (a * b)`, `(o * e + i) / e = o` and `(o * e + i) % e = i` when `i < e`, and
//! `(x / e) * e + x % e = x`. Extents are evaluated with the fusion's parameter values when
//! they have them, so the proof holds for the sizes the fusion is compiled for.
//!
//! A variable whose bound is 1 is 0, and `o * 1 + 0 = o`.
//!
//! Before the proof, as in nvFuser: without any mesh and without `Stream` among the requested
//! types nothing is sharded (`false`); different meshes with a device type requested are
//! always resharding (`true`).

use std::collections::HashSet;

use weave_host_ir::ids::SecondaryMap;
use weave_ir::{ExprId, Fusion, IdExpr, IterDomainId, IterType, ParallelType, Scalar, TensorId};
use weave_transform::logical_map::pairwise_map;
use weave_transform::DomainKind;

/// The device parallel types, the ones [`is_resharding`] compares.
pub const DEVICE_TYPES: [ParallelType; 2] = [ParallelType::DIDx, ParallelType::DIDy];

/// The device types and `Stream`: everything sharding propagation moves around.
pub const DEVICE_AND_STREAM_TYPES: [ParallelType; 3] =
    [ParallelType::DIDx, ParallelType::DIDy, ParallelType::Stream];

/// The ids of `t`'s `dom` domain (allocation defaults to logical).
pub fn domain_ids(f: &Fusion, t: TensorId, dom: DomainKind) -> Vec<IterDomainId> {
    let tv = f.tensor(t);
    match dom {
        DomainKind::Loop => tv.loop_domain.clone(),
        DomainKind::Allocation => tv.allocation_domain().to_vec(),
    }
}

/// The non-reduction axis of `ids` parallelized with `pt`, if any.
pub fn parallel_axis(f: &Fusion, ids: &[IterDomainId], pt: ParallelType) -> Option<IterDomainId> {
    ids.iter().copied().find(|i| {
        let d = f.id(*i);
        d.parallel == pt && d.iter_type != IterType::Reduction
    })
}

/// True if `producer` (its `p_dom` domain) and `consumer` (its `c_dom` domain) shard the
/// elements they share differently along any of `types` (see the module doc for the proof).
///
/// `producer` must be an operand of `consumer`'s definition, or `consumer` itself (then every
/// logical axis maps to itself). For two unrelated tensors nothing is mapped, and the answer
/// is `true` as soon as either side has one of `types`.
pub fn have_different_shardings(
    f: &Fusion,
    producer: TensorId,
    p_dom: DomainKind,
    consumer: TensorId,
    c_dom: DomainKind,
    types: &[ParallelType],
) -> bool {
    let (pm, cm) = (f.mesh_of(producer), f.mesh_of(consumer));
    let wants_stream = types.contains(&ParallelType::Stream);
    let wants_device = types.iter().any(|t| t.is_device());
    if pm.is_none() && cm.is_none() && !wants_stream {
        return false;
    }
    if pm != cm && wants_device {
        return true;
    }

    let unrelated = producer != consumer && related_expr(f, producer, consumer).is_none();
    let (mut ctx, p_mapped, c_mapped) = seeded(f, producer, consumer);

    let p_ids = domain_ids(f, producer, p_dom);
    let c_ids = domain_ids(f, consumer, c_dom);
    for &pt in types {
        if pt == ParallelType::Serial {
            continue;
        }
        let pick = |ids: &[IterDomainId], mapped: &HashSet<IterDomainId>| {
            parallel_axis(f, ids, pt)
                .filter(|id| unrelated || sources(f, *id).iter().any(|s| mapped.contains(s)))
        };
        let p_id = pick(&p_ids, &p_mapped);
        let c_id = pick(&c_ids, &c_mapped);
        match (p_id, c_id) {
            (None, None) => continue,
            (Some(_), None) | (None, Some(_)) => return true,
            (Some(p), Some(c)) => {
                if unrelated {
                    return true;
                }
                let pi = ctx.index(p);
                let ci = ctx.index(c);
                if !ctx.provably_equal(&pi, &ci) {
                    return true;
                }
            }
        }
    }
    false
}

/// True if axis `p_axis` of `producer` and axis `c_axis` of `consumer` provably have the same
/// index (the proof of [`have_different_shardings`], for two given axes of any parallel
/// type). `producer` must be an operand of `consumer`'s definition, or `consumer` itself.
pub fn same_index(
    f: &Fusion,
    producer: TensorId,
    p_axis: IterDomainId,
    consumer: TensorId,
    c_axis: IterDomainId,
) -> bool {
    if producer != consumer && related_expr(f, producer, consumer).is_none() {
        return false;
    }
    let (mut ctx, _, _) = seeded(f, producer, consumer);
    let (pi, ci) = (ctx.index(p_axis), ctx.index(c_axis));
    ctx.provably_equal(&pi, &ci)
}

/// True if `expr` changes the device sharding of any (input, output) pair (loop domains,
/// [`DEVICE_TYPES`]). A change of the `Stream` parallelization alone is not resharding; ask
/// [`is_stream_resharding`] for that.
pub fn is_resharding(f: &Fusion, expr: ExprId) -> bool {
    expr_differs(f, expr, &DEVICE_TYPES)
}

/// True if `expr` changes the `Stream` parallelization of any (input, output) pair (loop
/// domains): its input and output cannot share one stream loop.
pub fn is_stream_resharding(f: &Fusion, expr: ExprId) -> bool {
    expr_differs(f, expr, &[ParallelType::Stream])
}

fn expr_differs(f: &Fusion, expr: ExprId, types: &[ParallelType]) -> bool {
    let e = f.expr(expr);
    let mut inputs: Vec<TensorId> = e.inputs.clone();
    let mut seen = HashSet::new();
    inputs.retain(|x| seen.insert(*x));
    e.outputs.iter().any(|o| {
        inputs
            .iter()
            .any(|i| have_different_shardings(f, *i, DomainKind::Loop, *o, DomainKind::Loop, types))
    })
}

/// An index context where every producer logical axis is a variable (even one a reshape
/// defined) and each mapped consumer root axis shares its producer axis' variable, with the
/// mapped axes of each side. Unmapped consumer root axes get their own variables lazily (an
/// id with no definition that is not seeded is a fresh variable). Nothing is mapped between
/// unrelated tensors.
fn seeded(
    f: &Fusion,
    producer: TensorId,
    consumer: TensorId,
) -> (IndexCtx<'_>, HashSet<IterDomainId>, HashSet<IterDomainId>) {
    // Which producer logical axis indexes the same elements as which consumer root axis.
    let pairs: Vec<(IterDomainId, IterDomainId)> = if producer == consumer {
        f.tensor(producer)
            .logical
            .iter()
            .map(|i| (*i, *i))
            .collect()
    } else {
        related_expr(f, producer, consumer)
            .map(|e| pairwise_map(f, e, producer))
            .unwrap_or_default()
    };
    let mut ctx = IndexCtx::new(f);
    for p in &f.tensor(producer).logical {
        ctx.fresh_var(*p);
    }
    let (mut p_mapped, mut c_mapped) = (HashSet::new(), HashSet::new());
    for (p, c) in pairs {
        let v = ctx.fresh_var(p);
        ctx.seed(c, v);
        p_mapped.insert(p);
        c_mapped.insert(c);
    }
    (ctx, p_mapped, c_mapped)
}

/// The definition of `consumer` when it reads `producer`.
fn related_expr(f: &Fusion, producer: TensorId, consumer: TensorId) -> Option<ExprId> {
    let e = f.tensor(consumer).definition?;
    f.expr(e).inputs.contains(&producer).then_some(e)
}

/// `id` and every id it derives from through splits and merges.
fn sources(f: &Fusion, id: IterDomainId) -> Vec<IterDomainId> {
    let mut out = vec![id];
    let mut stack = vec![id];
    let mut seen = HashSet::new();
    while let Some(x) = stack.pop() {
        if !seen.insert(x) {
            continue;
        }
        out.push(x);
        if let Some(e) = f.id(x).definition {
            stack.extend(f.id_expr(e).inputs());
        }
    }
    out
}

/// A symbolic index: variables (one per source axis), floor division, remainder and the
/// merge combination `outer * extent + inner`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Idx {
    /// The constant 0.
    Zero,
    /// Index variable `k`, `0 ≤ x_k < extent_k`.
    Var(usize),
    /// `x / e`.
    Div(Box<Idx>, Scalar),
    /// `x % e`.
    Mod(Box<Idx>, Scalar),
    /// `outer * e + inner`.
    Lin(Box<Idx>, Scalar, Box<Idx>),
}

/// Index variables and memoized indices of one comparison.
struct IndexCtx<'a> {
    f: &'a Fusion,
    vars: SecondaryMap<IterDomainId, Idx>,
    /// Exclusive upper bound of each variable.
    bounds: Vec<Scalar>,
}

impl<'a> IndexCtx<'a> {
    fn new(f: &'a Fusion) -> IndexCtx<'a> {
        IndexCtx {
            f,
            vars: SecondaryMap::new(),
            bounds: Vec::new(),
        }
    }

    /// The extent of `id`, evaluated when the parameters allow.
    fn extent(&self, id: IterDomainId) -> Scalar {
        concrete(self.f, &self.f.id(id).extent)
    }

    /// A fresh variable for `id` (bounded by its extent), recorded as its index.
    fn fresh_var(&mut self, id: IterDomainId) -> Idx {
        if let Some(v) = self.vars.get(id) {
            return v.clone();
        }
        let v = Idx::Var(self.bounds.len());
        self.bounds.push(self.extent(id));
        self.vars.insert(id, v.clone());
        v
    }

    fn seed(&mut self, id: IterDomainId, v: Idx) {
        if !self.vars.contains_key(id) {
            self.vars.insert(id, v);
        }
    }

    /// The index of `id`, computed through its definition from its inputs' indices.
    fn index(&mut self, id: IterDomainId) -> Idx {
        if let Some(v) = self.vars.get(id) {
            return v.clone();
        }
        let Some(e) = self.f.id(id).definition else {
            return self.fresh_var(id);
        };
        let idx = match self.f.id_expr(e).clone() {
            IdExpr::Split {
                input,
                outer,
                inner,
                ..
            } => {
                let x = self.index(input);
                let ie = self.extent(inner);
                let (o, i) = (
                    simplify(Idx::Div(Box::new(x.clone()), ie.clone()), &self.bounds),
                    simplify(Idx::Mod(Box::new(x), ie), &self.bounds),
                );
                self.vars.insert(outer, o.clone());
                self.vars.insert(inner, i.clone());
                if id == outer {
                    o
                } else {
                    i
                }
            }
            IdExpr::Merge { outer, inner, .. } => {
                let (o, i) = (self.index(outer), self.index(inner));
                let ie = self.extent(inner);
                simplify(Idx::Lin(Box::new(o), ie, Box::new(i)), &self.bounds)
            }
        };
        self.vars.insert(id, idx.clone());
        idx
    }

    fn provably_equal(&self, a: &Idx, b: &Idx) -> bool {
        simplify(a.clone(), &self.bounds) == simplify(b.clone(), &self.bounds)
    }
}

/// `s` as a constant when it evaluates with the fusion's parameters.
fn concrete(f: &Fusion, s: &Scalar) -> Scalar {
    f.eval(s).map(Scalar::c).unwrap_or_else(|| s.clone())
}

/// `a ≤ b` when provable: structurally equal, or both constants.
fn le(a: &Scalar, b: &Scalar) -> bool {
    if a == b {
        return true;
    }
    matches!((a.as_const(), b.as_const()), (Some(x), Some(y)) if x <= y)
}

/// An exclusive upper bound of `x`, given the bounds of the variables.
fn bound(x: &Idx, bounds: &[Scalar]) -> Scalar {
    match x {
        Idx::Zero => Scalar::c(1),
        Idx::Var(k) => bounds[*k].clone(),
        Idx::Div(a, e) => bound(a, bounds).ceil_div(e.clone()),
        Idx::Mod(a, e) => {
            let b = bound(a, bounds);
            if le(&b, e) {
                b
            } else {
                e.clone()
            }
        }
        Idx::Lin(o, e, _) => bound(o, bounds).mul(e.clone()),
    }
}

/// Simplifies bottom-up with the rules of the module doc.
pub(crate) fn simplify(x: Idx, bounds: &[Scalar]) -> Idx {
    let one = Scalar::c(1);
    match x {
        // A variable below 1 is 0 (an extent-1 axis, e.g. from splitting an axis by its
        // full extent).
        Idx::Var(k) if bounds.get(k) == Some(&one) => Idx::Zero,
        Idx::Zero | Idx::Var(_) => x,
        Idx::Div(a, e) => {
            let a = simplify(*a, bounds);
            if e == one {
                return a;
            }
            if a == Idx::Zero || le(&bound(&a, bounds), &e) {
                return Idx::Zero;
            }
            match a {
                Idx::Div(inner, e1) => simplify(Idx::Div(inner, e1.mul(e)), bounds),
                Idx::Lin(o, e1, i) if e1 == e && le(&bound(&i, bounds), &e) => *o,
                // `(o·e1 + i) / (e1·q)` with `i < e1` is `o / q`: a merge split again by a
                // multiple of its inner extent (heads merged back into a hidden axis whose
                // device split cuts whole heads).
                Idx::Lin(o, e1, i)
                    if le(&bound(&i, bounds), &e1)
                        && matches!(
                            (e1.as_const(), e.as_const()),
                            (Some(c1), Some(c)) if c1 > 0 && c % c1 == 0
                        ) =>
                {
                    let q = e.as_const().unwrap_or(1) / e1.as_const().unwrap_or(1);
                    simplify(Idx::Div(o, Scalar::c(q)), bounds)
                }
                a => Idx::Div(Box::new(a), e),
            }
        }
        Idx::Mod(a, e) => {
            let a = simplify(*a, bounds);
            if e == one || a == Idx::Zero {
                return Idx::Zero;
            }
            if le(&bound(&a, bounds), &e) {
                return a;
            }
            match a {
                Idx::Lin(_, e1, i) if e1 == e && le(&bound(&i, bounds), &e) => *i,
                Idx::Mod(inner, e1) if e1 == e => Idx::Mod(inner, e1),
                a => Idx::Mod(Box::new(a), e),
            }
        }
        Idx::Lin(o, e, i) => {
            let (o, i) = (simplify(*o, bounds), simplify(*i, bounds));
            if o == Idx::Zero {
                return i;
            }
            if e == one && i == Idx::Zero {
                return o;
            }
            if let (Idx::Div(x1, e1), Idx::Mod(x2, e2)) = (&o, &i) {
                if x1 == x2 && *e1 == e && *e2 == e {
                    return (**x1).clone();
                }
            }
            Idx::Lin(Box::new(o), e, Box::new(i))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(v: i64) -> Scalar {
        Scalar::c(v)
    }

    fn var(k: usize) -> Box<Idx> {
        Box::new(Idx::Var(k))
    }

    #[test]
    fn split_then_merge_is_the_identity() {
        let b = vec![c(12)];
        let x = Idx::Lin(
            Box::new(Idx::Div(var(0), c(4))),
            c(4),
            Box::new(Idx::Mod(var(0), c(4))),
        );
        assert_eq!(simplify(x, &b), Idx::Var(0));
    }

    #[test]
    fn merge_then_split_recovers_the_parts() {
        let b = vec![c(3), c(4)];
        let m = Idx::Lin(var(0), c(4), var(1));
        assert_eq!(
            simplify(Idx::Div(Box::new(m.clone()), c(4)), &b),
            Idx::Var(0)
        );
        assert_eq!(simplify(Idx::Mod(Box::new(m), c(4)), &b), Idx::Var(1));
    }

    #[test]
    fn a_merge_split_by_a_multiple_of_its_inner_extent_divides_the_outer_part() {
        // heads (8) x head_dim (3) merged, the hidden axis cut into 4 device blocks of 6:
        // block = head / 2, the heads' own split by 4 devices.
        let b = vec![c(8), c(3)];
        let m = Idx::Lin(var(0), c(3), var(1));
        assert_eq!(
            simplify(Idx::Div(Box::new(m.clone()), c(6)), &b),
            Idx::Div(var(0), c(2))
        );
        // Not a multiple of the inner extent: nothing to prove.
        assert_eq!(
            simplify(Idx::Div(Box::new(m.clone()), c(4)), &b),
            Idx::Div(Box::new(m), c(4))
        );
    }

    #[test]
    fn nested_divisions_fold_and_small_values_vanish() {
        let b = vec![c(24)];
        let x = Idx::Div(Box::new(Idx::Div(var(0), c(3))), c(2));
        assert_eq!(simplify(x, &b), Idx::Div(var(0), c(6)));
        assert_eq!(simplify(Idx::Div(var(0), c(24)), &b), Idx::Zero);
        assert_eq!(simplify(Idx::Mod(var(0), c(30)), &b), Idx::Var(0));
        // Unprovable stays distinct.
        assert_ne!(
            simplify(Idx::Div(var(0), c(6)), &b),
            simplify(Idx::Div(var(0), c(4)), &b)
        );
    }
}
