//! `prefetch-communications`: a stream loop posts the communication of chunk `i + 1` before it
//! computes chunk `i`, so that a collective over data the loop only reads (the allgather at the
//! head of a sequence-parallel block) never queues behind the previous chunk's collectives.
//!
//! Why: a rank's collectives run in the order they are posted — NCCL serializes the kernels of
//! one communicator, and the copy-engine windows pair each rank's transfers by their order. In
//! the loop `assign-streams` leaves, chunk `i + 1`'s allgather is posted after chunk `i`'s
//! reduce-scatter, which waits for chunk `i`'s GEMMs; so the allgather starts only once chunk
//! `i` is done, and chunk `i + 1`'s GEMMs wait for it: the pipeline runs in series
//! (docs/benchmarks.md, the MLP block's timelines). Posted one chunk ahead, it runs beside
//! chunk `i`'s GEMMs, and chunk `i`'s reduce-scatter beside chunk `i + 1`'s.
//!
//! Contract:
//!
//! * **Input**: a host program after `assign-streams` and `allocate-and-deallocate`.
//! * **Which loops**: those whose rest (below) posts a communication too — the place where
//!   posting order costs. A loop that gathers and then only computes (a column-parallel
//!   linear) already posts chunk `i + 1`'s gather right after chunk `i`'s GEMM, so it runs
//!   beside it; such loops are left as they are.
//! * **Output**: every top-level stream loop `FOR i in [0, S)` (`S` not the constant 1) whose
//!   body is a *head* and a *rest* is rewritten. The body must start with the fork of
//!   `assign-streams` (`SetCurrentStream(Stream (i % numberOfStreams))`, then `Synchronize`s),
//!   followed by the head: `ShardByStream` views, kernel launches of data the loop does not
//!   write (into views, cut in the head, of buffers no other statement of the loop writes and
//!   the program touches only through views cut the same way: the permute before a 2-D
//!   mesh's gather; `head_kernel`), and communications each followed in the head by its
//!   `Wait`, at least one. A later communication of the body that could stand in the
//!   head (the conditions below), whose `Wait` is in the body and between whose head's end
//!   and `Wait` nothing touches the buffer it writes, first moves up to the head's end with
//!   its views and its `Wait` (the MLP block's backward gathers the output's gradient after
//!   its first GEMM). A communication of the head must read a tensor that no
//!   statement of the loop writes (a view of it, or the tensor itself), or a buffer a kernel
//!   of the head writes, and write a view `V`,
//!   cut in the head, of a buffer `B` that is no program input or output, that the loop
//!   touches only through views cut exactly like `V`, and that nothing outside the loop reads
//!   or writes (its `Allocate` and `Deallocate` aside). The loop becomes
//!
//!   ```text
//!   FOR j in [0, S + 1):
//!     FOR a in [j, min(j + 1, S)):             # post chunk a's communications
//!       SetCurrentStream(Stream (a % numberOfStreams)); Synchronize(...)
//!       <the head, cut for chunk a: views, kernels, communications, waits>
//!     FOR i in [max(j - 1, 0), j):              # compute chunk i = j - 1
//!       SetCurrentStream(Stream (i % numberOfStreams)); Synchronize(...)
//!       <the head's views the rest uses>; <the rest>
//!   ```
//!
//!   and each such `B` (and each buffer a kernel of the head writes) held in `numberOfStreams`
//!   slots (`allocate-and-deallocate`) holds
//!   `max(numberOfStreams, 2)`: `min(S, max(numberOfStreams, 2))` slots, chunk `i` in slot
//!   `i % max(numberOfStreams, 2)`.
//! * **Why it is safe**: a prefetched communication of chunk `i + 1` runs on chunk `i + 1`'s
//!   stream, and its `Wait` orders that stream's later work (chunk `i + 1`'s compute) after it.
//!   Its input is not written by the loop. Its output slot `(i + 1) % m` (`m` the slot count's
//!   modulus, a multiple of `numberOfStreams` and at least 2) is not chunk `i`'s, and was last
//!   used by chunk `i + 1 - m`, on the same stream and posted before it: stream order
//!   serializes them. With one pool stream the two slots keep chunk `i`'s data while chunk
//!   `i + 1`'s arrives. The CPU backend's race checker runs every scenario so rewritten
//!   (`tests/scenario_sweep.rs`).
//! * **Preserves**: every statement of the rest, in order, and the program's results.
//! * **Idempotent**: a rewritten loop's body is two loops, which no head matches.

