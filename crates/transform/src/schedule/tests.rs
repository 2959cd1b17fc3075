//! Tests of the schedule primitives and `apply_schedules`: splits, merges, reorders,
//! parallelization rules and their error messages.

use super::*;
use crate::test_util::{devices, f32_input, loop_of, n, row_parallel_unscheduled};
use weave_ir::{DType, MemoryType, Span};

fn step(op: ScheduleOp) -> ScheduleStep {
    ScheduleStep {
        op,
        span: Some(Span::new(7, 3)),
    }
}

fn outer(axis: usize, factor: Scalar, p: Option<ParallelType>) -> ScheduleStep {
    step(ScheduleOp::OuterSplit {
        axis,
        factor,
        parallel: p,
    })
}

fn inner(axis: usize, factor: Scalar, p: Option<ParallelType>) -> ScheduleStep {
    step(ScheduleOp::InnerSplit {
        axis,
        factor,
        parallel: p,
    })
}

/// `t = 8192, h = 8192, d = 2, s = 4`, mesh `m = devices(d)`, `inp: bf16[t, 4 * h] on m`,
/// `w: bf16[h, 4 * h] on m`, `out = linear(inp, w)`.
fn row_parallel() -> (Fusion, TensorId, TensorId, TensorId) {
    let (mut f, inp, w, out) = row_parallel_unscheduled();
    f.add_output(out).unwrap();
    (f, inp, w, out)
}

fn render(f: &Fusion, ids: &[IterDomainId]) -> String {
    let v: Vec<String> = ids
        .iter()
        .map(|i| {
            let d = f.id(*i);
            format!(
                "{}{}{{{}}}",
                d.iter_type.prefix(),
                d.parallel.print_name(),
                d.extent
            )
        })
        .collect();
    format!("[{}]", v.join(", "))
}

fn apply_err(f: &mut Fusion) -> Diagnostic {
    apply_schedules(f).unwrap_err()
}

/// The error of [`row_parallel`] with `schedule` on its tensor `name` (`inp`, `w` or `out`).
fn row_parallel_err(name: &str, schedule: Vec<ScheduleStep>) -> Diagnostic {
    let (mut f, _, _, _) = row_parallel();
    let t = f.tensor_by_name(name).unwrap();
    f.tensor_mut(t).schedule = schedule;
    apply_err(&mut f)
}

#[test]
fn row_parallel_linear_schedules() {
    let (mut f, inp, w, out) = row_parallel();
    f.tensor_mut(inp).schedule = vec![
        outer(0, n("s"), Some(ParallelType::Stream)),
        outer(2, n("d"), Some(ParallelType::DIDx)),
    ];
    f.tensor_mut(w).schedule = vec![outer(1, n("d"), Some(ParallelType::DIDx))];
    apply_schedules(&mut f).unwrap();
    assert_eq!(
        loop_of(&f, inp),
        vec![
            (ParallelType::Stream, Scalar::c(4)),
            (ParallelType::Serial, n("t").ceil_div(Scalar::c(4))),
            (ParallelType::DIDx, Scalar::c(2)),
            (ParallelType::Serial, n("h").mul(4).ceil_div(Scalar::c(2))),
        ]
    );
    assert_eq!(
        loop_of(&f, w),
        vec![
            (ParallelType::Serial, n("h")),
            (ParallelType::DIDx, Scalar::c(2)),
            (ParallelType::Serial, n("h").mul(4).ceil_div(Scalar::c(2))),
        ]
    );
    // The output is untouched; its loop domain is its logical domain.
    assert_eq!(f.tensor(out).loop_domain, f.tensor(out).logical);
    // Evaluated with the parameters: [4, 2048, 2, 16384].
    let ev: Vec<i64> = loop_of(&f, inp)
        .iter()
        .map(|(_, e)| f.eval(e).unwrap())
        .collect();
    assert_eq!(ev, vec![4, 2048, 2, 16384]);
    insta::assert_snapshot!(
        render(&f, &f.tensor(inp).loop_domain),
        @"[istreamIdx{4}, iS{( ceilDiv(t, 4) )}, ideviceIdx.x{2}, iS{( 2 * h )}]"
    );
    insta::assert_snapshot!(
        render(&f, &f.tensor(out).loop_domain),
        @"[iS{t}, iS{h}, rS{( 4 * h )}]"
    );
}

