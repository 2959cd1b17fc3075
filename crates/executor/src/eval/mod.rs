//! The evaluator: walks a host program for one rank and issues every statement to a
//! [`Backend`] and a [`Communicator`], optionally feeding the race checker.
//!
//! Before the first statement the inputs are checked against the program's signature
//! (count, dtype, every size) and every team against the world; nothing is enqueued for a
//! program that does not fit. When anything fails on this rank, the communicator is aborted
//! so that the other ranks fail promptly instead of waiting for this one.
//!
//! By concern: this module holds the run's configuration, its results and the entry points;
//! `check` checks inputs against the signature and evaluates scalars; `evaluator` walks the
//! program and issues each statement; `stmts` holds the handlers of the statements that take
//! more than a line (allocations, loops, views, communications and waits).

mod check;
mod evaluator;
mod produce;
mod stmts;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use weave_comm::{Communicator, P2p};
use weave_host_ir::ids::SecondaryMap;
use weave_host_ir::KernelId;
use weave_host_ir::{HostProgram, HostTensorId, Stmt, StmtId, StreamId};
use weave_ir::{DType, Fusion};

use crate::backend::{Backend, Span, StreamKey};
use crate::dense::Dense;
use crate::error::ExecError;
use crate::race::{Agent, RaceChecker, RaceReport};

pub use check::check_inputs;
use check::{check_signature, LazyNames, Scalars};
pub use produce::producers;

/// The most iterations one `ForLoop` may run. Loops walk stream chunks, and a program
/// asking for more than this is a mistaken chunk count, not a schedule worth running (a
/// 4-billion-chunk loop would run for hours).
pub const MAX_TRIP_COUNT: i64 = 1 << 16;

/// How one rank runs a program.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Values of the fusion's parameters that sizes mention (`t`, `h`, …).
    pub params: HashMap<String, i64>,
    /// The size of the stream pool: `numberOfStreams`.
    pub number_of_streams: usize,
    /// Whether to run the race checker.
    pub check_races: bool,
    /// When the whole run must be over: a rank still issuing statements then stops with a
    /// timeout naming the statement it was at (and aborts its communicator, so its peers stop
    /// too). Every wait is bounded on its own; this bounds the loops between waits. `None`:
    /// no bound.
    pub deadline: Option<Deadline>,
}

/// The end of a run's time budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadline {
    /// When the budget is spent.
    pub at: Instant,
    /// The budget (for messages).
    pub budget: Duration,
}

impl Deadline {
    /// A budget of `budget` from now; `None` when the end is past what an instant can hold.
    pub fn after(budget: Duration) -> Option<Deadline> {
        Instant::now()
            .checked_add(budget)
            .map(|at| Deadline { at, budget })
    }
}

impl Default for RunConfig {
    fn default() -> RunConfig {
        RunConfig {
            params: HashMap::new(),
            number_of_streams: 2,
            check_races: true,
            deadline: None,
        }
    }
}

/// What one rank's run produced (the default: nothing, no time, the main stream).
#[derive(Clone, Debug, Default)]
pub struct RankRun {
    /// The program's outputs, in signature order.
    pub outputs: Vec<Dense>,
    /// The races found (empty when the checker was off).
    pub races: Vec<RaceReport>,
    /// Device spans, when the backend traced.
    pub spans: Vec<Span>,
    /// Host time spent issuing statements.
    pub issue_time: Duration,
    /// Wall time from the first statement until every stream was idle.
    pub wall_time: Duration,
    /// Statements issued (a loop body counts once per iteration).
    pub statements: usize,
    /// Wall times of timed repetitions run before this one, each from the first statement
    /// until every stream was idle (filled by callers that time repetitions, like `weave run
    /// --iters`; empty otherwise).
    pub timed: Vec<Duration>,
    /// Whether the timed repetitions were replays of one run captured as a CUDA graph
    /// ([`Replay`](crate::cuda::Replay)) rather than runs issued statement by statement.
    pub replayed: bool,
    /// The current stream after the last statement.
    pub final_stream: StreamKey,
    /// Every stream the run created.
    pub streams: Vec<StreamKey>,
    /// Buffers made by `Allocate` still alive when the run ended, outputs included.
    pub live_allocations: usize,
}

