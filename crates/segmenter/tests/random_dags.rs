//! Property test: random DAG-shaped fusions (pointwise, matmul, sum and broadcast ops over
//! earlier tensors, some stream-split, with a random classifier) always segment into a valid,
//! acyclic partition whose run order respects every data dependence.

use std::collections::HashSet;

use proptest::prelude::*;
use weave_ir::{
    BinaryOp, DType, ExprId, ExprKind, Fusion, ParallelType, Scalar, SplitKind, TensorId, UnaryOp,
};
use weave_segmenter::{
    compute_kind, segment, verify, DefaultMergeRule, MergeRule, NoMergeRule, SegmentKind,
    SegmentedFusion,
};
use weave_transform::{parallelize, split, DomainKind};

const N: i64 = 4;

/// One random op: `(op selector, operand picks, stream-split?)`.
type OpSpec = (u8, usize, usize, bool);

/// Builds a fusion from op specs. Rank-2 tensors are `[N, N]`, rank-1 tensors `[N]`; each op
/// picks its operands among earlier tensors of the rank it needs.
fn build(ops: &[OpSpec], n_outputs: usize) -> Fusion {
    let mut f = Fusion::new("random");
    let mut rank2: Vec<TensorId> = Vec::new();
    let mut rank1: Vec<TensorId> = Vec::new();
    for k in 0..2 {
        let t = f
            .add_input(
                &format!("in{k}"),
                DType::F32,
                vec![Scalar::c(N), Scalar::c(N)],
                None,
            )
            .unwrap();
        rank2.push(t);
    }
    for (k, &(sel, i, j, stream)) in ops.iter().enumerate() {
        let name = format!("t{k}");
        let pick = |v: &[TensorId], x: usize| v[x % v.len()];
        let use_rank1 = !rank1.is_empty() && sel % 7 == 6;
        let a1 = if rank1.is_empty() {
            None
        } else {
            Some(pick(&rank1, i))
        };
        let (a, b) = (pick(&rank2, i), pick(&rank2, j));
        let made = match (use_rank1, a1) {
            (true, Some(a1)) => match sel % 3 {
                0 => f.binary(&name, BinaryOp::Mul, a1, pick(&rank1, j)),
                1 => f.add_op(&name, ExprKind::Broadcast { axes: vec![j % 2] }, &[a1]),
                _ => f.add_op(&name, ExprKind::Unary(UnaryOp::Exp), &[a1]),
            },
            _ => match sel % 6 {
                0 | 1 => f.binary(&name, BinaryOp::Add, a, b),
                2 => f.add_op(&name, ExprKind::Unary(UnaryOp::Neg), &[a]),
                3 => f.matmul(&name, a, b),
                4 => f.sum(&name, a, &[j % 2]),
                _ => f.set(&name, a),
            },
        };
        // Shapes that do not fit (a broadcast operand of a matmul) become a copy.
        let out = match made {
            Ok(t) => t,
            Err(_) => f.set(&name, a).unwrap(),
        };
        let rank = f.visible_axes(out).len();
        if stream {
            // Best effort: a split the schedule rules refuse just leaves the tensor serial.
            if split(
                &mut f,
                out,
                DomainKind::Loop,
                0,
                Scalar::c(2),
                SplitKind::Outer,
            )
            .is_ok()
            {
                let _ = parallelize(&mut f, out, 0, ParallelType::Stream);
            }
        }
        if rank == 2 {
            rank2.push(out);
        } else {
            rank1.push(out);
        }
    }
    let defined: Vec<TensorId> = f.exprs().iter().map(|e| f.expr(*e).outputs[0]).collect();
    for t in defined.iter().rev().take(n_outputs) {
        f.add_output(*t).unwrap();
    }
    f
}

