//! Host-cost benchmarks on the CPU: loading (parse, schedule, verify) the row-parallel
//! linear fusion, compiling it through the whole pass pipeline to its host program (target:
//! under 2 ms), and the evaluator's own cost per loop iteration, measured on the meter
//! backend, which does no device work (target: under 5 µs); and how loading and compiling
//! grow with a tensor's rank and a fusion's parameter count (near-linear: from 2,000 to
//! 16,000 the time per parameter stays flat and the time per axis grows 1.5×;
//! docs/benchmarks.md).

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Bencher, Criterion, Throughput};
use streamweave::Compiler;
use weave_executor::meter::MeterBackend;
use weave_executor::{run_rank, Dense};

fn source() -> String {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/scenarios/row_parallel_linear.weave"
    );
    std::fs::read_to_string(path).expect("fixture exists")
}

fn load_row_parallel(c: &mut Criterion) {
    let source = source();
    c.bench_function("load row_parallel_linear", |b| {
        b.iter(|| streamweave::load("row_parallel_linear.weave", black_box(&source), &[]).unwrap())
    });
    c.bench_function("parse+print row_parallel_linear", |b| {
        b.iter(|| {
            let f = streamweave::ir::text::parse(black_box(&source), &[]).unwrap();
            streamweave::ir::text::print(&f)
        })
    });
}

fn compile_row_parallel(c: &mut Criterion) {
    let source = source();
    c.bench_function(
        "load+compile row_parallel_linear (whole pipeline)",
        compiling("row_parallel_linear.weave", &source),
    );
}

/// The routine that loads and compiles `source` (the file `file`) through the whole pipeline.
fn compiling<'a>(file: &'a str, source: &'a str) -> impl FnMut(&mut Bencher<'_>) + 'a {
    move |b| {
        b.iter(|| {
            Compiler::new()
                .compile_source(file, black_box(source))
                .unwrap()
        })
    }
}

/// A fusion of one `neg` over a tensor of `rank` axes, or over a fusion of `params`
/// parameters.
fn wide_source(rank: usize, params: usize) -> String {
    let axes = vec!["1"; rank.max(1)].join(", ");
    let ps: Vec<String> = (0..params.max(1)).map(|i| format!("p{i} = 1")).collect();
    format!(
        "fusion wide({}) {{\n  tensor x: f32[{axes}]\n  y = neg(x)\n  output y\n}}\n",
        ps.join(", ")
    )
}

/// Loading and compiling per axis and per parameter, at growing counts (`Throughput` makes
/// criterion report the time per element: flat means linear).
fn scaling(c: &mut Criterion) {
    let mut group = c.benchmark_group("scaling");
    group.sample_size(10);
    for n in [2000usize, 16000] {
        let by_rank = wide_source(n, 1);
        let by_params = wide_source(1, n);
        group.throughput(Throughput::Elements(n as u64));
        group.bench_function(
            format!("load+compile rank {n}"),
            compiling("wide.weave", &by_rank),
        );
        group.bench_function(
            format!("load+compile {n} parameters"),
            compiling("wide.weave", &by_params),
        );
    }
    group.finish();
}

/// One rank of the row-parallel program with `s` chunks on the meter backend: every
/// statement is evaluated (scalars, views, events, posts) and no device work is done, so the
/// time per chunk is the evaluator's cost per loop iteration.
fn evaluator_per_iteration(c: &mut Criterion) {
    let mut group = c.benchmark_group("evaluator");
    for s in [4usize, 64] {
        let set: Vec<(String, i64)> = [("t", 64 * s as i64), ("h", 8), ("d", 2), ("s", s as i64)]
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect();
        let mut compiler = Compiler::new();
        for (k, v) in &set {
            compiler = compiler.set(k, *v);
        }
        let exe = compiler
            .compile_source("row_parallel_linear.weave", &source())
            .unwrap();
        let inputs: Vec<Dense> = exe
            .inputs()
            .iter()
            .map(|t| Dense {
                dtype: t.dtype,
                sizes: t.local_sizes(),
                data: Vec::new(),
            })
            .collect();
        let config = exe.config(&streamweave::RunOptions {
            streams: 2,
            check_races: false,
            ..streamweave::RunOptions::default()
        });
        group.throughput(Throughput::Elements(s as u64));
        group.bench_function(
            format!("row_parallel_linear, {s} chunks (per chunk: 1 / throughput)"),
            |b| {
                b.iter(|| {
                    let backend = MeterBackend::new();
                    let comm = backend.comm(0, 2);
                    run_rank(exe.program(), &backend, &comm, black_box(&inputs), &config).unwrap()
                })
            },
        );
    }
    group.finish();
}

/// A chain of `n` pointwise ops (`t_i = neg(t_{i-1})`), optionally stream-split: what a long
/// generated program looks like to the compiler.
fn chain(n: usize, streamed: bool) -> String {
    let mut s = String::from("fusion chain(m = 64, s = 4) {\n  tensor t0: f32[m, 8]\n");
    for i in 1..=n {
        s.push_str(&format!("  t{i} = neg(t{})\n", i - 1));
    }
    s.push_str(&format!("  output t{n}\n"));
    if streamed {
        s.push_str(&format!(
            "  schedule t{n} {{ outer_split(0, s) -> Stream }}\n"
        ));
    }
    s.push_str("}\n");
    s
}

/// Load and lower long chains (target: 10,000 ops in under a second, growing near-linearly).
fn compile_long_chains(c: &mut Criterion) {
    let mut group = c.benchmark_group("long chains");
    group.sample_size(10);
    for n in [1_000usize, 10_000] {
        for streamed in [false, true] {
            let source = chain(n, streamed);
            let what = if streamed { "stream-split" } else { "plain" };
            group.throughput(Throughput::Elements(n as u64));
            group.bench_function(
                format!("load+compile {n} ops, {what}"),
                compiling("chain.weave", &source),
            );
        }
    }
    group.finish();
}

criterion_group!(
    benches,
    load_row_parallel,
    compile_row_parallel,
    evaluator_per_iteration,
    compile_long_chains,
    scaling
);
criterion_main!(benches);
