//! Mutation test of the race checker: every scenario of tests/scenarios is lowered at one
//! small configuration, and every synchronization of its host program is broken in turn —
//! each `Synchronize` deleted, each `Wait` deleted, each join loop (a `FOR` of
//! `Synchronize`s only) deleted, each `SetCurrentStream(x); Synchronize(y)` pair swapped
//! (forks, and the joins' switch back to the main stream). A mutant is *killed* when the
//! host-IR verifier refuses it, the run fails, or the race checker reports a race on some
//! rank. A mutant that survives must be *redundant*, as decided by a happens-before analysis
//! of the program's synchronization (below, sharing no code with the race checker) on every
//! rank: either every statement instance keeps its vector clock (the removed ordering is
//! implied by the synchronization left), or every two accesses of one buffer, one a write,
//! that the original orders stay ordered (what the removed synchronization ordered touches
//! different buffers). The test prints the score, the redundant mutants and why, and fails
//! on any other survivor, and on a race the analysis calls redundant (the two disagree).
//!
//! Programs are lowered with every stream loop kept (the standard pipeline without
//! `merge-kernel-chunks`), so a loop that only launches kernels on small chunks has its forks
//! and joins to break too. Sizes follow tests/scenario_sweep.rs (`t = 10`, `h = 3`), with `s = 3` chunks and 2
//! devices (a 2 × 2 mesh for the 2-D scenarios), each program run with 2 pool streams (more
//! chunks than streams, so a pool stream is reused across iterations) and with 1; a scenario
//! refused there takes the next configuration of a short list. Every mutant runs on the CPU backend with the main stream
//! slowed down (uploads and allocations are stream-ordered there, so a worker that does not
//! wait for the main stream really runs ahead and reads poison); its outputs are compared
//! with the original program's, which shows how many of the races reported really happened,
//! and a redundant mutant must give the original's outputs. Every mutant of every scenario
//! runs: a few seconds in all, no sampling.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::time::Duration;

use common::{fixed_ranks, fixtures, params};
use streamweave::executor::{Dense, StreamKey};
use streamweave::host_ir::{
    HostProgram, HostScalar, HostTensorId, Names, ScalarId, ScopeRef, Stmt, StmtId, Stream,
    StreamId,
};
use streamweave::ir::Scalar;
use streamweave::passes::Pipeline;
use streamweave::{Compiler, Executable, RunOptions, Target};

/// One way of breaking a program's synchronization.
#[derive(Clone, Debug)]
enum Mutation {
    /// Delete a `Synchronize`, a `Wait` or a join loop.
    Delete(StmtId),
    /// Swap the `SetCurrentStream` at `position` of `scope` with the `Synchronize` after it.
    Reverse(ScopeRef, usize),
}

/// Every mutant of `p`, each with a description.
fn mutations(p: &HostProgram) -> Vec<(Mutation, String)> {
    let mut names = Names::of(p);
    let mut out = Vec::new();
    for w in p.walk() {
        let Some(stmt) = p.stmts.get(w.stmt) else {
            continue;
        };
        let label = names.stmt(p, w.stmt);
        match stmt {
            Stmt::Synchronize { .. } => {
                out.push((Mutation::Delete(w.stmt), format!("delete `{label}`")));
            }
            Stmt::Wait { .. } => {
                out.push((Mutation::Delete(w.stmt), format!("delete `{label}`")));
            }
            Stmt::ForLoop { body, .. }
                if !body.is_empty()
                    && body
                        .iter()
                        .all(|s| matches!(p.stmts.get(*s), Some(Stmt::Synchronize { .. }))) =>
            {
                out.push((
                    Mutation::Delete(w.stmt),
                    format!("delete the join loop `{label}`"),
                ));
            }
            Stmt::SetCurrentStream { .. } => {
                let scope = p.scope(w.scope);
                let next = scope.get(w.position + 1).and_then(|s| p.stmts.get(*s));
                if matches!(next, Some(Stmt::Synchronize { .. })) {
                    out.push((
                        Mutation::Reverse(w.scope, w.position),
                        format!("swap `{label}` and the `Synchronize` after it"),
                    ));
                }
            }
            _ => {}
        }
    }
    out
}

fn apply(p: &HostProgram, m: &Mutation) -> HostProgram {
    let mut q = p.clone();
    match *m {
        Mutation::Delete(s) => {
            q.remove(s);
        }
        Mutation::Reverse(scope, pos) => q.scope_mut(scope).swap(pos, pos + 1),
    }
    q
}