use weave_host_ir::access::Access;
use weave_host_ir::ids::SecondaryMap;
use weave_host_ir::{
    HostProgram, HostScalar, HostTensorId, ScalarId, Stmt, StmtId, Stream, StreamId,
};
use weave_ir::{Scalar, ScalarOp};

use crate::assign_streams::{is_stream_slot, number_of_streams};
use crate::pass::{Changed, HostPass, Pass, PassError};
use crate::shared::{binary, find_or_insert_scalar};

/// The `prefetch-communications` pass; see the module documentation for its contract.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PrefetchCommunications;

impl Pass for PrefetchCommunications {
    fn name(&self) -> &'static str {
        "prefetch-communications"
    }

    fn summary(&self) -> &'static str {
        "post a stream loop's communications of loop-invariant data one chunk ahead of its compute"
    }
}

impl HostPass for PrefetchCommunications {
    fn run(&self, p: &mut HostProgram) -> Result<Changed, PassError> {
        Ok(self.run_on(p))
    }
}

impl PrefetchCommunications {
    /// Runs the pass on a host program directly; [`HostPass::run`] forwards here.
    pub fn run_on(&self, p: &mut HostProgram) -> Changed {
        let mut changed = Changed::No;
        let loops: Vec<StmtId> = p.top_level.clone();
        for l in loops {
            if let Some(plan) = Plan::find(p, l) {
                plan.apply(p);
                changed = Changed::Yes;
            }
        }
        changed
    }
}

/// One loop to rewrite, as found.
struct Plan {
    /// The loop statement.
    lp: StmtId,
    /// Its index `i`.
    index: ScalarId,
    /// Its trip count `S`.
    stop: ScalarId,
    /// The fork: `SetCurrentStream` and `Synchronize`s.
    header: Vec<StmtId>,
    /// The head's statements, in order.
    head: Vec<StmtId>,
    /// The rest of the body.
    rest: Vec<StmtId>,
    /// The buffers the head's communications write into (through views cut in the head).
    outputs: Vec<HostTensorId>,
}

