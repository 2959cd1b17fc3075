//! The `weave run` command: compile, run on in-process ranks with a progress bar, compare
//! with the reference, print a summary, and write the timeline.

use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::Duration;

use weave_executor::timeline::{chrome_trace, svg, RankSpans};
use weave_host_ir::{HostProgram, Stmt};

use crate::run::{compile_for_run, generate_inputs, run_compiled, RunOptions, RunReport};

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

/// Prints the report of a finished run.
pub fn print_report(report: &RunReport, checked_races: bool) {
    for (rank, r) in report.ranks.iter().enumerate() {
        println!(
            "  rank {rank}: {} statements issued in {}, done in {}",
            r.statements,
            ms(r.issue_time),
            ms(r.wall_time)
        );
    }
    let mut outputs: Vec<&str> = report.checks.iter().map(|c| c.output.as_str()).collect();
    outputs.dedup();
    for o in outputs {
        let checks: Vec<_> = report.checks.iter().filter(|c| c.output == o).collect();
        let worst = checks
            .iter()
            .max_by(|a, b| a.comparison.max_abs.total_cmp(&b.comparison.max_abs));
        let ok = checks.iter().all(|c| c.comparison.ok);
        if let Some(w) = worst {
            println!(
                "output {o}: {} on {} rank(s) (worst: rank {}: {})",
                if ok {
                    "matches the reference"
                } else {
                    "DIFFERS from the reference"
                },
                checks.len(),
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
            println!("race checker: no races");
        } else {
            println!("race checker: {} race(s)", races.len());
            for r in races {
                println!("{r}");
            }
        }
    }
    println!("max abs error: {:.3e}", report.max_abs_error());
}

/// Runs `weave run`.
pub fn run(
    file: &Path,
    set: &[(String, i64)],
    options: &RunOptions,
    trace: Option<&Path>,
) -> ExitCode {
    let fusion = match crate::load_file(file, set) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let compiled = match compile_for_run(fusion) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "{}: {} rank(s) on the cpu backend, numberOfStreams = {}",
        file.display(),
        options.ranks,
        options.streams
    );
    println!("host program: {}", summarize(&compiled.program));
    let globals = match generate_inputs(&compiled.fusion, options.seed) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let progress = std::thread::spawn(move || {
        // Quiet for runs under a second; a spinner with the elapsed time after that.
        if done_rx.recv_timeout(Duration::from_secs(1)).is_ok() {
            return;
        }
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_message("running");
        bar.enable_steady_tick(Duration::from_millis(120));
        let _ = done_rx.recv();
        bar.finish_and_clear();
    });
    let result = run_compiled(&compiled, &globals, options);
    let _ = done_tx.send(());
    let _ = progress.join();
    let report = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "timings: compile {}, reference {}, run {}",
        ms(compiled.compile_time),
        ms(report.reference_time),
        ms(report.run_time)
    );
    print_report(&report, options.check_races);
    if let Some(path) = trace {
        let ranks: Vec<RankSpans> = report
            .ranks
            .iter()
            .enumerate()
            .map(|(rank, r)| RankSpans {
                rank,
                spans: r.spans.clone(),
            })
            .collect();
        let svg_path = path.with_extension("svg");
        let written = std::fs::write(path, chrome_trace(&ranks))
            .and_then(|()| std::fs::write(&svg_path, svg(&ranks)));
        match written {
            Ok(()) => println!(
                "trace: {} (open in https://ui.perfetto.dev), timeline: {}",
                path.display(),
                svg_path.display()
            ),
            Err(e) => {
                eprintln!("error: cannot write the trace {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
        }
    }
    if report.passed() {
        println!("result: PASS");
        ExitCode::SUCCESS
    } else {
        println!("result: FAIL");
        ExitCode::FAILURE
    }
}
