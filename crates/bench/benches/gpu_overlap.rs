//! The overlap benchmark on GPUs: row-parallel (matmul + allreduce), column-parallel
//! (allgather + matmul), matmul + reduce-scatter, the P2P-ring allgather + matmul and the
//! sequence-parallel MLP block (allgather + column-parallel linear + SiLU + row-parallel
//! linear + reduce-scatter, f = 4h), bf16, for every world size, hidden size and chunk count
//! S ∈ {1, 2, 4, 8} plus the cost model's choice; per row, in the same run, our GEMMs alone
//! and our collectives alone; medians over CUDA-event-timed iterations, maximum over ranks;
//! every configuration's output checked on sampled rows against a host reference; overlap
//! experiments (stream pool size, entry synchronization, priorities, SM and CTA limits, CUDA
//! graphs) on top.
//!
//! `cargo xtask gpu-bundle` builds it into `bin/gpu_overlap`; `scripts/gpu/bench.sh` runs it
//! and then PyTorch's reference (scripts/gpu/torch_reference.py) and merges both into one
//! table. Without GPUs it prints why and exits 0 (so `cargo bench` stays usable here).

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{ArgAction, Parser, ValueEnum};
use serde_json::{json, Value};
use streamweave::chunks::{choose, workload, Calibration, CANDIDATES};
use streamweave::{Compiler, Executable};
use weave_bench::{
    calibrate, check_sample, linear_reference, median, run_program, time_comm, time_gemm,
    times_hashed, world_gpu_name, Check, CommKind, CopyEngine, ProgramRun, ProgramTiming, World,
    WorldOptions, LINEAR_SEEDS,
};
use weave_comm::nccl::{NcclId, NcclOptions};
use weave_comm::{IpcOptions, PeerHub};
use weave_executor::dense::round_to;
use weave_executor::timeline::{chrome_trace, svg, RankSpans};
use weave_executor::CudaOptions;
use weave_passes::{AssignStreams, Pipeline, SyncVariant};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Pattern {
    /// Matmul + allreduce.
    #[value(name = "row-parallel")]
    RowParallel,
    /// Allgather + matmul.
    #[value(name = "column-parallel")]
    ColumnParallel,
    /// Matmul + reduce-scatter.
    #[value(name = "matmul+rs")]
    MatmulRs,
    /// The P2P-ring allgather + matmul.
    #[value(name = "p2p-ring")]
    P2pRing,
    /// The sequence-parallel MLP block: allgather of x over t, column-parallel linear (w1,
    /// f = 4h), SiLU, row-parallel linear (w2), reduce-scatter back onto t.
    #[value(name = "sp-mlp")]
    SpMlp,
}