impl Plan {
    fn find(p: &HostProgram, lp: StmtId) -> Option<Plan> {
        let Some(Stmt::ForLoop {
            index,
            start,
            stop,
            body,
        }) = p.stmts.get(lp)
        else {
            return None;
        };
        let (index, stop) = (*index, *stop);
        // A loop of at most one iteration has nothing to post ahead.
        if const_value(p, *start) != Some(0) || const_value(p, stop).is_some_and(|n| n <= 1) {
            return None;
        }
        // The fork of `assign-streams`.
        let forked = body
            .iter()
            .take_while(|&&s| {
                matches!(
                    p.stmts[s],
                    Stmt::SetCurrentStream { .. } | Stmt::Synchronize { .. }
                )
            })
            .count();
        let header = body[..forked].to_vec();
        let sets: Vec<StreamId> = header
            .iter()
            .filter_map(|&s| match p.stmts[s] {
                Stmt::SetCurrentStream { stream } => Some(stream),
                _ => None,
            })
            .collect();
        let [set] = sets[..] else { return None };
        let switches_first = header
            .first()
            .is_some_and(|&s| matches!(p.stmts[s], Stmt::SetCurrentStream { .. }));
        if !switches_first {
            return None;
        }
        if !matches!(p.streams[set], Stream::Indexed(k) if is_stream_slot(p, k, index)) {
            return None;
        }
        // No other stream switch in the body: every iteration runs on its own stream.
        let inside = loop_statements(p, body);
        let switches = inside
            .iter()
            .filter(|&&s| matches!(p.stmts[s], Stmt::SetCurrentStream { .. }))
            .count();
        if switches != 1 {
            return None;
        }
        // Later communications of loop-invariant data join the head.
        let bases = Bases::of(p);
        let order = hoisted(p, &bases, lp, body, forked, &inside);
        let body = &order;

        // The head: views, kernels of loop-invariant data, communications and their waits.
        let mut head = Vec::new();
        let mut open: Vec<StmtId> = Vec::new();
        let mut kernel_buffers: Vec<HostTensorId> = Vec::new();
        for &s in &body[forked..] {
            if matches!(p.stmts[s], Stmt::LaunchKernel { .. }) {
                match head_kernel(p, &bases, lp, &inside, &head, s) {
                    Some(buffers) => {
                        kernel_buffers.extend(buffers);
                        head.push(s);
                        continue;
                    }
                    None => break,
                }
            }
            match &p.stmts[s] {
                Stmt::ShardByStream { .. } | Stmt::Communication(_) => {
                    if matches!(p.stmts[s], Stmt::Communication(_)) {
                        open.push(s);
                    }
                    head.push(s);
                }
                Stmt::Wait { comm } if open.contains(comm) => {
                    open.retain(|c| c != comm);
                    head.push(s);
                }
                _ => break,
            }
        }
        // Cut the head after its last wait: views after it belong to the rest.
        let last_wait = head
            .iter()
            .rposition(|&s| matches!(p.stmts[s], Stmt::Wait { .. }))?;
        head.truncate(last_wait + 1);
        kernel_buffers.retain(|&b| {
            head.iter().any(|&s| {
                matches!(&p.stmts[s], Stmt::LaunchKernel { outputs, .. }
                    if outputs.iter().any(|&o| bases.root(o) == b))
            })
        });
        if open.iter().any(|c| head.contains(c)) {
            return None;
        }
        let rest = body[forked + head.len()..].to_vec();
        // Only where the rest posts a communication of its own: there the next chunk's
        // would queue behind it. Without one (a column-parallel linear: gather, then GEMM),
        // chunk `i + 1`'s gather is posted right after chunk `i`'s GEMM and runs beside it
        // already; posting it earlier only puts it ahead of that GEMM on the GPU.
        let rest_posts = loop_statements(p, &rest).iter().any(|&s| {
            matches!(
                p.stmts[s],
                Stmt::Communication(_) | Stmt::P2PCommunication(_)
            )
        });
        if !rest_posts {
            return None;
        }
        // A head's communication is waited for in the head only.
        let waited_later = loop_statements(p, &rest)
            .iter()
            .any(|&s| matches!(p.stmts[s], Stmt::Wait { comm } if head.contains(&comm)));
        if waited_later {
            return None;
        }

        let writes_in_loop = |t: HostTensorId| inside.iter().any(|&s| s_writes(p, &bases, s, t));
        let defined_in_head = |t: HostTensorId| cut_in(p, &head, t).is_some();
        let view_of = |t: HostTensorId| cut_in(p, &head, t);
        let defined_in_loop = |t: HostTensorId| cut_in(p, &inside, t).is_some();
        // Every view of the head cuts a tensor defined before the loop.
        for &s in &head {
            if let Stmt::ShardByStream { input, .. } = &p.stmts[s] {
                if defined_in_loop(*input) {
                    return None;
                }
            }
        }
        let mut outputs = Vec::new();
        for &s in &head {
            let Stmt::Communication(c) = &p.stmts[s] else {
                continue;
            };
            // The input: loop-invariant data.
            // (or what a kernel of the head computed from such data).
            let source = bases.root(view_of(c.input).map_or(c.input, |(_, base)| base));
            let from_kernel = kernel_buffers.contains(&source);
            if (writes_in_loop(source) && !from_kernel)
                || (!defined_in_head(c.input) && defined_in_loop(c.input))
            {
                return None;
            }
            // The output: a view, cut in the head, of a buffer only this loop uses, through
            // views cut the same way.
            let (cut, buffer) = view_of(c.output)?;
            if p.inputs.contains(&buffer) || p.outputs.contains(&buffer) {
                return None;
            }
            if !buffer_used_only_through(p, lp, buffer, cut) {
                return None;
            }
            outputs.push(buffer);
        }
        if outputs.is_empty() {
            return None;
        }
        // The buffers the head's kernels write take slots too.
        for b in kernel_buffers {
            if !outputs.contains(&b) {
                outputs.push(b);
            }
        }
        Some(Plan {
            lp,
            index,
            stop,
            header,
            head,
            rest,
            outputs,
        })
    }

