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

#[path = "overlap/args.rs"]
mod args;
#[path = "overlap/measure.rs"]
mod measure;
#[path = "overlap/pattern.rs"]
mod pattern;
#[path = "overlap/row.rs"]
mod row;

use std::io::Write as _;

use clap::Parser;
use serde_json::{json, Value};
use streamweave::chunks::Calibration;
use weave_bench::{calibrate, world_gpu_name, World, WorldOptions};
use weave_comm::nccl::NcclOptions;
use weave_executor::timeline::trace_and_picture;
use weave_passes::{AssignStreams, Pipeline, SyncVariant};

use args::Args;
use pattern::Pattern;
use row::run_row;

struct Bench {
    args: Args,
    log: std::fs::File,
}

impl Bench {
    fn emit(&mut self, v: Value) {
        let _ = writeln!(self.log, "{v}");
    }
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
    let mut cal = Calibration::load(calibration_path.as_deref()).map_err(|e| e.to_string())?;
    let mut summary = Vec::new();
    for &d in &ranks {
        let options = WorldOptions {
            devices: Vec::new(),
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
                        let (trace_json, picture) = trace_and_picture(spans.clone());
                        std::fs::write(base.with_extension("json"), trace_json)
                            .and_then(|()| std::fs::write(base.with_extension("svg"), picture))
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

fn main() {
    if let Err(e) = run() {
        eprintln!("gpu_overlap: error: {e}");
        std::process::exit(1);
    }
}