impl Pattern {
    fn name(self) -> &'static str {
        match self {
            Pattern::RowParallel => "row-parallel",
            Pattern::ColumnParallel => "column-parallel",
            Pattern::MatmulRs => "matmul+rs",
            Pattern::P2pRing => "p2p-ring",
            Pattern::SpMlp => "sp-mlp",
        }
    }

    fn fixture(self) -> (&'static str, &'static str) {
        match self {
            Pattern::RowParallel => (
                "row_parallel_linear",
                include_str!("../../../tests/scenarios/row_parallel_linear.weave"),
            ),
            Pattern::ColumnParallel => (
                "column_parallel_chunked",
                include_str!("../../../tests/scenarios/column_parallel_chunked.weave"),
            ),
            Pattern::MatmulRs => (
                "matmul_rs",
                include_str!("../../../tests/scenarios/matmul_rs.weave"),
            ),
            Pattern::P2pRing => (
                "column_parallel_p2p",
                include_str!("../../../tests/scenarios/column_parallel_p2p.weave"),
            ),
            // sequence_parallel_mlp_silu.weave in bf16 (that fixture is f32).
            Pattern::SpMlp => (
                "sequence_parallel_mlp_block",
                include_str!("../../../tests/scenarios/sequence_parallel_mlp_block.weave"),
            ),
        }
    }

    /// The fixture's parameters at (t, h, d), the chunk count aside.
    fn params(self, t: usize, h: usize, d: usize) -> Vec<(&'static str, i64)> {
        let mut set = vec![("t", t as i64), ("h", h as i64), ("d", d as i64)];
        if self == Pattern::SpMlp {
            set.push(("f", (MLP_EXPANSION * h) as i64));
        }
        set
    }

    /// The seeds of the fixture's inputs, in their order.
    fn seeds(self) -> &'static [u64] {
        match self {
            Pattern::SpMlp => &MLP_SEEDS,
            _ => &LINEAR_SEEDS,
        }
    }

    /// The local GEMMs `[m, k] · [n, k]ᵀ` of one rank, as (m, n, k).
    fn gemms(self, t: usize, h: usize, d: usize) -> Vec<(usize, usize, usize)> {
        match self {
            Pattern::RowParallel | Pattern::MatmulRs => vec![(t, h, 4 * h / d)],
            Pattern::ColumnParallel | Pattern::P2pRing => vec![(t, 4 * h / d, h)],
            Pattern::SpMlp => {
                let f = MLP_EXPANSION * h / d;
                vec![(t, f, h), (t, h, f)]
            }
        }
    }

    /// The collectives alone, each over the whole `[t, h]` activation.
    fn comms(self) -> Vec<CommKind> {
        match self {
            Pattern::RowParallel => vec![CommKind::Allreduce],
            Pattern::ColumnParallel => vec![CommKind::Allgather],
            Pattern::MatmulRs => vec![CommKind::ReduceScatter],
            Pattern::P2pRing => vec![CommKind::Ring],
            Pattern::SpMlp => vec![CommKind::Allgather, CommKind::ReduceScatter],
        }
    }

    /// The host reference of the output rows `rows` at hidden size `h`.
    fn reference(self, rows: &[usize], h: usize) -> Vec<Vec<f64>> {
        let [sx, sw] = LINEAR_SEEDS;
        match self {
            // The global X [t, k] · W [n, k]ᵀ.
            Pattern::RowParallel | Pattern::MatmulRs => linear_reference(rows, 4 * h, h, sx, sw),
            Pattern::ColumnParallel | Pattern::P2pRing => linear_reference(rows, h, 4 * h, sx, sw),
            Pattern::SpMlp => mlp_reference(rows, h, MLP_EXPANSION * h, MLP_SEEDS),
        }
    }

    /// The chunk counts to sweep on `d` ranks.
    fn chunk_counts(self, d: usize) -> Vec<usize> {
        match self {
            Pattern::P2pRing => vec![d],
            _ => vec![1, 2, 4, 8],
        }
    }
}

/// The overlap benchmark on GPUs (rows, experiments and calibration; see the module doc).
#[derive(Parser)]
#[command(name = "gpu_overlap")]
struct Args {
    /// World sizes to measure, comma-separated (those above the visible GPUs are skipped).
    #[arg(long, value_name = "D,...", value_delimiter = ',', default_values_t = [2, 4])]
    ranks: Vec<usize>,
    /// Hidden sizes h, comma-separated.
    #[arg(long = "h", value_name = "H,...", value_delimiter = ',', default_values_t = [4096, 8192])]
    hs: Vec<usize>,
    /// Tokens t.
    #[arg(long = "t", default_value_t = 8192)]
    t: usize,
    /// Timed iterations per configuration (at least 1).
    #[arg(long, default_value_t = 20, value_parser = at_least_one)]
    iters: usize,
    /// Untimed iterations before them.
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// The patterns to measure, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "row-parallel,column-parallel,matmul+rs,p2p-ring,sp-mlp"
    )]
    patterns: Vec<Pattern>,
    /// Where to write ours.jsonl, the traces and the timelines.
    #[arg(long, value_name = "DIR", default_value = "bench-out")]
    out: PathBuf,
    /// Skip the overlap experiments.
    #[arg(long = "no-experiments", action = ArgAction::SetFalse)]
    experiments: bool,
    /// Skip the calibration (the cost model then reads --calibration, or its defaults).
    #[arg(long = "no-calibrate", action = ArgAction::SetFalse)]
    calibrate: bool,
    /// The calibration cache: read for the cost model, and written with the calibration
    /// measured here. Default: $WEAVE_CALIBRATION; without either the measured calibration
    /// is used for this run only (and logged in ours.jsonl).
    #[arg(long, value_name = "FILE")]
    calibration: Option<PathBuf>,
    /// How long any wait may take, in seconds.
    #[arg(long = "timeout-secs", value_name = "T", default_value_t = 30)]
    timeout_secs: u64,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

impl Args {
    /// The bound on every wait.
    fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_secs)
    }

    /// `--calibration`, else `$WEAVE_CALIBRATION`.
    fn calibration_path(&self) -> Option<PathBuf> {
        self.calibration
            .clone()
            .or_else(|| std::env::var_os("WEAVE_CALIBRATION").map(PathBuf::from))
    }
}

