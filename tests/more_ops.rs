//! The ops of issue 28 after `mean`: the `min` reduction and `var` (two-pass population
//! variance, and with a correction: `var(x, [1], 1)`), run on the CPU backend on 1, 2 and 4
//! ranks against the f64 reference, over device-split axes too.

mod common;

fn load(source: &str, d: i64) -> weave_ir::Fusion {
    streamweave::load("case.weave", source, &[("d".to_string(), d)])
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `fusion` on the CPU backend on `d` ranks with `x` given, and returns the output
/// `name` (after the run's reference check passed).
fn output_of(src: &str, d: i64, x: &[f64], name: &str) -> Vec<f64> {
    let exe = streamweave::Compiler::new().compile(&load(src, d)).unwrap();
    let mut globals = exe.random_inputs(7).unwrap();
    globals[0].data = x.to_vec();
    let options = streamweave::RunOptions {
        target: streamweave::Target::Cpu { ranks: d as usize },
        check: true,
        ..streamweave::RunOptions::default()
    };
    let report = exe.run_dense(&globals, &options).unwrap();
    assert!(report.passed(), "{d} ranks: the reference check failed");
    let outputs = report.into_outputs().unwrap();
    outputs.get(name).unwrap().to_dense().data
}

/// Runs `src` on `d` CPU ranks with `streams` streams on inputs from `seed`, checked against
/// the reference (see [`common::run_checked`]): every check passes.
fn checked(src: &str, d: i64, streams: usize, seed: u64) -> common::Checked {
    let c = common::run_checked(load(src, d), d as usize, streams, seed)
        .unwrap_or_else(|f| panic!("{d} ranks: {}: {}", f.stage, f.detail));
    assert!(c.checks.iter().all(|k| k.comparison.ok), "{d} ranks");
    c
}

/// Why loading `src` as `file` fails.
fn refusal(file: &str, src: &str, overrides: &[(String, i64)]) -> String {
    streamweave::load(file, src, overrides)
        .expect_err("refused at load")
        .to_string()
}

/// Four rows of eight far from zero: row i holds 1e4 (i + 1) plus the deviations 1, -1, 2,
/// -2, 3, -3, 0, 0 times (i + 1), whose squares add up to 28 (i + 1)^2.
fn rows_with_known_variance() -> Vec<f64> {
    let dev = [1.0, -1.0, 2.0, -2.0, 3.0, -3.0, 0.0, 0.0];
    (0..4)
        .flat_map(|i| {
            dev.iter()
                .map(move |e| 1e4 * (i + 1) as f64 + e * (i + 1) as f64)
        })
        .collect()
}

/// A fusion `name` built in Rust with one input `x: f32[4, 8]`.
fn built_with_x(name: &str) -> (weave_ir::Fusion, weave_ir::TensorId) {
    let mut f = weave_ir::Fusion::new(name);
    let x = f
        .add_input(
            "x",
            weave_ir::DType::F32,
            vec![weave_ir::Scalar::c(4), weave_ir::Scalar::c(8)],
            None,
        )
        .unwrap();
    (f, x)
}

/// The CUDA sources of the kernels of `src` on `d` devices (every rank's, of 2), as one
/// text.
fn cuda_sources(src: &str, d: i64) -> String {
    let fusion = load(src, d);
    let exe = streamweave::Compiler::new().compile(&fusion).unwrap();
    let mut all = String::new();
    for k in exe.kernel_table(2, 2, 132).unwrap().entries() {
        for launch in &k.plan.launches {
            all.push_str(&launch.source);
        }
    }
    all
}

const MIN_MAX: &str = "fusion min_max(t = 6, h = 8, d = 2) {
  mesh m = devices(d)
  tensor x: f32[t, h] on m
  lo = min(x, [1])
  hi = max(x, [1])
  span = hi - lo
  col = min(x, [0])
  output lo, span, col
  schedule x { outer_split(1, d) -> DIDx }
}
";

#[test]
fn min_over_a_device_split_axis_reduces_across_devices() {
    // Row i holds i * 10 + (j * 5) % 8 - 20: the smallest of row i is at column 0, the
    // largest at column 3 (value 15 + ...), so with h on DIDx they live on different devices
    // of 2 and 4 (and the column minimum is row 0's).
    let x: Vec<f64> = (0..6)
        .flat_map(|i| (0..8).map(move |j| (i * 10 + (j * 5) % 8) as f64 - 20.0))
        .collect();
    for d in [1, 2, 4] {
        let lo = output_of(MIN_MAX, d, &x, "lo");
        assert_eq!(lo, vec![-20.0, -10.0, 0.0, 10.0, 20.0, 30.0], "{d} ranks");
        let span = output_of(MIN_MAX, d, &x, "span");
        assert_eq!(span, vec![7.0; 6], "{d} ranks");
        let col = output_of(MIN_MAX, d, &x, "col");
        let want: Vec<f64> = (0..8).map(|j| ((j * 5) % 8) as f64 - 20.0).collect();
        assert_eq!(col, want, "{d} ranks");
    }
}