    fn apply(self, p: &mut HostProgram) {
        let zero = find_or_insert_scalar(p, HostScalar::Value(Scalar::c(0)));
        let one = find_or_insert_scalar(p, HostScalar::Value(Scalar::c(1)));
        let two = find_or_insert_scalar(p, HostScalar::Value(Scalar::c(2)));

        // Slots: `max(numberOfStreams, 2)` of them where `numberOfStreams` bounded the buffer.
        let n = number_of_streams(p);
        let modulus = binary(p, ScalarOp::Max, n, two);
        for &buffer in &self.outputs {
            let views: Vec<StmtId> = p
                .walk()
                .map(|w| w.stmt)
                .filter(|&s| matches!(&p.stmts[s], Stmt::ShardByStream { input, .. } if *input == buffer))
                .collect();
            let Some(&first) = views.first() else {
                continue;
            };
            let (axis, holds, index) = match &p.stmts[first] {
                Stmt::ShardByStream {
                    axis, holds, index, ..
                } => (*axis, *holds, *index),
                _ => continue,
            };
            let Some(h) = holds else { continue };
            if !is_stream_slot(p, index, self.index) {
                continue;
            }
            let slots = binary(p, ScalarOp::Min, h.chunks, modulus);
            let slot = binary(p, ScalarOp::Mod, self.index, modulus);
            let chunk = binary(p, ScalarOp::CeilDiv, h.extent, h.chunks);
            let size = binary(p, ScalarOp::Mul, chunk, slots);
            p.tensors[buffer].sizes[axis] = size;
            for v in views {
                if let Stmt::ShardByStream { chunks, index, .. } = &mut p.stmts[v] {
                    *chunks = slots;
                    *index = slot;
                }
            }
        }

        // The two inner loops' indices, and the outer loop's.
        let a = p.scalars.insert(HostScalar::LoopIndex);
        let j = p.scalars.insert(HostScalar::LoopIndex);

        // The posting loop's body: the fork and the head, cut for chunk `a`.
        let mut post = Vec::new();
        for &s in &self.header {
            let copy = match p.stmts[s].clone() {
                Stmt::SetCurrentStream { stream } => Stmt::SetCurrentStream {
                    stream: subst_stream(p, stream, self.index, a),
                },
                Stmt::Synchronize { stream } => Stmt::Synchronize {
                    stream: subst_stream(p, stream, self.index, a),
                },
                other => other,
            };
            post.push(p.stmts.insert(copy));
        }
        let mut renamed: Vec<(HostTensorId, HostTensorId)> = Vec::new();
        for &s in &self.head {
            match p.stmts[s].clone() {
                Stmt::ShardByStream {
                    input,
                    axis,
                    chunks,
                    index,
                    holds,
                    output,
                } => {
                    let fresh = p.tensors.insert(p.tensors[output].clone());
                    renamed.push((output, fresh));
                    let holds = holds.map(|mut h| {
                        h.chunk = subst(p, h.chunk, self.index, a);
                        h.chunks = subst(p, h.chunks, self.index, a);
                        h.extent = subst(p, h.extent, self.index, a);
                        h
                    });
                    let view = Stmt::ShardByStream {
                        input,
                        axis,
                        chunks: subst(p, chunks, self.index, a),
                        index: subst(p, index, self.index, a),
                        holds,
                        output: fresh,
                    };
                    post.push(p.stmts.insert(view));
                }
                Stmt::Communication(mut c) => {
                    let rename = |t: HostTensorId| renamed_to(&renamed, t);
                    c.input = rename(c.input);
                    c.output = rename(c.output);
                    c.root = c.root.map(|r| subst(p, r, self.index, a));
                    p.stmts[s] = Stmt::Communication(c);
                    post.push(s);
                }
                Stmt::LaunchKernel {
                    kernel,
                    inputs,
                    outputs,
                } => {
                    let rename = |t: HostTensorId| renamed_to(&renamed, t);
                    p.stmts[s] = Stmt::LaunchKernel {
                        kernel,
                        inputs: inputs.into_iter().map(rename).collect(),
                        outputs: outputs.into_iter().map(rename).collect(),
                    };
                    post.push(s);
                }
                Stmt::Wait { .. } => post.push(s),
                _ => {}
            }
        }

        // The computing loop's body: the fork, the head's views the rest uses, the rest.
        let used_by_rest = |p: &HostProgram, t: HostTensorId| {
            let inside = loop_statements(p, &self.rest);
            inside.iter().any(|&s| {
                let e = p.stmts[s].effects();
                e.view == Some(t) || e.accesses.iter().any(|&(u, _)| u == t)
            })
        };
        let mut compute = self.header.clone();
        for &s in &self.head {
            if let Stmt::ShardByStream { output, .. } = p.stmts[s] {
                if used_by_rest(p, output) {
                    compute.push(s);
                } else {
                    p.stmts.remove(s);
                    p.tensors.remove(output);
                }
            }
        }
        compute.extend(&self.rest);

        let next = binary(p, ScalarOp::Add, j, one);
        let post_stop = binary(p, ScalarOp::Min, next, self.stop);
        let before = binary(p, ScalarOp::Sub, j, one);
        let compute_start = binary(p, ScalarOp::Max, before, zero);
        let post_loop = p.stmts.insert(Stmt::ForLoop {
            index: a,
            start: j,
            stop: post_stop,
            body: post,
        });
        let compute_loop = p.stmts.insert(Stmt::ForLoop {
            index: self.index,
            start: compute_start,
            stop: j,
            body: compute,
        });
        let outer_stop = binary(p, ScalarOp::Add, self.stop, one);
        if let Stmt::ForLoop {
            index, stop, body, ..
        } = &mut p.stmts[self.lp]
        {
            *index = j;
            *stop = outer_stop;
            *body = vec![post_loop, compute_loop];
        }
    }
}

