//! The single-GPU kernel benchmark: the generated kernels of tests/scenarios/kernels (add,
//! SiLU, GELU tanh, bias + residual, row sum, column sum, softmax, LayerNorm, RMSNorm) at
//! [16384, 8192] and [4096, 4096], whole (s = 1) and in s = 4 stream chunks (as the default
//! pipeline runs them, and with every loop kept: what a kernel chunk costs), each against a
//! device-to-device memcpy of the same bytes measured in the same run (the bandwidth
//! ceiling). Times are medians of CUDA-event-timed runs, both replays of one run captured as a
//! CUDA graph (the default way repeated runs are timed) and runs issued statement by
//! statement (eager); every configuration's output is
//! checked against the f64 reference of its fixture (the whole output where it is small
//! enough, sampled rows or columns otherwise).
//!
//! `cargo xtask gpu-bundle` builds it into `bin/gpu_kernels`; `scripts/gpu/kernels.sh` runs it
//! and then PyTorch's twin (scripts/gpu/kernels_torch.py) and prints one table. Without a GPU
//! it prints why and exits 0 (so `cargo bench` stays usable here).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::{json, Value};
use streamweave::host_ir::TensorSig;
use streamweave::passes::Pipeline;
use streamweave::{Compiler, Executable, RunOptions, Target};
use weave_bench::{hash_value, median, random_input, sample_rows, JobError, Rank, Timing, World};
use weave_bench::{world_gpu_name, WorldOptions};
use weave_comm::nccl::NcclOptions;
use weave_executor::dense::{elem_bytes, Dense};
use weave_executor::reference::compare;
use weave_executor::{Backend, CudaBackend, CudaOptions, DeviceTensor, Replay, StreamKey};
use weave_ir::DType;

/// The cases, each a fixture `NAME.weave` in the scenarios directory.
const CASES: [&str; 9] = weave_bench::KERNEL_CASES;

/// What is measured and how (written into the JSON).
const TIMING: &str = "CUDA events on the main stream around one whole program run (inputs \
                      already on the device), median: `ms` replays one run captured as a CUDA \
                      graph (how `weave run --iters` times runs), `eager_ms` issues every \
                      statement from the host (kernel launches and host issue included)";

/// The kernel benchmark on one GPU (see the module doc).
#[derive(Parser)]
#[command(name = "gpu_kernels")]
struct Args {
    /// The directory of the fixtures (NAME.weave). Default: scenarios/kernels when it exists
    /// (the bundle's layout), else the repository's tests/scenarios/kernels.
    #[arg(long, value_name = "DIR")]
    scenarios: Option<PathBuf>,
    /// The cases to run, comma-separated (default: all).
    #[arg(long, value_delimiter = ',', value_name = "CASE,...")]
    cases: Vec<String>,
    /// The shapes [t, h], comma-separated, each `TxH`.
    #[arg(long, value_delimiter = ',', value_name = "TxH,...", default_value = "16384x8192,4096x4096", value_parser = shape)]
    shapes: Vec<(usize, usize)>,
    /// The stream chunk counts s, comma-separated.
    #[arg(long = "chunks", value_delimiter = ',', value_name = "S,...", default_values_t = [1, 4])]
    chunks: Vec<usize>,
    /// Untimed runs before the timed ones.
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// Timed runs per configuration (at least 1).
    #[arg(long, default_value_t = 50, value_parser = at_least_one)]
    iters: usize,
    /// The worker-stream pool size of each run.
    #[arg(long, default_value_t = 2, value_parser = at_least_one)]
    streams: usize,
    /// Outputs of at most this many elements (t × h) are checked whole; larger ones on
    /// sampled rows (columns for the column sum).
    #[arg(long, value_name = "N", default_value_t = 4096 * 4096)]
    full_check: usize,
    /// Rows (columns) sampled for the check of larger outputs, besides the chunk edges.
    #[arg(long, value_name = "N", default_value_t = 32)]
    sample: usize,
    /// The JSON file to write (every row; rewritten after each one).
    #[arg(long, value_name = "FILE", default_value = "gpu_kernels.json")]
    out: PathBuf,
    /// How long any wait may take, in seconds.
    #[arg(long = "timeout-secs", value_name = "T", default_value_t = 60)]
    timeout_secs: u64,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// A count of at least 1.
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("`{s}` is not a positive number")),
    }
}