/// An agent of the happens-before analysis: a stream, or the `n`-th communication posted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Agent {
    Stream(StreamKey),
    Comm(u64),
}

/// For each agent, how many of its events come before.
type Clock = BTreeMap<Agent, u64>;

/// One event of the analysis: a statement instance that touches memory (an allocation, a
/// deallocation, a kernel or library call, a posted communication), or the caller's input
/// writes (first) and output reads (last); who performs it, the vector clock it runs at, and
/// the buffers it touches (whole allocations, numbered in allocation order) with whether it
/// writes them.
#[derive(Clone, Debug, PartialEq)]
struct Event {
    stmt: Option<StmtId>,
    agent: Agent,
    clock: Clock,
    touches: Vec<(u64, bool)>,
}

impl Event {
    /// Whether `self` is ordered before `later`.
    fn before(&self, later: &Event) -> bool {
        let mine = self.clock.get(&self.agent).copied().unwrap_or(0);
        later.clock.get(&self.agent).copied().unwrap_or(0) >= mine
    }

    /// Whether the two touch one buffer and one of them writes it.
    fn conflicts(&self, other: &Event) -> bool {
        self.touches
            .iter()
            .any(|&(b, w)| other.touches.iter().any(|&(c, v)| b == c && (w || v)))
    }
}

/// The happens-before analysis of one rank's run of a program: the program's control flow
/// and synchronization (`Synchronize`, communications and their `Wait`s) evaluated for that
/// rank, every memory-touching statement instance an event. It shares nothing with the race
/// checker but the model (docs/ARCHITECTURE.md, the executor): the caller writes the inputs
/// on the main stream first and reads the outputs there last, an allocation writes its
/// buffer on the allocating stream, a communication is an agent ordered after its posting
/// stream and before whoever waits for it.
struct HappensBefore<'p> {
    p: &'p HostProgram,
    rank: i64,
    streams: i64,
    params: &'p HashMap<String, i64>,
    bound: HashMap<ScalarId, i64>,
    current: StreamKey,
    captured: HashMap<StreamId, StreamKey>,
    clocks: HashMap<Agent, Clock>,
    posted: HashMap<StmtId, Agent>,
    comms: u64,
    /// The point-to-point communications of the open coalescing group.
    group: Option<Vec<StmtId>>,
    /// The buffer each bound tensor (or view) is part of.
    buffers: HashMap<HostTensorId, u64>,
    allocated: u64,
    events: Vec<Event>,
}

impl<'p> HappensBefore<'p> {
    fn of(
        p: &'p HostProgram,
        rank: usize,
        streams: usize,
        params: &'p HashMap<String, i64>,
    ) -> Option<Vec<Event>> {
        let mut hb = HappensBefore {
            p,
            rank: rank as i64,
            streams: streams as i64,
            params,
            bound: HashMap::new(),
            current: StreamKey::Main,
            captured: HashMap::new(),
            clocks: HashMap::new(),
            posted: HashMap::new(),
            comms: 0,
            group: None,
            buffers: HashMap::new(),
            allocated: 0,
            events: Vec::new(),
        };
        let main = Agent::Stream(StreamKey::Main);
        let inputs: Vec<_> = p.inputs.iter().map(|&t| (hb.fresh(t), true)).collect();
        hb.event(None, main, inputs);
        hb.scope(&p.top_level)?;
        let outputs: Vec<_> = p.outputs.iter().map(|&t| (hb.buffer(t), false)).collect();
        hb.event(None, main, outputs);
        Some(hb.events)
    }

    /// Binds `t` to a new buffer.
    fn fresh(&mut self, t: HostTensorId) -> u64 {
        self.allocated += 1;
        self.buffers.insert(t, self.allocated);
        self.allocated
    }

    /// The buffer `t` is part of; a write into an unbound tensor binds a new one.
    fn buffer(&mut self, t: HostTensorId) -> u64 {
        match self.buffers.get(&t) {
            Some(&b) => b,
            None => self.fresh(t),
        }
    }

    /// What `stmt` touches: its reads, then its writes.
    fn touches(&mut self, stmt: &Stmt) -> Vec<(u64, bool)> {
        let reads = stmt.reads().into_iter().map(|t| (t, false));
        let writes = stmt.writes().into_iter().map(|t| (t, true));
        let all: Vec<_> = reads.chain(writes).collect();
        all.into_iter().map(|(t, w)| (self.buffer(t), w)).collect()
    }

