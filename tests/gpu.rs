//! GPU tests: every scenario on 2 and 4 GPUs against the CPU reference (with the CPU race
//! checker agreeing), the large patterns at t = h = 8192 against a row-sampled reference,
//! a rank that fails early ending every rank with an error within the timeout, and the
//! benchmark's execution variants (graph replay, ordered compute, copy-engine transfers,
//! a blocking NCCL communicator) matching the reference, and on one GPU the tuner's winner
//! (the fastest measured configuration, cached) taken by `run` with `--chunks auto`.
//!
//! They run only with `WEAVE_GPU_TESTS=1` on a machine with GPUs (the GPU test bundle sets
//! it); elsewhere each test prints why it is skipped and passes, so CI compiles them and the
//! normal suite stays green without a GPU.
//!
//! The fixtures are found when the tests run (tests/common `scenarios_dir`):
//! `$WEAVE_SCENARIOS`, else the bundle's `scenarios/` beside `bin/gpu-tests`, else the source
//! tree's tests/scenarios.

mod common;

use std::time::{Duration, Instant};

use streamweave::passes::Pipeline;
use streamweave::run::RunError;
use streamweave::{Compiler, Executable, RunOptions, Target};
use weave_executor::reference::{compare, run_reference};
use weave_executor::Dense;

/// One test's turn on the GPUs: the tests of this binary take them one at a time, also
/// when the harness runs them on several threads. Two programs of one process on the same
/// GPUs can wait on each other in the driver (one's GEMM set-up waits for a GPU that waits
/// on the other's copy-engine flag): measured, two of these tests run side by side hung.
type Turn = std::sync::MutexGuard<'static, ()>;

