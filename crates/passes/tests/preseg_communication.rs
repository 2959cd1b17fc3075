//! `derive_communication` (reference §4.2, §4.3): the collective, team and root of every
//! collective fixture, after propagate-shardings and decompose-reshardings.

mod preseg_util;

use preseg_util::*;
use weave_host_ir::CommunicationType::{self, *};
use weave_ir::{ExprId, Fusion, ParallelType, ReduceOp};
use weave_passes::communication::{
    derive_communication, CommunicationInfo, RootKind, TeamInstance,
};
use weave_passes::resharding::is_resharding;

/// The communications of `f`: every resharding expr, derived.
fn comms(f: &Fusion) -> Vec<(ExprId, CommunicationInfo)> {
    f.exprs()
        .iter()
        .filter(|e| is_resharding(f, **e))
        .map(|e| (*e, derive_communication(f, *e).expect("derivable")))
        .collect()
}

/// Loads `name`, decomposes it, and returns its only communication.
fn only_comm(name: &str) -> (Fusion, CommunicationInfo) {
    let mut f = load(name);
    run_until(&mut f, "decompose-reshardings");
    let mut c = comms(&f);
    assert_eq!(c.len(), 1, "{name}:\n{}", show(&f));
    let (_, info) = c.pop().expect("one");
    (f, info)
}

fn member(index: usize, device: i64) -> Option<RootKind> {
    Some(RootKind::Member { index, device })
}

fn check(
    name: &str,
    kind: CommunicationType,
    team: &[i64],
    root: Option<RootKind>,
    red: Option<ReduceOp>,
) -> (Fusion, CommunicationInfo) {
    let (f, info) = only_comm(name);
    assert_eq!(info.kind, kind, "{name}");
    assert_eq!(info.team, team, "{name}");
    assert_eq!(info.root, root, "{name}");
    assert_eq!(info.red_op, red, "{name}");
    assert_eq!(kind.has_root(), info.root.is_some(), "{name}");
    (f, info)
}

#[test]
fn allgather() {
    let (f, info) = check("allgather", Allgather, &[0, 1], None, None);
    assert_eq!(info.parallel, Some(ParallelType::DIDx));
    let inp = t(&f, "inp");
    assert_eq!(info.producer_axis.map(|a| a.axis), Some(Some(0)));
    assert_eq!(
        info.producer_axis.map(|a| a.id),
        Some(f.tensor(inp).logical[0])
    );
    assert_eq!(info.consumer_axis.map(|a| a.axis), Some(Some(0)));
    check("allgather_loop_split", Allgather, &[0, 1], None, None);
}

#[test]
fn broadcast_between_meshes() {
    let (_, info) = check("broadcast", Broadcast, &[0, 1], member(0, 0), None);
    assert_eq!(info.parallel, None);
}

#[test]
fn reduce_allreduce_and_reduce_scatter() {
    check("reduce", Reduce, &[0, 1], member(0, 0), Some(ReduceOp::Sum));
    let (f, info) = check("allreduce", Allreduce, &[0, 1], None, Some(ReduceOp::Sum));
    // The reduced consumer axis is a reduction: no tensor axis.
    assert_eq!(info.consumer_axis.map(|a| a.axis), Some(None));
    assert_eq!(info.producer_axis.map(|a| a.axis), Some(Some(0)));
    assert_eq!(f.exprs().len(), 1);
    // The DID-split reduction is rfactored: a local sum, then the ReduceScatter.
    let (f, info) = check(
        "reduce_scatter",
        ReduceScatter,
        &[0, 1],
        None,
        Some(ReduceOp::Sum),
    );
    assert_eq!(f.exprs().len(), 2);
    assert_eq!(info.consumer_axis.map(|a| a.axis), Some(Some(0)));
    check(
        "reduce_scatter_logical",
        ReduceScatter,
        &[0, 1],
        None,
        Some(ReduceOp::Sum),
    );
}

#[test]
fn all_to_all() {
    for name in ["all_to_all_dispatch", "all_to_all_combine"] {
        let (_, info) = check(name, AllToAll, &[0, 1], None, None);
        assert_ne!(
            info.producer_axis.map(|a| a.axis),
            info.consumer_axis.map(|a| a.axis),
            "{name}: different axes"
        );
    }
}