/// Runs `program` as rank `comm.rank()` of `comm.size()` on `backend`.
pub fn run_rank<B, C>(
    program: &HostProgram,
    backend: &B,
    comm: &C,
    inputs: &[Dense],
    config: &RunConfig,
) -> Result<RankRun, ExecError>
where
    B: Backend,
    C: Communicator<Buffer = B::Buffer, Stream = B::CommStream>,
{
    let span = run_span(program, comm.rank(), comm.size());
    let _entered = span.enter();
    let result = Evaluator::new(program, backend, comm, config).and_then(|mut e| e.run(inputs));
    match &result {
        Ok(run) => {
            span.record("issued", run.statements);
        }
        Err(e) => comm.abort(&e.to_string()),
    }
    result
}

/// The span of one run of `program` by `rank` of `world`: `statements` counts the program's
/// statements, `issued` (recorded at the end) those issued, a loop body once per iteration.
fn run_span(program: &HostProgram, rank: usize, world: usize) -> tracing::Span {
    tracing::debug_span!(
        "run_rank",
        rank,
        world,
        statements = program.stmts.len(),
        issued = tracing::field::Empty,
    )
}

/// What [`run_rank_buffers`] leaves: the outputs, still on the device, and the host's cost.
#[derive(Clone, Debug)]
pub struct BufferRun<T> {
    /// The program's outputs, in signature order, as device buffers.
    pub outputs: Vec<T>,
    /// Host time spent issuing statements.
    pub issue_time: Duration,
    /// Statements issued (a loop body counts once per iteration).
    pub statements: usize,
}

/// Runs `program` on inputs already on the device and returns once every statement is
/// *issued*: nothing is uploaded, downloaded or waited for, so a caller can time the device
/// work with its own events and run the program again on the same buffers (benchmarks, CUDA
/// graph capture). The race checker is not run. Errors of enqueued work surface at the
/// backend's next synchronization.
pub fn run_rank_buffers<B, C>(
    program: &HostProgram,
    backend: &B,
    comm: &C,
    inputs: &[B::Buffer],
    config: &RunConfig,
) -> Result<BufferRun<B::Buffer>, ExecError>
where
    B: Backend,
    C: Communicator<Buffer = B::Buffer, Stream = B::CommStream>,
{
    let config = RunConfig {
        check_races: false,
        ..config.clone()
    };
    issue_on_device(program, backend, comm, inputs, &config, |e| e.issue(inputs))
}

/// The common part of [`run_rank_buffers`] and [`run_rank_into`]: checks the device inputs
/// against the signature, makes the evaluator and hands it to `issue`, inside the run's span;
/// a failure aborts the communicator (so the peers stop too).
fn issue_on_device<'p, B, C, R>(
    program: &'p HostProgram,
    backend: &'p B,
    comm: &'p C,
    inputs: &[B::Buffer],
    config: &'p RunConfig,
    issue: impl FnOnce(&mut Evaluator<'p, B, C>) -> Result<R, ExecError>,
) -> Result<R, ExecError>
where
    B: Backend,
    C: Communicator<Buffer = B::Buffer, Stream = B::CommStream>,
{
    let shapes: Vec<(DType, Vec<usize>)> = inputs
        .iter()
        .map(|b| (backend.dtype(b), backend.sizes(b)))
        .collect();
    let given: Vec<(DType, &[usize])> = shapes.iter().map(|(d, s)| (*d, s.as_slice())).collect();
    let span = run_span(program, comm.rank(), comm.size());
    let _entered = span.enter();
    let result = check_signature(program, &given, config, comm.rank(), comm.size())
        .and_then(|()| Evaluator::new(program, backend, comm, config))
        .and_then(|mut e| issue(&mut e).map(|r| (r, e.statements)));
    match &result {
        Ok((_, statements)) => {
            span.record("issued", statements);
        }
        Err(e) => comm.abort(&e.to_string()),
    }
    result.map(|(r, _)| r)
}

/// What [`run_rank_into`] reports: the host's cost and the races found.
#[derive(Clone, Debug, Default)]
pub struct IntoRun {
    /// Host time spent issuing statements.
    pub issue_time: Duration,
    /// Statements issued (a loop body counts once per iteration).
    pub statements: usize,
    /// The races found (empty when the checker was off).
    pub races: Vec<RaceReport>,
}

