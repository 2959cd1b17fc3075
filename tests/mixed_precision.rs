//! The reference check of mixed-precision programs and of integer ops on generated inputs:
//! a correct program whose values pass through `bf16` or `f16` passes (the reference rounds
//! every op's result to its dtype, and the tolerance follows the least precise rounding on
//! the value's path), a wrong one still fails, and integer `div` and `pow` on generated
//! inputs are defined.

mod common;

use streamweave::{Compiler, Executable, RunOptions, Target};
use weave_executor::interp::{eval_fusion, Precision};
use weave_executor::reference::{compare, output_tolerances, Tolerance};
use weave_executor::Dense;
use weave_ir::DType;

/// The everyday logits pattern: a `bf16` linear whose result is cast to `f32`.
const LOGITS: &str = "fusion logits(t = 16, h = 64, v = 24, d = 1) {
  mesh m = devices(d)
  tensor x: bf16[t, h] on m
  tensor w: bf16[v, h] on m
  y = linear(x, w)
  out = cast(y, f32)
  output out
  schedule w { outer_split(0, d) -> DIDx }
}
";

/// A value through bf16, f16, f32, bf16 and f32 again, computing in each, with every
/// intermediate stored in its dtype between segments (`segment_set`), as a device stores
/// the values that cross a segment boundary.
const CHAIN: &str = "fusion chain(t = 12, h = 40) {
  tensor x: bf16[t, h]
  tensor y: bf16[t, h]
  a0 = mul(x, y)
  a = segment_set(a0)
  b = cast(a, f16)
  c0 = exp(b)
  c = segment_set(c0)
  e = cast(c, f32)
  g0 = mul(e, e)
  g = segment_set(g0)
  k = cast(g, bf16)
  n0 = add(k, a)
  n = segment_set(n0)
  out = cast(n, f32)
  output out
}
";

fn load(source: &str, ov: &[(&str, i64)]) -> weave_ir::Fusion {
    let ov: Vec<(String, i64)> = ov.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    streamweave::load("case.weave", source, &ov).unwrap_or_else(|e| panic!("{e}"))
}

fn executable(source: &str, ov: &[(&str, i64)]) -> Executable {
    Compiler::new().compile(&load(source, ov)).unwrap()
}

fn cpu(ranks: usize, check: bool) -> RunOptions {
    RunOptions {
        target: Target::Cpu { ranks },
        check,
        check_races: true,
        ..RunOptions::default()
    }
}

#[test]
fn a_bf16_linear_cast_to_f32_passes_on_one_and_two_ranks() {
    for d in [1, 2] {
        let c = common::run_checked(load(LOGITS, &[("d", d)]), d as usize, 2, 5)
            .unwrap_or_else(|f| panic!("{d} ranks: {}: {}", f.stage, f.detail));
        assert!(c.checks.iter().all(|k| k.comparison.ok));
    }
    // The output is f32, but its tolerance is bf16's: the linear rounds to bf16 first.
    assert_eq!(
        output_tolerances(&load(LOGITS, &[])),
        vec![Tolerance::for_dtype(DType::BF16)]
    );
}

#[test]
fn a_bf16_f16_f32_bf16_f32_chain_passes_where_the_unrounded_check_failed() {
    // Stored between segments, and fused into one kernel that rounds only at casts.
    for src in [CHAIN.to_string(), CHAIN.replace("segment_set", "set")] {
        let c = common::run_checked(load(&src, &[]), 1, 1, 7)
            .unwrap_or_else(|f| panic!("{}: {}\n{src}", f.stage, f.detail));
        assert!(c.checks.iter().all(|k| k.comparison.ok));
    }
    // The check as it was (f64 rounded only by casts, at the output's f32 tolerance) calls
    // the same correct run wrong: that is what rounding each op and the path's tolerance fix.
    let exe = executable(CHAIN, &[]);
    let globals = exe.random_inputs(7).unwrap();
    let report = exe.run_dense(&globals, &cpu(1, false)).unwrap();
    let def = load(CHAIN, &[]);
    let unrounded = eval_fusion(&def, &globals, Precision::Exact).unwrap();
    let old = compare(
        &report.ranks[0].outputs[0].data,
        &unrounded[0].data,
        DType::F32,
    );
    assert!(!old.ok, "the unrounded f32 check passed: {old}");
}

