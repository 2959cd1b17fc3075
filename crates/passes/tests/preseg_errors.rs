//! Refusals with exact messages (a ReduceScatter across meshes, exprs that are not
//! communications), and two sharding changes in one set, which become one set per change.

mod preseg_util;

use preseg_util::*;
use weave_passes::communication::derive_communication;
use weave_passes::decompose_reshardings::DecomposeReshardings;
use weave_passes::propagate_shardings::PropagateShardings;
use weave_passes::PassError;

fn decompose_err(src: &str) -> (String, Option<weave_ir::Span>) {
    let mut f = load_src(src);
    run(&mut f, &PropagateShardings);
    let before = show(&f);
    match try_run(&mut f, &DecomposeReshardings) {
        Err(PassError::Unsupported { pass, diagnostic }) => {
            assert_eq!(pass, "decompose-reshardings");
            assert_eq!(show(&f), before, "the fusion is left as it was");
            (diagnostic.message, diagnostic.span)
        }
        other => panic!("expected an error, got {other:?}\n{}", show(&f)),
    }
}

/// The collectives of the resharding exprs after `decompose-reshardings`, in program order.
fn collectives_after_decompose(src: &str) -> Vec<weave_host_ir::CommunicationType> {
    let mut f = load_src(src);
    run(&mut f, &PropagateShardings);
    run(&mut f, &DecomposeReshardings);
    f.exprs()
        .iter()
        .filter(|e| weave_passes::resharding::is_resharding(&f, **e))
        .map(|e| {
            derive_communication(&f, *e)
                .expect("one communication")
                .kind
        })
        .collect()
}

#[test]
fn two_sharding_changes_in_one_set_become_one_set_per_change() {
    use weave_host_ir::CommunicationType::*;
    // DIDx leaves axis 0 and DIDy arrives on axis 1 in the same set: the analysis refuses
    // the set as it is written ...
    let src = one_op(
        "    ",
        ["two(n = 4)", "devices(2, 2)"],
        ["inp", "4, 4 * n"],
        ["out", "set(inp)"],
        [
            "outer_split(0, 2) -> DIDx",
            "mesh = m; outer_split(1, 2) -> DIDy",
        ],
    );
    let f = load_src(&src);
    let e = f.tensor(t(&f, "out")).definition.expect("defined");
    assert_eq!(
        derive_communication(&f, e).unwrap_err().message,
        "expected at most one sharding change in `out = set(inp)`: DIDx and DIDy both change"
    );
    // ... and the pass makes it two: gather over DIDx, then scatter over DIDy.
    assert_eq!(collectives_after_decompose(&src), vec![Allgather, Scatter]);
    // The same for the set inserted before a pointwise op.
    let src = one_op(
        "    ",
        ["two(n = 4)", "devices(2, 2)"],
        ["a", "4, 4 * n"],
        ["b", "neg(a)"],
        [
            "outer_split(0, 2) -> DIDx",
            "mesh = m; outer_split(1, 2) -> DIDy",
        ],
    );
    assert_eq!(collectives_after_decompose(&src), vec![Allgather, Scatter]);
    // Swapping the DIDx and DIDy axes: the DIDy split cannot move onto the DIDx axis while
    // that is still split, so DIDx is gathered first.
    let src = one_op(
        "    ",
        ["swap(n = 4)", "devices(2, 2)"],
        ["a", "4, 4 * n"],
        ["b", "set(a)"],
        [
            "outer_split(0, 2) -> DIDx; outer_split(2, 2) -> DIDy",
            "mesh = m; outer_split(0, 2) -> DIDy; outer_split(2, 2) -> DIDx",
        ],
    );
    assert_eq!(
        collectives_after_decompose(&src),
        vec![Allgather, AllToAll, Scatter]
    );
}

