//! The handlers of the statements that take more than a line to issue: allocations, loops,
//! stream synchronization, chunk views, communications and waits.

use weave_comm::{Collective, Communicator, P2p};
use weave_host_ir::access::Access;
use weave_host_ir::{
    ChunkOf, Communication, CommunicationType, HostTensorId, ScalarId, Stmt, StmtId, StreamId,
};

use super::{Evaluator, Posted, MAX_TRIP_COUNT};
use crate::backend::Backend;
use crate::collective::comm_op;
use crate::error::ExecError;
use crate::race::Agent;

impl<'p, B, C> Evaluator<'p, B, C>
where
    B: Backend,
    C: Communicator<Buffer = B::Buffer, Stream = B::CommStream>,
{
    /// `Allocate`: binds `tensor` to a new buffer of its sizes on the current stream (or to
    /// the caller's buffer for an output of [`run_rank_into`](super::run_rank_into)), zero-filled if asked.
    pub(super) fn allocate(
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
        if let Some(buffer) = self.given.remove(tensor) {
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
    pub(super) fn for_loop(
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
        self.scalars.bound.remove(index);
        Ok(())
    }

    /// `Synchronize`: orders the current stream after the work enqueued so far on `stream`.
    pub(super) fn synchronize(&mut self, label: &str, stream: StreamId) -> Result<(), ExecError> {
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
    pub(super) fn chunk_view(
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
    pub(super) fn communication(
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
        // The linear that computes the input, when it was handed to this collective
        // (`produce::producers`); with a staged input it runs here, before the copy in.
        // It needs a 2-D input and an output of `[rows, n]` (and axes of one element).
        let mut deferred = self.deferred.remove(id);
        let fits = deferred.as_ref().is_some_and(|d| {
            let (x, w, o) = (
                self.backend.sizes(&d.input),
                self.backend.sizes(&d.weight),
                self.backend.sizes(&d.out),
            );
            x.len() == 2
                && w.len() == 2
                && o.len() >= 2
                && (o[0], o[1]) == (x[0], w[0])
                && o[2..].iter().all(|&e| e == 1)
        });
        if staged_in.is_some() || !fits {
            if let Some(d) = deferred.take() {
                self.run_deferred(&d, &stream)?;
            }
        }
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
        // In traces, the transport that moves the bytes (the program's label says NCCL).
        let traced = match self
            .backend
            .tracing()
            .then(|| self.comm.moved_by(&collective))
        {
            Some(Some(by)) => label.replace("backend=NCCL", &format!("backend={by}")),
            _ => label.clone(),
        };
        let comm_stream = self.backend.comm_stream(&stream);
        let collective = match &deferred {
            Some(d) => {
                // Each block of the input computed where the collective sums it: whole rows
                // of the linear's `[rows, n]` output.
                let n = self.backend.sizes(&d.weight).first().copied().unwrap_or(0);
                let backend = self.backend;
                let mut produce = |first: usize, len: usize, at: u64| {
                    let rows = first / n.max(1)..(first + len) / n.max(1);
                    backend
                        .linear_rows_into(
                            &d.label,
                            &d.input,
                            &d.weight,
                            d.bias.as_ref(),
                            rows,
                            at,
                            &stream,
                        )
                        .map_err(|e| weave_comm::CommError::Backend {
                            op: d.label.clone(),
                            message: e.to_string(),
                        })
                };
                self.backend.traced_post(&stream, &traced, || {
                    self.comm
                        .post_produced(collective, n, &mut produce, comm_stream)
                })?
            }
            None => Some(collective),
        };
        if let Some(collective) = collective {
            // Not computed by the collective (it could not): the linear runs first.
            if let Some(d) = deferred.take() {
                self.run_deferred(&d, &stream)?;
            }
            self.backend.traced_post(&stream, &traced, || {
                self.backend
                    .post_comm(&stream, |on| self.comm.post(collective, on))
            })?;
        }
        // Only the root of a Reduce or Gather receives: another member's output is left as
        // it was (a loop of Reduces rooted at each iteration's device writes each rank's
        // block in one iteration only).
        let receives = !matches!(
            c.kind,
            CommunicationType::Reduce | CommunicationType::Gather
        ) || team.get(root).copied() == Some(self.comm.rank() as i64);
        if let Some(t) = staged_out {
            if receives {
                self.backend.copy(&label, &t, &output, &stream)?;
            }
            self.backend.deallocate(t, &stream);
        }
        if let Some(t) = staged_in {
            self.backend.deallocate(t, &stream);
        }
        let agent = self.races.as_mut().map(|r| r.post(self.current));
        if let Some(agent) = agent {
            let untouched = (!receives).then_some(c.output);
            self.record_effects_except(agent, id, &label, untouched);
        }
        let event = self.backend.record_event(&stream);
        self.posted.insert(id, Posted { event, agent });
        Ok(())
    }

    /// Runs a linear that was handed to a collective which did not compute it.
    fn run_deferred(
        &self,
        d: &super::produce::Deferred<B::Buffer>,
        stream: &B::Stream,
    ) -> Result<(), ExecError> {
        self.backend.linear(
            &d.label,
            &d.input,
            &d.weight,
            d.bias.as_ref(),
            &d.out,
            false,
            stream,
        )
    }

    /// `Wait`: orders the current stream after the communication `comm` posted.
    pub(super) fn wait(&mut self, label: &str, comm: StmtId) -> Result<(), ExecError> {
        if let Some(Stmt::Communication(c)) = self.program.stmts.get(comm) {
            if c.team_of(self.comm.rank() as i64).is_none() {
                return Ok(());
            }
        }
        let posted = self.posted.get(comm).ok_or_else(|| {
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
    pub(super) fn record_effects(&mut self, agent: Agent, id: StmtId, label: &str) {
        self.record_effects_except(agent, id, label, None);
    }

    /// [`Self::record_effects`] without the write of `untouched` (the output of a Reduce or
    /// Gather on a member that is not its root).
    pub(super) fn record_effects_except(
        &mut self,
        agent: Agent,
        id: StmtId,
        label: &str,
        untouched: Option<HostTensorId>,
    ) {
        if self.races.is_none() {
            return;
        }
        let Some(stmt) = self.program.stmts.get(id) else {
            return;
        };
        for (t, access) in stmt.effects().accesses {
            let write = match access {
                Access::Read => false,
                Access::Write if untouched == Some(t) => continue,
                Access::Write | Access::Allocate | Access::Free => true,
                Access::View => continue,
            };
            if let Some(buffer) = self.tensors.get(t).cloned() {
                self.record(agent, &buffer, write, label, t);
            }
        }
    }

    pub(super) fn buffers(
        &mut self,
        ts: &[HostTensorId],
        at: &str,
    ) -> Result<Vec<B::Buffer>, ExecError> {
        ts.iter().map(|&t| self.buffer(t, at)).collect()
    }

    /// Posts point-to-point transfers as one operation, named by the statement `id` that a
    /// `Wait` will name.
    pub(super) fn post_p2p(
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
            self.backend
                .post_comm(&stream, |on| self.comm.post_p2p(label, staged, on))
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