/// `body` with each later communication that moves data the loop does not write (and its
/// views and its `Wait`) moved up to the end of the head, after the fork `body[..forked]`:
/// where nothing from the head's end to its `Wait` touches the buffer it writes, and that
/// buffer passes the head's own tests. Moving its `Wait` up only orders more of the chunk's
/// work after it. The backward of the MLP block gathers `x` in its head and the output's
/// gradient after the first GEMM; both are then posted a chunk ahead.
fn hoisted(
    p: &HostProgram,
    bases: &Bases,
    lp: StmtId,
    body: &[StmtId],
    forked: usize,
    inside: &[StmtId],
) -> Vec<StmtId> {
    let mut order = body.to_vec();
    // The end of the head as it stands: its views, communications and waits, cut after its
    // last wait.
    let mut end = forked;
    for (k, &s) in order.iter().enumerate().skip(forked) {
        match p.stmts[s] {
            Stmt::Wait { .. } => end = k + 1,
            Stmt::ShardByStream { .. } | Stmt::Communication(_) => {}
            Stmt::LaunchKernel { .. }
                if head_kernel(p, bases, lp, inside, &order[forked..k], s).is_some() => {}
            _ => break,
        }
    }
    let mut k = end;
    while k < order.len() {
        let s = order[k];
        let Stmt::Communication(c) = &p.stmts[s] else {
            k += 1;
            continue;
        };
        let cut = |t: HostTensorId| {
            order[..k].iter().position(
                |&x| matches!(&p.stmts[x], Stmt::ShardByStream { output, .. } if *output == t),
            )
        };
        let wait = order
            .iter()
            .position(|&x| matches!(p.stmts[x], Stmt::Wait { comm } if comm == s));
        let (Some(out_at), Some(w)) = (cut(c.output), wait) else {
            k += 1;
            continue;
        };
        let in_at = cut(c.input);
        let (buffer, source) = match (&p.stmts[order[out_at]], in_at.map(|i| &p.stmts[order[i]])) {
            (
                Stmt::ShardByStream { input: b, .. },
                Some(Stmt::ShardByStream { input: src, .. }),
            ) => (*b, *src),
            (Stmt::ShardByStream { input: b, .. }, None) => (*b, c.input),
            _ => {
                k += 1;
                continue;
            }
        };
        let defined_in_loop = |t: HostTensorId| cut_in(p, inside, t).is_some();
        let source_root = bases.root(source);
        let invariant = !defined_in_loop(source)
            && !inside.iter().any(|&x| s_writes(p, bases, x, source_root))
            && !p.inputs.contains(&buffer)
            && !p.outputs.contains(&buffer)
            && buffer_used_only_through(p, lp, buffer, order[out_at]);
        let mut moving: Vec<usize> = [in_at, Some(out_at), Some(k), Some(w)]
            .into_iter()
            .flatten()
            .filter(|&i| i >= end)
            .collect();
        moving.sort_unstable();
        moving.dedup();
        let touched = (end..=w).filter(|i| !moving.contains(i)).any(|i| {
            let e = p.stmts[order[i]].effects();
            e.view.is_some_and(|t| bases.root(t) == buffer)
                || e.accesses.iter().any(|&(t, _)| bases.root(t) == buffer)
        });
        if !invariant || touched || w < k {
            k += 1;
            continue;
        }
        let stmts: Vec<StmtId> = moving.iter().map(|&i| order[i]).collect();
        for &i in moving.iter().rev() {
            order.remove(i);
        }
        for (j, st) in stmts.into_iter().enumerate() {
            order.insert(end + j, st);
        }
        end += moving.len();
        k = end;
    }
    order
}