/// `TxH` as (t, h).
fn shape(s: &str) -> Result<(usize, usize), String> {
    let (t, h) = s
        .split_once(['x', 'X'])
        .ok_or_else(|| format!("`{s}` is not TxH"))?;
    match (t.trim().parse::<usize>(), h.trim().parse::<usize>()) {
        (Ok(t), Ok(h)) if t >= 1 && h >= 1 => Ok((t, h)),
        _ => Err(format!("`{s}` is not TxH with positive T and H")),
    }
}

/// The seed of input `k` (the device fill and the host reference agree on it).
fn seed(k: usize) -> u64 {
    101 + k as u64
}

/// The output elements a check compares: global rows × global columns of the input
/// (`rows` for the row-wise cases, `cols` for the column sum).
#[derive(Clone, Debug)]
struct Window {
    rows: Vec<usize>,
    cols: Vec<usize>,
    whole: bool,
}

/// `n` positions spread over `0..len`, plus both sides of every chunk edge of each `s` in
/// `chunks` (where stream chunking could go wrong), sorted and unique.
fn spread(len: usize, n: usize, chunks: &[usize]) -> Vec<usize> {
    let mut v: Vec<usize> = vec![0, len - 1];
    for i in 0..n {
        v.push((i * len / n.max(1) + 7 * i + 3) % len);
    }
    for &s in chunks {
        let chunk = len.div_ceil(s.max(1));
        for c in 1..s {
            let edge = c * chunk;
            if edge < len {
                v.push(edge);
                v.push(edge - 1);
            }
        }
    }
    v.sort_unstable();
    v.dedup();
    v
}

/// The window checked for `case` at (t, h).
fn window(args: &Args, case: &str, t: usize, h: usize) -> Window {
    if t * h <= args.full_check {
        return Window {
            rows: (0..t).collect(),
            cols: (0..h).collect(),
            whole: true,
        };
    }
    if case == "col_sum" {
        Window {
            rows: (0..t).collect(),
            cols: spread(h, args.sample, &args.chunks),
            whole: false,
        }
    } else {
        Window {
            rows: spread(t, args.sample, &args.chunks),
            cols: (0..h).collect(),
            whole: false,
        }
    }
}

/// The f64 reference of `case` on the window: the fixture compiled at the window's size and
/// evaluated on the window's slice of the global inputs (the same hash values the device
/// fill writes), row-major over (rows, cols) for 2-D outputs, over rows (row sum) or
/// columns (column sum) for 1-D ones.
fn reference(
    source: &str,
    case: &str,
    h: usize,
    names: &[String],
    w: &Window,
) -> Result<Vec<f64>, String> {
    let (tw, hw) = (w.rows.len(), w.cols.len());
    let exe = Compiler::new()
        .set("t", tw as i64)
        .set("h", hw as i64)
        .set("s", 1)
        .compile_source(&format!("{case}.weave"), source)
        .map_err(|e| format!("reference compile: {e}"))?;
    let consts = weave_bench::kernel_constants(case, h);
    let mut globals = Vec::new();
    for sig in exe.inputs() {
        let k = names
            .iter()
            .position(|n| *n == sig.name)
            .ok_or_else(|| format!("reference: no input `{}`", sig.name))?;
        let data: Vec<f64> = if let Some((_, v)) = consts.iter().find(|(n, _)| *n == sig.name) {
            vec![*v as f32 as f64]
        } else {
            match sig.shape.as_slice() {
                [a, b] if *a == tw && *b == hw => w
                    .rows
                    .iter()
                    .flat_map(|&r| w.cols.iter().map(move |&c| (r * h + c) as u64))
                    .map(|g| hash_value(seed(k), g))
                    .collect(),
                [b] if *b == hw => w
                    .cols
                    .iter()
                    .map(|&c| hash_value(seed(k), c as u64))
                    .collect(),
                other => {
                    return Err(format!(
                        "reference: input `{}` has sizes {other:?}, not [t, h] or [h]",
                        sig.name
                    ))
                }
            }
        };
        globals.push(Dense::new(sig.dtype, sig.shape.clone(), data).map_err(|e| e.to_string())?);
    }
    let out = exe
        .reference(&globals)
        .map_err(|e| format!("reference: {e}"))?;
    out.into_iter()
        .next()
        .map(|d| d.data)
        .ok_or_else(|| "reference: no output".to_string())
}

