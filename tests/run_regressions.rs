//! Programs that sharding propagation, segmentation and stream-loop placement used to get
//! wrong, each run on the CPU backend against the unsharded f64 reference (race checker on),
//! with a structural check of the IR where the property is structural: no `Stream` on a
//! reduction axis, which tensors are streamed, how many segments and stream loops there are.

mod common;

use common::Checked;
use streamweave::host_ir::{HostProgram, Stmt};
use streamweave::ir::{Fusion, IterType, ParallelType, TensorId};
use streamweave::passes::{Ir, PassManager, Pipeline, Registry};

/// Compiles `source` with `overrides` and runs it on `ranks` ranks; an error holds the stage,
/// the program and the report.
fn run(source: &str, overrides: &[(&str, i64)], ranks: usize) -> Result<Checked, String> {
    let ov: Vec<(String, i64)> = overrides.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    let what = |stage: &str, detail: String| {
        format!("{stage} failed ({ranks} ranks, {overrides:?}):\n{source}\n--- {detail}")
    };
    let fusion =
        streamweave::load("case.weave", source, &ov).map_err(|e| what("load", e.to_string()))?;
    common::run_checked(fusion, ranks, 2, 11).map_err(|f| what(f.stage, f.detail))
}

/// [`run`] on every rank count in `ranks`, setting `d` to it; panics with every failure.
fn runs_on(source: &str, ranks: &[usize], extra: &[(&str, i64)]) -> Vec<Checked> {
    let mut ok = Vec::new();
    let mut failures = Vec::new();
    for &r in ranks {
        let mut ov = extra.to_vec();
        if source.contains("d = ") {
            ov.push(("d", r as i64));
        }
        match run(source, &ov, r) {
            Ok(c) => ok.push(c),
            Err(e) => failures.push(e),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    ok
}

fn tensor(f: &Fusion, name: &str) -> TensorId {
    f.tensor_by_name(name)
        .unwrap_or_else(|| panic!("no tensor `{name}`"))
}

/// The names of tensors with a `Stream` axis on a reduction axis of their loop domain.
fn streamed_reductions(f: &Fusion) -> Vec<String> {
    f.tensors_in_order()
        .into_iter()
        .filter(|t| {
            f.tensor(*t).loop_domain.iter().any(|i| {
                let d = f.id(*i);
                d.parallel == ParallelType::Stream && d.iter_type == IterType::Reduction
            })
        })
        .map(|t| f.tensor(t).name.clone())
        .collect()
}

fn has(f: &Fusion, name: &str, pt: ParallelType) -> bool {
    let t = tensor(f, name);
    f.tensor(t)
        .loop_domain
        .iter()
        .any(|i| f.id(*i).parallel == pt)
}

/// The top-level loops of `p` that do work (not the join loops of `assign-streams`).
fn compute_loops(p: &HostProgram) -> usize {
    p.top_level
        .iter()
        .filter(|s| match &p.stmts[**s] {
            Stmt::ForLoop { body, .. } => body.iter().any(|b| {
                !matches!(
                    p.stmts[*b],
                    Stmt::Synchronize { .. } | Stmt::SetCurrentStream { .. }
                )
            }),
            _ => false,
        })
        .count()
}

/// The segments of `source` after the pre-segmentation passes, one line each.
fn segments(source: &str) -> Vec<String> {
    let f = streamweave::load("case.weave", source, &[]).unwrap();
    let registry = Registry::standard();
    let pipeline = Pipeline::parse(
        "propagate-shardings,decompose-reshardings,reorder-sharded-axis,finalize-multidevice-domains,segment",
        &registry,
    )
    .unwrap();
    match PassManager::new(registry, pipeline)
        .run(Ir::Fusion(f))
        .unwrap()
    {
        Ir::Segmented(sf) => sf.to_string().lines().map(str::to_string).collect(),
        other => panic!("expected a segmented fusion, got {}", other.form()),
    }
}

/// The backward of a row-parallel linear: grad_inp is stream-split on the token axis, which
/// propagation also gives grad_out and its permute; grad_w contracts over that axis, so it
/// must stay unstreamed (it used to receive Stream on its reduction axis and be refused).
#[test]
fn a_reduction_over_a_streamed_axis_stays_outside_the_stream_loop() {
    let source = std::fs::read_to_string(common::fixture("row_parallel_linear_backward")).unwrap();
    for c in runs_on(&source, &[1, 2, 3, 4], &[]) {
        let f = &c.sharded();
        assert_eq!(streamed_reductions(f), Vec::<String>::new());
        assert!(has(f, "grad_inp", ParallelType::Stream));
        assert!(has(f, "grad_out_t", ParallelType::Stream));
        assert!(!has(f, "grad_w", ParallelType::Stream));
        assert_eq!(compute_loops(&c.program), 1);
        // grad_w's GEMM runs at top level, after the loop.
        let top_gemms = c
            .program
            .top_level
            .iter()
            .filter(|s| matches!(c.program.stmts[**s], Stmt::Matmul { .. }))
            .count();
        assert_eq!(top_gemms, 1);
    }
    // The same with a linear for grad_inp (w transposed), every tensor on the mesh.
    let linear = "fusion bwd_linear(t = 12, h = 2, d = 2, s = 3) {
  mesh m = devices(d)
  tensor inp: f32[t, 4 * h] on m
  tensor wt: f32[4 * h, h] on m
  tensor grad_out: f32[t, h] on m
  grad_inp = linear(grad_out, wt)
  grad_out_t = permute(grad_out, [1, 0])
  grad_w = matmul(grad_out_t, inp)
  output grad_inp, grad_w
  schedule inp { outer_split(1, d) -> DIDx }
  schedule wt { outer_split(0, d) -> DIDx }
  schedule grad_inp { mesh = m; outer_split(0, s) -> Stream; outer_split(2, d) -> DIDx }
}
";
    for c in runs_on(linear, &[1, 2, 4], &[]) {
        assert_eq!(streamed_reductions(&c.sharded()), Vec::<String>::new());
        assert!(!has(&c.sharded(), "grad_w", ParallelType::Stream));
    }
}

/// A schedule with stream splits only and no `mesh = …` chooses streams, not devices: the
/// tensor still receives its neighbours' mesh and DID splits (it used to stay meshless, and a
/// compiler-made copy failed with "`grad_out_resharded` has no device mesh").
#[test]
fn a_stream_only_schedule_still_receives_the_device_sharding() {
    let column = "fusion stream_only(t = 8, h = 2, d = 2, s = 2) {
  mesh m = devices(d)
  tensor w: f32[h, 4 * h] on m
  tensor grad_out: f32[t, h]
  grad_x = matmul(grad_out, w)
  output grad_x
  schedule w { outer_split(1, d) -> DIDx }
  schedule grad_x { outer_split(0, s) -> Stream }
}
";
    for c in runs_on(column, &[1, 2, 4], &[]) {
        let f = &c.sharded();
        assert!(has(f, "grad_x", ParallelType::Stream));
        assert!(has(f, "grad_x", ParallelType::DIDx));
        assert!(f.tensor(tensor(f, "grad_x")).mesh.is_some());
    }
    let chain = "fusion stream_only_chain(t = 8, h = 2, s = 2, d = 2) {
  mesh m = devices(d)
  tensor x: f32[t, h] on m
  a = neg(x)
  b = exp(a)
  output b
  schedule x { outer_split(1, d) -> DIDx }
  schedule a { outer_split(0, s) -> Stream }
}
";
    for c in runs_on(chain, &[1, 2], &[]) {
        assert!(has(&c.sharded(), "a", ParallelType::DIDx));
    }
    // No mesh anywhere: a stream split on one intermediate.
    let single = "fusion stream_only_single(t = 8, h = 2, s = 2) {
  tensor x: f32[t, 4 * h]
  tensor w: f32[h, 4 * h]
  tensor grad_out: f32[t, h]
  grad_x = matmul(grad_out, w)
  gt = permute(grad_out, [1, 0])
  grad_w = matmul(gt, x)
  output grad_x, grad_w
  schedule grad_x { outer_split(0, s) -> Stream }
}
";
    runs_on(single, &[1], &[]);
}