/// The MLP block's intermediate size f over h.
const MLP_EXPANSION: usize = 4;

/// The seeds of the MLP block's inputs x, w1 and w2 (x and w1 as a linear's).
const MLP_SEEDS: [u64; 3] = [LINEAR_SEEDS[0], LINEAR_SEEDS[1], 303];

/// Rows `rows` of the MLP block's output `silu(x · w1ᵀ) · w2ᵀ` (the reduce-scatter only
/// places rows) for the global x [t, h], w1 [f, h] and w2 [h, f] hashed from `seeds`, in f64
/// but with the bf16 roundings the program makes in between: h1 (the first GEMM's bf16
/// output) and a (the SiLU kernel computes in f32 and stores bf16). The remaining differences
/// (the first GEMM's f32 accumulation, which may round h1 one bf16 step the other way, the
/// second GEMM's, its bf16 partials, the reduce-scatter's bf16 sums) are within the bf16
/// tolerance of [`check_sample`].
fn mlp_reference(rows: &[usize], h: usize, f: usize, seeds: [u64; 3]) -> Vec<Vec<f64>> {
    let bf16 = |v: f64| round_to(weave_ir::DType::BF16, v);
    let a: Vec<Vec<f64>> = linear_reference(rows, h, f, seeds[0], seeds[1])
        .into_iter()
        .map(|row| {
            row.into_iter()
                .map(|v| {
                    let h1 = bf16(v);
                    bf16(h1 / (1.0 + (-h1).exp()))
                })
                .collect()
        })
        .collect();
    times_hashed(&a, h, seeds[2])
}

/// A count of at least 1.
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("`{s}` is not a positive number")),
    }
}

/// Loads and compiles the pattern at (t, h, d, s) with `pipeline`.
fn compile(
    p: Pattern,
    t: usize,
    h: usize,
    d: usize,
    s: Option<usize>,
    pipeline: &Pipeline,
) -> Result<Executable, String> {
    let (name, source) = p.fixture();
    let mut set = p.params(t, h, d);
    if let Some(s) = s {
        set.push(("s", s as i64));
    }
    let mut compiler = Compiler::new().pipeline(pipeline.clone());
    for (k, v) in set {
        compiler = compiler.set(k, v);
    }
    compiler
        .compile_source(name, source)
        .map_err(|e| e.to_string())
}

/// One measured configuration of a row.
struct Measured {
    config: String,
    ms: f64,
    check: Check,
    spans: Vec<RankSpans>,
}

struct Bench {
    args: Args,
    log: std::fs::File,
}

impl Bench {
    fn emit(&mut self, v: Value) {
        let _ = writeln!(self.log, "{v}");
    }
}

/// Times `compiled` with `how` on every rank (with `comm_options` a fresh communicator for
/// the job, else the world's) and checks its sampled rows.
#[allow(clippy::too_many_arguments)]
fn measure(
    world: &World,
    compiled: &Arc<Executable>,
    how: &ProgramRun,
    comm_options: Option<(NcclId, NcclOptions)>,
    engine: CopyEngine,
    args: &Args,
    seeds: &'static [u64],
    rows: &Arc<Vec<usize>>,
    reference: &[Vec<f64>],
    config: String,
) -> Result<Measured, String> {
    let (c, how2, rows2) = (compiled.clone(), how.clone(), rows.clone());
    let (warmup, iters) = (args.warmup, args.iters);
    let timings: Vec<ProgramTiming> = world.run(move |r| {
        run_program(
            r,
            comm_options.as_ref(),
            &engine,
            &c,
            &how2,
            seeds,
            (warmup, iters),
            &rows2,
        )
    })?;
    let ms = timings
        .iter()
        .map(|t| median(&t.times))
        .fold(0.0f64, f64::max);
    let found: Vec<(usize, usize, f64)> = timings.iter().flat_map(|t| t.sample.clone()).collect();
    let check = check_sample(&found, rows, reference, weave_ir::DType::BF16);
    if how.trace {
        let n: usize = timings.iter().map(|t| t.spans.len()).sum();
        println!("  ({config}: {n} spans traced over all ranks)");
    }
    let spans = timings
        .iter()
        .enumerate()
        .map(|(rank, t)| RankSpans {
            rank,
            spans: t.spans.clone(),
        })
        .collect();
    Ok(Measured {
        config,
        ms,
        check,
        spans,
    })
}