    fn eval(&self, s: ScalarId) -> Option<i64> {
        match self.p.scalars.get(s)? {
            HostScalar::LoopIndex => self.bound.get(&s).copied(),
            HostScalar::Value(v) => v.eval(&|n: &str| match n {
                "rank" => Some(self.rank),
                "numberOfStreams" => Some(self.streams),
                _ => self.params.get(n).copied(),
            }),
            HostScalar::Binary(op, a, b) => {
                let (a, b) = (self.eval(*a)?, self.eval(*b)?);
                Scalar::binary(*op, Scalar::c(a), Scalar::c(b)).eval(&|_| None)
            }
        }
    }

    fn stream(&self, s: StreamId) -> Option<StreamKey> {
        match self.p.streams.get(s)? {
            Stream::Captured => self.captured.get(&s).copied(),
            Stream::Indexed(i) => usize::try_from(self.eval(*i)?).ok().map(StreamKey::Pool),
        }
    }

    /// `agent` does something: its own component advances, and the event is recorded.
    fn event(&mut self, stmt: Option<StmtId>, agent: Agent, touches: Vec<(u64, bool)>) {
        let clock = self.clocks.entry(agent).or_default();
        *clock.entry(agent).or_insert(0) += 1;
        let clock = clock.clone();
        self.events.push(Event {
            stmt,
            agent,
            clock,
            touches,
        });
    }

    fn join(&mut self, waiter: Agent, waited: Agent) {
        let other = self.clocks.get(&waited).cloned().unwrap_or_default();
        let mine = self.clocks.entry(waiter).or_default();
        for (a, t) in other {
            let e = mine.entry(a).or_insert(0);
            *e = (*e).max(t);
        }
    }

    /// Posts the communications `parts` as one agent that a `Wait` on `stmt` joins.
    fn post(&mut self, stmt: StmtId, parts: &[StmtId]) -> Option<()> {
        self.comms += 1;
        let agent = Agent::Comm(self.comms);
        let clock = self
            .clocks
            .get(&Agent::Stream(self.current))
            .cloned()
            .unwrap_or_default();
        self.clocks.insert(agent, clock);
        self.posted.insert(stmt, agent);
        let mut touches = Vec::new();
        for &part in parts {
            let s = self.p.stmts.get(part)?;
            touches.extend(self.touches(s));
        }
        self.event(Some(stmt), agent, touches);
        Some(())
    }

    fn scope(&mut self, body: &[StmtId]) -> Option<()> {
        for &id in body {
            let here = Agent::Stream(self.current);
            let stmt = self.p.stmts.get(id)?;
            match stmt {
                Stmt::Allocate { tensor, .. } => {
                    let b = self.fresh(*tensor);
                    self.event(Some(id), here, vec![(b, true)]);
                }
                Stmt::Deallocate { tensor } => {
                    let b = self.buffer(*tensor);
                    self.event(Some(id), here, vec![(b, true)]);
                }
                Stmt::LaunchKernel { .. } | Stmt::Matmul { .. } | Stmt::Linear { .. } => {
                    let touches = self.touches(stmt);
                    self.event(Some(id), here, touches);
                }
                Stmt::ShardByStream { input, output, .. } => {
                    let b = self.buffer(*input);
                    self.buffers.insert(*output, b);
                }
                Stmt::ForLoop {
                    index,
                    start,
                    stop,
                    body,
                } => {
                    let (a, b) = (self.eval(*start)?, self.eval(*stop)?);
                    for i in a..b {
                        self.bound.insert(*index, i);
                        self.scope(body)?;
                    }
                    self.bound.remove(index);
                }
                Stmt::GetCurrentStream { out } => {
                    self.captured.insert(*out, self.current);
                }
                Stmt::SetCurrentStream { stream } => self.current = self.stream(*stream)?,
                Stmt::Synchronize { stream } => {
                    let waited = Agent::Stream(self.stream(*stream)?);
                    self.join(here, waited);
                }
                Stmt::Communication(c) => {
                    if c.team_of(self.rank).is_some() {
                        self.post(id, &[id])?;
                    }
                }
                Stmt::P2PCommunication(_) => match self.group.as_mut() {
                    Some(g) => g.push(id),
                    None => self.post(id, &[id])?,
                },
                Stmt::StartCoalescing => self.group = Some(Vec::new()),
                Stmt::EndCoalescing => {
                    let parts = self.group.take().unwrap_or_default();
                    self.post(id, &parts)?;
                }
                Stmt::Wait { comm } => {
                    if let Some(&agent) = self.posted.get(comm) {
                        self.join(here, agent);
                    }
                }
            }
        }
        Some(())
    }
}

