//! Every scenario of tests/scenarios runs on the CPU backend with 1, 2, 3 and 4 in-process
//! ranks (`d` set to the rank count where the fusion has that parameter; a scenario on a 2-D
//! mesh `devices(dy, dx)` runs the shapes of [`MESH_SHAPES_2D`] on `dy * dx` ranks), matches
//! the unsharded f64 reference on every rank, and passes the race checker.

mod common;

use common::fixtures;

use std::time::Duration;

use streamweave::{Compiler, Executable, RunOptions, Target};

/// The rank counts a scenario runs with: every count, except for fusions whose meshes are
/// written with fixed devices.
fn rank_counts(name: &str) -> &'static [usize] {
    match name {
        "send_recv" => &[2],
        _ => &[1, 2, 3, 4],
    }
}

/// The `dy × dx` shapes the scenarios on a 2-D mesh `devices(dy, dx)` run with, on `dy * dx`
/// ranks: both mesh axes alone, both together, and an odd data-parallel count.
const MESH_SHAPES_2D: [(usize, usize); 4] = [(1, 2), (2, 1), (2, 2), (3, 1)];

/// Whether the fusion header has parameter `p`.
fn has_param(source: &str, p: &str) -> bool {
    let header = source
        .lines()
        .find(|l| l.starts_with("fusion"))
        .unwrap_or("");
    header.contains(&format!("({p} = ")) || header.contains(&format!(" {p} = "))
}

/// Every run of a scenario: its rank count and the overrides that go with it.
fn runs_of(name: &str, source: &str) -> Vec<(usize, Vec<(String, i64)>)> {
    if has_param(source, "dy") && has_param(source, "dx") {
        return MESH_SHAPES_2D
            .iter()
            .map(|&(dy, dx)| {
                let mut o = overrides(source, dy * dx);
                o.push(("dy".to_string(), dy as i64));
                o.push(("dx".to_string(), dx as i64));
                (dy * dx, o)
            })
            .collect();
    }
    rank_counts(name)
        .iter()
        .map(|&ranks| (ranks, overrides(source, ranks)))
        .collect()
}

/// One run of a scenario: its name, rank count, overrides and the fusion loaded with them.
struct Run {
    name: String,
    ranks: usize,
    overrides: Vec<(String, i64)>,
    fusion: streamweave::ir::Fusion,
}

/// Every run of every scenario ([`runs_of`]), loaded.
fn every_run() -> Vec<Run> {
    let mut out = Vec::new();
    for path in fixtures() {
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        let source = std::fs::read_to_string(&path).unwrap();
        for (ranks, overrides) in runs_of(&name, &source) {
            let fusion = streamweave::load(&name, &source, &overrides)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            out.push(Run {
                name: name.clone(),
                ranks,
                overrides,
                fusion,
            });
        }
    }
    out
}

/// Small sizes for the scenarios whose defaults are benchmark sizes.
fn overrides(source: &str, ranks: usize) -> Vec<(String, i64)> {
    let has = |p: &str| has_param(source, p);
    let mut o = Vec::new();
    if has("d") {
        o.push(("d".to_string(), ranks as i64));
    }
    if has("t") {
        o.push(("t".to_string(), 48));
    }
    if has("h") {
        o.push(("h".to_string(), 12));
    }
    o
}

/// Runs `compiled` (scenario `name` loaded with `overrides`) on `ranks` CPU ranks with
/// `streams` pool streams, the reference check and the race checker; the failure, if any.
fn failure_of(
    name: &str,
    compiled: &Executable,
    ranks: usize,
    streams: usize,
    overrides: &[(String, i64)],
) -> Option<String> {
    let globals = compiled.random_inputs(7 + ranks as u64).unwrap();
    let options = RunOptions {
        target: Target::Cpu { ranks },
        check: true,
        streams,
        check_races: true,
        timeouts: streamweave::Timeouts::all(Duration::from_secs(20)),
        ..RunOptions::default()
    };
    match compiled.run_dense(&globals, &options) {
        Ok(report) if report.passed() => {
            assert!(!report.checks.is_empty(), "{name}: no output was checked");
            None
        }
        Ok(report) => {
            let races: Vec<String> = report
                .ranks
                .iter()
                .flat_map(|r| r.races.iter().map(ToString::to_string))
                .collect();
            let bad = common::failed_checks(&report);
            Some(format!(
                "{name} ({ranks} ranks, {overrides:?}): {bad:?} {races:?}"
            ))
        }
        Err(e) => Some(format!("{name} ({ranks} ranks, {overrides:?}): {e}")),
    }
}

