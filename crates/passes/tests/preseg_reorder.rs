//! `reorder-sharded-axis` (reference §4.2, layout compliance): gathers and scatters on an inner
//! axis are wrapped in permutes so that the collective runs on an outermost axis.

mod preseg_util;

use preseg_util::*;
use weave_host_ir::CommunicationType;
use weave_ir::{ExprKind, Fusion, ParallelType::*};
use weave_passes::communication::derive_communication;
use weave_passes::reorder_sharded_axis::{is_layout_compliant, ReorderShardedAxis};
use weave_passes::resharding::is_resharding;
use weave_passes::Changed;

fn ops(f: &Fusion) -> Vec<String> {
    f.exprs()
        .iter()
        .map(|e| match &f.expr(*e).kind {
            ExprKind::Permute { perm } => format!("permute{perm:?}"),
            k => k.op_name().to_string(),
        })
        .collect()
}

/// The one communication of `f`, its kind, and whether both of its sides are compliant.
fn the_comm(f: &Fusion) -> (CommunicationType, bool) {
    let comms: Vec<_> = f.exprs().iter().filter(|e| is_resharding(f, **e)).collect();
    assert_eq!(comms.len(), 1, "{}", show(f));
    let e = *comms[0];
    let info = derive_communication(f, e).expect("a communication");
    let (x, y) = (f.expr(e).inputs[0], f.expr(e).outputs[0]);
    let ok = is_layout_compliant(f, x, info.producer_axis.expect("axis").id)
        && is_layout_compliant(f, y, info.consumer_axis.expect("axis").id);
    (info.kind, ok)
}

#[test]
fn an_inner_allgather_is_wrapped_in_permutes() {
    let mut f = load_src(INNER_ALLGATHER);
    run_until(&mut f, "decompose-reshardings");
    assert_eq!(the_comm(&f), (CommunicationType::Allgather, false));
    assert_eq!(run(&mut f, &ReorderShardedAxis), Changed::Yes);
    assert_eq!(ops(&f), ["permute[1, 0]", "set", "permute[1, 0]"]);
    assert_eq!(the_comm(&f), (CommunicationType::Allgather, true));
    // The permuted input keeps the sharding, now on its axis 0.
    assert_eq!(loop_types(&f, "inp_reordered"), vec![DIDx, Serial, Serial]);
    assert_eq!(loop_types(&f, "out_reordered"), vec![Serial, Serial]);
    // out keeps its id and domains; only its definition changed.
    assert_eq!(f.outputs(), [t(&f, "out")]);
    assert_eq!(run(&mut f, &ReorderShardedAxis), Changed::No);
}

#[test]
fn an_inner_reduce_scatter_is_wrapped_in_permutes() {
    let mut f = load_src(INNER_REDUCE_SCATTER);
    run_until(&mut f, "decompose-reshardings");
    assert_eq!(the_comm(&f), (CommunicationType::ReduceScatter, false));
    run(&mut f, &ReorderShardedAxis);
    assert_eq!(ops(&f), ["permute[2, 0, 1]", "sum", "permute[1, 0]"]);
    assert_eq!(the_comm(&f), (CommunicationType::ReduceScatter, true));
    // out lost its reduction axis to the new sum; its scattered axis is still axis 1.
    assert_eq!(loop_types(&f, "out"), vec![Serial, DIDx]);
    assert_eq!(run(&mut f, &ReorderShardedAxis), Changed::No);
}

#[test]
fn compliant_fixtures_are_left_alone() {
    for name in [
        "allgather",
        "allgather_loop_split",
        "gather",
        "scatter",
        "reduce_scatter",
        "reduce_scatter_logical",
        "stream_allgather",
        "stream_reduce_scatter",
        "matmul_rs",
        "ag_matmul",
    ] {
        let mut f = load(name);
        run_until(&mut f, "decompose-reshardings");
        assert_eq!(run(&mut f, &ReorderShardedAxis), Changed::No, "{name}");
    }
}
