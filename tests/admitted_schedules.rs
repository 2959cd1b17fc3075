//! Schedules the format's rules admit, written from docs/fusion-format.md: each either runs
//! on the CPU backend and matches the f64 reference on 1–4 ranks, or is refused at load with
//! file:line:col, the user's tensor and axis, and what to write instead (issue 28, "Schedules
//! the format admits, refused late or ignored"; docs/passes.md, "Known gaps and refusals").

mod common;

use streamweave::host_ir::{self, HostProgram};

fn ov(overrides: &[(&str, i64)]) -> Vec<(String, i64)> {
    overrides.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

fn lower(source: &str, overrides: &[(&str, i64)]) -> HostProgram {
    let f =
        streamweave::load("test.weave", source, &ov(overrides)).unwrap_or_else(|e| panic!("{e}"));
    streamweave::Compiler::new()
        .lower(f)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `source` on `ranks` in-process ranks with the race checker and panics unless every
/// output matches the reference.
fn assert_matches_reference(source: &str, overrides: &[(&str, i64)], ranks: usize) {
    let fusion =
        streamweave::load("test.weave", source, &ov(overrides)).unwrap_or_else(|e| panic!("{e}"));
    if let Err(f) = common::run_checked(fusion, ranks, 2, 7 + ranks as u64) {
        panic!("{overrides:?} on {ranks} ranks, {}:\n{}", f.stage, f.detail);
    }
}

fn load_error(source: &str, overrides: &[(&str, i64)]) -> String {
    streamweave::load("test.weave", source, &ov(overrides))
        .expect_err("refused at load")
        .to_string()
}

// (a) A merge of two axes followed by a device split.

const MERGE_THEN_DID_INPUT: &str = "fusion merged(t = 4, h = 6, d = 2) {
  mesh m = devices(d)
  tensor x: f32[t, h] on m
  y = relu(x)
  output y
  schedule x { merge(0, 1); outer_split(0, d) -> DIDx }
}
";

#[test]
fn a_device_split_of_a_merged_axis_is_refused_at_load() {
    assert_eq!(
        load_error(MERGE_THEN_DID_INPUT, &[]),
        "schedule of `x`: outer_split(0, d) -> DIDx: loop axis 0 derives from `t * h`, a merge \
         of two axes (`t` and `h`), and a DIDx shard of a merged axis is not a block of one \
         axis, which no allocation or collective holds; split one axis across the devices \
         before merging (`outer_split(a, d) -> DIDx` on the outer axis of the merge: the same \
         shards when it divides by d), then merge what is left if needed
 --> test.weave:6:29
  |
6 |   schedule x { merge(0, 1); outer_split(0, d) -> DIDx }
  |                             ^"
    );
    // On a tensor that feeds an allgather, and through `parallelize`, likewise at the step.
    let gathered = "fusion merged_ag(t = 4, h = 6, d = 2) {
  mesh m = devices(d)
  tensor x: f32[t, h] on m
  y = relu(x)
  z = set(y)
  output z
  schedule y { mesh = m; merge(0, 1); outer_split(0, d); parallelize(0, DIDx) }
  schedule z { mesh = m }
}
";
    let e = load_error(gathered, &[]);
    assert!(
        e.starts_with(
            "schedule of `y`: parallelize(0, DIDx): loop axis 0 derives from `t * h`, a merge"
        ),
        "{e}"
    );
    assert!(e.contains("--> test.weave:7:58"), "{e}");
    // What the message says to write runs.
    let fixed = MERGE_THEN_DID_INPUT.replace(
        "merge(0, 1); outer_split(0, d) -> DIDx",
        "outer_split(0, d) -> DIDx; merge(1, 2)",
    );
    for d in [1, 2, 4] {
        assert_matches_reference(&fixed, &[("d", d)], d as usize);
    }
}

// (b) A Stream split of a merged axis: on an input it used to be dropped silently.

#[test]
fn a_stream_split_of_a_merged_axis_is_refused_at_load_on_inputs_and_outputs() {
    for t in ["x", "y"] {
        let source = format!(
            "fusion merged(t = 4, h = 6, s = 2) {{
  mesh m = devices(1)
  tensor x: f32[t, h] on m
  y = relu(x)
  output y
  schedule {t} {{ merge(0, 1); outer_split(0, s) -> Stream }}
}}
"
        );
        assert_eq!(
            load_error(&source, &[]),
            format!(
                "schedule of `{t}`: outer_split(0, s) -> Stream: loop axis 0 is a split of `t * \
                 h`, a merge of two axes (`t` and `h`), and a Stream chunk of a merged axis is \
                 not a block of one axis; stream-split one axis before merging \
                 (`outer_split(a, s) -> Stream` on the outer axis of the merge, then merge what \
                 is left if needed)
 --> test.weave:6:{}
  |
6 |   schedule {t} {{ merge(0, 1); outer_split(0, s) -> Stream }}
  |                             ^",
                29
            )
        );
        let fixed = source.replace(
            "merge(0, 1); outer_split(0, s) -> Stream",
            "outer_split(0, s) -> Stream; merge(1, 2)",
        );
        for s in 1..=3 {
            assert_matches_reference(&fixed, &[("s", s)], 1);
        }
    }
}