/// Why a mutant that runs without a race is redundant, decided by [`HappensBefore`] on every
/// rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Redundancy {
    /// Every event keeps its clock: the removed ordering is implied by the synchronization
    /// left.
    Implied,
    /// Some events lose an ordering, but no two of them touch one buffer with one writing
    /// (whole buffers, coarser than the race checker's regions): what the removed
    /// synchronization ordered needs no order.
    Unneeded,
}

/// Whether `mutant` keeps every ordering of `original` (or every ordering between two
/// accesses of one buffer, one of them a write) on every rank.
fn redundancy(
    original: &HostProgram,
    mutant: &HostProgram,
    ranks: usize,
    streams: usize,
    params: &HashMap<String, i64>,
) -> Option<Redundancy> {
    let mut result = Redundancy::Implied;
    for r in 0..ranks {
        let a = HappensBefore::of(original, r, streams, params)?;
        let b = HappensBefore::of(mutant, r, streams, params)?;
        if a == b {
            continue;
        }
        // The mutant issues the same statements in the same order; only clocks may differ.
        let same_events = a.len() == b.len()
            && a.iter()
                .zip(&b)
                .all(|(x, y)| x.stmt == y.stmt && x.agent == y.agent && x.touches == y.touches);
        if !same_events {
            return None;
        }
        for j in 0..a.len() {
            for i in 0..j {
                if a[i].conflicts(&a[j]) && a[i].before(&a[j]) && !b[i].before(&b[j]) {
                    return None;
                }
            }
        }
        result = Redundancy::Unneeded;
    }
    Some(result)
}

/// What happened to one mutant.
enum Fate {
    /// Refused by the verifier (and whether the race checker, run anyway, also reported).
    Verifier(String, bool),
    RunError(String),
    /// A race report (and whether the outputs differed from the original's: a race that
    /// really happened on the CPU).
    Race(String, bool),
    /// No race, and the analysis shows why none can be.
    Redundant(Redundancy),
    /// No race and not redundant: a miss (with whether the outputs differed from the
    /// original's).
    Survived(bool),
}

/// The stream pool sizes every scenario runs with: more chunks than streams, and one pool
/// stream that every iteration reuses.
const STREAMS: [usize; 2] = [2, 1];

fn options(ranks: usize, streams: usize) -> RunOptions {
    RunOptions {
        target: Target::Cpu { ranks },
        streams,
        check_races: true,
        timeouts: streamweave::Timeouts::all(Duration::from_secs(10)),
        // The caller's stream is slow: a worker that does not wait for it runs ahead.
        cpu: streamweave::CpuRunOptions {
            delays: vec![(StreamKey::Main, Duration::from_micros(300))],
        },
        ..RunOptions::default()
    }
}

/// What a run left: the outputs of every rank and the first race reported.
type Ran = (Vec<Vec<Dense>>, Option<String>);

/// Runs `program` on every rank.
fn run(
    program: &HostProgram,
    exe: &Executable,
    per_rank: &[Vec<Dense>],
    streams: usize,
) -> Result<Ran, String> {
    let opts = options(per_rank.len(), streams);
    let config = exe.config(&opts);
    let (runs, _) = streamweave::run::run_local(program, &config, per_rank.to_vec(), &opts)
        .map_err(|e| e.to_string())?;
    let race = runs
        .iter()
        .flat_map(|r| r.races.iter())
        .next()
        .map(ToString::to_string);
    Ok((runs.into_iter().map(|r| r.outputs).collect(), race))
}

/// A scenario lowered and run cleanly: its executable, ranks, inputs and outputs.
struct Baseline {
    what: String,
    exe: Executable,
    per_rank: Vec<Vec<Dense>>,
    outputs: Vec<Vec<Dense>>,
}

