//! Choosing a run's configuration by measuring it: for a fusion with its parameter values, a
//! backend and rank count and a machine, [`tune`] compiles every chunk count S of
//! [`TuneOptions::chunk_counts`] (where the fusion has a chunk-count parameter), runs each
//! with every stream-pool size K and, on GPUs, with CUDA-graph replay on and off, and keeps
//! the fastest; the winner goes into a [`TuneCache`] that `weave run` reads back.
//!
//! The measurement is a [`Measure`]: [`RunMeasure`] runs the program (warm-up runs, then
//! timed repetitions, each taken at its slowest rank, their median), and tests hand in a
//! closure with made-up figures, so the choice, the pruning, the ties, the refusals and the
//! cache are tested without a GPU. Not everything is measured:
//!
//! * the cost model of [`crate::chunks`] prunes the chunk counts it predicts at least
//!   [`TuneOptions::prune_factor`] times slower than its best (S = 1, the baseline a choice
//!   must beat, is always measured; a program without communication is never pruned: the
//!   model has nothing to say about it, it does not count kernels);
//! * a pool of more streams than chunks runs as a pool of as many streams as chunks, so
//!   K > S is skipped;
//! * a chunk count the compiler refuses is recorded with its message.
//!
//! Among the measured candidates, those within [`TIE_MARGIN`] of the fastest tie, and the
//! simplest of them wins: fewer chunks, then fewer streams, then graph replay (the default).
//!
//! The cache is a TOML file whose path the caller gives (`weave` reads `$WEAVE_TUNE_CACHE`,
//! else `~/.cache/streamweave/tune.toml`): one `[[entry]]` per [`TuneKey`], written whole
//! through a temporary file and a rename.

mod cache;

pub use cache::{lookup, store, Entry, TuneCache, TuneKey};

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use weave_executor::Dense;
use weave_ir::{Fusion, ParamRole};

use crate::chunks::{Calibration, CANDIDATES};
use crate::executable::{Chunks, Compiler, Error, Executable};
use crate::run::{NcclCtaPolicy, Overlap, RunOptions, Target, Timeouts, Transport};

/// Measured candidates within this fraction of the fastest tie; the simplest of them wins.
pub const TIE_MARGIN: f64 = 0.02;

/// The stream-pool sizes a tuning considers by default.
pub const STREAM_COUNTS: [usize; 3] = [1, 2, 4];

/// One configuration of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Candidate {
    /// The chunk count S, or `None` when the fusion has no chunk-count parameter (its Stream
    /// axes keep the extents it writes).
    pub chunks: Option<usize>,
    /// The stream-pool size K ([`RunOptions::streams`]).
    pub streams: usize,
    /// Whether repeated runs replay a captured CUDA graph ([`RunOptions::replay`]).
    pub replay: bool,
    /// How allgathers and transfers move ([`RunOptions::transport`]).
    pub transport: Transport,
    /// The backend's overlap knobs ([`RunOptions::overlap`]).
    pub overlap: Overlap,
}

impl Candidate {
    /// `chunks`, `streams` and `replay` with NCCL and the default overlap knobs.
    pub fn new(chunks: Option<usize>, streams: usize, replay: bool) -> Candidate {
        Candidate {
            chunks,
            streams,
            replay,
            transport: Transport::Nccl,
            overlap: Overlap::default(),
        }
    }

    /// How many knobs differ from the defaults (ties go to fewer).
    fn knobs(&self) -> usize {
        let o = &self.overlap;
        usize::from(self.transport != Transport::Nccl)
            + usize::from(o.ordered_compute)
            + usize::from(o.pool_priority_high)
            + usize::from(o.gemm_sm_margin > 0)
            + usize::from(o.nccl_max_ctas.is_some())
            + usize::from(o.nccl_cta_policy.is_some())
            + usize::from(o.nccl_window_mib > 0)
            + usize::from(o.ce_slot_mib > 0)
            + usize::from(o.gemm_into_windows)
    }
}

impl fmt::Display for Candidate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.chunks {
            Some(s) => write!(f, "S={s}")?,
            None => f.write_str("S=as written")?,
        }
        write!(
            f,
            " K={} {}",
            self.streams,
            if self.replay { "replay" } else { "eager" }
        )?;
        if self.transport == Transport::CopyEngine {
            f.write_str(", copy-engine")?;
        }
        if self.overlap != Overlap::default() {
            write!(f, ", {}", self.overlap.describe())?;
        }
        Ok(())
    }
}

/// What became of one candidate.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Measured: the median of the timed repetitions (each at its slowest rank).
    Measured(Duration),
    /// Not measured: the cost model predicts this chunk count too slow.
    Pruned {
        /// Its prediction over the model's best one.
        ratio: f64,
        /// The chunk count the model predicts fastest.
        best: usize,
    },
    /// Not measured: the same run as another candidate (why).
    Redundant(String),
    /// The compiler refused this chunk count (its message).
    Refused(String),
    /// The run failed (its message).
    Failed(String),
    /// Not measured: the tuning's time budget was spent.
    OverBudget,
}

impl Outcome {
    /// The measured time, if any.
    pub fn time(&self) -> Option<Duration> {
        match self {
            Outcome::Measured(d) => Some(*d),
            _ => None,
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Measured(d) => write!(f, "{:.3} ms", d.as_secs_f64() * 1e3),
            Outcome::Pruned { ratio, best } => write!(
                f,
                "skipped: the cost model predicts {ratio:.2}x its best (S={best})"
            ),
            Outcome::Redundant(why) => write!(f, "skipped: {why}"),
            Outcome::Refused(m) => write!(f, "refused: {}", first_line(m)),
            Outcome::Failed(m) => write!(f, "failed: {}", first_line(m)),
            Outcome::OverBudget => f.write_str("skipped: over the tuning budget"),
        }
    }
}

fn first_line(m: &str) -> &str {
    m.lines().next().unwrap_or("")
}

/// One candidate and what became of it.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// The configuration.
    pub candidate: Candidate,
    /// Its figure, or why it has none.
    pub outcome: Outcome,
}

/// What a tuning did: every candidate in the order considered, and the winner.
#[derive(Clone, Debug, PartialEq)]
pub struct Tuning {
    /// What the result is cached under.
    pub key: TuneKey,
    /// Every candidate with its figure or why it has none.
    pub rows: Vec<Row>,
    /// The index in `rows` of the winner; `None` when no candidate was measured.
    pub winner: Option<usize>,
    /// The cost model's contention factor fitted to this tuning's measurements
    /// ([`crate::chunks::fit_contention`] over the fastest run of each chunk count with NCCL
    /// and the default knobs), on GPUs with S = 1 and a chunked count measured; later
    /// calibrations of this machine take it ([`measured_contention`]).
    pub contention: Option<f64>,
}

impl Tuning {
    /// The winning candidate and its figure.
    pub fn best(&self) -> Option<(Candidate, Duration)> {
        let row = &self.rows[self.winner?];
        Some((row.candidate, row.outcome.time()?))
    }

    /// The cache entry of the winner.
    pub fn entry(&self) -> Option<Entry> {
        let (c, t) = self.best()?;
        Some(Entry {
            key: self.key.id.clone(),
            fusion: self.key.fusion.clone(),
            params: self.key.params.clone(),
            ranks: self.key.ranks,
            backend: self.key.backend.clone(),
            gpu: self.key.gpu.clone(),
            chunks: c.chunks,
            streams: c.streams,
            replay: c.replay,
            transport: c.transport,
            ordered_compute: c.overlap.ordered_compute,
            pool_priority_high: c.overlap.pool_priority_high,
            gemm_sm_margin: c.overlap.gemm_sm_margin,
            nccl_max_ctas: c.overlap.nccl_max_ctas,
            nccl_cta_policy: c.overlap.nccl_cta_policy,
            nccl_window_mib: c.overlap.nccl_window_mib,
            ce_slot_mib: c.overlap.ce_slot_mib,
            gemm_into_windows: c.overlap.gemm_into_windows,
            median_ms: t.as_secs_f64() * 1e3,
            contention: self.contention,
        })
    }
}

