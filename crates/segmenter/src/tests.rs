//! Unit tests of segmentation on fusions built with the weave-ir builder.

use weave_ir::{
    BinaryOp, DType, ExprId, ExprKind, Fusion, MeshSpec, ParallelType, Scalar, SplitKind, TensorId,
    UnaryOp,
};
use weave_transform::{parallelize, split, DomainKind};

use crate::{
    compute_kind, segment, verify, DefaultMergeRule, NoMergeRule, SegmentKind, SegmentedFusion,
};
use SegmentKind::{Communication, Kernel, Library};

fn input(f: &mut Fusion, name: &str) -> TensorId {
    f.add_input(name, DType::F32, vec![Scalar::c(8), Scalar::c(8)], None)
        .unwrap()
}

fn unary(f: &mut Fusion, name: &str, op: UnaryOp, a: TensorId) -> TensorId {
    f.add_op(name, ExprKind::Unary(op), &[a]).unwrap()
}

fn def(f: &Fusion, t: TensorId) -> ExprId {
    f.tensor(t).definition.unwrap()
}

fn kinds(sf: &SegmentedFusion) -> Vec<SegmentKind> {
    sf.segments().map(|(_, s)| s.kind()).collect()
}

fn seg_default(f: Fusion) -> SegmentedFusion {
    let sf = segment(f, &compute_kind, &DefaultMergeRule::new());
    verify(&sf).unwrap();
    sf
}

/// Outer-splits loop axis `axis` of `t` by `factor` and parallelizes the outer part on `pt`.
fn split_on(f: &mut Fusion, t: TensorId, axis: usize, factor: Scalar, pt: ParallelType) {
    split(f, t, DomainKind::Loop, axis, factor, SplitKind::Outer).unwrap();
    parallelize(f, t, axis, pt).unwrap();
}

/// Stream-splits axis 0 of `t`'s loop domain into `s` chunks.
fn stream_split(f: &mut Fusion, t: TensorId, s: i64) {
    split_on(f, t, 0, Scalar::c(s), ParallelType::Stream);
}

#[test]
fn pointwise_chain_fuses_into_one_kernel() {
    let mut f = Fusion::new("chain");
    let a = input(&mut f, "a");
    let b = input(&mut f, "b");
    let c = f.binary("c", BinaryOp::Add, a, b).unwrap();
    let d = unary(&mut f, "d", UnaryOp::Relu, c);
    let e = f.binary("e", BinaryOp::Mul, d, a).unwrap();
    let g = f.sum("g", e, &[1]).unwrap();
    let h = f.set("h", g).unwrap();
    f.add_output(h).unwrap();
    let sf = seg_default(f);
    assert_eq!(sf.len(), 1);
    let (id, s) = sf.segments().next().unwrap();
    assert_eq!(s.kind(), Kernel);
    assert_eq!(s.exprs(), sf.fusion().exprs());
    assert_eq!(s.inputs(), &[a, b]);
    assert_eq!(s.outputs(), &[h]);
    assert!(sf.edges().is_empty());
    assert_eq!(id.index(), 0);
    insta::assert_snapshot!(sf.to_string(), @"segment 0 (kernel): exprs [add, relu, mul, sum, set] inputs (a, b) outputs (h)");
    insta::assert_snapshot!(format!("{sf:#}"), @"segment 0 (kernel): exprs [c = add(a, b), d = relu(c), e = mul(d, a), g = sum(e), h = set(g)] inputs (a, b) outputs (h)");
}

