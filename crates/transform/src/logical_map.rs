//! The producer → consumer logical domain map of one expr (nvFuser's
//! `PairwiseLogicalDomainMap`): which logical axis of an operand indexes the same elements as
//! which root (or logical, when there is no root) axis of the expr's output.
//!
//! Rules, by op (axis numbers count the producer's materialized axes, reductions excluded):
//!
//! * pointwise (`set`, `cast`, unary, binary, `where`): axis `i` ↔ axis `i`;
//! * reductions: axis `i` ↔ output axis `i`, reduced axes included (they become `r` axes);
//! * `broadcast`: producer axes ↔ the output axes that were not inserted, in order;
//! * `squeeze`: the removed producer axes map to nothing;
//! * `permute`: output axis `i` ↔ producer axis `perm[i]`;
//! * `reshape`: axis `i` ↔ output **root** axis `i`;
//! * `iota`, `slice`, `concat` (each operand): axis `i` ↔ axis `i`, the indexed, sliced or
//!   joined axis too, so that shardings pass through; that axis must stay whole where the
//!   op runs (load refuses a schedule that splits it, a kernel a chunk of it);
//! * `matmul`: A `[.., m, k]` → out `[.., m, n, rk]`: batch ↔ batch, `m` ↔ `m`, `k` ↔ `rk`;
//!   B `[.., k, n]`: batch ↔ batch, `k` ↔ `rk`, `n` ↔ `n`. Batch axes align at the right
//!   (numpy broadcasting): an operand with fewer batch axes maps its batch axis `i` to output
//!   batch axis `i + (output batch count − operand batch count)`, and a broadcast batch axis
//!   maps to nothing where the other operand stretches it;
//! * `linear`: x `[.., k]` → out `[.., n, rk]`: leading ↔ leading, `k` ↔ `rk`; w `[n, k]`:
//!   `n` ↔ `n`, `k` ↔ `rk`; bias `[n]`: `n` ↔ `n`.
//! * `index_select(table, ids, a)`: table `[.., v, ..]` → out `[.., n, .., rv]`: the other
//!   table axes ↔ the same positions, `v` (axis `a`) ↔ the trailing `rv`; ids `[n]`: `n` ↔
//!   output axis `a`.
//!
//! A broadcast producer axis is never mapped to a non-broadcast consumer axis: the consumer
//! axis has a real extent the broadcast does not index.

use weave_ir::{ExprId, ExprKind, Fusion, IterDomainId, IterType, TensorId};

/// Pairs `(producer logical axis, consumer root-or-logical axis)` of `expr` for operand
/// `producer`, in producer axis order. An operand read twice (`add(a, a)`) contributes the
/// union of both positions' pairs. Empty when `producer` is not an operand of `expr`.
pub fn pairwise_map(
    f: &Fusion,
    expr: ExprId,
    producer: TensorId,
) -> Vec<(IterDomainId, IterDomainId)> {
    let e = f.expr(expr);
    let Some(&consumer) = e.outputs.first() else {
        return Vec::new();
    };
    let cdom = f.tensor(consumer).root_domain();
    let pvis = f.visible_axes(producer);
    let mut out: Vec<(IterDomainId, IterDomainId)> = Vec::new();
    // Sets and positions by hashing: a tensor of many axes maps in linear time.
    let mut seen: std::collections::HashSet<(IterDomainId, IterDomainId)> =
        std::collections::HashSet::new();
    for (pos, _) in e.inputs.iter().enumerate().filter(|(_, t)| **t == producer) {
        for (pi, ci) in operand_pairs(&e.kind, pos, pvis.len(), cdom.len()) {
            let (Some(&p), Some(&c)) = (pvis.get(pi), cdom.get(ci)) else {
                continue;
            };
            let (pt, ct) = (f.id(p).iter_type, f.id(c).iter_type);
            if pt == IterType::Broadcast && ct != IterType::Broadcast {
                continue;
            }
            if seen.insert((p, c)) {
                out.push((p, c));
            }
        }
    }
    let position: std::collections::HashMap<IterDomainId, usize> =
        pvis.iter().enumerate().map(|(i, x)| (*x, i)).collect();
    out.sort_by_key(|(p, _)| position.get(p).copied());
    out
}