/// The table of a tuning: one line per candidate with its median or why it has none, the
/// winner marked with `*`.
impl fmt::Display for Tuning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, row) in self.rows.iter().enumerate() {
            let mark = if Some(i) == self.winner { "*" } else { " " };
            writeln!(f, "{mark} {:40} {}", row.candidate.to_string(), row.outcome)?;
        }
        if let Some(c) = self.contention {
            writeln!(
                f,
                "  contention of overlapped GEMMs and collectives, fitted to these runs: {c:.2}"
            )?;
        }
        Ok(())
    }
}

/// Where and how a tuning measures.
#[derive(Clone, Debug)]
pub struct TuneOptions {
    /// The rank count.
    pub ranks: usize,
    /// Whether the ranks run on GPUs (the CUDA backend) rather than CPU threads.
    pub cuda: bool,
    /// The machine's name in the key: the GPU's name ([`gpu_name`]) or `cpu`.
    pub machine: String,
    /// The chunk counts S to try (where the fusion has a chunk-count parameter).
    pub chunk_counts: Vec<usize>,
    /// The stream-pool sizes K to try.
    pub stream_counts: Vec<usize>,
    /// The cost model's calibration that prunes chunk counts; `None` measures them all.
    pub calibration: Option<Calibration>,
    /// Chunk counts predicted at least this many times slower than the model's best are not
    /// measured.
    pub prune_factor: f64,
    /// The replay settings of the grid (GPU: on and off; CPU: off, it has no graphs).
    pub replays: Vec<bool>,
    /// After the grid, measure the overlap knobs (ordered compute, pool priority, NCCL CTA
    /// limit, GEMM SM margin, other pool sizes, copy-engine transport) one at a time on the
    /// fastest candidate and on the fastest chunked one, then the knobs that helped
    /// together ([`knob_variants`]). GPUs only; a program without communication has nothing
    /// for them to overlap.
    pub knobs: bool,
    /// Stop measuring once this much time went by (the candidates left are recorded as
    /// [`Outcome::OverBudget`]); `None`: no limit.
    pub budget: Option<Duration>,
}

impl TuneOptions {
    /// S ∈ {1, 2, 4, 8}, K ∈ {1, 2, 4}, replay on and off on GPUs, pruned by `calibration`
    /// at 1.5×; on GPUs then the overlap knobs; no time limit (`weave tune`).
    pub fn new(ranks: usize, cuda: bool, machine: &str, calibration: Option<Calibration>) -> Self {
        TuneOptions {
            ranks,
            cuda,
            machine: machine.to_string(),
            chunk_counts: CANDIDATES.to_vec(),
            stream_counts: STREAM_COUNTS.to_vec(),
            calibration,
            prune_factor: 1.5,
            replays: if cuda { vec![true, false] } else { vec![false] },
            knobs: cuda,
            budget: None,
        }
    }

    /// The tuning of a first repeated run on GPUs (`weave run --iters`, a second
    /// [`Executable::run`](crate::Executable::run)): S ∈ {1, 2, 4, 8} at K = 2 replayed (what
    /// repeated runs do), then the overlap knobs and the other pool sizes on the best two,
    /// within `budget`.
    pub fn first_run(
        ranks: usize,
        machine: &str,
        calibration: Option<Calibration>,
        budget: Duration,
    ) -> Self {
        TuneOptions {
            stream_counts: vec![2],
            replays: vec![true],
            budget: Some(budget),
            ..TuneOptions::new(ranks, true, machine, calibration)
        }
    }

    /// `cuda` or `cpu`.
    pub fn backend(&self) -> &'static str {
        if self.cuda {
            "cuda"
        } else {
            "cpu"
        }
    }
}

/// The name of GPU `device` (`NVIDIA H200`), the machine part of a [`TuneKey`].
#[cfg(feature = "cuda")]
pub fn gpu_name(device: usize) -> Result<String, String> {
    weave_cuda::Gpu::open(device)
        .map(|g| g.name())
        .map_err(|e| e.to_string())
}

/// The name of GPU `device`: in a build without the `cuda` feature, an error saying so.
#[cfg(not(feature = "cuda"))]
pub fn gpu_name(device: usize) -> Result<String, String> {
    let _ = device;
    Err(crate::run::NO_CUDA.to_string())
}

/// Measures one candidate: its compiled program, run with its stream-pool size and replay
/// setting. A closure `FnMut(&Executable, &Candidate) -> Result<Duration, String>` is one.
pub trait Measure {
    /// The candidate's figure (lower is better), or why it could not run.
    fn measure(&mut self, exe: &Executable, candidate: &Candidate) -> Result<Duration, String>;
}

impl<F> Measure for F
where
    F: FnMut(&Executable, &Candidate) -> Result<Duration, String>,
{
    fn measure(&mut self, exe: &Executable, candidate: &Candidate) -> Result<Duration, String> {
        self(exe, candidate)
    }
}

/// Measures by running: `warmup` runs, then `iters` timed repetitions on seeded random
/// inputs (the same global inputs for every candidate), the median of each repetition's
/// slowest rank. On GPUs the repetitions run on device-resident inputs
/// ([`RunOptions::iters`], [`crate::RunReport::timed`]), replayed as a CUDA graph or issued
/// statement by statement as the candidate says; on the CPU each repetition is a whole run,
/// timed by its slowest rank's wall time.
#[derive(Clone, Debug)]
pub struct RunMeasure {
    /// `Target::Cuda` or `Target::Cpu` with the tuning's rank count.
    pub target: Target,
    /// Untimed runs first.
    pub warmup: usize,
    /// Timed repetitions (at least 1).
    pub iters: usize,
    /// The timeout of each candidate's runs together, warm-up and timed (and of each wait in
    /// them).
    pub timeout: Duration,
    /// The seed of the inputs.
    pub seed: u64,
    globals: Option<Vec<Dense>>,
}

impl RunMeasure {
    /// Runs on `target`, `warmup` untimed runs then `iters` timed ones.
    pub fn new(target: Target, warmup: usize, iters: usize, timeout: Duration) -> RunMeasure {
        RunMeasure {
            target,
            warmup,
            iters: iters.max(1),
            timeout,
            seed: 0x5eed,
            globals: None,
        }
    }
}

impl Measure for RunMeasure {
    fn measure(&mut self, exe: &Executable, candidate: &Candidate) -> Result<Duration, String> {
        if self.globals.is_none() {
            self.globals = Some(exe.random_inputs(self.seed).map_err(|e| e.to_string())?);
        }
        let globals = self.globals.as_deref().unwrap_or_default();
        let options = RunOptions {
            target: self.target.clone(),
            streams: candidate.streams,
            check: false,
            check_races: false,
            timeouts: Timeouts::all(self.timeout),
            replay: candidate.replay,
            transport: candidate.transport,
            overlap: candidate.overlap,
            // A candidate is measured as it is, never tuned itself.
            tune: None,
            ..RunOptions::default()
        };
        if self.target.is_cuda() {
            let report = exe
                .run_dense(
                    globals,
                    &RunOptions {
                        warmup: self.warmup,
                        iters: self.iters,
                        ..options
                    },
                )
                .map_err(|e| e.to_string())?;
            return report
                .timed()
                .map(|t| t.median)
                .ok_or_else(|| "the run reported no timed repetitions".to_string());
        }
        let iters = self.iters.max(1);
        let runs = self
            .warmup
            .checked_add(iters)
            .ok_or_else(|| format!("{} warm-up and {iters} timed runs: too many", self.warmup))?;
        // The timeout bounds the candidate's whole measurement: every run gets what is left
        // of it, and the candidate fails once it is spent. A timeout past the end of time
        // sets no deadline.
        let started = Instant::now();
        let deadline = started.checked_add(self.timeout);
        let mut slowest = Vec::with_capacity(iters.min(1 << 16));
        for i in 0..runs {
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => self.timeout,
            };
            let timed_out = || {
                format!(
                    "timed out after {:.1} s ({i} of {} warm-up and {iters} timed runs done; the timeout bounds each candidate's runs together)",
                    started.elapsed().as_secs_f64(),
                    self.warmup,
                )
            };
            if left.is_zero() {
                return Err(timed_out());
            }
            let report = exe
                .run_dense(
                    globals,
                    &RunOptions {
                        timeouts: Timeouts::all(left),
                        ..options.clone()
                    },
                )
                .map_err(|e| match deadline {
                    // A run stopped by what was left of the candidate's time.
                    Some(d) if Instant::now() >= d => timed_out(),
                    _ => e.to_string(),
                })?;
            if i >= self.warmup {
                let wall = report.ranks.iter().map(|r| r.wall_time).max();
                slowest.push(wall.unwrap_or_default());
            }
        }
        slowest.sort();
        slowest
            .get(slowest.len() / 2)
            .copied()
            .ok_or_else(|| "no timed run".to_string())
    }
}