/// Per rank, the medians of each part; returns (the slowest rank's sum of the parts, each
/// part's slowest rank).
fn sum_of_medians(v: &[Vec<f64>]) -> (f64, Vec<f64>) {
    let total = v
        .iter()
        .map(|r| r.iter().sum::<f64>())
        .fold(0.0f64, f64::max);
    let parts = (0..v.first().map_or(0, Vec::len))
        .map(|j| v.iter().map(|r| r[j]).fold(0.0f64, f64::max))
        .collect();
    (total, parts)
}

fn run() -> Result<(), String> {
    let args = Args::parse();
    match weave_cuda::device_count() {
        Ok(n) if n >= 2 => {}
        Ok(n) => {
            println!("gpu_overlap: skipped: {n} GPU(s) visible, the benchmark needs 2 or more");
            return Ok(());
        }
        Err(e) => {
            println!("gpu_overlap: skipped: {e}");
            return Ok(());
        }
    }
    let visible = weave_cuda::device_count().map_err(|e| e.to_string())?;
    std::fs::create_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    let log_path = args.out.join("ours.jsonl");
    let log = std::fs::File::create(&log_path)
        .map_err(|e| format!("cannot write {}: {e}", log_path.display()))?;
    let mut bench = Bench { args, log };
    let mut separate = Pipeline::standard();
    separate.replace(
        "assign-streams",
        AssignStreams::new(SyncVariant::SeparateLoop),
    );
    let ranks: Vec<usize> = bench
        .args
        .ranks
        .iter()
        .copied()
        .filter(|&r| r <= visible)
        .collect();
    let calibration_path = bench.args.calibration_path();
    let mut cal = Calibration::load(calibration_path.as_deref())?;
    let mut summary = Vec::new();
    for &d in &ranks {
        let options = WorldOptions {
            ranks: d,
            timeout: bench.args.timeout(),
            nccl: NcclOptions::default(),
        };
        let mut world = Ranks {
            world: World::open(options.clone())?,
            options,
        };
        let gpu = world_gpu_name(world.get()?)?;
        println!("== {d} x {gpu}");
        if bench.args.calibrate {
            cal = calibrate(world.get()?)?;
            if let Some(path) = &calibration_path {
                if let Some(dir) = path.parent() {
                    let _ = std::fs::create_dir_all(dir);
                }
                std::fs::write(path, cal.render())
                    .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
                println!("calibration ({}): {}", path.display(), cal.source);
            }
            bench.emit(json!({
                "source": "streamweave-calibration", "d": d, "gpu": gpu,
                "gemm_tflops": cal.gemm_tflops, "busbw_gbs": cal.busbw_gbs,
                "p2p_gbs": cal.p2p_gbs, "gemm_overhead_us": cal.gemm_overhead_us,
                "comm_latency_us": cal.comm_latency_us, "contention": cal.contention,
            }));
        }
        let sms = world.get()?.run(|r| Ok(r.gpu.sm_count()))?[0];
        let post_us = world
            .get()?
            .run(|r| weave_bench::host_post_us(r, 50))?
            .into_iter()
            .fold(0.0f64, f64::max);
        println!("host time per allreduce post: {post_us:.1} us");
        bench.emit(json!({"source": "streamweave-host", "d": d, "post_host_us": post_us}));
        let t = bench.args.t;
        for h in bench.args.hs.clone() {
            for p in bench.args.patterns.clone() {
                let row = match run_row(&mut bench, &mut world, p, t, h, d, &cal, sms, &separate) {
                    Ok(row) => row,
                    Err(e) => {
                        let line = format!("{:16} d={d} h={h}: ERROR {e}", p.name());
                        println!("{line}");
                        bench.emit(json!({
                            "source": "streamweave-error", "pattern": p.name(), "d": d,
                            "t": t, "h": h, "error": e,
                        }));
                        summary.push(line);
                        continue;
                    }
                };
                if p == Pattern::RowParallel && h == 8192 {
                    if let Some((ms, config, spans)) = &row.traced {
                        let base = bench.args.out.join(format!("row_parallel_d{d}"));
                        std::fs::write(base.with_extension("json"), chrome_trace(spans))
                            .and_then(|()| std::fs::write(base.with_extension("svg"), svg(spans)))
                            .map_err(|e| format!("cannot write the timeline: {e}"))?;
                        println!(
                            "timeline of the fastest traced row-parallel run (d={d} h={h} \
                             {config}, {ms:.3} ms timed): {}.svg",
                            base.display()
                        );
                    }
                }
                summary.push(row.line);
            }
        }
    }
    println!("\n{}", summary.join("\n"));
    Ok(())
}