// (c) A Stream split inside a Serial split of the same axis.

#[test]
fn a_stream_split_inside_a_serial_split_is_refused_at_load() {
    let source = "fusion nested(t = 8, h = 6, k = 2, s = 2, d = 2) {
  mesh m = devices(d)
  tensor x: f32[t, h] on m
  tensor w: f32[h, h] on m
  y = matmul(x, w)
  output y
  schedule x { outer_split(0, k); outer_split(1, s) -> Stream }
}
";
    assert_eq!(
        load_error(source, &[]),
        "schedule of `x`: outer_split(1, s) -> Stream: the Stream split cuts the inside of a \
         Serial split of the same axis (stream chunks of Serial chunks), which no stream loop \
         cuts from one axis; split the stream first and the Serial chunks inside each stream \
         chunk (`outer_split(a, s) -> Stream; outer_split(a + 1, k)`)
 --> test.weave:7:35
  |
7 |   schedule x { outer_split(0, k); outer_split(1, s) -> Stream }
  |                                   ^"
    );
    let fixed = source.replace(
        "outer_split(0, k); outer_split(1, s) -> Stream",
        "outer_split(0, s) -> Stream; outer_split(1, k)",
    );
    for (d, s, k, t) in [(1, 2, 2, 8), (2, 3, 3, 10), (4, 2, 3, 8)] {
        assert_matches_reference(
            &fixed,
            &[("d", d), ("s", s), ("k", k), ("t", t)],
            d as usize,
        );
    }
}

// (d) A DID → Stream copy whose chunks and shards neither match nor nest.

/// `fusion {name}`: `{out} = {op}(x)` of an `x` split on `d` devices into a result in `s`
/// stream chunks.
fn did_to_stream(name: &str, out: &str, op: &str) -> String {
    format!(
        "fusion {name}(t = 20, d = 4, s = 5) {{
  mesh m = devices(d)
  tensor x: f32[t, 3] on m
  {out} = {op}(x)
  output {out}
  schedule x {{ outer_split(0, d) -> DIDx }}
  schedule {out} {{ mesh = m; outer_split(0, s) -> Stream }}
}}
"
    )
}

/// The same copy where the stream split comes from propagation (the consumer of the gathered
/// tensor is stream-split), and through an op other than `set`.
const DID_TO_STREAM_PROPAGATED: &str = "fusion ag_mm(t = 20, d = 4, s = 5) {
  mesh m = devices(d)
  tensor x: f32[t, 3] on m
  tensor w: f32[3, 3] on m
  y = set(x)
  z = matmul(y, w)
  output z
  schedule x { outer_split(0, d) -> DIDx }
  schedule z { outer_split(0, s) -> Stream }
}
";

#[test]
fn did_to_stream_copies_whose_factors_do_not_nest_take_the_allgather_route() {
    // s = 5 chunks of 4 rows against 4 shards of 5 rows: one Allgather before the loop, no
    // per-chunk Broadcast.
    let did_to_stream_set = did_to_stream("ag", "y", "set");
    let did_to_stream_op = did_to_stream("ag_neg", "out", "neg");
    for source in [
        did_to_stream_set.as_str(),
        DID_TO_STREAM_PROPAGATED,
        &did_to_stream_op,
    ] {
        let p = lower(source, &[]);
        let text = host_ir::print(&p);
        assert!(text.contains("type=Allgather"), "{text}");
        assert!(!text.contains("type=Broadcast"), "{text}");
        for s in 1..=8 {
            assert_matches_reference(source, &[("s", s)], 4);
        }
    }
    for d in 1..=3 {
        for s in [1, 3, 5, 7] {
            assert_matches_reference(
                &did_to_stream_set,
                &[("d", d), ("t", 12), ("s", s)],
                d as usize,
            );
        }
    }
}

// (e) Copies onto a 2-D mesh from another mesh.