#[test]
fn a_wrong_mixed_precision_program_still_fails() {
    // The chain with `exp` replaced by `tanh`, checked against the chain's reference.
    let exe = executable(CHAIN, &[]);
    let wrong = executable(&CHAIN.replace("exp(b)", "tanh(b)"), &[]);
    let globals = exe.random_inputs(3).unwrap();
    let reference = exe.reference(&globals).unwrap();
    let run = wrong.run_dense(&globals, &cpu(1, false)).unwrap();
    let checks = exe.check(&reference, &run.ranks).unwrap();
    assert!(checks.iter().all(|c| !c.comparison.ok));

    // The logits run with one value off by twice the bf16 tolerance of the tensor's scale.
    let exe = executable(LOGITS, &[]);
    let globals = exe.random_inputs(4).unwrap();
    let reference = exe.reference(&globals).unwrap();
    let mut run = exe.run_dense(&globals, &cpu(1, false)).unwrap();
    assert!(exe
        .check(&reference, &run.ranks)
        .unwrap()
        .iter()
        .all(|c| c.comparison.ok));
    let scale = reference[0].data.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    run.ranks[0].outputs[0].data[5] += 2.0 * 1.6e-2 * scale;
    let checks = exe.check(&reference, &run.ranks).unwrap();
    assert_eq!(checks[0].comparison.mismatches, 1);
    assert_eq!(checks[0].comparison.worst, Some(5));
}

#[test]
fn an_f32_path_from_bf16_inputs_keeps_the_f32_tolerance() {
    // Casting an input up is exact on both sides: only ops that round loosen the tolerance.
    let f = load(
        "fusion f() {\n tensor x: bf16[4]\n tensor i: i64[4]\n a = cast(x, f32)\n b = exp(a)\n \
         c = cast(b, bf16)\n j = add(i, i)\n output b, c, j\n}\n",
        &[],
    );
    assert_eq!(
        output_tolerances(&f),
        vec![
            Tolerance::for_dtype(DType::F32),
            Tolerance::for_dtype(DType::BF16),
            Tolerance::for_dtype(DType::I64),
        ]
    );
}

#[test]
fn integer_div_and_pow_on_generated_inputs_are_defined_and_match() {
    let src = "fusion ints(t = 8, h = 6, d = 1) {
  mesh m = devices(d)
  tensor a: i64[t, h] on m
  tensor b: i64[t, h] on m
  tensor c: i64[t, h] on m
  bb = set(b)
  q = div(a, bb)
  p = pow(a, c)
  output q, p
  schedule a { outer_split(0, d) -> DIDx }
}
";
    for d in [1, 2] {
        let c = common::run_checked(load(src, &[("d", d)]), d as usize, 2, 9)
            .unwrap_or_else(|f| panic!("{d} ranks: {}: {}", f.stage, f.detail));
        assert_eq!(c.checks.len(), 2 * d as usize);
    }
    // The generated divisor has no zeros and the exponent no negative values, while the
    // dividend keeps both signs.
    let exe = executable(src, &[]);
    let g = exe.random_inputs(9).unwrap();
    assert!(g[1].data.iter().all(|v| *v != 0.0));
    assert!(g[2].data.iter().all(|v| *v >= 0.0));
    assert!(g[0].data.iter().any(|v| *v < 0.0));
    // Without that, the same values divide by zero.
    let mut zero = g.clone();
    zero[1] = Dense::new(DType::I64, vec![8, 6], vec![0.0; 48]).unwrap();
    assert_eq!(
        exe.reference(&zero).unwrap_err().to_string(),
        "reference evaluation failed: div `q`: integer division by zero"
    );
}
