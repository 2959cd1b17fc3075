//! The host program verifier: the invariants every host pass keeps, checked after each one.
//!
//! The rules, in the order a statement is checked:
//!
//! * **Structure.** Every placed statement id is in the arena and sits in exactly one scope;
//!   loops nest at most [`MAX_LOOP_DEPTH`] deep;
//!   every tensor, scalar, stream and kernel a statement names is in its arena; a
//!   `LaunchKernel` passes as many tensors as its fusion has inputs and outputs, and that
//!   fusion parallelizes no axis (a kernel computes whole buffers; nvFuser likewise refuses
//!   a stream-parallel output of a `PostOnStream`); a
//!   collective has a root exactly when its type has one and a reduction exactly when it
//!   reduces, and at least one team, no device appearing twice among its teams; a
//!   `ShardByStream` cuts an axis the tensor has. Buffers hold what is put in them: a
//!   `LaunchKernel`'s buffers have its fusion's element types; a view has its tensor's
//!   element type and rank, its tensor's sizes but along the cut axis (where both are known
//!   at load: constants, or expressions over the signature's parameters), and there at most
//!   the tensor's extent.
//! * **Scalars.** A loop index is used only inside the `FOR` that binds it (in loop bounds,
//!   chunk indices, roots, peers, stream indices and the sizes of what is allocated), and
//!   each loop index is bound by one `FOR`. Other named symbols (`rank`, `numberOfStreams`,
//!   fusion parameters) are free.
//! * **Definitions.** A tensor is defined by being a program input, by `Allocate`, as the
//!   output of `ShardByStream`, or by a write (a library call or a receive into an unbound
//!   tensor binds it). A `ShardByStream` of a tensor that was never bound binds it too: it is
//!   a buffer that lowering leaves to `allocate-and-deallocate` (loop-local intermediates get
//!   their slots there), written only through its views. Every read, every `ShardByStream` input, every `Deallocate` and every
//!   `Wait` (a use of its communication's buffers) needs a definition that dominates it: an
//!   earlier one in the same scope or an enclosing one. A definition inside a loop body does
//!   not reach past the loop. A view is usable only while the tensor it cuts is. A program
//!   input or output is never deallocated, a tensor defined outside a loop is not
//!   deallocated inside it (every iteration would free it), and every output is defined when
//!   the program ends.
//! * **Streams.** `SetCurrentStream` and `Synchronize` name a captured stream that a
//!   dominating `GetCurrentStream` defined, or a pool stream whose index is in scope;
//!   `GetCurrentStream` defines a captured stream.
//! * **Communications.** Every `Communication`, every `P2PCommunication` outside a
//!   coalescing group and every `EndCoalescing` is followed in the same scope by exactly one
//!   `Wait` naming it, and until that `Wait` no statement writes, reallocates, rebinds or
//!   deallocates any of its buffers (or a view that shares memory with one), and none reads a
//!   buffer that it writes (a received or output buffer; a sent or input buffer may be read
//!   meanwhile, as a ring computes on the chunk it forwards). The scope
//!   must not end first. A `Wait` names such a statement, never a point-to-point inside a
//!   group. Coalescing groups open and close in one scope, do not nest, and hold only
//!   `P2PCommunication`s.
//!
//! Views share memory with the tensor they cut and with each other, except that two views of
//! one tensor cut along the same axis into the same number of chunks with structurally
//! different indices (as printed) are taken to be disjoint (the ring patterns send one chunk of a buffer
//! while receiving another).
//!
//! The first violation in program order is reported, quoting the statement as the printer
//! prints it and naming the loops around it:
//! ``statement `Deallocate(T4)` in FOR i0: deallocates T4 while `Communication 9 (…)` is in
//! flight on it; `Wait(Communication 9)` must come first``.

//!
//! The checks live by concern: this module walks scopes and statements, `signature` checks
//! the signature against the program, `tensors` definitions and in-flight memory, and
//! `scalars` loop indices and streams.
use slotmap::SecondaryMap;
use weave_ir::{Diagnostic, ParallelType, ScheduleOp};

