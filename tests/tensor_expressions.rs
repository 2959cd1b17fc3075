//! Programs written with tensor expressions (literals, infix arithmetic, nested calls) and
//! the ops `mean`, `erf`, `gelu`, `gelu_tanh`, run on the CPU backend on 1 and 2 ranks
//! against the f64 reference; the first is the example of docs/fusion-format.md.

mod common;

/// The example of docs/fusion-format.md, "Tensor expressions".
const DOC_EXAMPLE: &str = "fusion scaled_gelu(t = 8, h = 12, d = 2) {
  mesh m = devices(d)
  tensor x: f32[t, h] on m
  tensor b: f32[t, h] on m
  y = x * 0.5 + b
  g = gelu(y) - 0.25 * gelu_tanh(-y) + erf(y / 2)
  r = where(gt(y, 0), g, -1e9)
  mu = mean(x, [1])
  output r, mu
  schedule x { outer_split(1, d) -> DIDx }
}
";

fn load(source: &str, d: i64) -> weave_ir::Fusion {
    streamweave::load("case.weave", source, &[("d".to_string(), d)])
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn the_doc_example_matches_the_reference_on_one_and_two_ranks() {
    for d in [1, 2] {
        let c = common::run_checked(load(DOC_EXAMPLE, d), d as usize, 2, 3)
            .unwrap_or_else(|f| panic!("{d} ranks: {}: {}", f.stage, f.detail));
        assert!(c.checks.iter().all(|k| k.comparison.ok));
        assert!(c.checks.len() >= 2);
    }
}

#[test]
fn a_mean_over_a_device_axis_adds_across_devices_then_divides_by_the_global_extent() {
    // `x` is split on the reduced axis: each device sums its half, the halves are added across
    // devices, and the division uses h = 12, not a device's 6 columns.
    let exe = streamweave::Compiler::new()
        .compile(&load(DOC_EXAMPLE, 2))
        .unwrap();
    let mut globals = exe.random_inputs(5).unwrap();
    for v in &mut globals[0].data {
        *v = 1.0;
    }
    let report = exe
        .run_dense(
            &globals,
            &streamweave::RunOptions {
                target: streamweave::Target::Cpu { ranks: 2 },
                check: true,
                ..streamweave::RunOptions::default()
            },
        )
        .unwrap();
    assert!(report.passed());
    let outputs = report.into_outputs().unwrap();
    let mu = outputs.get("mu").unwrap().to_dense();
    assert_eq!(mu.data, vec![1.0; 8]);
}

#[test]
fn literals_on_i64_and_comparisons_build_a_causal_mask() {
    // A mask from comparisons of i64 inputs with literals; the masked scores keep their values
    // where the row index is at least the column index.
    let src = "fusion mask(t = 6, d = 1) {
  mesh m = devices(d)
  tensor row: i64[t, t] on m
  tensor col: i64[t, t] on m
  tensor s: f32[t, t] on m
  keep = ge(row + 8, col + 8)
  out = where(keep, s * 2 - 1, -inf)
  output out
  schedule s { outer_split(0, d) -> DIDx }
}
";
    for d in [1, 2] {
        common::run_checked(load(src, d), d as usize, 1, 4)
            .unwrap_or_else(|f| panic!("{d} ranks: {}: {}", f.stage, f.detail));
    }
}
