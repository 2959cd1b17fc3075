//! The `weave run` command: compile, run on in-process ranks or GPUs (threads, or one process
//! per rank under a launcher) with a progress bar, compare with the reference, print a
//! summary, write the timeline and an optional JSON summary; with `--chunks auto` it takes
//! the configuration `weave tune` cached for the program. `weave tune` measures the
//! candidate configurations and caches the winner (`$WEAVE_TUNE_CACHE`, else
//! `streamweave/tune.toml` in the platform's cache directory), and `weave calibrate` measures the machine for the
//! chunk-count model.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::Duration;

use weave_executor::timeline::{chrome_trace, svg};
use weave_host_ir::{HostProgram, Stmt};
use weave_passes::DumpOptions;

use streamweave::{Chunks, Compiler, Executable, RunOptions, RunReport, Target};

/// A one-paragraph summary of a host program: statements by kind, loops, communications.
pub fn summarize(program: &HostProgram) -> String {
    let mut loops = 0;
    let mut kernels = 0;
    let mut gemms = 0;
    let mut comms: Vec<String> = Vec::new();
    let mut p2p = 0;
    let mut total = 0;
    for w in program.walk() {
        total += 1;
        match program.stmts.get(w.stmt) {
            Some(Stmt::ForLoop { .. }) => loops += 1,
            Some(Stmt::LaunchKernel { .. }) => kernels += 1,
            Some(Stmt::Matmul { .. } | Stmt::Linear { .. }) => gemms += 1,
            Some(Stmt::Communication(c)) => comms.push(c.kind.name().to_string()),
            Some(Stmt::P2PCommunication(_)) => p2p += 1,
            _ => {}
        }
    }
    comms.sort();
    comms.dedup();
    let mut s = format!(
        "{total} statements, {loops} loop(s), {kernels} kernel launch(es), {gemms} GEMM(s)"
    );
    if !comms.is_empty() {
        let _ = write!(s, ", collectives: {}", comms.join(" "));
    }
    if p2p > 0 {
        let _ = write!(s, ", {p2p} send/recv");
    }
    s
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// Prints the report of a finished run ([`render_report`]).
pub fn print_report(report: &RunReport, checked_races: bool) {
    crate::out!("{}", render_report(report, checked_races));
}

/// The report of a finished run: every rank's statements and times, the timed runs, each
/// output against the reference (on how many ranks it differs, and the worst of those), the
/// race checker's verdict and the largest error.
pub fn render_report(report: &RunReport, checked_races: bool) -> String {
    let mut s = String::new();
    for (rank, r) in report.ranks.iter().enumerate() {
        let _ = writeln!(
            s,
            "  rank {rank}: {} statements issued in {}, done in {}",
            r.statements,
            ms(r.issue_time),
            ms(r.wall_time)
        );
    }
    if let Some(t) = report.timed() {
        let _ = writeln!(
            s,
            "timed: {} runs{}, median {}, min {} (each run's slowest rank)",
            t.count,
            if report.ranks.iter().all(|r| r.replayed) {
                " (CUDA graph replays)"
            } else {
                " (issued statement by statement)"
            },
            ms(t.median),
            ms(t.min)
        );
    }
    let mut outputs: Vec<&str> = report.checks.iter().map(|c| c.output.as_str()).collect();
    outputs.dedup();
    for o in outputs {
        let checks: Vec<_> = report.checks.iter().filter(|c| c.output == o).collect();
        let ok = checks.iter().all(|c| c.comparison.ok);
        // The rank shown is the worst of those that decide the verdict: a failing one when
        // any fails (a rank within tolerance can have the larger absolute error).
        let worst = checks
            .iter()
            .filter(|c| ok || !c.comparison.ok)
            .max_by(|a, b| {
                (a.comparison.mismatches, a.comparison.max_abs)
                    .partial_cmp(&(b.comparison.mismatches, b.comparison.max_abs))
                    .unwrap_or(std::cmp::Ordering::Equal)
            });
        if let Some(w) = worst {
            let _ = writeln!(
                s,
                "output {o}: {} (worst: rank {}: {})",
                if ok {
                    format!("matches the reference on {} rank(s)", checks.len())
                } else {
                    let failed = checks.iter().filter(|c| !c.comparison.ok).count();
                    format!(
                        "DIFFERS from the reference on {failed} of {} rank(s)",
                        checks.len()
                    )
                },
                w.rank,
                w.comparison
            );
        }
    }
    if checked_races {
        let races: Vec<String> = report
            .ranks
            .iter()
            .enumerate()
            .flat_map(|(rank, r)| r.races.iter().map(move |x| format!("  rank {rank}: {x}")))
            .collect();
        if races.is_empty() {
            let _ = writeln!(s, "race checker: no races");
        } else {
            let _ = writeln!(s, "race checker: {} race(s)", races.len());
            for r in races {
                let _ = writeln!(s, "{r}");
            }
        }
    }
    let _ = writeln!(s, "max abs error: {:.3e}", report.max_abs_error());
    s
}

/// Why a finished run did not pass: the outputs that differ from the reference (and on how
/// many ranks) and the races found; `None` when it passed.
pub fn failures(report: &RunReport) -> Option<String> {
    let mut why = Vec::new();
    let mut outputs: Vec<&str> = report.checks.iter().map(|c| c.output.as_str()).collect();
    outputs.dedup();
    for o in outputs {
        let failed = report
            .checks
            .iter()
            .filter(|c| c.output == o && !c.comparison.ok)
            .count();
        if failed > 0 {
            why.push(format!(
                "output {o} differs from the reference on {failed} rank(s)"
            ));
        }
    }
    if report.races() > 0 {
        why.push(format!("{} race(s)", report.races()));
    }
    match (why.is_empty(), report.passed()) {
        (true, true) => None,
        (true, false) => Some("the run did not pass".into()),
        (false, _) => Some(why.join("; ")),
    }
}

/// The flags of `weave run` beyond [`RunOptions`]: the rank count and backend (which make
/// the target), the seed of the generated inputs, whether to check against the reference,
/// where the one-line JSON summary goes, the chunk count, and the dumps `WEAVE_DUMP` asks for.
#[derive(Clone, Debug, Default)]
pub struct RunFlags {
    /// `--ranks`: `None` for the default (2 for a fusion, its devices for a host program).
    pub ranks: Option<usize>,
    /// `--backend cuda`.
    pub cuda: bool,
    /// The seed of the generated inputs.
    pub seed: u64,
    /// `--no-check`: run without the reference.
    pub no_check: bool,
    /// The JSON summary's file, if any.
    pub path: Option<PathBuf>,
    /// `--chunks`: a fixed S, or `None` for the tuned configuration or the cost model's
    /// choice.
    pub chunks: Option<usize>,
    /// Whether `--streams` was given (the tuned pool size is used only when it was not).
    pub streams_given: bool,
    /// The value of `WEAVE_DUMP` (`weave_passes::DumpOptions::parse` syntax), which the binary
    /// reads: the IR to dump to stderr while compiling. `None` when unset.
    pub weave_dump: Option<String>,
    /// The overlap knobs and transport the command line set (they win over the tuned ones).
    pub pinned: Pinned,
    /// How long the first repeated run of an untuned program may tune (`None`: `--no-tune`).
    pub tune_budget: Option<Duration>,
}

/// The overlap knobs and the transport set on the command line; `None`: left to the tuned
/// configuration, else the default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pinned {
    /// `--transport`.
    pub transport: Option<streamweave::Transport>,
    /// `--ordered-compute on|off`.
    pub ordered_compute: Option<bool>,
    /// `--pool-priority high|normal`.
    pub pool_priority_high: Option<bool>,
    /// `--gemm-sm-margin N`.
    pub gemm_sm_margin: Option<u32>,
    /// `--nccl-max-ctas N` (`Some(None)`: `--nccl-max-ctas auto`, NCCL's choice).
    pub nccl_max_ctas: Option<Option<u32>>,
    /// `--nccl-cta-policy P` (`Some(None)`: `--nccl-cta-policy auto`, NCCL's choice).
    pub nccl_cta_policy: Option<Option<streamweave::NcclCtaPolicy>>,
    /// `--nccl-window-mib N`.
    pub nccl_window_mib: Option<u32>,
    /// `--ce-slot-mib N`.
    pub ce_slot_mib: Option<u32>,
    /// `--gemm-into-windows on|off`.
    pub gemm_into_windows: Option<bool>,
}