#[test]
fn min_on_random_inputs_matches_the_reference_on_one_two_and_four_ranks() {
    for d in [1, 2, 4] {
        assert!(checked(MIN_MAX, d, 2, 11).checks.len() >= 3);
    }
}

const VAR: &str = "fusion variance(t = 4, h = 8, d = 2) {
  mesh m = devices(d)
  tensor x: f32[t, h] on m
  v = var(x, [1])
  output v
  schedule x { outer_split(1, d) -> DIDx }
}
";

#[test]
fn var_is_the_two_pass_population_variance_across_devices() {
    // Rows far from zero (1e4 + small deviations): the two-pass form keeps the variance
    // exact where mean-of-squares minus square-of-mean in f32 would lose it.
    // Population variance 28 / 8 = 3.5 times (i + 1)^2.
    let x = rows_with_known_variance();
    for d in [1, 2, 4] {
        let v = output_of(VAR, d, &x, "v");
        let want: Vec<f64> = (1..=4).map(|i| 3.5 * (i * i) as f64).collect();
        assert_eq!(v, want, "{d} ranks");
    }
    let f = load(VAR, 2);
    let text = weave_ir::text::print(&f);
    assert!(text.contains("v_3 = broadcast(v_2, [1])"), "{text}");
    assert!(text.contains("v = div(v_6, 8)"), "{text}");
}

#[test]
fn var_matches_the_reference_on_random_inputs_and_in_the_rust_builder() {
    for d in [1, 2, 4] {
        assert!(!checked(VAR, d, 1, 3).checks.is_empty());
    }
    // The Rust builder builds the same ops.
    let (mut f, x) = built_with_x("variance");
    let v = f.var("v", x, &[1]).unwrap();
    f.add_output(v).unwrap();
    let lo = f.reduce("lo", weave_ir::ReduceOp::Min, x, &[0]).unwrap();
    f.add_output(lo).unwrap();
    let text = weave_ir::text::print(&f);
    assert!(text.contains("v_1 = sum(x, [1])"), "{text}");
    assert!(text.contains("v = div(v_6, 8)"), "{text}");
    assert!(text.contains("lo = min(x, [0])"), "{text}");
}

/// Attention scores of `b` heads with a causal mask built from two `iota`s; the heads are
/// split across devices, the token axes stay whole on every device.
const CAUSAL: &str = "fusion causal(b = 4, t = 6, d = 2) {
  mesh m = devices(d)
  tensor s: f32[b, t, t] on m
  keep = ge(iota(s, 1), iota(s, 2))
  out = where(keep, s, -inf)
  row = cast(iota(s, 1), f32) * 10 + cast(iota(s, 2), f32)
  output out, row
  schedule s { outer_split(0, d) -> DIDx }
}
";

#[test]
fn a_causal_mask_from_iota_matches_the_reference_with_heads_on_devices() {
    for d in [1, 2, 4] {
        checked(CAUSAL, d, 2, 5);
        // Every device's indices are the global token indices: row i, column j holds
        // 10 i + j in every head, and the mask keeps j <= i.
        let x: Vec<f64> = (0..4 * 36).map(|i| i as f64).collect();
        let row = output_of(CAUSAL, d, &x, "row");
        let want: Vec<f64> = (0..4)
            .flat_map(|_| (0..6).flat_map(|i| (0..6).map(move |j| (10 * i + j) as f64)))
            .collect();
        assert_eq!(row, want, "{d} ranks");
        let out = output_of(CAUSAL, d, &x, "out");
        for (k, v) in out.iter().enumerate() {
            let (i, j) = ((k / 6) % 6, k % 6);
            if j <= i {
                assert_eq!(*v, k as f64);
            } else {
                assert_eq!(*v, f64::NEG_INFINITY);
            }
        }
    }
}

/// A fused QKV weight sliced into q, k and v; the tokens are split across devices and cut
/// into stream chunks, the weight is whole on every device.
const QKV: &str = "fusion qkv(t = 8, h = 4, k = 6, d = 2, s = 2) {
  mesh m = devices(d)
  tensor x: f32[t, k] on m
  tensor w: f32[3 * h, k] on m
  tensor a: f32[t, 2] on m
  q = linear(x, slice(w, 0, 0, h))
  kk = linear(x, slice(w, 0, h, 2 * h))
  v = linear(x, slice(w, 0, 2 * h, 3 * h))
  qa = concat(q, a, 1)
  qkv = concat(concat(q, kk, 1), v, 1)
  output q, kk, v, qa, qkv
  schedule x { outer_split(0, s) -> Stream; outer_split(1, d) -> DIDx }
}
";