#[test]
fn allocation_domain_splits_start_from_logical() {
    let (mut f, inp, _, _) = row_parallel();
    let (o, i) = split(
        &mut f,
        inp,
        DomainKind::Allocation,
        1,
        n("d"),
        SplitKind::Outer,
    )
    .unwrap();
    let l0 = f.tensor(inp).logical[0];
    assert_eq!(f.tensor(inp).allocation, Some(vec![l0, o, i]));
    assert_eq!(f.tensor(inp).loop_domain, f.tensor(inp).logical);
    reorder(&mut f, inp, DomainKind::Allocation, &[(1, 0)]).unwrap();
    assert_eq!(f.tensor(inp).allocation, Some(vec![o, l0, i]));
    let m = merge(&mut f, inp, DomainKind::Allocation, 1, 2).unwrap();
    assert_eq!(f.tensor(inp).allocation, Some(vec![o, m]));
    assert_eq!(f.id(m).extent, n("t").mul(n("h").mul(2)));
}

#[test]
fn allocation_as_loop_mesh_and_memory_steps() {
    let (mut f, inp, w, _) = row_parallel();
    let m2 = devices(&mut f, "m2", 2);
    f.tensor_mut(inp).schedule = vec![
        outer(0, n("s"), Some(ParallelType::Stream)),
        step(ScheduleOp::AllocationAsLoop),
        step(ScheduleOp::SetMemory(MemoryType::Symmetric)),
        step(ScheduleOp::SetMesh(m2)),
    ];
    f.tensor_mut(w).schedule = vec![step(ScheduleOp::Reorder {
        moves: vec![(0, 1)],
    })];
    apply_schedules(&mut f).unwrap();
    let tv = f.tensor(inp);
    assert_eq!(tv.allocation.as_ref(), Some(&tv.loop_domain));
    assert_eq!(tv.memory, MemoryType::Symmetric);
    assert_eq!(tv.mesh, Some(m2));
    let wl = f.tensor(w).logical.clone();
    assert_eq!(f.tensor(w).loop_domain, vec![wl[1], wl[0]]);
}

#[test]
fn axis_out_of_range() {
    let e = row_parallel_err(
        "inp",
        vec![outer(0, n("s"), None), outer(3, Scalar::c(2), None)],
    );
    assert_eq!(
        e.message,
        "schedule of `inp`: outer_split of axis 3, but the loop domain has 3 axes (0..2)"
    );
    assert_eq!(e.span, Some(Span::new(7, 3)));
}

#[test]
fn factor_without_value() {
    let (mut f, inp, _, _) = row_parallel();
    f.add_param("u", None).unwrap();
    f.tensor_mut(inp).schedule = vec![inner(0, n("u"), None)];
    assert_eq!(
        apply_err(&mut f).message,
        "schedule of `inp`: split factor `u` has no value"
    );
    assert_eq!(
        row_parallel_err("inp", vec![outer(0, n("s").sub(4), None)]).message,
        "schedule of `inp`: split factor `s - 4` = 0 must be positive"
    );
}

#[test]
fn inner_split_cannot_make_device_or_stream_axes() {
    let e = row_parallel_err(
        "inp",
        vec![inner(1, Scalar::c(4), Some(ParallelType::DIDx))],
    );
    assert_eq!(
            e.message,
            "schedule of `inp`: inner_split(1, 4) -> DIDx: device and stream axes must come from an outer split"
        );
    assert_eq!(e.span, Some(Span::new(7, 3)));
    assert_eq!(
            row_parallel_err("inp", vec![inner(0, n("s"), Some(ParallelType::Stream))]).message,
            "schedule of `inp`: inner_split(0, s) -> Stream: device and stream axes must come from an outer split"
        );
}

#[test]
fn device_split_needs_a_mesh() {
    let mut f = Fusion::new("nomesh");
    f.add_param("d", Some(2)).unwrap();
    let w = f32_input(&mut f, "w", vec![Scalar::c(4), Scalar::c(8)], None);
    f.tensor_mut(w).schedule = vec![outer(1, n("d"), Some(ParallelType::DIDx))];
    assert_eq!(
            apply_err(&mut f).message,
            "schedule of `w`: DIDx split needs a device mesh (declare the tensor `on m` or add `mesh = m`)"
        );
}

