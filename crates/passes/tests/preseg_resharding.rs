//! `have_different_shardings` / `is_resharding` (reference §2.6, §10 #22): the truth table of
//! nvFuser's `StreamTest.HaveDifferentShardings` and the device cases around it.

mod preseg_util;

use preseg_util::*;
use weave_ir::{Fusion, ParallelType};
use weave_passes::resharding::{
    have_different_shardings, is_resharding, is_stream_resharding, DEVICE_TYPES,
};
use weave_transform::DomainKind::{Allocation, Loop};

const STREAM: &[ParallelType] = &[ParallelType::Stream];

fn differ(f: &Fusion, p: &str, c: &str, types: &[ParallelType]) -> bool {
    have_different_shardings(f, t(f, p), Loop, t(f, c), Loop, types)
}

fn def(f: &Fusion, name: &str) -> weave_ir::ExprId {
    f.tensor(t(f, name)).definition.expect("defined")
}

#[test]
fn stream_truth_table_of_the_fixture() {
    // tv1 [s, x/s, y] -> tv2 [s, x/s, y]: same; tv2 -> tv3 [x, s, y/s]: different.
    let f = load("have_different_shardings");
    assert!(!differ(&f, "tv1", "tv2", STREAM));
    assert!(differ(&f, "tv2", "tv3", STREAM));
    // tv0 is unsharded, tv1 stream-split: one side only.
    assert!(differ(&f, "tv0", "tv1", STREAM));
    // No mesh and no Stream requested: nothing is sharded.
    assert!(!differ(&f, "tv2", "tv3", &DEVICE_TYPES));
    // A stream change alone is not resharding.
    assert!(!is_resharding(&f, def(&f, "tv3")));
    assert!(is_stream_resharding(&f, def(&f, "tv3")));
    assert!(!is_stream_resharding(&f, def(&f, "tv2")));
}

#[test]
fn stream_truth_table_holds_for_other_sizes_and_ragged_chunks() {
    for (x, y, s) in [(8, 8, 4), (10, 6, 3)] {
        let src = format!(
            "fusion h(x = {x}, y = {y}, s = {s}) {{
              tensor tv0: f32[x, y]
              tv1 = set(tv0)
              tv2 = set(tv1)
              tv3 = set(tv2)
              output tv2, tv3
              schedule tv1 {{ outer_split(0, s) -> Stream }}
              schedule tv2 {{ outer_split(0, s) -> Stream }}
              schedule tv3 {{ outer_split(1, s) -> Stream }}
            }}"
        );
        let f = load_src(&src);
        assert!(!differ(&f, "tv1", "tv2", STREAM), "{x} {y} {s}");
        assert!(differ(&f, "tv2", "tv3", STREAM), "{x} {y} {s}");
    }
    // One chunk on either axis is the same (every index divides to 0): not different.
    let f = load_src(
        "fusion one(x = 12, y = 12, s = 1) {
          tensor tv0: f32[x, y]
          tv1 = set(tv0)
          output tv1
          schedule tv0 { outer_split(0, s) -> Stream }
          schedule tv1 { outer_split(1, s) -> Stream }
        }",
    );
    assert!(!differ(&f, "tv0", "tv1", STREAM));
}

#[test]
fn device_truth_table() {
    // iDIDx -> replicated: Allgather.
    let f = load("allgather");
    assert!(differ(&f, "inp", "out", &DEVICE_TYPES));
    assert!(is_resharding(&f, def(&f, "out")));
    // A DIDx loop split -> the same split left serial.
    let f = load("allgather_loop_split");
    assert!(differ(&f, "inp", "out", &[ParallelType::DIDx]));
    assert!(!differ(&f, "inp", "out", &[ParallelType::DIDy]));
    // Sharded on different axes.
    let f = load("all_to_all_dispatch");
    assert!(differ(&f, "inp", "out", &DEVICE_TYPES));
    // iDIDx -> rDIDx counts as resharding (a reduction axis is replicated).
    let f = load("allreduce");
    assert!(differ(&f, "inp", "out", &DEVICE_TYPES));
    // Different meshes with a device type requested: always resharding, even unsharded.
    let f = load("broadcast");
    assert!(differ(&f, "inp", "out", &DEVICE_TYPES));
    // ... but not when only Stream is asked for.
    assert!(!differ(&f, "inp", "out", STREAM));
    // The same axis on different meshes.
    let f = load("send_recv");
    assert!(differ(&f, "inp", "out", &DEVICE_TYPES));
}

