//! Compile-time benchmarks on the CPU: loading (parse, schedule, verify) the row-parallel
//! linear fusion. Later layers add the pass pipeline here (target: under 2 ms end to end).

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use criterion::{black_box, criterion_group, criterion_main, Criterion};

fn load_row_parallel(c: &mut Criterion) {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/scenarios/row_parallel_linear.weave"
    );
    let source = std::fs::read_to_string(path).expect("fixture exists");
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

criterion_group!(benches, load_row_parallel);
criterion_main!(benches);
