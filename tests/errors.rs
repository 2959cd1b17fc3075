//! Malformed `.weave` inputs through the whole load path (parse, schedule, verify): each
//! asserts the exact rendered error — message, file:line:col and the caret line.

use std::path::Path;

fn load_err(src: &str) -> String {
    match streamweave::load("bad.weave", src, &[]) {
        Ok(_) => panic!("expected an error for:\n{src}"),
        Err(e) => e.to_string(),
    }
}

const HEAD: &str = "fusion f(t = 8, d = 2) {\n  mesh m = devices(d)\n  tensor a: f32[t, 6] on m\n";

fn with(body: &str) -> String {
    format!("{HEAD}{body}}}\n")
}

/// A refused program: what it shows, a maker of its source, and its exact error.
type BadSchedule = (&'static str, fn() -> String, &'static str);

/// Schedules refused at load, each with its exact rendered error: (what, source, error).
const BAD_SCHEDULES: [BadSchedule; 5] = [
    (
        "split of a non-existent axis",
        || with("  b = set(a)\n  output b\n  schedule a { outer_split(2, d) -> DIDx }\n"),
        "schedule of `a`: outer_split of axis 2, but the loop domain has 2 axes (0..1)\n \
         --> bad.weave:6:16\n  |\n6 |   schedule a { outer_split(2, d) -> DIDx }\n  |                ^",
    ),
    (
        "non-divisible constant device split",
        || "fusion f(d = 4) {\n  mesh m = devices(d)\n  tensor a: f32[8, 6] on m\n  b = set(a)\n  output b\n  schedule a { outer_split(1, d) -> DIDx }\n}\n".to_string(),
        "schedule of `a`: axis 1 has extent 6 (`6`), not divisible by 4 devices (DIDx)\n \
         --> bad.weave:6:16\n  |\n6 |   schedule a { outer_split(1, d) -> DIDx }\n  |                ^",
    ),
    (
        "inner split marked DIDx",
        || with("  b = set(a)\n  output b\n  schedule a { inner_split(0, 2) -> DIDx }\n"),
        "schedule of `a`: inner_split(0, 2) -> DIDx: device and stream axes must come from an outer split\n \
         --> bad.weave:6:16\n  |\n6 |   schedule a { inner_split(0, 2) -> DIDx }\n  |                ^",
    ),
    (
        "device split without a mesh",
        || "fusion f(d = 2) {\n  tensor a: f32[8, 6]\n  b = set(a)\n  output b\n  schedule b { outer_split(0, d) -> DIDx }\n}\n".to_string(),
        "schedule of `b`: DIDx split needs a device mesh (declare the tensor `on m` or add `mesh = m`)\n \
         --> bad.weave:5:16\n  |\n5 |   schedule b { outer_split(0, d) -> DIDx }\n  |                ^",
    ),
    (
        "second stream axis",
        || with("  b = set(a)\n  output b\n  schedule b { outer_split(0, 2) -> Stream; outer_split(2, 3) -> Stream }\n"),
        "schedule of `b`: outer_split(2, 3) -> Stream: loop axis 0 is already Stream; a loop domain has at most one Stream axis\n \
         --> bad.weave:6:45\n  |\n6 |   schedule b { outer_split(0, 2) -> Stream; outer_split(2, 3) -> Stream }\n  |                                             ^",
    ),
];

#[test]
fn bad_schedules_render_their_exact_error() {
    for (what, source, error) in BAD_SCHEDULES {
        assert_eq!(load_err(&source()), error, "{what}");
    }
}

#[test]
fn parse_errors_render_with_the_line() {
    let e = load_err(&with("  b = addd(a, a)\n  output b\n"));
    assert!(
        e.starts_with("unknown op `addd` (expected one of: set, segment_set, cast, neg,"),
        "{e}"
    );
    assert!(e.contains("--> bad.weave:4:7\n"), "{e}");
    assert!(e.ends_with("4 |   b = addd(a, a)\n  |       ^"), "{e}");
}

#[test]
fn unknown_override_names_the_known_parameters() {
    let e = streamweave::load("bad.weave", &with("  output a\n"), &[("q".into(), 1)]).unwrap_err();
    assert_eq!(
        e.diagnostic.message,
        "unknown parameter `q` (fusion `f` has: t, d)"
    );
}

#[test]
fn missing_file_is_a_clear_error() {
    let e = streamweave::load_file(Path::new("no/such.weave"), &[]).unwrap_err();
    assert!(
        e.to_string().starts_with("cannot read no/such.weave:"),
        "{e}"
    );
}