/// One experiment around the sweep.
#[derive(Clone)]
struct Experiment {
    /// What is varied (`streams`, `cuda-graph`, …).
    kind: &'static str,
    /// The chunk count.
    s: usize,
    /// The program (compiled for `s`, possibly with another pipeline).
    compiled: Arc<Executable>,
    /// How it runs.
    how: ProgramRun,
    /// The communicator's options (`None`: the world's communicator).
    nccl: Option<NcclOptions>,
    /// How allgathers and transfers move.
    engine: Engine,
    /// Its description.
    config: String,
}

/// How an experiment moves allgathers and transfers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Engine {
    /// NCCL kernels.
    Nccl,
    /// Copy-engine peer copies pulled by the receiver (`PeerCopy`).
    Peer,
    /// Copy-engine pushes through shared receive windows (`IpcCopy`, the launched-process
    /// protocol).
    Windows,
}

/// The world of one rank count, reopened after a job failed (a failed job may leave the
/// communicator aborted).
struct Ranks {
    world: World,
    options: WorldOptions,
}

impl Ranks {
    fn get(&mut self) -> Result<&World, String> {
        if self.world.failed() {
            println!(
                "(reopening the {} ranks after a failure)",
                self.options.ranks
            );
            self.world = World::open(self.options.clone())?;
        }
        Ok(&self.world)
    }
}

struct RowResult {
    /// The fastest configuration that has a trace (with its time and description).
    traced: Option<(f64, String, Vec<RankSpans>)>,
    line: String,
}

