//! Property tests of weave-transform: split/merge extents against integer formulas, replay
//! giving structurally identical extents, and the id graph being an equivalence relation.

use proptest::prelude::*;
use weave_ir::{
    BinaryOp, DType, ExprKind, Fusion, IterDomainId, MeshSpec, ParallelType, Scalar, SplitKind,
    TensorId,
};
use weave_transform::{
    pairwise_map, parallelize, replay_loop_like, schedule, split, DomainKind, IdGraph,
};

const PARAMS: [&str; 3] = ["p0", "p1", "p2"];

/// An extent as generated: a constant, a parameter, or a constant times a parameter.
#[derive(Clone, Debug)]
enum Ext {
    Const(i64),
    Param(usize),
    Scaled(i64, usize),
}

impl Ext {
    fn scalar(&self) -> Scalar {
        match self {
            Ext::Const(c) => Scalar::c(*c),
            Ext::Param(p) => Scalar::named(PARAMS[*p]),
            Ext::Scaled(c, p) => Scalar::named(PARAMS[*p]).mul(*c),
        }
    }
}

fn ext() -> impl Strategy<Value = Ext> {
    prop_oneof![
        (1i64..=30).prop_map(Ext::Const),
        (0usize..3).prop_map(Ext::Param),
        ((2i64..=4), (0usize..3)).prop_map(|(c, p)| Ext::Scaled(c, p)),
    ]
}

fn fusion_with_params(values: &[i64; 3]) -> Fusion {
    let mut f = Fusion::new("prop");
    for (p, v) in PARAMS.iter().zip(values) {
        f.add_param(p, Some(*v)).unwrap();
    }
    f
}

/// One random domain transform.
#[derive(Clone, Debug)]
enum Step {
    Split {
        axis: usize,
        factor: i64,
        outer: bool,
    },
    Merge {
        axis: usize,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => ((0usize..16), (1i64..=8), any::<bool>())
            .prop_map(|(axis, factor, outer)| Step::Split { axis, factor, outer }),
        1 => (0usize..16).prop_map(|axis| Step::Merge { axis }),
    ]
}

fn ceil_div(a: i64, b: i64) -> i64 {
    (a + b - 1) / b
}