/// Tunes `fusion` (loaded with its parameter values): compiles each chunk count, measures
/// every candidate that is neither pruned nor redundant with `measure`, and picks the winner
/// (see the module doc). Refusals and failed runs are rows of the result, not errors; the
/// result has no winner when nothing could be measured.
pub fn tune(
    fusion: &Fusion,
    options: &TuneOptions,
    measure: &mut dyn Measure,
) -> Result<Tuning, Error> {
    if options.ranks == 0 {
        return Err(Error::Program("at least one rank is needed".into()));
    }
    if options.stream_counts.is_empty() || options.stream_counts.contains(&0) {
        return Err(Error::Program(
            "the stream-pool sizes to try must be positive, and at least one".into(),
        ));
    }
    if options.replays.is_empty() || (!options.cuda && options.replays.contains(&true)) {
        return Err(Error::Program(
            "the replay settings to try must be at least one, and replay needs GPUs".into(),
        ));
    }
    let started = Instant::now();
    // The budget never stops the first measurement (S = 1 comes first): a tuning always has
    // a winner when anything runs.
    let over_budget = |rows: &[Row]| {
        options.budget.is_some_and(|b| started.elapsed() >= b)
            && rows.iter().any(|r| r.outcome.time().is_some())
    };
    let key = TuneKey::of(fusion, options.ranks, options.backend(), &options.machine);
    let has_chunks = fusion.role_param(ParamRole::ChunkCount).is_some();
    let chunk_counts: Vec<Option<usize>> = if has_chunks {
        let mut s: Vec<usize> = options.chunk_counts.clone();
        if !s.contains(&1) {
            s.insert(0, 1);
        }
        s.sort_unstable();
        s.dedup();
        s.into_iter().map(Some).collect()
    } else {
        vec![None]
    };
    let compiler = Compiler::new().devices(options.ranks);
    let compiled: Vec<(Option<usize>, Result<Executable, String>)> = chunk_counts
        .iter()
        .map(|&s| {
            let chunks = s.map_or(Chunks::AsWritten, Chunks::Fixed);
            let exe = compiler
                .clone()
                .chunks(chunks)
                .compile(fusion)
                .map_err(|e| e.to_string())
                .and_then(|exe| {
                    exe.check_ranks(options.ranks)
                        .map_err(|e| e.to_string())
                        .map(|()| exe)
                });
            (s, exe)
        })
        .collect();
    let pruned = prune(&compiled, options);
    // A chunk count whose host program is statement for statement that of a smaller one (a
    // loop of small kernel-only chunks runs once whatever S asks, `merge-kernel-chunks`)
    // is the same run: measured once.
    let bodies: Vec<Option<String>> = compiled
        .iter()
        .map(|(_, e)| e.as_ref().ok().map(|exe| statements_of(exe.program())))
        .collect();
    let mut rows = Vec::new();
    for (n, (s, exe)) in compiled.iter().enumerate() {
        let same_as = bodies[n].as_ref().and_then(|body| {
            (0..n)
                .find(|&m| bodies[m].as_ref() == Some(body))
                .and_then(|m| compiled[m].0)
        });
        let loops = exe.as_ref().is_ok_and(|exe| has_loop(exe.program()));
        for &k in &options.stream_counts {
            // The pool a program can use: one stream without a loop, at most S with S
            // chunks. A larger K is the same run as that one: recorded as such where the
            // grid has it, measured as it (named so) where it does not.
            let usable = if exe.is_ok() && !loops {
                1
            } else {
                s.map_or(k, |s| k.min(s.max(1)))
            };
            let k = if options.stream_counts.contains(&usable) {
                k
            } else {
                usable
            };
            for &replay in &options.replays {
                let candidate = Candidate::new(*s, k, replay);
                let outcome = match (exe, s.and_then(|s| pruned.get(&s))) {
                    (Err(m), _) => Outcome::Refused(m.clone()),
                    (Ok(_), Some(&(ratio, best))) => Outcome::Pruned { ratio, best },
                    (Ok(_), None) if same_as.is_some() => Outcome::Redundant(format!(
                        "the same host program as S={}: the same run",
                        same_as.unwrap_or(1)
                    )),
                    (Ok(_), None) if !loops && k > 1 => Outcome::Redundant(
                        "no stream loop: the pool is never used, the same run as K=1".into(),
                    ),
                    (Ok(_), None) if s.is_some_and(|s| k > s.max(1)) => {
                        let s = s.unwrap_or(1).max(1);
                        Outcome::Redundant(format!(
                            "{s} chunk(s) use at most {s} stream(s): the same run as K={s}"
                        ))
                    }
                    (Ok(exe), None) => measured(measure, exe, &candidate, over_budget(&rows)),
                };
                rows.push(Row { candidate, outcome });
            }
        }
    }
    if options.cuda && options.knobs {
        let exe_of = |c: &Candidate| {
            compiled
                .iter()
                .find(|(s, _)| *s == c.chunks)
                .and_then(|(_, e)| e.as_ref().ok())
        };
        // The copy engines at every chunk count, on that count's fastest run: their best S
        // is not NCCL's (no SM taken from the GEMM, a handshake per piece), so trying them
        // on NCCL's best S alone misses it.
        if options.ranks > 1 {
            let mut per_count: Vec<(Candidate, Duration)> = Vec::new();
            for r in &rows {
                let Some(t) = r.outcome.time() else { continue };
                match per_count
                    .iter_mut()
                    .find(|(c, _)| c.chunks == r.candidate.chunks)
                {
                    Some(best) if t < best.1 => *best = (r.candidate, t),
                    Some(_) => {}
                    None => per_count.push((r.candidate, t)),
                }
            }
            for (base, _) in per_count {
                let Some(exe) = exe_of(&base) else { continue };
                let comms = communications(exe.program());
                if base.transport != Transport::Nccl || !moves_data(&comms) {
                    continue;
                }
                let ce = Knob::CopyEngine.apply(base);
                // Where the program sums, also its GEMMs writing into the windows, with
                // slots that hold a chunk's block to one peer in one piece (measured on 4 ×
                // H200: 1.60 ms at S = 1 against 1.93 ms with 8 MiB slots, docs/benchmarks.md).
                let mut tries = vec![ce];
                if sums(&comms) {
                    tries.push(
                        Knob::CeSlots(TUNED_CE_SLOT_MIB).apply(Knob::GemmIntoWindows.apply(ce)),
                    );
                }
                for candidate in tries {
                    if !rows.iter().any(|r| r.candidate == candidate) {
                        let outcome = measured(measure, exe, &candidate, over_budget(&rows));
                        rows.push(Row { candidate, outcome });
                    }
                }
            }
        }
        // The bases: the fastest candidate, and the fastest chunked one (the knobs are about
        // overlap, which needs chunks; it may win once they are set).
        let fastest = |chunked: bool| {
            rows.iter()
                .filter(|r| !chunked || r.candidate.chunks.is_some_and(|s| s > 1))
                .filter_map(|r| r.outcome.time().map(|t| (r.candidate, t)))
                .min_by_key(|(_, t)| *t)
        };
        let mut bases: Vec<(Candidate, Duration)> = Vec::new();
        for base in [fastest(false), fastest(true)].into_iter().flatten() {
            if !bases.iter().any(|(c, _)| *c == base.0) {
                bases.push(base);
            }
        }
        for (base, base_time) in bases {
            let Some(exe) = exe_of(&base) else { continue };
            let program = exe.program();
            let comms = communications(program);
            if comms.is_empty() {
                continue;
            }
            let mut helped: Vec<Knob> = Vec::new();
            for knob in knob_variants(&base, &comms, options.ranks) {
                let candidate = knob.apply(base);
                if rows.iter().any(|r| r.candidate == candidate) {
                    continue;
                }
                let outcome = measured(measure, exe, &candidate, over_budget(&rows));
                if outcome
                    .time()
                    .is_some_and(|t| t.as_secs_f64() < base_time.as_secs_f64() * (1.0 - TIE_MARGIN))
                {
                    helped.push(knob);
                }
                rows.push(Row { candidate, outcome });
            }
            // The knobs that helped, together (a pool size and a transport are one choice
            // each: the last that helped).
            if helped.len() >= 2 {
                let candidate = helped.iter().fold(base, |c, k| k.apply(c));
                if !rows.iter().any(|r| r.candidate == candidate) {
                    let outcome = measured(measure, exe, &candidate, over_budget(&rows));
                    rows.push(Row { candidate, outcome });
                }
            }
        }
    }
    let winner = choose(&rows);
    let contention = fitted_contention(&compiled, &rows, options);
    Ok(Tuning {
        key,
        rows,
        winner,
        contention,
    })
}

