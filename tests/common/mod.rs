//! Helpers shared by the root package's integration tests: where the scenario fixtures are
//! (found at run time, so the GPU bundle's copy of the tests finds the bundle's),
//! and a checked run of a fusion against the reference.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The directory of the scenario fixtures, found when the test runs (never only where the
/// sources were at compile time): see [`resolve_scenarios`].
#[allow(dead_code)]
pub fn scenarios_dir() -> PathBuf {
    resolve_scenarios(
        std::env::var_os("WEAVE_SCENARIOS"),
        std::env::current_exe().ok().as_deref(),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios"),
    )
}

/// The scenarios directory, in this order: `env` (`$WEAVE_SCENARIOS`) when set and not
/// empty; else `scenarios/` beside the directory of the executable `exe` when it is a
/// directory (the GPU bundle: `bin/gpu-tests` next to `scenarios/`); else `source` (the
/// source tree's tests/scenarios, for `cargo test`).
#[allow(dead_code)]
pub fn resolve_scenarios(env: Option<OsString>, exe: Option<&Path>, source: PathBuf) -> PathBuf {
    if let Some(dir) = env.filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    exe.and_then(Path::parent)
        .and_then(Path::parent)
        .map(|dir| dir.join("scenarios"))
        .filter(|dir| dir.is_dir())
        .unwrap_or(source)
}

/// The fixture `{name}.weave` of the scenarios directory ([`scenarios_dir`]).
#[allow(dead_code)]
pub fn fixture(name: &str) -> PathBuf {
    scenarios_dir().join(format!("{name}.weave"))
}

