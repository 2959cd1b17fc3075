//! Builds the row-parallel linear fusion with the Rust builder API instead of `.weave` text,
//! schedules it, verifies it and prints it both ways.
//!
//! Run with `cargo run --example row_parallel_builder`.

use streamweave::ir::{
    print::fusion_to_string, text, verify::verify, DType, Fusion, MeshSpec, ParallelType, Scalar,
    ScheduleOp, ScheduleStep,
};
use streamweave::transform::schedule::apply_schedules;

fn step(op: ScheduleOp) -> ScheduleStep {
    ScheduleStep { op, span: None }
}

fn main() -> Result<(), streamweave::ir::Diagnostic> {
    let mut f = Fusion::new("row_parallel_linear");
    for (name, v) in [("t", 8192), ("h", 8192), ("d", 2), ("s", 3)] {
        f.add_param(name, Some(v))?;
    }
    let m = f.add_mesh("m", MeshSpec::Devices(vec![Scalar::named("d")]))?;
    let four_h = Scalar::named("h").mul(4);
    let inp = f.add_input(
        "inp",
        DType::BF16,
        vec![Scalar::named("t"), four_h.clone()],
        Some(m),
    )?;
    let w = f.add_input("w", DType::BF16, vec![Scalar::named("h"), four_h], Some(m))?;
    let out = f.linear("out", inp, w, None)?;
    f.add_output(out)?;
    f.tensor_mut(inp).schedule = vec![
        step(ScheduleOp::OuterSplit {
            axis: 0,
            factor: Scalar::named("s"),
            parallel: Some(ParallelType::Stream),
        }),
        step(ScheduleOp::OuterSplit {
            axis: 2,
            factor: Scalar::named("d"),
            parallel: Some(ParallelType::DIDx),
        }),
    ];
    f.tensor_mut(w).schedule = vec![step(ScheduleOp::OuterSplit {
        axis: 1,
        factor: Scalar::named("d"),
        parallel: Some(ParallelType::DIDx),
    })];
    apply_schedules(&mut f)?;
    verify(&f)?;
    println!("{}", text::print(&f));
    println!("{}", fusion_to_string(&f));
    Ok(())
}