use crate::access::Effects;
use crate::ids::{HostTensorId, ScalarId, StmtId, StreamId};
use crate::printer::Names;
use crate::syntax::{HostProgram, HostScalar, Stmt, Stream};

mod scalars;
mod signature;
mod tensors;

use signature::{known_numel, verify_signature};
use tensors::bind;

/// Checks every rule of the module docs; returns the first violation in program order.
pub fn verify(p: &HostProgram) -> Result<(), Diagnostic> {
    let mut v = Verifier {
        p,
        names: Names::of(p),
        placed: SecondaryMap::new(),
        loop_of: SecondaryMap::new(),
        grouped: SecondaryMap::new(),
        loops: Vec::new(),
        pending: Vec::new(),
        group: Vec::new(),
    };
    v.program()?;
    verify_signature(p)
}
/// Deeper scalars (only cyclic ones get there) are reported as malformed.
const MAX_SCALAR_DEPTH: usize = 256;

/// Loops nest at most this deep (the parser enforces it too), which bounds the verifier's
/// recursion.
pub const MAX_LOOP_DEPTH: usize = 64;

/// A view made by `ShardByStream`: chunk `index` of `chunks` of `parent` along `axis`.
#[derive(Clone, Copy, Debug)]
struct View {
    parent: HostTensorId,
    axis: usize,
    chunks: ScalarId,
    index: ScalarId,
}

/// What is defined at a program point; flows forward through a scope and is copied into a
/// loop body.
#[derive(Clone, Debug, Default)]
struct State {
    defined: SecondaryMap<HostTensorId, ()>,
    /// Deallocated and not defined again (for messages).
    freed: SecondaryMap<HostTensorId, ()>,
    /// Defined only inside the body of an earlier loop (for messages).
    loop_local: SecondaryMap<HostTensorId, StmtId>,
    views: SecondaryMap<HostTensorId, View>,
    /// Captured streams defined by a dominating `GetCurrentStream`.
    streams: SecondaryMap<StreamId, ()>,
    /// Loop indices in scope.
    indices: SecondaryMap<ScalarId, ()>,
    /// Tensors defined before the innermost enclosing loop and not rebound since.
    from_outside: SecondaryMap<HostTensorId, ()>,
}

/// An asynchronous communication that no `Wait` has named yet.
#[derive(Clone, Debug)]
struct Pending {
    comm: StmtId,
    /// The buffers it uses, each with whether it writes that buffer (a received or output
    /// buffer) or only reads it (a sent or input buffer).
    buffers: Vec<(HostTensorId, bool)>,
    /// A point-to-point of a coalescing group that is still open.
    in_group: bool,
}

type VResult = Result<(), Diagnostic>;

struct Verifier<'a> {
    p: &'a HostProgram,
    names: Names,
    placed: SecondaryMap<StmtId, ()>,
    /// Which loop binds each loop index.
    loop_of: SecondaryMap<ScalarId, StmtId>,
    /// Point-to-points that sit inside a coalescing group.
    grouped: SecondaryMap<StmtId, ()>,
    /// Enclosing loops of the statement being checked, outermost first.
    loops: Vec<StmtId>,
    /// In-flight communications, one list per open scope (innermost last).
    pending: Vec<Vec<Pending>>,
    /// The open coalescing group of each open scope: its `StartCoalescing`.
    group: Vec<Option<StmtId>>,
}

