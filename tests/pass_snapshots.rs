//! One isolated run of every pass of the default pipeline on every fixture: each pass runs
//! alone (through the pass manager, so its output is verified) on the IR the passes before it
//! produced, and the snapshot records what that pass changed — a line diff when the IR form
//! stays the same, the new IR when the pass changes the form. One snapshot file per fixture,
//! one section per pass, in pipeline order.

mod common;

use similar::{ChangeTag, TextDiff};
use streamweave::passes::{manager::render, DumpOptions, Ir, PassManager, Pipeline, Registry};

fn diff(before: &str, after: &str) -> String {
    if before == after {
        return "(no change)\n".to_string();
    }
    let d = TextDiff::from_lines(before, after);
    let mut out = String::new();
    for group in d.grouped_ops(1) {
        out.push_str("@@\n");
        for op in group {
            for change in d.iter_changes(&op) {
                let sign = match change.tag() {
                    ChangeTag::Delete => '-',
                    ChangeTag::Insert => '+',
                    ChangeTag::Equal => ' ',
                };
                out.push(sign);
                out.push_str(change.value());
                if !change.value().ends_with('\n') {
                    out.push('\n');
                }
            }
        }
    }
    out
}

fn run_one(pass: &str, ir: Ir) -> Ir {
    let registry = Registry::standard();
    let pipeline = Pipeline::parse(pass, &registry).unwrap();
    PassManager::new(registry, pipeline)
        .with_options(DumpOptions::default())
        .run_with_output(ir, &mut Vec::new())
        .unwrap_or_else(|e| panic!("{pass}: {e}"))
}

#[test]
fn every_pass_on_every_fixture() {
    common::snapshot_each_fixture("snapshots/passes", |name, path| {
        let mut ir = Ir::Fusion(streamweave::load_file(path, &[]).unwrap());
        let mut report = String::new();
        for pass in Pipeline::standard().names() {
            let (form, before) = (ir.form(), render(&ir));
            ir = run_one(pass, ir);
            let after = render(&ir);
            report.push_str(&format!("=== {pass} ({form} -> {})\n", ir.form()));
            if form == ir.form() {
                report.push_str(&diff(&before, &after));
            } else {
                report.push_str(&after);
            }
        }
        insta::assert_snapshot!(name, report);
    });
}
