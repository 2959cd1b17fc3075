//! Shared helpers of the pre-segmentation pass tests: load a scenario fixture, run passes with
//! the verifier after each, look tensors and axes up.

#![allow(dead_code)]

use weave_ir::{Fusion, IterDomainId, ParallelType, TensorId};
use weave_passes::decompose_reshardings::DecomposeReshardings;
use weave_passes::finalize_multidevice_domains::FinalizeMultideviceDomains;
use weave_passes::propagate_shardings::PropagateShardings;
use weave_passes::reorder_sharded_axis::ReorderShardedAxis;
use weave_passes::{Changed, FusionPass, PassError};

/// An allgather of an inner axis (DIDx on axis 1 of `inp`, `out` replicated).
pub const INNER_ALLGATHER: &str = "fusion inner_allgather(d = 2, n = 3) {
  mesh m = devices(d)
  tensor inp: f32[n, d * 4] on m
  out = set(inp)
  output out
  schedule inp { outer_split(1, d) -> DIDx }
  schedule out { mesh = m }
}";

/// A reduce-scatter whose scattered axis is not outermost.
pub const INNER_REDUCE_SCATTER: &str = "fusion inner_reduce_scatter(d = 2, n = 3) {
  mesh m = devices(d)
  tensor inp: f32[n, d, d] on m
  out = sum(inp, [1])
  output out
  schedule inp { parallelize(1, DIDx) }
  schedule out { mesh = m; parallelize(2, DIDx) }
}";

/// `(parallel type, extent)` of the row-parallel linear's per-chunk `out` (and
/// `out_partial`) after propagation: Stream chunks of tokens, then the device reduction axis.
pub const ROW_PARALLEL_OUT_LOOP: [(ParallelType, i64); 5] = [
    (ParallelType::Stream, 4),
    (ParallelType::Serial, 2048),
    (ParallelType::Serial, 8192),
    (ParallelType::DIDx, 2),
    (ParallelType::Serial, 16384),
];

/// A fusion of one op on one input, one statement a line, the body indented by `indent`
/// plus two spaces and the closing brace by `indent`: `fusion {sig} { mesh m = {mesh};
/// tensor {x}: f32[{shape}] on m; {y} = {def}; output {y}; schedule {x} { {x_steps} };
/// schedule {y} { {y_steps} } }`.
pub fn one_op(
    indent: &str,
    [sig, mesh]: [&str; 2],
    [x, shape]: [&str; 2],
    [y, def]: [&str; 2],
    [x_steps, y_steps]: [&str; 2],
) -> String {
    format!(
        "fusion {sig} {{
{indent}  mesh m = {mesh}
{indent}  tensor {x}: f32[{shape}] on m
{indent}  {y} = {def}
{indent}  output {y}
{indent}  schedule {x} {{ {x_steps} }}
{indent}  schedule {y} {{ {y_steps} }}
{indent}}}"
    )
}

/// Parses `source`, applies its schedules and verifies it (what `streamweave::load` does).
pub fn load_src(source: &str) -> Fusion {
    let mut f = weave_ir::text::parse(source, &[]).expect("parses");
    weave_transform::schedule::apply_schedules(&mut f).expect("schedules apply");
    weave_ir::verify::verify(&f).expect("verifies");
    f
}

/// Loads `tests/scenarios/<name>.weave` of the workspace.
pub fn load(name: &str) -> Fusion {
    let path = format!(
        "{}/../../tests/scenarios/{name}.weave",
        env!("CARGO_MANIFEST_DIR")
    );
    let src = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    load_src(&src)
}

/// The four pre-segmentation passes, in pipeline order.
pub fn preseg_passes() -> Vec<Box<dyn FusionPass>> {
    vec![
        Box::new(PropagateShardings),
        Box::new(DecomposeReshardings),
        Box::new(ReorderShardedAxis),
        Box::new(FinalizeMultideviceDomains),
    ]
}

/// Runs `pass` on `f` and verifies the result.
pub fn try_run(f: &mut Fusion, pass: &dyn FusionPass) -> Result<Changed, PassError> {
    let mut out = f.clone();
    let changed = pass.run(&mut out)?;
    if let Err(d) = weave_ir::verify::verify(&out) {
        panic!(
            "IR invalid after `{}`: {d}\n{}",
            pass.name(),
            weave_ir::print::fusion_to_string(&out)
        );
    }
    *f = out;
    Ok(changed)
}

/// Runs `pass` on `f`, which must succeed, and verifies the result.
pub fn run(f: &mut Fusion, pass: &dyn FusionPass) -> Changed {
    try_run(f, pass).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs the passes of the pipeline up to and including `last` (a pass name).
pub fn run_until(f: &mut Fusion, last: &str) {
    for p in preseg_passes() {
        run(f, p.as_ref());
        if p.name() == last {
            return;
        }
    }
    panic!("no pass named {last}");
}

/// Runs the whole pre-segmentation pipeline, checking that a second run of each pass changes
/// nothing (idempotence).
pub fn preseg(f: &mut Fusion) {
    for p in preseg_passes() {
        run(f, p.as_ref());
        assert_eq!(
            run(f, p.as_ref()),
            Changed::No,
            "`{}` is not idempotent:\n{}",
            p.name(),
            weave_ir::print::fusion_to_string(f)
        );
    }
}

/// The tensor named `name`.
pub fn t(f: &Fusion, name: &str) -> TensorId {
    f.tensor_by_name(name)
        .unwrap_or_else(|| panic!("no tensor `{name}`"))
}

/// The parallel types of `name`'s loop axes.
pub fn loop_types(f: &Fusion, name: &str) -> Vec<ParallelType> {
    f.tensor(t(f, name))
        .loop_domain
        .iter()
        .map(|i| f.id(*i).parallel)
        .collect()
}

/// `(parallel type, evaluated extent)` of each loop axis of `name`.
pub fn loop_shape(f: &Fusion, name: &str) -> Vec<(ParallelType, i64)> {
    shape(f, &f.tensor(t(f, name)).loop_domain)
}

/// `(parallel type, evaluated extent)` of each of `ids`.
pub fn shape(f: &Fusion, ids: &[IterDomainId]) -> Vec<(ParallelType, i64)> {
    ids.iter()
        .map(|i| {
            (
                f.id(*i).parallel,
                f.eval(&f.id(*i).extent).expect("constant"),
            )
        })
        .collect()
}

/// The seed-style print of the fusion.
pub fn show(f: &Fusion) -> String {
    weave_ir::print::fusion_to_string(f)
}