#[test]
fn matmul_between_pointwise_ops_gives_kernel_library_kernel() {
    let mut f = Fusion::new("mm");
    let x = input(&mut f, "x");
    let w = input(&mut f, "w");
    let a = unary(&mut f, "a", UnaryOp::Neg, x);
    let b = f.binary("b", BinaryOp::Add, a, x).unwrap();
    let m = f.matmul("m", b, w).unwrap();
    let c = unary(&mut f, "c", UnaryOp::Relu, m);
    let d = f.binary("d", BinaryOp::Mul, c, c).unwrap();
    f.add_output(d).unwrap();
    let sf = seg_default(f);
    assert_eq!(kinds(&sf), [Kernel, Library, Kernel]);
    let ids = sf.run_order().to_vec();
    assert_eq!(sf.segment(ids[1]).inputs(), &[b, w]);
    assert_eq!(sf.segment(ids[1]).outputs(), &[m]);
    assert_eq!(sf.segment(ids[0]).outputs(), &[b]);
    assert_eq!(sf.producers(ids[2]), vec![ids[1]]);
    assert_eq!(sf.consumers(ids[0]), vec![ids[1]]);
    assert_eq!(sf.producer_of(m), Some(ids[1]));
    assert_eq!(sf.producer_of(x), None);
    let edges = sf.edges();
    assert_eq!(edges.len(), 2);
    assert_eq!(
        (edges[0].from, edges[0].to, edges[0].tensor),
        (ids[0], ids[1], b)
    );
    assert_eq!(
        (edges[1].from, edges[1].to, edges[1].tensor),
        (ids[1], ids[2], m)
    );
    insta::assert_snapshot!(sf.to_string(), @r"
    segment 0 (kernel): exprs [neg, add] inputs (x) outputs (b)
    segment 1 (library): exprs [matmul] inputs (b, w) outputs (m)
    segment 2 (kernel): exprs [relu, mul] inputs (m) outputs (d)
    ");
}

#[test]
fn diamond_around_a_library_call_stays_acyclic() {
    // a -> matmul -> c and a -> c2 -> c: c2 merges with a, but c cannot join {a, c2}, which
    // would close the cycle {a, c2} -> matmul -> {a, c2, c}.
    let mut f = Fusion::new("diamond");
    let x = input(&mut f, "x");
    let w = input(&mut f, "w");
    let a = unary(&mut f, "a", UnaryOp::Relu, x);
    let m = f.matmul("m", a, w).unwrap();
    let c2 = unary(&mut f, "c2", UnaryOp::Neg, a);
    let c = f.binary("c", BinaryOp::Add, m, c2).unwrap();
    f.add_output(c).unwrap();
    let sf = seg_default(f);
    assert_eq!(kinds(&sf), [Kernel, Library, Kernel]);
    let ids = sf.run_order().to_vec();
    let fu = sf.fusion();
    assert_eq!(sf.segment(ids[0]).exprs(), &[def(fu, a), def(fu, c2)]);
    assert_eq!(sf.segment(ids[0]).outputs(), &[a, c2]);
    assert_eq!(sf.segment(ids[2]).exprs(), &[def(fu, c)]);
    assert_eq!(sf.segment(ids[2]).inputs(), &[m, c2]);
    insta::assert_snapshot!(sf.to_string(), @r"
    segment 0 (kernel): exprs [relu, neg] inputs (x) outputs (a, c2)
    segment 1 (library): exprs [matmul] inputs (a, w) outputs (m)
    segment 2 (kernel): exprs [add] inputs (m, c2) outputs (c)
    ");
}

#[test]
fn direct_edge_plus_path_through_library_is_refused() {
    // a -> c directly and a -> m -> c: merging a and c would swallow the path through m.
    let mut f = Fusion::new("triangle");
    let x = input(&mut f, "x");
    let a = unary(&mut f, "a", UnaryOp::Relu, x);
    let m = f.matmul("m", a, a).unwrap();
    let c = f.binary("c", BinaryOp::Add, a, m).unwrap();
    f.add_output(c).unwrap();
    let sf = seg_default(f);
    assert_eq!(sf.len(), 3);
}

#[test]
fn classifier_marked_communications_are_their_own_segments() {
    let mut f = Fusion::new("comm");
    let x = input(&mut f, "x");
    let a = unary(&mut f, "a", UnaryOp::Neg, x);
    let g1 = f.set("g1", a).unwrap();
    let g2 = f.set("g2", g1).unwrap();
    let b = f.binary("b", BinaryOp::Add, g2, a).unwrap();
    let c = f.set("c", b).unwrap();
    f.add_output(c).unwrap();
    let comms = [def(&f, g1), def(&f, g2)];
    let classify = move |fu: &Fusion, e: ExprId| {
        if comms.contains(&e) {
            Communication
        } else {
            compute_kind(fu, e)
        }
    };
    let sf = segment(f, &classify, &DefaultMergeRule::new());
    verify(&sf).unwrap();
    assert_eq!(kinds(&sf), [Kernel, Communication, Communication, Kernel]);
    insta::assert_snapshot!(sf.to_string(), @r"
    segment 0 (kernel): exprs [neg] inputs (x) outputs (a)
    segment 1 (communication): exprs [set] inputs (a) outputs (g1)
    segment 2 (communication): exprs [set] inputs (g1) outputs (g2)
    segment 3 (kernel): exprs [add, set] inputs (g2, a) outputs (c)
    ");
}

#[test]
fn run_order_is_topological_and_breaks_ties_by_program_order() {
    // Program order: p (kernel), m (library), q, r (kernel reading m). p, q and r merge into
    // one kernel that needs m, so the library call runs first even though p comes first.
    let mut f = Fusion::new("order");
    let x = input(&mut f, "x");
    let y = input(&mut f, "y");
    let p = unary(&mut f, "p", UnaryOp::Neg, x);
    let m = f.matmul("m", y, y).unwrap();
    let q = f.binary("q", BinaryOp::Add, p, p).unwrap();
    let r = f.binary("r", BinaryOp::Add, q, m).unwrap();
    // Two independent chains after it: ties go to program order.
    let s1 = unary(&mut f, "s1", UnaryOp::Abs, y);
    let t1 = f.matmul("t1", x, x).unwrap();
    let s2 = unary(&mut f, "s2", UnaryOp::Abs, t1);
    for t in [r, s1, s2] {
        f.add_output(t).unwrap();
    }
    let sf = seg_default(f.clone());
    insta::assert_snapshot!(sf.to_string(), @r"
    segment 0 (library): exprs [matmul] inputs (y) outputs (m)
    segment 1 (kernel): exprs [neg, add, add] inputs (x, m) outputs (r)
    segment 2 (kernel): exprs [abs] inputs (y) outputs (s1)
    segment 3 (library): exprs [matmul] inputs (x) outputs (t1)
    segment 4 (kernel): exprs [abs] inputs (t1) outputs (s2)
    ");
    // Deterministic: the same input gives the same segmentation, twice.
    let again = seg_default(f);
    assert_eq!(sf.to_string(), again.to_string());
    for e in sf.edges() {
        assert!(e.from.index() < e.to.index());
    }
}

#[test]
fn segment_inputs_are_listed_once_in_first_use_order() {
    // The matmul reads `y` twice; a segment lists each input once.
    let mut f = Fusion::new("io");
    let y = input(&mut f, "y");
    let m = f.matmul("m", y, y).unwrap();
    f.add_output(m).unwrap();
    let sf = seg_default(f);
    assert_eq!(sf.segment(sf.run_order()[0]).inputs(), &[y]);
}

#[test]
fn intermediate_fusion_outputs_are_segment_outputs() {
    let mut f = Fusion::new("io");
    let x = input(&mut f, "x");
    let a = unary(&mut f, "a", UnaryOp::Neg, x);
    let b = unary(&mut f, "b", UnaryOp::Abs, a);
    let _dead = unary(&mut f, "dead", UnaryOp::Relu, a);
    f.add_output(a).unwrap();
    f.add_output(b).unwrap();
    let sf = seg_default(f);
    assert_eq!(sf.len(), 1);
    let s = sf.segment(sf.run_order()[0]);
    assert_eq!(s.outputs(), &[a, b]);
    assert_eq!(s.produced(sf.fusion()).len(), 3);
}

#[test]
fn no_merge_rule_gives_one_segment_per_expr() {
    let mut f = Fusion::new("nomerge");
    let x = input(&mut f, "x");
    let a = unary(&mut f, "a", UnaryOp::Neg, x);
    let b = f.binary("b", BinaryOp::Add, a, x).unwrap();
    let m = f.matmul("m", b, a).unwrap();
    let c = f.sum("c", m, &[0]).unwrap();
    f.add_output(c).unwrap();
    let n = f.exprs().len();
    let sf = segment(f, &compute_kind, &NoMergeRule);
    verify(&sf).unwrap();
    assert_eq!(sf.len(), n);
    for (k, (_, s)) in sf.segments().enumerate() {
        assert_eq!(s.exprs(), &[sf.fusion().exprs()[k]]);
    }
    assert_eq!(kinds(&sf), [Kernel, Kernel, Library, Kernel]);
}

#[test]
fn stream_parallel_mismatch_is_never_merged() {
    let mut f = Fusion::new("streams");
    let x = input(&mut f, "x");
    let a = unary(&mut f, "a", UnaryOp::Neg, x);
    let b = unary(&mut f, "b", UnaryOp::Abs, a);
    let c = unary(&mut f, "c", UnaryOp::Relu, b);
    let d = unary(&mut f, "d", UnaryOp::Neg, c);
    f.add_output(d).unwrap();
    // a, b split into 2 stream chunks; c into 4; d unsplit.
    stream_split(&mut f, a, 2);
    stream_split(&mut f, b, 2);
    stream_split(&mut f, c, 4);
    let sf = seg_default(f);
    insta::assert_snapshot!(sf.to_string(), @r"
    segment 0 (kernel): exprs [neg, abs] inputs (x) outputs (b)
    segment 1 (kernel): exprs [relu] inputs (b) outputs (c)
    segment 2 (kernel): exprs [neg] inputs (c) outputs (d)
    ");
}

#[test]
fn device_split_mismatch_and_symbolic_extents() {
    let mut f = Fusion::new("dids");
    f.add_param("d", Some(2)).unwrap();
    f.add_param("s", Some(2)).unwrap();
    let mesh = f
        .add_mesh("m", MeshSpec::Devices(vec![Scalar::named("d")]))
        .unwrap();
    let x = f
        .add_input(
            "x",
            DType::F32,
            vec![Scalar::c(8), Scalar::c(8)],
            Some(mesh),
        )
        .unwrap();
    let a = unary(&mut f, "a", UnaryOp::Neg, x);
    let b = unary(&mut f, "b", UnaryOp::Abs, a);
    let c = unary(&mut f, "c", UnaryOp::Relu, b);
    f.add_output(c).unwrap();
    for t in [a, b, c] {
        f.tensor_mut(t).mesh = Some(mesh);
    }
    // a: DIDx on axis 1; b: DIDx on axis 1 after a Stream split of axis 0 (same DID
    // structure plus a stream axis); c: DIDx only.
    for t in [a, b, c] {
        split_on(&mut f, t, 1, Scalar::named("d"), ParallelType::DIDx);
    }
    split_on(&mut f, b, 0, Scalar::named("s"), ParallelType::Stream);
    let sf = seg_default(f);
    assert_eq!(sf.len(), 3, "{sf}");
}

#[test]
fn equal_structures_merge_regardless_of_axis_position() {
    let mut f = Fusion::new("same");
    let x = input(&mut f, "x");
    let a = unary(&mut f, "a", UnaryOp::Neg, x);
    let b = unary(&mut f, "b", UnaryOp::Abs, a);
    f.add_output(b).unwrap();
    stream_split(&mut f, a, 2);
    // b chunks the same axis, but its stream axis sits at loop position 1.
    stream_split(&mut f, b, 2);
    weave_transform::reorder(&mut f, b, DomainKind::Loop, &[(0, 1)]).unwrap();
    assert_eq!(
        f.id(f.tensor(b).loop_domain[1]).parallel,
        ParallelType::Stream
    );
    let sf = seg_default(f);
    assert_eq!(sf.len(), 1);
}

#[test]
fn stream_splits_of_unmapped_axes_are_never_merged() {
    // a = add(x, y) chunked by rows feeding r = sum(a, [0]) chunked by columns: the same
    // parallel signature (one Stream axis of 2), but one loop cannot chunk both.
    let mut f = Fusion::new("two_axes");
    let x = input(&mut f, "x");
    let y = input(&mut f, "y");
    let a = f.binary("a", BinaryOp::Add, x, y).unwrap();
    let r = f.sum("r", a, &[0]).unwrap();
    f.add_output(r).unwrap();
    stream_split(&mut f, a, 2);
    split_on(&mut f, r, 1, Scalar::c(2), ParallelType::Stream);
    assert!(crate::same_parallel_structure(&f, a, r));
    assert!(!crate::same_stream_axis(&f, &[a, r]));
    let sf = seg_default(f);
    insta::assert_snapshot!(sf.to_string(), @r"
    segment 0 (kernel): exprs [add] inputs (x, y) outputs (a)
    segment 1 (kernel): exprs [sum] inputs (a) outputs (r)
    ");
}

#[test]
fn sibling_merges_only_when_the_rule_asks() {
    let mut f = Fusion::new("siblings");
    let x = input(&mut f, "x");
    let w = input(&mut f, "w");
    let a = unary(&mut f, "a", UnaryOp::Neg, x);
    let b = unary(&mut f, "b", UnaryOp::Abs, x);
    // A third reader of x that depends on a through a library call: merging it with b is
    // fine, with a it would close a cycle.
    let m = f.matmul("m", a, w).unwrap();
    let c = f.binary("c", BinaryOp::Add, x, m).unwrap();
    for t in [b, c] {
        f.add_output(t).unwrap();
    }
    let plain = seg_default(f.clone());
    assert_eq!(plain.len(), 4);
    let sf = segment(f, &compute_kind, &DefaultMergeRule::with_siblings());
    verify(&sf).unwrap();
    insta::assert_snapshot!(sf.to_string(), @r"
    segment 0 (kernel): exprs [neg, abs] inputs (x) outputs (a, b)
    segment 1 (library): exprs [matmul] inputs (a, w) outputs (m)
    segment 2 (kernel): exprs [add] inputs (x, m) outputs (c)
    ");
}

#[test]
fn permute_and_reshape_stay_alone_under_the_default_rule() {
    let mut f = Fusion::new("views");
    let x = input(&mut f, "x");
    let a = unary(&mut f, "a", UnaryOp::Neg, x);
    let p = f
        .add_op("p", ExprKind::Permute { perm: vec![1, 0] }, &[a])
        .unwrap();
    let b = unary(&mut f, "b", UnaryOp::Abs, p);
    f.add_output(b).unwrap();
    let sf = seg_default(f);
    assert_eq!(sf.len(), 3);
    assert!(kinds(&sf).iter().all(|k| *k == Kernel));
}

#[test]
fn from_partition_builds_and_rejects() {
    let mut f = Fusion::new("manual");
    let x = input(&mut f, "x");
    let a = unary(&mut f, "a", UnaryOp::Neg, x);
    let m = f.matmul("m", a, a).unwrap();
    let c = f.binary("c", BinaryOp::Add, a, m).unwrap();
    f.add_output(c).unwrap();
    let (ea, em, ec) = (def(&f, a), def(&f, m), def(&f, c));

    let ok = SegmentedFusion::from_partition(
        f.clone(),
        vec![(Kernel, vec![ec]), (Library, vec![em]), (Kernel, vec![ea])],
    )
    .unwrap();
    assert_eq!(
        ok.to_string(),
        "segment 0 (kernel): exprs [neg] inputs (x) outputs (a)\n\
         segment 1 (library): exprs [matmul] inputs (a) outputs (m)\n\
         segment 2 (kernel): exprs [add] inputs (a, m) outputs (c)\n"
    );
    assert_eq!(ok.segment_of(em), Some(ok.run_order()[1]));

    let cyclic = SegmentedFusion::from_partition(
        f.clone(),
        vec![(Kernel, vec![ea, ec]), (Library, vec![em])],
    )
    .unwrap_err()
    .to_string();
    assert!(cyclic.contains("cycle"), "{cyclic}");

    let twice = SegmentedFusion::from_partition(
        f.clone(),
        vec![
            (Kernel, vec![ea, ec]),
            (Kernel, vec![ea]),
            (Library, vec![em]),
        ],
    )
    .unwrap_err()
    .to_string();
    assert!(twice.contains("two segments"), "{twice}");

    let missing = SegmentedFusion::from_partition(f.clone(), vec![(Kernel, vec![ea])])
        .unwrap_err()
        .to_string();
    assert!(missing.contains("in no segment"), "{missing}");

    let fat_library =
        SegmentedFusion::from_partition(f, vec![(Kernel, vec![ea]), (Library, vec![em, ec])])
            .unwrap_err()
            .to_string();
    assert!(fat_library.contains("exactly one"), "{fat_library}");
}

#[test]
fn empty_fusion_has_no_segments() {
    let mut f = Fusion::new("empty");
    let x = input(&mut f, "x");
    f.add_output(x).unwrap();
    let sf = seg_default(f);
    assert!(sf.is_empty());
    assert_eq!(sf.to_string(), "");
}