impl Pinned {
    /// Whether any knob was set.
    pub fn any(&self) -> bool {
        *self != Pinned::default()
    }

    /// Sets the knobs given on `options`.
    pub fn apply(&self, options: &mut RunOptions) {
        if let Some(t) = self.transport {
            options.transport = t;
        }
        if let Some(v) = self.ordered_compute {
            options.overlap.ordered_compute = v;
        }
        if let Some(v) = self.pool_priority_high {
            options.overlap.pool_priority_high = v;
        }
        if let Some(v) = self.gemm_sm_margin {
            options.overlap.gemm_sm_margin = v;
        }
        if let Some(v) = self.nccl_max_ctas {
            options.overlap.nccl_max_ctas = v;
        }
        if let Some(v) = self.nccl_cta_policy {
            options.overlap.nccl_cta_policy = v;
        }
        if let Some(v) = self.nccl_window_mib {
            options.overlap.nccl_window_mib = v;
        }
        if let Some(v) = self.ce_slot_mib {
            options.overlap.ce_slot_mib = v;
        }
        if let Some(v) = self.gemm_into_windows {
            options.overlap.gemm_into_windows = v;
        }
    }
}

/// The configuration a run uses, as `weave run` prints it: `S=2 K=2 replay, ordered compute`.
fn describe_config(exe: &Executable, options: &RunOptions, cuda: bool) -> String {
    let sig = exe.signature();
    let s = sig
        .role(streamweave::ir::ParamRole::ChunkCount)
        .and_then(|p| sig.param(p))
        .map_or_else(|| "S=as written".to_string(), |v| format!("S={v}"));
    let mut out = format!("{s} K={}", options.streams);
    if cuda {
        out.push_str(if options.replay && options.iters > 0 {
            " replay"
        } else {
            " eager"
        });
        out.push_str(match options.transport {
            streamweave::Transport::Nccl => ", NCCL",
            streamweave::Transport::CopyEngine => ", copy-engine",
        });
        if options.overlap != streamweave::Overlap::default() {
            out.push_str(&format!(", {}", options.overlap.describe()));
        }
    }
    out
}