#[test]
fn equal_device_shardings_are_proved_through_splits_reshapes_and_merges() {
    // Identical loop splits on both sides of a set.
    let f = load_src(&one_op(
        "        ",
        ["same(d = 2, n = 6)", "devices(d)"],
        ["a", "d * n, 3"],
        ["b", "set(a)"],
        [
            "outer_split(0, d) -> DIDx",
            "mesh = m; outer_split(0, d) -> DIDx",
        ],
    ));
    assert!(!differ(&f, "a", "b", &DEVICE_TYPES));
    assert!(!is_resharding(&f, def(&f, "b")));
    // A loop split of [d * n] against a reshape to [d, n] sharded on its logical axis 0:
    // (x / n) == (x / ceilDiv(d * n, d)).
    let f = load_src(&one_op(
        "        ",
        ["split_reshape(d = 2, n = 6)", "devices(d)"],
        ["a", "d * n"],
        ["r", "reshape(a, [d, n])"],
        [
            "outer_split(0, d) -> DIDx",
            "mesh = m; parallelize(0, DIDx)",
        ],
    ));
    assert!(!differ(&f, "a", "r", &DEVICE_TYPES));
    // A logical axis 0 of [d, n] against a merge to [d * n] split by d:
    // (x0 * n + x1) / n == x0 because x1 < n.
    let f = load_src(&one_op(
        "        ",
        ["merge_reshape(d = 2, n = 6)", "devices(d)"],
        ["a", "d, n"],
        ["r", "reshape(a, [d * n])"],
        [
            "parallelize(0, DIDx)",
            "mesh = m; outer_split(0, d) -> DIDx",
        ],
    ));
    assert!(!differ(&f, "a", "r", &DEVICE_TYPES));
    // The same merge split by another factor cannot be proved equal.
    let f = load_src(&one_op(
        "        ",
        ["merge_reshape_other(d = 2, n = 6)", "devices(d)"],
        ["a", "d, n"],
        ["r", "reshape(a, [d * n])"],
        [
            "parallelize(0, DIDx)",
            "mesh = m; outer_split(0, d) ; outer_split(1, d) -> DIDx",
        ],
    ));
    assert!(differ(&f, "a", "r", &DEVICE_TYPES));
}

#[test]
fn only_axes_the_producer_maps_are_compared() {
    // linear(ag, w): the output's DIDx is on n, which ag does not map; w shares it.
    let mut f = load("column_parallel_linear");
    run_until(&mut f, "propagate-shardings");
    let out = def(&f, "out");
    assert!(!differ(&f, "ag", "out", &DEVICE_TYPES));
    assert!(!differ(&f, "w", "out", &DEVICE_TYPES));
    assert!(!is_resharding(&f, out));
    assert!(!differ(&f, "ag", "out", STREAM));
    // ag = set(inp) is the DID -> Stream communication.
    assert!(is_resharding(&f, def(&f, "ag")));
}

#[test]
fn domains_are_selectable() {
    // After finalize, the DIDx split of inp is in its allocation as well as its loop.
    let mut f = load("row_parallel_linear");
    preseg(&mut f);
    let inp = t(&f, "inp");
    assert!(!have_different_shardings(
        &f,
        inp,
        Allocation,
        inp,
        Loop,
        &DEVICE_TYPES
    ));
    // inp's stream split is not in its allocation (a fusion input): its allocation is not
    // stream-sharded like its loop.
    assert!(have_different_shardings(
        &f, inp, Allocation, inp, Loop, STREAM
    ));
    // The partial is allocated per stream chunk, like its loop.
    let partial = t(&f, "out_partial");
    assert!(!have_different_shardings(
        &f, partial, Allocation, partial, Loop, STREAM
    ));
}