fn domain_of(f: &Fusion, t: TensorId, dom: DomainKind) -> Vec<IterDomainId> {
    match dom {
        DomainKind::Loop => f.tensor(t).loop_domain.clone(),
        DomainKind::Allocation => f.tensor(t).allocation_domain().to_vec(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Random chains of splits and merges: each evaluated extent follows the integer
    /// formulas, and the product of the final extents covers the logical domain exactly
    /// when every split divides.
    #[test]
    fn split_merge_extents_follow_the_formulas(
        values in [1i64..=30, 1i64..=30, 1i64..=30],
        extents in proptest::collection::vec(ext(), 1..=4),
        steps in proptest::collection::vec(step(), 0..10),
        allocation in any::<bool>(),
    ) {
        let mut f = fusion_with_params(&values);
        let x = f
            .add_input("x", DType::F32, extents.iter().map(Ext::scalar).collect(), None)
            .unwrap();
        let dom = if allocation { DomainKind::Allocation } else { DomainKind::Loop };
        let mut model: Vec<i64> = extents.iter().map(|e| f.eval(&e.scalar()).unwrap()).collect();
        let logical_product: i64 = model.iter().product();
        let mut divisible = true;
        for s in &steps {
            match *s {
                Step::Split { axis, factor, outer } => {
                    let axis = axis % model.len();
                    let e = model[axis];
                    divisible &= e % factor == 0;
                    let kind = if outer { SplitKind::Outer } else { SplitKind::Inner };
                    let (o, i) = split(&mut f, x, dom, axis, Scalar::c(factor), kind).unwrap();
                    let (oe, ie) = if outer {
                        (factor, ceil_div(e, factor))
                    } else {
                        (ceil_div(e, factor), factor)
                    };
                    prop_assert_eq!(f.eval(&f.id(o).extent), Some(oe));
                    prop_assert_eq!(f.eval(&f.id(i).extent), Some(ie));
                    model.splice(axis..=axis, [oe, ie]);
                }
                Step::Merge { axis } => {
                    if model.len() < 2 {
                        continue;
                    }
                    let axis = axis % (model.len() - 1);
                    schedule::merge(&mut f, x, dom, axis, axis + 1).unwrap();
                    let m = model[axis] * model[axis + 1];
                    model.splice(axis..=axis + 1, [m]);
                }
            }
        }
        let ids = domain_of(&f, x, dom);
        let evaluated: Vec<i64> = ids.iter().map(|i| f.eval(&f.id(*i).extent).unwrap()).collect();
        prop_assert_eq!(&evaluated, &model);
        let product: i64 = evaluated.iter().product();
        prop_assert!(product >= logical_product);
        if divisible {
            prop_assert_eq!(product, logical_product);
        }
        // The other domain is untouched.
        let other = if allocation { DomainKind::Loop } else { DomainKind::Allocation };
        prop_assert_eq!(domain_of(&f, x, other), f.tensor(x).logical.clone());
    }
}

/// One split of a random stream chain: kind, factor, and which output the chain follows.
#[derive(Clone, Debug)]
struct ChainSplit {
    outer: bool,
    factor: i64,
    take_outer: bool,
}

fn chain_split() -> impl Strategy<Value = ChainSplit> {
    (any::<bool>(), 1i64..=8, any::<bool>()).prop_map(|(outer, factor, take_outer)| ChainSplit {
        outer,
        factor,
        take_outer,
    })
}

/// How the replay target relates to the reference.
#[derive(Clone, Copy, Debug)]
enum Shape {
    /// `b = set(a)`, a → b.
    Set,
    /// `c = add(a, b)`, a → c.
    Add,
    /// `b = set(a)`, b scheduled, b → a.
    Backward,
    /// `c = add(a, b)`, a → b (mapped through c only).
    Sibling,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Scheduling a reference with a random stream split chain (and maybe a DIDx split)
    /// and replaying it onto a pointwise-mapped tensor gives structurally equal extents and
    /// equal parallel types on the target's loop domain.
    #[test]
    fn replay_reproduces_symbolic_extents(
        values in [1i64..=30, 1i64..=30, 1i64..=30],
        extents in proptest::collection::vec(ext(), 1..=3),
        stream_axis in 0usize..3,
        chain in proptest::collection::vec(chain_split(), 0..3),
        stream_factor in 1i64..=8,
        device in proptest::option::of(((0usize..3), ext())),
        shape in prop_oneof![
            Just(Shape::Set),
            Just(Shape::Add),
            Just(Shape::Backward),
            Just(Shape::Sibling)
        ],
    ) {
        let mut f = fusion_with_params(&values);
        let m = f.add_mesh("m", MeshSpec::Devices(vec![Scalar::c(2)])).unwrap();
        let mut shape_ext: Vec<Scalar> = extents.iter().map(Ext::scalar).collect();
        let rank = shape_ext.len();
        let stream_axis = stream_axis % rank;
        // The device axis (if any, and distinct from the stream axis) gets an even extent.
        let device = device
            .map(|(a, e)| (a % rank, e))
            .filter(|(a, _)| *a != stream_axis);
        if let Some((a, e)) = &device {
            shape_ext[*a] = e.scalar().mul(2);
        }
        let a = f.add_input("a", DType::F32, shape_ext.clone(), Some(m)).unwrap();
        let (reference, target) = match shape {
            Shape::Set => {
                let b = f.set("b", a).unwrap();
                (a, b)
            }
            Shape::Backward => {
                let b = f.set("b", a).unwrap();
                f.tensor_mut(b).mesh = Some(m);
                f.tensor_mut(a).mesh = None;
                (b, a)
            }
            Shape::Add | Shape::Sibling => {
                let b = f.add_input("b", DType::F32, shape_ext.clone(), None).unwrap();
                let c = f.binary("c", BinaryOp::Add, a, b).unwrap();
                (a, if matches!(shape, Shape::Add) { c } else { b })
            }
        };
        // Schedule the reference.
        if let Some((da, _)) = &device {
            split(&mut f, reference, DomainKind::Loop, *da, Scalar::c(2), SplitKind::Outer).unwrap();
            parallelize(&mut f, reference, *da, ParallelType::DIDx).unwrap();
        }
        let start = f.tensor(reference).logical[stream_axis];
        let mut pos = f.tensor(reference).loop_domain.iter().position(|i| *i == start).unwrap();
        for s in &chain {
            let kind = if s.outer { SplitKind::Outer } else { SplitKind::Inner };
            split(&mut f, reference, DomainKind::Loop, pos, Scalar::c(s.factor), kind).unwrap();
            if !s.take_outer {
                pos += 1;
            }
        }
        split(&mut f, reference, DomainKind::Loop, pos, Scalar::c(stream_factor), SplitKind::Outer)
            .unwrap();
        parallelize(&mut f, reference, pos, ParallelType::Stream).unwrap();

        let g = IdGraph::build(&f);
        let report = replay_loop_like(
            &mut f,
            reference,
            target,
            &g,
            &[ParallelType::Stream, ParallelType::DIDx],
        )
        .unwrap();
        prop_assert!(report.skipped.is_empty(), "{:?}", report.skipped);
        prop_assert_eq!(report.applied.len(), 1 + usize::from(device.is_some()));
        let describe = |t: TensorId| -> Vec<(ParallelType, Scalar)> {
            f.tensor(t)
                .loop_domain
                .iter()
                .map(|i| (f.id(*i).parallel, f.id(*i).extent.clone()))
                .collect()
        };
        prop_assert_eq!(describe(target), describe(reference));
        prop_assert_eq!(f.tensor(target).mesh, Some(m));
    }
}

/// One random op of a small fusion; seeds pick operands and axes.
#[derive(Clone, Debug)]
enum Op {
    Set(usize),
    Add(usize, bool),
    Sum(usize, usize),
    Matmul(usize, i64),
    Linear(usize, i64),
    Broadcast(usize, usize),
    Permute(usize, usize),
    Split(usize, usize, i64, bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0usize..64).prop_map(Op::Set),
        ((0usize..64), any::<bool>()).prop_map(|(t, s)| Op::Add(t, s)),
        ((0usize..64), (0usize..8)).prop_map(|(t, a)| Op::Sum(t, a)),
        ((0usize..64), (1i64..=6)).prop_map(|(t, n)| Op::Matmul(t, n)),
        ((0usize..64), (1i64..=6)).prop_map(|(t, n)| Op::Linear(t, n)),
        ((0usize..64), (0usize..8)).prop_map(|(t, p)| Op::Broadcast(t, p)),
        ((0usize..64), (0usize..8)).prop_map(|(t, p)| Op::Permute(t, p)),
        ((0usize..64), (0usize..8), (1i64..=4), any::<bool>())
            .prop_map(|(t, a, k, o)| Op::Split(t, a, k, o)),
    ]
}

fn visible_extents(f: &Fusion, t: TensorId) -> Vec<Scalar> {
    f.visible_axes(t)
        .iter()
        .map(|i| f.id(*i).extent.clone())
        .collect()
}

/// Builds a small random fusion; ops whose operands do not fit are left out.
fn random_fusion(values: &[i64; 3], inputs: &[Vec<Ext>], ops: &[Op]) -> Fusion {
    let mut f = fusion_with_params(values);
    let mut pool: Vec<TensorId> = Vec::new();
    for (k, exts) in inputs.iter().enumerate() {
        let t = f
            .add_input(
                &format!("in{k}"),
                DType::F32,
                exts.iter().map(Ext::scalar).collect(),
                None,
            )
            .unwrap();
        pool.push(t);
    }
    for (k, op) in ops.iter().enumerate() {
        let name = format!("t{k}");
        let pick = |s: usize| pool[s % pool.len()];
        let made = match *op {
            Op::Set(s) => f.set(&name, pick(s)).ok(),
            Op::Add(s, same) => {
                let a = pick(s);
                let b = if same {
                    a
                } else {
                    let ext = visible_extents(&f, a);
                    f.add_input(&format!("{name}_rhs"), DType::F32, ext, None)
                        .unwrap()
                };
                f.binary(&name, BinaryOp::Add, a, b).ok()
            }
            Op::Sum(s, axis) => {
                let a = pick(s);
                let r = f.visible_axes(a).len();
                if r == 0 {
                    None
                } else {
                    f.sum(&name, a, &[axis % r]).ok()
                }
            }
            Op::Matmul(s, n) => {
                let a = pick(s);
                let ext = visible_extents(&f, a);
                if ext.len() < 2 {
                    None
                } else {
                    let k = ext[ext.len() - 1].clone();
                    let b = f
                        .add_input(
                            &format!("{name}_b"),
                            DType::F32,
                            vec![k, Scalar::c(n)],
                            None,
                        )
                        .unwrap();
                    f.matmul(&name, a, b).ok()
                }
            }
            Op::Linear(s, n) => {
                let a = pick(s);
                let ext = visible_extents(&f, a);
                match ext.last() {
                    None => None,
                    Some(k) => {
                        let w = f
                            .add_input(
                                &format!("{name}_w"),
                                DType::F32,
                                vec![Scalar::c(n), k.clone()],
                                None,
                            )
                            .unwrap();
                        f.linear(&name, a, w, None).ok()
                    }
                }
            }
            Op::Broadcast(s, p) => {
                let a = pick(s);
                let r = f.visible_axes(a).len();
                f.add_op(
                    &name,
                    ExprKind::Broadcast {
                        axes: vec![p % (r + 1)],
                    },
                    &[a],
                )
                .ok()
            }
            Op::Permute(s, rot) => {
                let a = pick(s);
                let r = f.visible_axes(a).len();
                if r == 0 {
                    None
                } else {
                    let perm = (0..r).map(|i| (i + rot) % r).collect();
                    f.add_op(&name, ExprKind::Permute { perm }, &[a]).ok()
                }
            }
            Op::Split(s, axis, factor, outer) => {
                let a = pick(s);
                let r = f.tensor(a).loop_domain.len();
                let kind = if outer {
                    SplitKind::Outer
                } else {
                    SplitKind::Inner
                };
                if r > 0 {
                    let _ = split(
                        &mut f,
                        a,
                        DomainKind::Loop,
                        axis % r,
                        Scalar::c(factor),
                        kind,
                    );
                }
                None
            }
        };
        pool.extend(made);
    }
    f
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// `are_mapped` is reflexive, symmetric and transitive, agrees with `class_of` and
    /// `classes`, and contains every pairwise producer→consumer pair.
    #[test]
    fn id_graph_is_an_equivalence(
        values in [1i64..=6, 1i64..=6, 1i64..=6],
        inputs in proptest::collection::vec(proptest::collection::vec(ext(), 1..=3), 1..=2),
        ops in proptest::collection::vec(op(), 0..12),
    ) {
        let f = random_fusion(&values, &inputs, &ops);
        let g = IdGraph::build(&f);
        let ids: Vec<IterDomainId> = g.ids().iter().copied().take(60).collect();
        for a in &ids {
            prop_assert!(g.are_mapped(*a, *a));
            for b in &ids {
                let ab = g.are_mapped(*a, *b);
                prop_assert_eq!(ab, g.are_mapped(*b, *a));
                prop_assert_eq!(ab, g.class_of(*a) == g.class_of(*b));
                if ab {
                    for c in &ids {
                        prop_assert_eq!(g.are_mapped(*a, *c), g.are_mapped(*b, *c));
                    }
                }
            }
        }
        // Classes partition the known ids.
        let classes = g.classes();
        let total: usize = classes.iter().map(Vec::len).sum();
        prop_assert_eq!(total, g.ids().len());
        for class in &classes {
            for id in class {
                prop_assert_eq!(g.class_of(*id), g.class_of(class[0]));
            }
        }
        // Every pairwise pair is mapped.
        for e in f.exprs() {
            for p in &f.expr(*e).inputs {
                for (a, b) in pairwise_map(&f, *e, *p) {
                    prop_assert!(g.are_mapped(a, b));
                }
            }
        }
    }
}
