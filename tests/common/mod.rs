//! Helpers shared by the root package's integration tests: where the scenario fixtures are,
//! and a checked run of a fusion against the reference.

use std::path::{Path, PathBuf};

/// The fixture `tests/scenarios/{name}.weave`.
#[allow(dead_code)]
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/scenarios/{name}.weave"))
}

/// Every `.weave` fixture directly in tests/scenarios, sorted by path.
#[allow(dead_code)]
pub fn fixtures() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/scenarios exists")
        .map(|e| e.expect("readable dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "weave"))
        .collect();
    v.sort();
    v
}

/// A failed checked run: the stage that failed (`compile`, `inputs`, `run`, `check`) and what
/// it said (for `check`: every output that differs and every race, one per line).
#[allow(dead_code)]
pub struct Failure {
    pub stage: &'static str,
    pub detail: String,
}

/// Compiles `fusion`, generates its inputs from `seed`, runs it on `ranks` in-process ranks
/// with `streams` streams and the race checker, and checks every output against the f64
/// reference: the way `weave run` does. Fails unless at least one output was checked and
/// every check passed without a race.
#[allow(dead_code)]
pub fn run_checked(
    fusion: streamweave::ir::Fusion,
    ranks: usize,
    streams: usize,
    seed: u64,
) -> Result<streamweave::run::Compiled, Failure> {
    use std::fmt::Write as _;
    use streamweave::run::{compile_for_run, generate_inputs, run_compiled, RunOptions};
    let fail = |stage: &'static str, detail: String| Failure { stage, detail };
    let compiled = compile_for_run(fusion).map_err(|e| fail("compile", e.to_string()))?;
    let globals =
        generate_inputs(&compiled.fusion, seed).map_err(|e| fail("inputs", e.to_string()))?;
    let options = RunOptions {
        ranks,
        streams,
        check_races: true,
        seed,
        timeout: std::time::Duration::from_secs(20),
        ..RunOptions::default()
    };
    let report =
        run_compiled(&compiled, &globals, &options).map_err(|e| fail("run", e.to_string()))?;
    if report.checks.is_empty() {
        return Err(fail("check", "no output was checked".into()));
    }
    if !report.passed() {
        let mut detail = String::new();
        for c in &report.checks {
            let _ = writeln!(
                detail,
                "output {} rank {}: {}",
                c.output, c.rank, c.comparison
            );
        }
        for (rank, r) in report.ranks.iter().enumerate() {
            for race in &r.races {
                let _ = writeln!(detail, "rank {rank} race: {race}");
            }
        }
        return Err(fail("check", detail));
    }
    Ok(compiled)
}