#[test]
fn a_fused_qkv_weight_sliced_and_concatenated_matches_the_reference() {
    for d in [1, 2, 4] {
        assert!(checked(QKV, d, 2, 9).checks.len() >= 5);
    }
    // The printed form names the intermediate slices and round-trips.
    let f = load(QKV, 2);
    let text = weave_ir::text::print(&f);
    assert!(text.contains("kk_1 = slice(w, 0, h, 2 * h)"), "{text}");
    assert!(text.contains("qkv_1 = concat(q, kk, 1)"), "{text}");
    assert_eq!(weave_ir::text::print(&load(&text, 2)), text);
}

#[test]
fn a_schedule_that_cuts_an_indexed_axis_is_refused_at_load() {
    let src = QKV.replace(
        "schedule x { outer_split(0, s) -> Stream; outer_split(1, d) -> DIDx }",
        "schedule w { outer_split(0, d) -> DIDx }",
    );
    let e = refusal("qkv.weave", &src, &[]);
    assert!(
        e.contains("slice: the schedule of `w` cuts axis 0, which `slice` indexes globally")
            && e.contains("qkv.weave:6:17"),
        "{e}"
    );
    let src = CAUSAL.replace("outer_split(0, d)", "outer_split(2, d)");
    let e = refusal("causal.weave", &src, &[]);
    assert!(
        e.contains("iota: the schedule of `s` cuts axis 2") && e.contains("causal.weave:4:"),
        "{e}"
    );
}

#[test]
fn shape_errors_of_the_indexed_ops_point_at_the_op() {
    let cases = [
        ("q = slice(w, 0, 2, 13)", "slice: `2..13` (2..13) is not a range of axis 0 of", "6:7"),
        ("q = slice(w, 2, 0, 1)", "axis 2", "6:7"),
        (
            "q = concat(x, w, 1)",
            "concat: axis 0 of `x` (f32[t, k]) and of `w` (f32[3 * h, k]) differ; only axis 1, the one joined, may",
            "6:7",
        ),
        ("q = iota(x, 1.5)", "`iota`: argument 2 must be an axis number", "6:15"),
        ("q = slice(w, 0, 0, zz)", "`slice`: `zz` is not a parameter", "6:22"),
    ];
    for (line, want, at) in cases {
        let src = QKV.replace("q = linear(x, slice(w, 0, 0, h))", line);
        let e = refusal("e.weave", &src, &[]);
        assert!(
            e.contains(want) && e.contains(&format!("e.weave:{at}")),
            "{line}: {e}"
        );
    }
}

/// The example of docs/fusion-format.md, §Variance, as written there.
fn sample_variance_example() -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/fusion-format.md");
    let doc = std::fs::read_to_string(path).unwrap();
    let (_, from) = doc
        .split_once("fusion sample_variance(")
        .expect("the example is in the doc");
    let (body, _) = from.split_once("\n}\n").expect("the example ends");
    format!("fusion sample_variance({body}\n}}\n")
}

#[test]
fn var_with_a_correction_divides_by_n_minus_the_correction() {
    let src = sample_variance_example();
    // Squared deviations add up to 28 (i + 1)^2 in row i, so the population variance is
    // 28 (i + 1)^2 / 8 and the sample one / 7.
    let x = rows_with_known_variance();
    for d in [1, 2, 4] {
        let pop = output_of(&src, d, &x, "pop");
        let sample = output_of(&src, d, &x, "sample");
        for i in 0..4 {
            let k = ((i + 1) * (i + 1)) as f64;
            assert_eq!(pop[i], (28.0 * k / 8.0) as f32 as f64, "{d} ranks, row {i}");
            assert_eq!(
                sample[i],
                (28.0 * k / 7.0) as f32 as f64,
                "{d} ranks, row {i}"
            );
        }
        checked(&src, d, 2, 19);
    }
    // Only the last division changes; the printed form loads back to the same text.
    let f = load(&src, 2);
    let text = weave_ir::text::print(&f);
    assert!(text.contains("pop = div(pop_6, 8)"), "{text}");
    assert!(text.contains("sample = div(sample_6, 7)"), "{text}");
    assert!(text.contains("sample_2 = div(sample_1, 8)"), "{text}");
    assert_eq!(weave_ir::text::print(&load(&text, 2)), text);
    // The Rust builder's form prints the same ops.
    let (mut b, x) = built_with_x("sample_variance");
    let v = b.var_corrected("sample", x, &[1], 1).unwrap();
    b.add_output(v).unwrap();
    let built = weave_ir::text::print(&b);
    assert!(built.contains("sample = div(sample_6, 7)"), "{built}");
}

