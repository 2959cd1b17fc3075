//! The `weave run` command: compile (or parse a host program), take the tuned or modelled
//! configuration, run on in-process ranks or GPUs (threads, or one process per rank under a
//! launcher) with a progress bar, compare with the reference, print the report, and write
//! the timeline and the JSON summary.

use std::path::Path;
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::Duration;

use weave_executor::timeline::trace_and_picture;
use weave_passes::DumpOptions;

use streamweave::{Chunks, Compiler, Executable, RunOptions, Target};

use super::report::{describe_config, ms, summary_json};
use super::tune_command::{tunable, tune_first_run, tuned_entry, TuneStop};
use super::{
    failures, gpu_calibration, is_host_program, print_report, read_source_text, summarize, RunFlags,
};

/// Whether `--trace PATH` names a regular file (or a link to one) or nothing yet: where its
/// SVG timeline can be written beside it.
fn trace_is_a_file(path: &Path) -> bool {
    match std::fs::metadata(path) {
        Ok(m) => m.is_file(),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
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
                    return fail(e.to_string());
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
    let text = match read_source_text(file) {
        Ok(text) => text,
        Err(e) => return fail(e),
    };
    let name = file.display().to_string();
    // The rank count the run binds as the mesh size: the launched world's, else `--ranks`.
    let run_ranks = launched
        .as_ref()
        .map(|e| e.world)
        .or(flags.ranks)
        .unwrap_or(2);
    // The configuration `weave tune` cached for this program, when `--chunks auto` and no
    // `--streams` leave the choice open.
    let open_choice =
        !is_host_program(file, &text) && flags.chunks.is_none() && !flags.streams_given;
    // The fusion and the tuning cache's path, when there is a tuning to look up or to make.
    let to_tune = if open_choice {
        tunable(&name, &text, set, run_ranks)
    } else {
        None
    };
    let mut tuned = match &to_tune {
        None => None,
        Some((fusion, cache)) => {
            let device = launched.as_ref().map_or(0, |e| e.local_rank);
            match tuned_entry(fusion, cache, run_ranks, flags.cuda, device) {
                Ok(t) => t.map(|e| (e, cache.clone())),
                Err(m) => return fail(m),
            }
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
        && options.gpu.replay
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
                if let Some((fusion, cache)) = &to_tune {
                    match tune_first_run(
                        fusion,
                        cache,
                        run_ranks,
                        budget,
                        options.timeouts.wait,
                        flags.tune_copy_engines,
                    ) {
                        Ok(Some(entry)) => {
                            tuned = Some((entry, cache.clone()));
                            source = "tuned now";
                        }
                        Ok(None) => {}
                        Err(TuneStop::Failed(m)) => {
                            eprintln!("tuning: failed, running the untuned default: {m}")
                        }
                        // A candidate whose ranks did not stop may hold the GPUs until this
                        // process ends: a run now would wait on them, so none starts. What
                        // was measured before it is cached for the next run.
                        Err(TuneStop::Held(candidate)) => {
                            return fail(format!(
                                "tuning: the ranks of candidate {candidate} did not stop (see the table above) and may still hold the GPUs, which only the end of this process frees: the run is not started; run again (the tuning cache keeps what was measured) or with --no-tune"
                            ));
                        }
                    }
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
        let ranks = run_ranks;
        let dumps = DumpOptions::parse(flags.weave_dump.as_deref().unwrap_or_default())
            .map_err(|e| e.to_string())?;
        let chunks = match flags.chunks {
            Some(c) => c.compiler_chunks(),
            None if tuned.is_some() => tuned
                .as_ref()
                .map_or(Chunks::AsWritten, |(e, _)| e.compiler_chunks()),
            None if flags.cuda => {
                let gpu = streamweave::tune::gpu_name(0).unwrap_or_default();
                Chunks::Auto(gpu_calibration(&gpu, ranks).map_err(|e| e.to_string())?)
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
    if let Err(e) = options.gpu.overlap.check(options.gpu.transport) {
        return fail(e.to_string());
    }
    if is_reporter {
        let transport = match options.gpu.transport {
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
        // The ranks on one clock; the picture from when every rank had begun.
        let (trace_json, picture) = trace_and_picture(report.rank_spans());
        // The timeline goes beside a trace that is a file; a trace written into a device or
        // a FIFO (`/dev/stdout`) has no "beside".
        let svg_path = trace_is_a_file(path).then(|| path.with_extension("svg"));
        // A signal before the timeline is written takes the trace with it: never a trace
        // without its timeline (and each is written whole or not at all).
        if svg_path.is_some() {
            crate::output::remove_on_signal(path);
        }
        let written =
            crate::output::write_output(path, trace_json.as_bytes()).and_then(
                |()| match &svg_path {
                    Some(p) => crate::output::write_output(p, picture.as_bytes()),
                    None => Ok(()),
                },
            );
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
            (Err(e), _) => return fail(e.to_string()),
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