/// An add chunked by rows feeding a sum chunked by columns: the two kernels have the same
/// parallel signature but unmapped stream axes, so they are two segments in two loops (they
/// used to be fused, and lowering refused "only defined inside a stream loop").
#[test]
fn kernels_streamed_on_different_axes_are_separate_segments() {
    let source = "fusion two_axes(a = 4, b = 6, s = 2) {
  tensor x: f32[a, b]
  tensor y: f32[a, b]
  z = add(x, y)
  r = sum(z, [0])
  output r
  schedule z { outer_split(0, s) -> Stream }
  schedule r { outer_split(1, s) -> Stream }
}
";
    let segs = segments(source);
    assert_eq!(segs.len(), 2, "{segs:#?}");
    for c in runs_on(source, &[1], &[]) {
        assert_eq!(compute_loops(&c.program), 2);
    }
}

/// One chunk (what `--chunks auto` picks on CUDA when overlap cannot pay): two one-iteration
/// loops over unmapped stream axes stay two loops, and the tensor the second reads is
/// allocated whole, not per chunk of the first (`two_matmuls_not_inlinable` failed with "`t`
/// is read before it is defined"). tests/scenario_sweep.rs runs every scenario with s = 1.
#[test]
fn one_chunk_loops_over_unmapped_axes_stay_apart() {
    let source = std::fs::read_to_string(common::fixture("two_matmuls_not_inlinable")).unwrap();
    for s in 1..=3 {
        for c in runs_on(&source, &[1], &[("s", s)]) {
            let p = &c.program;
            assert_eq!(compute_loops(p), 2, "s = {s}");
            // `t` (M × N = 6 × 6; no other tensor has that shape) is allocated whole at top
            // level, before the first loop.
            let sig = p.signature.as_ref().unwrap();
            let whole = p.top_level.iter().any(|st| match &p.stmts[*st] {
                Stmt::Allocate { tensor, .. } => {
                    let sizes: Option<Vec<i64>> = p.tensors[*tensor]
                        .sizes
                        .iter()
                        .map(|s| match &p.scalars[*s] {
                            streamweave::host_ir::HostScalar::Value(v) => v.eval(&|n| sig.param(n)),
                            _ => None,
                        })
                        .collect();
                    sizes == Some(vec![6, 6])
                }
                _ => false,
            });
            assert!(whole, "s = {s}");
        }
    }
}

