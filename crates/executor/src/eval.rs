//! The evaluator: walks a host program for one rank and issues every statement to a
//! [`Backend`] and a [`Communicator`], optionally feeding the race checker.
//!
//! Before the first statement the inputs are checked against the program's signature
//! (count, dtype, every size) and every team against the world; nothing is enqueued for a
//! program that does not fit. When anything fails on this rank, the communicator is aborted
//! so that the other ranks fail promptly instead of waiting for this one.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use weave_comm::{Collective, Communicator, P2p};
use weave_host_ir::access::Access;
use weave_host_ir::KernelId;
use weave_host_ir::{
    ChunkOf, Communication, HostProgram, HostScalar, HostTensorId, Names, P2PDirection, ScalarId,
    Stmt, StmtId, Stream, StreamId,
};
use weave_ir::{DType, Fusion, Scalar};

use crate::backend::{Backend, Span, StreamKey};
use crate::collective::comm_op;
use crate::dense::Dense;
use crate::error::ExecError;
use crate::race::{Agent, RaceChecker, RaceReport};

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
        if let Some(&t) = e.given.keys().next() {
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

/// Checks `inputs` against the signature of `program` for a world of `world` ranks without
/// running anything.
pub fn check_inputs(
    program: &HostProgram,
    inputs: &[Dense],
    config: &RunConfig,
    rank: usize,
    world: usize,
) -> Result<(), ExecError> {
    let given: Vec<(DType, &[usize])> = inputs
        .iter()
        .map(|d| (d.dtype, d.sizes.as_slice()))
        .collect();
    check_signature(program, &given, config, rank, world)
}

/// Checks inputs given as (dtype, sizes) against the signature of `program`.
fn check_signature(
    program: &HostProgram,
    inputs: &[(DType, &[usize])],
    config: &RunConfig,
    rank: usize,
    world: usize,
) -> Result<(), ExecError> {
    let mut names = LazyNames::new(program);
    let scalars = Scalars {
        program,
        params: &config.params,
        rank: rank as i64,
        number_of_streams: config.number_of_streams as i64,
        bound: HashMap::new(),
    };
    if inputs.len() != program.inputs.len() {
        return Err(ExecError::Input(format!(
            "the program takes {} inputs but {} were given",
            program.inputs.len(),
            inputs.len()
        )));
    }
    for (k, (&t, &(given_dtype, given_sizes))) in program.inputs.iter().zip(inputs).enumerate() {
        // Named only in a message: building the names costs more than the check.
        let name = &mut |names: &mut LazyNames| names.tensor(t);
        let decl = program.tensors.get(t).ok_or_else(|| {
            ExecError::Program(format!("input {k} is not a tensor of the program"))
        })?;
        if decl.dtype != given_dtype {
            return Err(ExecError::Input(format!(
                "input {k} ({}) must be {} but a {} tensor was given",
                name(&mut names),
                decl.dtype.name(),
                given_dtype.name()
            )));
        }
        if decl.sizes.len() != given_sizes.len() {
            return Err(ExecError::Input(format!(
                "input {k} ({}) has {} axes but the given tensor has {} (sizes {:?})",
                name(&mut names),
                decl.sizes.len(),
                given_sizes.len(),
                given_sizes
            )));
        }
        for (axis, (&s, &n)) in decl.sizes.iter().zip(given_sizes).enumerate() {
            let want = scalars.eval(s, &mut names)?;
            if want != n as i64 {
                let expr = names.scalar(program, s);
                let expr = if expr == want.to_string() {
                    String::new()
                } else {
                    format!(" = {expr}")
                };
                return Err(ExecError::Input(format!(
                    "input {k} ({}) axis {axis} must have size {want}{expr} but has {n}",
                    name(&mut names)
                )));
            }
        }
    }
    for w in program.walk() {
        if let Some(Stmt::Communication(c)) = program.stmts.get(w.stmt) {
            let devices = c.teams.iter().flatten();
            if let Some(&bad) = devices.clone().find(|&&d| d < 0 || d as usize >= world) {
                return Err(ExecError::Input(format!(
                    "`{}` needs device {bad} but only {world} rank(s) run the program",
                    names.stmt(program, w.stmt)
                )));
            }
        }
    }
    Ok(())
}

/// The program's names, built on first use: only messages need them.
struct LazyNames<'p> {
    program: &'p HostProgram,
    names: Option<Names>,
}