fn check(sf: &SegmentedFusion, comms: &HashSet<ExprId>) -> Result<(), TestCaseError> {
    verify(sf).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let f = sf.fusion();
    let pos = |s| sf.run_order().iter().position(|x| *x == s).unwrap();
    let mut seen = 0;
    for (_, s) in sf.segments() {
        seen += s.exprs().len();
        if s.kind() != SegmentKind::Kernel {
            prop_assert_eq!(s.exprs().len(), 1);
        }
        for e in s.exprs() {
            let want = if comms.contains(e) {
                SegmentKind::Communication
            } else {
                compute_kind(f, *e)
            };
            prop_assert_eq!(s.kind(), want);
        }
    }
    prop_assert_eq!(seen, f.exprs().len());
    // Every data dependence runs forward (or stays inside one segment).
    for e in f.exprs() {
        let consumer = sf.segment_of(*e).unwrap();
        for t in &f.expr(*e).inputs {
            if let Some(p) = sf.producer_of(*t) {
                prop_assert!(pos(p) <= pos(consumer));
                if p != consumer {
                    prop_assert!(sf.segment(p).outputs().contains(t));
                    prop_assert!(sf.segment(consumer).inputs().contains(t));
                    prop_assert!(sf
                        .edges()
                        .iter()
                        .any(|x| x.from == p && x.to == consumer && x.tensor == *t));
                }
            }
        }
    }
    prop_assert!(!petgraph::algo::is_cyclic_directed(sf.graph()));
    Ok(())
}

fn op_spec() -> impl Strategy<Value = OpSpec> {
    (
        any::<u8>(),
        0usize..64,
        0usize..64,
        proptest::bool::weighted(0.3),
    )
}

/// The exprs of `f` whose entry in `mask` (in program order) is set.
fn masked(f: &Fusion, mask: &[bool]) -> HashSet<ExprId> {
    f.exprs()
        .iter()
        .zip(mask)
        .filter(|(_, c)| **c)
        .map(|(e, _)| *e)
        .collect()
}

/// [`compute_kind`], except that the exprs of `comms` are communications.
fn classify_comms(comms: &HashSet<ExprId>) -> impl Fn(&Fusion, ExprId) -> SegmentKind + '_ {
    move |fu, e| {
        if comms.contains(&e) {
            SegmentKind::Communication
        } else {
            compute_kind(fu, e)
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_fusions_segment_into_valid_dags(
        ops in proptest::collection::vec(op_spec(), 1..28),
        comm_mask in proptest::collection::vec(proptest::bool::weighted(0.2), 28),
        n_outputs in 1usize..4,
        siblings in any::<bool>(),
    ) {
        let f = build(&ops, n_outputs);
        let comms = masked(&f, &comm_mask);
        let classify = classify_comms(&comms);
        let rule = DefaultMergeRule { merge_siblings: siblings };
        let sf = segment(f.clone(), &classify, &rule);
        check(&sf, &comms)?;
        // Deterministic.
        let again = segment(f.clone(), &classify, &rule);
        prop_assert_eq!(sf.to_string(), again.to_string());
        // Rebuilding from the partition gives the same segmentation.
        let parts = sf
            .segments()
            .map(|(_, s)| (s.kind(), s.exprs().to_vec()))
            .collect();
        let rebuilt = SegmentedFusion::from_partition(f.clone(), parts).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(sf.to_string(), rebuilt.to_string());

        let single = segment(f, &classify, &NoMergeRule);
        check(&single, &comms)?;
        prop_assert_eq!(single.len(), single.fusion().exprs().len());
    }

    #[test]
    fn a_merge_everything_rule_still_gives_a_dag(
        ops in proptest::collection::vec(op_spec(), 1..28),
        comm_mask in proptest::collection::vec(proptest::bool::weighted(0.3), 28),
    ) {
        struct Greedy;
        impl MergeRule for Greedy {
            fn name(&self) -> &'static str { "greedy" }
            fn can_merge(&self, _: &Fusion, _: &weave_segmenter::Segment, _: &weave_segmenter::Segment) -> bool { true }
            fn merge_siblings(&self) -> bool { true }
        }
        let f = build(&ops, 2);
        let comms = masked(&f, &comm_mask);
        let classify = classify_comms(&comms);
        let sf = segment(f, &classify, &Greedy);
        check(&sf, &comms)?;
    }
}