#[test]
fn a_copy_from_a_one_dimensional_mesh_onto_a_two_dimensional_one_changing_both_types_runs() {
    let source = "fusion to_2d(n = 6) {
  mesh a = devices(4)
  mesh b = devices(2, 2)
  tensor x: f32[4, n] on a
  y = set(x)
  output y
  schedule x { outer_split(0, 4) -> DIDx }
  schedule y { mesh = b; outer_split(0, 2) -> DIDy; outer_split(2, 2) -> DIDx }
}
";
    for n in [2, 6] {
        assert_matches_reference(source, &[("n", n)], 4);
    }
}

#[test]
fn a_scatter_onto_a_two_dimensional_mesh_from_another_mesh_runs() {
    // From a device outside the receivers (a Broadcast, then a Scatter within each row) and
    // from one inside them.
    for (sender, ranks) in [("[4]", 5), ("[0]", 4)] {
        let source = format!(
            "fusion sc(n = 2) {{
  mesh r = {sender}
  mesh m = [[0, 1], [2, 3]]
  tensor x: f32[4, 3 * n] on r
  y = set(x)
  output y
  schedule y {{ mesh = m; outer_split(1, 2) -> DIDx }}
}}
"
        );
        assert_matches_reference(&source, &[], ranks);
        let both = source.replace(
            "outer_split(1, 2) -> DIDx",
            "outer_split(0, 2) -> DIDy; outer_split(2, 2) -> DIDx",
        );
        assert_matches_reference(&both, &[], ranks);
    }
}

// (f) Stream chunks of each device's part of an axis (heads on DIDx, each device's heads in
// Stream chunks): refused at load before; both orders now run (tests/streams_inside_device_splits.rs
// has the fixtures and the copies that stay refused).

#[test]
fn stream_chunks_of_a_device_shard_and_the_other_order_both_run() {
    let source = "fusion heads(nh = 8, t = 4, d = 2, s = 2) {
  mesh m = devices(d)
  tensor q: f32[nh, t, 3] on m
  y = relu(q)
  output y
  schedule q { outer_split(0, d) -> DIDx; outer_split(1, s) -> Stream }
}
";
    let other = source.replace(
        "outer_split(0, d) -> DIDx; outer_split(1, s) -> Stream",
        "outer_split(0, s) -> Stream; outer_split(1, d) -> DIDx",
    );
    for (d, s) in [(1, 2), (2, 2), (2, 4), (4, 2)] {
        assert_matches_reference(source, &[("d", d), ("s", s)], d as usize);
        assert_matches_reference(&other, &[("d", d), ("s", s)], d as usize);
    }
    // Uneven and empty chunks of each device's block (8 / d heads in 3 or 5 chunks).
    for (d, s) in [(2, 3), (4, 3), (2, 5), (1, 5)] {
        assert_matches_reference(source, &[("d", d), ("s", s)], d as usize);
    }
}

// (g) A Stream split of an axis that a `reshape` merges or splits, on the reshape's input, its
// output, or a tensor beyond it: lowering cut stream chunks axis by axis and refused late,
// without a location (`pass lower-to-host: `x` cannot be sliced into this stream loop's
// chunks`). Load refuses it at the schedule step; a Stream split of an axis the reshape keeps
// runs.

/// `x: [t, h]` merged into `y: [t * h]` by a reshape, `z = relu(y)`, with `steps` on `tensor`.
fn reshape_merge(tensor: &str, steps: &str) -> String {
    format!(
        "fusion merged(t = 4, h = 6, s = 2) {{
  mesh m = devices(1)
  tensor x: f32[t, h] on m
  y = reshape(x, [t * h])
  z = relu(y)
  output z
  schedule {tensor} {{ {steps} }}
}}
"
    )
}