/// The values of the device output `out` (of `layout`) on the window, in the order of
/// [`reference`].
fn actual(
    rank: &Rank,
    backend: &CudaBackend,
    out: &DeviceTensor,
    layout: &TensorSig,
    case: &str,
    w: &Window,
) -> Result<Vec<f64>, JobError> {
    let main = backend.stream(StreamKey::Main).map_err(|e| e.to_string())?;
    let global = &layout.shape;
    if global.len() == 2 && !w.whole {
        // Only the sampled rows come back.
        let h = global[1];
        let found = sample_rows(rank, backend, out, layout, &w.rows)?;
        let mut by_pos: HashMap<(usize, usize), f64> = HashMap::with_capacity(found.len());
        for (r, c, v) in found {
            by_pos.insert((r, c), v);
        }
        let mut v = Vec::with_capacity(w.rows.len() * h);
        for &r in &w.rows {
            for &c in &w.cols {
                v.push(
                    *by_pos
                        .get(&(r, c))
                        .ok_or_else(|| format!("element ({r}, {c}) was not read back"))?,
                );
            }
        }
        return Ok(v);
    }
    let all = backend.download(out, &main).map_err(|e| e.to_string())?;
    let data = all.data;
    match global.as_slice() {
        [_, h] => Ok(w
            .rows
            .iter()
            .flat_map(|&r| w.cols.iter().map(move |&c| r * h + c))
            .map(|i| data[i])
            .collect()),
        [_] if case == "col_sum" => Ok(w.cols.iter().map(|&c| data[c]).collect()),
        [_] => Ok(w.rows.iter().map(|&r| data[r]).collect()),
        other => Err(format!("an output of sizes {other:?}").into()),
    }
}

/// What one configuration measured.
struct Measured {
    /// Replays of one run captured as a CUDA graph (how `weave run --iters` times runs).
    times: Vec<f64>,
    /// Runs issued statement by statement.
    eager: Vec<f64>,
    got: Vec<f64>,
    bytes: usize,
    out_dtype: DType,
    out_rank: usize,
}

/// Fills the inputs of `exe` (hash values, constants), times `warmup` + `iters` runs on the
/// GPU issued statement by statement and as many replays of one captured run, then runs
/// once more and reads the window of the output back.
fn measure(
    rank: &Rank,
    exe: &Executable,
    case: &str,
    h: usize,
    w: &Window,
    (warmup, iters, streams): (usize, usize, usize),
) -> Result<Measured, JobError> {
    // A backend that launches the program's kernels from its kernel table, planned for this
    // GPU before the runs.
    let kernels = exe
        .kernel_table(rank.world, streams, streamweave::gpu::sms_of(&rank.gpu))
        .map_err(|e| e.to_string())?;
    let backend = &rank
        .backend_with(CudaOptions::default())?
        .with_kernels(kernels, rank.rank);
    let main = backend.stream(StreamKey::Main).map_err(|e| e.to_string())?;
    let consts = weave_bench::kernel_constants(case, h);
    let mut inputs = Vec::new();
    let mut bytes = 0usize;
    for (k, sig) in exe.inputs().iter().enumerate() {
        bytes += sig.shape.iter().product::<usize>() * elem_bytes(sig.dtype);
        let buf = match consts.iter().find(|(n, _)| *n == sig.name) {
            Some((_, v)) => {
                let d = Dense::new(sig.dtype, sig.shape.clone(), vec![*v as f32 as f64])
                    .map_err(|e| e.to_string())?;
                backend.upload(&d).map_err(|e| format!("constant: {e}"))?
            }
            None => random_input(rank, backend, sig.dtype, sig, seed(k))?,
        };
        inputs.push(buf);
    }
    let layout = exe.outputs().first().ok_or("the program has no output")?;
    for o in exe.outputs() {
        bytes += o.shape.iter().product::<usize>() * elem_bytes(o.dtype);
    }
    let options = RunOptions {
        target: Target::Cuda { ranks: 1 },
        streams,
        check_races: false,
        timeouts: streamweave::Timeouts::all(rank.timeout),
        ..RunOptions::default()
    };
    let once = || -> Result<Vec<DeviceTensor>, JobError> {
        exe.run_rank_buffers(backend, &*rank.comm, &inputs, &options)
            .map(|r| r.outputs)
            .map_err(|e| JobError(e.to_string()))
    };
    let eager = rank.time(Timing::Each, backend, warmup, iters, || {
        for o in once()? {
            backend.deallocate(o, &main);
        }
        Ok(())
    })?;
    let config = exe.config(&options);
    let replay = Replay::capture(exe.program(), backend, &*rank.comm, &inputs, &config)
        .map_err(|e| e.to_string())?;
    let times = rank.time(Timing::Each, backend, warmup, iters, || {
        replay.launch().map_err(|e| JobError(e.to_string()))
    })?;
    drop(replay);
    let outputs = once()?;
    backend
        .synchronize()
        .map_err(|e| format!("checked run: {e}"))?;
    let got = actual(rank, backend, &outputs[0], layout, case, w);
    for o in outputs {
        backend.deallocate(o, &main);
    }
    for i in inputs {
        backend.deallocate(i, &main);
    }
    backend
        .synchronize()
        .map_err(|e| format!("checked run: {e}"))?;
    Ok(Measured {
        times,
        eager,
        got: got?,
        bytes,
        out_dtype: layout.dtype,
        out_rank: layout.shape.len(),
    })
}