impl Verifier<'_> {
    // ----- messages -----------------------------------------------------------------------

    /// ``statement `…` in FOR i0 / FOR i1: message``.
    fn fail(&mut self, s: StmtId, message: impl Into<String>) -> Diagnostic {
        let text = self.names.stmt(self.p, s);
        let loops: Vec<String> = self
            .loops
            .clone()
            .into_iter()
            .map(|l| self.names.loop_name(self.p, l))
            .collect();
        let place = if loops.is_empty() {
            String::new()
        } else {
            format!(" in {}", loops.join(" / "))
        };
        Diagnostic::new(format!("statement `{text}`{place}: {}", message.into()))
    }

    fn t(&mut self, t: HostTensorId) -> String {
        self.names.tensor(t)
    }

    /// `Communication 9 (type=…, …)`: the statement as quoted inside a message.
    fn quote(&mut self, s: StmtId) -> String {
        format!("`{}`", self.names.stmt(self.p, s))
    }

    // ----- the program --------------------------------------------------------------------

    fn program(&mut self) -> VResult {
        let p = self.p;
        let mut state = State::default();
        for &t in &p.inputs {
            let Some(ht) = p.tensors.get(t) else {
                return Err(Diagnostic::new(
                    "a program input is not in the tensor arena".to_string(),
                ));
            };
            for &size in &ht.sizes {
                if let Err(problem) = self.scalar_problem(&state, size, 0) {
                    let name = self.t(t);
                    return Err(Diagnostic::new(format!(
                        "program input {name}: a size {problem}"
                    )));
                }
            }
            state.defined.insert(t, ());
        }
        self.scope(&p.top_level, &mut state)?;
        for &t in &p.outputs {
            if state.defined.contains_key(t) {
                continue;
            }
            let name = self.t(t);
            let why = if state.freed.contains_key(t) {
                "it is deallocated".to_string()
            } else if let Some(l) = state.loop_local.get(t).copied() {
                format!(
                    "it is defined only inside {} (a definition in a loop body does not reach \
                     past the loop)",
                    self.names.loop_name(p, l)
                )
            } else {
                "nothing writes it".to_string()
            };
            return Err(Diagnostic::new(format!(
                "program output {name} is not defined when the program ends: {why}"
            )));
        }
        Ok(())
    }

    fn scope(&mut self, stmts: &[StmtId], state: &mut State) -> VResult {
        self.pending.push(Vec::new());
        self.group.push(None);
        for &s in stmts {
            self.stmt(s, state)?;
        }
        if let Some(Some(start)) = self.group.pop() {
            return Err(self.fail(
                start,
                "opens a coalescing group that no `EndCoalescing` closes in the same scope",
            ));
        }
        if let Some(first) = self.pending.pop().and_then(|v| v.into_iter().next()) {
            let r = self.names.stmt_ref(self.p, first.comm);
            let end = if self.loops.is_empty() {
                "before the program ends"
            } else {
                "in the same loop body, before the iteration ends"
            };
            return Err(self.fail(
                first.comm,
                format!("is never waited for: `Wait({r})` must follow it {end}"),
            ));
        }
        Ok(())
    }

    fn stmt(&mut self, s: StmtId, state: &mut State) -> VResult {
        let p = self.p;
        let Some(stmt) = p.stmts.get(s) else {
            let place = match self.loops.last() {
                Some(l) => format!("the body of `{}`", self.names.stmt(p, *l)),
                None => "the top level".to_string(),
            };
            return Err(Diagnostic::new(format!(
                "{place} holds a statement id that is not in the statement arena"
            )));
        };
        if self.placed.insert(s, ()).is_some() {
            return Err(self.fail(
                s,
                "appears more than once in the program (a statement sits in exactly one scope)",
            ));
        }
        if let Some(Some(start)) = self.group.last() {
            if !matches!(stmt, Stmt::P2PCommunication(_) | Stmt::EndCoalescing) {
                let start = self.names.stmt_ref(p, *start);
                return Err(self.fail(
                    s,
                    format!(
                        "sits inside the coalescing group opened by `StartCoalescing` \
                         ({start}), which may hold only P2PCommunication statements"
                    ),
                ));
            }
        }
        let fx = stmt.effects();
        if fx.tensors().any(|t| !p.tensors.contains_key(t)) {
            return Err(self.fail(s, "names a tensor that is not in the tensor arena"));
        }
        for &x in &fx.scalars {
            self.check_scalar(s, state, x)?;
        }
        match stmt {
            Stmt::Allocate { tensor, .. } => {
                for &size in p.tensors.get(*tensor).map_or(&[][..], |t| &t.sizes) {
                    self.check_scalar(s, state, size)?;
                }
                self.touch(s, state, *tensor, "reallocates")?;
                bind(state, *tensor);
                state.views.remove(*tensor);
            }
            Stmt::Deallocate { tensor } => {
                let t = *tensor;
                if p.inputs.contains(&t) {
                    let n = self.t(t);
                    return Err(self.fail(s, format!("deallocates program input {n}")));
                }
                if p.outputs.contains(&t) {
                    let n = self.t(t);
                    return Err(self.fail(
                        s,
                        format!("deallocates program output {n}, which the caller receives"),
                    ));
                }
                self.need(s, state, t, "deallocates")?;
                self.touch(s, state, t, "deallocates")?;
                if state.from_outside.contains_key(t) {
                    let n = self.t(t);
                    let l = self.loops.last().copied();
                    let l = l.map(|l| self.names.loop_name(p, l)).unwrap_or_default();
                    return Err(self.fail(
                        s,
                        format!(
                            "deallocates {n}, which is defined outside {l}: every iteration \
                             would free it again (deallocate it after the loop)"
                        ),
                    ));
                }
                state.defined.remove(t);
                state.freed.insert(t, ());
            }
            Stmt::ForLoop {
                index, body: stmts, ..
            } => self.for_loop(s, state, *index, stmts)?,
            Stmt::GetCurrentStream { out } => match p.streams.get(*out) {
                Some(Stream::Captured) => {
                    state.streams.insert(*out, ());
                }
                Some(Stream::Indexed(_)) => {
                    let st = self.names.stream(p, *out);
                    return Err(self.fail(
                        s,
                        format!(
                            "defines {st}, a pool stream; `GetCurrentStream` defines a captured \
                             stream (`Stream N`)"
                        ),
                    ));
                }
                None => return Err(self.fail(s, "names a stream that is not in the stream arena")),
            },
            Stmt::SetCurrentStream { stream } | Stmt::Synchronize { stream } => {
                self.check_stream(s, state, *stream)?;
            }
            Stmt::ShardByStream {
                input,
                axis,
                chunks,
                index,
                output,
                ..
            } => {
                if input == output {
                    let n = self.t(*input);
                    return Err(self.fail(s, format!("makes {n} a view of itself")));
                }
                let never_bound = !state.defined.contains_key(*input)
                    && !state.freed.contains_key(*input)
                    && !state.loop_local.contains_key(*input);
                if never_bound {
                    bind(state, *input);
                }
                self.need(s, state, *input, "shards")?;
                let rank = p.tensors.get(*input).map_or(0, |t| t.sizes.len());
                if *axis >= rank {
                    let n = self.t(*input);
                    return Err(
                        self.fail(s, format!("cuts axis {axis} of {n}, which has {rank} axes"))
                    );
                }
                // The view's declared sizes are its tensor's, but for the cut axis, which
                // holds at most the tensor's extent (known sizes only).
                if let (Some(view), Some(whole)) = (p.tensors.get(*output), p.tensors.get(*input)) {
                    let known = |v: &[ScalarId]| -> Vec<Option<i64>> {
                        v.iter().map(|&x| known_numel(p, &[x])).collect()
                    };
                    let (vs, ws) = (known(&view.sizes), known(&whole.sizes));
                    let contradiction = if vs.len() != ws.len() {
                        Some(format!("has {} axes", vs.len()))
                    } else if view.dtype != whole.dtype {
                        Some(format!("is {}", view.dtype))
                    } else {
                        vs.iter()
                            .zip(&ws)
                            .enumerate()
                            .find_map(|(a, pair)| match pair {
                                (Some(v), Some(w)) if a == *axis && v > w => {
                                    Some(format!("has {v} elements along axis {a}"))
                                }
                                (Some(v), Some(w)) if a != *axis && v != w => {
                                    Some(format!("has {v} elements along axis {a}"))
                                }
                                _ => None,
                            })
                    };
                    if let Some(why) = contradiction {
                        let (o, i) = (self.t(*output), self.t(*input));
                        return Err(self.fail(
                            s,
                            format!(
                                "makes {o} a view of {i} along axis {axis}, but {o} {why}, \
                                 which {i} ({} {} axes) cannot hold",
                                whole.dtype,
                                ws.len()
                            ),
                        ));
                    }
                }
                self.touch(s, state, *output, "rebinds")?;
                bind(state, *output);
                state.views.insert(
                    *output,
                    View {
                        parent: *input,
                        axis: *axis,
                        chunks: *chunks,
                        index: *index,
                    },
                );
            }
            Stmt::LaunchKernel {
                kernel,
                inputs,
                outputs,
            } => {
                let Some(unit) = p.kernels.get(*kernel) else {
                    return Err(self.fail(s, "launches a kernel that is not in the kernel arena"));
                };
                let (fi, fo) = (unit.fusion.inputs().len(), unit.fusion.outputs().len());
                if (fi, fo) != (inputs.len(), outputs.len()) {
                    let k = self.names.kernel(p, *kernel);
                    return Err(self.fail(
                        s,
                        format!(
                            "passes {} inputs and {} outputs to {k}, whose fusion has {fi} \
                             inputs and {fo} outputs",
                            inputs.len(),
                            outputs.len()
                        ),
                    ));
                }
                // A kernel computes the whole buffers it is given: stream chunks and device
                // shards are views that the host program cuts (nvFuser refuses a
                // stream-parallel output of a PostOnStream the same way).
                let kf = &unit.fusion;
                for t in kf.tensors_in_order() {
                    // Parsed kernel blocks keep their schedule steps unapplied.
                    let scheduled = kf.tensor(t).schedule.iter().filter_map(|st| match &st.op {
                        ScheduleOp::OuterSplit { parallel, .. }
                        | ScheduleOp::InnerSplit { parallel, .. } => *parallel,
                        ScheduleOp::Parallelize { parallel, .. }
                        | ScheduleOp::Swizzle1d { parallel, .. } => Some(*parallel),
                        _ => None,
                    });
                    let parallel = kf
                        .tensor(t)
                        .loop_domain
                        .iter()
                        .map(|i| kf.id(*i).parallel)
                        .chain(scheduled)
                        .find(|pt| *pt != ParallelType::Serial);
                    if let Some(pt) = parallel {
                        let k = self.names.kernel(p, *kernel);
                        return Err(self.fail(
                            s,
                            format!(
                                "launches {k}, whose fusion makes `{}` {pt}-parallel; a kernel \
                                 computes the whole buffers it is given (stream chunks and \
                                 device shards are views that the host program cuts)",
                                kf.tensor(t).name
                            ),
                        ));
                    }
                }
                // Each buffer holds the element type of the kernel's tensor. (Not its sizes:
                // a kernel block states the whole tensor's, and a loop launches it on each
                // chunk's view.)
                let params = kf.inputs().iter().chain(kf.outputs());
                for (t, &buffer) in params.zip(inputs.iter().chain(outputs.iter())) {
                    let tv = kf.tensor(*t);
                    let Some(host) = p.tensors.get(buffer) else {
                        continue;
                    };
                    let k = self.names.kernel(p, *kernel);
                    if host.dtype != tv.dtype {
                        let b = self.t(buffer);
                        return Err(self.fail(
                            s,
                            format!(
                                "passes {b} ({}) as `{}` of {k}, which is {}",
                                host.dtype, tv.name, tv.dtype
                            ),
                        ));
                    }
                }
                self.access(s, state, &fx)?;
            }
            Stmt::Matmul { .. } | Stmt::Linear { .. } => self.access(s, state, &fx)?,
            Stmt::Communication(c) => {
                let kind = c.kind.name();
                match (c.kind.has_root(), c.root.is_some()) {
                    (true, false) => {
                        return Err(self.fail(s, format!("`type={kind}` needs a `root=`")));
                    }
                    (false, true) => {
                        return Err(self.fail(s, format!("`type={kind}` takes no `root=`")));
                    }
                    _ => {}
                }
                match (c.kind.is_reduction(), c.red_op.is_some()) {
                    (true, false) => {
                        return Err(self.fail(s, format!("`type={kind}` needs a `red_op=`")));
                    }
                    (false, true) => {
                        return Err(self.fail(
                            s,
                            format!("`type={kind}` takes no `red_op=` (it does not reduce)"),
                        ));
                    }
                    _ => {}
                }
                if c.teams.is_empty() {
                    return Err(self.fail(s, "has no team"));
                }
                let mut seen = Vec::new();
                for d in c.teams.iter().flatten() {
                    if seen.contains(d) {
                        return Err(self.fail(
                            s,
                            format!("lists device {d} twice in its teams (teams are disjoint)"),
                        ));
                    }
                    seen.push(*d);
                }
                self.access(s, state, &fx)?;
                self.post(s, fx.contents());
            }
            Stmt::P2PCommunication(_) => {
                self.access(s, state, &fx)?;
                if matches!(self.group.last(), Some(Some(_))) {
                    self.grouped.insert(s, ());
                    if let Some(v) = self.pending.last_mut() {
                        v.push(Pending {
                            comm: s,
                            buffers: fx.contents(),
                            in_group: true,
                        });
                    }
                } else {
                    self.post(s, fx.contents());
                }
            }
            Stmt::StartCoalescing => {
                if let Some(g) = self.group.last_mut() {
                    *g = Some(s);
                }
            }
            Stmt::EndCoalescing => {
                let open = self.group.last_mut().and_then(Option::take);
                if open.is_none() {
                    return Err(self.fail(
                        s,
                        "closes no coalescing group: no `StartCoalescing` before it in this scope",
                    ));
                }
                let mut buffers = Vec::new();
                if let Some(v) = self.pending.last_mut() {
                    v.retain(|pd| {
                        if pd.in_group {
                            buffers.extend(pd.buffers.iter().copied());
                        }
                        !pd.in_group
                    });
                }
                self.post(s, buffers);
            }
            Stmt::Wait { comm } => self.wait(s, state, *comm)?,
        }
        Ok(())
    }

    fn post(&mut self, comm: StmtId, buffers: Vec<(HostTensorId, bool)>) {
        if let Some(v) = self.pending.last_mut() {
            v.push(Pending {
                comm,
                buffers,
                in_group: false,
            });
        }
    }

    /// Reads, then writes, of a compute or communication statement.
    fn access(&mut self, s: StmtId, state: &mut State, fx: &Effects) -> VResult {
        for t in fx.reads() {
            self.need(s, state, t, "reads")?;
            self.touch_as(s, state, t, "reads", true)?;
        }
        for t in fx.writes() {
            self.usable_parents(s, state, t, "writes")?;
            self.touch(s, state, t, "writes")?;
            if state.defined.insert(t, ()).is_none() {
                state.freed.remove(t);
                state.loop_local.remove(t);
            }
        }
        Ok(())
    }

    fn for_loop(
        &mut self,
        s: StmtId,
        state: &mut State,
        index: ScalarId,
        stmts: &[StmtId],
    ) -> VResult {
        if self.loops.len() >= MAX_LOOP_DEPTH {
            return Err(self.fail(
                s,
                format!("nests loops deeper than {MAX_LOOP_DEPTH} levels"),
            ));
        }
        if !matches!(self.p.scalars.get(index), Some(HostScalar::LoopIndex)) {
            let i = self.names.scalar(self.p, index);
            return Err(self.fail(s, format!("binds `{i}`, which is not a loop index scalar")));
        }
        if let Some(other) = self.loop_of.insert(index, s) {
            if other != s {
                let i = self.names.scalar(self.p, index);
                return Err(self.fail(
                    s,
                    format!("binds loop index {i}, which another FOR already binds"),
                ));
            }
        }
        let mut inner = state.clone();
        inner.indices.insert(index, ());
        inner.from_outside = state.defined.clone();
        self.loops.push(s);
        let result = self.scope(stmts, &mut inner);
        self.loops.pop();
        result?;
        for (t, ()) in inner.defined {
            if !state.defined.contains_key(t) {
                state.loop_local.insert(t, s);
            }
        }
        Ok(())
    }

    fn wait(&mut self, s: StmtId, state: &mut State, comm: StmtId) -> VResult {
        let p = self.p;
        let Some(target) = p.stmts.get(comm) else {
            return Err(self.fail(
                s,
                "waits for a statement that is not in the statement arena",
            ));
        };
        if !target.is_communication() {
            let q = self.quote(comm);
            return Err(self.fail(s, format!("waits for {q}, which is not a communication")));
        }
        if self.grouped.contains_key(comm) {
            let q = self.quote(comm);
            return Err(self.fail(
                s,
                format!(
                    "waits for {q}, which is inside a coalescing group; wait for the group's \
                     `EndCoalescing` instead"
                ),
            ));
        }
        let here = self
            .pending
            .last()
            .and_then(|v| v.iter().position(|pd| pd.comm == comm && !pd.in_group));
        let Some(i) = here else {
            let q = self.quote(comm);
            let outer = self
                .pending
                .iter()
                .rev()
                .skip(1)
                .flatten()
                .any(|pd| pd.comm == comm);
            let why = if outer {
                "which was posted outside this loop body; a `Wait` must follow its \
                 communication in the same scope"
            } else {
                "which is not in flight here (it is already waited for, comes later, or sits \
                 in another scope)"
            };
            return Err(self.fail(s, format!("waits for {q}, {why}")));
        };
        let done = self.pending.last_mut().map(|v| v.remove(i));
        // The Wait uses the communication's buffers: they must still be defined.
        for (b, _) in done.map(|pd| pd.buffers).unwrap_or_default() {
            self.need(s, state, b, "waits on")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! Violations that text cannot express (it always places a statement once, in one
    //! scope, with ids from their arenas); the textual rules are in tests/verify_errors.rs.

    use weave_ir::{DType, MemoryType, Scalar};

    use super::*;
    use crate::builder::ScopeRef;
    use crate::syntax::{Communication, CommunicationType};

    fn message(p: &HostProgram) -> String {
        verify(p).unwrap_err().message
    }

    #[test]
    fn a_statement_sits_in_one_scope() {
        let mut p = HostProgram::new();
        let s = p.push(ScopeRef::Top, Stmt::StartCoalescing);
        p.top_level.push(s);
        assert_eq!(
            message(&p),
            "statement `StartCoalescing`: appears more than once in the program (a statement \
             sits in exactly one scope)"
        );
        let mut p = HostProgram::new();
        let (a, b) = (p.constant(0), p.constant(2));
        let (l, _) = p.push_for(ScopeRef::Top, a, b);
        p.scope_mut(ScopeRef::Body(l)).push(l);
        assert_eq!(
            message(&p),
            "statement `FOR i0 from 0 to 2:` in FOR i0: appears more than once in the program \
             (a statement sits in exactly one scope)"
        );
        let mut p = HostProgram::new();
        p.top_level.push(StmtId::default());
        assert_eq!(
            message(&p),
            "the top level holds a statement id that is not in the statement arena"
        );
    }

    #[test]
    fn ids_come_from_their_arenas() {
        let mut p = HostProgram::new();
        let t = p.new_tensor(DType::F32, vec![Scalar::c(4)], MemoryType::Global);
        p.push(ScopeRef::Top, Stmt::Deallocate { tensor: t });
        p.tensors.remove(t);
        assert_eq!(
            message(&p),
            "statement `Deallocate(T?)`: names a tensor that is not in the tensor arena"
        );
    }

    #[test]
    fn a_loop_binds_a_loop_index() {
        let mut p = HostProgram::new();
        let (a, b) = (p.constant(0), p.constant(2));
        p.push(
            ScopeRef::Top,
            Stmt::ForLoop {
                index: a,
                start: a,
                stop: b,
                body: vec![],
            },
        );
        assert_eq!(
            message(&p),
            "statement `FOR 0 from 0 to 2:`: binds `0`, which is not a loop index scalar"
        );
    }

    #[test]
    fn a_wait_names_a_placed_communication() {
        let mut p = HostProgram::new();
        let t = p.add_input(DType::F32, vec![Scalar::c(4)], MemoryType::Global);
        let c = p.stmts.insert(Stmt::Communication(Communication {
            kind: CommunicationType::Allgather,
            teams: vec![vec![0, 1]],
            root: None,
            red_op: None,
            input: t,
            output: t,
        }));
        p.push(ScopeRef::Top, Stmt::Wait { comm: c });
        assert_eq!(
            message(&p),
            "statement `Wait(Communication ?)`: waits for `Communication ? (type=Allgather, \
             team=(0 1), input=T0, output=T0, backend=NCCL)`, which is not in flight here (it is \
             already waited for, comes later, or sits in another scope)"
        );
    }
}
