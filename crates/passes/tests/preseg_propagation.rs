//! `propagate-shardings` (reference §2.5, §10 #22): forward, backward, the reference order of
//! linear/matmul, fusion inputs (Stream only), user-sharded tensors and mesh inheritance.

mod preseg_util;

use preseg_util::*;
use weave_ir::IterType;
use weave_ir::ParallelType::{DIDx, Serial, Stream};
use weave_passes::propagate_shardings::PropagateShardings;
use weave_passes::Changed;

/// `out = op(x, y)` with `x: f32[t, k]` split on axis 0 and `y: f32[y_shape]` split on
/// `y_axis`, both over `d = 2` devices.
fn both_operands_split(
    name: &str,
    op: &str,
    [x, y]: [&str; 2],
    y_shape: &str,
    y_axis: usize,
) -> weave_ir::Fusion {
    load_src(&format!(
        "fusion {name}(t = 8, k = 4, n = 6, d = 2) {{
          mesh m = devices(d)
          tensor {x}: f32[t, k] on m
          tensor {y}: f32[{y_shape}] on m
          out = {op}({x}, {y})
          output out
          schedule {x} {{ outer_split(0, d) -> DIDx }}
          schedule {y} {{ outer_split({y_axis}, d) -> DIDx }}
        }}"
    ))
}

/// `a: f32[12]` split over `d` devices, then `r = reshape(a, [2, 6])`.
fn split_then_reshape(name: &str, d: i64) -> weave_ir::Fusion {
    load_src(&format!(
        "fusion {name}(d = {d}) {{
          mesh m = devices(d)
          tensor a: f32[12] on m
          r = reshape(a, [2, 6])
          output r
          schedule a {{ outer_split(0, d) -> DIDx }}
        }}"
    ))
}

/// `c = set(set(a))` stream- and device-split on `c`, with `b` user-scheduled (mesh only).
const BACK: &str = "fusion back(t = 8, n = 4, d = 2, s = 2) {
          mesh m = devices(d)
          tensor a: f32[t, n] on m
          b = set(a)
          c = set(b)
          output c
          schedule b { mesh = m }
          schedule c { mesh = m; outer_split(0, s) -> Stream; outer_split(2, d) -> DIDx }
        }";

#[test]
fn forward_stream_from_the_weight_reaches_the_matmul_output_axis_1() {
    // w.outer_split(1, 2) -> Stream  ==>  matmul(inp, w) has Stream on axis 1.
    let mut f = load("propagation_forward");
    assert_eq!(run(&mut f, &PropagateShardings), Changed::Yes);
    let out = t(&f, "out");
    assert_eq!(
        shape(&f, &f.tensor(out).loop_domain),
        vec![(Serial, 8), (Stream, 2), (Serial, 6), (Serial, 4)]
    );
    let k = f.tensor(out).loop_domain[3];
    assert_eq!(f.id(k).iter_type, IterType::Reduction);
    // inp shares no axis with the stream split: untouched.
    assert_eq!(loop_types(&f, "inp"), vec![Serial, Serial]);
    assert_eq!(run(&mut f, &PropagateShardings), Changed::No);
}

#[test]
fn backward_stream_from_the_output_reaches_every_input() {
    // tv2.outer_split(0, 2) -> Stream  ==>  tv0, tv1, tv2 all have Stream on axis 0.
    let mut f = load("propagation_backward");
    run(&mut f, &PropagateShardings);
    for name in ["tv0", "tv1", "tv2"] {
        let tv = f.tensor(t(&f, name));
        assert_eq!(
            shape(&f, &tv.loop_domain),
            vec![(Stream, 2), (Serial, 6), (Serial, 4)],
            "{name}"
        );
    }
    assert_eq!(run(&mut f, &PropagateShardings), Changed::No);
}

#[test]
fn linear_takes_the_weight_first_so_the_output_is_not_doubly_didx_sharded() {
    // inp sharded on M, w sharded on N: the output takes DIDx on N (from w) only.
    let mut f = both_operands_split("lin", "linear", ["inp", "w"], "n, k", 0);
    run(&mut f, &PropagateShardings);
    let out = t(&f, "out");
    assert_eq!(
        shape(&f, &f.tensor(out).loop_domain),
        vec![(Serial, 8), (DIDx, 2), (Serial, 3), (Serial, 4)]
    );
    assert_eq!(
        loop_types(&f, "out").iter().filter(|p| **p == DIDx).count(),
        1
    );
    // The same with matmul: B (the weight) first.
    let mut f = both_operands_split("mm", "matmul", ["a", "b"], "k, n", 1);
    run(&mut f, &PropagateShardings);
    assert_eq!(
        loop_shape(&f, "out"),
        vec![(Serial, 8), (DIDx, 2), (Serial, 3), (Serial, 4)]
    );
}

#[test]
fn row_parallel_linear_output_gets_stream_and_a_device_reduction_axis() {
    let mut f = load("row_parallel_linear");
    let m = f.tensor(t(&f, "inp")).mesh;
    assert_eq!(f.tensor(t(&f, "out")).mesh, None);
    run(&mut f, &PropagateShardings);
    let out = f.tensor(t(&f, "out"));
    assert_eq!(out.mesh, m, "a tensor without a mesh inherits one");
    assert_eq!(shape(&f, &out.loop_domain), ROW_PARALLEL_OUT_LOOP);
    let rdid = out.loop_domain[3];
    assert_eq!(f.id(rdid).iter_type, IterType::Reduction);
}