/// Whether kernel launch `s`, met in the head of loop `lp` after `before` (the head's
/// statements so far), can be posted ahead with it, and if so the buffers it writes: it reads
/// only data the loop does not write (tensors from before the loop, or views of them cut in
/// `before`), and writes only views cut in `before` of buffers that are no program input or
/// output, that no other statement of the loop writes, and that the program touches only
/// through views cut the same way (the permute of a 2-D mesh's gather).
fn head_kernel(
    p: &HostProgram,
    bases: &Bases,
    lp: StmtId,
    inside: &[StmtId],
    before: &[StmtId],
    s: StmtId,
) -> Option<Vec<HostTensorId>> {
    let Stmt::LaunchKernel {
        inputs, outputs, ..
    } = &p.stmts[s]
    else {
        return None;
    };
    let cut_before = |t: HostTensorId| cut_in(p, before, t);
    let defined_in_loop = |t: HostTensorId| cut_in(p, inside, t).is_some();
    for &t in inputs {
        let root = bases.root(t);
        if inside.iter().any(|&x| s_writes(p, bases, x, root))
            || (cut_before(t).is_none() && defined_in_loop(t))
        {
            return None;
        }
    }
    let mut buffers = Vec::new();
    for &t in outputs {
        let (cut, buffer) = cut_before(t)?;
        if p.inputs.contains(&buffer)
            || p.outputs.contains(&buffer)
            || !buffer_used_only_through(p, lp, buffer, cut)
            || inside
                .iter()
                .any(|&x| x != s && s_writes(p, bases, x, buffer))
        {
            return None;
        }
        buffers.push(buffer);
    }
    Some(buffers)
}

/// `t`, or the fresh tensor it was renamed to in `renamed`.
fn renamed_to(renamed: &[(HostTensorId, HostTensorId)], t: HostTensorId) -> HostTensorId {
    renamed
        .iter()
        .find(|(old, _)| *old == t)
        .map_or(t, |&(_, new)| new)
}

/// The view among `stmts` that cuts `t`, and the tensor it cuts `t` from.
fn cut_in(p: &HostProgram, stmts: &[StmtId], t: HostTensorId) -> Option<(StmtId, HostTensorId)> {
    stmts.iter().find_map(|&x| match &p.stmts[x] {
        Stmt::ShardByStream { input, output, .. } if *output == t => Some((x, *input)),
        _ => None,
    })
}

