//! Fusion builders and schedule-step helpers shared by the unit tests of this crate.

use weave_ir::{
    DType, ExprKind, Fusion, MeshId, MeshSpec, ParallelType, Scalar, ScheduleOp, ScheduleStep,
    TensorId,
};

/// The named parameter `s` as an extent.
pub(crate) fn n(s: &str) -> Scalar {
    Scalar::named(s)
}

/// `outer_split(axis, factor) [-> p]`, with no source span.
pub(crate) fn outer(axis: usize, factor: Scalar, p: Option<ParallelType>) -> ScheduleStep {
    ScheduleStep {
        op: ScheduleOp::OuterSplit {
            axis,
            factor,
            parallel: p,
        },
        span: None,
    }
}

/// The parallel type and extent of every loop axis of `t`.
pub(crate) fn loop_of(f: &Fusion, t: TensorId) -> Vec<(ParallelType, Scalar)> {
    f.tensor(t)
        .loop_domain
        .iter()
        .map(|i| (f.id(*i).parallel, f.id(*i).extent.clone()))
        .collect()
}

/// A one-axis mesh `name = devices(k)`.
pub(crate) fn devices(f: &mut Fusion, name: &str, k: i64) -> MeshId {
    f.add_mesh(name, MeshSpec::Devices(vec![Scalar::c(k)]))
        .unwrap()
}

/// An f32 input `name` of the given sizes, on `mesh` when given.
pub(crate) fn f32_input(
    f: &mut Fusion,
    name: &str,
    sizes: Vec<Scalar>,
    mesh: Option<MeshId>,
) -> TensorId {
    f.add_input(name, DType::F32, sizes, mesh).unwrap()
}

/// `name = reshape(a, shape)`.
pub(crate) fn reshape(f: &mut Fusion, name: &str, a: TensorId, shape: Vec<Scalar>) -> TensorId {
    f.add_op(name, ExprKind::Reshape { shape }, &[a]).unwrap()
}

/// `t = 8192, h = 8192, d = 2, s = 4`, mesh `m = devices(d)`, `inp: bf16[t, 4 * h] on m`,
/// `w: bf16[h, 4 * h] on m`, `out = linear(inp, w)`; nothing scheduled, no output marked.
pub(crate) fn row_parallel_unscheduled() -> (Fusion, TensorId, TensorId, TensorId) {
    let mut f = Fusion::new("row_parallel_linear");
    for (p, v) in [("t", 8192), ("h", 8192), ("d", 2), ("s", 4)] {
        f.add_param(p, Some(v)).unwrap();
    }
    let m = f.add_mesh("m", MeshSpec::Devices(vec![n("d")])).unwrap();
    let inp = f
        .add_input("inp", DType::BF16, vec![n("t"), n("h").mul(4)], Some(m))
        .unwrap();
    let w = f
        .add_input("w", DType::BF16, vec![n("h"), n("h").mul(4)], Some(m))
        .unwrap();
    let out = f.linear("out", inp, w, None).unwrap();
    (f, inp, w, out)
}

/// Outer-splits loop axis `axis` of `t` by `factor` and parallelizes the outer part on `pt`.
pub(crate) fn split_on(f: &mut Fusion, t: TensorId, axis: usize, factor: Scalar, pt: ParallelType) {
    crate::schedule::split(
        f,
        t,
        crate::DomainKind::Loop,
        axis,
        factor,
        weave_ir::SplitKind::Outer,
    )
    .unwrap();
    crate::schedule::parallelize(f, t, axis, pt).unwrap();
}

/// Splits loop axis `axis` of `t` by `factor`; returns `(outer, inner)`.
pub(crate) fn loop_split(
    f: &mut Fusion,
    t: TensorId,
    axis: usize,
    factor: Scalar,
    kind: weave_ir::SplitKind,
) -> (weave_ir::IterDomainId, weave_ir::IterDomainId) {
    crate::schedule::split(f, t, crate::DomainKind::Loop, axis, factor, kind).unwrap()
}