#[test]
fn gather_scatter_send_recv() {
    check("gather", Gather, &[0, 1], member(0, 0), None);
    check("scatter", Scatter, &[0, 1], member(0, 0), None);
    let (_, info) = check("send_recv", SendRecv, &[0, 1], member(0, 0), None);
    assert_eq!(
        info.instances,
        vec![
            TeamInstance {
                team: vec![0, 1],
                root: member(0, 0)
            },
            TeamInstance {
                team: vec![1, 0],
                root: member(0, 1)
            },
        ]
    );
}

#[test]
fn stream_parallel_collectives() {
    check("stream_allgather", Allgather, &[0, 1], None, None);
    check(
        "stream_allreduce",
        Allreduce,
        &[0, 1],
        None,
        Some(ReduceOp::Sum),
    );
    check(
        "stream_reduce_scatter",
        ReduceScatter,
        &[0, 1],
        None,
        Some(ReduceOp::Sum),
    );
    // DID -> Stream on the same axis: iteration i broadcasts device i's shard.
    let (_, info) = check(
        "allgather_p2p",
        Broadcast,
        &[0, 1],
        Some(RootKind::StreamIndex),
        None,
    );
    assert_eq!(info.consumer_axis.map(|a| a.axis), Some(Some(0)));
    check(
        "column_parallel_linear",
        Broadcast,
        &[0, 1],
        Some(RootKind::StreamIndex),
        None,
    );
    // AG + matmul: a set is inserted before the matmul, and it is the Allgather.
    let (f, _) = check("ag_matmul", Allgather, &[0, 1], None, None);
    assert_eq!(f.exprs().len(), 2);
}

#[test]
fn rfactored_linear_and_matmul_end_in_one_collective() {
    // Row-parallel linear: linear -> partial (local), then sum over DIDx: an Allreduce.
    let (f, info) = check(
        "row_parallel_linear",
        Allreduce,
        &[0, 1],
        None,
        Some(ReduceOp::Sum),
    );
    let ops: Vec<&str> = f
        .exprs()
        .iter()
        .map(|e| f.expr(*e).kind.op_name())
        .collect();
    assert_eq!(ops, ["linear", "sum"]);
    assert_eq!(info.producer_axis.map(|a| a.axis), Some(Some(2)));
    check("matmul_ar", Allreduce, &[0, 1], None, Some(ReduceOp::Sum));
    let (_, info) = check(
        "matmul_rs",
        ReduceScatter,
        &[0, 1],
        None,
        Some(ReduceOp::Sum),
    );
    // The scattered axis is the token axis (0) on both sides.
    assert_eq!(info.consumer_axis.map(|a| a.axis), Some(Some(0)));
    assert_eq!(info.producer_axis.map(|a| a.axis), Some(Some(0)));
}

#[test]
fn teams_follow_the_mesh_size() {
    for d in [1, 3, 4] {
        let path = format!(
            "{}/../../tests/scenarios/allgather.weave",
            env!("CARGO_MANIFEST_DIR")
        );
        let src = std::fs::read_to_string(path).expect("fixture");
        let mut f = weave_ir::text::parse(&src, &[("d".to_string(), d)]).expect("parses");
        weave_transform::schedule::apply_schedules(&mut f).expect("applies");
        run_until(&mut f, "decompose-reshardings");
        let c = comms(&f);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].1.team, (0..d).collect::<Vec<_>>());
    }
}

#[test]
fn two_dimensional_meshes_give_one_team_per_slice() {
    let mut f = load_src(
        "fusion ag2(n = 8) {
          mesh m = devices(2, 3)
          tensor inp: f32[4, 6 * n] on m
          out = set(inp)
          output out
          schedule inp { outer_split(1, 3) -> DIDx; outer_split(0, 2) -> DIDy }
          schedule out { mesh = m; outer_split(0, 2) -> DIDy }
        }",
    );
    run_until(&mut f, "decompose-reshardings");
    let c = comms(&f);
    assert_eq!(c.len(), 1);
    let info = &c[0].1;
    assert_eq!(info.kind, Allgather);
    assert_eq!(info.parallel, Some(ParallelType::DIDx));
    let teams: Vec<Vec<i64>> = info.instances.iter().map(|i| i.team.clone()).collect();
    assert_eq!(teams, vec![vec![0, 1, 2], vec![3, 4, 5]]);
    assert_eq!(
        info.instance_for(4).map(|i| i.team.clone()),
        Some(vec![3, 4, 5])
    );
}