/// Every statement of `scope`, loops' bodies included.
fn loop_statements(p: &HostProgram, scope: &[StmtId]) -> Vec<StmtId> {
    let mut out = Vec::new();
    for &s in scope {
        out.push(s);
        if let Stmt::ForLoop { body, .. } = &p.stmts[s] {
            out.extend(loop_statements(p, body));
        }
    }
    out
}

/// Whether statement `s` writes `t`, or a view whose base is `t`.
fn s_writes(p: &HostProgram, bases: &Bases, s: StmtId, t: HostTensorId) -> bool {
    p.stmts[s]
        .effects()
        .accesses
        .iter()
        .any(|&(u, access)| access == Access::Write && bases.root(u) == t)
}

/// The tensor each `ShardByStream` view is cut from, for the whole program, read once.
struct Bases(SecondaryMap<HostTensorId, HostTensorId>);

impl Bases {
    fn of(p: &HostProgram) -> Bases {
        let mut bases = SecondaryMap::new();
        for w in p.walk() {
            if let Stmt::ShardByStream { input, output, .. } = &p.stmts[w.stmt] {
                bases.insert(*output, *input);
            }
        }
        Bases(bases)
    }

    /// The buffer at the root of `t`'s chain of views (a chain no longer than the views).
    fn root(&self, t: HostTensorId) -> HostTensorId {
        let mut t = t;
        for _ in 0..=self.0.len() {
            match self.0.get(t) {
                Some(&b) => t = b,
                None => break,
            }
        }
        t
    }
}

/// Whether the program touches `buffer` only through views cut like `cut` inside loop `lp`
/// (and binds and frees it anywhere).
fn buffer_used_only_through(
    p: &HostProgram,
    lp: StmtId,
    buffer: HostTensorId,
    cut: StmtId,
) -> bool {
    let Stmt::ShardByStream {
        axis,
        chunks,
        index,
        holds,
        ..
    } = &p.stmts[cut]
    else {
        return false;
    };
    let Stmt::ForLoop { body, .. } = &p.stmts[lp] else {
        return false;
    };
    let inside = loop_statements(p, body);
    p.walk().all(|w| {
        let s = &p.stmts[w.stmt];
        match s {
            Stmt::Allocate { tensor, .. } | Stmt::Deallocate { tensor } if *tensor == buffer => {
                true
            }
            Stmt::ShardByStream {
                input,
                axis: a,
                chunks: c,
                index: i,
                holds: h,
                ..
            } if *input == buffer => {
                inside.contains(&w.stmt) && a == axis && c == chunks && i == index && h == holds
            }
            _ => {
                let e = s.effects();
                e.view != Some(buffer) && e.accesses.iter().all(|&(u, _)| u != buffer)
            }
        }
    })
}

/// The value of `s` when it is a constant.
fn const_value(p: &HostProgram, s: ScalarId) -> Option<i64> {
    match &p.scalars[s] {
        HostScalar::Value(x) => x.as_const(),
        _ => None,
    }
}

/// `s` with the loop index `from` replaced by `to`.
fn subst(p: &mut HostProgram, s: ScalarId, from: ScalarId, to: ScalarId) -> ScalarId {
    if s == from {
        return to;
    }
    match p.scalars[s].clone() {
        HostScalar::Binary(op, x, y) => {
            let (x2, y2) = (subst(p, x, from, to), subst(p, y, from, to));
            if (x2, y2) == (x, y) {
                s
            } else {
                find_or_insert_scalar(p, HostScalar::Binary(op, x2, y2))
            }
        }
        _ => s,
    }
}

/// `stream` with the loop index `from` replaced by `to`: a new stream value where it changes.
fn subst_stream(p: &mut HostProgram, stream: StreamId, from: ScalarId, to: ScalarId) -> StreamId {
    match p.streams[stream] {
        Stream::Indexed(k) => {
            let k2 = subst(p, k, from, to);
            if k2 == k {
                stream
            } else {
                p.streams.insert(Stream::Indexed(k2))
            }
        }
        Stream::Captured => stream,
    }
}