#[allow(clippy::too_many_arguments)]
fn run_row(
    bench: &mut Bench,
    world: &mut Ranks,
    p: Pattern,
    t: usize,
    h: usize,
    d: usize,
    cal: &Calibration,
    sms: i32,
    separate: &Pipeline,
) -> Result<RowResult, String> {
    let (w, i) = (bench.args.warmup, bench.args.iters);
    let standard = Pipeline::standard();
    // Our GEMMs alone and our collectives alone: per rank the sum of each one's median (the
    // MLP block: both GEMMs; the allgather and the reduce-scatter), the slowest rank's.
    let gemms = p.gemms(t, h, d);
    let (mm, mm_parts) = sum_of_medians(&world.get()?.run(move |r| {
        gemms
            .iter()
            .map(|&g| time_gemm(r, g, w, i).map(|v| median(&v)))
            .collect::<Result<Vec<f64>, _>>()
    })?);
    let kinds = p.comms();
    let (comm, comm_parts) = sum_of_medians(&world.get()?.run(move |r| {
        kinds
            .iter()
            .map(|&k| time_comm(r, k, t * h, w, i).map(|v| median(&v)))
            .collect::<Result<Vec<f64>, _>>()
    })?);
    // The host reference of 16 sampled rows.
    let rows: Arc<Vec<usize>> = Arc::new(
        (0..16)
            .map(|j| j * (t / 16) + (j * 37) % (t / 16))
            .collect(),
    );
    let reference = p.reference(&rows, h);
    let mut sweep: Vec<(usize, Measured)> = Vec::new();
    for s in p.chunk_counts(d) {
        let param = (p != Pattern::P2pRing).then_some(s);
        let compiled = Arc::new(compile(p, t, h, d, param, &standard)?);
        let how = ProgramRun {
            streams: 2,
            trace: p == Pattern::RowParallel && h == 8192,
            ..ProgramRun::default()
        };
        let m = measure(
            world.get()?,
            &compiled,
            &how,
            None,
            CopyEngine::Off,
            &bench.args,
            p.seeds(),
            &rows,
            &reference,
            format!("S={s} K=2"),
        )?;
        println!(
            "{:16} d={d} h={h} S={s}: {:.3} ms  numerics {}",
            p.name(),
            m.ms,
            if m.check.ok { "ok" } else { "FAIL" }
        );
        sweep.push((s, m));
    }
    let s1 = sweep.iter().find(|(s, _)| *s == 1).map(|(_, m)| m.ms);
    // The cost model's choice, from the unchunked program's workload.
    let auto = if p == Pattern::P2pRing {
        None
    } else {
        let one = compile(p, t, h, d, Some(1), &standard)?;
        let wl = workload(one.program(), d).map_err(|e| e.to_string())?;
        let c = choose(&wl, cal, &CANDIDATES);
        let ms = sweep
            .iter()
            .find(|(s, _)| *s == c.chunks)
            .map(|(_, m)| m.ms);
        Some((c.chunks, ms))
    };
    // The best chunk count of the sweep (overlapped: S > 1), and experiments around it.
    let (s_best, _) = sweep
        .iter()
        .filter(|(s, m)| *s > 1 && m.check.ok)
        .map(|(s, m)| (*s, m.ms))
        .fold(
            (0usize, f64::INFINITY),
            |a, b| if b.1 < a.1 { b } else { a },
        );
    let mut variants: Vec<Measured> = Vec::new();
    if bench.args.experiments && s_best > 0 {
        let sweep_ms: Vec<(usize, f64)> = sweep.iter().map(|(s, m)| (*s, m.ms)).collect();
        let program = |s: usize, pipeline: &Pipeline| -> Result<Arc<Executable>, String> {
            let param = (p != Pattern::P2pRing).then_some(s);
            Ok(Arc::new(compile(p, t, h, d, param, pipeline)?))
        };
        let best_program = program(s_best, &standard)?;
        // Row-parallel at h = 8192: every configuration keeps a trace, for the timeline of
        // the best one.
        let base = ProgramRun {
            trace: p == Pattern::RowParallel && h == 8192,
            ..ProgramRun::default()
        };
        let exp =
            |kind, s, compiled: &Arc<Executable>, how: ProgramRun, config: String| Experiment {
                kind,
                s,
                compiled: compiled.clone(),
                how,
                nccl: None,
                engine: Engine::Nccl,
                config,
            };
        let timeout = bench.args.timeout();
        let ctas = |n: i32| NcclOptions {
            timeout,
            max_ctas: Some(n),
            ..NcclOptions::default()
        };
        let with_cuda = |cuda: CudaOptions, graph: bool| ProgramRun {
            cuda,
            graph,
            ..base.clone()
        };
        let mut exps: Vec<Experiment> = Vec::new();
        // Phase 1: knobs of the eager program at the best S, and CUDA graphs at every S.
        for k in [1usize, 3, 4, 8] {
            if k <= s_best {
                let how = ProgramRun {
                    streams: k,
                    ..base.clone()
                };
                exps.push(exp(
                    "streams",
                    s_best,
                    &best_program,
                    how,
                    format!("S={s_best} K={k}"),
                ));
            }
        }
        exps.push(exp(
            "entry-sync",
            s_best,
            &program(s_best, separate)?,
            base.clone(),
            format!("S={s_best} K=2 separate entry-sync loop"),
        ));
        exps.push(exp(
            "priority",
            s_best,
            &best_program,
            with_cuda(
                CudaOptions {
                    pool_priority_high: true,
                    ..CudaOptions::default()
                },
                false,
            ),
            format!("S={s_best} K=2 pool streams high priority"),
        ));
        for cut in [8, 16, 32] {
            exps.push(exp(
                "gemm-sms",
                s_best,
                &best_program,
                with_cuda(
                    CudaOptions {
                        gemm_sm_count: sms - cut,
                        ..CudaOptions::default()
                    },
                    false,
                ),
                format!("S={s_best} K=2 GEMM on {} SMs", sms - cut),
            ));
        }
        for n in [4, 8, 16] {
            exps.push(Experiment {
                nccl: Some(ctas(n)),
                ..exp(
                    "nccl-ctas",
                    s_best,
                    &best_program,
                    base.clone(),
                    format!("S={s_best} K=2 NCCL maxCTAs={n}"),
                )
            });
        }
        for s in [1, s_best] {
            exps.push(Experiment {
                nccl: Some(NcclOptions {
                    timeout,
                    blocking: true,
                    ..NcclOptions::default()
                }),
                ..exp(
                    "nccl-blocking",
                    s,
                    &program(s, &standard)?,
                    base.clone(),
                    format!("S={s} K=2 blocking NCCL communicator"),
                )
            });
        }
        for s in p.chunk_counts(d) {
            let how = ProgramRun {
                graph: true,
                ..base.clone()
            };
            exps.push(exp(
                "cuda-graph",
                s,
                &program(s, &standard)?,
                how,
                format!("S={s} K=2 CUDA graph replay"),
            ));
        }
        // Compute in issue order across streams (chunk i + 1's GEMM after chunk i's), eager
        // and replayed.
        let ordered = CudaOptions {
            ordered_compute: true,
            ..CudaOptions::default()
        };
        for s in p.chunk_counts(d).into_iter().filter(|&s| s > 1) {
            let c = program(s, &standard)?;
            for graph in [false, true] {
                let how = with_cuda(ordered.clone(), graph);
                let kind = if graph {
                    "graph+ordered"
                } else {
                    "ordered-compute"
                };
                let what = if graph { ", CUDA graph" } else { "" };
                exps.push(exp(
                    kind,
                    s,
                    &c,
                    how,
                    format!("S={s} K=2 ordered compute{what}"),
                ));
            }
        }
        // Copy-engine allgathers and transfers: no SMs taken from the GEMMs, so more chunks
        // may pay.
        if matches!(
            p,
            Pattern::ColumnParallel | Pattern::P2pRing | Pattern::SpMlp
        ) {
            for s in p.chunk_counts(d).into_iter().filter(|&s| s > 1) {
                let c = program(s, &standard)?;
                // Window transfers leave their flags as they found them, so they replay.
                let replay = ProgramRun {
                    graph: true,
                    ..base.clone()
                };
                for (engine, kind, how, what) in [
                    (Engine::Peer, "peer-copy", &base, "copy-engine transfers"),
                    (
                        Engine::Windows,
                        "window-copy",
                        &base,
                        "copy-engine pushes through shared windows",
                    ),
                    (
                        Engine::Windows,
                        "graph+window-copy",
                        &replay,
                        "CUDA graph, copy-engine pushes through shared windows",
                    ),
                ] {
                    exps.push(Experiment {
                        engine,
                        ..exp(kind, s, &c, how.clone(), format!("S={s} K=2 {what}"))
                    });
                }
            }
        }
        let mut graphs: Vec<(usize, f64)> = Vec::new();
        for e in exps {
            if let Some(m) =
                run_experiment(bench, world, p, (t, h, d), &e, &sweep_ms, &rows, &reference)?
            {
                if e.kind == "cuda-graph" && e.s > 1 && m.check.ok {
                    graphs.push((e.s, m.ms));
                }
                variants.push(m);
            }
        }
        // Phase 2: the fastest replayed S with the knobs that may still help a replay.
        if let Some(&(sg, _)) = graphs.iter().min_by(|a, b| a.1.total_cmp(&b.1)) {
            let g = program(sg, &standard)?;
            let replay = |cuda: CudaOptions, streams: usize| ProgramRun {
                cuda,
                graph: true,
                streams,
                ..base.clone()
            };
            let mut more = vec![
                exp(
                    "graph+priority",
                    sg,
                    &g,
                    replay(
                        CudaOptions {
                            pool_priority_high: true,
                            ..CudaOptions::default()
                        },
                        2,
                    ),
                    format!("S={sg} K=2 CUDA graph, pool streams high priority"),
                ),
                exp(
                    "graph+gemm-sms",
                    sg,
                    &g,
                    replay(
                        CudaOptions {
                            gemm_sm_count: sms - 8,
                            ..CudaOptions::default()
                        },
                        2,
                    ),
                    format!("S={sg} K=2 CUDA graph, GEMM on {} SMs", sms - 8),
                ),
                Experiment {
                    nccl: Some(ctas(16)),
                    ..exp(
                        "graph+nccl-ctas",
                        sg,
                        &g,
                        replay(CudaOptions::default(), 2),
                        format!("S={sg} K=2 CUDA graph, NCCL maxCTAs=16"),
                    )
                },
            ];
            if sg > 2 {
                more.push(exp(
                    "graph+streams",
                    sg,
                    &g,
                    replay(CudaOptions::default(), sg),
                    format!("S={sg} K={sg} CUDA graph"),
                ));
            }
            for e in more {
                if let Some(m) =
                    run_experiment(bench, world, p, (t, h, d), &e, &sweep_ms, &rows, &reference)?
                {
                    variants.push(m);
                }
            }
        }
    }
    let numerics_ok = sweep.iter().all(|(_, m)| m.check.ok) && variants.iter().all(|m| m.check.ok);
    let max_err = sweep
        .iter()
        .map(|(_, m)| &m.check)
        .chain(variants.iter().map(|m| &m.check))
        .map(|c| c.max_rel)
        .fold(0.0f64, f64::max);
    let configs = sweep.len() + variants.len();
    let chunks: serde_json::Map<String, Value> = sweep
        .iter()
        .filter(|(s, _)| *s > 1)
        .map(|(s, m)| (s.to_string(), json!(m.ms)))
        .collect();
    let traced = sweep
        .iter()
        .map(|(_, m)| m)
        .chain(variants.iter())
        .filter(|m| m.check.ok && m.spans.iter().any(|r| !r.spans.is_empty()))
        .min_by(|a, b| a.ms.total_cmp(&b.ms))
        .map(|m| (m.ms, m.config.clone(), m.spans.clone()));
    // The best overlapped configuration with correct numerics (S > 1, or P2P's S = d).
    let mut candidates: Vec<Measured> = sweep
        .into_iter()
        .filter(|(s, _)| *s > 1)
        .map(|(_, m)| m)
        .chain(variants)
        .filter(|m| m.check.ok)
        .collect();
    candidates.sort_by(|a, b| a.ms.total_cmp(&b.ms));
    let best = candidates.into_iter().next().ok_or(format!(
        "{} d={d} h={h}: no overlapped configuration produced correct numerics",
        p.name()
    ))?;
    bench.emit(json!({
        "source": "streamweave", "pattern": p.name(), "d": d, "t": t, "h": h,
        "mm_ms": mm, "comm_ms": comm, "mm_parts_ms": mm_parts, "comm_parts_ms": comm_parts,
        "s1_ms": s1, "chunks": chunks,
        "auto": auto.map(|(s, ms)| json!({"s": s, "ms": ms})),
        "best": {"ms": best.ms, "config": best.config},
        "numerics": {"ok": numerics_ok, "max_err": max_err, "configs": configs},
    }));
    let line = format!(
        "{:16} d={d} h={h}: mm {mm:.3} comm {comm:.3} S=1 {} auto {} best {:.3} ({}) \
         best/max {:.2} numerics {}",
        p.name(),
        s1.map_or("-".into(), |v| format!("{v:.3}")),
        auto.map_or("-".into(), |(s, ms)| format!(
            "S={s} {}",
            ms.map_or("-".into(), |v| format!("{v:.3}"))
        )),
        best.ms,
        best.config,
        best.ms / mm.max(comm),
        if numerics_ok { "ok" } else { "FAIL" }
    );
    println!("{line}");
    Ok(RowResult { traced, line })
}