/// The JSON summary of a run (or of its failure).
fn summary_json(
    file: &Path,
    ranks: usize,
    mode: &str,
    backend: &str,
    report: Option<&RunReport>,
    error: Option<&str>,
) -> String {
    let scenario = file
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    // Non-finite figures are `null` (JSON has no NaN or infinity).
    let num = |v: f64| v.is_finite().then_some(v);
    let (passed, abs, rel, wall) = match report {
        Some(r) => (
            r.passed(),
            num(r.max_abs_error()),
            num(r
                .checks
                .iter()
                .map(|c| c.comparison.max_rel)
                .fold(0.0, f64::max)),
            num(r
                .ranks
                .iter()
                .map(|x| x.wall_time.as_secs_f64() * 1e3)
                .fold(0.0, f64::max)),
        ),
        None => (false, None, None, None),
    };
    let (median, min) = match report.and_then(|r| r.timed()) {
        Some(t) => (
            num(t.median.as_secs_f64() * 1e3),
            num(t.min.as_secs_f64() * 1e3),
        ),
        None => (None, None),
    };
    let summary = serde_json::json!({
        "scenario": scenario,
        "ranks": ranks,
        "mode": mode,
        "backend": backend,
        "passed": passed,
        "max_abs_error": abs,
        "max_rel_error": rel,
        "wall_ms": wall,
        "timed_median_ms": median,
        "timed_min_ms": min,
        "timed_replayed": report.and_then(|r| r.timed().map(|_| r.ranks.iter().all(|x| x.replayed))),
        "config": report.and_then(|r| r.config.clone()),
        "error": error,
    });
    format!("{summary}\n")
}

