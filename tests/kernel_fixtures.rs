//! The kernel benchmark's fixtures (tests/scenarios/kernels/*.weave) on the CPU backend: each
//! loads, compiles and runs at small sizes, whole and cut into stream chunks (uneven ones
//! too), matches the f64 reference of its definition, and computes the math its comment
//! names (checked here against a formula written out in f64, independent of the fusion).

use std::path::PathBuf;
use std::time::Duration;

use streamweave::executor::dense::Dense;
use streamweave::ir::DType;
use streamweave::{Compiler, RunOptions, Target};

/// Every fixture the benchmark runs.
const CASES: [&str; 9] = weave_bench::KERNEL_CASES;

fn path(case: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/scenarios/kernels/{case}.weave"))
}

/// `v` rounded to f32.
fn f32r(v: f64) -> f64 {
    v as f32 as f64
}

/// The output of `case` on `inputs` (by name; constants from [`constants`]), row-major, in
/// f64 from the formula: what the fixture is meant to compute.
fn formula(case: &str, t: usize, h: usize, input: &dyn Fn(&str) -> Vec<f64>) -> Vec<f64> {
    let rows = |x: &[f64]| -> Vec<Vec<f64>> { x.chunks(h).map(<[f64]>::to_vec).collect() };
    match case {
        "add" => {
            let (a, b) = (input("a"), input("b"));
            a.iter().zip(&b).map(|(a, b)| a + b).collect()
        }
        "silu" => input("x").iter().map(|x| x / (1.0 + (-x).exp())).collect(),
        "gelu_tanh" => {
            let (k0, k1) = (f32r(0.797_884_56), f32r(0.044_715));
            input("x")
                .iter()
                .map(|x| 0.5 * x * (1.0 + (k0 * (x + k1 * x * x * x)).tanh()))
                .collect()
        }
        "bias_residual" => {
            let (x, bias, res) = (input("x"), input("bias"), input("residual"));
            (0..t * h).map(|i| x[i] + bias[i % h] + res[i]).collect()
        }
        "row_sum" => rows(&input("x")).iter().map(|r| r.iter().sum()).collect(),
        "col_sum" => {
            let x = input("x");
            (0..h).map(|j| (0..t).map(|i| x[i * h + j]).sum()).collect()
        }
        "softmax" => rows(&input("x"))
            .iter()
            .flat_map(|r| {
                let m = r.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = r.iter().map(|v| (v - m).exp()).sum();
                r.iter().map(move |v| (v - m).exp() / z).collect::<Vec<_>>()
            })
            .collect(),
        "layernorm" => {
            let (w, b) = (input("weight"), input("bias"));
            let eps = f32r(1e-5);
            rows(&input("x"))
                .iter()
                .flat_map(|r| {
                    let mean = r.iter().sum::<f64>() / h as f64;
                    let var = r.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / h as f64;
                    let inv = 1.0 / (var + eps).sqrt();
                    r.iter()
                        .enumerate()
                        .map(|(j, v)| (v - mean) * inv * w[j] + b[j])
                        .collect::<Vec<_>>()
                })
                .collect()
        }
        "rmsnorm" => {
            let w = input("weight");
            let eps = f32r(1e-6);
            rows(&input("x"))
                .iter()
                .flat_map(|r| {
                    let ms = r.iter().map(|v| v * v).sum::<f64>() / h as f64;
                    let inv = 1.0 / (ms + eps).sqrt();
                    r.iter()
                        .enumerate()
                        .map(|(j, v)| v * inv * w[j])
                        .collect::<Vec<_>>()
                })
                .collect()
        }
        other => panic!("no formula for {other}"),
    }
}