/// The first configuration of the scenario at `path` that loads, compiles and runs without
/// a race.
fn baseline(path: &std::path::Path, streams: usize) -> Option<Baseline> {
    let source = std::fs::read_to_string(path).ok()?;
    let names = params(&source);
    let has = |p: &str| names.iter().any(|n| n == p);
    let ss: &[i64] = if has("s") { &[3, 2, 4, 1] } else { &[0] };
    let meshes: Vec<Vec<(&str, i64)>> = if has("d") {
        vec![vec![("d", 2)], vec![("d", 1)]]
    } else if has("dy") && has("dx") {
        vec![vec![("dy", 2), ("dx", 2)], vec![("dy", 1), ("dx", 2)]]
    } else {
        vec![Vec::new()]
    };
    for &s in ss {
        for mesh in &meshes {
            let mut set: Vec<(String, i64)> =
                mesh.iter().map(|(k, v)| (k.to_string(), *v)).collect();
            if s > 0 {
                set.push(("s".into(), s));
            }
            if has("t") {
                set.push(("t".into(), 10));
            }
            if has("h") {
                set.push(("h".into(), 3));
            }
            let ranks = if mesh.is_empty() {
                fixed_ranks(&source)
            } else {
                mesh.iter().map(|(_, v)| *v as usize).product()
            };
            let Ok(fusion) = streamweave::load_file(path, &set) else {
                continue;
            };
            // Every stream loop kept: a loop that only launches kernels is synchronization
            // to break too (on small chunks the default runs it once, `merge-kernel-chunks`).
            let compiler =
                Compiler::new().pipeline(Pipeline::standard().without("merge-kernel-chunks"));
            let Ok(exe) = compiler.compile(&fusion) else {
                continue;
            };
            let globals = exe.random_inputs(7).unwrap();
            let Ok(per_rank) = (0..ranks)
                .map(|r| exe.shard_inputs(&globals, r))
                .collect::<Result<Vec<_>, _>>()
            else {
                continue;
            };
            let Ok((outputs, None)) = run(exe.program(), &exe, &per_rank, streams) else {
                continue;
            };
            let shape: Vec<String> = set.iter().map(|(k, v)| format!("{k}={v}")).collect();
            return Some(Baseline {
                what: format!("{} ranks={ranks} streams={streams}", shape.join(" ")),
                exe,
                per_rank,
                outputs,
            });
        }
    }
    None
}

fn same(a: &[Vec<Dense>], b: &[Vec<Dense>]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.len() == y.len()
                && x.iter().zip(y).all(|(u, v)| {
                    u.sizes == v.sizes
                        && u.data.len() == v.data.len()
                        && u.data
                            .iter()
                            .zip(&v.data)
                            .all(|(p, q)| p == q || (p.is_nan() && q.is_nan()))
                })
        })
}