/// Whether `--trace PATH` names a regular file (or a link to one) or nothing yet: where its
/// SVG timeline can be written beside it.
fn trace_is_a_file(path: &Path) -> bool {
    match std::fs::metadata(path) {
        Ok(m) => m.is_file(),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

/// Whether `file` holds a printed host program (`.hir`, or text that starts with the
/// container header) rather than a `.weave` fusion.
fn is_host_program(file: &Path, text: &str) -> bool {
    file.extension().is_some_and(|e| e == "hir")
        || text.trim_start().starts_with("%HostIrContainer")
}

/// Runs `weave run` on a `.weave` fusion or a printed host program (`.hir`). A fusion is
/// compiled for the rank count (its mesh-size parameter, unless `set` gives it) and the chunk
/// count; a host program runs as printed, its inputs sharded by its signature. With the CUDA
/// backend in a process started by `weave launch` (or torchrun, or mpirun) this process runs
/// one rank and rank 0 reports.
pub fn run(
    file: &Path,
    set: &[(String, i64)],
    options: &RunOptions,
    trace: Option<&Path>,
    flags: &RunFlags,
) -> ExitCode {
    let _run = tracing::info_span!("weave_run", file = %file.display()).entered();
    let mut options = options.clone();
    let launched = if flags.cuda {
        // RANK, WORLD_SIZE, ...: this process's place in a launched world, if any.
        // A value that is not UTF-8 is read lossily, so that it is reported as malformed
        // rather than ignored.
        match weave_comm::bootstrap::LaunchEnv::from_lookup(|name| {
            std::env::var_os(name).map(|value| value.to_string_lossy().into_owned())
        }) {
            Ok(env) => env,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        None
    };
    let mode = if launched.is_some() {
        "launch"
    } else {
        "threads"
    };
    let backend = if flags.cuda { "cuda" } else { "cpu" };
    let is_reporter = launched.as_ref().is_none_or(|e| e.rank == 0);
    let json_ranks = launched
        .as_ref()
        .map(|e| e.world)
        .or(flags.ranks)
        .unwrap_or(0);
    let summary_path = flags.path.as_deref().filter(|_| is_reporter);
    // An earlier run's summary never outlives this one: were this run killed before it
    // writes its own, a stale `"passed": true` would be read as this run's. Only a regular
    // file is removed: a link, a FIFO or a device (`/dev/stdout`) stays.
    if let Some(p) = summary_path {
        if let Err(e) = crate::output::remove_stale(p) {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    }
    // Every failure prints one `error: ` line and leaves a summary that says what failed.
    let fail = |message: String| -> ExitCode {
        eprintln!("error: {message}");
        if let Some(p) = summary_path {
            let json = summary_json(file, json_ranks, mode, backend, None, Some(&message));
            if let Err(e) = crate::output::write_output(p, json.as_bytes()) {
                eprintln!("error: {e}");
            }
        }
        ExitCode::FAILURE
    };
    if let Some(path) = trace {
        if path.extension().is_some_and(|e| e == "svg") {
            return fail(format!(
                "--trace {}: the trace is a Chrome trace (JSON) and its SVG timeline is written beside it with the extension .svg; give the trace another extension (e.g. .json)",
                path.display()
            ));
        }
        // Nor do an earlier run's trace and timeline (rank 0 writes them; the timeline only
        // beside a trace that is a file).
        if is_reporter {
            let beside = trace_is_a_file(path).then(|| path.with_extension("svg"));
            for p in std::iter::once(path.to_path_buf()).chain(beside) {
                if let Err(e) = crate::output::remove_stale(&p) {
                    return fail(e);
                }
            }
        }
    }
    if launched.is_none() {
        if let Some(n) = flags.ranks {
            if let Err(e) = (Target::Cpu { ranks: n }).check() {
                return fail(e.to_string());
            }
        }
    }
    let text = match streamweave::read_source(file) {
        Ok(bytes) => match streamweave::utf8_source(bytes) {
            Ok(t) => t,
            Err(d) => return fail(format!("{}:{d}", file.display())),
        },
        Err(e) => return fail(e),
    };
    let name = file.display().to_string();
    // The configuration `weave tune` cached for this program, when `--chunks auto` and no
    // `--streams` leave the choice open.
    let open_choice =
        !is_host_program(file, &text) && flags.chunks.is_none() && !flags.streams_given;
    let mut tuned = if !open_choice {
        None
    } else {
        let ranks = launched
            .as_ref()
            .map(|e| e.world)
            .or(flags.ranks)
            .unwrap_or(2);
        let device = launched.as_ref().map_or(0, |e| e.local_rank);
        match tuned_entry(&name, &text, set, ranks, flags.cuda, device) {
            Ok(t) => t,
            Err(m) => return fail(m),
        }
    };
    // The first repeated run of an untuned program on GPUs tunes it (bounded, said on
    // stderr, `--no-tune` to skip) and caches the winner for the runs after it.
    let mut source = if tuned.is_some() {
        "the tuning cache"
    } else {
        ""
    };
    if tuned.is_none()
        && open_choice
        && flags.cuda
        && options.iters > 0
        && !flags.pinned.any()
        && options.replay
    {
        match (&launched, flags.tune_budget) {
            (_, None) => {}
            (Some(_), Some(_)) => {
                if is_reporter {
                    eprintln!(
                        "tuning: skipped in a launched world (one process per rank); run `weave tune {} --backend cuda --ranks N` or `weave run` without a launcher once to tune it",
                        file.display()
                    );
                }
            }
            (None, Some(budget)) => {
                let ranks = flags.ranks.unwrap_or(2);
                match tune_first_run(&name, &text, set, ranks, budget, options.timeouts.wait) {
                    Ok(Some(entry)) => {
                        tuned = Some(entry);
                        source = "tuned now";
                    }
                    Ok(None) => {}
                    Err(m) => eprintln!("tuning: failed, running the untuned default: {m}"),
                }
            }
        }
    }
    let compiled = tracing::info_span!("compile").in_scope(|| {
        if is_host_program(file, &text) {
            if let Some((k, _)) = set.first() {
                return Err(format!(
                    "--set {k}: a host program's parameters are fixed (its signature's `params(..)`); set them when compiling the .weave fusion"
                ));
            }
            if let Some(n) = flags.chunks {
                return Err(format!(
                    "--chunks {n}: a host program's chunk count is fixed; choose it when compiling the .weave fusion"
                ));
            }
            return Executable::from_text(&name, &text).map_err(|e| e.to_string());
        }
        let ranks = launched.as_ref().map(|e| e.world).or(flags.ranks).unwrap_or(2);
        let dumps = DumpOptions::parse(flags.weave_dump.as_deref().unwrap_or_default())
            .map_err(|e| e.to_string())?;
        let chunks = match flags.chunks {
            Some(n) => Chunks::Fixed(n),
            None if tuned.is_some() => tuned
                .as_ref()
                .map_or(Chunks::AsWritten, |(e, _)| e.compiler_chunks()),
            None if flags.cuda => {
                let gpu = streamweave::tune::gpu_name(0).unwrap_or_default();
                Chunks::Auto(gpu_calibration(&gpu, ranks)?)
            }
            None => Chunks::AsWritten,
        };
        let mut compiler = Compiler::new().dump(dumps).devices(ranks).chunks(chunks);
        for (k, v) in set {
            compiler = compiler.set(k, *v);
        }
        compiler
            .compile_source(&name, &text)
            .map_err(|e| e.to_string())
    });
    let exe = match compiled {
        Ok(e) => e,
        Err(m) => return fail(m),
    };
    let ranks = launched
        .as_ref()
        .map(|e| e.world)
        .or(flags.ranks)
        .unwrap_or_else(|| {
            if is_host_program(file, &text) {
                exe.signature().all_devices().len().max(1)
            } else {
                2
            }
        });
    options.target = match &launched {
        Some(env) => Target::Launched(env.clone()),
        None if flags.cuda => Target::Cuda { ranks },
        None => Target::Cpu { ranks },
    };
    options.check = !flags.no_check;
    if let Some((entry, cache)) = &tuned {
        entry.apply(&mut options);
        if is_reporter {
            crate::outln!(
                "chunks: tuned {} (cache {})",
                entry.candidate(),
                cache.display()
            );
        }
    }
    flags.pinned.apply(&mut options);
    let config_line = {
        let from = if !source.is_empty() {
            source
        } else if flags.chunks.is_some() || flags.streams_given || flags.pinned.any() {
            "the command line"
        } else if exe.chunk_choice().is_some() {
            "the cost model"
        } else {
            "the defaults"
        };
        format!(
            "{} (from {from})",
            describe_config(&exe, &options, flags.cuda)
        )
    };

    if let (Some(choice), true) = (exe.chunk_choice(), is_reporter) {
        tracing::debug!(chunks = choice.chunks, "chunk count chosen");
        let predicted: Vec<String> = choice
            .predicted
            .iter()
            .map(|(s, t)| format!("S={s}: {:.3} ms", t * 1e3))
            .collect();
        crate::outln!(
            "chunks: auto -> {} (predicted {})",
            choice.chunks,
            predicted.join(", ")
        );
    }
    if let Err(e) = exe.check_ranks(ranks) {
        // An error; the `skipped:` line tells the GPU scripts that this fusion does not run
        // on this many ranks (send_recv's meshes are fixed to 2 devices).
        crate::outln!("skipped: {e}");
        eprintln!("error: {e}");
        if let Some(p) = summary_path {
            let message = format!("skipped: {e}");
            let json = summary_json(file, ranks, mode, backend, None, Some(&message));
            if let Err(e) = crate::output::write_output(p, json.as_bytes()) {
                eprintln!("error: {e}");
            }
        }
        return ExitCode::FAILURE;
    }
    if let Err(e) = options.target.check() {
        return fail(e.to_string());
    }
    if is_reporter {
        let transport = match options.transport {
            streamweave::Transport::Nccl => "",
            streamweave::Transport::CopyEngine => ", copy-engine transfers",
        };
        crate::outln!(
            "{}: {ranks} rank(s) on the {backend} backend ({mode}{transport}), numberOfStreams = {}",
            file.display(),
            options.streams
        );
        crate::outln!("host program: {}", summarize(exe.program()));
        crate::outln!("config: {config_line}");
    }
    // Sizes are checked against the memory here before any input is generated.
    let host_ranks = if launched.is_some() { 1 } else { ranks };
    let globals = match exe
        .check_memory(host_ranks)
        .and_then(|()| exe.random_inputs(flags.seed))
    {
        Ok(g) => g,
        Err(e) => return fail(e.to_string()),
    };
    let (done_tx, done_rx) = mpsc::channel::<()>();
    // The progress thread is a nicety: when the system refuses it, the run goes on without.
    let progress = std::thread::Builder::new()
        .name("weave-progress".into())
        .spawn(move || {
            // Quiet for runs under a second; a spinner with the elapsed time after that.
            if done_rx.recv_timeout(Duration::from_secs(1)).is_ok() {
                return;
            }
            if !std::io::IsTerminal::is_terminal(&std::io::stdout()) {
                let _ = done_rx.recv();
                return;
            }
            let bar = indicatif::ProgressBar::new_spinner();
            bar.set_message("running");
            bar.enable_steady_tick(Duration::from_millis(120));
            let _ = done_rx.recv();
            bar.finish_and_clear();
        });
    let execute = tracing::info_span!("execute", ranks, backend).entered();
    let result = exe.run_dense(&globals, &options);
    drop(execute);
    let _ = done_tx.send(());
    if let Ok(progress) = progress {
        let _ = progress.join();
    }
    let mut report = match result {
        Ok(r) if r.outputs.is_none() => {
            crate::outln!("rank done; rank 0 reports");
            return ExitCode::SUCCESS;
        }
        Ok(r) => r,
        Err(e) => return fail(e.to_string()),
    };
    report.config.get_or_insert(config_line);
    crate::outln!(
        "timings: compile {}, reference {}, run {}",
        ms(exe.compile_time()),
        ms(report.reference_time),
        ms(report.run_time)
    );
    print_report(&report, options.check_races);
    if flags.no_check {
        crate::outln!("reference check: skipped (--no-check)");
    }
    if let Some(path) = trace {
        let ranks = report.rank_spans();
        // The timeline goes beside a trace that is a file; a trace written into a device or
        // a FIFO (`/dev/stdout`) has no "beside".
        let svg_path = trace_is_a_file(path).then(|| path.with_extension("svg"));
        // A signal before the timeline is written takes the trace with it: never a trace
        // without its timeline (and each is written whole or not at all).
        if svg_path.is_some() {
            crate::output::remove_on_signal(path);
        }
        let written =
            crate::output::write_output(path, chrome_trace(&ranks).as_bytes()).and_then(|()| {
                match &svg_path {
                    Some(p) => crate::output::write_output(p, svg(&ranks).as_bytes()),
                    None => Ok(()),
                }
            });
        crate::output::keep_on_signal(path);
        match (written, svg_path) {
            (Ok(()), Some(svg_path)) => crate::outln!(
                "trace: {} (open in https://ui.perfetto.dev), timeline: {}",
                path.display(),
                svg_path.display()
            ),
            (Ok(()), None) => crate::outln!(
                "trace: {} (open in https://ui.perfetto.dev); no SVG timeline beside a trace that is not a file",
                path.display()
            ),
            (Err(e), _) => return fail(e),
        }
    }
    let failed = failures(&report);
    if let Some(p) = summary_path {
        let json = summary_json(file, ranks, mode, backend, Some(&report), failed.as_deref());
        if let Err(e) = crate::output::write_output(p, json.as_bytes()) {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    }
    match failed {
        None => {
            crate::outln!("result: PASS");
            ExitCode::SUCCESS
        }
        Some(why) => {
            crate::outln!("result: FAIL ({why})");
            ExitCode::FAILURE
        }
    }
}

/// The entry `weave tune` cached for the fusion `text` (named `name`, with the overrides
/// `set`) on `ranks` ranks of this backend, with the cache's path; `None` when there is no
/// cache path, no entry, the fusion does not load (compiling reports why), `set` gives the
/// chunk count, or the GPU cannot be opened (the run reports why). A cache that cannot be read
/// is an error.
fn tuned_entry(
    name: &str,
    text: &str,
    set: &[(String, i64)],
    ranks: usize,
    cuda: bool,
    device: usize,
) -> Result<Option<(streamweave::tune::Entry, PathBuf)>, String> {
    use streamweave::tune;
    let Some(path) = tune_cache_path() else {
        return Ok(None);
    };
    let Ok(fusion) = streamweave::load(name, text, set) else {
        return Ok(None);
    };
    let chunk = fusion.role_param(streamweave::ir::ParamRole::ChunkCount);
    if chunk.is_some_and(|p| set.iter().any(|(k, _)| *k == p.name)) {
        return Ok(None);
    }
    let gpu = if cuda {
        match tune::gpu_name(device) {
            Ok(g) => g,
            Err(_) => return Ok(None),
        }
    } else {
        "cpu".to_string()
    };
    let backend = if cuda { "cuda" } else { "cpu" };
    let key = tune::TuneKey::of(&fusion, ranks, backend, &gpu);
    Ok(tune::lookup(&path, &key)?.map(|e| (e, path)))
}

/// Tunes the fusion `text` on `ranks` GPUs of this process for a first repeated run: the
/// candidates of [`streamweave::tune::TuneOptions::first_run`] measured on one world of GPUs
/// (one NCCL communicator for all) for at most `budget`, the winner stored in the tuning
/// cache. Says on stderr what it does and what it found. `None`: nothing to tune (no cache
/// path, a chunk count set, a fusion that does not load — the run reports that).
fn tune_first_run(
    name: &str,
    text: &str,
    set: &[(String, i64)],
    ranks: usize,
    budget: Duration,
    timeout: Duration,
) -> Result<Option<(streamweave::tune::Entry, PathBuf)>, String> {
    use streamweave::tune;
    let Some(cache) = tune_cache_path() else {
        return Ok(None);
    };
    let Ok(fusion) = streamweave::load(name, text, set) else {
        return Ok(None);
    };
    if let Some(p) = fusion.role_param(streamweave::ir::ParamRole::ChunkCount) {
        if set.iter().any(|(k, _)| *k == p.name) {
            return Ok(None);
        }
    }
    // A cache that cannot be read is the run's error, not the tuning's.
    tune::TuneCache::load(&cache)?;
    let machine = tune::gpu_name(0)?;
    let options = tune::TuneOptions::first_run(ranks, &machine, None, budget);
    eprintln!(
        "tuning: no cached configuration of {} on {ranks} x {machine}: measuring candidates for at most {} s (--no-tune skips this; `weave tune` prints the whole table)",
        fusion.name,
        budget.as_secs()
    );
    let started = std::time::Instant::now();
    let mut measure = world_measure(ranks, 3, 10, timeout)?;
    let tuning = tune::tune(&fusion, &options, measure.as_mut()).map_err(|e| e.to_string())?;
    drop(measure);
    let measured = tuning
        .rows
        .iter()
        .filter(|r| r.outcome.time().is_some())
        .count();
    let one = tuning
        .rows
        .iter()
        .find(|r| r.candidate == tune::Candidate::new(Some(1), 1, true))
        .and_then(|r| r.outcome.time());
    eprint!("{tuning}");
    // A signal during the cache's write removes its temporary file.
    crate::output::clean_up_on_signals();
    let Some(entry) = tune::store(&cache, &tuning)? else {
        eprintln!("tuning: no candidate could be measured; running the untuned default");
        return Ok(None);
    };
    eprintln!(
        "tuning: {measured} candidate(s) measured in {:.1} s: {} at {:.3} ms{}, cached in {}",
        started.elapsed().as_secs_f64(),
        entry.candidate(),
        entry.median_ms,
        one.map(|t| format!(" (S=1: {:.3} ms)", t.as_secs_f64() * 1e3))
            .unwrap_or_default(),
        cache.display()
    );
    Ok(Some((entry, cache)))
}

/// What a CUDA path answers in a `weave` built without the `cuda` feature.
pub const NO_CUDA_FEATURE: &str = "this `weave` was built without the `cuda` feature (CPU only): rebuild it with the default features (`cargo build -p weave-cli`) for the CUDA backend";

/// One world of `ranks` GPUs that measures tuning candidates (one NCCL communicator for all);
/// [`NO_CUDA_FEATURE`] in a build without the `cuda` feature.
fn world_measure(
    ranks: usize,
    warmup: usize,
    iters: usize,
    timeout: Duration,
) -> Result<Box<dyn streamweave::tune::Measure>, String> {
    #[cfg(feature = "cuda")]
    {
        streamweave::measure::WorldMeasure::open(ranks, warmup, iters, timeout)
            .map(|m| Box::new(m) as Box<dyn streamweave::tune::Measure>)
            .map_err(|e| e.to_string())
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (ranks, warmup, iters, timeout);
        Err(NO_CUDA_FEATURE.to_string())
    }
}

/// Where `weave tune` caches its winners: `$WEAVE_TUNE_CACHE`, else
/// `streamweave/tune.toml` in the platform's cache directory ([`cache_file`]; `None` when
/// there is none).
pub fn tune_cache_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("WEAVE_TUNE_CACHE") {
        return Some(PathBuf::from(p));
    }
    cache_file("tune.toml")
}

/// The flags of `weave tune`.
#[derive(Clone, Debug)]
pub struct TuneFlags {
    /// `--ranks`.
    pub ranks: usize,
    /// `--backend cuda`.
    pub cuda: bool,
    /// Timed runs per candidate.
    pub iters: usize,
    /// Untimed runs per candidate first.
    pub warmup: usize,
    /// `--cache`: the cache file, else [`tune_cache_path`].
    pub cache: Option<PathBuf>,
    /// How long waits and each candidate's runs may take.
    pub timeout: Duration,
}

/// `weave tune`: measures the candidate configurations of the fusion in `file` (with the
/// overrides `set`) on `flags.ranks` ranks, prints every candidate's median or why it was
/// skipped, the winner marked, and stores the winner in the tuning cache.
pub fn tune(file: &Path, set: &[(String, i64)], flags: &TuneFlags) -> ExitCode {
    use streamweave::tune;
    let _tune = tracing::info_span!("weave_tune", file = %file.display()).entered();
    let fail = |message: String| -> ExitCode {
        eprintln!("error: {message}");
        ExitCode::FAILURE
    };
    let target = if flags.cuda {
        Target::Cuda { ranks: flags.ranks }
    } else {
        Target::Cpu { ranks: flags.ranks }
    };
    if let Err(e) = target.check() {
        return fail(e.to_string());
    }
    if flags.iters == 0 {
        return fail("--iters 0: at least one timed run per candidate is needed".into());
    }
    let Some(cache) = flags.cache.clone().or_else(tune_cache_path) else {
        return fail(
            "no tuning cache: pass --cache FILE (WEAVE_TUNE_CACHE is not set and there is no cache directory)".into(),
        );
    };
    // A cache that cannot be read fails before anything is measured.
    if let Err(e) = tune::TuneCache::load(&cache) {
        return fail(e);
    }
    let text = match streamweave::read_source(file) {
        Ok(bytes) => match streamweave::utf8_source(bytes) {
            Ok(t) => t,
            Err(d) => return fail(format!("{}:{d}", file.display())),
        },
        Err(e) => return fail(e),
    };
    if is_host_program(file, &text) {
        return fail(format!(
            "{}: a host program's chunk count is fixed; tune the .weave fusion",
            file.display()
        ));
    }
    let name = file.display().to_string();
    let fusion = match streamweave::load(&name, &text, set) {
        Ok(f) => f,
        Err(e) => return fail(e.to_string()),
    };
    if let Some(p) = fusion.role_param(streamweave::ir::ParamRole::ChunkCount) {
        if set.iter().any(|(k, _)| *k == p.name) {
            return fail(format!(
                "--set {}: the chunk count is what `weave tune` chooses; leave it out",
                p.name
            ));
        }
    }
    let machine = if flags.cuda {
        match tune::gpu_name(0) {
            Ok(g) => g,
            Err(e) => return fail(format!("cannot open GPU 0: {e}")),
        }
    } else {
        "cpu".to_string()
    };
    // The cost model's calibration describes GPUs: it prunes GPU tunings only.
    let calibration = if flags.cuda {
        match gpu_calibration(&machine, flags.ranks) {
            Ok(c) => Some(c),
            Err(e) => return fail(e),
        }
    } else {
        None
    };
    let options = tune::TuneOptions::new(flags.ranks, flags.cuda, &machine, calibration);
    crate::outln!(
        "{}: tuning on {} rank(s) of the {} backend{}, {} warm-up and {} timed run(s) per candidate",
        file.display(),
        flags.ranks,
        options.backend(),
        if flags.cuda {
            format!(" ({machine})")
        } else {
            String::new()
        },
        flags.warmup,
        flags.iters
    );
    // On GPUs every candidate runs on one world of GPUs and one NCCL communicator.
    let mut measure: Box<dyn tune::Measure> = if flags.cuda {
        match world_measure(flags.ranks, flags.warmup, flags.iters, flags.timeout) {
            Ok(m) => m,
            Err(e) => return fail(format!("cannot open {} GPU(s): {e}", flags.ranks)),
        }
    } else {
        Box::new(tune::RunMeasure::new(
            target,
            flags.warmup,
            flags.iters,
            flags.timeout,
        ))
    };
    let tuning = match tune::tune(&fusion, &options, measure.as_mut()) {
        Ok(t) => t,
        Err(e) => return fail(e.to_string()),
    };
    crate::outln!(
        "  {:40} median of the timed runs (slowest rank), or why not measured",
        "candidate"
    );
    crate::out!("{tuning}");
    // A signal during the cache's write removes its temporary file.
    crate::output::clean_up_on_signals();
    let entry = match tune::store(&cache, &tuning) {
        Ok(Some(e)) => e,
        Ok(None) => return fail("no candidate could be measured: nothing was cached".into()),
        Err(e) => return fail(e),
    };
    crate::outln!(
        "tuned: {} at {:.3} ms, cached in {}",
        entry.candidate(),
        entry.median_ms,
        cache.display()
    );
    ExitCode::SUCCESS
}

/// `streamweave/NAME` in the platform's cache directory (`dirs::cache_dir`: on Linux
/// `$XDG_CACHE_HOME`, else `~/.cache`; on macOS `~/Library/Caches`), `None` when it has none.
pub fn cache_file(name: &str) -> Option<PathBuf> {
    dirs::cache_dir().map(|d| d.join("streamweave").join(name))
}

/// The cost model's calibration of `ranks` GPUs named `gpu`: the file at
/// [`calibration_path`] (else the built-in figures), its contention replaced by the one the
/// tunings in the tuning cache measured on this machine, when they did
/// ([`streamweave::tune::measured_contention`]).
pub fn gpu_calibration(
    gpu: &str,
    ranks: usize,
) -> Result<streamweave::chunks::Calibration, String> {
    let mut cal = streamweave::chunks::Calibration::load(calibration_path().as_deref())?;
    if let Some(c) =
        tune_cache_path().and_then(|p| streamweave::tune::measured_contention(&p, gpu, ranks))
    {
        cal.contention = c;
        cal.source = format!("{}, contention {c:.2} measured by tuning", cal.source);
    }
    Ok(cal)
}

/// Where the machine's calibration is cached: `$WEAVE_CALIBRATION`, else
/// `streamweave/calibration.txt` in the platform's cache directory ([`cache_file`]; `None`
/// when there is none).
pub fn calibration_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("WEAVE_CALIBRATION") {
        return Some(PathBuf::from(p));
    }
    cache_file("calibration.txt")
}

/// `weave calibrate`: measures this machine on `ranks` GPUs and writes the calibration to
/// `out` (default [`calibration_path`]).
pub fn calibrate(ranks: usize, out: Option<PathBuf>, timeout: Duration) -> ExitCode {
    let Some(path) = out.or_else(calibration_path) else {
        eprintln!("error: no calibration file: pass --out FILE (WEAVE_CALIBRATION is not set and there is no cache directory)");
        return ExitCode::FAILURE;
    };
    if ranks < 2 {
        eprintln!("error: --ranks {ranks}: the collectives need 2 or more GPUs");
        return ExitCode::FAILURE;
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (timeout, path);
        eprintln!("error: weave calibrate: {NO_CUDA_FEATURE}");
        ExitCode::FAILURE
    }
    #[cfg(feature = "cuda")]
    {
        let world =
            match streamweave::calibrate::World::open(streamweave::calibrate::WorldOptions {
                ranks,
                timeout,
                nccl: weave_comm::NcclOptions::default(),
            }) {
                Ok(w) => w,
                Err(e) => {
                    eprintln!("error: cannot open {ranks} GPU(s): {e}");
                    return ExitCode::FAILURE;
                }
            };
        let cal = match streamweave::calibrate::calibrate(&world) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("error: calibration failed: {e}");
                return ExitCode::FAILURE;
            }
        };
        write_calibration(&path, &cal)
    }
}

/// Writes the calibration `cal` to `path` and prints it.
#[cfg(feature = "cuda")]
fn write_calibration(path: &Path, cal: &streamweave::chunks::Calibration) -> ExitCode {
    if let Some(dir) = path.parent() {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("error: cannot create {}: {e}", dir.display());
            return ExitCode::FAILURE;
        }
    }
    if let Err(e) = crate::output::write_output(path, cal.render().as_bytes()) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    crate::out!("{}", cal.render());
    crate::outln!("calibration written to {}", path.display());
    ExitCode::SUCCESS
}
