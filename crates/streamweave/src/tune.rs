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
//! The least of a score of short medians is optimistic: a winner chosen on one measurement
//! ran up to 7% slower than its figure in the `weave run` that followed, and on 2 × H200 a
//! copy-engine candidate measured 3.4% faster than S = 1 ran 7% slower than it
//! (docs/benchmarks.md, 2026-11-27 ninth and 2026-11-28 fifteenth). So after the search a
//! final round measures the [`FINALISTS`] fastest candidates and the simplest measured one
//! (S = 1, or the fewest streams of a program whose loops have their chunks as written)
//! again, [`TuneOptions::final_rounds`] times each, in turn, and the winner is chosen among
//! them by the median of these fresh figures alone ([`Outcome::Confirmed`]): the figure that
//! made a candidate a finalist takes no part in its ranking.
//! Among the measured candidates, those
//! within [`TIE_MARGIN`] of the fastest tie, and the simplest of them wins: fewer chunks, then
//! fewer streams, then graph replay (the default).
//!
//! The cache is a TOML file whose path the caller gives (`weave` reads `$WEAVE_TUNE_CACHE`,
//! else `~/.cache/streamweave/tune.toml`): one `[[entry]]` per [`TuneKey`], written whole
//! through a temporary file and a rename.

mod cache;
mod candidate;
mod choice;
mod knobs;
mod measurement;

pub use cache::{lookup, store, CacheError, CacheParseError, Entry, TuneCache, TuneKey};
pub use candidate::{Candidate, Outcome};
pub use knobs::{knob_variants, loop_chunks, Knob, TUNED_CE_SLOT_MIB, TUNED_NCCL_WINDOW_MIB};
pub use measurement::{
    candidate_bounds, gpu_name, GpuNameError, Measure, MeasureError, RunMeasure,
};

use choice::choose;
use knobs::{moves_data, sums};

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use weave_ir::{Fusion, ParamRole};

use crate::chunks::{Calibration, CANDIDATES};
#[cfg(doc)]
use crate::executable::Chunks;
use crate::executable::{Compiler, Error, Executable};
use crate::run::{Overlap, Transport};

/// Measured candidates within this fraction of the fastest tie; the simplest of them wins.
pub const TIE_MARGIN: f64 = 0.02;

/// The final round measures this many of the fastest candidates again (and the simplest
/// measured one).
pub const FINALISTS: usize = 3;

/// How many times the final round measures each finalist by default.
pub const FINAL_ROUNDS: usize = 3;

/// How many rounds a first run's final round goes up to while less than half its budget is
/// spent ([`TuneOptions::final_rounds_up_to`]).
pub const FIRST_RUN_FINAL_ROUNDS: usize = 12;

/// The stream-pool sizes a tuning considers by default.
pub const STREAM_COUNTS: [usize; 3] = [1, 2, 4];

/// The pieces per step a reduce ring without a chunk-count parameter is tried with (chunk
/// counts of that many times the chunks its loops run; `lower-to-host{ring-pieces=K}`).
pub const RING_PIECES: [usize; 2] = [2, 4];

/// The pieces per step a fusion's ring form ([`Chunks::Ring`]) is tried with on more than one
/// rank: each step whole, and the reduce rings' steps in 2 and 4 pieces.
pub const RING_FORM_PIECES: [usize; 3] = [1, 2, 4];

/// What a tuning compiles: a chunk count (`None`: as written) and, for the fusion's ring form,
/// its pieces a step.
type Form = (Option<usize>, Option<usize>);