#[test]
fn every_broken_synchronization_of_every_scenario_is_caught_or_redundant() {
    let mut log = String::new();
    let mut unlowered = Vec::new();
    let (mut total, mut by_verifier, mut by_run, mut by_race, mut redundant) = (0, 0, 0, 0, 0);
    let mut verifier_and_race = 0;
    let mut survivors = Vec::new();
    let mut redundant_list = Vec::new();
    let mut disagreements = Vec::new();
    let mut real_races = 0;
    let (mut scenarios, mut with_sync) = (0, 0);
    for (path, streams) in fixtures()
        .into_iter()
        .flat_map(|p| STREAMS.map(|s| (p.clone(), s)))
    {
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        let Some(base) = baseline(&path, streams) else {
            unlowered.push(format!("{name} streams={streams}"));
            continue;
        };
        let program = base.exe.program();
        let ranks = base.per_rank.len();
        let params: HashMap<String, i64> = base.exe.config(&options(ranks, streams)).params;
        let mutations = mutations(program);
        scenarios += 1;
        with_sync += usize::from(!mutations.is_empty());
        for (m, what) in mutations {
            total += 1;
            let mutant = apply(program, &m);
            let verified = streamweave::host_ir::verify(&mutant);
            let ran = run(&mutant, &base.exe, &base.per_rank, streams);
            let fate = match (verified, ran) {
                (Err(d), ran) => Fate::Verifier(d.message, matches!(ran, Ok((_, Some(_))))),
                (Ok(()), Err(e)) => Fate::RunError(e),
                (Ok(()), Ok((outputs, Some(race)))) => {
                    // The two analyses agree: a race the checker reports is an ordering of
                    // one buffer's accesses that the mutant lost.
                    if redundancy(program, &mutant, ranks, streams, &params).is_some() {
                        disagreements.push(format!("{name}: {what}: {race}"));
                    }
                    Fate::Race(race, !same(&outputs, &base.outputs))
                }
                (Ok(()), Ok((outputs, None))) => {
                    let differs = !same(&outputs, &base.outputs);
                    match redundancy(program, &mutant, ranks, streams, &params) {
                        Some(why) if !differs => Fate::Redundant(why),
                        _ => Fate::Survived(differs),
                    }
                }
            };
            let head = format!("{name} ({}): {what}", base.what);
            match fate {
                Fate::Verifier(msg, race) => {
                    by_verifier += 1;
                    verifier_and_race += usize::from(race);
                    let also = if race {
                        " (the checker reports a race too)"
                    } else {
                        ""
                    };
                    let _ = writeln!(log, "KILLED  verifier{also}  {head}: {msg}");
                }
                Fate::RunError(e) => {
                    by_run += 1;
                    let _ = writeln!(log, "KILLED  run error  {head}: {e}");
                }
                Fate::Race(r, real) => {
                    by_race += 1;
                    real_races += usize::from(real);
                    let real = if real { " (wrong outputs)" } else { "" };
                    let _ = writeln!(log, "KILLED  race{real}  {head}: {r}");
                }
                Fate::Redundant(why) => {
                    redundant += 1;
                    let why = match why {
                        Redundancy::Implied => {
                            "every event of every rank keeps its happens-before clock: the \
                             removed ordering is implied by the synchronization left"
                        }
                        Redundancy::Unneeded => {
                            "every two accesses of one buffer (one a write) that the original \
                             orders stay ordered: what the removed synchronization ordered \
                             touches different buffers"
                        }
                    };
                    let _ = writeln!(log, "REDUNDANT  {head}: {why}");
                    redundant_list.push(format!("{head}: {why}"));
                }
                Fate::Survived(differs) => {
                    let d = if differs {
                        "; the outputs differ from the original's"
                    } else {
                        ""
                    };
                    let _ = writeln!(log, "SURVIVED  {head}{d}");
                    survivors.push(format!("{head}{d}"));
                }
            }
        }
    }
    let killed = by_verifier + by_run + by_race;
    eprintln!("{log}");
    eprintln!(
        "{scenarios} lowered programs (every scenario with {STREAMS:?} pool streams), \
         {with_sync} of them with synchronization to break"
    );
    eprintln!(
        "mutation score: {killed} killed of {total} mutants ({by_race} by a race report — {real_races} of them with \
         outputs that differ from the original's on the CPU with the main stream slowed — \
         {by_verifier} by the verifier — {verifier_and_race} of them also by a race report — \
         {by_run} by a run error); {redundant} redundant (shown by the happens-before \
         analysis); {} survived",
        survivors.len()
    );
    for r in &redundant_list {
        eprintln!("  redundant: {r}");
    }
    assert!(unlowered.is_empty(), "not lowered and run: {unlowered:?}");
    // 116 programs, 110 with synchronization, and 444 mutants when this was written: fewer
    // would mean that the scenarios or the mutations quietly shrank.
    assert!(
        scenarios >= 116 && with_sync >= 110 && total >= 444,
        "only {total} mutants of {with_sync} programs with synchronization ({scenarios} in all)"
    );
    assert!(
        disagreements.is_empty(),
        "races in mutants that the happens-before analysis calls redundant:\n{}",
        disagreements.join("\n")
    );
    assert!(
        survivors.is_empty(),
        "mutants neither caught nor redundant:\n{}",
        survivors.join("\n")
    );
}

/// The host program `host` followed by its kernel `K0`, a copy of an `f32[4]`.
fn with_copy_kernel(host: &str) -> String {
    format!(
        "{host}K0: fusion copy() {{
  tensor a: f32[4]
  b = set(a)
  output b
}}
"
    )
}

