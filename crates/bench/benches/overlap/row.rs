//! One row of the overlap benchmark ([`run_row`]): a pattern at one world size and hidden
//! size, our GEMMs and collectives alone, the chunk-count sweep with the cost model's choice,
//! and the overlap experiments around it ([`run_experiment`]).

use std::sync::Arc;

use serde_json::{json, Value};
use streamweave::chunks::{choose, workload, Calibration, CANDIDATES};
use streamweave::Executable;
use weave_bench::{median, time_comm, time_gemm, CopyEngine, ProgramRun};
use weave_comm::nccl::{NcclId, NcclOptions};
use weave_comm::{IpcOptions, PeerHub};
use weave_executor::timeline::RankSpans;
use weave_executor::CudaOptions;
use weave_passes::Pipeline;

use super::measure::{measure, sum_of_medians, Measured};
use super::pattern::{compile, Pattern};
use super::{Bench, Ranks};

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

pub(crate) struct RowResult {
    /// The fastest configuration that has a trace (with its time and description).
    pub(crate) traced: Option<(f64, String, Vec<RankSpans>)>,
    pub(crate) line: String,
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn run_row(
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