#[test]
fn reduce_scatter_across_meshes_is_refused() {
    let (msg, _) = decompose_err(
        "fusion rs(n = 8) {
          mesh m = devices(2)
          mesh o = [2, 3]
          tensor inp: f32[2, 2, n] on m
          out = sum(inp, [0])
          output out
          schedule inp { parallelize(0, DIDx) }
          schedule out { mesh = o; parallelize(1, DIDx) }
        }",
    );
    assert_eq!(
        msg,
        "ReduceScatter needs the same mesh on both sides of `out = sum(inp)`, got DeviceMesh{0 1} and DeviceMesh{2 3}: insert a set before or after the reduction to reshard to another device mesh"
    );
}

#[test]
fn compute_exprs_are_not_communications() {
    let mut f = load("row_parallel_linear");
    run_until(&mut f, "decompose-reshardings");
    let partial = f.tensor(t(&f, "out_partial")).definition.expect("defined");
    assert_eq!(
        derive_communication(&f, partial).unwrap_err().message,
        "`out_partial = linear(inp, w)` cannot be a communication: only set, sum, max and squeeze can"
    );
    let f = load("have_different_shardings");
    let e = f.tensor(t(&f, "tv2")).definition.expect("defined");
    assert_eq!(
        derive_communication(&f, e).unwrap_err().message,
        "`tv2 = set(tv1)`: `tv1` has no device mesh (run propagate-shardings first)"
    );
}

#[test]
fn a_did_to_stream_set_whose_splits_do_not_nest_gathers_first() {
    use weave_host_ir::CommunicationType::*;
    // inp is split over 2 devices, ag over 3 stream chunks of the same axis: a chunk would
    // straddle two shards unevenly (factors that nest, 4 chunks of 2 shards or 1 of 2, are
    // broadcast piece by piece). No one communication is that copy ...
    let src = one_op(
        "        ",
        ["cpl(t = 12, h = 4, d = 2, s = 3)", "devices(d)"],
        ["inp", "t, h"],
        ["ag", "set(inp)"],
        [
            "outer_split(0, d) -> DIDx",
            "mesh = m; outer_split(0, s) -> Stream",
        ],
    );
    let f = load_src(&src);
    let e = f.tensor(t(&f, "ag")).definition.expect("defined");
    assert_eq!(
        derive_communication(&f, e).unwrap_err().message,
        "a DID → Stream set needs the stream split of `ag` to match the DIDx split of `inp` in `ag = set(inp)`, or both to be outer splits of the axis by factors that divide it and one of which divides the other"
    );
    // ... so decompose-reshardings gathers `inp` whole first; the chunks are local copies.
    assert_eq!(collectives_after_decompose(&src), vec![Allgather]);
}

#[test]
fn a_meshless_output_of_a_sharded_operand_is_named_in_the_error() {
    // Without propagate-shardings `a` keeps no mesh; the error names the user's expr and
    // tensors (never the copy decompose-reshardings would insert) at the expr.
    let src = one_op(
        "",
        ["meshless(t = 8, h = 2, s = 2, d = 2)", "devices(d)"],
        ["x", "t, h"],
        ["a", "neg(x)"],
        ["outer_split(1, d) -> DIDx", "outer_split(0, s) -> Stream"],
    );
    let mut f = load_src(&src);
    match try_run(&mut f, &DecomposeReshardings) {
        Err(PassError::Unsupported { diagnostic, .. }) => {
            assert_eq!(
                diagnostic.message,
                "`a = neg(x)`: `a` has no device mesh while its operand `x` is sharded across devices; give `a` a mesh (`mesh = …` in its schedule)"
            );
            assert_eq!(diagnostic.span.map(|s| s.line), Some(4));
        }
        other => panic!("expected an error, got {other:?}"),
    }
    // With propagation, `a` receives the mesh and x's DIDx, and nothing is refused.
    let mut f = load_src(&src);
    run(&mut f, &PropagateShardings);
    run(&mut f, &DecomposeReshardings);
}