/// Runs `case` at (t, h, s) on one CPU rank with two streams and the race checker; fails
/// with the stage and what it said.
fn run_case(case: &str, t: usize, h: usize, s: usize) -> Result<(), String> {
    let source = std::fs::read_to_string(path(case)).map_err(|e| format!("read: {e}"))?;
    let exe = Compiler::new()
        .set("t", t as i64)
        .set("h", h as i64)
        .set("s", s as i64)
        .compile_source(&format!("{case}.weave"), &source)
        .map_err(|e| format!("compile: {e}"))?;
    let consts = weave_bench::kernel_constants(case, h);
    let globals: Vec<Dense> = exe
        .inputs()
        .iter()
        .enumerate()
        .map(
            |(k, sig)| match consts.iter().find(|(n, _)| *n == sig.name) {
                Some((_, v)) => Dense::new(sig.dtype, sig.shape.clone(), vec![f32r(*v)])
                    .expect("a 0-d constant"),
                None => Dense::random(sig.dtype, sig.shape.clone(), 7 + k as u64),
            },
        )
        .collect();
    let options = RunOptions {
        target: Target::Cpu { ranks: 1 },
        streams: 2,
        check: true,
        check_races: true,
        timeouts: streamweave::Timeouts::all(Duration::from_secs(20)),
        ..RunOptions::default()
    };
    let report = exe
        .run_dense(&globals, &options)
        .map_err(|e| format!("run: {e}"))?;
    if report.checks.is_empty() || !report.passed() {
        let detail: Vec<String> = report
            .checks
            .iter()
            .map(|c| format!("{}: {}", c.output, c.comparison))
            .collect();
        return Err(format!(
            "check against the reference: {} ({} race(s))",
            detail.join("; "),
            report.races()
        ));
    }
    // The fixture computes what its comment says.
    let input = |name: &str| -> Vec<f64> {
        let k = exe
            .inputs()
            .iter()
            .position(|sig| sig.name == name)
            .unwrap_or_else(|| panic!("{case} has no input `{name}`"));
        globals[k].data.clone()
    };
    let want = formula(case, t, h, &input);
    let outputs = report.into_outputs().map_err(|e| format!("outputs: {e}"))?;
    let (_, out) = outputs.iter().next().ok_or("no output")?;
    let got = out.to_dense().data;
    let dtype = out.dtype();
    let c = streamweave::executor::reference::compare(&got, &want, dtype);
    if !c.ok {
        return Err(format!("against the formula: {c}"));
    }
    let expected_dtype = if matches!(case, "row_sum" | "col_sum") {
        DType::F32
    } else {
        DType::BF16
    };
    if dtype != expected_dtype {
        return Err(format!("output is {dtype}, expected {expected_dtype}"));
    }
    Ok(())
}

#[test]
fn every_kernel_fixture_matches_the_reference_whole_and_chunked() {
    let mut failures = Vec::new();
    let mut ran = 0;
    for case in CASES {
        for (t, h) in [(8, 16), (12, 40), (10, 16)] {
            for s in [1, 4] {
                ran += 1;
                if let Err(e) = run_case(case, t, h, s) {
                    failures.push(format!("{case} t={t} h={h} s={s}: {e}"));
                }
            }
        }
    }
    assert_eq!(ran, CASES.len() * 6);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_benchmark_runs_every_kernel_fixture() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios/kernels");
    let mut found: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "weave"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    found.sort();
    let mut cases: Vec<String> = CASES.iter().map(|c| c.to_string()).collect();
    cases.sort();
    assert_eq!(found, cases);
}

/// Each fixture is one kernel segment, launched once per chunk, and one generated kernel: the
/// broadcasts of its 0-d
/// constants and the casts of its weights (unsplit tensors feeding a chunked kernel) fold
/// into that kernel instead of running as kernels of their own before the stream loop.
#[test]
fn every_kernel_fixture_is_one_kernel_per_chunk() {
    for case in CASES {
        let source = std::fs::read_to_string(path(case)).expect("the fixture");
        let exe = Compiler::new()
            .set("t", 12)
            .set("h", 40)
            .set("s", 3)
            .compile_source(&format!("{case}.weave"), &source)
            .expect("compiles");
        let program = exe.program();
        let launches: Vec<_> = program
            .walk()
            .filter(|w| {
                matches!(
                    program.stmts.get(w.stmt),
                    Some(streamweave::host_ir::Stmt::LaunchKernel { .. })
                )
            })
            .collect();
        assert_eq!(launches.len(), 1, "{case}: {launches:?}");
        assert_eq!(program.kernels.len(), 1, "{case}");
        // And the code generator makes that segment one CUDA kernel (softmax and the norms
        // a row kernel), with no temporary, for every chunk shape.
        let table = exe.kernel_table(1, 2, 132).expect("kernel table");
        assert!(!table.entries().is_empty(), "{case}");
        for k in table.entries() {
            assert_eq!(k.plan.launches.len(), 1, "{case}: {:#?}", k.plan.launches);
            assert!(k.plan.temps.iter().all(|(_, n)| *n == 0), "{case}");
        }
    }
}