/// Runs `program` on inputs already on the device, writing its outputs into buffers the
/// caller gave (`outputs`, in signature order, each of the output's local sizes and dtype):
/// each output's `Allocate` binds the caller's buffer instead of allocating one (zero-filling
/// it where the program asks for zeros). Returns once every statement is issued: the inputs
/// are read and the outputs written on the backend's streams, all of it ordered before the
/// main stream's end, and nothing is waited for. The race checker runs when the config asks.
///
/// An output buffer of other sizes or dtype than the program writes is an error naming the
/// output and the rank; so is an output the program never allocates.
pub fn run_rank_into<B, C>(
    program: &HostProgram,
    backend: &B,
    comm: &C,
    inputs: &[B::Buffer],
    outputs: &[B::Buffer],
    config: &RunConfig,
) -> Result<IntoRun, ExecError>
where
    B: Backend,
    C: Communicator<Buffer = B::Buffer, Stream = B::CommStream>,
{
    if outputs.len() != program.outputs.len() {
        let e = ExecError::Input(format!(
            "rank {}: {} output buffers were given, the program has {} outputs",
            comm.rank(),
            outputs.len(),
            program.outputs.len()
        ));
        comm.abort(&e.to_string());
        return Err(e);
    }
    issue_on_device(program, backend, comm, inputs, config, |e| {
        e.given = program
            .outputs
            .iter()
            .copied()
            .zip(outputs.iter().cloned())
            .collect();
        for (&t, b) in program.inputs.iter().zip(inputs) {
            // The caller wrote every input before the program started, ordered before the
            // main stream.
            e.record(
                Agent::Stream(StreamKey::Main),
                b,
                true,
                "<caller writes inputs>",
                t,
            );
        }
        let run = e.issue(inputs)?;
        if let Some(t) = e.given.keys().next() {
            return Err(ExecError::Program(format!(
                "output {} is never allocated by the program, so it cannot be written into the buffer given",
                e.names.tensor(t)
            )));
        }
        for (&t, b) in program.outputs.iter().zip(&run.outputs) {
            e.record(
                Agent::Stream(StreamKey::Main),
                b,
                false,
                "<caller reads outputs>",
                t,
            );
        }
        Ok(IntoRun {
            issue_time: run.issue_time,
            statements: run.statements,
            races: e
                .races
                .as_ref()
                .map(|r| r.reports().to_vec())
                .unwrap_or_default(),
        })
    })
}

struct Posted<E> {
    event: E,
    agent: Option<Agent>,
}

struct Evaluator<'p, B: Backend, C> {
    program: &'p HostProgram,
    backend: &'p B,
    comm: &'p C,
    config: &'p RunConfig,
    names: LazyNames<'p>,
    labels: Arc<SecondaryMap<StmtId, String>>,
    kernels: SecondaryMap<KernelId, Arc<Fusion>>,
    scalars: Scalars<'p>,
    tensors: SecondaryMap<HostTensorId, B::Buffer>,
    captured: SecondaryMap<StreamId, StreamKey>,
    current: StreamKey,
    posted: SecondaryMap<StmtId, Posted<B::Event>>,
    group: Option<Vec<(StmtId, P2p<B::Buffer>)>>,
    races: Option<RaceChecker>,
    statements: usize,
    /// Buffers the caller gave for outputs: their `Allocate` binds them instead of
    /// allocating ([`run_rank_into`]).
    given: SecondaryMap<HostTensorId, B::Buffer>,
    /// Linears handed to the collective they feed ([`producers`]), where the backend
    /// produces into windows: linear → collective.
    producers: SecondaryMap<StmtId, StmtId>,
    /// Such linears issued and not run yet, by the collective that will compute them.
    deferred: SecondaryMap<StmtId, produce::Deferred<B::Buffer>>,
}

/// The teams of the program's collectives, each once (every team of a communication, also
/// those a given rank is not in): what a communicator that builds one sub-communicator per
/// team must prepare, identically on every rank, before the program runs.
pub fn program_teams(program: &HostProgram) -> Vec<Vec<usize>> {
    let mut teams: Vec<Vec<usize>> = Vec::new();
    for stmt in program.stmts.values() {
        if let Stmt::Communication(c) = stmt {
            for team in &c.teams {
                let team: Vec<usize> = team.iter().map(|&d| d.max(0) as usize).collect();
                if !teams.contains(&team) {
                    teams.push(team);
                }
            }
        }
    }
    teams
}