/// How `form` is named in a row's message.
fn form_name((chunks, ring): Form) -> String {
    match (ring, chunks) {
        (Some(k), _) => format!("ring:{k}"),
        (None, Some(s)) => format!("S={s}"),
        (None, None) => "S=as written".to_string(),
    }
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
            ring: c.ring,
            streams: c.streams,
            replay: c.replay,
            transport: c.transport,
            ordered_compute: c.overlap.ordered_compute,
            pool_priority_high: c.overlap.pool_priority_high,
            comm_priority_high: c.overlap.comm_priority_high,
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
    /// The pieces a step the fusion's ring form ([`Chunks::Ring`]) is tried with, on more than
    /// one rank ([`RING_FORM_PIECES`] by default; empty: not tried).
    pub ring_pieces: Vec<usize>,
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
    /// Which candidates the runner that applies the winner can run: the others are never
    /// measured.
    pub scope: Scope,
    /// Also try the copy-engine transport (and its slots and GEMMs into windows), at every
    /// chunk count. On by default: they take no SM from the GEMM, and where a program sums
    /// they beat NCCL's kernels (`matmul_rs` on 4 × H200: 1.580 ms against 1.716,
    /// docs/benchmarks.md). `false` (`weave tune --copy-engines off`, `weave run
    /// --tune-copy-engines off`) measures NCCL only.
    pub copy_engines: bool,
    /// How many times the final round measures each finalist (the [`FINALISTS`] fastest and
    /// the simplest measured candidate), in turn, before the winner is chosen among them by
    /// these fresh figures alone; 0: no final round, the search's figures choose.
    pub final_rounds: usize,
    /// While the tuning has spent less than half its [`TuneOptions::budget`], the final round
    /// goes on past [`TuneOptions::final_rounds`], up to this many rounds: the median of more
    /// fresh figures chooses (on 2 × H200 at t = h = 8192 one candidate's figures of 3 rounds
    /// spread 7.27–8.20 ms, docs/benchmarks.md, 2026-11-28 nineteenth). At most
    /// `final_rounds` (the default) adds none.
    pub final_rounds_up_to: usize,
}

/// Which candidates a tuning may measure and choose: what the runner that applies the
/// winner can switch to ([`TuneOptions::scope`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Every candidate: `weave run` and [`Executable::run`](crate::Executable::run) open their
    /// world per run, with any transport and communicator options.
    #[default]
    Any,
    /// What a [`CudaSession`](crate::CudaSession) can switch to between two calls on the
    /// communicators it keeps open: eager runs on NCCL at any chunk count and pool size, with
    /// the backend's own knobs (ordered compute, pool priority, GEMM SM margin); no graph
    /// replay (a session issues statement by statement), no copy engines and nothing that
    /// needs a communicator of its own (CTA limits and policies, symmetric windows).
    Session,
}

impl Scope {
    /// Whether a runner of this scope can run `c`.
    pub fn admits(self, c: &Candidate) -> bool {
        match self {
            Scope::Any => true,
            Scope::Session => {
                let o = &c.overlap;
                !c.replay
                    && c.transport == Transport::Nccl
                    && !o.needs_own_communicators()
                    && o.ce_slot_mib == 0
                    && !o.gemm_into_windows
            }
        }
    }

    /// The backend part of a tuning's key: a session's winner (eager, NCCL only) is cached
    /// apart from a run's.
    fn backend(self, cuda: bool) -> &'static str {
        match (self, cuda) {
            (_, false) => "cpu",
            (Scope::Any, true) => "cuda",
            (Scope::Session, true) => "cuda-session",
        }
    }
}

impl TuneOptions {
    /// S ∈ {1, 2, 4, 8} and, on more than one rank, the ring form in 1, 2 and 4 pieces a
    /// step; K ∈ {1, 2, 4}, replay on and off on GPUs, the chunk counts pruned by
    /// `calibration` at 1.5×; on GPUs then the copy engines at every chunk count and the overlap knobs; no
    /// time limit (`weave tune`).
    pub fn new(ranks: usize, cuda: bool, machine: &str, calibration: Option<Calibration>) -> Self {
        TuneOptions {
            ranks,
            cuda,
            machine: machine.to_string(),
            chunk_counts: CANDIDATES.to_vec(),
            ring_pieces: RING_FORM_PIECES.to_vec(),
            stream_counts: STREAM_COUNTS.to_vec(),
            calibration,
            prune_factor: 1.5,
            replays: if cuda { vec![true, false] } else { vec![false] },
            knobs: cuda,
            budget: None,
            scope: Scope::Any,
            copy_engines: true,
            final_rounds: FINAL_ROUNDS,
            final_rounds_up_to: FINAL_ROUNDS,
        }
    }

