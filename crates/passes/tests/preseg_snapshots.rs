//! One isolated snapshot per pre-segmentation pass and fixture: the fixture is brought to the
//! pass's input phase by the passes before it, then only that pass runs; the snapshot shows
//! the fusion before and after it (seed-style printer). Targeted assertions live in the
//! other `preseg_*` tests; these show the shape.

mod preseg_util;

use preseg_util::*;
use weave_ir::Fusion;

/// Runs the pipeline up to (not including) `pass`, then `pass`, and renders before/after.
fn before_after(mut f: Fusion, pass: &str) -> String {
    let passes = preseg_passes();
    for p in &passes {
        if p.name() == pass {
            let before = show(&f);
            run(&mut f, p.as_ref());
            return format!("before {pass}:\n{before}\nafter {pass}:\n{}", show(&f));
        }
        run(&mut f, p.as_ref());
    }
    panic!("no pass {pass}");
}

fn snap(pass: &str, fixture: &str) {
    let out = before_after(load(fixture), pass);
    insta::assert_snapshot!(format!("{pass}__{fixture}"), out);
}

#[test]
fn propagate_shardings() {
    for fixture in [
        "propagation_forward",
        "propagation_backward",
        "sharded_allocation",
        "row_parallel_linear",
        "column_parallel_linear",
    ] {
        snap("propagate-shardings", fixture);
    }
}

#[test]
fn decompose_reshardings() {
    for fixture in [
        "row_parallel_linear",
        "matmul_rs",
        "reduce_scatter",
        "allreduce",
        "ag_matmul",
    ] {
        snap("decompose-reshardings", fixture);
    }
}

#[test]
fn reorder_sharded_axis() {
    for (name, src) in [
        ("inner_allgather", INNER_ALLGATHER),
        ("inner_reduce_scatter", INNER_REDUCE_SCATTER),
    ] {
        let out = before_after(load_src(src), "reorder-sharded-axis");
        insta::assert_snapshot!(format!("reorder-sharded-axis__{name}"), out);
    }
}

#[test]
fn finalize_multidevice_domains() {
    for fixture in [
        "sharded_allocation",
        "replicated_allocation",
        "row_parallel_linear",
        "column_parallel_linear",
        "matmul_rs",
        "reduce_scatter",
    ] {
        snap("finalize-multidevice-domains", fixture);
    }
}