/// Median milliseconds of a device-to-device copy of `bytes` bytes (`warmup` + `iters`
/// copies, CUDA events around each), the copy captured in a CUDA graph and replayed, as our
/// runs are.
fn memcpy_ms(rank: &Rank, bytes: usize, warmup: usize, iters: usize) -> Result<f64, JobError> {
    let backend = &rank.backend;
    let main = backend.stream(StreamKey::Main).map_err(|e| e.to_string())?;
    let src = rank.gpu.alloc(bytes, &main).map_err(|e| e.to_string())?;
    let dst = rank.gpu.alloc(bytes, &main).map_err(|e| e.to_string())?;
    let times = main
        .capture(|| rank.gpu.copy(dst.ptr(), src.ptr(), bytes, &main))
        .map_err(|e| JobError(e.to_string()))
        .and_then(|((), graph)| {
            rank.time(Timing::Each, backend, warmup, iters, || {
                graph.launch(&main).map_err(|e| JobError(e.to_string()))
            })
        });
    for m in [src, dst] {
        m.free_on(&main).map_err(|e| e.to_string())?;
    }
    backend.synchronize().map_err(|e| e.to_string())?;
    Ok(median(&times?))
}

/// Gigabytes (1e9 bytes) per second.
fn gbs(bytes: usize, ms: f64) -> f64 {
    bytes as f64 / (ms * 1e-3) / 1e9
}

struct Bench {
    args: Args,
    dir: PathBuf,
    world: World,
    options: WorldOptions,
    gpu: String,
    rows: Vec<Value>,
    memcpy: HashMap<usize, f64>,
    references: HashMap<(String, usize, usize), Result<Vec<f64>, String>>,
}

impl Bench {
    /// The GPU's world, reopened when a failed configuration broke it (so one failure does
    /// not hide the configurations after it).
    fn world(&mut self) -> Result<&World, String> {
        if self.world.failed() {
            println!("(reopening the GPU after a failure)");
            self.world = World::open(self.options.clone())?;
        }
        Ok(&self.world)
    }

    /// Writes every row so far (a run cut short still leaves its rows).
    fn write(&self) -> Result<(), String> {
        let doc = json!({
            "source": "streamweave",
            "gpu": self.gpu,
            "timing": TIMING,
            "memcpy": "Gpu::copy (cuMemcpyDtoDAsync) of half the case's bytes (it reads and writes each), captured in a CUDA graph and replayed, same timing",
            "warmup": self.args.warmup,
            "iters": self.args.iters,
            "streams": self.args.streams,
            "rows": self.rows,
        });
        let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
        std::fs::write(&self.args.out, text + "\n")
            .map_err(|e| format!("cannot write {}: {e}", self.args.out.display()))
    }

    /// Measures `exe`, the case `case` of hidden size `h`, on the world's GPUs ([`measure`],
    /// `w` the window of its outputs to check): what the first rank measured.
    fn measure(
        &mut self,
        exe: Executable,
        case: &str,
        h: usize,
        w: &Window,
    ) -> Result<Measured, String> {
        let (exe, case, w) = (std::sync::Arc::new(exe), case.to_string(), w.clone());
        let how = (self.args.warmup, self.args.iters, self.args.streams);
        Ok(self
            .world()?
            .run(move |r| measure(r, &exe, &case, h, &w, how))?
            .into_iter()
            .next()
            .ok_or("no rank answered")?)
    }