#[test]
fn a_stream_split_of_an_axis_a_reshape_merges_is_refused_at_load_with_its_location() {
    let tail = "; stream chunks are not carried through a reshape of their axis";
    // On the merged axis, on the reshape's output and on its consumer.
    for t in ["y", "z"] {
        assert_eq!(
            load_error(&reshape_merge(t, "outer_split(0, s) -> Stream"), &[]),
            format!(
                "schedule of `{t}`: outer_split(0, s) -> Stream: the Stream split cuts axis 0 of \
                 `{t}` (`t * h`), which `y = reshape(x, [t * h])` makes by merging `t` and `h`{tail} \
                 (`x` would have no axis to cut into the same chunks): stream-split an axis that \
                 the reshape leaves as it is, or leave this one unsplit
 --> test.weave:7:16
  |
7 |   schedule {t} {{ outer_split(0, s) -> Stream }}
  |                ^"
            )
        );
    }
    // On the input's outer axis, which the reshape merges with `h` (also through
    // `parallelize`: the error is at the step that makes the Stream axis).
    assert_eq!(
        load_error(&reshape_merge("x", "outer_split(0, s) -> Stream"), &[]),
        format!(
            "schedule of `x`: outer_split(0, s) -> Stream: the Stream split cuts axis 0 of `x` \
             (`t`), which `y = reshape(x, [t * h])` merges with `h` into `t * h`{tail} (`y` \
             would have no axis to cut into the same chunks): stream-split an axis that the \
             reshape leaves as it is, or leave this one unsplit
 --> test.weave:7:16
  |
7 |   schedule x {{ outer_split(0, s) -> Stream }}
  |                ^"
        )
    );
    let e = load_error(
        &reshape_merge("x", "outer_split(0, s); parallelize(0, Stream)"),
        &[],
    );
    assert!(
        e.starts_with("schedule of `x`: parallelize(0, Stream): the Stream split cuts axis 0"),
        "{e}"
    );
    assert!(e.contains("--> test.weave:7:35"), "{e}");
    // A reshape that splits an axis: a Stream split of the axis it splits, and of one it makes.
    let split = |t: &str| {
        format!(
            "fusion split(t = 4, h = 6, s = 2) {{
  mesh m = devices(1)
  tensor x: f32[t * h] on m
  y = reshape(x, [t, h])
  output y
  schedule {t} {{ outer_split(0, s) -> Stream }}
}}
"
        )
    };
    let e = load_error(&split("x"), &[]);
    assert!(
        e.starts_with(
            "schedule of `x`: outer_split(0, s) -> Stream: the Stream split cuts axis 0 of `x` \
             (`t * h`), which `y = reshape(x, [t, h])` splits into `t` and `h`"
        ),
        "{e}"
    );
    assert!(e.contains("--> test.weave:6:16"), "{e}");
    let e = load_error(&split("y"), &[]);
    assert!(
        e.starts_with(
            "schedule of `y`: outer_split(0, s) -> Stream: the Stream split cuts axis 0 of `y` \
             (`t`), which `y = reshape(x, [t, h])` makes by splitting `t * h`"
        ),
        "{e}"
    );
}

#[test]
fn a_stream_split_of_an_axis_a_reshape_keeps_runs() {
    // `x: [b, t, h]` → `[b, t * h]`: the batch axis is left as it is, so its stream chunks cut
    // both sides, on the input or on the consumer, with the rows on DIDx inside each chunk.
    for (tensor, steps) in [
        ("x", "outer_split(0, s) -> Stream"),
        ("z", "outer_split(0, s) -> Stream"),
        (
            "z",
            "mesh = m; outer_split(0, s) -> Stream; outer_split(1, d) -> DIDx",
        ),
    ] {
        let source = format!(
            "fusion kept(b = 8, t = 2, h = 3, s = 2, d = 2) {{
  mesh m = devices(d)
  tensor x: f32[b, t, h] on m
  y = reshape(x, [b, t * h])
  z = relu(y)
  output z
  schedule {tensor} {{ {steps} }}
}}
"
        );
        for d in [1, 2] {
            assert_matches_reference(&source, &[("d", d)], d as usize);
        }
    }
}

/// The example of docs/fusion-format.md, "Schedules": an op output split across devices
/// names its mesh with `mesh = m` (the block is indented in a list item there).
fn op_output_split_example() -> String {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/fusion-format.md"),
    )
    .unwrap();
    let start = doc
        .find("fusion op_output_split(")
        .expect("the example is in the doc");
    let end = start + doc[start..].find("\n  }\n").expect("the example ends") + 5;
    doc[start..end]
        .lines()
        .map(|l| l.strip_prefix("  ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

#[test]
fn the_op_output_split_of_the_format_doc_runs_as_written() {
    let src = op_output_split_example();
    assert!(
        src.contains("schedule y { mesh = m; outer_split(0, d) -> DIDx }"),
        "{src}"
    );
    for d in [1, 2, 4] {
        assert_matches_reference(&src, &[("d", d)], d as usize);
    }
    // Without `mesh = m`, or with it after the device split, load refuses the step.
    for steps in [
        "outer_split(0, d) -> DIDx",
        "outer_split(0, d) -> DIDx; mesh = m",
    ] {
        let without = src.replace("mesh = m; outer_split(0, d) -> DIDx", steps);
        let e = load_error(&without, &[]);
        assert!(
            e.starts_with(
                "schedule of `y`: DIDx split needs a device mesh (declare the tensor `on m` or add `mesh = m`)\n --> test.weave:6:16"
            ),
            "{e}"
        );
    }
}