#[test]
fn fusion_inputs_receive_only_stream_and_user_sharded_tensors_keep_theirs() {
    let mut f = load_src(BACK);
    run(&mut f, &PropagateShardings);
    // b is user-sharded (replicated on purpose): untouched.
    assert_eq!(loop_types(&f, "b"), vec![Serial, Serial]);
    // A non-user intermediate takes everything: same fusion without b's schedule.
    let mut g = load_src(&BACK.replace("          schedule b { mesh = m }\n", ""));
    run(&mut g, &PropagateShardings);
    assert_eq!(loop_types(&g, "b"), vec![Stream, Serial, DIDx, Serial]);
    // The fusion input takes the Stream split but never the DIDx one.
    assert_eq!(loop_types(&g, "a"), vec![Stream, Serial, Serial]);
}

#[test]
fn every_fixture_propagates_verifies_and_is_idempotent() {
    for name in [
        "propagation_forward",
        "propagation_backward",
        "have_different_shardings",
        "sharded_allocation",
        "replicated_allocation",
        "row_parallel_linear",
        "column_parallel_linear",
        "matmul_rs",
        "matmul_ar",
        "matmul_ar_logical",
        "matmul_rs_through_bcast_logical",
        "rs_matmul",
        "ag_matmul",
        "stream_matmul",
        "two_matmuls_inlinable",
        "two_matmuls_not_inlinable",
    ] {
        let mut f = load(name);
        run(&mut f, &PropagateShardings);
        assert_eq!(run(&mut f, &PropagateShardings), Changed::No, "{name}");
    }
}

#[test]
fn shardings_cross_a_matmul_whose_batch_axes_broadcast() {
    // [S, D, m, k] x [D, k, n]: b's batch axis 0 is the output's batch axis 1 (right-aligned),
    // so b's DIDx lands on the output's axis 1, not on its stream axis 0.
    let mut f = load_src(
        "fusion mmb(s = 3, d = 2, m = 4, k = 6, n = 5) {
          mesh m = devices(d)
          tensor a: f32[s, d, m, k] on m
          tensor b: f32[d, k, n] on m
          c = matmul(a, b)
          output c
          schedule a { parallelize(0, Stream); parallelize(1, DIDx) }
          schedule b { parallelize(0, DIDx) }
        }",
    );
    run(&mut f, &PropagateShardings);
    assert_eq!(
        loop_types(&f, "c"),
        vec![Stream, DIDx, Serial, Serial, Serial]
    );
    // Backward through a broadcast batch axis: the broadcast axis of `bb` takes nothing from
    // the output's stream axis it stretches over, and `b` keeps its DIDx.
    let mut g = load("matmul_rs_through_bcast_logical");
    run(&mut g, &PropagateShardings);
    assert_eq!(
        loop_types(&g, "tv1b"),
        vec![Serial, DIDx, Serial, Serial, Serial]
    );
    assert_eq!(loop_types(&g, "tv1"), vec![DIDx, Serial, Serial]);
}

#[test]
fn stream_matmul_gives_the_weight_the_output_stream_split() {
    // §10 #24: out.outer_split(1, 3) -> Stream; w [7, 6] gets Stream on its n axis.
    let mut f = load("stream_matmul");
    run(&mut f, &PropagateShardings);
    assert_eq!(loop_types(&f, "w"), vec![Serial, Stream, Serial]);
    assert_eq!(loop_types(&f, "inp"), vec![Serial, Serial]);
}

#[test]
fn a_device_split_whose_shards_are_not_blocks_across_a_reshape_stays_on_its_side() {
    // a [12] split over 4 devices; r = reshape(a, [2, 6]): a shard of 3 elements is no block
    // of r's outer axis (extent 2, which 4 devices do not divide), so propagation leaves r
    // unsplit (before, it failed: "schedule of `r`: axis 0 has extent 2 (`2`), not divisible
    // by 4 devices (DIDx)"), and decompose-reshardings gathers `a` for the reshape.
    let mut f = split_then_reshape("ragged", 4);
    run(&mut f, &PropagateShardings);
    assert_eq!(loop_types(&f, "r"), vec![Serial, Serial]);
    assert_eq!(loop_types(&f, "a"), vec![DIDx, Serial]);
    // When 2 devices divide the outer axis, the split crosses the reshape as before.
    let mut g = split_then_reshape("even", 2);
    run(&mut g, &PropagateShardings);
    assert_eq!(loop_types(&g, "r"), vec![DIDx, Serial]);
}

/// A fusion pass takes a fusion by its type; a pipeline that puts it after lowering is
/// refused when it is parsed.
#[test]
fn fusion_passes_after_lowering_are_refused_by_the_pipeline() {
    let registry = weave_passes::Registry::standard();
    let err = weave_passes::Pipeline::parse("segment,lower-to-host,propagate-shardings", &registry)
        .unwrap_err();
    assert!(
        err.to_string().starts_with(
            "`propagate-shardings` runs on a fusion, but `lower-to-host` before it leaves a host program"
        ),
        "{err}"
    );
}