/// A segment outside the stream loop that reads nothing the loop produced moves before the
/// loop, so the loop stays one and its per-chunk intermediates stay loop-local (lower-to-host
/// used to open a second loop that read them across the segment: "`X` is read before it is
/// defined"). The shapes of the known gap: a column-parallel linear fed by a P2P allgather with
/// a replicated bias; a stream-split cast feeding a matmul whose weight is cast separately; an
/// RMSNorm with a gain vector, on one device and with the hidden axis device-split.
#[test]
fn top_level_segments_independent_of_a_stream_loop_do_not_split_it() {
    let ag_bias = "fusion ag_bias(d = 2) {
  mesh m = devices(d)
  tensor inp: f32[d, 4] on m
  tensor w: f32[d, 4] on m
  tensor bias: f32[d] on m
  ag = set(inp)
  out = linear(ag, w, bias)
  output out
  schedule inp { outer_split(0, d) -> DIDx }
  schedule w { outer_split(0, d) -> DIDx }
  schedule ag { mesh = m; outer_split(0, d) -> Stream }
}
";
    for c in runs_on(ag_bias, &[1, 2, 3, 4], &[]) {
        assert_eq!(compute_loops(&c.program), 1);
    }
    let cast_matmul = "fusion cast_matmul(t = 8, h = 4, n = 3, s = 2) {
  tensor x: bf16[t, h]
  tensor w: bf16[h, n]
  inpf = cast(x, f32)
  wf = cast(w, f32)
  out = matmul(inpf, wf)
  output out
  schedule x { outer_split(0, s) -> Stream }
}
";
    for c in runs_on(cast_matmul, &[1], &[]) {
        assert_eq!(compute_loops(&c.program), 1);
    }
    let rms_norm = "fusion rms_norm(t = 8, h = 4, s = 2) {
  tensor x: f32[t, h]
  tensor g: f32[h]
  tensor eps: f32[t]
  x2 = mul(x, x)
  ss = sum(x2, [1])
  ms = add(ss, eps)
  r = rsqrt(ms)
  rb = broadcast(r, [1])
  gb = broadcast(g, [0])
  y0 = mul(x, rb)
  y = mul(y0, gb)
  output y
  schedule x { outer_split(0, s) -> Stream }
}
";
    runs_on(rms_norm, &[1], &[]);
    // Hidden axis DID-split: the sum of squares is a partial sum per device, allreduced per
    // chunk (this one failed with "`ss_partial` is read before it is defined").
    let rms_norm_tp = "fusion rms_norm_tp(t = 8, h = 4, s = 2, d = 2) {
  mesh m = devices(d)
  tensor x: bf16[t, h] on m
  tensor g: bf16[h] on m
  tensor eps: f32[t] on m
  xf = cast(x, f32)
  gf = cast(g, f32)
  x2 = mul(xf, xf)
  ss = sum(x2, [1])
  ms = add(ss, eps)
  r = rsqrt(ms)
  rb = broadcast(r, [1])
  y0 = mul(xf, rb)
  gb = broadcast(gf, [0])
  y = mul(y0, gb)
  out = cast(y, bf16)
  output out
  schedule x { outer_split(0, s) -> Stream; outer_split(2, d) -> DIDx }
}
";
    for c in runs_on(rms_norm_tp, &[1, 2, 4], &[]) {
        assert_eq!(compute_loops(&c.program), 1);
    }
}