#[test]
fn every_scenario_matches_the_reference_on_1_to_4_ranks_without_races() {
    let mut runs = 0;
    let mut failures = Vec::new();
    for Run {
        name,
        ranks,
        overrides,
        fusion,
    } in every_run()
    {
        // Vary the pool size too: 1, 2 and 3 streams across the rank counts.
        let streams = 1 + ranks % 3;
        let compiled = Compiler::new()
            .compile(&fusion)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        runs += 1;
        failures.extend(failure_of(&name, &compiled, ranks, streams, &overrides));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(runs >= 44 * 3, "only {runs} runs");
}

/// Every scenario with Stream axes and no chunk-count parameter (the rings written with one
/// stream chunk per device, the swizzled and P2P forms), compiled with one chunk (`--chunks
/// 1`, which the tuner measures as such a program's S = 1): its Stream axes run serially, so
/// its host program has no stream loop, and it matches the reference on 1 to 4 ranks without
/// races. The two rings become their collectives: one ReduceScatter of the partial sums (and
/// the MLP block's Allgather first), no point-to-point transfer.
#[test]
fn scenarios_without_a_chunk_count_run_their_stream_axes_serially_with_one_chunk() {
    use streamweave::ir::ParamRole;
    let mut runs = 0;
    let mut failures = Vec::new();
    let mut names = Vec::new();
    for Run {
        name,
        ranks,
        overrides,
        fusion,
    } in every_run()
    {
        if fusion.role_param(ParamRole::ChunkCount).is_some() || !fusion.has_stream_axes() {
            continue;
        }
        let compiled = Compiler::new()
            .chunks(streamweave::Chunks::Fixed(1))
            .compile(&fusion)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        // The same inputs and outputs, each rank's buffers of the same sizes: a caller's
        // buffers fit the serial form (a repeated `Executable::run` may switch to it).
        let as_written = Compiler::new()
            .compile(&fusion)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        for (a, b) in [
            (as_written.inputs(), compiled.inputs()),
            (as_written.outputs(), compiled.outputs()),
        ] {
            assert_eq!(a.len(), b.len(), "{name}");
            for (x, y) in a.iter().zip(b) {
                assert_eq!((&x.name, x.dtype, &x.shape), (&y.name, y.dtype, &y.shape));
                for rank in 0..ranks {
                    assert_eq!(
                        x.local_sizes_of(rank),
                        y.local_sizes_of(rank),
                        "{name}: `{}` on rank {rank}",
                        x.name
                    );
                }
            }
        }
        let program = compiled.program();
        assert_eq!(streamweave::tune::loop_chunks(program), None, "{name}");
        assert!(
            !program.walk().any(|w| matches!(
                program.stmts[w.stmt],
                streamweave::host_ir::Stmt::SetCurrentStream { .. }
            )),
            "{name}: a stream loop is left\n{}",
            streamweave::host_ir::print(program)
        );
        if ranks == 2 {
            let kinds = common::communication_kinds(program);
            let p2p = program.walk().any(|w| {
                matches!(
                    program.stmts[w.stmt],
                    streamweave::host_ir::Stmt::P2PCommunication(_)
                )
            });
            match name.as_str() {
                "matmul_rs_ring" => assert_eq!(kinds, ["ReduceScatter"], "{name}"),
                "row_parallel_ring" => {
                    assert_eq!(kinds, ["ReduceScatter", "Allgather"], "{name}")
                }
                "sequence_parallel_mlp_ring" => {
                    assert_eq!(kinds, ["Allgather", "ReduceScatter"], "{name}")
                }
                _ => {}
            }
            if name.ends_with("_ring") {
                assert!(!p2p, "{name}");
            }
            names.push(name.clone());
        }
        runs += 1;
        failures.extend(failure_of(
            &name,
            &compiled,
            ranks,
            1 + ranks % 3,
            &overrides,
        ));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    for ring in [
        "matmul_rs_ring",
        "row_parallel_ring",
        "sequence_parallel_mlp_ring",
    ] {
        assert!(names.iter().any(|n| n == ring), "{ring} not run: {names:?}");
    }
    assert!(runs >= 8, "only {runs} runs: {names:?}");
}

#[test]
fn row_parallel_linear_with_more_chunks_than_streams_is_race_free_and_exact_in_f32() {
    // The functional configuration of §10 #43 in f32 so that the comparison is tight: three
    // chunks on two pool streams reuse the loop-local partial buffer's slots.
    let source = std::fs::read_to_string(common::fixture("row_parallel_linear"))
        .unwrap()
        .replace("bf16", "f32");
    let set = |k: &str, v: i64| (k.to_string(), v);
    let fusion = streamweave::load(
        "row_parallel_linear",
        &source,
        &[set("t", 6), set("h", 2), set("s", 3), set("d", 2)],
    )
    .unwrap();
    let compiled = Compiler::new().compile(&fusion).unwrap();
    let globals = compiled.random_inputs(1).unwrap();
    for streams in 1..=4 {
        let report = compiled
            .run_dense(&globals, &checked_on_cpu(2, streams))
            .unwrap();
        assert!(report.passed(), "{streams} streams: {:?}", report.checks);
        assert!(report.max_abs_error() < 1e-5, "{}", report.max_abs_error());
        // Three linears and three allreduces per rank, one per chunk.
        assert_eq!(report.ranks[0].statements, report.ranks[1].statements);
    }
}

#[test]
fn serial_splits_of_any_factor_match_the_reference() {
    // A Serial split only names a loop; the buffer is the whole axis whatever the factor,
    // also when it exceeds the extent (M = 3 rows split by up to 7) or does not divide it.
    let schedules = [
        "schedule c { outer_split(0, s) -> Serial }",
        "schedule c { outer_split(1, s) -> Serial }",
        "schedule c { inner_split(1, s) -> Serial }",
        "schedule a { outer_split(0, s) -> Serial }",
        "schedule a { outer_split(0, s) -> Serial }\n  schedule c { outer_split(1, s) -> Serial }",
    ];
    for schedule in schedules {
        let source = format!(
            "fusion serial(M = 3, K = 4, N = 5, s = 2) {{\n  tensor a: f32[M, K]\n  \
             tensor b: f32[K, N]\n  c = matmul(a, b)\n  output c\n  {schedule}\n}}\n"
        );
        for s in 1..=7 {
            let fusion = streamweave::load("serial.weave", &source, &[("s".to_string(), s)])
                .unwrap_or_else(|e| panic!("{e}"));
            let compiled = Compiler::new().compile(&fusion).unwrap();
            let globals = compiled.random_inputs(3).unwrap();
            let report = compiled.run_dense(&globals, &checked_on_cpu(1, 2)).unwrap();
            assert!(report.passed(), "{schedule}, s = {s}: {:?}", report.checks);
            assert!(report.max_abs_error() < 1e-5, "{schedule}, s = {s}");
            assert_eq!(report.ranks[0].outputs[0].sizes, vec![3, 5]);
        }
    }
}

/// Runs fixture `name` with `sets` on `ranks` in-process ranks and a pool of 2 streams, with
/// the race checker on, and asserts that every output matches the reference.
fn assert_matches_reference(name: &str, sets: &[(&str, i64)], ranks: usize) {
    let source = std::fs::read_to_string(common::fixture(name)).unwrap();
    let ov: Vec<(String, i64)> = sets.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    let fusion = streamweave::load(name, &source, &ov).unwrap_or_else(|e| panic!("{name}: {e}"));
    let compiled = Compiler::new()
        .compile(&fusion)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let globals = compiled.random_inputs(11).unwrap();
    let report = compiled
        .run_dense(&globals, &checked_on_cpu(ranks, 2))
        .unwrap_or_else(|e| panic!("{name} {sets:?}: {e}"));
    assert!(
        report.passed(),
        "{name} {sets:?} on {ranks} ranks: {:?}",
        report.checks
    );
    assert!(!report.checks.is_empty());
}

/// §10 #44 functional config (h = 2, t = 24; h = 3 where d = 3 needs it) and §10 #39 at
/// nvFuser's sizes (M = 32, K = 8, N = 2, S = 4), on their rank counts.
#[test]
fn functional_configs_of_column_parallel_linear_and_matmul_rs_match_the_reference() {
    for d in 1..=4i64 {
        let h = if d == 3 { 3 } else { 2 };
        assert_matches_reference(
            "column_parallel_linear",
            &[("d", d), ("h", h), ("t", 24)],
            d as usize,
        );
    }
    for d in [1, 2, 4i64] {
        assert_matches_reference(
            "matmul_rs_through_bcast_logical",
            &[("d", d), ("M", 32), ("K", 8)],
            d as usize,
        );
    }
}

/// `swizzle1d` only reorders each rank's iterations: a loop of per-rank compute visits chunk
/// (rank + i) % d, while a loop that posts a collective per chunk keeps the natural order
/// (every rank must post the same chunk). Both match the reference on 1-4 ranks.
#[test]
fn swizzled_loops_rotate_compute_but_not_collectives() {
    let compute = "fusion sw_compute(d = 2) {\n  mesh m = devices(d)\n  \
                   tensor tv0: f32[d, 6, 4] on m\n  tensor w: f32[4, 5] on m\n  \
                   tv1 = neg(tv0)\n  tv2 = matmul(tv1, w)\n  tv3 = exp(tv2)\n  output tv3\n  \
                   schedule tv3 { mesh = m; swizzle1d(0, DIDx); parallelize(0, Stream) }\n}\n";
    let collective = "fusion sw_allgather(d = 2) {\n  mesh m = devices(d)\n  \
                      tensor tv0: f32[d, d] on m\n  tv1 = set(tv0)\n  output tv1\n  \
                      schedule tv0 { parallelize(1, DIDx) }\n  \
                      schedule tv1 { mesh = m; swizzle1d(0, DIDx); parallelize(0, Stream) }\n}\n";
    for d in 1..=4i64 {
        for (source, rotated) in [(compute, true), (collective, false)] {
            let fusion = streamweave::load("sw.weave", source, &[("d".to_string(), d)]).unwrap();
            let compiled = Compiler::new().compile(&fusion).unwrap();
            let text = streamweave::host_ir::print(compiled.program());
            let rot = format!("stream_index=( ( rank + i0 ) % {d} ))");
            assert_eq!(text.contains(&rot), rotated, "d={d}:\n{text}");
            if !rotated {
                assert!(text.contains("stream_index=i0)"), "d={d}:\n{text}");
            }
            let globals = compiled.random_inputs(5).unwrap();
            let report = compiled
                .run_dense(&globals, &checked_on_cpu(d as usize, 2))
                .unwrap();
            assert!(report.passed(), "d={d}: {:?}\n{text}", report.checks);
        }
    }
}

/// Every scenario with Stream axes and no chunk-count parameter, compiled with a chunk count
/// that is 2 and 4 times its chunks (`--chunks 2d`, `4d`: a reduce ring's steps cut into
/// pieces and summed in its GEMMs). The three rings compile: the loop that sums runs `d * k`
/// iterations, adds every product with an accumulating GEMM into a zeroed buffer whose last
/// block is the output, launches no kernel, waits for the receive `k` iterations back, and
/// matches the reference on 2 to 4 ranks without races, on 1 to 3 pool streams; the
/// row-parallel ring posts its allgather in the last step's exchanges. Every other
/// such scenario is refused, naming what is missing (no ring summed by a GEMM, or a stream
/// axis of one element per device that cannot be cut into pieces).
#[test]
fn rings_in_pieces_sum_in_their_gemms_and_match_the_reference() {
    use streamweave::host_ir::{HostScalar, Stmt};
    use streamweave::ir::ParamRole;
    let mut runs = 0;
    let mut failures = Vec::new();
    for Run {
        name,
        ranks,
        overrides,
        fusion,
    } in every_run()
    {
        let no_count = fusion.role_param(ParamRole::ChunkCount).is_none();
        if !no_count || !fusion.has_stream_axes() || ranks < 2 {
            continue;
        }
        for k in [2usize, 4] {
            let compiled = Compiler::new()
                .chunks(streamweave::Chunks::Fixed(ranks * k))
                .compile(&fusion);
            let compiled = match compiled {
                Ok(c) => c,
                Err(e) => {
                    assert!(!name.ends_with("_ring"), "{name}: {e}");
                    let e = e.to_string();
                    assert!(
                        e.contains("has no reduce ring whose partials a GEMM of its loop computes")
                            || e.contains("has no chunk-count parameter")
                            // A ring whose stream axis is one chunk per device by
                            // itself (`parallelize(1, Stream)` on an axis of size d).
                            || e.contains("equal pieces"),
                        "{name}: {e}"
                    );
                    continue;
                }
            };
            assert!(name.ends_with("_ring"), "{name} took ring pieces");
            assert_eq!(compiled.ring_pieces(), Some((ranks * k, k as i64)));
            let p = compiled.program();
            let summing = p
                .walk()
                .find_map(|w| match &p.stmts[w.stmt] {
                    Stmt::ForLoop { stop, body, .. }
                        if body.iter().any(|s| {
                            matches!(
                                p.stmts[*s],
                                Stmt::Linear {
                                    accumulate: true,
                                    ..
                                }
                            )
                        }) =>
                    {
                        Some((*stop, body.clone()))
                    }
                    _ => None,
                })
                .unwrap_or_else(|| panic!("{name}: no loop sums in its GEMM"));
            let trip = match &p.scalars[summing.0] {
                HostScalar::Value(v) => v.as_const(),
                _ => None,
            };
            assert_eq!(trip, Some((ranks * k) as i64), "{name}");
            let body: Vec<&Stmt> = summing.1.iter().map(|s| &p.stmts[*s]).collect();
            assert!(
                !body.iter().any(|s| matches!(s, Stmt::LaunchKernel { .. })),
                "{name}"
            );
            streamweave::host_ir::verify(p).unwrap_or_else(|e| panic!("{name}: {e}"));
            let text = streamweave::host_ir::print(p);
            // The printed program parses back to the same text.
            let reparsed = streamweave::host_ir::parse(&text)
                .unwrap_or_else(|e| panic!("{name}: {e}\n{text}"));
            assert_eq!(streamweave::host_ir::print(&reparsed), text, "{name}");
            if name == "matmul_rs_ring" && ranks == 2 && k == 2 {
                insta::assert_snapshot!("matmul_rs_ring_in_2_pieces_on_2_ranks", text);
            }
            let wait = "Synchronize(Stream ( ( i";
            let back = format!("+ ( {k} * ( numberOfStreams - 1 ) ) ) % numberOfStreams ))");
            assert!(
                text.lines().any(|l| l.contains(wait) && l.contains(&back)),
                "{name}: no wait {k} iterations back\n{text}"
            );
            assert!(text.contains("zero_init=true"), "{name}\n{text}");
            if name == "row_parallel_ring" {
                // Its allgather goes out piece by piece in the ring's last step: no
                // collective, and d pairs in each iteration's exchange (the ring's and one
                // to each other rank).
                assert!(common::communication_kinds(p).is_empty(), "{name}\n{text}");
                let p2p = body
                    .iter()
                    .filter(|s| matches!(s, Stmt::P2PCommunication(_)))
                    .count();
                assert_eq!(p2p, 2 * ranks, "{name}\n{text}");
            }
            runs += 1;
            let streams = 1 + (ranks + k) % 3;
            failures.extend(failure_of(&name, &compiled, ranks, streams, &overrides));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(
        runs,
        3 * 3 * 2,
        "the three rings on 2, 3 and 4 ranks in 2 and 4 pieces"
    );
}

/// The ring form (`Chunks::Ring`, `weave run --chunks ring:K`) of every scenario on 2 to 4
/// ranks, each step whole and in 2 pieces: refused, saying why, or run with the race checker
/// against the reference. The layers a user writes with a collective (the row-parallel
/// linear, with and without a bias, the column-parallel linear, `matmul_rs`, the MLP block)
/// all have one, and in pieces the rewritten collectives are gone from their host programs.
#[test]
fn ring_forms_of_every_scenario_match_the_reference_or_are_refused() {
    const LAYERS: [&str; 5] = [
        "row_parallel_linear",
        "row_parallel_linear_bias",
        "column_parallel_chunked",
        "matmul_rs",
        "sequence_parallel_mlp_block",
    ];
    let mut failures = Vec::new();
    let mut layers = 0;
    let mut others = 0;
    for Run {
        name,
        ranks,
        overrides,
        fusion,
    } in every_run()
    {
        for k in [1usize, 2] {
            let compiled = match Compiler::new()
                .devices(ranks)
                .chunks(streamweave::Chunks::Ring(k))
                .compile(&fusion)
            {
                Ok(c) => c,
                Err(e) => {
                    let e = e.to_string();
                    let is_layer = LAYERS.contains(&name.as_str()) && ranks >= 2;
                    // Refused as a whole (no ring site); its rings all gather (nothing to
                    // cut into pieces); a reduce ring that pieces cannot take (its loop holds
                    // another communication: the MLP block's backward); or a one-chunk form
                    // the data refuses.
                    let known = e.contains("has no ring form")
                        || e.contains("has no reduce ring to cut into pieces")
                        || e.contains("has no reduce ring whose partials a GEMM")
                        || e.contains("the ring form: ");
                    if is_layer && !(k > 1 && name == "column_parallel_chunked") || !known {
                        failures.push(format!("{name} on {ranks} ranks, ring:{k}: {e}"));
                    }
                    continue;
                }
            };
            let form = compiled.ring_form().expect("compiled in its ring form");
            assert!(!form.rings.is_empty(), "{name}");
            let p = compiled.program();
            streamweave::host_ir::verify(p).unwrap_or_else(|e| panic!("{name}: {e}"));
            if LAYERS.contains(&name.as_str()) {
                layers += 1;
                let kinds = common::communication_kinds(p);
                let rewritten = ["ReduceScatter", "Allreduce"];
                assert!(
                    !kinds.iter().any(|c| rewritten.contains(&c.as_str())),
                    "{name} on {ranks} ranks, ring:{k} ({form}): {kinds:?}"
                );
                if k > 1 {
                    assert!(kinds.is_empty(), "{name} {ranks} ring:{k}: {kinds:?}");
                    assert_eq!(compiled.ring_pieces(), Some((ranks * k, k as i64)));
                }
            } else {
                others += 1;
            }
            let streams = 1 + (ranks + k) % 3;
            failures.extend(failure_of(&name, &compiled, ranks, streams, &overrides));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Each layer on 2, 3 and 4 ranks, whole and (but for column-parallel, whose only ring
    // gathers) in 2 pieces.
    assert_eq!(layers, 3 * (5 * 2 - 1), "the five layers' ring forms");
    assert!(others > 0, "no other scenario has a ring form");
}

/// A run on `ranks` CPU ranks with a pool of `streams`, checked against the reference, the
/// race checker on (the default).
fn checked_on_cpu(ranks: usize, streams: usize) -> RunOptions {
    RunOptions {
        check: true,
        target: Target::Cpu { ranks },
        streams,
        check_races: true,
        ..RunOptions::default()
    }
}

/// `compiled` on `ranks` CPU ranks and 1 to 3 pool streams, with the race checker: every
/// output matches the reference, each value within `tolerance` (`what` names the case).
fn matches_in_f32_on_cpu(compiled: &Executable, ranks: usize, tolerance: f64, what: &str) {
    let globals = compiled.random_inputs(5).unwrap();
    for streams in 1..=3 {
        let report = compiled
            .run_dense(&globals, &checked_on_cpu(ranks, streams))
            .unwrap();
        assert!(report.passed(), "{what}, K={streams}");
        assert!(
            report.max_abs_error() < tolerance,
            "{what}, K={streams}: {}",
            report.max_abs_error()
        );
    }
}

/// A reduce ring whose partials a `matmul` computes (the weight written `[4h, h]`) sums in
/// that GEMM too (`T += matmul(..)`), in f32 within rounding of the reference, on 2 to 4 ranks
/// in 2 and 4 pieces a step, on 1 to 3 pool streams, without races.
#[test]
fn a_matmul_ring_in_pieces_sums_in_its_gemm() {
    const SOURCE: &str = "fusion mm_ring(t = 48, h = 12, d = 2) {
  mesh m = devices(d)
  tensor inp: f32[t, 4 * h] on m
  tensor w: f32[4 * h, h] on m
  p = matmul(inp, w)
  out = set(p)
  output out
  schedule inp { outer_split(1, d) -> DIDx }
  schedule w { outer_split(0, d) -> DIDx }
  schedule p { mesh = m; outer_split(2, d) -> DIDx; outer_split(0, d) -> Stream }
  schedule out { mesh = m; outer_split(0, d) -> DIDx }
}";
    for ranks in 2..=4usize {
        let fusion =
            streamweave::load("mm_ring", SOURCE, &[("d".to_string(), ranks as i64)]).unwrap();
        for k in [2usize, 4] {
            let compiled = Compiler::new()
                .chunks(streamweave::Chunks::Fixed(ranks * k))
                .compile(&fusion)
                .unwrap();
            let text = streamweave::host_ir::print(compiled.program());
            assert!(text.contains("+= matmul("), "{text}");
            assert!(!text.contains("LaunchKernel"), "{text}");
            let what = format!("{ranks} ranks, {k} pieces");
            matches_in_f32_on_cpu(&compiled, ranks, 1e-5, &what);
        }
    }
}

/// The row-parallel ring's gather moves into the ring's last step only when the allgather is
/// all that reads the ring's output: with `y` also an output, or also read by another op,
/// the allgather stays a collective after the loop. Every form matches the f32 reference on
/// 2 to 4 ranks in 2 pieces a step, on 1 to 3 pool streams, without races.
#[test]
fn a_ring_gathers_in_its_last_step_only_when_the_allgather_alone_reads_its_output() {
    let source = |outputs: &str, extra: &str| {
        format!(
            "fusion rp_ring(t = 48, h = 12, d = 2) {{
  mesh m = devices(d)
  tensor inp: f32[t, 4 * h] on m
  tensor w: f32[h, 4 * h] on m
  p = linear(inp, w)
  y = set(p)
  out = set(y)
  {extra}
  output {outputs}
  schedule inp {{ outer_split(1, d) -> DIDx }}
  schedule w {{ outer_split(1, d) -> DIDx }}
  schedule p {{ mesh = m; outer_split(2, d) -> DIDx; outer_split(0, d) -> Stream }}
  schedule y {{ mesh = m; outer_split(0, d) -> DIDx }}
  schedule out {{ mesh = m }}
}}"
        )
    };
    let forms = [
        (source("out", ""), false),
        (source("out, y", ""), true),
        (source("out, r", "r = relu(y)"), true),
    ];
    for (text, keeps_collective) in &forms {
        for ranks in 2..=4usize {
            let fusion =
                streamweave::load("rp_ring", text, &[("d".to_string(), ranks as i64)]).unwrap();
            let compiled = Compiler::new()
                .chunks(streamweave::Chunks::Fixed(ranks * 2))
                .compile(&fusion)
                .unwrap_or_else(|e| panic!("{e}\n{text}"));
            let kinds = common::communication_kinds(compiled.program());
            let printed = streamweave::host_ir::print(compiled.program());
            assert_eq!(
                kinds == ["Allgather"],
                *keeps_collective,
                "{ranks} ranks: {kinds:?}\n{printed}"
            );
            matches_in_f32_on_cpu(&compiled, ranks, 1e-4, &format!("{ranks} ranks\n{text}"));
        }
    }
}