impl<'p> LazyNames<'p> {
    fn new(program: &'p HostProgram) -> LazyNames<'p> {
        LazyNames {
            program,
            names: None,
        }
    }

    fn get(&mut self) -> &mut Names {
        let program = self.program;
        self.names.get_or_insert_with(|| Names::of(program))
    }

    fn tensor(&mut self, t: HostTensorId) -> String {
        self.get().tensor(t)
    }

    fn scalar(&mut self, program: &HostProgram, s: ScalarId) -> String {
        self.get().scalar(program, s)
    }

    fn stmt(&mut self, program: &HostProgram, s: StmtId) -> String {
        self.get().stmt(program, s)
    }
}

/// Scalar evaluation with the bindings current at a point of the walk.
struct Scalars<'p> {
    program: &'p HostProgram,
    params: &'p HashMap<String, i64>,
    rank: i64,
    number_of_streams: i64,
    bound: HashMap<ScalarId, i64>,
}

impl Scalars<'_> {
    fn eval(&self, s: ScalarId, names: &mut LazyNames) -> Result<i64, ExecError> {
        self.eval_depth(s, names, 0)
    }

    fn eval_depth(
        &self,
        s: ScalarId,
        names: &mut LazyNames,
        depth: usize,
    ) -> Result<i64, ExecError> {
        let fail = |names: &mut LazyNames, why: &str| {
            ExecError::Program(format!(
                "cannot evaluate `{}`: {why}",
                names.scalar(self.program, s)
            ))
        };
        if depth > 256 {
            return Err(fail(names, "the expression is cyclic"));
        }
        match self.program.scalars.get(s) {
            None => Err(fail(names, "not a scalar of the program")),
            Some(HostScalar::LoopIndex) => match self.bound.get(&s) {
                Some(&v) => Ok(v),
                None => Err(fail(names, "the loop index is read outside its loop")),
            },
            Some(HostScalar::Value(v)) => {
                let lookup = |n: &str| match n {
                    weave_ir::RANK => Some(self.rank),
                    weave_ir::NUMBER_OF_STREAMS => Some(self.number_of_streams),
                    _ => self.params.get(n).copied(),
                };
                match v.eval(&lookup) {
                    Some(x) => Ok(x),
                    None => {
                        let missing: Vec<String> = v
                            .symbols()
                            .iter()
                            .filter(|n| lookup(n).is_none())
                            .map(|n| n.to_string())
                            .collect();
                        if missing.is_empty() {
                            Err(fail(names, "division by zero or overflow"))
                        } else {
                            Err(fail(names, &format!("no value for {}", missing.join(", "))))
                        }
                    }
                }
            }
            Some(HostScalar::Binary(op, a, b)) => {
                let a = self.eval_depth(*a, names, depth + 1)?;
                let b = self.eval_depth(*b, names, depth + 1)?;
                Scalar::binary(*op, Scalar::c(a), Scalar::c(b))
                    .eval(&|_| None)
                    .ok_or_else(|| fail(names, "division by zero or overflow"))
            }
        }
    }
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
    labels: Arc<HashMap<StmtId, String>>,
    kernels: HashMap<KernelId, Arc<Fusion>>,
    scalars: Scalars<'p>,
    tensors: HashMap<HostTensorId, B::Buffer>,
    captured: HashMap<StreamId, StreamKey>,
    current: StreamKey,
    posted: HashMap<StmtId, Posted<B::Event>>,
    group: Option<Vec<(StmtId, P2p<B::Buffer>)>>,
    races: Option<RaceChecker>,
    statements: usize,
    /// Buffers the caller gave for outputs: their `Allocate` binds them instead of
    /// allocating ([`run_rank_into`]).
    given: HashMap<HostTensorId, B::Buffer>,
}

