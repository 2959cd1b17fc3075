//! What `weave run` prints and writes about a run: the one-paragraph summary of its host
//! program, the configuration line, the report of a finished run (ranks, timed runs, checks,
//! races), why it failed, and the one-line JSON summary.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use weave_host_ir::{HostProgram, Stmt};

use streamweave::{Executable, RunOptions, RunReport};

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

pub(super) fn ms(d: Duration) -> String {
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

/// The configuration a run uses, as `weave run` prints it: `S=2 K=2 replay, ordered compute`.
pub(super) fn describe_config(exe: &Executable, options: &RunOptions, cuda: bool) -> String {
    let sig = exe.signature();
    let ring = exe.ring_form().map(|form| {
        let pieces = match exe.ring_pieces() {
            Some((_, k)) => format!("{k} pieces a step"),
            None => "each step whole".to_string(),
        };
        format!("ring form, {pieces} ({form})")
    });
    let s = ring.unwrap_or_else(|| {
        sig.role(streamweave::ir::ParamRole::ChunkCount)
            .and_then(|p| sig.param(p))
            .map(|v| format!("S={v}"))
            // Without a chunk-count parameter: its stream loops as written, or one chunk (no
            // stream loop: none written, or its Stream axes run serially by `--chunks 1`).
            .unwrap_or_else(|| match streamweave::tune::loop_chunks(exe.program()) {
                _ if exe.ring_pieces().is_some() => {
                    let (s, k) = exe.ring_pieces().unwrap_or_default();
                    format!("S={s} (ring steps in {k} pieces)")
                }
                Some(_) => "S=as written".to_string(),
                None => "S=1".to_string(),
            })
    });
    let mut out = format!("{s} K={}", options.streams);
    if cuda {
        out.push_str(if options.gpu.replay && options.iters > 0 {
            " replay"
        } else {
            " eager"
        });
        out.push_str(match options.gpu.transport {
            streamweave::Transport::Nccl => ", NCCL",
            streamweave::Transport::CopyEngine => ", copy-engine",
        });
        if options.gpu.overlap != streamweave::Overlap::default() {
            out.push_str(&format!(", {}", options.gpu.overlap.describe()));
        }
    }
    out
}

/// The JSON summary of a run (or of its failure).
pub(super) fn summary_json(
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
