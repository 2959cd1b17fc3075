//! Every fixture in tests/scenarios: it loads (parse, schedule, verify), round-trips through
//! the `.weave` printer, and its seed-style print matches the reviewed snapshot.

mod common;

use common::fixtures;

use std::path::Path;

use streamweave::ir::{self, IterType, ParallelType};

#[test]
fn there_are_at_least_25_scenarios() {
    assert!(fixtures().len() >= 25, "only {} fixtures", fixtures().len());
}

#[test]
fn every_fixture_loads_and_verifies() {
    let mut failures = Vec::new();
    for p in fixtures() {
        if let Err(e) = streamweave::load_file(&p, &[]) {
            failures.push(e.to_string());
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn every_fixture_round_trips() {
    for p in fixtures() {
        let src = std::fs::read_to_string(&p).unwrap();
        let once = ir::text::print(&ir::text::parse(&src, &[]).unwrap());
        let twice = ir::text::print(&ir::text::parse(&once, &[]).unwrap_or_else(|e| {
            panic!("{}: printed form does not parse: {e}\n{once}", p.display())
        }));
        assert_eq!(
            once,
            twice,
            "{}: print(parse(x)) is not a fixed point",
            p.display()
        );
        // The printed form also schedules and verifies like the original.
        let reloaded = streamweave::load("printed", &once, &[]).unwrap();
        let original = streamweave::load_file(&p, &[]).unwrap();
        assert_eq!(
            ir::print::fusion_to_string(&reloaded),
            ir::print::fusion_to_string(&original),
            "{}",
            p.display()
        );
    }
}

#[test]
fn every_fixture_prints_as_reviewed() {
    common::snapshot_each_fixture("snapshots/scenarios", |name, p| {
        let f = streamweave::load_file(p, &[]).unwrap();
        insta::assert_snapshot!(name, ir::print::fusion_to_string(&f));
    });
}

/// The acceptance check: `dump row_parallel_linear.weave --set s=3` shows a stream
/// axis of 3 chunks and a device axis of 2 on the input, as in the seeds.
#[test]
fn row_parallel_linear_with_three_streams() {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios/row_parallel_linear.weave");
    let f = streamweave::load_file(&p, &[("s".into(), 3)]).unwrap();
    let inp = f.tensor_by_name("inp").unwrap();
    let loop_: Vec<_> = f
        .tensor(inp)
        .loop_domain
        .iter()
        .map(|i| (f.id(*i).parallel, f.eval(&f.id(*i).extent)))
        .collect();
    assert_eq!(
        loop_,
        vec![
            (ParallelType::Stream, Some(3)),
            (ParallelType::Serial, Some(2731)),
            (ParallelType::DIDx, Some(2)),
            (ParallelType::Serial, Some(16384)),
        ]
    );
    let out = f.tensor_by_name("out").unwrap();
    let last = *f.tensor(out).logical.last().unwrap();
    assert_eq!(f.id(last).iter_type, IterType::Reduction);
    let printed = ir::print::fusion_to_string(&f);
    assert!(printed.contains("istreamIdx"), "{printed}");
    assert!(printed.contains("ideviceIdx.x"), "{printed}");
    assert!(printed.contains("{( ceilDiv(t, 3) )}"), "{printed}");
    assert!(printed.contains("(DeviceMesh{0 1})"), "{printed}");
}