/// The inverse of [`pairwise_map`]: pairs `(consumer root-or-logical axis, producer logical
/// axis)`, in consumer axis order.
pub fn consumer_to_producer(
    f: &Fusion,
    expr: ExprId,
    producer: TensorId,
) -> Vec<(IterDomainId, IterDomainId)> {
    let mut v: Vec<(IterDomainId, IterDomainId)> = pairwise_map(f, expr, producer)
        .into_iter()
        .map(|(p, c)| (c, p))
        .collect();
    if let Some(&consumer) = f.expr(expr).outputs.first() {
        let cdom = f.tensor(consumer).root_domain();
        v.sort_by_key(|(c, _)| cdom.iter().position(|x| x == c));
    }
    v
}

/// `(producer visible index, consumer root index)` pairs for operand position `pos` of an op
/// of kind `kind`, given the producer's visible rank and the consumer's root rank.
fn operand_pairs(kind: &ExprKind, pos: usize, prank: usize, crank: usize) -> Vec<(usize, usize)> {
    let identity = |n: usize| (0..n).map(|i| (i, i)).collect::<Vec<_>>();
    match kind {
        ExprKind::Set
        | ExprKind::SegmentSet
        | ExprKind::Cast(_)
        | ExprKind::Unary(_)
        | ExprKind::Binary(_)
        | ExprKind::Where
        | ExprKind::BinaryLit { .. }
        | ExprKind::WhereLit { .. }
        | ExprKind::Reduction { .. }
        | ExprKind::Reshape { .. }
        | ExprKind::Iota { .. }
        | ExprKind::Slice { .. }
        | ExprKind::Concat { .. } => identity(prank.min(crank)),
        ExprKind::Broadcast { axes } => (0..crank)
            .filter(|c| !axes.contains(c))
            .enumerate()
            .collect(),
        ExprKind::Squeeze { axes } => (0..prank)
            .filter(|p| !axes.contains(p))
            .enumerate()
            .map(|(c, p)| (p, c))
            .collect(),
        ExprKind::Permute { perm } => perm.iter().enumerate().map(|(c, p)| (*p, c)).collect(),
        ExprKind::Matmul => {
            // out = [batch.., m, n, rk]; each operand's batch axes align at the right of the
            // output's batch axes (numpy broadcasting), so a shorter batch maps with an offset.
            if crank < 3 || prank < 2 {
                return Vec::new();
            }
            let (m, n, rk) = (crank - 3, crank - 2, crank - 1);
            let Some(offset) = (crank - 3).checked_sub(prank - 2) else {
                return Vec::new();
            };
            let mut v: Vec<(usize, usize)> = (0..prank - 2).map(|i| (i, i + offset)).collect();
            if pos == 0 {
                v.push((prank - 2, m));
                v.push((prank - 1, rk));
            } else {
                v.push((prank - 2, rk));
                v.push((prank - 1, n));
            }
            v
        }
        ExprKind::IndexSelect { axis, .. } => {
            // out = [table axes with `axis` replaced by the ids' axis.., rv]: crank =
            // rank(table) + 1; the table's indexed axis maps to the trailing reduction axis.
            if crank < 2 {
                return Vec::new();
            }
            match pos {
                0 => (0..prank)
                    .map(|p| if p == *axis { (p, crank - 1) } else { (p, p) })
                    .collect(),
                _ if prank == 1 => vec![(0, *axis)],
                _ => Vec::new(),
            }
        }
        ExprKind::Linear => {
            // out = [leading.., n, rk]: crank = rank(x) + 1.
            if crank < 2 || prank == 0 {
                return Vec::new();
            }
            let (n, rk) = (crank - 2, crank - 1);
            match pos {
                0 => {
                    let mut v = identity(prank - 1);
                    v.push((prank - 1, rk));
                    v
                }
                1 => vec![(0, n), (1, rk)],
                _ => vec![(0, n)],
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weave_ir::{DType, Scalar};

    fn c(v: i64) -> Scalar {
        Scalar::c(v)
    }

    /// Adds input `name` of type `dtype` and constant sizes `dims`, on no mesh.
    fn input(f: &mut Fusion, name: &str, dtype: DType, dims: &[i64]) -> TensorId {
        let sizes = dims.iter().map(|&d| c(d)).collect();
        f.add_input(name, dtype, sizes, None).unwrap()
    }

    fn axes(f: &Fusion, t: TensorId) -> Vec<IterDomainId> {
        f.tensor(t).logical.clone()
    }

    fn def(f: &Fusion, t: TensorId) -> ExprId {
        f.tensor(t).definition.unwrap()
    }

    #[test]
    fn linear_maps_operands_to_output_and_contraction() {
        let mut f = Fusion::new("lin");
        let x = input(&mut f, "x", DType::BF16, &[2, 3, 8]);
        let w = input(&mut f, "w", DType::BF16, &[5, 8]);
        let b = input(&mut f, "b", DType::BF16, &[5]);
        let out = f.linear("out", x, w, Some(b)).unwrap();
        let e = def(&f, out);
        let (xa, wa, ba, oa) = (axes(&f, x), axes(&f, w), axes(&f, b), axes(&f, out));
        assert_eq!(oa.len(), 4);
        assert_eq!(f.id(oa[3]).iter_type, IterType::Reduction);
        assert_eq!(
            pairwise_map(&f, e, x),
            vec![(xa[0], oa[0]), (xa[1], oa[1]), (xa[2], oa[3])]
        );
        assert_eq!(pairwise_map(&f, e, w), vec![(wa[0], oa[2]), (wa[1], oa[3])]);
        assert_eq!(pairwise_map(&f, e, b), vec![(ba[0], oa[2])]);
        assert_eq!(
            consumer_to_producer(&f, e, w),
            vec![(oa[2], wa[0]), (oa[3], wa[1])]
        );
    }

    #[test]
    fn matmul_maps_batch_m_n_and_contraction() {
        let mut f = Fusion::new("mm");
        let a = input(&mut f, "a", DType::F32, &[4, 2, 3]);
        let b = input(&mut f, "b", DType::F32, &[4, 3, 5]);
        let out = f.matmul("out", a, b).unwrap();
        let e = def(&f, out);
        let (aa, ba, oa) = (axes(&f, a), axes(&f, b), axes(&f, out));
        // out = [4, 2, 5, r3]
        assert_eq!(
            pairwise_map(&f, e, a),
            vec![(aa[0], oa[0]), (aa[1], oa[1]), (aa[2], oa[3])]
        );
        assert_eq!(
            pairwise_map(&f, e, b),
            vec![(ba[0], oa[0]), (ba[1], oa[3]), (ba[2], oa[2])]
        );

        // Unbatched B against a batched A.
        let b2 = input(&mut f, "b2", DType::F32, &[3, 7]);
        let out2 = f.matmul("out2", a, b2).unwrap();
        let e2 = def(&f, out2);
        let (b2a, o2) = (axes(&f, b2), axes(&f, out2));
        assert_eq!(
            pairwise_map(&f, e2, b2),
            vec![(b2a[0], o2[3]), (b2a[1], o2[2])]
        );
    }

    #[test]
    fn matmul_batch_axes_align_at_the_right_and_broadcasts_stretch() {
        let mut f = Fusion::new("mmb");
        // [S, D, m, k] x [D, k, n] -> [S, D, m, n, rk]
        let a = input(&mut f, "a", DType::F32, &[4, 2, 3, 5]);
        let b = input(&mut f, "b", DType::F32, &[2, 5, 7]);
        let out = f.matmul("out", a, b).unwrap();
        let e = def(&f, out);
        let (aa, ba, oa) = (axes(&f, a), axes(&f, b), axes(&f, out));
        assert_eq!(oa.len(), 5);
        assert_eq!(
            pairwise_map(&f, e, a),
            vec![
                (aa[0], oa[0]),
                (aa[1], oa[1]),
                (aa[2], oa[2]),
                (aa[3], oa[4])
            ]
        );
        assert_eq!(
            pairwise_map(&f, e, b),
            vec![(ba[0], oa[1]), (ba[1], oa[4]), (ba[2], oa[3])]
        );

        // [S, D, m, k] x [1, D, k, n] where the 1 is a broadcast: it maps to nothing.
        let bc = f
            .add_op("bc", ExprKind::Broadcast { axes: vec![0] }, &[b])
            .unwrap();
        let out2 = f.matmul("out2", a, bc).unwrap();
        let e2 = def(&f, out2);
        let (bca, o2) = (axes(&f, bc), axes(&f, out2));
        assert_eq!(f.id(o2[0]).iter_type, IterType::Iteration);
        assert_eq!(
            pairwise_map(&f, e2, bc),
            vec![(bca[1], o2[1]), (bca[2], o2[4]), (bca[3], o2[3])]
        );
    }

    #[test]
    fn broadcast_skips_inserted_axes_and_pointwise_skips_broadcast_producers() {
        let mut f = Fusion::new("bc");
        let a = input(&mut f, "a", DType::F32, &[3, 4]);
        let bc = f
            .add_op("bc", ExprKind::Broadcast { axes: vec![0, 2] }, &[a])
            .unwrap();
        let (aa, ba) = (axes(&f, a), axes(&f, bc));
        assert_eq!(ba.len(), 4);
        assert_eq!(
            pairwise_map(&f, def(&f, bc), a),
            vec![(aa[0], ba[1]), (aa[1], ba[3])]
        );

        // add(bc, full): bc's broadcast axes do not map to full's real axes in the output.
        let full = input(&mut f, "full", DType::F32, &[2, 3, 5, 4]);
        let sum = f.binary("s", weave_ir::BinaryOp::Add, bc, full).unwrap();
        let sa = axes(&f, sum);
        let e = def(&f, sum);
        assert_eq!(
            pairwise_map(&f, e, bc),
            vec![(ba[1], sa[1]), (ba[3], sa[3])]
        );
        assert_eq!(pairwise_map(&f, e, full).len(), 4);
    }

    #[test]
    fn reductions_map_every_axis_including_reduced_ones() {
        let mut f = Fusion::new("red");
        let a = input(&mut f, "a", DType::F32, &[3, 4, 5]);
        let s = f.sum("s", a, &[1]).unwrap();
        let (aa, sa) = (axes(&f, a), axes(&f, s));
        assert_eq!(f.id(sa[1]).iter_type, IterType::Reduction);
        assert_eq!(
            pairwise_map(&f, def(&f, s), a),
            vec![(aa[0], sa[0]), (aa[1], sa[1]), (aa[2], sa[2])]
        );
        // A consumer of `s` sees only its visible axes.
        let t = f.set("t", s).unwrap();
        let ta = axes(&f, t);
        assert_eq!(
            pairwise_map(&f, def(&f, t), s),
            vec![(sa[0], ta[0]), (sa[2], ta[1])]
        );
    }

    #[test]
    fn permute_squeeze_and_reshape() {
        let mut f = Fusion::new("shape");
        let a = input(&mut f, "a", DType::F32, &[3, 1, 4]);
        let p = f
            .add_op(
                "p",
                ExprKind::Permute {
                    perm: vec![2, 0, 1],
                },
                &[a],
            )
            .unwrap();
        let (aa, pa) = (axes(&f, a), axes(&f, p));
        assert_eq!(
            pairwise_map(&f, def(&f, p), a),
            vec![(aa[0], pa[1]), (aa[1], pa[2]), (aa[2], pa[0])]
        );
        let sq = f
            .add_op("sq", ExprKind::Squeeze { axes: vec![1] }, &[a])
            .unwrap();
        let qa = axes(&f, sq);
        assert_eq!(
            pairwise_map(&f, def(&f, sq), a),
            vec![(aa[0], qa[0]), (aa[2], qa[1])]
        );
        let r = f
            .add_op(
                "r",
                ExprKind::Reshape {
                    shape: vec![c(3), c(2), c(2)],
                },
                &[sq],
            )
            .unwrap();
        let root = f.tensor(r).root.clone().unwrap();
        assert_eq!(
            pairwise_map(&f, def(&f, r), sq),
            vec![(qa[0], root[0]), (qa[1], root[1])]
        );
    }

    #[test]
    fn an_operand_read_twice_maps_once_per_pair() {
        let mut f = Fusion::new("twice");
        let a = input(&mut f, "a", DType::F32, &[3]);
        let s = f.binary("s", weave_ir::BinaryOp::Mul, a, a).unwrap();
        assert_eq!(pairwise_map(&f, def(&f, s), a).len(), 1);
        let other = input(&mut f, "o", DType::F32, &[3]);
        assert!(pairwise_map(&f, def(&f, s), other).is_empty());
    }
}