/// The contention [`crate::chunks::fit_contention`] fits to `rows` on GPUs: each chunk
/// count's fastest run with NCCL and the default knobs (replayed where any was), against
/// the workload of the one-chunk program, from `options`' calibration (else the default).
fn fitted_contention(
    compiled: &[(Option<usize>, Result<Executable, String>)],
    rows: &[Row],
    options: &TuneOptions,
) -> Option<f64> {
    if !options.cuda {
        return None;
    }
    let one = compiled.iter().find_map(|(s, e)| match (s, e) {
        (Some(1), Ok(exe)) => Some(exe),
        _ => None,
    })?;
    let w = crate::chunks::workload(one.program(), options.ranks).ok()?;
    let plain = |r: &&Row| {
        r.candidate.transport == Transport::Nccl && r.candidate.overlap == Overlap::default()
    };
    let replayed = rows.iter().filter(plain).any(|r| r.candidate.replay);
    let mut fastest: BTreeMap<usize, f64> = BTreeMap::new();
    for r in rows
        .iter()
        .filter(plain)
        .filter(|r| r.candidate.replay == replayed)
    {
        if let (Some(s), Some(t)) = (r.candidate.chunks, r.outcome.time()) {
            let t = t.as_secs_f64();
            let best = fastest.entry(s).or_insert(t);
            *best = best.min(t);
        }
    }
    let measured: Vec<(usize, f64)> = fastest.into_iter().collect();
    let cal = options.calibration.clone().unwrap_or_default();
    crate::chunks::fit_contention(&w, &cal, &measured)
}

/// The contention the tunings cached in `path` measured on `ranks` GPUs named `gpu` (their
/// median), for the cost model's calibration of that machine; `None` when none did (or the
/// cache cannot be read).
pub fn measured_contention(path: &std::path::Path, gpu: &str, ranks: usize) -> Option<f64> {
    let cache = TuneCache::load(path).ok()?;
    let mut found: Vec<f64> = cache
        .entries
        .iter()
        .filter(|e| e.backend == "cuda" && e.gpu == gpu && e.ranks == ranks)
        .filter_map(|e| e.contention)
        .filter(|c| c.is_finite())
        .collect();
    if found.is_empty() {
        return None;
    }
    found.sort_by(f64::total_cmp);
    Some(found[found.len() / 2])
}

/// `candidate` measured, or [`Outcome::OverBudget`] when the budget is `spent`.
fn measured(
    measure: &mut dyn Measure,
    exe: &Executable,
    candidate: &Candidate,
    spent: bool,
) -> Outcome {
    if spent {
        return Outcome::OverBudget;
    }
    match measure.measure(exe, candidate) {
        Ok(t) => Outcome::Measured(t),
        Err(m) => Outcome::Failed(m),
    }
}

/// One overlap knob set away from its default (or another pool size, or the other
/// transport): what [`tune`] tries on its best candidates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Knob {
    /// [`Overlap::ordered_compute`].
    OrderedCompute,
    /// [`Overlap::pool_priority_high`].
    PoolPriorityHigh,
    /// [`Overlap::nccl_max_ctas`] at this limit.
    NcclMaxCtas(u32),
    /// [`Overlap::gemm_sm_margin`] of this many SMs.
    GemmSmMargin(u32),
    /// This stream-pool size.
    Streams(usize),
    /// Copy-engine transfers and reductions ([`Transport::CopyEngine`]).
    CopyEngine,
    /// [`Overlap::nccl_cta_policy`] set to this policy.
    NcclCtaPolicy(NcclCtaPolicy),
    /// A symmetric NCCL window of this many MiB ([`Overlap::nccl_window_mib`]), with the
    /// zero-CTA policy when the second field says so.
    NcclWindow(u32, bool),
    /// Copy-engine window slots of this many MiB ([`Overlap::ce_slot_mib`]).
    CeSlots(u32),
    /// GEMMs writing into the copy engines' windows ([`Overlap::gemm_into_windows`]).
    GemmIntoWindows,
}

impl Knob {
    /// `c` with this knob set.
    pub fn apply(self, c: Candidate) -> Candidate {
        let mut c = c;
        match self {
            Knob::OrderedCompute => c.overlap.ordered_compute = true,
            Knob::PoolPriorityHigh => c.overlap.pool_priority_high = true,
            Knob::NcclMaxCtas(n) => c.overlap.nccl_max_ctas = Some(n),
            Knob::GemmSmMargin(n) => c.overlap.gemm_sm_margin = n,
            Knob::Streams(k) => c.streams = k,
            Knob::CopyEngine => c.transport = Transport::CopyEngine,
            Knob::NcclCtaPolicy(p) => c.overlap.nccl_cta_policy = Some(p),
            Knob::NcclWindow(mib, zero) => {
                c.overlap.nccl_window_mib = mib;
                if zero {
                    c.overlap.nccl_cta_policy = Some(NcclCtaPolicy::Zero);
                }
            }
            Knob::CeSlots(mib) => c.overlap.ce_slot_mib = mib,
            Knob::GemmIntoWindows => c.overlap.gemm_into_windows = true,
        }
        c
    }
}

/// The knobs [`tune`] tries on `base`, whose program posts the collectives `comms` (their
/// type names) on `ranks` ranks: ordered compute and pool priority where a loop has chunks
/// to overlap; the NCCL CTA limit (16: fewer starve the collective, docs/benchmarks.md) and
/// a GEMM SM margin (16) where NCCL kernels run beside GEMMs; pool sizes 1, 2 and 4 up to
/// the chunk count; copy-engine transfers and reductions where allgathers, transfers or sum
/// reductions move data; on a copy-engine base, slots of [`TUNED_CE_SLOT_MIB`] (a chunk's
/// block to one peer in one piece) and, where sums are reduced, GEMMs writing into the
/// windows.
pub fn knob_variants(base: &Candidate, comms: &[String], ranks: usize) -> Vec<Knob> {
    let chunked = base.chunks.is_some_and(|s| s > 1);
    let mut out = Vec::new();
    if chunked {
        out.push(Knob::OrderedCompute);
        out.push(Knob::PoolPriorityHigh);
    }
    if ranks > 1 {
        out.push(Knob::NcclMaxCtas(16));
        out.push(Knob::GemmSmMargin(16));
    }
    if chunked {
        let s = base.chunks.unwrap_or(1);
        for k in [1, 2, 4] {
            if k != base.streams && k <= s {
                out.push(Knob::Streams(k));
            }
        }
    }
    if ranks > 1 && moves_data(comms) && base.transport == Transport::Nccl {
        out.push(Knob::CopyEngine);
    }
    if ranks > 1 && base.transport == Transport::CopyEngine && base.overlap.ce_slot_mib == 0 {
        out.push(Knob::CeSlots(TUNED_CE_SLOT_MIB));
    }
    if ranks > 1
        && sums(comms)
        && base.transport == Transport::CopyEngine
        && !base.overlap.gemm_into_windows
    {
        out.push(Knob::GemmIntoWindows);
    }
    // NCCL's own ways of leaving SMs to GEMMs: fewer CTAs, and symmetric windows (whose
    // kernels need fewer; with the zero-CTA policy, copy engines) for the collectives a
    // window can stage.
    let stageable = comms
        .iter()
        .any(|c| matches!(c.as_str(), "Allgather" | "ReduceScatter" | "Allreduce"));
    if ranks > 1 && stageable && base.transport == Transport::Nccl {
        out.push(Knob::NcclCtaPolicy(NcclCtaPolicy::Efficiency));
        out.push(Knob::NcclWindow(TUNED_NCCL_WINDOW_MIB, false));
        out.push(Knob::NcclWindow(TUNED_NCCL_WINDOW_MIB, true));
    }
    out
}