/// A row-parallel linear with a bias, stream-split: the bias add is one kernel inside the
/// stream loop, after the Allreduce's `Wait` (never before the reduction over devices).
#[test]
fn the_bias_of_a_row_parallel_linear_is_added_after_the_reduction() {
    let source = std::fs::read_to_string(common::fixture("row_parallel_linear_bias")).unwrap();
    for c in runs_on(&source, &[1, 2, 3, 4], &[]) {
        let p = &c.program;
        assert_eq!(compute_loops(p), 1);
        let body = p
            .top_level
            .iter()
            .find_map(|s| match &p.stmts[*s] {
                Stmt::ForLoop { body, .. } if body.len() > 2 => Some(body.clone()),
                _ => None,
            })
            .unwrap();
        let kinds: Vec<&str> = body.iter().map(|s| p.stmts[*s].kind_name()).collect();
        let launch = kinds.iter().position(|k| *k == "LaunchKernel").unwrap();
        let linear = kinds.iter().position(|k| *k == "Linear").unwrap();
        assert!(linear < launch, "{kinds:?}");
        if let Some(wait) = kinds.iter().position(|k| *k == "Wait") {
            assert!(wait < launch, "{kinds:?}");
        }
        // The product the GEMM computes has no bias.
        let biased = p
            .walk()
            .any(|w| matches!(p.stmts[w.stmt], Stmt::Linear { bias: Some(_), .. }));
        assert!(!biased);
    }
}

/// Heads split out of a device-split hidden axis and merged back (tests/scenarios/
/// split_merge_heads.weave): each device's block of the hidden axis holds whole heads, so no
/// communication is needed — `decompose-reshardings` used to refuse the merge from inside
/// the pass ("does not reshard"). Matches the reference on 1, 2 and 4 ranks, with even and
/// uneven stream chunks and heads of several sizes.
#[test]
fn heads_split_and_merged_around_a_device_split_need_no_communication() {
    let source = std::fs::read_to_string(common::fixture("split_merge_heads")).unwrap();
    for extra in [
        &[("s", 1)][..],
        &[("s", 3), ("t", 7)],
        &[("nh", 8), ("hd", 5), ("s", 4)],
    ] {
        for c in runs_on(&source, &[1, 2, 4], extra) {
            let p = &c.program;
            let comms = p
                .walk()
                .filter(|w| matches!(p.stmts[w.stmt], Stmt::Communication(_)))
                .count();
            assert_eq!(comms, 0, "{extra:?}");
            assert_eq!(compute_loops(p), 1, "{extra:?}");
        }
    }
}

/// Sequence ↔ head parallelism through AllToAll (tests/scenarios/ulysses_all_to_all.weave)
/// at several shapes, on 1 to 4 ranks: two AllToAll communications on more than one rank,
/// none on one, and the reference's numbers.
#[test]
fn ulysses_all_to_all_reshards_tokens_to_heads_and_back_at_several_shapes() {
    let source = std::fs::read_to_string(common::fixture("ulysses_all_to_all")).unwrap();
    for extra in [
        &[][..],
        &[("t", 12), ("nh", 12), ("hd", 1)],
        &[("t", 36), ("nh", 24), ("hd", 3)],
    ] {
        for c in runs_on(&source, &[1, 2, 3, 4], extra) {
            let p = &c.program;
            let kinds: Vec<String> = p
                .walk()
                .filter_map(|w| match &p.stmts[w.stmt] {
                    Stmt::Communication(comm) => Some(format!("{:?}", comm.kind)),
                    _ => None,
                })
                .collect();
            let ranks = c.exe.min_ranks();
            if ranks == 1 {
                assert!(kinds.is_empty(), "{extra:?}: {kinds:?}");
            } else {
                assert_eq!(
                    kinds,
                    ["AllToAll", "AllToAll"],
                    "{extra:?} on {ranks} ranks"
                );
            }
        }
    }
}