/// The negative fixtures of tests/scenarios/invalid fail where their comments say.
#[test]
fn invalid_fixtures_fail_at_their_schedule_step() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios/invalid");
    let cases = [
        (
            "did_factor_not_mesh_size",
            "DIDx split factor `4` = 4, but mesh `m` has 2 devices along DIDx",
            10,
            18,
        ),
        (
            "stream_inner_split",
            "inner_split(0, 2) -> Stream: device and stream axes must come from an outer split",
            10,
            18,
        ),
        (
            "stream_merged_axis",
            "parallelize(0, Stream): axis 0 is the output of a merge",
            9,
            31,
        ),
    ];
    for (name, msg, line, col) in cases {
        let e = streamweave::load_file(&dir.join(format!("{name}.weave")), &[]).unwrap_err();
        assert!(
            e.diagnostic.message.contains(msg),
            "{name}: {}",
            e.diagnostic.message
        );
        let span = e.diagnostic.span.expect("a position");
        assert_eq!((span.line, span.col), (line, col), "{name}");
    }
}

/// `swizzle1d(axis, DIDx)` rotates a stream axis by the rank: refused at load time unless the
/// parallel type is DIDx, the tensor sits on a `devices(n)` mesh and the axis has one chunk
/// per device, from an unsplit axis or the outer output of an outer split.
#[test]
fn swizzle1d_needs_didx_a_devices_mesh_and_one_chunk_per_device() {
    let first_line = |e: String| e.lines().next().unwrap().to_string();
    let e = load_err(&with(
        "  b = set(a)\n  output b\n  schedule a { outer_split(0, d); swizzle1d(0, Stream) }\n",
    ));
    assert_eq!(
        e,
        "schedule of `a`: swizzle1d(0, Stream): only DIDx can rotate a stream axis (the chunks are rotated by the device index of a 1-D mesh)\n \
         --> bad.weave:6:35\n  |\n6 |   schedule a { outer_split(0, d); swizzle1d(0, Stream) }\n  |                                   ^"
    );
    assert_eq!(
        first_line(load_err(&with(
            "  b = set(a)\n  output b\n  schedule a { outer_split(0, 4); swizzle1d(0, DIDx) }\n",
        ))),
        "schedule of `a`: swizzle1d(0, DIDx): axis 0 has extent `4`, but the rotation needs one chunk per device of mesh `m` (2)"
    );
    assert_eq!(
        first_line(load_err(&with(
            "  b = set(a)\n  output b\n  schedule a { inner_split(0, 2); swizzle1d(0, DIDx) }\n",
        ))),
        "schedule of `a`: swizzle1d(0, DIDx): axis 0 is the outer output of an inner split; device and stream axes must be an unsplit logical axis or the outer output of an outer split"
    );
    assert_eq!(
        first_line(load_err(
            "fusion f() {\n  tensor a: f32[2, 6]\n  b = set(a)\n  output b\n  schedule a { swizzle1d(0, DIDx) }\n}\n"
        )),
        "schedule of `a`: swizzle1d(0, DIDx) needs a device mesh (declare the tensor `on m` or add `mesh = m` before it)"
    );
    assert_eq!(
        first_line(load_err(
            "fusion f() {\n  mesh m = [1, 0]\n  tensor a: f32[2, 6] on m\n  b = set(a)\n  output b\n  schedule a { swizzle1d(0, DIDx) }\n}\n"
        )),
        "schedule of `a`: swizzle1d(0, DIDx) needs a 1-D mesh of devices 0..n (`devices(n)`), but mesh `m` is [1, 0] with shape [2]"
    );
}

/// What the transformer layer cannot be scheduled as, refused at load with the user's tensor
/// and the step: a Stream split of the softmax's sum over the keys (flash attention's online
/// softmax accumulates across key chunks, which a stream loop does not), and a sequence-
/// parallel layer whose token chunks do not split evenly across the devices.
#[test]
fn the_layer_schedules_it_cannot_run_are_refused_at_their_step() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios/tp_attention.weave");
    let source = std::fs::read_to_string(&path).unwrap();
    let keys = source.replace(
        "  schedule y { mesh = m; outer_split(0, s) -> Stream }",
        "  schedule z { outer_split(2, s) -> Stream }",
    );
    let line = keys
        .lines()
        .position(|l| l.contains("schedule z {"))
        .unwrap()
        + 1;
    let pad = " ".repeat(line.to_string().len());
    assert_eq!(
        load_err(&keys),
        format!(
            "schedule of `z`: outer_split(2, s) -> Stream: loop axis 2 is a reduction axis, which cannot be stream-parallel (the chunks' partial results would need adding up); stream-split an iteration axis\n\
             {pad}--> bad.weave:{line}:16\n{pad} |\n{line} |   schedule z {{ outer_split(2, s) -> Stream }}\n{pad} |                ^"
        )
    );
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/scenarios/sequence_parallel_mlp_backward.weave");
    let set = [
        ("t".to_string(), 36),
        ("s".to_string(), 5),
        ("d".to_string(), 3),
    ];
    let e = streamweave::load_file(&path, &set).unwrap_err().to_string();
    let first = e.lines().next().unwrap();
    assert_eq!(
        first,
        "schedule of `x`: axis 1 has extent 8 (`ceilDiv(t, 5)`), not divisible by 3 devices (DIDx)"
    );
    assert!(
        e.contains("sequence_parallel_mlp_backward.weave:"),
        "no file:line:col in {e}"
    );
}