impl<'p, B, C> Evaluator<'p, B, C>
where
    B: Backend,
    C: Communicator<Buffer = B::Buffer, Stream = B::CommStream>,
{
    fn new(
        program: &'p HostProgram,
        backend: &'p B,
        comm: &'p C,
        config: &'p RunConfig,
    ) -> Result<Self, ExecError> {
        if config.number_of_streams == 0 {
            return Err(ExecError::Input(
                "numberOfStreams must be at least 1".into(),
            ));
        }
        let names = LazyNames::new(program);
        let labels = program.statement_labels();
        // A kernel whose ops depend on the device running it (a vocabulary-parallel lookup's
        // first row, a size over `rank`) gets this rank's copy.
        let rank = comm.rank() as i64;
        let kernels = program
            .kernels
            .iter()
            .map(|(k, unit)| {
                let fusion = match crate::interp::bind_rank(&unit.fusion, rank) {
                    Some(bound) => Arc::new(bound),
                    None => unit.fusion.clone(),
                };
                (k, fusion)
            })
            .collect();
        Ok(Evaluator {
            program,
            backend,
            comm,
            config,
            names,
            labels,
            kernels,
            scalars: Scalars {
                program,
                params: &config.params,
                rank: comm.rank() as i64,
                number_of_streams: config.number_of_streams as i64,
                bound: HashMap::new(),
            },
            tensors: HashMap::new(),
            captured: HashMap::new(),
            current: StreamKey::Main,
            posted: HashMap::new(),
            group: None,
            races: config.check_races.then(RaceChecker::new),
            statements: 0,
            given: HashMap::new(),
        })
    }

    fn run(&mut self, inputs: &[Dense]) -> Result<RankRun, ExecError> {
        check_inputs(
            self.program,
            inputs,
            self.config,
            self.comm.rank(),
            self.comm.size(),
        )?;
        for (&t, data) in self.program.inputs.iter().zip(inputs) {
            let buffer = match self.backend.upload(data) {
                Ok(b) => b,
                Err(ExecError::Compute { message, .. }) => {
                    return Err(ExecError::Input(format!(
                        "input {} on rank {}: {message}",
                        self.names.tensor(t),
                        self.comm.rank()
                    )))
                }
                Err(e) => return Err(e),
            };
            // The caller wrote every input on its own stream before the program started (the
            // CUDA backend uploads on the main stream): a pool stream reads one only after
            // synchronizing with the main stream.
            self.record(
                Agent::Stream(StreamKey::Main),
                &buffer,
                true,
                "<caller writes inputs>",
                t,
            );
            self.tensors.insert(t, buffer);
        }
        let start = Instant::now();
        let top = self.program.top_level.clone();
        self.exec_scope(&top)?;
        let issue_time = start.elapsed();
        if self.group.is_some() {
            return Err(ExecError::Program(
                "the program ends inside a coalescing group (StartCoalescing without EndCoalescing)".into(),
            ));
        }
        // The caller reads the outputs on its own stream.
        let main = self.backend.stream(StreamKey::Main)?;
        let mut outputs = Vec::new();
        for &t in &self.program.outputs.clone() {
            let buffer = self.buffer(t, "the end of the program")?;
            self.record(
                Agent::Stream(StreamKey::Main),
                &buffer,
                false,
                "<caller reads outputs>",
                t,
            );
            outputs.push(self.backend.download(&buffer, &main)?);
        }
        self.backend.synchronize()?;
        let mut bound: Vec<_> = self.tensors.drain().collect();
        bound.retain(|(t, _)| self.program.outputs.contains(t));
        let live_allocations = self.backend.live_allocations();
        drop(bound);
        Ok(RankRun {
            final_stream: self.current,
            streams: self.backend.streams(),
            live_allocations,
            outputs,
            races: self
                .races
                .as_ref()
                .map(|r| r.reports().to_vec())
                .unwrap_or_default(),
            spans: self.backend.spans(),
            issue_time,
            wall_time: start.elapsed(),
            statements: self.statements,
            timed: Vec::new(),
            replayed: false,
        })
    }

    /// Binds `inputs` and issues every statement; no download, no synchronization.
    fn issue(&mut self, inputs: &[B::Buffer]) -> Result<BufferRun<B::Buffer>, ExecError> {
        for (&t, b) in self.program.inputs.iter().zip(inputs) {
            self.tensors.insert(t, b.clone());
        }
        let start = Instant::now();
        let top = self.program.top_level.clone();
        self.exec_scope(&top)?;
        let issue_time = start.elapsed();
        if self.group.is_some() {
            return Err(ExecError::Program(
                "the program ends inside a coalescing group (StartCoalescing without EndCoalescing)".into(),
            ));
        }
        let mut outputs = Vec::new();
        for &t in &self.program.outputs.clone() {
            outputs.push(self.buffer(t, "the end of the program")?);
        }
        Ok(BufferRun {
            outputs,
            issue_time,
            statements: self.statements,
        })
    }

    fn label(&self, s: StmtId) -> String {
        self.labels
            .get(&s)
            .cloned()
            .unwrap_or_else(|| "<statement>".into())
    }

    fn buffer(&mut self, t: HostTensorId, at: &str) -> Result<B::Buffer, ExecError> {
        match self.tensors.get(&t) {
            Some(b) => Ok(b.clone()),
            None => Err(ExecError::Program(format!(
                "`{at}` reads {}, which is not bound here",
                self.names.tensor(t)
            ))),
        }
    }

    fn eval(&mut self, s: ScalarId) -> Result<i64, ExecError> {
        self.scalars.eval(s, &mut self.names)
    }

    fn stream_key(&mut self, s: StreamId, at: &str) -> Result<StreamKey, ExecError> {
        match self.program.streams.get(s) {
            Some(Stream::Captured) => self.captured.get(&s).copied().ok_or_else(|| {
                ExecError::Program(format!("`{at}` uses a stream before it is captured"))
            }),
            Some(Stream::Indexed(i)) => {
                let n = self.eval(*i)?;
                usize::try_from(n).map(StreamKey::Pool).map_err(|_| {
                    ExecError::Program(format!("`{at}`: stream index {n} is negative"))
                })
            }
            None => Err(ExecError::Program(format!(
                "`{at}` names an unknown stream"
            ))),
        }
    }

    fn record(
        &mut self,
        agent: Agent,
        buffer: &B::Buffer,
        write: bool,
        stmt: &str,
        t: HostTensorId,
    ) {
        if self.races.is_some() {
            let region = self.backend.region(buffer);
            let tensor = self.names.tensor(t);
            if let Some(r) = self.races.as_mut() {
                r.access(agent, region, write, stmt, &tensor);
            }
        }
    }

    fn exec_scope(&mut self, body: &[StmtId]) -> Result<(), ExecError> {
        for &s in body {
            self.exec(s)?;
        }
        Ok(())
    }

    /// Issues one statement: counts it, checks the deadline, and hands it to the handler of
    /// its kind.
    fn exec(&mut self, id: StmtId) -> Result<(), ExecError> {
        let Some(stmt) = self.program.stmts.get(id) else {
            return Err(ExecError::Program(
                "a scope names a missing statement".into(),
            ));
        };
        self.statements += 1;
        if let Some(deadline) = self.config.deadline {
            if Instant::now() >= deadline.at {
                return Err(ExecError::Timeout {
                    what: format!(
                        "rank {}: the whole run, at `{}` after {} statements",
                        self.comm.rank(),
                        self.label(id),
                        self.statements - 1
                    ),
                    millis: u64::try_from(deadline.budget.as_millis()).unwrap_or(u64::MAX),
                });
            }
        }
        let label = self.label(id);
        let _span = tracing::trace_span!("statement", label = %label).entered();
        match stmt {
            Stmt::Allocate { tensor, zero_init } => {
                self.allocate(id, &label, *tensor, *zero_init)?;
            }
            Stmt::Deallocate { tensor } => {
                let buffer = self.buffer(*tensor, &label)?;
                self.record_effects(Agent::Stream(self.current), id, &label);
                self.tensors.remove(tensor);
                let stream = self.backend.stream(self.current)?;
                self.backend.deallocate(buffer, &stream);
            }
            Stmt::ForLoop {
                index,
                start,
                stop,
                body,
            } => self.for_loop(&label, *index, (*start, *stop), body)?,
            Stmt::GetCurrentStream { out } => {
                self.captured.insert(*out, self.current);
            }
            Stmt::SetCurrentStream { stream } => {
                self.current = self.stream_key(*stream, &label)?;
                self.backend.stream(self.current)?;
            }
            Stmt::Synchronize { stream } => self.synchronize(&label, *stream)?,
            Stmt::ShardByStream {
                input,
                axis,
                chunks,
                index,
                holds,
                output,
            } => {
                let view = self.chunk_view(&label, *input, *axis, (*chunks, *index), *holds)?;
                self.tensors.insert(*output, view);
            }
            Stmt::LaunchKernel {
                kernel,
                inputs,
                outputs,
            } => {
                let fusion = self.kernels.get(kernel).cloned().ok_or_else(|| {
                    ExecError::Program(format!("`{label}` launches an unknown kernel"))
                })?;
                let ins = self.buffers(inputs, &label)?;
                let outs = self.buffers(outputs, &label)?;
                self.record_effects(Agent::Stream(self.current), id, &label);
                let stream = self.backend.stream(self.current)?;
                self.backend
                    .launch_kernel(&label, *kernel, &fusion, &ins, &outs, &stream)?;
            }
            Stmt::Matmul {
                a,
                b,
                out,
                accumulate,
            } => {
                let (x, y, o) = (
                    self.buffer(*a, &label)?,
                    self.buffer(*b, &label)?,
                    self.buffer(*out, &label)?,
                );
                self.record_effects(Agent::Stream(self.current), id, &label);
                let stream = self.backend.stream(self.current)?;
                self.backend
                    .matmul(&label, &x, &y, &o, *accumulate, &stream)?;
            }
            Stmt::Linear {
                input,
                weight,
                bias,
                out,
            } => {
                let x = self.buffer(*input, &label)?;
                let w = self.buffer(*weight, &label)?;
                let bb = match bias {
                    Some(t) => Some(self.buffer(*t, &label)?),
                    None => None,
                };
                let o = self.buffer(*out, &label)?;
                self.record_effects(Agent::Stream(self.current), id, &label);
                let stream = self.backend.stream(self.current)?;
                self.backend
                    .linear(&label, &x, &w, bb.as_ref(), &o, &stream)?;
            }
            Stmt::Communication(c) => self.communication(id, label, c)?,
            Stmt::P2PCommunication(p) => {
                let buffer = self.buffer(p.buffer, &label)?;
                let peer = self.eval(p.peer)?;
                let peer = usize::try_from(peer)
                    .ok()
                    .filter(|&v| v < self.comm.size())
                    .ok_or_else(|| {
                        ExecError::Program(format!(
                            "`{label}`: peer {peer} is not a rank of a world of {}",
                            self.comm.size()
                        ))
                    })?;
                let op = match p.direction {
                    P2PDirection::Send => P2p::Send { peer, buffer },
                    P2PDirection::Recv => P2p::Recv { peer, buffer },
                };
                match self.group.as_mut() {
                    Some(g) => g.push((id, op)),
                    None => self.post_p2p(id, label, vec![(id, op)])?,
                }
            }
            Stmt::StartCoalescing => {
                if self.group.is_some() {
                    return Err(ExecError::Program(format!(
                        "`{label}`: coalescing groups do not nest"
                    )));
                }
                self.group = Some(Vec::new());
            }
            Stmt::EndCoalescing => {
                let ops = self.group.take().ok_or_else(|| {
                    ExecError::Program(format!("`{label}` closes no coalescing group"))
                })?;
                self.post_p2p(id, label, ops)?;
            }
            Stmt::Wait { comm } => self.wait(&label, *comm)?,
        }
        Ok(())
    }

    /// `Allocate`: binds `tensor` to a new buffer of its sizes on the current stream (or to
    /// the caller's buffer for an output of [`run_rank_into`]), zero-filled if asked.
    fn allocate(
        &mut self,
        id: StmtId,
        label: &str,
        tensor: HostTensorId,
        zero_init: bool,
    ) -> Result<(), ExecError> {
        let decl =
            self.program.tensors.get(tensor).ok_or_else(|| {
                ExecError::Program(format!("`{label}` allocates an unknown tensor"))
            })?;
        let mut sizes = Vec::new();
        for &s in &decl.sizes {
            let n = self.eval(s)?;
            sizes.push(
                usize::try_from(n)
                    .map_err(|_| ExecError::Program(format!("`{label}`: size {n} is negative")))?,
            );
        }
        let stream = self.backend.stream(self.current)?;
        if let Some(buffer) = self.given.remove(&tensor) {
            let (dtype, have) = (self.backend.dtype(&buffer), self.backend.sizes(&buffer));
            if dtype != decl.dtype || have != sizes {
                // Names are built only for a message (building them costs more than
                // issuing a small program).
                let name = self.names.tensor(tensor);
                return Err(ExecError::Input(format!(
                    "output {name} on rank {}: the buffer given is {dtype}{have:?}, the program writes {}{sizes:?}",
                    self.comm.rank(),
                    decl.dtype
                )));
            }
            if zero_init {
                self.backend.zero(&buffer, &stream)?;
            }
            // The caller's buffer is written from here, as a fresh one would be.
            self.tensors.insert(tensor, buffer);
            self.record_effects(Agent::Stream(self.current), id, label);
            return Ok(());
        }
        // A refused allocation names the statement (and so the tensor).
        let buffer = self
            .backend
            .allocate(decl.dtype, &sizes, zero_init, &stream)
            .map_err(|e| match e {
                ExecError::Compute { message, .. } => ExecError::Compute {
                    stmt: label.to_string(),
                    message,
                },
                e => e,
            })?;
        // A stream-ordered allocation (`cuMemAllocAsync`) is a write on the allocating
        // stream: the memory may still be in use by its previous owner until that stream
        // gets here, so another stream uses the buffer only after synchronizing with it. A
        // zero fill is the same write.
        self.tensors.insert(tensor, buffer);
        self.record_effects(Agent::Stream(self.current), id, label);
        Ok(())
    }

    /// `ForLoop`: runs `body` for every index of `[start, stop)`, at most
    /// [`MAX_TRIP_COUNT`] times.
    fn for_loop(
        &mut self,
        label: &str,
        index: ScalarId,
        (start, stop): (ScalarId, ScalarId),
        body: &[StmtId],
    ) -> Result<(), ExecError> {
        let (a, b) = (self.eval(start)?, self.eval(stop)?);
        let trips = b.saturating_sub(a);
        if trips > MAX_TRIP_COUNT {
            return Err(ExecError::Program(format!(
                "`{label}` would run {trips} iterations; a loop runs at most {MAX_TRIP_COUNT} (a stream split into fewer chunks)"
            )));
        }
        for i in a..b {
            self.scalars.bound.insert(index, i);
            self.exec_scope(body)?;
        }
        self.scalars.bound.remove(&index);
        Ok(())
    }

    /// `Synchronize`: orders the current stream after the work enqueued so far on `stream`.
    fn synchronize(&mut self, label: &str, stream: StreamId) -> Result<(), ExecError> {
        let other = self.stream_key(stream, label)?;
        // A stream is always ordered after itself: nothing to enqueue (one chunk on the main
        // stream synchronizes with it at the fork and the join).
        if other != self.current {
            let waited = self.backend.stream(other)?;
            let waiter = self.backend.stream(self.current)?;
            let event = self.backend.record_event(&waited);
            self.backend.wait_event(&waiter, &event, label);
        }
        if let Some(r) = self.races.as_mut() {
            r.synchronize(self.current, other);
        }
        Ok(())
    }

    /// `ShardByStream`: the view of chunk `index` of `chunks` of `input` along `axis`,
    /// narrowed to the chunk it `holds` when it is a slot of a bounded buffer.
    fn chunk_view(
        &mut self,
        label: &str,
        input: HostTensorId,
        axis: usize,
        (chunks, index): (ScalarId, ScalarId),
        holds: Option<ChunkOf>,
    ) -> Result<B::Buffer, ExecError> {
        let buffer = self.buffer(input, label)?;
        let (c, i) = (self.eval(chunks)?, self.eval(index)?);
        if c <= 0 || i < 0 || i >= c {
            return Err(ExecError::Program(format!(
                "`{label}`: chunk {i} of {c} does not exist"
            )));
        }
        let mut view = self
            .backend
            .chunk(&buffer, axis, c as usize, i as usize)
            .map_err(|m| ExecError::Program(format!("`{label}`: {m}")))?;
        if let Some(h) = holds {
            // A slot narrowed to the chunk of the longer axis that it holds.
            let (k, n, e) = (
                self.eval(h.chunk)?,
                self.eval(h.chunks)?,
                self.eval(h.extent)?,
            );
            if n <= 0 || k < 0 || k >= n || e < 0 {
                return Err(ExecError::Program(format!(
                    "`{label}`: chunk {k} of {n} of an axis of {e} elements does not exist"
                )));
            }
            let len = weave_comm::host::chunk_len(e as usize, n as usize, k as usize);
            view = self
                .backend
                .narrow(&view, axis, len)
                .map_err(|m| ExecError::Program(format!("`{label}`: {m}")))?;
        }
        Ok(view)
    }

    /// `Communication`: posts the collective on the current stream, on the team that holds
    /// this rank (a rank in none takes no part), through contiguous stand-ins where the
    /// communicator needs them.
    fn communication(
        &mut self,
        id: StmtId,
        label: String,
        c: &'p Communication,
    ) -> Result<(), ExecError> {
        // A rank in none of the teams takes no part (its `Wait` is a no-op).
        let Some(team) = c.team_of(self.comm.rank() as i64) else {
            return Ok(());
        };
        let input = self.buffer(c.input, &label)?;
        let output = self.buffer(c.output, &label)?;
        let root = match c.root {
            Some(r) => {
                let v = self.eval(r)?;
                usize::try_from(v)
                    .ok()
                    .filter(|&v| v < team.len())
                    .ok_or_else(|| {
                        ExecError::Program(format!(
                            "`{label}`: root {v} is not an index into a team of {}",
                            team.len()
                        ))
                    })?
            }
            None => 0,
        };
        // Strided views go through contiguous stand-ins where the communicator needs
        // contiguous memory (NCCL), copied in before the post and out after it.
        let stream = self.backend.stream(self.current)?;
        let staged_in = self.backend.staging(&input, &stream)?;
        let staged_out = self.backend.staging(&output, &stream)?;
        if let Some(t) = &staged_in {
            self.backend.copy(&label, &input, t, &stream)?;
        }
        let i = staged_in.clone().unwrap_or_else(|| input.clone());
        let o = staged_out.clone().unwrap_or_else(|| output.clone());
        let collective = Collective {
            label: label.clone(),
            team: team.iter().map(|&d| d.max(0) as usize).collect(),
            op: comm_op(c, team, self.comm.rank(), root, i, o),
        };
        self.backend.traced_post(&stream, &label, || {
            self.comm
                .post(collective, self.backend.comm_stream(&stream))
        })?;
        if let Some(t) = staged_out {
            self.backend.copy(&label, &t, &output, &stream)?;
            self.backend.deallocate(t, &stream);
        }
        if let Some(t) = staged_in {
            self.backend.deallocate(t, &stream);
        }
        let agent = self.races.as_mut().map(|r| r.post(self.current));
        if let Some(agent) = agent {
            self.record_effects(agent, id, &label);
        }
        let event = self.backend.record_event(&stream);
        self.posted.insert(id, Posted { event, agent });
        Ok(())
    }

    /// `Wait`: orders the current stream after the communication `comm` posted.
    fn wait(&mut self, label: &str, comm: StmtId) -> Result<(), ExecError> {
        if let Some(Stmt::Communication(c)) = self.program.stmts.get(comm) {
            if c.team_of(self.comm.rank() as i64).is_none() {
                return Ok(());
            }
        }
        let posted = self.posted.get(&comm).ok_or_else(|| {
            ExecError::Program(format!(
                "`{label}` waits for a communication that was not posted"
            ))
        })?;
        let stream = self.backend.stream(self.current)?;
        self.backend.wait_event(&stream, &posted.event, label);
        if let (Some(r), Some(agent)) = (self.races.as_mut(), posted.agent) {
            r.wait(self.current, agent);
        }
        Ok(())
    }

    /// Feeds the race checker what statement `id` touches ([`Stmt::effects`]), as `agent`,
    /// through the buffers bound now: reads as reads; writes, allocations and frees as writes
    /// (a stream-ordered allocation or free is a write of the whole buffer on its stream, as
    /// the race module says); a view touches nothing.
    fn record_effects(&mut self, agent: Agent, id: StmtId, label: &str) {
        if self.races.is_none() {
            return;
        }
        let Some(stmt) = self.program.stmts.get(id) else {
            return;
        };
        for (t, access) in stmt.effects().accesses {
            let write = match access {
                Access::Read => false,
                Access::Write | Access::Allocate | Access::Free => true,
                Access::View => continue,
            };
            if let Some(buffer) = self.tensors.get(&t).cloned() {
                self.record(agent, &buffer, write, label, t);
            }
        }
    }

    fn buffers(&mut self, ts: &[HostTensorId], at: &str) -> Result<Vec<B::Buffer>, ExecError> {
        ts.iter().map(|&t| self.buffer(t, at)).collect()
    }

    /// Posts point-to-point transfers as one operation, named by the statement `id` that a
    /// `Wait` will name.
    fn post_p2p(
        &mut self,
        id: StmtId,
        label: String,
        ops: Vec<(StmtId, P2p<B::Buffer>)>,
    ) -> Result<(), ExecError> {
        let stream = self.backend.stream(self.current)?;
        let agent = self.races.as_mut().map(|r| r.post(self.current));
        if let Some(agent) = agent {
            for (stmt, _) in &ops {
                let l = self.label(*stmt);
                self.record_effects(agent, *stmt, &l);
            }
        }
        // Strided views go through contiguous stand-ins, as for collectives: a send's is
        // filled before the group, a receive's is copied out after it.
        let mut staged: Vec<P2p<B::Buffer>> = Vec::with_capacity(ops.len());
        let mut copy_out: Vec<(B::Buffer, B::Buffer)> = Vec::new();
        let mut release: Vec<B::Buffer> = Vec::new();
        for (_, op) in ops {
            let (P2p::Send { buffer, .. } | P2p::Recv { buffer, .. }) = &op;
            let Some(t) = self.backend.staging(buffer, &stream)? else {
                staged.push(op);
                continue;
            };
            staged.push(match op {
                P2p::Send { peer, buffer } => {
                    self.backend.copy(&label, &buffer, &t, &stream)?;
                    release.push(t.clone());
                    P2p::Send { peer, buffer: t }
                }
                P2p::Recv { peer, buffer } => {
                    copy_out.push((t.clone(), buffer));
                    P2p::Recv { peer, buffer: t }
                }
            });
        }
        let name = label.clone();
        self.backend.traced_post(&stream, &name, || {
            self.comm
                .post_p2p(label, staged, self.backend.comm_stream(&stream))
        })?;
        for (t, buffer) in copy_out {
            self.backend.copy(&name, &t, &buffer, &stream)?;
            self.backend.deallocate(t, &stream);
        }
        for t in release {
            self.backend.deallocate(t, &stream);
        }
        let event = self.backend.record_event(&stream);
        self.posted.insert(id, Posted { event, agent });
        Ok(())
    }
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
