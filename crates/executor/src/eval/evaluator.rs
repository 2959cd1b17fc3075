//! The evaluator's walk: set-up, the run over the program, and `exec`, which issues one
//! statement by handing it to the handler of its kind.

use std::sync::Arc;
use std::time::{Duration, Instant};

use weave_comm::{Communicator, P2p};
use weave_host_ir::ids::SecondaryMap;
use weave_host_ir::{
    HostProgram, HostTensorId, P2PDirection, ScalarId, Stmt, StmtId, Stream, StreamId,
};

use super::{check_inputs, BufferRun, Evaluator, LazyNames, RankRun, RunConfig, Scalars};
use crate::backend::{Backend, StreamKey};
use crate::dense::Dense;
use crate::error::ExecError;
use crate::race::{Agent, RaceChecker};

impl<'p, B, C> Evaluator<'p, B, C>
where
    B: Backend,
    C: Communicator<Buffer = B::Buffer, Stream = B::CommStream>,
{
    pub(super) fn new(
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
                bound: SecondaryMap::new(),
            },
            tensors: SecondaryMap::new(),
            captured: SecondaryMap::new(),
            current: StreamKey::Main,
            posted: SecondaryMap::new(),
            group: None,
            races: config.check_races.then(RaceChecker::new),
            statements: 0,
            given: SecondaryMap::new(),
            producers: if backend.produces_into_windows() {
                super::producers(program)
            } else {
                SecondaryMap::new()
            },
            deferred: SecondaryMap::new(),
        })
    }

    pub(super) fn run(&mut self, inputs: &[Dense]) -> Result<RankRun, ExecError> {
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
        let (start, issue_time) = self.issue_top_level()?;
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

    /// Issues every top-level statement; returns when it started and how long issuing took.
    /// The program must not end inside a coalescing group.
    fn issue_top_level(&mut self) -> Result<(Instant, Duration), ExecError> {
        let start = Instant::now();
        let top = self.program.top_level.clone();
        self.exec_scope(&top)?;
        let issue_time = start.elapsed();
        if self.group.is_some() {
            return Err(ExecError::Program(
                "the program ends inside a coalescing group (StartCoalescing without EndCoalescing)".into(),
            ));
        }
        Ok((start, issue_time))
    }

    /// Binds `inputs` and issues every statement; no download, no synchronization.
    pub(super) fn issue(
        &mut self,
        inputs: &[B::Buffer],
    ) -> Result<BufferRun<B::Buffer>, ExecError> {
        for (&t, b) in self.program.inputs.iter().zip(inputs) {
            self.tensors.insert(t, b.clone());
        }
        let (_, issue_time) = self.issue_top_level()?;
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

    pub(super) fn label(&self, s: StmtId) -> String {
        self.labels
            .get(s)
            .cloned()
            .unwrap_or_else(|| "<statement>".into())
    }

    pub(super) fn buffer(&mut self, t: HostTensorId, at: &str) -> Result<B::Buffer, ExecError> {
        match self.tensors.get(t) {
            Some(b) => Ok(b.clone()),
            None => Err(ExecError::Program(format!(
                "`{at}` reads {}, which is not bound here",
                self.names.tensor(t)
            ))),
        }
    }

    pub(super) fn eval(&mut self, s: ScalarId) -> Result<i64, ExecError> {
        self.scalars.eval(s, &mut self.names)
    }

    pub(super) fn stream_key(&mut self, s: StreamId, at: &str) -> Result<StreamKey, ExecError> {
        match self.program.streams.get(s) {
            Some(Stream::Captured) => self.captured.get(s).copied().ok_or_else(|| {
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

    pub(super) fn record(
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

    pub(super) fn exec_scope(&mut self, body: &[StmtId]) -> Result<(), ExecError> {
        for &s in body {
            self.exec(s)?;
        }
        Ok(())
    }

    /// Issues one statement: counts it, checks the deadline, and hands it to the handler of
    /// its kind.
    pub(super) fn exec(&mut self, id: StmtId) -> Result<(), ExecError> {
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
                self.tensors.remove(*tensor);
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
                let fusion = self.kernels.get(*kernel).cloned().ok_or_else(|| {
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
                accumulate,
            } => {
                let x = self.buffer(*input, &label)?;
                let w = self.buffer(*weight, &label)?;
                let bb = match bias {
                    Some(t) => Some(self.buffer(*t, &label)?),
                    None => None,
                };
                let o = self.buffer(*out, &label)?;
                self.record_effects(Agent::Stream(self.current), id, &label);
                if let Some(&comm) = self.producers.get(id) {
                    // Computed by the collective it feeds, where it sums each block.
                    self.deferred.insert(
                        comm,
                        super::produce::Deferred {
                            input: x,
                            weight: w,
                            bias: bb,
                            out: o,
                            label,
                        },
                    );
                    return Ok(());
                }
                let stream = self.backend.stream(self.current)?;
                self.backend
                    .linear(&label, &x, &w, bb.as_ref(), &o, *accumulate, &stream)?;
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
}