#[test]
fn the_cuda_kernel_of_a_corrected_variance_divides_by_n_minus_the_correction() {
    // No GPU here: the generated CUDA source is checked as text. The kernels of one rank
    // divide the mean by 8 and the squared deviations by 8 (population) and 7 (sample).
    let src = sample_variance_example();
    let all = cuda_sources(&src, 2);
    // The sample variance's division, and three by 8: the two means and the population one.
    assert!(
        all.contains("float v3 = (7.0f);\n        float v4 = v2 / v3;"),
        "{all}"
    );
    assert_eq!(all.matches("(7.0f)").count(), 1, "{all}");
    assert_eq!(all.matches("(8.0f)").count(), 3, "{all}");
}

#[test]
fn a_correction_that_leaves_no_positive_divisor_is_refused_at_the_op() {
    let src = sample_variance_example().replace("var(x, [1], 1)", "var(x, [1], 8)");
    let e = refusal("sample.weave", &src, &[]);
    assert_eq!(
        e,
        "var: the correction 8 is not smaller than the 8 elements that each variance of `x` \
         (f32[t, h]) over axes [1] reduces, so the divisor n - correction would be 0; reduce \
         more elements, or lower the correction (0 is the population variance)
 --> sample.weave:5:12
  |
5 |   sample = var(x, [1], 8)
  |            ^"
    );
    // Larger than the count, over two axes (n = 32), and through `--set`: h = 1 leaves one
    // element per row for a sample variance.
    let over = src.replace("var(x, [1], 8)", "var(x, [0, 1], 40)");
    let e = refusal("sample.weave", &over, &[]);
    assert!(
        e.starts_with("var: the correction 40 is not smaller than the 32 elements"),
        "{e}"
    );
    assert!(e.contains("would be -8;"), "{e}");
    let one = [("h".to_string(), 1), ("d".to_string(), 1)];
    let e = refusal("sample.weave", &sample_variance_example(), &one);
    assert!(
        e.starts_with("var: the correction 1 is not smaller than the 1 elements"),
        "{e}"
    );
    // The correction is a non-negative integer literal, and at most the third argument.
    for (bad, want) in [
        ("var(x, [1], -1)", "found the literal `-1`"),
        ("var(x, [1], 0.5)", "found the literal `0.5`"),
        ("var(x, [1], x)", "found"),
    ] {
        let src = sample_variance_example().replace("var(x, [1], 1)", bad);
        let e = refusal("sample.weave", &src, &[]);
        assert!(
            e.starts_with("`var`: the correction must be a non-negative integer"),
            "{bad}: {e}"
        );
        assert!(e.contains(want), "{bad}: {e}");
        assert!(e.contains("--> sample.weave:5:"), "{bad}: {e}");
    }
    let four = sample_variance_example().replace("var(x, [1], 1)", "var(x, [1], 1, 2)");
    let e = refusal("sample.weave", &four, &[]);
    assert!(
        e.starts_with("`var` takes a tensor, an axis list and an optional correction"),
        "{e}"
    );
    // A correction of 0 is the population variance, as written without it.
    let same = sample_variance_example().replace("var(x, [1], 1)", "var(x, [1], 0)");
    let text = weave_ir::text::print(&load(&same, 2));
    assert!(text.contains("sample = div(sample_6, 8)"), "{text}");
}

/// Found by the `layer` family of tests/run_differential.rs: a column rotation by the whole
/// width, `concat(slice(x, 1, 2, 2), slice(x, 1, 0, 2), 1)`, sliced an empty tensor, which
/// loaded and was refused late in lower-to-host without a location (`tensor `v0_1` axis 1:
/// extent `0` = 0 must be positive`). An empty slice is refused at load, at the op.
#[test]
fn an_empty_slice_is_refused_at_load_at_the_op() {
    let src = "fusion layer(d = 1, s = 1) {
  mesh m = devices(d)
  tensor x: f32[1, 2] on m
  v0 = concat(slice(x, 1, 2, 2), slice(x, 1, 0, 2), 1)
  output v0
}
";
    let e = refusal("gen.weave", src, &[]);
    assert_eq!(
        e,
        "slice: `2..2` (2..2) of axis 1 of `x` (f32[1, 2]) is empty, and a tensor's extents \
         must be positive; slice at least one element (start < stop), or leave the op out
 --> gen.weave:4:15
  |
4 |   v0 = concat(slice(x, 1, 2, 2), slice(x, 1, 0, 2), 1)
  |               ^"
    );
    // A non-empty rotation of the columns runs on the reference.
    let fixed = src.replace(
        "slice(x, 1, 2, 2), slice(x, 1, 0, 2)",
        "slice(x, 1, 1, 2), slice(x, 1, 0, 1)",
    );
    common::run_checked(load(&fixed, 1), 1, 1, 3)
        .unwrap_or_else(|f| panic!("{}: {}", f.stage, f.detail));
}