/// Every `.weave` fixture directly in the scenarios directory ([`scenarios_dir`]), sorted by
/// path.
#[allow(dead_code)]
pub fn fixtures() -> Vec<PathBuf> {
    let dir = scenarios_dir();
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list the scenarios {}: {e}", dir.display()))
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

/// A fusion that ran and matched: its host program (as printed and parsed back), the fusion
/// as given (its form after the passes before segmentation, where propagation's choices
/// show, is [`Checked::sharded`]), and the executable.
#[allow(dead_code)]
pub struct Checked {
    pub program: streamweave::host_ir::HostProgram,
    pub fusion: streamweave::ir::Fusion,
    pub exe: streamweave::Executable,
    /// Every output's comparison with the reference, per rank.
    pub checks: Vec<streamweave::run::OutputCheck>,
}

#[allow(dead_code)]
impl Checked {
    /// The fusion after the passes before segmentation.
    pub fn sharded(&self) -> streamweave::ir::Fusion {
        sharded(self.fusion.clone())
    }
}

/// The fusion after the standard pipeline's passes before `segment`.
#[allow(dead_code)]
pub fn sharded(fusion: streamweave::ir::Fusion) -> streamweave::ir::Fusion {
    use streamweave::passes::{Ir, PassManager, Pipeline, Registry};
    let passes = Pipeline::standard().passes().to_vec();
    let cut = passes
        .iter()
        .position(|p| p.name() == "segment")
        .unwrap_or(passes.len());
    let before = PassManager::new(
        Registry::standard(),
        passes[..cut].iter().cloned().collect(),
    );
    match before
        .run(Ir::Fusion(fusion))
        .expect("the passes before segment run")
    {
        Ir::Fusion(f) => f,
        other => panic!("the passes before segment gave a {}", other.form()),
    }
}

/// Compiles `fusion`, prints its host program and runs the text parsed back (so every run
/// is also a run of a printed `.hir`), on inputs generated from `seed`, on `ranks` in-process
/// ranks with `streams` streams and the race checker, and checks every output against the f64
/// reference of the program's definition: the way `weave run` does. Fails unless at least
/// one output was checked and every check passed without a race.
#[allow(dead_code)]
pub fn run_checked(
    fusion: streamweave::ir::Fusion,
    ranks: usize,
    streams: usize,
    seed: u64,
) -> Result<Checked, Failure> {
    run_checked_with(fusion, ranks, streams, seed, &|_, _| {})
}

/// [`run_checked`] with the generated inputs edited first: `edit` gets each input's name and
/// its global tensor (constants the fusion takes as inputs, a causal mask).
#[allow(dead_code)]
pub fn run_checked_with(
    fusion: streamweave::ir::Fusion,
    ranks: usize,
    streams: usize,
    seed: u64,
    edit: &dyn Fn(&str, &mut weave_executor::Dense),
) -> Result<Checked, Failure> {
    use std::fmt::Write as _;
    use streamweave::{Compiler, Executable, RunOptions, Target};
    let fail = |stage: &'static str, detail: String| Failure { stage, detail };
    let compiled = Compiler::new()
        .compile(&fusion)
        .map_err(|e| fail("compile", e.to_string()))?;
    let text = streamweave::host_ir::print(compiled.program());
    let exe = Executable::from_text("program.hir", &text)
        .map_err(|e| fail("parse", format!("{e}\n{text}")))?;
    if streamweave::host_ir::print(exe.program()) != text {
        return Err(fail(
            "parse",
            "the printed program reads back differently".into(),
        ));
    }
    let mut globals = exe.random_inputs(seed).unwrap();
    for (sig, g) in exe.inputs().iter().zip(globals.iter_mut()) {
        edit(&sig.name, g);
    }
    let options = RunOptions {
        target: Target::Cpu { ranks },
        streams,
        check: true,
        check_races: true,
        timeouts: streamweave::Timeouts::all(std::time::Duration::from_secs(20)),
        ..RunOptions::default()
    };
    let report = exe
        .run_dense(&globals, &options)
        .map_err(|e| fail("run", e.to_string()))?;
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
    Ok(Checked {
        program: exe.program().clone(),
        fusion,
        exe,
        checks: report.checks,
    })
}

/// The fusion's parameter names, from its header line.
#[allow(dead_code)]
pub fn params(source: &str) -> Vec<String> {
    let header = source
        .lines()
        .find(|l| l.starts_with("fusion"))
        .unwrap_or("");
    let inner = header
        .split_once('(')
        .and_then(|(_, r)| r.split_once(')'))
        .map_or("", |(p, _)| p);
    inner
        .split(',')
        .filter_map(|p| p.split('=').next())
        .map(|p| p.split(':').next().unwrap_or(p).trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

/// The rank count of a fusion without a mesh-size parameter: as many devices as its meshes
/// name (they are written with fixed devices), or 1.
#[allow(dead_code)]
pub fn fixed_ranks(source: &str) -> usize {
    let fusion = streamweave::load("fixture", source, &[]).expect("the defaults load");
    let mut devices: Vec<i64> = fusion
        .meshes()
        .iter()
        .flat_map(|&m| fusion.mesh(m).mesh.devices().to_vec())
        .collect();
    devices.sort_unstable();
    devices.dedup();
    devices.len().max(1)
}

/// A small deterministic generator (SplitMix64) for the seeded fuzz batches: the same seed
/// gives the same inputs on every machine.
#[allow(dead_code)]
pub struct Rng(pub u64);

#[allow(dead_code)]
impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// The rank counts a run of a fixture takes, and its parameter overrides.
#[allow(dead_code)]
pub type Case = (&'static [usize], &'static [(&'static str, i64)]);

/// The value of parameter `name` in `extra`, else `default`.
#[allow(dead_code)]
pub fn param(extra: &[(&str, i64)], name: &str, default: i64) -> i64 {
    extra
        .iter()
        .find(|(k, _)| *k == name)
        .map_or(default, |(_, v)| *v)
}

/// Loads `source` with `overrides` and runs it on `ranks` ranks with 2 streams, seed 11 and
/// the generated inputs edited by `edit` (see [`run_checked_with`]); an error holds the
/// stage, the program and the report.
#[allow(dead_code)]
pub fn run_with(
    source: &str,
    overrides: &[(&str, i64)],
    ranks: usize,
    edit: &dyn Fn(&str, &mut weave_executor::Dense),
) -> Result<Checked, String> {
    let ov: Vec<(String, i64)> = overrides.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    let what = |stage: &str, detail: String| {
        format!("{stage} failed ({ranks} ranks, {overrides:?}):\n{source}\n--- {detail}")
    };
    let fusion =
        streamweave::load("case.weave", source, &ov).map_err(|e| what("load", e.to_string()))?;
    run_checked_with(fusion, ranks, 2, 11, edit).map_err(|f| what(f.stage, f.detail))
}

/// [`run_with`] on every rank count in `ranks`, setting `d` to it when `source` has that
/// parameter, with the generated inputs edited by `edit`; panics with every failure.
#[allow(dead_code)]
pub fn runs_on_with(
    source: &str,
    ranks: &[usize],
    extra: &[(&str, i64)],
    edit: &dyn Fn(&str, &mut weave_executor::Dense),
) -> Vec<Checked> {
    let mut ok = Vec::new();
    let mut failures = Vec::new();
    for &r in ranks {
        let mut ov = extra.to_vec();
        if source.contains("d = ") {
            ov.push(("d", r as i64));
        }
        match run_with(source, &ov, r, edit) {
            Ok(c) => ok.push(c),
            Err(e) => failures.push(e),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    ok
}

/// The inputs the attention fixtures take as constants and the causal mask, set as a runner
/// would: `n` = the row length `hidden`, `eps` = 1e-6, `scale` = 1 / sqrt(`hd`), `neg` =
/// -1e4 (the masked score), `mask[q][k]` = k <= q. (Random constants keep the values finite
/// too, the fixtures' RMSNorm taking the rsqrt of |ms + eps|, but check less of a real layer.)
#[allow(dead_code)]
pub fn attention_inputs(hidden: usize, hd: usize) -> impl Fn(&str, &mut weave_executor::Dense) {
    move |name, x| match name {
        "n" => x.data = vec![hidden as f64],
        "eps" => x.data = vec![1e-6],
        "scale" => x.data = vec![1.0 / (hd as f64).sqrt()],
        "neg" => x.data = vec![-1e4],
        "mask" => {
            let t = x.sizes[1];
            for (i, v) in x.data.iter_mut().enumerate() {
                *v = if i % t <= i / t { 1.0 } else { 0.0 };
            }
        }
        _ => {}
    }
}

/// The kinds of the communications of `p` in program order (`Allreduce`, `Allgather`, ..).
#[allow(dead_code)]
pub fn communication_kinds(p: &streamweave::host_ir::HostProgram) -> Vec<String> {
    p.walk()
        .filter_map(|w| match &p.stmts[w.stmt] {
            streamweave::host_ir::Stmt::Communication(comm) => Some(format!("{:?}", comm.kind)),
            _ => None,
        })
        .collect()
}

/// A fresh, empty directory `weave-{what}-{pid}-{name}` in the temporary directory, for one
/// test's files.
#[allow(dead_code)]
pub fn scratch(what: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weave-{what}-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Asserts that `out`, what `weave run` printed, ran the configuration `winner` that the tune
/// cache `cache` holds, with its `streams` streams, and passed.
#[allow(dead_code)]
pub fn assert_ran_tuned(out: &str, winner: &dyn std::fmt::Display, cache: &Path, streams: usize) {
    assert!(
        out.contains(&format!(
            "chunks: tuned {winner} (cache {})",
            cache.display()
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!("numberOfStreams = {streams}")),
        "{out}"
    );
    assert!(out.trim_end().ends_with("result: PASS"), "{out}");
}

/// Runs `each` on every fixture ([`fixtures`]) with its name, inside insta settings that keep
/// the snapshots in `snapshots` (relative to the test file) without the module prefix.
#[allow(dead_code)]
pub fn snapshot_each_fixture(snapshots: &str, mut each: impl FnMut(&str, &Path)) {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(snapshots);
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| {
        for path in fixtures() {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            each(&name, &path);
        }
    });
}

/// Every output check of `report` that failed, as `output rank N: comparison`.
#[allow(dead_code)]
pub fn failed_checks(report: &streamweave::run::RunReport) -> Vec<String> {
    report
        .checks
        .iter()
        .filter(|c| !c.comparison.ok)
        .map(|c| format!("{} rank {}: {}", c.output, c.rank, c.comparison))
        .collect()
}

/// `fusion linear_relu({params})`: the ReLU of a linear of `x: {dt}[t, h]` by `w: {dt}[f, h]`,
/// in `s` stream chunks of the result.
#[allow(dead_code)]
pub fn linear_relu(params: &str, dt: &str) -> String {
    format!(
        "fusion linear_relu({params}) {{
  tensor x: {dt}[t, h]
  tensor w: {dt}[f, h]
  y = linear(x, w)
  z = relu(y)
  output z
  schedule z {{ outer_split(0, s) -> Stream }}
}}
"
    )
}