/// The analysis that decides redundancy, on programs small enough to check by hand: a
/// worker forks from the main stream twice in a row, so either `Synchronize` alone gives the
/// same ordering, but deleting both (or the join) loses an ordering the buffers need; a
/// worker that only touches its own buffer needs no join before the main stream allocates
/// another one, but does before the caller reads the output.
#[test]
fn the_happens_before_analysis_finds_an_implied_synchronization_and_only_that() {
    let src = with_copy_kernel(
        "\
%HostIrContainer { (T0_g_f32[4]) -> (T1_g_f32[4]) :
  Stream 0 = GetCurrentStream()
  T1 = ALLOCATE(mem_type=global, zero_init=false)
  SetCurrentStream(Stream ( 0 ))
  Synchronize(Stream 0)
  Synchronize(Stream 0)
  LaunchKernel(kernel=K0, inputs=(T0), outputs=(T1))
  SetCurrentStream(Stream 0)
  Synchronize(Stream ( 0 ))
} // %HostIrContainer
",
    );
    let p = streamweave::host_ir::parse(&src).unwrap_or_else(|e| panic!("{e}"));
    let params = HashMap::new();
    let syncs = top_level_syncs(&p);
    assert_eq!(syncs.len(), 3);
    let without = |ids: &[StmtId]| without_stmts(&p, ids);
    let why = |q: &HostProgram| redundancy(&p, q, 1, 2, &params);
    assert_eq!(
        why(&p),
        Some(Redundancy::Implied),
        "a program implies itself"
    );
    assert_eq!(why(&without(&syncs[..1])), Some(Redundancy::Implied));
    assert_eq!(why(&without(&syncs[1..2])), Some(Redundancy::Implied));
    assert_eq!(
        why(&without(&syncs[..2])),
        None,
        "without both forks the kernel is no longer after the allocation of T1"
    );
    assert_eq!(
        why(&without(&syncs[2..])),
        None,
        "without the join the caller's read of T1 is no longer after the kernel"
    );
    let mutants = mutations(&p);
    assert_eq!(
        mutants.iter().map(|(_, w)| w.as_str()).collect::<Vec<_>>(),
        vec![
            "swap `SetCurrentStream(Stream ( 0 ))` and the `Synchronize` after it",
            "delete `Synchronize(Stream 0)`",
            "delete `Synchronize(Stream 0)`",
            "swap `SetCurrentStream(Stream 0)` and the `Synchronize` after it",
            "delete `Synchronize(Stream ( 0 ))`",
        ]
    );

    // Pool stream 0 fills its own T2 and joins the main stream before the main stream
    // allocates T1; only the caller's read of the output T1 could need that join, and the
    // final join gives it again.
    let src = with_copy_kernel(
        "\
%HostIrContainer { (T0_g_f32[4]) -> (T1_g_f32[4]) :
  Stream 0 = GetCurrentStream()
  SetCurrentStream(Stream ( 0 ))
  Synchronize(Stream 0)
  T2_g_f32[4] = ALLOCATE(mem_type=global, zero_init=false)
  LaunchKernel(kernel=K0, inputs=(T0), outputs=(T2))
  Deallocate(T2)
  SetCurrentStream(Stream 0)
  Synchronize(Stream ( 0 ))
  T1 = ALLOCATE(mem_type=global, zero_init=false)
  LaunchKernel(kernel=K0, inputs=(T0), outputs=(T1))
  Synchronize(Stream ( 0 ))
} // %HostIrContainer
",
    );
    let p = streamweave::host_ir::parse(&src).unwrap_or_else(|e| panic!("{e}"));
    let syncs = top_level_syncs(&p);
    let without = |s: StmtId| without_stmts(&p, &[s]);
    let why = |q: &HostProgram| redundancy(&p, q, 1, 2, &params);
    assert_eq!(
        why(&without(syncs[1])),
        Some(Redundancy::Unneeded),
        "the first join orders pool stream 0's T2 before the main stream's T1: other buffers"
    );
    assert_eq!(
        why(&without(syncs[2])),
        Some(Redundancy::Implied),
        "the last join adds nothing after the first"
    );
    assert_eq!(
        why(&without(syncs[0])),
        None,
        "the kernel reads the input T0"
    );
}

/// The `Synchronize` statements of `p`'s top level, in program order.
fn top_level_syncs(p: &HostProgram) -> Vec<StmtId> {
    p.top_level
        .iter()
        .copied()
        .filter(|s| matches!(p.stmts.get(*s), Some(Stmt::Synchronize { .. })))
        .collect()
}

/// `p` without the statements `ids`.
fn without_stmts(p: &HostProgram, ids: &[StmtId]) -> HostProgram {
    let mut q = p.clone();
    for &s in ids {
        q.remove(s);
    }
    q
}