/// Runs one experiment and writes its line; `None` (with the error written) when it failed.
#[allow(clippy::too_many_arguments)]
fn run_experiment(
    bench: &mut Bench,
    world: &mut Ranks,
    p: Pattern,
    (t, h, d): (usize, usize, usize),
    e: &Experiment,
    sweep_ms: &[(usize, f64)],
    rows: &Arc<Vec<usize>>,
    reference: &[Vec<f64>],
) -> Result<Option<Measured>, String> {
    let baseline = sweep_ms
        .iter()
        .find(|(s, _)| *s == e.s)
        .map(|(_, ms)| *ms)
        .unwrap_or(f64::NAN);
    let comm_options = match &e.nccl {
        Some(o) => Some((NcclId::new().map_err(|e| e.to_string())?, o.clone())),
        None => None,
    };
    let measured = measure(
        world.get()?,
        &e.compiled,
        &e.how,
        comm_options,
        match e.engine {
            Engine::Nccl => CopyEngine::Off,
            Engine::Peer => CopyEngine::Peer(PeerHub::new()),
            Engine::Windows => {
                CopyEngine::windows(d, IpcOptions::from_env().expect("WEAVE_CE_WINDOWS"))
            }
        },
        &bench.args,
        p.seeds(),
        rows,
        reference,
        e.config.clone(),
    );
    let config = &e.config;
    match measured {
        Ok(m) => {
            println!(
                "{:16} d={d} h={h} {config}: {:.3} ms (eager S={} {baseline:.3})  numerics {}",
                p.name(),
                m.ms,
                e.s,
                if m.check.ok { "ok" } else { "FAIL" }
            );
            bench.emit(json!({
                "source": "streamweave-experiment", "pattern": p.name(), "d": d, "t": t,
                "h": h, "experiment": e.kind, "config": config, "ms": m.ms,
                "baseline_ms": baseline, "numerics_ok": m.check.ok,
                "max_err": m.check.max_rel,
            }));
            Ok(Some(m))
        }
        Err(err) => {
            println!("{:16} d={d} h={h} {config}: ERROR {err}", p.name());
            bench.emit(json!({
                "source": "streamweave-experiment", "pattern": p.name(), "d": d, "t": t,
                "h": h, "experiment": e.kind, "config": config, "ms": null,
                "baseline_ms": baseline, "error": err,
            }));
            Ok(None)
        }
    }
}

fn main() {
    if let Err(e) = run() {
        eprintln!("gpu_overlap: error: {e}");
        std::process::exit(1);
    }
}