    /// Runs one configuration and adds its row.
    fn row(&mut self, case: &str, t: usize, h: usize, s: usize) -> Result<(), String> {
        let path = self.dir.join(format!("{case}.weave"));
        let source = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let started = Instant::now();
        // The program with the default pipeline, or with `pipeline`.
        let compile = |pipeline: Option<Pipeline>| {
            let compiler = Compiler::new()
                .set("t", t as i64)
                .set("h", h as i64)
                .set("s", s as i64);
            match pipeline {
                Some(p) => compiler.pipeline(p),
                None => compiler,
            }
            .compile_source(&path.display().to_string(), &source)
        };
        let exe = compile(None).map_err(|e| format!("compile: {e}"))?;
        let names: Vec<String> = exe.inputs().iter().map(|i| i.name.clone()).collect();
        let w = window(&self.args, case, t, h);
        let m = self.measure(exe, case, h, &w)?;
        // With s > 1 the default pipeline runs a kernel-only loop once over whole tensors
        // (`merge-kernel-chunks`); the same program with every loop kept measures what a
        // kernel chunk costs where chunks stay (between GEMMs or communications).
        let kept = if s > 1 {
            let kept_exe = compile(Some(Pipeline::standard().without("merge-kernel-chunks")))
                .map_err(|e| format!("compile with every loop kept: {e}"))?;
            Some(self.measure(kept_exe, case, h, &w)?)
        } else {
            None
        };
        let ms = median(&m.times);
        let eager_ms = median(&m.eager);
        // The ceiling: a copy that reads and writes as many bytes as the case moves.
        let copy_bytes = (m.bytes / 2).div_ceil(16) * 16;
        let copy_ms = match self.memcpy.get(&copy_bytes) {
            Some(v) => *v,
            None => {
                let (warmup, iters) = (self.args.warmup, self.args.iters);
                let v = self
                    .world()?
                    .run(move |r| memcpy_ms(r, copy_bytes, warmup, iters))?
                    .into_iter()
                    .next()
                    .ok_or("no rank answered")?;
                self.memcpy.insert(copy_bytes, v);
                v
            }
        };
        let key = (case.to_string(), t, h);
        if !self.references.contains_key(&key) {
            let r = reference(&source, case, h, &names, &w);
            self.references.insert(key.clone(), r);
        }
        let numerics = match &self.references[&key] {
            Ok(want) => {
                let c = compare(&m.got, want, m.out_dtype);
                // The worst element: its (row, column) of the input's grid (the output's
                // element for a 2-D output, its row or column for a sum), and both values.
                let worst = c.worst.map(|i| {
                    let at = match (m.out_rank == 2, case) {
                        (true, _) => json!([w.rows[i / w.cols.len()], w.cols[i % w.cols.len()]]),
                        (false, "col_sum") => json!([null, w.cols[i]]),
                        (false, _) => json!([w.rows[i], null]),
                    };
                    json!({"at": at, "got": m.got.get(i), "want": want[i]})
                });
                json!({
                    "worst": worst,
                    "ok": c.ok, "max_abs": c.max_abs, "max_rel": c.max_rel,
                    "mismatches": c.mismatches, "compared": c.actual_len.min(c.expected_len),
                    "checked": if w.whole { "whole output".to_string() } else if case == "col_sum" {
                        format!("{} sampled columns", w.cols.len())
                    } else {
                        format!("{} sampled rows", w.rows.len())
                    },
                })
            }
            Err(e) => json!({"ok": false, "error": e}),
        };
        let kept = kept.map(|k| {
            let kept_ms = median(&k.times);
            let ok = match &self.references[&key] {
                Ok(want) => compare(&k.got, want, k.out_dtype).ok,
                Err(_) => false,
            };
            json!({
                "ms": kept_ms,
                "eager_ms": median(&k.eager),
                "pct_of_memcpy": 100.0 * gbs(k.bytes, kept_ms) / gbs(2 * copy_bytes, copy_ms),
                "numerics_ok": ok,
            })
        });
        let copy_gbs = gbs(2 * copy_bytes, copy_ms);
        let case_gbs = gbs(m.bytes, ms);
        let ok = numerics["ok"].as_bool().unwrap_or(false);
        println!(
            "{case:14} [{t}, {h}] s={s}: {ms:.4} ms (eager {eager_ms:.4}) {case_gbs:7.1} GB/s  memcpy {copy_ms:.4} ms \
             {copy_gbs:7.1} GB/s  {:5.1}% of memcpy  numerics {} (max rel {:.1e})  [{:.1} s]",
            100.0 * case_gbs / copy_gbs,
            if ok { "ok" } else { "FAIL" },
            numerics["max_rel"].as_f64().unwrap_or(f64::NAN),
            started.elapsed().as_secs_f64()
        );
        self.rows.push(json!({
            "case": case, "t": t, "h": h, "s": s, "ms": ms,
            "min_ms": m.times.iter().copied().fold(f64::INFINITY, f64::min),
            "eager_ms": eager_ms,
            "eager_gbs": gbs(m.bytes, eager_ms),
            "eager_pct_of_memcpy": 100.0 * gbs(m.bytes, eager_ms) / copy_gbs,
            "bytes": m.bytes, "gbs": case_gbs,
            "memcpy_bytes": copy_bytes, "memcpy_ms": copy_ms, "memcpy_gbs": copy_gbs,
            "pct_of_memcpy": 100.0 * case_gbs / copy_gbs,
            "numerics": numerics,
            "kept": kept,
        }));
        Ok(())
    }
}