fn turn() -> Turn {
    static GPUS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // A test that failed while holding its turn poisons the lock; the next one still runs.
    GPUS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The number of GPUs to test on and the test's turn on them, or `None` (with the reason
/// printed) to skip.
fn gpus() -> Option<(usize, Turn)> {
    if std::env::var("WEAVE_GPU_TESTS").ok().as_deref() != Some("1") {
        eprintln!("skipped: set WEAVE_GPU_TESTS=1 on a machine with GPUs to run the GPU tests");
        return None;
    }
    match weave_cuda::device_count() {
        Ok(n) if n >= 2 => Some((n, turn())),
        Ok(n) => {
            eprintln!("skipped: {n} GPU(s) visible, the GPU tests need 2 or more");
            None
        }
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
}

fn rank_counts(gpus: usize) -> Vec<usize> {
    [2, 4].into_iter().filter(|r| *r <= gpus).collect()
}

fn load(name: &str, set: &[(&str, i64)]) -> weave_ir::Fusion {
    let set: Vec<(String, i64)> = set.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    streamweave::load_file(&common::fixture(name), &set).expect("the fixture loads")
}

fn gpu_options(ranks: usize) -> RunOptions {
    RunOptions {
        target: Target::Cuda { ranks },
        streams: 2,
        check: true,
        check_races: false,
        timeouts: streamweave::Timeouts::all(Duration::from_secs(60)),
        ..RunOptions::default()
    }
}

fn compile(fusion: weave_ir::Fusion) -> Executable {
    Compiler::new().compile(&fusion).expect("compiles")
}

/// The fixtures are found at run time (no GPU needed): `$WEAVE_SCENARIOS` first, then the
/// bundle's `scenarios/` beside `bin/` (where `bin/gpu-tests` runs from a copied bundle), then
/// the source tree's tests/scenarios.
#[test]
fn the_scenarios_are_the_environments_then_the_bundles_then_the_sources() {
    use std::path::{Path, PathBuf};
    let root = std::env::temp_dir().join(format!("weave-gpu-scenarios-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let bundle = root.join("bundle");
    std::fs::create_dir_all(bundle.join("bin")).unwrap();
    std::fs::create_dir_all(bundle.join("scenarios")).unwrap();
    std::fs::create_dir_all(root.join("plain/bin")).unwrap();
    let bundled_exe = bundle.join("bin/gpu-tests");
    let plain_exe = root.join("plain/bin/gpu-tests");
    let source = PathBuf::from("/src/tests/scenarios");
    let resolve = |env: Option<&str>, exe: Option<&Path>| {
        common::resolve_scenarios(env.map(Into::into), exe, source.clone())
    };
    let cases = [
        (
            resolve(Some("/elsewhere"), Some(&bundled_exe)),
            PathBuf::from("/elsewhere"),
        ),
        (
            resolve(Some(""), Some(&bundled_exe)),
            bundle.join("scenarios"),
        ),
        (resolve(None, Some(&bundled_exe)), bundle.join("scenarios")),
        (resolve(None, Some(&plain_exe)), source.clone()),
        (resolve(None, None), source.clone()),
    ];
    std::fs::remove_dir_all(&root).unwrap();
    for (i, (got, want)) in cases.into_iter().enumerate() {
        assert_eq!(got, want, "case {i}");
    }
    // Here (cargo test, or the bundle) the fixtures the GPU tests load are found.
    for name in ["tp_attention", "row_parallel_linear", "ag_matmul_p2p"] {
        let path = common::fixture(name);
        assert!(path.is_file(), "{}", path.display());
    }
    assert!(common::fixtures().len() > 10);
}

#[test]
fn every_scenario_matches_the_reference_on_2_and_4_gpus_and_the_race_checker_agrees() {
    let Some((n, _turn)) = gpus() else { return };
    let mut table = Vec::new();
    let mut failures = Vec::new();
    for ranks in rank_counts(n) {
        for path in common::fixtures() {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            let fusion = streamweave::load_file(&path, &[]).expect("loads");
            let set: Vec<(String, i64)> = if fusion.params().iter().any(|p| p.name == "d") {
                vec![("d".into(), ranks as i64)]
            } else {
                vec![]
            };
            // The big patterns run at their full size in their own test.
            let mut set = set;
            for (k, v) in [("t", 64), ("h", 32)] {
                if fusion.params().iter().any(|p| p.name == k) {
                    set.push((k.into(), v));
                }
            }
            let fusion = streamweave::load_file(&path, &set).expect("loads");
            let compiled = compile(fusion);
            if compiled.check_ranks(ranks).is_err() {
                continue;
            }
            let globals = compiled.random_inputs(7).unwrap();
            // The CPU race checker first: no races.
            let cpu = compiled.run_dense(
                &globals,
                &RunOptions {
                    check_races: true,
                    target: Target::Cpu { ranks },
                    ..gpu_options(ranks)
                },
            );
            let races = cpu.as_ref().map(|r| r.races()).unwrap_or(usize::MAX);
            let gpu = compiled.run_dense(&globals, &gpu_options(ranks));
            let line = match &gpu {
                Ok(r) => format!(
                    "{name:36} {ranks} ranks: max abs {:.3e} races(cpu) {races} {}",
                    r.max_abs_error(),
                    if r.passed() { "PASS" } else { "FAIL" }
                ),
                Err(e) => format!("{name:36} {ranks} ranks: ERROR {e}"),
            };
            println!("{line}");
            if !matches!(&gpu, Ok(r) if r.passed()) || races != 0 {
                failures.push(line.clone());
            }
            table.push(line);
        }
    }
    assert!(!table.is_empty(), "no scenario ran");
    assert!(failures.is_empty(), "failures:\n{}", failures.join("\n"));
}

/// The three rings written with one stream chunk per device, their steps cut into 2 and 4
/// pieces summed in their GEMMs (`--chunks` 2d and 4d; the row-parallel ring's allgather
/// posted piece by piece in its last step), on NCCL and on the copy engines: every rank
/// matches the reference on 2 and 4 GPUs.
#[test]
fn rings_in_pieces_match_the_reference_on_both_transports() {
    let Some((n, _turn)) = gpus() else { return };
    let names = [
        "matmul_rs_ring",
        "row_parallel_ring",
        "sequence_parallel_mlp_ring",
    ];
    rings_match_the_reference(n, &names, |ranks, k| {
        (
            streamweave::Chunks::Fixed(ranks * k),
            Some((ranks * k, k as i64)),
        )
    });
}

/// The ring form (`Chunks::Ring`, `weave run --chunks ring:K`) of the layers a user writes
/// with collectives (the row-parallel linear with and without a bias), their reduce rings in 2 and 4 pieces a step (column-parallel, whose only
/// ring gathers, each step whole), on NCCL and on the copy engines: every rank matches the
/// reference on 2 and 4 GPUs.
#[test]
fn ring_forms_of_the_layers_match_the_reference_on_both_transports() {
    let Some((n, _turn)) = gpus() else { return };
    let names = [
        "row_parallel_linear",
        "row_parallel_linear_bias",
        "matmul_rs",
        "sequence_parallel_mlp_block",
        "column_parallel_chunked",
    ];
    rings_match_the_reference(n, &names, |ranks, k| {
        (
            streamweave::Chunks::Ring(k),
            (k > 1).then_some((ranks * k, k as i64)),
        )
    });
}

/// Runs each of `names` (t = 64 a rank, h = 64) on 2 and 4 of `gpus` GPUs, compiled with the
/// chunks `how(ranks, pieces)` gives (with the ring pieces it must report) for 2 and 4 pieces
/// (1 for `column_parallel_chunked`), on both transports, against the reference.
fn rings_match_the_reference(
    gpus: usize,
    names: &[&str],
    how: impl Fn(usize, usize) -> (streamweave::Chunks, Option<(usize, i64)>),
) {
    let mut failures = Vec::new();
    let mut runs = 0;
    for ranks in rank_counts(gpus) {
        for &name in names {
            let set = [("d", ranks as i64), ("t", 64 * ranks as i64), ("h", 64)];
            let pieces: &[usize] = if name == "column_parallel_chunked" {
                &[1]
            } else {
                &[2, 4]
            };
            for &k in pieces {
                let (chunks, expected) = how(ranks, k);
                let compiled = Compiler::new()
                    .devices(ranks)
                    .chunks(chunks)
                    .compile(&load(name, &set))
                    .expect("compiles as rings");
                assert_eq!(compiled.ring_pieces(), expected, "{name}");
                let globals = compiled.random_inputs(11).unwrap();
                for transport in [
                    streamweave::Transport::Nccl,
                    streamweave::Transport::CopyEngine,
                ] {
                    let mut options = gpu_options(ranks);
                    options.gpu.transport = transport;
                    let run = compiled.run_dense(&globals, &options);
                    let line = match &run {
                        Ok(r) => format!(
                            "{name} {ranks} ranks, {k} pieces, {transport:?}: max abs {:.3e} {}",
                            r.max_abs_error(),
                            if r.passed() { "PASS" } else { "FAIL" }
                        ),
                        Err(e) => format!("{name} {ranks} ranks, {k} pieces, {transport:?}: {e}"),
                    };
                    println!("{line}");
                    runs += 1;
                    if !matches!(&run, Ok(r) if r.passed() && r.max_abs_error().is_finite()) {
                        failures.push(line);
                    }
                }
            }
        }
    }
    assert!(runs > 0, "no ring ran");
    assert!(failures.is_empty(), "failures:\n{}", failures.join("\n"));
}

/// Runs `name` at full size on `ranks` GPUs and checks the rows `j * full / sample` of every
/// output, along the axis that the parameter `rows` sizes, against the reference of the same
/// fusion with `rows = sample_value` evaluated on the same rows of the inputs.
fn sampled_check(
    name: &str,
    ranks: usize,
    full: &[(&str, i64)],
    rows: &str,
    sample_value: i64,
) -> Result<String, String> {
    let mut set: Vec<(&str, i64)> = full.to_vec();
    set.push(("d", ranks as i64));
    let big = load(name, &set);
    let mut small_set = set.clone();
    for (k, v) in small_set.iter_mut() {
        if *k == rows {
            *v = sample_value;
        }
    }
    let small = load(name, &small_set);
    let compiled = compile(big);
    let globals = compiled.random_inputs(11).unwrap();
    let options = gpu_options(ranks);
    let per_rank = (0..ranks)
        .map(|r| compiled.shard_inputs(&globals, r))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let start = Instant::now();
    let (runs, _) =
        streamweave::gpu::run_threads(&compiled, &compiled.config(&options), per_rank, &options)
            .map_err(|e: RunError| e.to_string())?;
    let run_time = start.elapsed();
    // The sampled inputs and reference.
    let small_inputs: Vec<Dense> = globals
        .iter()
        .zip(small.inputs())
        .map(|(g, t)| {
            let want = tensor_sizes(&small, *t);
            sample(g, &want)
        })
        .collect::<Result<_, _>>()?;
    let reference = run_reference(&small, &small_inputs).map_err(|e| e.to_string())?;
    let mut report = Vec::new();
    for (k, layout) in compiled.outputs().iter().enumerate() {
        let locals: Vec<&[f64]> = runs.iter().map(|r| r.outputs[k].data.as_slice()).collect();
        let global = Dense {
            dtype: layout.dtype,
            sizes: layout.shape.clone(),
            data: layout
                .unshard(&locals, f64::NAN)
                .map_err(|e| e.to_string())?,
        };
        let got = sample(&global, &reference[k].sizes)?;
        let c = compare(&got.data, &reference[k].data, reference[k].dtype);
        report.push(format!("{c}"));
        if !c.ok {
            return Err(format!("{name} on {ranks} GPUs: output {k}: {c}"));
        }
    }
    Ok(format!(
        "{name} on {ranks} GPUs ({} = {}, run {:.1} ms incl. upload): {}",
        rows,
        full.iter()
            .find(|(k, _)| *k == rows)
            .map(|p| p.1)
            .unwrap_or(0),
        run_time.as_secs_f64() * 1e3,
        report.join("; ")
    ))
}

fn tensor_sizes(fusion: &weave_ir::Fusion, t: weave_ir::TensorId) -> Vec<usize> {
    fusion
        .visible_axes(t)
        .iter()
        .map(|id| fusion.eval(&fusion.id(*id).extent).unwrap_or(0) as usize)
        .collect()
}

/// The elements of `x` at indices `j * x.sizes[a] / want[a]` along every axis where the sizes
/// differ (a uniform sample of rows).
fn sample(x: &Dense, want: &[usize]) -> Result<Dense, String> {
    if want.len() != x.sizes.len() {
        return Err(format!("cannot sample {:?} as {want:?}", x.sizes));
    }
    let n: usize = want.iter().product();
    let strides: Vec<usize> = (0..x.sizes.len())
        .map(|a| x.sizes[a + 1..].iter().product())
        .collect();
    let mut data = Vec::with_capacity(n);
    let mut idx = vec![0usize; want.len()];
    for _ in 0..n {
        let off: usize = (0..want.len())
            .map(|a| (idx[a] * x.sizes[a] / want[a].max(1)) * strides[a])
            .sum();
        data.push(x.data[off]);
        for a in (0..want.len()).rev() {
            idx[a] += 1;
            if idx[a] < want[a] {
                break;
            }
            idx[a] = 0;
        }
    }
    Ok(Dense {
        dtype: x.dtype,
        sizes: want.to_vec(),
        data,
    })
}

/// A large pattern: the fixture, its full-size parameters, the parameter that sizes the rows,
/// and its value in the sampled reference.
type Case<'a> = (&'a str, &'a [(&'a str, i64)], &'a str, i64);

#[test]
fn the_large_patterns_at_t_h_8192_match_a_row_sampled_reference() {
    let Some((n, _turn)) = gpus() else { return };
    let mut lines = Vec::new();
    for ranks in rank_counts(n) {
        let cases: [Case; 7] = [
            (
                "row_parallel_linear",
                &[("t", 8192), ("h", 8192), ("s", 4)],
                "t",
                64,
            ),
            (
                "column_parallel_linear",
                &[("t", 8192), ("h", 8192)],
                "t",
                64,
            ),
            ("matmul_rs", &[("t", 8192), ("h", 8192), ("s", 4)], "t", 64),
            (
                "matmul_ar",
                &[("M", 8192), ("K", 8192), ("N", 8192), ("s", 4)],
                "M",
                64 * 4,
            ),
            (
                "ag_matmul",
                &[("M", 8192), ("K", 8192), ("N", 8192), ("s", 4)],
                "M",
                16 * 4 * ranks as i64,
            ),
            (
                "ag_matmul_p2p",
                &[("M", 8192), ("K", 8192), ("N", 8192)],
                "M",
                64 * ranks as i64,
            ),
            // The MLP block as `prefetch-communications` rewrites it: chunk 1's allgather
            // posted before chunk 0's reduce-scatter.
            (
                "sequence_parallel_mlp_block",
                &[("t", 8192), ("h", 2048), ("f", 8192), ("s", 2)],
                "t",
                64,
            ),
        ];
        for (name, set, rows, sample_value) in cases {
            match sampled_check(name, ranks, set, rows, sample_value) {
                Ok(l) => {
                    println!("{l}");
                    lines.push(l)
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
    assert!(!lines.is_empty());
}

/// On both transports: rank 1 sets up its GPU and communicator like every rank, then exits
/// before posting anything; rank 0 runs the program and waits in its first allreduce (NCCL)
/// or on a flag of its copy-engine window (a stream that stalls on purpose) for a peer that
/// never comes. Every rank ends with an error within the run's timeout and the grace to stop.
#[test]
fn a_rank_that_fails_early_ends_every_rank_with_an_error_within_the_timeout() {
    let Some((_, _turn)) = gpus() else { return };
    let fusion = load(
        "row_parallel_linear",
        &[("t", 256), ("h", 64), ("d", 2), ("s", 4)],
    );
    let compiled = compile(fusion);
    let globals = compiled.random_inputs(3).unwrap();
    let timeout = Duration::from_secs(10);
    // The bound: the timeout, the grace to stop (half of it, 5 s at least) and set-up.
    let bound = Duration::from_secs(10 + 5 + 10);
    for transport in [
        streamweave::Transport::Nccl,
        streamweave::Transport::CopyEngine,
    ] {
        let per_rank: Vec<Vec<Dense>> = (0..2)
            .map(|r| compiled.shard_inputs(&globals, r).expect("shards"))
            .collect();
        let mut options = RunOptions {
            timeouts: streamweave::Timeouts::all(timeout),
            ..gpu_options(2)
        };
        options.gpu.transport = transport;
        let start = Instant::now();
        let result = streamweave::gpu::run_threads_failing(
            &compiled,
            &compiled.config(&options),
            per_rank,
            &options,
            1,
        );
        let elapsed = start.elapsed();
        match result {
            Err(RunError::Ranks(errors)) => {
                let ranks: Vec<usize> = errors.iter().map(|(r, _)| *r).collect();
                assert_eq!(
                    ranks,
                    vec![0, 1],
                    "{transport:?}: every rank ends with an error: {errors:?}"
                );
                let rank0 = errors[0].1.to_string();
                println!("{transport:?}: rank 0: {rank0}\nrank 1: {}", errors[1].1);
                assert!(
                    rank0.contains("timed out") || rank0.contains("communicator"),
                    "{transport:?}: rank 0 names a timeout or the communicator: {rank0}"
                );
                assert!(
                    !rank0.contains("did not stop"),
                    "{transport:?}: rank 0 stopped (its waits were released): {rank0}"
                );
            }
            other => panic!("{transport:?}: expected every rank to fail, got {other:?}"),
        }
        assert!(
            elapsed < bound,
            "{transport:?}: every rank ended within {bound:?} (took {elapsed:?})"
        );
    }
}

/// A world whose job outlives its limit fails that job naming the silent rank, is marked
/// stuck, refuses every later job at once, and is dropped without waiting for that rank.
#[test]
fn a_world_job_past_its_limit_fails_at_once_and_later_jobs_are_refused() {
    use weave_bench::{World, WorldOptions};
    use weave_comm::NcclOptions;

    let Some((_, _turn)) = gpus() else { return };
    let world = World::open(WorldOptions {
        devices: Vec::new(),
        ranks: 2,
        timeout: Duration::from_secs(30),
        nccl: NcclOptions::default(),
    })
    .expect("the GPUs open");
    let ok = world
        .run_within(|r| Ok(r.rank), Duration::from_secs(30))
        .expect("a quick job");
    assert_eq!(ok, vec![0, 1]);
    assert!(!world.failed() && !world.stuck());
    let start = Instant::now();
    let err = world
        .run_within(
            |r| {
                if r.rank == 1 {
                    std::thread::sleep(Duration::from_secs(8));
                }
                Ok(r.rank)
            },
            Duration::from_secs(2),
        )
        .unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(6),
        "{:?}",
        start.elapsed()
    );
    assert!(
        err.0.contains("no reply from rank(s) 1 within 2s"),
        "{}",
        err.0
    );
    assert!(world.failed() && world.stuck());
    let start = Instant::now();
    let refused = world.run_within(|r| Ok(r.rank), Duration::from_secs(30));
    assert!(
        refused.as_ref().is_err_and(|e| e
            .0
            .starts_with("not run: a rank of an earlier job did not reply")),
        "{refused:?}"
    );
    let before = streamweave::stuck_ranks();
    drop(world);
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(
        streamweave::stuck_ranks(),
        before + 2,
        "its threads are left, counted"
    );
    // Let the sleeping rank finish before the next test takes the GPUs.
    std::thread::sleep(Duration::from_secs(7));
}

/// A layer to check: its fixture, parameters beyond t, h, d, and its contraction size.
type Layer<'a> = (&'a str, &'a [(&'a str, i64)], usize);

/// The benchmark's execution variants produce the reference's numbers: CUDA-graph replay,
/// ordered compute (eager and replayed), collectives posted from high-priority streams of
/// their own (eager and replayed; NCCL only, as the product allows), copy-engine allgathers
/// and ring transfers, and a blocking NCCL communicator, on the chunked and P2P
/// column-parallel layers and the row-parallel one, on 2 and 4 GPUs (sampled rows against
/// the f64 host reference).
#[test]
fn replay_ordered_compute_copy_engine_and_window_transfers_match_the_reference() {
    use std::sync::Arc;
    use weave_bench::{
        check_sample, linear_reference, run_program, CopyEngine, ProgramRun, World, WorldOptions,
        LINEAR_SEEDS,
    };
    use weave_comm::{IpcOptions, NcclId, NcclOptions, PeerHub};
    use weave_executor::CudaOptions;

    let Some((n, _turn)) = gpus() else { return };
    let (t, h) = (256i64, 64i64);
    for ranks in rank_counts(n) {
        let world = World::open(WorldOptions {
            devices: Vec::new(),
            ranks,
            timeout: Duration::from_secs(30),
            nccl: NcclOptions::default(),
        })
        .expect("the GPUs open");
        let cases: [Layer; 3] = [
            ("column_parallel_chunked", &[("s", 2)], h as usize),
            ("column_parallel_p2p", &[], h as usize),
            ("row_parallel_linear", &[("s", 4)], 4 * h as usize),
        ];
        for (name, extra, k) in cases {
            let mut set = vec![("t", t), ("h", h), ("d", ranks as i64)];
            set.extend_from_slice(extra);
            let compiled = Arc::new(compile(load(name, &set)));
            let n_out = if name == "row_parallel_linear" {
                h
            } else {
                4 * h
            } as usize;
            let rows: Arc<Vec<usize>> = Arc::new((0..t as usize).step_by(37).collect());
            let reference = linear_reference(&rows, k, n_out, LINEAR_SEEDS[0], LINEAR_SEEDS[1]);
            // Windows of 2 slots of 1 KiB: every transfer is several pieces and reuses slots.
            let small_windows = IpcOptions {
                lanes: 4,
                slots: 2,
                slot_bytes: 1024,
            };
            let replay = ProgramRun {
                graph: true,
                ..ProgramRun::default()
            };
            let blocking = NcclOptions {
                blocking: true,
                ..NcclOptions::default()
            };
            // A symmetric window of 1 MiB a direction holds every collective here (the
            // largest moves t × 4h bf16 = 128 KiB).
            let window = |policy| NcclOptions {
                symmetric_window: Some(1 << 20),
                cta_policy: policy,
                ..NcclOptions::default()
            };
            // The row-parallel linear's GEMM computed by its allreduce, each peer's block
            // written straight into the peer's window (whole and in pieces of 8 rows).
            let into_windows = |graph| ProgramRun {
                graph,
                cuda: CudaOptions {
                    produce_into_windows: true,
                    ..CudaOptions::default()
                },
                ..ProgramRun::default()
            };
            // Collectives posted from high-priority streams beside the pool's (on NCCL: the
            // product refuses them with copy engines, `OverlapError::CommPriorityOnCopyEngines`).
            let comm_high = |graph| ProgramRun {
                graph,
                cuda: CudaOptions {
                    comm_priority_high: true,
                    ..CudaOptions::default()
                },
                ..ProgramRun::default()
            };
            let variants: [(&str, ProgramRun, u8, Option<NcclOptions>); 19] = [
                ("collectives at high priority", comm_high(false), 0, None),
                (
                    "collectives at high priority replayed",
                    comm_high(true),
                    0,
                    None,
                ),
                (
                    "GEMMs into copy-engine windows",
                    into_windows(false),
                    2,
                    None,
                ),
                (
                    "GEMMs into copy-engine windows of 2 x 1 KiB",
                    into_windows(false),
                    3,
                    None,
                ),
                (
                    "GEMMs into copy-engine windows of 2 x 1 KiB replayed",
                    into_windows(true),
                    3,
                    None,
                ),
                ("eager", ProgramRun::default(), 0, None),
                (
                    "replay",
                    ProgramRun {
                        graph: true,
                        ..ProgramRun::default()
                    },
                    0,
                    None,
                ),
                (
                    "ordered",
                    ProgramRun {
                        cuda: CudaOptions {
                            ordered_compute: true,
                            ..CudaOptions::default()
                        },
                        ..ProgramRun::default()
                    },
                    0,
                    None,
                ),
                (
                    "ordered replay",
                    ProgramRun {
                        graph: true,
                        cuda: CudaOptions {
                            ordered_compute: true,
                            ..CudaOptions::default()
                        },
                        ..ProgramRun::default()
                    },
                    0,
                    None,
                ),
                ("copy engine", ProgramRun::default(), 1, None),
                ("copy-engine windows", ProgramRun::default(), 2, None),
                (
                    "copy-engine windows of 2 x 1 KiB",
                    ProgramRun::default(),
                    3,
                    None,
                ),
                ("copy-engine windows replayed", replay.clone(), 2, None),
                (
                    "copy-engine windows of 2 x 1 KiB replayed",
                    replay.clone(),
                    3,
                    None,
                ),
                ("blocking NCCL", ProgramRun::default(), 0, Some(blocking)),
                (
                    "NCCL efficiency CTA policy",
                    ProgramRun::default(),
                    0,
                    Some(NcclOptions {
                        cta_policy: Some(weave_comm::CtaPolicy::Efficiency),
                        ..NcclOptions::default()
                    }),
                ),
                (
                    "NCCL symmetric window",
                    ProgramRun::default(),
                    0,
                    Some(window(None)),
                ),
                (
                    "NCCL symmetric window replayed",
                    replay.clone(),
                    0,
                    Some(window(None)),
                ),
                (
                    "NCCL symmetric window, zero CTAs, replayed",
                    replay.clone(),
                    0,
                    Some(window(Some(weave_comm::CtaPolicy::Zero))),
                ),
            ];
            for (what, how, engine, nccl) in variants {
                let (c, rows2) = (compiled.clone(), rows.clone());
                let fresh = nccl.map(|options| {
                    let options = NcclOptions {
                        timeout: Duration::from_secs(30),
                        ..options
                    };
                    (NcclId::new().expect("an NCCL id"), options)
                });
                let engine = match engine {
                    0 => CopyEngine::Off,
                    1 => CopyEngine::Peer(PeerHub::new()),
                    2 => CopyEngine::windows(ranks, IpcOptions::default()),
                    _ => CopyEngine::windows(ranks, small_windows),
                };
                let samples = world
                    .run(move |r| {
                        let f = fresh.as_ref();
                        let timing =
                            run_program(r, f, &engine, &c, &how, &LINEAR_SEEDS, (1, 2), &rows2)?;
                        Ok(timing.sample)
                    })
                    .unwrap_or_else(|e| panic!("{name} {what} on {ranks} GPUs: {e}"));
                let found: Vec<(usize, usize, f64)> = samples.into_iter().flatten().collect();
                let check = check_sample(&found, &rows, &reference, weave_ir::DType::BF16);
                println!("{name} {what} on {ranks} GPUs: {check:?}");
                assert!(check.ok, "{name} {what} on {ranks} GPUs: {check:?}");
            }
        }
    }
}

/// Whether one GPU is there for the single-GPU tests (the reason printed when not).
/// The test's turn on the GPUs when there is one to test on, or `None` (with the reason
/// printed) to skip.
fn one_gpu() -> Option<Turn> {
    if std::env::var("WEAVE_GPU_TESTS").ok().as_deref() != Some("1") {
        eprintln!("skipped: set WEAVE_GPU_TESTS=1 on a machine with GPUs to run the GPU tests");
        return None;
    }
    match weave_cuda::device_count() {
        Ok(n) if n >= 1 => Some(turn()),
        Ok(_) => {
            eprintln!("skipped: no GPU visible");
            None
        }
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
}

/// A buffer larger than the device has is refused before it is allocated, with the dtype,
/// sizes, the bytes asked for and the bytes available; the backend stays usable.
#[test]
fn a_device_buffer_larger_than_the_gpu_is_refused_with_the_bytes() {
    let Some(_turn) = one_gpu() else { return };
    use weave_executor::cuda::{CudaBackend, CudaOptions};
    let gpu = weave_cuda::Gpu::open(0).expect("GPU 0");
    let backend = CudaBackend::new(gpu.clone(), CudaOptions::default()).expect("backend");
    let sizes = [1usize << 20, 1 << 20];
    let err = backend
        .empty(weave_ir::DType::BF16, &sizes)
        .map(|t| t.sizes())
        .expect_err("a 2 TiB buffer is refused")
        .to_string();
    println!("{err}");
    for part in [
        "`Allocate` failed",
        "bf16 buffer of sizes [1048576, 1048576]",
        "needs 2199023255552 bytes (2.0 TiB) of device memory on GPU 0",
        "are available",
    ] {
        assert!(err.contains(part), "`{part}` in: {err}");
    }
    let small = backend
        .empty(weave_ir::DType::F32, &[1024])
        .expect("a small buffer");
    assert_eq!(small.sizes(), vec![1024]);
}

/// A copy-engine rank whose peer never posts leaves its stream blocked on a flag; aborting
/// the transport releases the wait, so the stream drains within a bounded time instead of
/// staying blocked until the process exits.
#[test]
fn an_aborted_copy_engine_rank_releases_its_flag_waits() {
    let Some(_turn) = one_gpu() else { return };
    use std::sync::{Arc, Barrier, Mutex};
    use weave_comm::copy::{CopyTransport, Transfers};
    use weave_comm::ipc::{IpcOptions, IpcTransport};
    let gpu = weave_cuda::Gpu::open(0).expect("GPU 0");
    let options = IpcOptions {
        lanes: 1,
        slots: 2,
        slot_bytes: 1 << 16,
    };
    // Both ranks live in this process on GPU 0; the exchange is a barrier.
    let cards = Arc::new(Mutex::new(vec![Vec::new(); 2]));
    let barrier = Arc::new(Barrier::new(2));
    let connect = |me: usize| {
        let (gpu, cards, barrier) = (gpu.clone(), cards.clone(), barrier.clone());
        std::thread::spawn(move || {
            IpcTransport::connect(me, 2, gpu, options, |card| {
                cards.lock().unwrap()[me] = card;
                barrier.wait();
                Ok(cards.lock().unwrap().clone())
            })
        })
    };
    let (a, b) = (connect(0), connect(1));
    let rank0 = a.join().unwrap().expect("rank 0 connects");
    let _rank1 = b.join().unwrap().expect("rank 1 connects");
    // Its side stream to its one peer was made when it connected, not at its first post.
    assert_eq!(rank0.side_streams(), vec![(0, 1)]);
    let stream = gpu
        .new_stream(weave_cuda::Priority::Normal)
        .expect("stream");
    let dst = gpu.alloc(1 << 18, &stream).expect("destination");
    // Rank 0 receives four slots' worth from rank 1, which never sends.
    let t = Transfers {
        local: Vec::new(),
        sends: Vec::new(),
        recvs: vec![(1, dst.ptr(), 1 << 18)],
    };
    rank0
        .transfer(0, "recv", &t, &stream, Duration::from_secs(1))
        .expect("posted");
    let blocked = stream.synchronize_timeout(Duration::from_millis(300));
    assert!(
        blocked.is_err(),
        "the stream waits on a flag no peer sets: {blocked:?}"
    );
    let start = Instant::now();
    rank0.abort();
    stream
        .synchronize_timeout(Duration::from_secs(10))
        .expect("the aborted rank's stream drains");
    println!("released in {:?}", start.elapsed());
    drop(dst);
    drop(rank0);
}

/// Fusions whose generated kernels take every path of the code generator: vectorized and
/// scalar pointwise kernels, row kernels of one and several passes (softmax, LayerNorm,
/// RMSNorm), column reductions split over blocks, reductions over other axes, and strided
/// (transposed) reads. `t` rows, `h` columns, `s` stream chunks of the rows.
const KERNEL_CASES: &[(&str, &str)] = &[
    (
        "add",
        "tensor a: bf16[t, h]\n tensor b: bf16[t, h]\n y = add(a, b)\n output y",
    ),
    (
        "silu",
        "tensor x: bf16[t, h]\n xf = cast(x, f32)\n g = sigmoid(xf)\n yf = mul(xf, g)\n \
         y = cast(yf, bf16)\n output y",
    ),
    (
        "bias_residual_f32",
        "tensor x: f32[t, h]\n tensor bias: f32[h]\n tensor r: f32[t, h]\n \
         bb = broadcast(bias, [0])\n u = add(x, bb)\n y = add(u, r)\n output y",
    ),
    (
        "row_sum",
        "tensor x: f32[t, h]\n y = sum(x, [1])\n output y",
    ),
    (
        "col_sum",
        "tensor x: f32[t, h]\n y = sum(x, [0])\n output y",
    ),
    (
        "row_max_bf16",
        "tensor x: bf16[t, h]\n y = max(x, [1])\n output y",
    ),
    (
        "softmax",
        "tensor x: bf16[t, h]\n xf = cast(x, f32)\n m = max(xf, [1])\n mb = broadcast(m, [1])\n \
         d = sub(xf, mb)\n e = exp(d)\n z = sum(e, [1])\n zb = broadcast(z, [1])\n \
         yf = div(e, zb)\n y = cast(yf, bf16)\n output y",
    ),
    (
        "layernorm",
        "tensor x: bf16[t, h]\n tensor w: bf16[h]\n tensor n: f32[t]\n xf = cast(x, f32)\n \
         pn = exp(n)\n nb = broadcast(pn, [1])\n \
         s1 = sum(xf, [1])\n s1b = broadcast(s1, [1])\n mean = div(s1b, nb)\n c = sub(xf, mean)\n \
         c2 = mul(c, c)\n s2 = sum(c2, [1])\n s2b = broadcast(s2, [1])\n var = div(s2b, nb)\n \
         inv = rsqrt(var)\n yn = mul(c, inv)\n wf = cast(w, f32)\n wb = broadcast(wf, [0])\n \
         yf = mul(yn, wb)\n y = cast(yf, bf16)\n output y, s1",
    ),
    (
        "transposed_read",
        "tensor x: f32[h, t]\n xt = permute(x, [1, 0])\n y = add(xt, xt)\n output y",
    ),
    (
        "middle_axis_sum",
        "tensor x: f32[t, h, 3]\n y = sum(x, [1])\n output y",
    ),
    (
        "whole_sum",
        "tensor x: f32[t, h]\n y = sum(x, [0, 1])\n output y",
    ),
];

/// The source of kernel case `body` with `t`, `h` and `s` defaults, its first output split
/// into `s` stream chunks of the rows.
fn kernel_case_source(name: &str, body: &str, t: usize, h: usize, s: usize) -> String {
    let first_output = body
        .rsplit("output ")
        .next()
        .and_then(|o| o.split(',').next())
        .unwrap_or("y")
        .trim()
        .to_string();
    let schedule = if name == "col_sum" || name == "whole_sum" {
        String::new()
    } else {
        format!("schedule {first_output} {{ outer_split(0, s) -> Stream }}")
    };
    format!("fusion {name}(t = {t}, h = {h}, s = {s}) {{\n {body}\n {schedule}\n}}\n")
}

/// The generated kernels of every case match the f64 reference on one GPU at shapes that
/// divide the vector widths and shapes that do not: unchunked, with `s = 4` as the default
/// pipeline runs it (one launch over the whole tensors, `merge-kernel-chunks`), and in uneven
/// stream chunks with every loop kept (views that are not 16-byte aligned, so the scalar
/// fallbacks run too).
#[test]
fn generated_kernels_match_the_reference_at_odd_shapes_and_chunks() {
    let Some(_turn) = one_gpu() else { return };
    let shapes = [
        (1, 1),
        (3, 5),
        (16, 64),
        (37, 136),
        (64, 4100),
        (300, 1000),
        (5, 70000),
    ];
    let mut failures = Vec::new();
    let mut runs = 0;
    for (name, body) in KERNEL_CASES {
        for (t, h) in shapes {
            for (s, merge) in [(1, true), (4, true), (4, false)] {
                let source = kernel_case_source(name, body, t, h, s);
                let compiler = if merge {
                    Compiler::new()
                } else {
                    Compiler::new().pipeline(Pipeline::standard().without("merge-kernel-chunks"))
                };
                let exe = match compiler.compile_source(&format!("{name}.weave"), &source) {
                    Ok(e) => e,
                    Err(e) => {
                        failures.push(format!(
                            "{name} t={t} h={h} s={s} merge={merge}: compile: {e}"
                        ));
                        continue;
                    }
                };
                let globals = exe.random_inputs(7).expect("inputs");
                let options = RunOptions {
                    target: Target::Cuda { ranks: 1 },
                    check: true,
                    timeouts: streamweave::Timeouts::all(Duration::from_secs(60)),
                    ..RunOptions::default()
                };
                runs += 1;
                match exe.run_dense(&globals, &options) {
                    Ok(r) if r.passed() => {}
                    Ok(r) => failures.push(format!(
                        "{name} t={t} h={h} s={s} merge={merge}: differs, max error {}",
                        r.max_abs_error()
                    )),
                    Err(e) => failures.push(format!("{name} t={t} h={h} s={s} merge={merge}: {e}")),
                }
            }
        }
    }
    println!("{runs} runs, {} failures", failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Repeated runs (`--iters`) replay one run captured as a CUDA graph by default: every rank's
/// timed runs say so, there are as many as asked for, and the eager run checked after the
/// replays still matches the reference (the capture and its replays leave the backend, its
/// memory pool and its streams usable). Kernel cases in uneven stream chunks (every loop kept:
/// the default would launch each kernel of these small chunks once), a chunked GEMM, and
/// weight gradients added up across chunks (whose first chunk waits for the previous chunk's
/// stream, outside the capture);
/// `replay: false` times eager runs instead.
#[test]
fn repeated_runs_replay_a_captured_graph_and_the_checked_run_stays_right() {
    let Some(_turn) = one_gpu() else { return };
    let mut cases: Vec<(String, String)> = KERNEL_CASES
        .iter()
        .filter(|(n, _)| ["add", "softmax", "layernorm", "col_sum"].contains(n))
        .map(|(n, body)| (n.to_string(), kernel_case_source(n, body, 300, 1000, 4)))
        .collect();
    cases.push((
        "matmul_m".to_string(),
        "fusion matmul_m(M = 300, K = 64, N = 96, s = 3) {\n tensor a: bf16[M, K]\n \
         tensor b: bf16[K, N]\n c = matmul(a, b)\n output c\n \
         schedule c { outer_split(0, s) -> Stream }\n}\n"
            .to_string(),
    ));
    // Weight gradients added up across chunks: the first chunk synchronizes with the pool
    // stream of the previous one, which has not joined the capture yet (nothing of the run
    // to wait for; waiting on it would invalidate the capture).
    let grads = std::fs::read_to_string(common::fixture("mlp_backward_weight_grads"))
        .expect("the fixture reads")
        .replace("d = 2, s = 2)", "d = 1, s = 2)");
    assert!(
        grads.contains("d = 1, s = 2)"),
        "the fixture's parameters moved"
    );
    cases.push(("mlp_backward_weight_grads".to_string(), grads));
    for (name, source) in &cases {
        let exe = Compiler::new()
            .pipeline(Pipeline::standard().without("merge-kernel-chunks"))
            .compile_source(&format!("{name}.weave"), source)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let globals = exe.random_inputs(3).expect("inputs");
        for replay in [true, false] {
            let options = RunOptions {
                target: Target::Cuda { ranks: 1 },
                check: true,
                timeouts: streamweave::Timeouts::all(Duration::from_secs(60)),
                warmup: 1,
                iters: 5,
                gpu: streamweave::GpuRunOptions {
                    replay,
                    ..Default::default()
                },
                ..RunOptions::default()
            };
            let report = exe
                .run_dense(&globals, &options)
                .unwrap_or_else(|e| panic!("{name} replay={replay}: {e}"));
            assert!(
                report.passed(),
                "{name} replay={replay}: max error {}",
                report.max_abs_error()
            );
            let timed = report.timed().expect("timed runs");
            assert_eq!(timed.count, 5, "{name}");
            assert!(
                report.ranks.iter().all(|r| r.replayed == replay),
                "{name}: replay={replay}"
            );
            println!("{name} replay={replay}: median {:?}", timed.median);
        }
    }
}

/// The transformer-layer fixtures (tests/scenarios/README.md, "A transformer layer") on one
/// GPU with d = 1, whole and in several stream chunks (t = 40 in 3 chunks is uneven), against
/// the f64 reference. The attention fixtures get their constants and a causal mask as a
/// runner sets them: `n` = the row length, `eps` = 1e-6, `scale` = 1 / sqrt(hd), `neg` = -1e4.
#[test]
fn the_transformer_layer_fixtures_match_the_reference_on_one_gpu() {
    let Some(_turn) = one_gpu() else { return };
    let mut failures = Vec::new();
    let mut runs = 0;
    for name in [
        "tp_attention",
        "sequence_parallel_attention",
        "sequence_parallel_mlp_silu",
        "sequence_parallel_mlp_backward",
    ] {
        for (t, s) in [(32, 1), (32, 4), (40, 3)] {
            let fusion = load(name, &[("d", 1), ("t", t), ("s", s)]);
            let value = |name: &str| {
                fusion
                    .params()
                    .iter()
                    .find(|p| p.name == name)
                    .and_then(|p| p.value)
                    .unwrap_or(1)
            };
            let (hd, nh) = (value("hd"), value("nh"));
            let edit = common::attention_inputs((nh * hd) as usize, hd as usize);
            let exe = compile(fusion);
            let mut globals = exe.random_inputs(7).expect("inputs");
            for (sig, x) in exe.inputs().iter().zip(globals.iter_mut()) {
                edit(&sig.name, x);
            }
            runs += 1;
            let what = format!("{name} t={t} s={s}");
            match exe.run_dense(&globals, &gpu_options(1)) {
                Ok(r) if r.passed() => println!("{what}: max abs {:.3e}", r.max_abs_error()),
                Ok(r) => failures.push(format!("{what}: differs, max error {}", r.max_abs_error())),
                Err(e) => failures.push(format!("{what}: {e}")),
            }
        }
    }
    println!("{runs} runs, {} failures", failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The `weave` binary: beside this test's executable in the GPU bundle (`bin/weave` next to
/// `bin/gpu-tests`), else the one cargo built with the tests.
fn weave_binary() -> std::path::PathBuf {
    let bundled = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("weave")))
        .filter(|p| p.is_file());
    bundled.unwrap_or_else(|| env!("CARGO_BIN_EXE_weave").into())
}

/// A GEMM and the ReLU of its result in stream chunks: the chunks stay (a GEMM chunk overlaps
/// the previous chunk's kernel), so every chunk count is a different program to measure.
fn linear_relu() -> String {
    common::linear_relu("t = 1024, h = 1024, f = 1024, s = 1", "bf16")
}

/// The tuner on one GPU: every candidate of a chunked linear + ReLU (S ∈ {1, 2, 4, 8},
/// K ≤ S, graph replay on and off; no communication, so the cost model prunes nothing) is
/// measured, the winner's figure is the least measured one (or ties it within the margin,
/// where the simpler configuration wins), the cache holds it, and both the library (the
/// entry's chunk count, pool and replay) and `weave run --chunks auto` run it, matching the
/// reference.
#[test]
fn the_tuner_measures_the_candidates_on_one_gpu_and_run_takes_the_winner() {
    use streamweave::tune::{self, Outcome, RunMeasure, TuneKey, TuneOptions};
    let Some(_turn) = one_gpu() else { return };
    let fusion = streamweave::load("linear_relu.weave", &linear_relu(), &[]).expect("loads");
    let gpu = tune::gpu_name(0).expect("GPU 0 opens");
    let options = TuneOptions::new(
        1,
        true,
        &gpu,
        Some(streamweave::chunks::Calibration::default()),
    );
    let mut measure = RunMeasure::new(Target::Cuda { ranks: 1 }, 2, 10, Duration::from_secs(60));
    let tuning = tune::tune(&fusion, &options, &mut measure).expect("tunes");
    println!("{tuning}");
    for row in &tuning.rows {
        assert!(
            row.outcome.time().is_some() || matches!(row.outcome, Outcome::Redundant(_)),
            "{}: {}",
            row.candidate,
            row.outcome
        );
    }
    let measured: Vec<Duration> = tuning
        .rows
        .iter()
        .filter_map(|r| r.outcome.time())
        .collect();
    assert_eq!(measured.len(), 18, "{tuning}"); // (1 + 2 + 3 + 3) pools × replay on/off
    let least = *measured.iter().min().unwrap();
    let (winner, figure) = tuning.best().expect("a winner");
    assert!(
        figure.as_secs_f64() <= least.as_secs_f64() * (1.0 + tune::TIE_MARGIN),
        "{winner} at {figure:?}, least {least:?}"
    );
    assert!(measured.contains(&figure));

    let dir = std::env::temp_dir().join(format!("weave-gpu-tune-{}", std::process::id()));
    let cache = dir.join("tune.toml");
    let _ = std::fs::remove_dir_all(&dir);
    tune::store(&cache, &tuning).expect("stores");
    let key = TuneKey::of(&fusion, 1, "cuda", &gpu);
    let entry = tune::lookup(&cache, &key)
        .expect("reads")
        .expect("the winner is cached");
    assert_eq!(entry.candidate(), winner);

    // The library runs the entry's configuration.
    let exe = Compiler::new()
        .devices(1)
        .chunks(entry.compiler_chunks())
        .compile(&fusion)
        .expect("compiles");
    let s = exe
        .signature()
        .params
        .iter()
        .find(|(k, _)| k == "s")
        .map(|(_, v)| *v);
    assert_eq!(s, winner.chunks.map(|c| c as i64));
    let mut options = RunOptions {
        target: Target::Cuda { ranks: 1 },
        check: true,
        warmup: 1,
        iters: 3,
        timeouts: streamweave::Timeouts::all(Duration::from_secs(60)),
        ..RunOptions::default()
    };
    entry.apply(&mut options);
    assert_eq!(options.streams, winner.streams);
    let report = exe
        .run_dense(&exe.random_inputs(5).unwrap(), &options)
        .expect("runs");
    assert!(report.passed(), "max error {}", report.max_abs_error());
    assert!(report.ranks.iter().all(|r| r.replayed == entry.replay));

    // So does `weave run` with `--chunks auto` (the default).
    let file = dir.join("linear_relu.weave");
    std::fs::write(&file, linear_relu()).unwrap();
    let out = std::process::Command::new(weave_binary())
        .args([
            "run",
            file.to_str().unwrap(),
            "--backend",
            "cuda",
            "--ranks",
            "1",
        ])
        .args(["--warmup", "1", "--iters", "3"])
        .env_remove("WEAVE_LOG")
        .env("WEAVE_TUNE_CACHE", &cache)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    common::assert_ran_tuned(&stdout, &winner, &cache, entry.streams);
    let _ = std::fs::remove_dir_all(&dir);
}

/// What a user gets without asking: the first `weave run --iters` of an untuned fusion tunes
/// it (said on stderr, the winner cached and printed as the `config:` line), and the second
/// `Executable::run` of a program tunes it in the library (its report says which
/// configuration ran); every run matches the reference. The row-parallel layer on two GPUs
/// (tuned over S, K and the overlap knobs, copy-engine reductions included), else the linear
/// + ReLU on one.
#[test]
fn repeated_runs_tune_themselves_and_run_the_winner() {
    let Some(_turn) = one_gpu() else { return };
    let two = streamweave::cuda::device_count().unwrap_or(0) >= 2;
    let (name, source, ranks) = if two {
        // The row-parallel scenario at small sizes.
        let scenario = std::fs::read_to_string(common::fixture("row_parallel_linear"))
            .expect("the row-parallel scenario");
        let small = scenario.replace("(t = 8192, h = 8192,", "(t = 512, h = 256,");
        assert_ne!(small, scenario, "the scenario's default sizes moved");
        ("row_parallel_linear.weave", small, 2)
    } else {
        ("linear_relu.weave", linear_relu(), 1)
    };
    let dir = std::env::temp_dir().join(format!("weave-gpu-repeat-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cache = dir.join("tune.toml");

    // The library: the first run as compiled, the second tuned now, the third the same.
    let exe = Compiler::new()
        .devices(ranks)
        .compile_source(name, &source)
        .expect("compiles");
    let options = RunOptions {
        target: Target::Cuda { ranks },
        check: true,
        warmup: 1,
        iters: 3,
        timeouts: streamweave::Timeouts::all(Duration::from_secs(60)),
        gpu: streamweave::GpuRunOptions {
            tune: Some(Duration::from_secs(60)),
            tune_cache: Some(cache.clone()),
            ..Default::default()
        },
        ..RunOptions::default()
    };
    let globals = exe.random_inputs(9).unwrap();
    let first = exe.run_dense(&globals, &options).expect("runs");
    assert!(first.passed(), "max error {}", first.max_abs_error());
    assert_eq!(first.config, None);
    assert!(!cache.exists(), "one run tunes nothing");
    let second = exe.run_dense(&globals, &options).expect("runs");
    assert!(second.passed(), "max error {}", second.max_abs_error());
    let config = second.config.clone().expect("the second run is tuned");
    assert!(config.ends_with("(tuned now)"), "{config}");
    let cached = streamweave::tune::TuneCache::load(&cache).expect("reads");
    assert_eq!(cached.entries.len(), 1);
    assert!(
        config.starts_with(&cached.entries[0].candidate().to_string()),
        "{config}"
    );
    let third = exe.run_dense(&globals, &options).expect("runs");
    assert!(third.passed());
    assert_eq!(third.config.as_deref(), Some(config.as_str()));

    // The command line: a fresh cache, so the first `--iters` run tunes.
    let cli_cache = dir.join("cli.toml");
    let file = dir.join(name);
    std::fs::write(&file, &source).unwrap();
    let out = std::process::Command::new(weave_binary())
        .args(["run", file.to_str().unwrap(), "--backend", "cuda"])
        .args([
            "--ranks",
            &ranks.to_string(),
            "--warmup",
            "1",
            "--iters",
            "3",
        ])
        .env_remove("WEAVE_LOG")
        .env("WEAVE_TUNE_CACHE", &cli_cache)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("tuning: no cached configuration"),
        "{stderr}"
    );
    assert!(stdout.contains("(from tuned now)"), "{stdout}");
    assert!(stdout.trim_end().ends_with("result: PASS"), "{stdout}");
    let entry = &streamweave::tune::TuneCache::load(&cli_cache)
        .unwrap()
        .entries[0];
    let chunks = entry
        .chunks
        .map_or("as written".to_string(), |s| s.to_string());
    let prefix = format!("config: S={chunks} K={}", entry.streams);
    assert!(stdout.contains(&prefix), "{prefix}\n{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A traced run names, for each collective, the transport that moved it: on copy engines a
/// contiguous allgather and (with their reductions) a sum reduce-scatter say
/// `backend=copy-engine`, though the host program's label says NCCL; on NCCL they say NCCL.
#[test]
fn a_traced_collective_names_the_transport_that_moved_it() {
    let Some((_n, _turn)) = gpus() else { return };
    let exe = Compiler::new()
        .chunks(streamweave::Chunks::Fixed(1))
        .compile(&load(
            "sequence_parallel_mlp_block",
            &[("d", 2), ("t", 256), ("h", 64), ("f", 256)],
        ))
        .expect("compiles");
    let globals = exe.random_inputs(5).unwrap();
    for (transport, word) in [
        (streamweave::Transport::Nccl, "backend=NCCL"),
        (streamweave::Transport::CopyEngine, "backend=copy-engine"),
    ] {
        let mut options = RunOptions {
            check: false,
            trace: true,
            ..gpu_options(2)
        };
        options.gpu.transport = transport;
        let report = exe.run_dense(&globals, &options).expect("runs");
        let labels: Vec<String> = report.rank_spans()[0]
            .spans
            .iter()
            .filter(|s| s.label.starts_with("Communication"))
            .map(|s| s.label.clone())
            .collect();
        assert!(labels.len() >= 2, "{transport:?}: {labels:?}");
        assert!(
            labels.iter().all(|l| l.contains(word)),
            "{transport:?}: {labels:?}"
        );
    }
}

/// A reduce ring in pieces sums into its slots with accumulating GEMMs (cuBLASLt's beta = 1, a
/// plan of its own). Loading rank 0's kernels of `matmul_rs_ring` in 2 pieces a step (2 ranks)
/// plans them too: issuing each of the rank's GEMMs afterwards, in its own form, plans nothing
/// new. (Warmed as plain GEMMs, the accumulating plans were made mid-run, in the driver, while
/// the GPU could wait on a peer's copy: the stall of rings in pieces on copy engines,
/// docs/benchmarks.md, 2026-11-28 eighteenth and nineteenth.)
#[test]
fn a_ring_in_pieces_plans_its_accumulating_gemms_before_the_first_statement() {
    let Some(_turn) = one_gpu() else { return };
    use weave_executor::{Backend, CudaBackend, CudaOptions};

    let gpu = weave_cuda::Gpu::open(0).expect("GPU 0");
    let compiled = Compiler::new()
        .chunks(streamweave::Chunks::Fixed(4))
        .compile(&load("matmul_rs_ring", &[("d", 2), ("t", 128), ("h", 64)]))
        .expect("compiles in pieces");
    assert_eq!(compiled.ring_pieces(), Some((4, 2)));
    let sms = usize::try_from(gpu.sm_count()).unwrap_or(1).max(1);
    let table = compiled.kernel_table(2, 2, sms).expect("kernel table");
    let gemms = table.gemms(0).to_vec();
    assert!(
        gemms.iter().any(|g| g.linear && g.accumulate),
        "the ring's pieces sum in their GEMMs: {gemms:?}"
    );
    let backend = CudaBackend::new(gpu.clone(), CudaOptions::default())
        .expect("backend")
        .with_kernels(table.clone(), 0);
    backend.load_kernels().expect("the kernels load");
    let planned = gpu.gemm_plans();
    let stream = backend
        .stream(weave_executor::StreamKey::Main)
        .expect("the main stream");
    for g in &gemms {
        let operand = |o: &weave_executor::meter::GemmOperand| {
            backend
                .allocate(o.dtype, &o.full, true, &stream)
                .expect("operand")
                .boxed(&o.ranges)
                .expect("the operand's box fits its allocation")
        };
        let (a, b, out) = (operand(&g.a), operand(&g.b), operand(&g.out));
        let bias = g.bias.as_ref().map(operand);
        let run = if g.linear {
            backend.linear(
                "the ring's GEMM",
                &a,
                &b,
                bias.as_ref(),
                &out,
                g.accumulate,
                &stream,
            )
        } else {
            backend.matmul("the ring's GEMM", &a, &b, &out, g.accumulate, &stream)
        };
        run.expect("the GEMM launches");
        assert_eq!(
            gpu.gemm_plans(),
            planned,
            "{g:?} was planned after loading: the run would plan it mid-run"
        );
    }
    backend.synchronize().expect("the GEMMs ran");
}

/// Loading ahead covers what a run launches, so no module is loaded and no stream or GEMM
/// handle is made while a run's waits are in flight (the copy-engine stalls of
/// docs/benchmarks.md, 2026-11-27 seventh and eighth): after `CudaBackend::load_kernels` a
/// run of a linear + ReLU in 3 uneven chunks on 2 pool streams compiles no kernel and makes
/// no stream, and after `Reducer::load` of what `sum_kernels` names for a
/// reduce-scatter's pieces, launching those sums compiles nothing — while a sum of a length
/// not loaded does (the count the checks read moves).
#[test]
fn a_run_compiles_no_kernel_after_its_kernels_were_loaded() {
    let Some(_turn) = one_gpu() else { return };
    use weave_comm::nccl::{Nccl, NcclId, NcclOptions};
    use weave_comm::{sum_kernels, DataType, Reducer, ReductionShape, SumKernel};
    use weave_executor::{BlockSums, CudaBackend, CudaOptions, DeviceTensor, RunConfig};

    let gpu = weave_cuda::Gpu::open(0).expect("GPU 0");
    let src = common::linear_relu("t = 10, h = 64, f = 32, s = 3", "f32");
    let fusion = streamweave::load("linear_relu.weave", &src, &[]).expect("loads");
    let exe = compile(fusion);
    let sms = usize::try_from(gpu.sm_count()).unwrap_or(1).max(1);
    let table = exe.kernel_table(1, 2, sms).expect("kernel table");
    assert!(!table.entries().is_empty(), "the layer launches kernels");
    let backend = CudaBackend::new(gpu.clone(), CudaOptions::default())
        .expect("backend")
        .with_kernels(table.clone(), 0);
    let before_load = gpu.kernels_compiled();
    backend.load_kernels().expect("the kernels load");
    let loaded = gpu.kernels_compiled();
    assert!(
        loaded > before_load,
        "loading {} plans compiled nothing",
        table.entries().len()
    );
    // Loading also made every stream the run posts on, each with its cuBLASLt handle (a
    // stream's first GEMM would otherwise allocate its workspace synchronously mid-run).
    use weave_executor::{Backend, StreamKey};
    let streams = backend.streams();
    assert_eq!(
        streams,
        vec![StreamKey::Main, StreamKey::Pool(0), StreamKey::Pool(1)]
    );
    for key in &streams {
        let stream = backend.stream(*key).expect("made");
        assert!(stream.gemms_prepared(), "{key} has no cuBLASLt handle");
    }
    // And launched each of the layer's GEMMs once (3 chunks: rows 0..4, 4..8 and 8..10).
    assert_eq!(table.gemms(0).len(), 3);
    let planned = gpu.gemm_plans();
    assert!(
        planned >= 2,
        "the chunks' GEMMs of 4 and 2 rows were not planned"
    );
    // And grew the memory pool to the rank's peak, so that the run does not grow it (a
    // pool peers may access maps new memory for them inside the driver, mid-run).
    let peak = table.peak_bytes(0);
    assert!(peak > 0, "the layer holds buffers");
    let pool = gpu.pool_bytes().expect("the pool's sizes");
    assert!(
        pool.reserved - pool.used >= peak,
        "{pool:?} after loading leaves less than the peak of {peak} bytes idle"
    );
    let comm: Nccl<DeviceTensor> = Nccl::init(
        &gpu,
        0,
        1,
        &NcclId::new().expect("NCCL id"),
        NcclOptions::default(),
    )
    .expect("a world of one");
    let config = RunConfig {
        params: exe.signature().params.iter().cloned().collect(),
        number_of_streams: 2,
        check_races: false,
        deadline: None,
    };
    let inputs: Vec<Dense> = exe
        .inputs()
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let sizes = t.local_sizes_of(0);
            let n: usize = sizes.iter().product();
            let data = (0..n).map(|e| ((e * 7 + i) % 13) as f64 - 6.0).collect();
            Dense {
                dtype: t.dtype,
                sizes,
                data,
            }
        })
        .collect();
    let run = weave_executor::run_rank(exe.program(), &backend, &comm, &inputs, &config)
        .expect("the layer runs");
    assert_eq!(run.outputs[0].sizes, vec![10, 32]);
    assert_eq!(
        gpu.kernels_compiled(),
        loaded,
        "the run compiled a kernel that was not loaded ahead"
    );
    assert_eq!(backend.streams(), streams, "the run made a stream");
    let after = gpu.pool_bytes().expect("the pool's sizes");
    assert_eq!(after.reserved, pool.reserved, "the run grew the pool");
    assert_eq!(
        gpu.gemm_plans(),
        planned,
        "the run planned a GEMM shape that was not warmed ahead"
    );

    // The copy-engine sums of a reduce-scatter's pieces: slots of 2 KiB (1,024 bf16) cut a
    // block of 3,000 into 1,024, 1,024 and 952; rows of 100 that fit a slot, into 1,000.
    let shape = ReductionShape {
        team: 2,
        allreduce: false,
        dtype: DataType::Bf16,
        input_len: 6000,
        output_len: 3000,
        row: 100,
    };
    let kernels = sum_kernels(&shape, Some(2048));
    let sums = BlockSums::new(gpu.clone());
    for &k in &kernels {
        sums.load(k).expect("the sum loads");
    }
    let stream = gpu
        .new_stream(weave_cuda::Priority::Normal)
        .expect("stream");
    let buf = |n: usize| gpu.alloc(2 * n, &stream).expect("buffer");
    let (a, b, out) = (buf(3000), buf(3000), buf(3000));
    let loaded = gpu.kernels_compiled();
    let mut lengths = Vec::new();
    for k in &kernels {
        let SumKernel::Pointers { n, .. } = *k else {
            panic!("{k:?}: windows sum pointers")
        };
        lengths.push(n);
        sums.sum_pointers(out.ptr(), &[a.ptr(), b.ptr()], n, DataType::Bf16, &stream)
            .expect("the sum launches");
    }
    lengths.sort_unstable();
    assert_eq!(lengths, vec![952, 1000, 1024]);
    assert_eq!(
        gpu.kernels_compiled(),
        loaded,
        "a loaded sum compiled again"
    );
    sums.sum_pointers(out.ptr(), &[a.ptr(), b.ptr()], 77, DataType::Bf16, &stream)
        .expect("a sum of another length launches");
    assert!(
        gpu.kernels_compiled() > loaded,
        "a length not loaded compiles: the count moves"
    );
    stream
        .synchronize_timeout(Duration::from_secs(30))
        .expect("the sums finish");
}

/// A traced run puts every rank on one clock, also for a program of point-to-point
/// transfers, which the timeline cannot align on a collective: `matmul_rs_ring` on 2 GPUs,
/// where iteration 0 of rank `r` computes its peer's partial sums, sends them and receives
/// the peer's partial of its own block. That exchange cannot end before the peer's GEMM
/// that computed what it receives: with each rank timed from an origin of its own (the
/// rank's first span), the ranks' start skew — milliseconds in a threads-mode run — breaks
/// that order on one side or the other.
#[test]
fn a_traced_ring_puts_every_rank_on_one_clock() {
    let Some((_n, _turn)) = gpus() else { return };
    let fusion = load("matmul_rs_ring", &[("d", 2), ("t", 4096), ("h", 2048)]);
    let exe = compile(fusion);
    let globals = exe.random_inputs(3).unwrap();
    let options = RunOptions {
        check: false,
        trace: true,
        ..gpu_options(2)
    };
    let report = exe.run_dense(&globals, &options).expect("runs");
    let ranks = report.rank_spans();
    assert_eq!(ranks.len(), 2);
    // Per rank: the end of its first GEMM and of its first exchange.
    let first_end = |r: usize, prefix: &str| -> f64 {
        ranks[r]
            .spans
            .iter()
            .filter(|s| s.label.contains(prefix))
            .min_by(|a, b| a.start_us.total_cmp(&b.start_us))
            .map(|s| s.start_us + s.dur_us)
            .unwrap_or_else(|| panic!("rank {r} has no `{prefix}` span: {:?}", ranks[r].spans))
    };
    // Both ranks' first exchange is one coalesced pair between them: on one clock the two
    // spans overlap (each ends once its own send and receive have; measured on 2 × H200,
    // ends 102 µs apart for 8 MiB each way). Rebased to each rank's own first span instead,
    // the rank whose host came first would be drawn that head start later (126 ms in the
    // run that showed it).
    let first = |r: usize| {
        ranks[r]
            .spans
            .iter()
            .filter(|s| s.label.contains("EndCoalescing"))
            .min_by(|a, b| a.start_us.total_cmp(&b.start_us))
            .map(|s| (s.start_us, s.start_us + s.dur_us))
            .expect("an exchange")
    };
    let ((s0, e0), (s1, e1)) = (first(0), first(1));
    assert!(
        s0 <= e1 && s1 <= e0,
        "the ranks' first exchange runs over {s0:.1}..{e0:.1} and {s1:.1}..{e1:.1} µs: \
         not one clock"
    );
    for r in 0..2 {
        let peer = 1 - r;
        let exchange = first_end(r, "EndCoalescing");
        let peer_gemm = first_end(peer, "linear(");
        assert!(
            exchange + 20.0 >= peer_gemm,
            "rank {r}'s first exchange ends at {exchange:.1} µs, before rank {peer}'s GEMM \
             that computes what it receives ends ({peer_gemm:.1} µs): the ranks are not on one clock"
        );
    }
}