#[test]
fn device_split_factor_must_match_the_mesh() {
    assert_eq!(
        row_parallel_err("w", vec![outer(1, Scalar::c(4), Some(ParallelType::DIDx))]).message,
        "schedule of `w`: DIDx split factor `4` = 4, but mesh `m` has 2 devices along DIDx"
    );
    assert_eq!(
        row_parallel_err("w", vec![outer(1, n("d"), Some(ParallelType::DIDy))]).message,
        "schedule of `w`: DIDy split, but mesh `m` has shape [2] and no DIDy axis"
    );
}

#[test]
fn device_split_must_divide_a_known_extent() {
    let mut f = Fusion::new("ragged");
    let m = devices(&mut f, "m", 4);
    let w = f32_input(&mut f, "w", vec![Scalar::c(3), Scalar::c(6)], Some(m));
    f.tensor_mut(w).schedule = vec![outer(1, Scalar::c(4), Some(ParallelType::DIDx))];
    assert_eq!(
        apply_err(&mut f).message,
        "schedule of `w`: axis 1 has extent 6 (`6`), not divisible by 4 devices (DIDx)"
    );
}

#[test]
fn stream_splits_may_be_ragged() {
    let mut f = Fusion::new("ragged");
    let a = f32_input(&mut f, "a", vec![Scalar::c(10)], None);
    f.tensor_mut(a).schedule = vec![outer(0, Scalar::c(3), Some(ParallelType::Stream))];
    apply_schedules(&mut f).unwrap();
    assert_eq!(
        loop_of(&f, a),
        vec![
            (ParallelType::Stream, Scalar::c(3)),
            (ParallelType::Serial, Scalar::c(4))
        ]
    );
}

#[test]
fn parallelize_rules() {
    // An inner-split output cannot become DIDx.
    assert_eq!(
            row_parallel_err("inp", vec![
        outer(1, n("d"), None),
        step(ScheduleOp::Parallelize {
            axis: 2,
            parallel: ParallelType::DIDx,
        }),
    ]).message,
            "schedule of `inp`: parallelize(2, DIDx): axis 2 is the inner output of an outer split; device and stream axes must be an unsplit logical axis or the outer output of an outer split"
        );
    // The outer output of an inner split cannot either.
    assert_eq!(
            row_parallel_err("inp", vec![
        inner(0, Scalar::c(4), None),
        step(ScheduleOp::Parallelize {
            axis: 0,
            parallel: ParallelType::Stream,
        }),
    ]).message,
            "schedule of `inp`: parallelize(0, Stream): axis 0 is the outer output of an inner split; device and stream axes must be an unsplit logical axis or the outer output of an outer split"
        );
    // Nor a merge output.
    assert_eq!(
            row_parallel_err("inp", vec![
        step(ScheduleOp::Merge { outer: 0, inner: 1 }),
        step(ScheduleOp::Parallelize {
            axis: 0,
            parallel: ParallelType::Stream,
        }),
    ]).message,
            "schedule of `inp`: parallelize(0, Stream): axis 0 is the output of a merge; device and stream axes must be an unsplit logical axis or the outer output of an outer split"
        );
    // An unsplit logical axis may be Stream directly, and DIDx when its extent is the mesh size.
    let (mut f, inp, _, _) = row_parallel();
    parallelize(&mut f, inp, 0, ParallelType::Stream).unwrap();
    assert_eq!(
            parallelize(&mut f, inp, 1, ParallelType::DIDx)
                .unwrap_err()
                .message,
            "schedule of `inp`: axis 1 has extent 32768 (`4 * h`), but mesh `m` has 2 devices along DIDx"
        );
    assert_eq!(
        parallelize(&mut f, inp, 2, ParallelType::DIDx)
            .unwrap_err()
            .message,
        "schedule of `inp`: parallelize of axis 2, but the loop domain has 2 axes (0..1)"
    );
    parallelize(&mut f, inp, 0, ParallelType::Serial).unwrap();
}