    /// Whether the tuning may measure `c`: what its runner can run
    /// ([`TuneOptions::scope`]), on copy engines unless they are left out
    /// ([`TuneOptions::copy_engines`]).
    pub fn allows(&self, c: &Candidate) -> bool {
        let o = &c.overlap;
        let copy_engine =
            c.transport == Transport::CopyEngine || o.ce_slot_mib > 0 || o.gemm_into_windows;
        self.scope.admits(c)
            && (self.copy_engines || !copy_engine)
            && c.overlap.check(c.transport).is_ok()
    }

    /// The tuning of a first repeated run on GPUs (`weave run --iters`, a second
    /// [`Executable::run`](crate::Executable::run)): S ∈ {1, 2, 4, 8} at K = 2 replayed (what
    /// repeated runs do), then the copy engines at every chunk count (replayed and eager), the
    /// overlap knobs, the other pool sizes and (chunked) the same run eager on the best two,
    /// within `budget`; the final round goes on up to [`FIRST_RUN_FINAL_ROUNDS`] rounds while
    /// less than half the budget is spent.
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
            final_rounds_up_to: FIRST_RUN_FINAL_ROUNDS,
            ..TuneOptions::new(ranks, true, machine, calibration)
        }
    }

    /// These options for a [`CudaSession`](crate::CudaSession)'s first repeated call: the
    /// grid eager (a session issues statement by statement), then only the knobs a session
    /// can switch to ([`Scope::Session`]). With [`TuneOptions::first_run`]: S ∈ {1, 2, 4, 8}
    /// at K = 2, then those knobs and the other pool sizes on the best two, within its budget.
    pub fn in_session(self) -> Self {
        TuneOptions {
            replays: vec![false],
            scope: Scope::Session,
            ..self
        }
    }

    /// The backend part of the key: `cpu`, `cuda`, or `cuda-session` ([`Scope::Session`]).
    pub fn backend(&self) -> &'static str {
        self.scope.backend(self.cuda)
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
    if options.scope == Scope::Session && options.replays.contains(&true) {
        return Err(Error::Program(
            "a session issues statement by statement: its tuning cannot try graph replay".into(),
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
    // Only chunk counts that keep the caller's data (`Fusion::chunk_count_keeps_the_data`,
    // with the mesh sized for the ranks); none, and the fusion runs as written.
    let mut bound = fusion.clone();
    if let Some(d) = fusion
        .role_param(ParamRole::MeshSize)
        .map(|p| p.name.clone())
    {
        let _ = bound.set_param(&d, i64::try_from(options.ranks).unwrap_or(i64::MAX));
    }
    let keeps = |n: usize| match (fusion.role_param(ParamRole::ChunkCount), i64::try_from(n)) {
        (Some(p), Ok(n)) => bound.chunk_count_keeps_the_data(&p.name, n).is_ok(),
        _ => false,
    };
    let chunk_counts: Vec<Option<usize>> = {
        let mut s: Vec<usize> = options.chunk_counts.clone();
        if !s.contains(&1) {
            s.insert(0, 1);
        }
        s.sort_unstable();
        s.dedup();
        s.retain(|&n| keeps(n));
        match s.is_empty() {
            // Without a chunk-count parameter: S = 1 (its Stream axes run serially, when it
            // has any: a ring lowers to its collective), then the fusion as written, then
            // its steps in pieces (a multiple of the chunks its loops run: a reduce ring
            // summing in its GEMMs; refused where there is none).
            true if fusion.has_stream_axes() => {
                let mut v = vec![Some(1), None];
                if let [e] = bound.stream_axis_extents().as_slice() {
                    let e = usize::try_from(*e).unwrap_or(0);
                    v.extend(
                        RING_PIECES
                            .iter()
                            .filter_map(|k| e.checked_mul(*k))
                            .filter(|&n| n > 1)
                            .map(Some),
                    );
                }
                v
            }
            true => vec![None],
            false => s.into_iter().map(Some).collect(),
        }
    };
    // Then, on more than one rank, the fusion's ring form (where it has one: else each is a
    // refused row), running as many chunks as devices times its pieces.
    let mut forms: Vec<Form> = chunk_counts.iter().map(|&s| (s, None)).collect();
    if options.ranks > 1 {
        forms.extend(
            options
                .ring_pieces
                .iter()
                .filter(|&&k| k > 0)
                .map(|&k| (Some(options.ranks.saturating_mul(k)), Some(k))),
        );
    }
    let compiler = Compiler::new().devices(options.ranks);
    let compiled: Vec<(Form, Result<Executable, String>)> = forms
        .iter()
        .map(|&(s, ring)| {
            let chunks = Candidate {
                ring,
                ..Candidate::new(s, 1, false)
            }
            .compiler_chunks();
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
            ((s, ring), exe)
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
    for (n, (form, exe)) in compiled.iter().enumerate() {
        let (s, ring) = (&form.0, form.1);
        let same_as = bodies[n].as_ref().and_then(|body| {
            (0..n)
                .find(|&m| bodies[m].as_ref() == Some(body))
                .map(|m| compiled[m].0)
        });
        let loops = exe.as_ref().is_ok_and(|exe| has_loop(exe.program()));
        // The chunks it runs: S, or as written its stream loops' trip count.
        let chunks = s.or_else(|| exe.as_ref().ok().and_then(|e| loop_chunks(e.program())));
        for &k in &options.stream_counts {
            // The pool a program can use: one stream without a loop, at most its chunks. A
            // larger K is the same run as that one: recorded as such where the grid has it,
            // measured as it (named so) where it does not.
            let usable = if exe.is_ok() && !loops {
                1
            } else {
                chunks.map_or(k, |c| k.min(c.max(1)))
            };
            let k = if options.stream_counts.contains(&usable) {
                k
            } else {
                usable
            };
            for &replay in &options.replays {
                let candidate = Candidate {
                    ring,
                    ..Candidate::new(*s, k, replay)
                };
                // The cost model knows chunk counts, not rings.
                let prune = s.filter(|_| ring.is_none()).and_then(|s| pruned.get(&s));
                let outcome = match (exe, prune) {
                    (Err(m), _) => Outcome::Refused(m.clone()),
                    (Ok(_), Some(&(ratio, best))) => Outcome::Pruned { ratio, best },
                    (Ok(_), None) if same_as.is_some() => Outcome::Redundant(format!(
                        "the same host program as {}: the same run",
                        same_as.map_or_else(String::new, form_name)
                    )),
                    (Ok(_), None) if !loops && k > 1 => Outcome::Redundant(
                        "no stream loop: the pool is never used, the same run as K=1".into(),
                    ),
                    (Ok(_), None) if chunks.is_some_and(|c| k > c.max(1)) => {
                        let s = chunks.unwrap_or(1).max(1);
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
                .find(|(f, _)| *f == (c.chunks, c.ring))
                .and_then(|(_, e)| e.as_ref().ok())
        };
        // The copy engines at every chunk count, on that count's fastest run: their best S
        // is not NCCL's (no SM taken from the GEMM, a handshake per piece), so trying them
        // on NCCL's best S alone misses it.
        if options.ranks > 1 && options.copy_engines {
            let mut per_count: Vec<(Candidate, Duration)> = Vec::new();
            for r in &rows {
                let Some(t) = r.outcome.time() else { continue };
                match per_count
                    .iter_mut()
                    .find(|(c, _)| (c.chunks, c.ring) == (r.candidate.chunks, r.candidate.ring))
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
                } else if comms.iter().any(|c| c == "P2P") {
                    // A ring's transfers in slots that hold a piece whole (the MLP block's
                    // rings in 2 pieces a step on 2 × H200: 1.58 ms against 1.74 with the
                    // default slots, docs/benchmarks.md, 2026-11-28 nineteenth).
                    tries.push(Knob::CeSlots(TUNED_CE_SLOT_MIB).apply(ce));
                }
                // Each with the other replay setting too (a first run's grid is replayed:
                // its copy engines are also tried eager; where the grid had an eager base,
                // they are also tried replayed, which `allows` refuses to a session). Which of
                // the two is faster differs with the program and S (4 × H200: plain copy
                // engines in `matmul_rs` at S = 8 took 1.640 ms eager against 1.841
                // replayed, the MLP block at h = 4096, S = 2 1.292 against 1.411; elsewhere
                // replay won by up to 8%, docs/benchmarks.md).
                let flipped: Vec<Candidate> = tries
                    .iter()
                    .map(|c| Candidate {
                        replay: !c.replay,
                        ..*c
                    })
                    .collect();
                tries.extend(flipped);
                for candidate in tries {
                    if options.allows(&candidate) && !rows.iter().any(|r| r.candidate == candidate)
                    {
                        let outcome = measured(measure, exe, &candidate, over_budget(&rows));
                        rows.push(Row { candidate, outcome });
                    }
                }
            }
        }
        // The bases: the fastest candidate, and the fastest chunked one (the knobs are about
        // overlap, which needs chunks; it may win once they are set). A fusion's chunks as
        // written count as chunked.
        let fastest = |chunked: bool| {
            rows.iter()
                .filter(|r| !chunked || r.candidate.chunks.is_none_or(|s| s > 1))
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
            let chunks = base.chunks.or_else(|| loop_chunks(program));
            for knob in knob_variants(&base, &comms, options.ranks, chunks) {
                let candidate = knob.apply(base);
                if !options.allows(&candidate) || rows.iter().any(|r| r.candidate == candidate) {
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
                if options.allows(&candidate) && !rows.iter().any(|r| r.candidate == candidate) {
                    let outcome = measured(measure, exe, &candidate, over_budget(&rows));
                    rows.push(Row { candidate, outcome });
                }
            }
        }
    }
    // The final round: the fastest candidates and the simplest measured one, measured again
    // in turn; the winner is chosen among them by these fresh figures alone (the search's
    // least figures are optimistic, see the module doc).
    if !over_budget(&rows) {
        // The rounds past `final_rounds` only while less than half the budget is spent.
        let extra_until = options.budget.map(|b| b / 2);
        choice::final_round(
            &mut rows,
            // No final round at all stays none.
            match options.final_rounds {
                0 => 0,
                n => n.max(options.final_rounds_up_to),
            },
            measure,
            &|c| {
                compiled
                    .iter()
                    .find(|(f, _)| *f == (c.chunks, c.ring))
                    .and_then(|(_, e)| e.as_ref().ok())
            },
            &|rows, round| {
                !over_budget(rows)
                    && (round < options.final_rounds
                        || extra_until.is_some_and(|t| started.elapsed() < t))
            },
        );
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
    compiled: &[(Form, Result<Executable, String>)],
    rows: &[Row],
    options: &TuneOptions,
) -> Option<f64> {
    if !options.cuda {
        return None;
    }
    let one = compiled.iter().find_map(|(s, e)| match (s, e) {
        ((Some(1), None), Ok(exe)) => Some(exe),
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
        .filter(|r| r.candidate.replay == replayed && r.candidate.ring.is_none())
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
        Err(m) => Outcome::Failed(m.0),
    }
}

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
    compiled: &[(Form, Result<Executable, String>)],
    options: &TuneOptions,
) -> BTreeMap<usize, (f64, usize)> {
    let mut out = BTreeMap::new();
    let Some(cal) = &options.calibration else {
        return out;
    };
    let Some(one) = compiled.iter().find_map(|(s, e)| match (s, e) {
        ((Some(1), None), Ok(exe)) => Some(exe),
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
    let counts: Vec<usize> = compiled
        .iter()
        .filter_map(|((s, ring), _)| s.filter(|_| ring.is_none()))
        .collect();
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

#[cfg(test)]
mod tests;