/// Whether collectives of `comms` (type names) move data the copy engines can carry.
fn moves_data(comms: &[String]) -> bool {
    comms.iter().any(|c| {
        matches!(
            c.as_str(),
            "Allgather" | "SendRecv" | "P2P" | "ReduceScatter" | "Allreduce"
        )
    })
}

/// Whether `comms` (type names) has a sum reduction the copy engines can reduce in their
/// windows.
fn sums(comms: &[String]) -> bool {
    comms
        .iter()
        .any(|c| matches!(c.as_str(), "ReduceScatter" | "Allreduce"))
}

/// The copy-engine slot size the tuner tries beside the default 8 MiB: a t = h = 8192 bf16
/// layer's block to one peer at S = 2 on 4 ranks (16 MiB) or S = 1 (32 MiB) in one piece.
pub const TUNED_CE_SLOT_MIB: u32 = 32;

/// The symmetric window the tuner tries: 256 MiB a direction holds the collectives of a
/// t = h = 8192 bf16 layer on 2 ranks (128 MiB) with room to spare.
pub const TUNED_NCCL_WINDOW_MIB: u32 = 256;

/// The type names of the collectives `program` posts (`Allreduce`, `Allgather`, …, and
/// `P2P` for point-to-point transfers), each once, in program order.
fn communications(program: &weave_host_ir::HostProgram) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for w in program.walk() {
        let name = match &program.stmts[w.stmt] {
            weave_host_ir::Stmt::Communication(c) => c.kind.name().to_string(),
            weave_host_ir::Stmt::P2PCommunication(_) => "P2P".to_string(),
            _ => continue,
        };
        if !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

/// The statements of a host program as printed, without its signature (whose parameter
/// values differ between chunk counts that lower to the same statements).
fn statements_of(program: &weave_host_ir::HostProgram) -> String {
    let text = weave_host_ir::print(program);
    match text.find("} // %HostIrContainer") {
        Some(end) => text[..end].to_string(),
        None => text,
    }
}

/// Whether the program has a loop anywhere (without one, no pool stream is ever used).
fn has_loop(program: &weave_host_ir::HostProgram) -> bool {
    program
        .walk()
        .any(|w| matches!(program.stmts[w.stmt], weave_host_ir::Stmt::ForLoop { .. }))
}

/// The chunk counts the cost model rules out, with their predicted ratio to its best and
/// that best: none without a calibration, without communication, or when the one-chunk
/// program did not compile or cannot be metered; never S = 1.
fn prune(
    compiled: &[(Option<usize>, Result<Executable, String>)],
    options: &TuneOptions,
) -> BTreeMap<usize, (f64, usize)> {
    let mut out = BTreeMap::new();
    let Some(cal) = &options.calibration else {
        return out;
    };
    let Some(one) = compiled.iter().find_map(|(s, e)| match (s, e) {
        (Some(1), Ok(exe)) => Some(exe),
        _ => None,
    }) else {
        return out;
    };
    let Ok(w) = crate::chunks::workload(one.program(), options.ranks) else {
        return out;
    };
    if w.comms.is_empty() {
        return out;
    }
    let counts: Vec<usize> = compiled.iter().filter_map(|(s, _)| *s).collect();
    let predicted: Vec<(usize, f64)> = counts
        .iter()
        .map(|&s| (s, crate::chunks::predict(&w, cal, s)))
        .collect();
    let Some(&(best, fastest)) = predicted.iter().min_by(|a, b| a.1.total_cmp(&b.1)) else {
        return out;
    };
    for &(s, t) in &predicted {
        if s != 1 && fastest > 0.0 && t >= fastest * options.prune_factor {
            out.insert(s, (t / fastest, best));
        }
    }
    out
}

/// The winner among measured rows: of those within [`TIE_MARGIN`] of the fastest, the one
/// with the fewest chunks, then the fewest streams, then replay on.
fn choose(rows: &[Row]) -> Option<usize> {
    let fastest = rows.iter().filter_map(|r| r.outcome.time()).min()?;
    let limit = fastest.as_secs_f64() * (1.0 + TIE_MARGIN);
    rows.iter()
        .enumerate()
        .filter(|(_, r)| r.outcome.time().is_some_and(|t| t.as_secs_f64() <= limit))
        .min_by_key(|(i, r)| {
            let c = r.candidate;
            (c.chunks.unwrap_or(0), c.streams, c.knobs(), !c.replay, *i)
        })
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// The row-parallel layer (a GEMM and an allreduce per chunk), small.
    const ROW_PARALLEL: &str = "fusion row_parallel_linear(t = 48, h = 8, d = 2, s = 4) {
  mesh m = devices(d)
  tensor inp: bf16[t, 4 * h] on m
  tensor w: bf16[h, 4 * h] on m
  out = linear(inp, w)
  output out
  schedule inp { outer_split(0, s) -> Stream; outer_split(2, d) -> DIDx }
  schedule w { outer_split(1, d) -> DIDx }
}
";

    pub(super) fn fusion(set: &[(&str, i64)]) -> Fusion {
        let set: Vec<(String, i64)> = set.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        crate::load("row_parallel_linear.weave", ROW_PARALLEL, &set).unwrap()
    }

    fn ms(x: f64) -> Duration {
        Duration::from_secs_f64(x * 1e-3)
    }

    /// GPU options without pruning.
    fn unpruned() -> TuneOptions {
        TuneOptions {
            knobs: false,
            ..TuneOptions::new(2, true, "Test GPU", None)
        }
    }

    /// A deterministic measurement from a table of S, K and replay, recording every call.
    struct Fake<F: Fn(&Candidate) -> f64> {
        figure: F,
        calls: RefCell<Vec<Candidate>>,
    }

    impl<F: Fn(&Candidate) -> f64> Fake<F> {
        fn new(figure: F) -> Self {
            Fake {
                figure,
                calls: RefCell::new(Vec::new()),
            }
        }
    }

    impl<F: Fn(&Candidate) -> f64> Measure for &Fake<F> {
        fn measure(&mut self, exe: &Executable, c: &Candidate) -> Result<Duration, String> {
            // The program measured is the one of the candidate's chunk count.
            let s = exe.signature().params.iter().find(|(k, _)| k == "s");
            assert_eq!(s.map(|(_, v)| *v as usize), c.chunks, "{c}");
            self.calls.borrow_mut().push(*c);
            Ok(ms((self.figure)(c)))
        }
    }

    pub(super) fn candidate(chunks: usize, streams: usize, replay: bool) -> Candidate {
        Candidate::new(Some(chunks), streams, replay)
    }

    /// Times that follow the cost model at a contention of 0.8 (on a machine 1.3 times
    /// slower than the calibration) give that contention back, it is cached with the
    /// winner, and the cache's median is what later calibrations of that machine take.
    #[test]
    fn a_gpu_tuning_fits_the_contention_it_measured_and_the_cache_keeps_it() {
        let f = fusion(&[]);
        let one = Compiler::new()
            .chunks(Chunks::Fixed(1))
            .compile(&f)
            .unwrap();
        let w = crate::chunks::workload(one.program(), 2).unwrap();
        let truth = Calibration {
            contention: 0.8,
            ..Calibration::default()
        };
        let fake = Fake::new(|c: &Candidate| {
            let s = c.chunks.unwrap_or(1);
            let knob = if c.overlap == Overlap::default() {
                1.0
            } else {
                1.1
            };
            1.3e3 * crate::chunks::predict(&w, &truth, s) * knob
        });
        let t = tune(&f, &unpruned(), &mut &fake).unwrap();
        let fitted = t.contention.unwrap();
        assert!((fitted - 0.8).abs() < 1e-3, "{fitted}\n{t}");
        assert!(
            t.to_string().contains(
                "contention of overlapped GEMMs and collectives, fitted to these runs: 0.80"
            ),
            "{t}"
        );
        // On the CPU nothing is fitted: its ranks are threads, not a GPU's SMs.
        let cpu = TuneOptions::new(2, false, "cpu", None);
        assert_eq!(tune(&f, &cpu, &mut &fake).unwrap().contention, None);
        // Cached with the winner, read back as the machine's contention (the median).
        let dir = std::env::temp_dir().join(format!("weave-contention-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("tune.toml");
        let mut cache = TuneCache::default();
        for (i, c) in [0.2, 0.8, 0.5].into_iter().enumerate() {
            let mut e = t.entry().unwrap();
            e.key = format!("k{i}");
            e.contention = Some(c);
            cache.insert(e);
        }
        let mut other = t.entry().unwrap();
        other.key = "elsewhere".into();
        other.gpu = "Other GPU".into();
        other.contention = Some(2.0);
        cache.insert(other);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(&path, cache.render()).unwrap();
        assert_eq!(measured_contention(&path, "Test GPU", 2), Some(0.5));
        assert_eq!(measured_contention(&path, "Test GPU", 4), None);
        assert_eq!(measured_contention(&path, "Other GPU", 2), Some(2.0));
        assert_eq!(
            measured_contention(&dir.join("none.toml"), "Test GPU", 2),
            None
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_fastest_measured_candidate_wins_and_every_candidate_is_recorded() {
        // S = 4 with two streams and replay is fastest.
        let fake = Fake::new(|c: &Candidate| {
            let s = match c.chunks {
                Some(1) => 10.0,
                Some(2) => 7.0,
                Some(4) => 5.0,
                _ => 6.0,
            };
            let k = if c.streams == 2 { 1.0 } else { 1.2 };
            let r = if c.replay { 1.0 } else { 1.1 };
            s * k * r
        });
        let t = tune(&fusion(&[]), &unpruned(), &mut &fake).unwrap();
        // 4 chunk counts × 3 pool sizes × replay on/off.
        assert_eq!(t.rows.len(), 24);
        assert_eq!(t.best(), Some((candidate(4, 2, true), ms(5.0))));
        // The winner's figure is the least of the measured ones.
        let least = t.rows.iter().filter_map(|r| r.outcome.time()).min();
        assert_eq!(least, Some(ms(5.0)));
        // K > S runs as K = S: not measured, and said so.
        for r in &t.rows {
            let redundant = matches!(r.outcome, Outcome::Redundant(_));
            assert_eq!(
                redundant,
                r.candidate.streams > r.candidate.chunks.unwrap(),
                "{r:?}"
            );
        }
        assert_eq!(
            fake.calls.borrow().len(),
            t.rows.iter().filter(|r| r.outcome.time().is_some()).count()
        );
        let table = t.to_string();
        assert!(table.contains("* S=4 K=2 replay"), "{table}");
        assert!(
            table.contains("S=1 K=2 replay") && table.contains("the same run as K=1"),
            "{table}"
        );
        let entry = t.entry().unwrap();
        assert_eq!(
            (entry.chunks, entry.streams, entry.replay),
            (Some(4), 2, true)
        );
        assert!((entry.median_ms - 5.0).abs() < 1e-9);
    }

    /// The first-run tuning on GPUs: S in {1, 2, 4, 8} at K = 2 replayed, then every knob
    /// once on the fastest candidate and on the fastest chunked one, then the knobs that
    /// helped together; the winner carries them and so does its cache entry.
    #[test]
    fn knobs_are_tried_on_the_best_candidates_and_the_ones_that_help_are_combined() {
        // S = 2 is fastest; ordered compute saves 10% and high priority 5% there, together
        // 15%; a CTA limit costs 20%; nothing else matters.
        let fake = Fake::new(|c: &Candidate| {
            let mut t = match c.chunks {
                Some(1) => 10.0,
                Some(2) => 8.0,
                _ => 9.0,
            };
            if c.overlap.ordered_compute {
                t -= 0.8;
            }
            if c.overlap.pool_priority_high {
                t -= 0.4;
            }
            if c.overlap.nccl_max_ctas.is_some() {
                t *= 1.2;
            }
            t
        });
        let options = TuneOptions::first_run(2, "Test GPU", None, Duration::from_secs(3600));
        let t = tune(&fusion(&[]), &options, &mut &fake).unwrap();
        let (best, time) = t.best().unwrap();
        assert_eq!(best.chunks, Some(2));
        assert_eq!(best.streams, 2);
        assert!(best.replay);
        assert!(best.overlap.ordered_compute && best.overlap.pool_priority_high);
        assert_eq!(best.overlap.nccl_max_ctas, None);
        assert_eq!(best.overlap.gemm_sm_margin, 0);
        assert!((time.as_secs_f64() * 1e3 - 6.8).abs() < 1e-9);
        // The grid is K = 2 (one stream for one chunk), replayed only.
        let grid: Vec<Candidate> = [(1, 1), (2, 2), (4, 2), (8, 2)]
            .map(|(s, k)| candidate(s, k, true))
            .to_vec();
        assert_eq!(
            t.rows[..4].iter().map(|r| r.candidate).collect::<Vec<_>>(),
            grid
        );
        // Every knob of the base was measured once on S = 2 (the fastest, also the fastest
        // chunked): ordered, priority, CTA limit, SM margin, K = 1, copy engines (the
        // allreduce is a sum), the efficiency CTA policy and a symmetric window (the
        // window with the zero-CTA policy sets two knobs).
        let on_base: Vec<Candidate> = t.rows[4..]
            .iter()
            .map(|r| r.candidate)
            .filter(|c| c.chunks == Some(2) && c.knobs() + usize::from(c.streams != 2) == 1)
            .collect();
        assert_eq!(on_base.len(), 8, "{t}");
        assert!(on_base
            .iter()
            .any(|c| c.overlap.nccl_window_mib == TUNED_NCCL_WINDOW_MIB));
        let copy_engine = on_base
            .iter()
            .filter(|c| c.transport == Transport::CopyEngine);
        assert_eq!(copy_engine.count(), 1);
        // The copy engines were tried at every chunk count, right after the grid, on that
        // count's run, and (the allreduce sums) with GEMMs into 32 MiB window slots; no
        // other candidate has larger slots.
        let ce: Vec<Candidate> = t.rows[4..12].iter().map(|r| r.candidate).collect();
        let expected: Vec<Candidate> = [(1, 1), (2, 2), (4, 2), (8, 2)]
            .into_iter()
            .flat_map(|(s, k)| {
                let ce = Knob::CopyEngine.apply(candidate(s, k, true));
                [
                    ce,
                    Knob::CeSlots(TUNED_CE_SLOT_MIB).apply(Knob::GemmIntoWindows.apply(ce)),
                ]
            })
            .collect();
        assert_eq!(ce, expected);
        assert!(t
            .rows
            .iter()
            .filter(|r| r.candidate.overlap.ce_slot_mib > 0)
            .all(|r| r.candidate.overlap.gemm_into_windows));
        // No candidate measured twice.
        let calls = fake.calls.borrow();
        let mut unique = calls.clone();
        unique.sort_by_key(|c| format!("{c}"));
        unique.dedup();
        assert_eq!(unique.len(), calls.len());
        // The winner's knobs go into the cache entry and back out of it, through TOML.
        let entry = t.entry().unwrap();
        let mut cache = TuneCache::default();
        cache.insert(entry.clone());
        let back = TuneCache::parse(&cache.render()).unwrap();
        assert_eq!(back.entries[0].candidate(), best);
        let mut run = RunOptions::default();
        entry.apply(&mut run);
        assert_eq!((run.streams, run.overlap), (2, best.overlap));
        let table = t.to_string();
        assert!(
            table.contains("* S=2 K=2 replay, ordered compute, pool priority high"),
            "{table}"
        );
    }

    /// Allgathers and sum reductions move data that copy engines can move: the copy-engine
    /// transport is a candidate (replayed: windows need no host wait), and so are pool sizes
    /// up to the chunk count; a broadcast is NCCL's alone.
    #[test]
    fn programs_that_gather_try_copy_engines_and_knob_variants_follow_the_base() {
        let base = candidate(4, 2, true);
        let knobs = knob_variants(&base, &["Allgather".to_string()], 4);
        assert!(knobs.contains(&Knob::CopyEngine));
        assert!(knobs.contains(&Knob::Streams(1)) && knobs.contains(&Knob::Streams(4)));
        let ce = Knob::CopyEngine.apply(base);
        assert_eq!((ce.transport, ce.replay), (Transport::CopyEngine, true));
        // One chunk: nothing to order or to prioritize, no other pool; one rank: no NCCL.
        let one = knob_variants(&candidate(1, 2, true), &["Allreduce".to_string()], 2);
        assert_eq!(
            one,
            vec![
                Knob::NcclMaxCtas(16),
                Knob::GemmSmMargin(16),
                Knob::CopyEngine,
                Knob::NcclCtaPolicy(NcclCtaPolicy::Efficiency),
                Knob::NcclWindow(TUNED_NCCL_WINDOW_MIB, false),
                Knob::NcclWindow(TUNED_NCCL_WINDOW_MIB, true),
            ]
        );
        assert!(knob_variants(&candidate(1, 1, true), &["Allreduce".to_string()], 1).is_empty());
        let broadcast = knob_variants(&candidate(2, 2, true), &["Broadcast".to_string()], 2);
        assert!(!broadcast.contains(&Knob::CopyEngine));
        // A window stages allgathers, allreduces and reduce-scatters only.
        assert!(!broadcast
            .iter()
            .any(|k| matches!(k, Knob::NcclWindow(..) | Knob::NcclCtaPolicy(_))));
        let zero = Knob::NcclWindow(TUNED_NCCL_WINDOW_MIB, true).apply(base);
        assert_eq!(
            (zero.overlap.nccl_window_mib, zero.overlap.nccl_cta_policy),
            (256, Some(NcclCtaPolicy::Zero))
        );
        assert_eq!(zero.knobs(), 2);
        assert_eq!(
            zero.overlap.describe(),
            "NCCL CTA policy zero, NCCL window 256 MiB"
        );
    }

    /// The copy engines' best chunk count is not NCCL's: they are measured at every chunk
    /// count, and where they win, larger window slots are tried on them.
    #[test]
    fn copy_engines_are_tried_at_every_chunk_count_and_their_slots_on_a_winner() {
        // NCCL is fastest at S = 2; copy engines lose there but win at S = 4, and their
        // 32 MiB slots save 5% more.
        let fake = Fake::new(|c: &Candidate| {
            let ce = c.transport == Transport::CopyEngine;
            let mut t = match (c.chunks, ce) {
                (Some(1), _) => 10.0,
                (Some(2), false) => 8.0,
                (Some(2), true) => 8.4,
                (Some(4), false) => 8.8,
                (Some(4), true) => 7.0,
                _ => 9.5,
            };
            if ce && c.overlap.ce_slot_mib == TUNED_CE_SLOT_MIB {
                t *= 0.95;
            }
            t
        });
        let options = TuneOptions::first_run(4, "Test GPU", None, Duration::from_secs(3600));
        let t = tune(&fusion(&[]), &options, &mut &fake).unwrap();
        let (best, time) = t.best().unwrap();
        assert_eq!(
            (best.chunks, best.transport, best.overlap.ce_slot_mib),
            (Some(4), Transport::CopyEngine, TUNED_CE_SLOT_MIB),
            "{t}"
        );
        assert!((time.as_secs_f64() * 1e3 - 6.65).abs() < 1e-9);
        // The slot knob is tried only on copy-engine bases, and survives the cache.
        assert!(t
            .rows
            .iter()
            .filter(|r| r.candidate.overlap.ce_slot_mib > 0)
            .all(|r| r.candidate.transport == Transport::CopyEngine));
        let entry = t.entry().unwrap();
        let mut cache = TuneCache::default();
        cache.insert(entry);
        let back = TuneCache::parse(&cache.render()).unwrap();
        assert_eq!(back.entries[0].candidate(), best);
        assert!(t.to_string().contains("copy-engine slots of 32 MiB"), "{t}");
        assert!(
            !knob_variants(&candidate(4, 2, true), &["Allreduce".to_string()], 4)
                .contains(&Knob::CeSlots(TUNED_CE_SLOT_MIB))
        );
        // GEMMs into 32 MiB slots were tried at every chunk count (the winner has them: they
        // cost nothing here, and the slots save 5%).
        for (s, k) in [(1, 1), (2, 2), (4, 2), (8, 2)] {
            let giw = Knob::CeSlots(TUNED_CE_SLOT_MIB)
                .apply(Knob::GemmIntoWindows.apply(Knob::CopyEngine.apply(candidate(s, k, true))));
            assert!(t.rows.iter().any(|r| r.candidate == giw), "S={s}: {t}");
        }
        assert!(best.overlap.gemm_into_windows);
        // They are a knob of copy-engine bases whose program sums: not of NCCL ones, not of
        // gathers.
        let ce = Knob::CopyEngine.apply(candidate(2, 2, true));
        for (comms, base, offered) in [
            ("ReduceScatter", ce, true),
            ("Allreduce", ce, true),
            ("Allgather", ce, false),
            ("Allreduce", candidate(2, 2, true), false),
        ] {
            assert_eq!(
                knob_variants(&base, &[comms.to_string()], 4).contains(&Knob::GemmIntoWindows),
                offered,
                "{comms} on {base}"
            );
        }
        let on = Knob::GemmIntoWindows.apply(ce);
        assert_eq!(on.overlap.describe(), "GEMMs into windows");
        assert_eq!(on.knobs(), 2);
    }

    /// A spent budget stops the measuring: S = 1 is always measured first (the budget
    /// counts from before compiling, and a tuning needs one figure), and everything left is
    /// recorded as over the budget, never silently dropped.
    #[test]
    fn a_spent_budget_leaves_the_remaining_candidates_unmeasured_and_says_so() {
        let fake = Fake::new(|_: &Candidate| {
            std::thread::sleep(Duration::from_millis(30));
            5.0
        });
        let options = TuneOptions::first_run(2, "Test GPU", None, Duration::from_millis(1));
        let t = tune(&fusion(&[]), &options, &mut &fake).unwrap();
        let measured = t.rows.iter().filter(|r| r.outcome.time().is_some()).count();
        assert_eq!(measured, 1, "{t}");
        assert_eq!(t.rows[0].candidate, candidate(1, 1, true));
        assert!(t.rows[0].outcome.time().is_some());
        let over = t
            .rows
            .iter()
            .filter(|r| r.outcome == Outcome::OverBudget)
            .count();
        assert_eq!(over + measured, t.rows.len(), "{t}");
        assert!(t.to_string().contains("skipped: over the tuning budget"));
    }

    /// A stream loop that only launches kernels on small chunks runs once whatever S asks:
    /// every chunk count compiles to the one-chunk program, which has no loop, so one pool size and both
    /// replay modes of S = 1 are all that is measured.
    #[test]
    fn chunk_counts_with_the_same_host_program_and_pools_without_a_loop_are_measured_once() {
        let source = "fusion add(t = 64, h = 8, s = 1) {
  tensor a: f32[t, h]
  tensor b: f32[t, h]
  out = add(a, b)
  output out
  schedule out { outer_split(0, s) -> Stream }
}
";
        let fusion = crate::load("add.weave", source, &[]).unwrap();
        let fake = Fake::new(|_: &Candidate| 1.0);
        let options = TuneOptions::new(1, true, "Test GPU", None);
        let t = tune(&fusion, &options, &mut &fake).unwrap();
        assert_eq!(
            *fake.calls.borrow(),
            [candidate(1, 1, true), candidate(1, 1, false)],
            "{t}"
        );
        for row in &t.rows {
            let Outcome::Redundant(why) = &row.outcome else {
                assert_eq!(row.candidate.chunks, Some(1), "{t}");
                assert_eq!(row.candidate.streams, 1, "{t}");
                continue;
            };
            let expected = if row.candidate.chunks == Some(1) {
                "no stream loop: the pool is never used, the same run as K=1"
            } else {
                "the same host program as S=1: the same run"
            };
            assert_eq!(why, expected, "{}", row.candidate);
        }
        assert_eq!(t.best(), Some((candidate(1, 1, true), ms(1.0))));
    }

    #[test]
    fn ties_within_two_percent_go_to_fewer_chunks_then_fewer_streams_then_replay() {
        // S = 4 is 1.5% faster than S = 2: a tie, the fewer chunks win.
        let fake = Fake::new(|c: &Candidate| match c.chunks {
            Some(2) => 5.0,
            Some(4) => 4.925,
            _ => 9.0,
        });
        let t = tune(&fusion(&[]), &unpruned(), &mut &fake).unwrap();
        assert_eq!(t.best(), Some((candidate(2, 1, true), ms(5.0))));
        // 3% faster is no tie.
        let fake = Fake::new(|c: &Candidate| match c.chunks {
            Some(2) => 5.0,
            Some(4) => 4.85,
            _ => 9.0,
        });
        let t = tune(&fusion(&[]), &unpruned(), &mut &fake).unwrap();
        assert_eq!(t.best().unwrap().0.chunks, Some(4));
        // Among equal chunk counts, fewer streams; then replay over eager.
        let fake = Fake::new(|c: &Candidate| match (c.chunks, c.streams, c.replay) {
            (Some(4), 4, false) => 3.0,
            (Some(4), 2, false) => 3.05,
            (Some(4), 2, true) => 3.05,
            _ => 9.0,
        });
        let t = tune(&fusion(&[]), &unpruned(), &mut &fake).unwrap();
        assert_eq!(t.best(), Some((candidate(4, 2, true), ms(3.05))));
    }

    #[test]
    fn the_cost_model_prunes_chunk_counts_it_predicts_much_slower_and_never_one() {
        // At t = 48, h = 8 every collective's fixed cost dominates: the model predicts every
        // chunked schedule at least 1.5x one chunk.
        let options = TuneOptions {
            calibration: Some(Calibration::default()),
            ..unpruned()
        };
        let fake = Fake::new(|c: &Candidate| c.chunks.unwrap() as f64);
        let t = tune(&fusion(&[]), &options, &mut &fake).unwrap();
        for r in &t.rows {
            match r.candidate.chunks {
                Some(1) => assert!(
                    matches!(r.outcome, Outcome::Measured(_) | Outcome::Redundant(_)),
                    "{r:?}"
                ),
                _ => match &r.outcome {
                    Outcome::Pruned { ratio, best } => {
                        assert!(*ratio >= 1.5, "{r:?}");
                        assert_eq!(*best, 1);
                    }
                    other => panic!("{}: {other:?}", r.candidate),
                },
            }
        }
        assert!(fake.calls.borrow().iter().all(|c| c.chunks == Some(1)));
        assert!(
            t.to_string().contains("skipped: the cost model predicts"),
            "{t}"
        );
        // A factor no prediction reaches prunes nothing.
        let options = TuneOptions {
            prune_factor: 1e9,
            ..options
        };
        let t = tune(&fusion(&[]), &options, &mut &Fake::new(|_: &Candidate| 1.0)).unwrap();
        assert!(!t
            .rows
            .iter()
            .any(|r| matches!(r.outcome, Outcome::Pruned { .. })));
    }

    #[test]
    fn refused_and_failed_candidates_are_recorded_with_their_message() {
        // More chunks than a stream loop may run: the compiler refuses.
        let options = TuneOptions {
            chunk_counts: vec![1, 2, 1 << 17],
            stream_counts: vec![1],
            ..unpruned()
        };
        let t = tune(
            &fusion(&[]),
            &options,
            &mut |_: &Executable, c: &Candidate| {
                if c.replay {
                    Err("out of memory".to_string())
                } else {
                    Ok(ms(c.chunks.unwrap() as f64))
                }
            },
        )
        .unwrap();
        let refused: Vec<&Row> = t
            .rows
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Refused(_)))
            .collect();
        assert_eq!(refused.len(), 2, "{t}");
        for r in refused {
            assert_eq!(r.candidate.chunks, Some(1 << 17));
            assert!(r.outcome.to_string().contains("stream chunks"), "{r:?}");
        }
        let failed = t
            .rows
            .iter()
            .filter(|r| r.outcome == Outcome::Failed("out of memory".into()))
            .count();
        assert_eq!(failed, 2, "{t}");
        assert_eq!(t.best(), Some((candidate(1, 1, false), ms(1.0))));
        // Nothing measured: no winner, nothing to cache.
        let t = tune(&fusion(&[]), &options, &mut |_: &Executable,
                                                   _: &Candidate|
         -> Result<
            Duration,
            String,
        > {
            Err("no GPU".into())
        })
        .unwrap();
        assert_eq!(t.winner, None);
        assert_eq!(t.entry(), None);
        // A rank count the program's meshes cannot take is refused for every candidate.
        let t = tune(
            &fusion(&[("d", 2)]),
            &TuneOptions::new(3, false, "cpu", None),
            &mut |_: &Executable, _: &Candidate| Ok(ms(1.0)),
        )
        .unwrap();
        assert!(t
            .rows
            .iter()
            .all(|r| matches!(r.outcome, Outcome::Refused(_))));
    }

    #[test]
    fn the_cache_round_trips_keeps_other_entries_and_replaces_its_own() {
        let dir = std::env::temp_dir().join(format!("weave-tune-{}", std::process::id()));
        let path = dir.join("sub/tune.toml");
        let _ = std::fs::remove_dir_all(&dir);
        let fake = Fake::new(|c: &Candidate| c.chunks.unwrap() as f64 + c.streams as f64);
        let t = tune(&fusion(&[]), &unpruned(), &mut &fake).unwrap();
        assert_eq!(lookup(&path, &t.key).unwrap(), None);
        let stored = store(&path, &t).unwrap().unwrap();
        assert_eq!(lookup(&path, &t.key).unwrap(), Some(stored.clone()));
        assert_eq!(stored.candidate(), candidate(1, 1, true));
        let mut options = RunOptions {
            streams: 4,
            ..RunOptions::default()
        };
        stored.apply(&mut options);
        assert_eq!((options.streams, options.replay), (1, true));
        let eager = Entry {
            replay: false,
            ..stored.clone()
        };
        eager.apply(&mut options);
        assert!(!options.replay);
        // Another program's entry joins it; tuning the first again replaces its entry.
        let other = tune(&fusion(&[("t", 96)]), &unpruned(), &mut &fake).unwrap();
        store(&path, &other).unwrap();
        let fake = Fake::new(|c: &Candidate| 10.0 - c.chunks.unwrap() as f64);
        let again = tune(&fusion(&[]), &unpruned(), &mut &fake).unwrap();
        store(&path, &again).unwrap();
        let cache = TuneCache::load(&path).unwrap();
        assert_eq!(cache.entries.len(), 2, "{}", cache.render());
        assert_eq!(cache.get(&t.key).unwrap().chunks, Some(8));
        assert_eq!(cache.get(&other.key).unwrap().chunks, Some(1));
        assert_eq!(TuneCache::parse(&cache.render()).unwrap(), cache);
        // No temporary file is left beside it.
        let names: Vec<_> = std::fs::read_dir(dir.join("sub"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("tune.toml")]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn runs_on_cpu_ranks_measure_and_choose() {
        let options = TuneOptions {
            chunk_counts: vec![1, 2],
            stream_counts: vec![1, 2],
            ..TuneOptions::new(2, false, "cpu", None)
        };
        let mut measure = RunMeasure::new(Target::Cpu { ranks: 2 }, 1, 2, Duration::from_secs(30));
        let t = tune(&fusion(&[]), &options, &mut measure).unwrap();
        // S ∈ {1, 2} × K ∈ {1, 2}, eager only; K = 2 for one chunk is redundant.
        assert_eq!(t.rows.len(), 4, "{t}");
        assert_eq!(
            t.rows
                .iter()
                .filter(|r| matches!(r.outcome, Outcome::Measured(_)))
                .count(),
            3,
            "{t}"
        );
        assert!(t.rows.iter().all(|r| !r.candidate.replay));
        let (_, best) = t.best().unwrap();
        let least = t
            .rows
            .iter()
            .filter_map(|r| r.outcome.time())
            .min()
            .unwrap();
        assert!(best.as_secs_f64() <= least.as_secs_f64() * (1.0 + TIE_MARGIN));
    }
}