#[test]
fn one_axis_per_parallel_type() {
    assert_eq!(
            row_parallel_err("inp", vec![
        outer(0, n("s"), Some(ParallelType::Stream)),
        outer(2, Scalar::c(2), Some(ParallelType::Stream)),
    ]).message,
            "schedule of `inp`: outer_split(2, 2) -> Stream: loop axis 0 is already Stream; a loop domain has at most one Stream axis"
        );
    // A reduction axis may carry DIDx beside an iteration DIDx axis (reduce-scatter).
    let (mut f, _, _, out) = row_parallel();
    let m = f.mesh_by_name("m").unwrap();
    f.tensor_mut(out).schedule = vec![
        step(ScheduleOp::SetMesh(m)),
        outer(2, n("d"), Some(ParallelType::DIDx)),
        outer(1, n("d"), Some(ParallelType::DIDx)),
    ];
    apply_schedules(&mut f).unwrap();
    let ps: Vec<ParallelType> = loop_of(&f, out).into_iter().map(|(p, _)| p).collect();
    assert_eq!(
        ps,
        vec![
            ParallelType::Serial,
            ParallelType::DIDx,
            ParallelType::Serial,
            ParallelType::DIDx,
            ParallelType::Serial
        ]
    );
}

#[test]
fn splitting_a_parallel_axis_is_an_error() {
    assert_eq!(
            row_parallel_err("inp", vec![
        outer(0, n("s"), Some(ParallelType::Stream)),
        outer(0, Scalar::c(2), None),
    ]).message,
            "schedule of `inp`: outer_split of axis 0, which is already parallelized as Stream (split before parallelizing)"
        );
}

#[test]
fn merge_rules() {
    assert_eq!(
        row_parallel_err("inp", vec![step(ScheduleOp::Merge { outer: 0, inner: 2 })]).message,
        "schedule of `inp`: merge(0, 2), but the loop domain has 2 axes (0..1)"
    );
    assert_eq!(
        row_parallel_err(
            "inp",
            vec![
                outer(0, n("s"), None),
                step(ScheduleOp::Merge { outer: 0, inner: 2 }),
            ]
        )
        .message,
        "schedule of `inp`: merge(0, 2): the inner axis must be the outer axis + 1"
    );
    assert_eq!(
        row_parallel_err("out", vec![step(ScheduleOp::Merge { outer: 1, inner: 2 })]).message,
        "schedule of `out`: merge(1, 2): cannot merge iteration axis 1 with reduction axis 2"
    );
    assert_eq!(
            row_parallel_err("inp", vec![
        outer(0, n("s"), Some(ParallelType::Stream)),
        step(ScheduleOp::Merge { outer: 0, inner: 1 }),
    ]).message,
            "schedule of `inp`: merge(0, 1): axis 0 is parallelized as Stream; device and stream axes cannot be merged"
        );
    let (mut f, inp, _, _) = row_parallel();
    f.tensor_mut(inp).schedule = vec![
        outer(0, n("s"), None),
        step(ScheduleOp::Merge { outer: 1, inner: 2 }),
    ];
    apply_schedules(&mut f).unwrap();
    assert_eq!(
        loop_of(&f, inp),
        vec![
            (ParallelType::Serial, Scalar::c(4)),
            (ParallelType::Serial, n("t").ceil_div(4).mul(n("h").mul(4))),
        ]
    );
}

#[test]
fn reorder_rules() {
    for (moves, message) in [
        (
            vec![(2, 0)],
            "schedule of `inp`: reorder(2 -> 0): axis 2 is out of range, the loop domain has 2 axes (0..1)",
        ),
        (
            vec![(0, 1), (0, 0)],
            "schedule of `inp`: reorder(0 -> 1, 0 -> 0): axis 0 is moved twice",
        ),
        (
            vec![(0, 1), (1, 1)],
            "schedule of `inp`: reorder(0 -> 1, 1 -> 1): two axes are moved to position 1",
        ),
    ] {
        let schedule = vec![step(ScheduleOp::Reorder { moves })];
        assert_eq!(row_parallel_err("inp", schedule).message, message);
    }
    // [a, b, c, d] with 3 -> 0, 0 -> 2 gives [d, b, a, c].
    let mut f = Fusion::new("r");
    let x = f
        .add_input("x", DType::F32, (1..=4).map(Scalar::c).collect(), None)
        .unwrap();
    reorder(&mut f, x, DomainKind::Loop, &[(3, 0), (0, 2)]).unwrap();
    let ext: Vec<Scalar> = loop_of(&f, x).into_iter().map(|(_, e)| e).collect();
    assert_eq!(ext, [4, 2, 1, 3].map(Scalar::c).to_vec());
}