/// The fixtures' directory: `--scenarios`, else the bundle's, else the repository's.
fn scenarios_dir(args: &Args) -> PathBuf {
    if let Some(d) = &args.scenarios {
        return d.clone();
    }
    let bundle = Path::new("scenarios/kernels");
    if bundle.is_dir() {
        return bundle.to_path_buf();
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/scenarios/kernels")
}

fn run() -> Result<bool, String> {
    let args = Args::parse();
    match weave_cuda::device_count() {
        Ok(n) if n >= 1 => {}
        Ok(_) => {
            println!("gpu_kernels: skipped: no GPU visible");
            return Ok(true);
        }
        Err(e) => {
            println!("gpu_kernels: skipped: {e}");
            return Ok(true);
        }
    }
    let cases: Vec<String> = if args.cases.is_empty() {
        CASES.iter().map(|c| c.to_string()).collect()
    } else {
        args.cases.clone()
    };
    if let Some(bad) = cases.iter().find(|c| !CASES.contains(&c.as_str())) {
        return Err(format!(
            "unknown case `{bad}` (the cases: {})",
            CASES.join(", ")
        ));
    }
    let dir = scenarios_dir(&args);
    let options = WorldOptions {
        devices: Vec::new(),
        ranks: 1,
        timeout: Duration::from_secs(args.timeout_secs),
        nccl: NcclOptions::default(),
    };
    let world = World::open(options.clone())?;
    let gpu = world_gpu_name(&world)?;
    println!(
        "== gpu_kernels on {gpu}: {} case(s), shapes {:?}, s {:?}, warmup {}, iters {}; {TIMING}",
        cases.len(),
        args.shapes,
        args.chunks,
        args.warmup,
        args.iters
    );
    let mut bench = Bench {
        args,
        dir,
        world,
        options,
        gpu,
        rows: Vec::new(),
        memcpy: HashMap::new(),
        references: HashMap::new(),
    };
    let mut all_ok = true;
    for (t, h) in bench.args.shapes.clone() {
        for case in &cases {
            for s in bench.args.chunks.clone() {
                if let Err(e) = bench.row(case, t, h, s) {
                    all_ok = false;
                    println!("{case:14} [{t}, {h}] s={s}: ERROR {e}");
                    bench.rows.push(json!({
                        "case": case, "t": t, "h": h, "s": s, "error": e,
                        "numerics": {"ok": false},
                    }));
                }
                bench.write()?;
            }
        }
    }
    all_ok &= bench
        .rows
        .iter()
        .all(|r| r["numerics"]["ok"].as_bool() == Some(true));
    println!(
        "gpu_kernels: {} row(s) in {}",
        bench.rows.len(),
        bench.args.out.display()
    );
    Ok(all_ok)
}

fn main() {
    match run() {
        Ok(true) => {}
        Ok(false) => {
            eprintln!("gpu_kernels: some configuration failed or did not match the reference");
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("gpu_kernels: error: {e}");
            std::process::exit(1);
        }
    }
}
