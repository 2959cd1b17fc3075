//! `allocate-and-deallocate`: give every buffer the program writes an `Allocate`, bound
//! loop-local stream buffers to `numberOfStreams` slots, and free every intermediate buffer
//! after its last use (reference/nvfuser-host-ir.md §6.2–6.4).
//!
//! Contract:
//!
//! * **Input**: a host program (`Ir::Host`), normally after `assign-streams`. Statements that
//!   write a buffer (`Matmul`/`Linear` `out`, `LaunchKernel` outputs, a `Communication`'s
//!   output, a receiving `P2PCommunication`'s buffer) may write one that nothing binds yet.
//! * **Output**: the same program with three kinds of edits, computed by one analysis over the
//!   nested scopes first and patched in afterwards.
//!
//!   **(a) Allocate.** A *buffer* is a tensor that is not a `ShardByStream` output; a view's
//!   reads and writes are reads and writes of the buffer at the root of its `ShardByStream`
//!   chain. Every buffer that is written, is not a program input and has no `Allocate` gets
//!   `Allocate(t, zero_init=false)` placed right before the first statement (in program order)
//!   of the innermost scope that holds all of its uses — the dominator LCA of its uses, where
//!   a loop dominates its body and nothing in a body dominates what follows the loop. The
//!   allocation is then hoisted out of an enclosing loop (placed before that loop, and the
//!   check repeats one level up) unless the buffer is *iteration-private*: it has no views and
//!   the first access inside the loop body is a direct write, so no iteration reads what
//!   another one wrote. Program outputs are used by the caller after the last statement and
//!   are therefore always allocated at top level. A buffer that already has an `Allocate` is
//!   left alone: whether that definition dominates its uses is the verifier's business.
//!
//!   **(b) `numberOfStreams` slots.** A buffer `t` that is *loop-local stream-parallel* — all of
//!   its uses are, inside one loop `L` over `[0, S)`, views `v = ShardByStream(t, axis,
//!   chunks=S, index=i)` on `L`'s own index `i` (so each iteration owns chunk `i` of the full
//!   extent), the first access to those views in an iteration is a write, `t` is neither read
//!   nor written directly, and it is no program input or output — is rewritten to hold
//!   `slots = min(S, numberOfStreams)` chunks instead of `S`:
//!   ```text
//!   t.sizes[axis] := ceilDiv(t.sizes[axis], S) * slots      # chunk size unchanged
//!   v = ShardByStream(t, axis, chunks=slots, index=( i % numberOfStreams ),
//!                     holds=(chunk=i, chunks=S, extent=old t.sizes[axis]))
//!   ```
//!   A slot is as long as the longest chunk, `ceilDiv(old size, S)`; `holds` narrows the view
//!   of iteration `i` to the length of chunk `i` of the old axis (shorter or empty at the end
//!   of an axis that `S` does not divide), so every view keeps the sizes of the chunk of the
//!   unbounded buffer it replaces.
//!   and (a) then allocates `t` once, before `L`.
//!   *Why it is safe* (§6.4): iteration `i` only touches slot `i % n`, and runs all of its
//!   device work on `Stream (i % n)` (the rewrite requires every `SetCurrentStream` inside `L`
//!   to set exactly that stream; a loop with none runs on one stream, which is safer still).
//!   Iterations `i` and `i + n` therefore share a stream, and stream order serializes every
//!   write of slot `i % n` by iteration `i + n` after every access by iteration `i`. Accesses
//!   by communications are covered because their `Wait` — which orders the current stream
//!   after the communication — lies in the same iteration (every use of the views, and `Wait`
//!   counts as one, lies inside `L`). The index stays in range: for `i < S`, `i % n < slots`
//!   (when `S ≤ n`, `i % n = i < S = slots`; otherwise `slots = n`). When `S ≤ n` the buffer
//!   keeps its size and only the chunk and index expressions change.
//!
//!   **(c) Deallocate.** Every buffer with an `Allocate` that is not a program input, is not
//!   (nor has a view that is) a program output, and has no `Deallocate` yet gets
//!   `Deallocate(t)` right after its last use: the post-dominator LCA of its uses (its
//!   `Allocate`s, every statement reading or writing it or one of its views, each
//!   `ShardByStream` of it, and every `Wait` on a communication whose buffers include it), i.e.
//!   right after the last statement, in program order, of the innermost scope holding all of
//!   them. `Wait` counts as a use of the communication's input and output, so a `Deallocate`
//!   never falls between a `Communication` and its `Wait`. When that last statement is a
//!   stream loop followed by its join (`SetCurrentStream(main)` and a loop of `Synchronize`
//!   only, as `assign-streams` emits), the `Deallocate` goes after the join, on the main
//!   stream that by then has waited for every worker. Views are never deallocated.
//! * **Preserves**: every existing statement, in its scope and order; existing `Allocate` and
//!   `Deallocate` statements; all sizes except those rewritten by (b).
//! * **Idempotent**: after one run every written buffer has an `Allocate` and every freeable
//!   one a `Deallocate`, and the views rewritten by (b) no longer index by the bare loop index,
//!   so a second run reports [`Changed::No`].

use std::collections::HashMap;

use weave_host_ir::access::Access as StmtAccess;
use weave_host_ir::ids::SecondaryMap;
use weave_host_ir::{
    ChunkOf, HostProgram, HostScalar, HostTensorId, ScalarId, Stmt, StmtId, Stream,
};
use weave_ir::ScalarOp;

use crate::assign_streams::{is_stream_slot, number_of_streams, stream_slot};
use crate::pass::{Changed, HostPass, Pass, PassError};
use crate::shared::{binary, push_to};

/// The `allocate-and-deallocate` pass; see the module documentation for its contract.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AllocateAndDeallocate;

impl AllocateAndDeallocate {
    /// Runs the pass on a host program directly; [`HostPass::run`] forwards here.
    pub fn run_on(&self, p: &mut HostProgram) -> Changed {
        let mut changed = Changed::No;

        // (b) first: it rewrites sizes and scalars only, so the analysis stays valid.
        let a = Analysis::new(p);
        let plans: Vec<SlotPlan> = p.tensors.keys().filter_map(|t| a.slot_plan(p, t)).collect();
        for plan in plans {
            plan.apply(p);
            changed = Changed::Yes;
        }

        // (a) and (c): analyze everything, then patch.
        let mut edits = Vec::new();
        // Where each new `Allocate` goes, as the chain of the statement it precedes: it is a
        // use that the `Deallocate` must follow.
        let mut planned: HashMap<HostTensorId, Vec<StmtId>> = HashMap::new();
        for t in p.tensors.keys() {
            if let Some((edit, chain)) = a.allocation(p, t) {
                planned.insert(t, chain);
                edits.push(edit);
            }
        }
        for t in p.tensors.keys() {
            let new_alloc = planned.get(&t).map(Vec::as_slice);
            if new_alloc.is_some() || a.allocs.contains_key(t) {
                if let Some(edit) = a.deallocation(p, t, new_alloc) {
                    edits.push(edit);
                }
            }
        }
        if !edits.is_empty() {
            changed = Changed::Yes;
        }
        apply_edits(p, edits);
        changed
    }
}

impl Pass for AllocateAndDeallocate {
    fn name(&self) -> &'static str {
        "allocate-and-deallocate"
    }

    fn summary(&self) -> &'static str {
        "allocate every written buffer where it is first needed, bound loop-local stream buffers to numberOfStreams slots, free intermediates after their last use"
    }
}

impl HostPass for AllocateAndDeallocate {
    fn run(&self, p: &mut HostProgram) -> Result<Changed, PassError> {
        Ok(self.run_on(p))
    }
}

/// How a statement touches a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Access {
    /// Reads the contents.
    Read,
    /// Overwrites the contents (as the result of a library call, kernel or communication).
    Write,
    /// Makes a view of it (`ShardByStream` input): no access to the contents.
    Alias,
    /// Any other use that extends its lifetime: a `Wait` on a communication of it.
    Other,
}

/// One access of a tensor, at a statement.
#[derive(Clone, Copy, Debug)]
struct Event {
    /// Index into [`Analysis::sites`].
    site: usize,
    /// The tensor named (the buffer itself or one of its views).
    tensor: HostTensorId,
    /// How it is accessed.
    access: Access,
}

/// A statement and its place: `chain` lists its enclosing loops, outermost first, then itself.
#[derive(Clone, Debug)]
struct Site {
    chain: Vec<StmtId>,
}

impl Site {
    fn stmt(&self) -> StmtId {
        *self.chain.last().expect("a chain ends with its statement")
    }
}

/// Everything the pass needs to know about the program, gathered in one walk.
struct Analysis {
    /// Every statement, in program pre-order (a loop before its body).
    sites: Vec<Site>,
    /// Position of each statement in `sites`.
    pos: SecondaryMap<StmtId, usize>,
    /// The tensor a `ShardByStream` output is a view of.
    parent: SecondaryMap<HostTensorId, HostTensorId>,
    /// The accesses of every buffer and its views, keyed by the buffer, in program order.
    events: SecondaryMap<HostTensorId, Vec<Event>>,
    /// Sites of the `Allocate`s of each tensor.
    allocs: SecondaryMap<HostTensorId, Vec<usize>>,
    /// Tensors that have a `Deallocate`.
    deallocated: SecondaryMap<HostTensorId, ()>,
    /// Buffers that are, or have a view that is, a program output.
    output_roots: SecondaryMap<HostTensorId, ()>,
    /// The `StartCoalescing` and `EndCoalescing` around each grouped `P2PCommunication`: an
    /// `Allocate` or `Deallocate` goes outside the group, never inside.
    group_of: SecondaryMap<StmtId, (StmtId, StmtId)>,
}

impl Analysis {
    fn new(p: &HostProgram) -> Analysis {
        let mut a = Analysis {
            sites: Vec::new(),
            pos: SecondaryMap::new(),
            parent: SecondaryMap::new(),
            events: SecondaryMap::new(),
            allocs: SecondaryMap::new(),
            deallocated: SecondaryMap::new(),
            output_roots: SecondaryMap::new(),
            group_of: SecondaryMap::new(),
        };
        let mut comm_buffers: HashMap<StmtId, Vec<HostTensorId>> = HashMap::new();
        let mut groups: Vec<Group> = Vec::new();
        a.walk(
            p,
            &p.top_level,
            &mut Vec::new(),
            &mut comm_buffers,
            &mut groups,
        );

        for site in 0..a.sites.len() {
            let s = a.sites[site].stmt();
            for (tensor, access) in uses(&p.stmts[s], &comm_buffers) {
                let root = a.root(tensor);
                push_to(
                    &mut a.events,
                    root,
                    Event {
                        site,
                        tensor,
                        access,
                    },
                );
            }
        }
        a.output_roots = p.outputs.iter().map(|&t| (a.root(t), ())).collect();
        a
    }

    fn walk(
        &mut self,
        p: &HostProgram,
        scope: &[StmtId],
        chain: &mut Vec<StmtId>,
        comm_buffers: &mut HashMap<StmtId, Vec<HostTensorId>>,
        groups: &mut Vec<Group>,
    ) {
        for &s in scope {
            chain.push(s);
            self.pos.insert(s, self.sites.len());
            self.sites.push(Site {
                chain: chain.clone(),
            });
            let fx = p.stmts[s].effects();
            if let Some(t) = fx.allocates() {
                let site = self.sites.len() - 1;
                push_to(&mut self.allocs, t, site);
            }
            if let Some(t) = fx.frees() {
                self.deallocated.insert(t, ());
            }
            if let (Some(view), Some(of)) = (fx.view, fx.viewed()) {
                self.parent.insert(view, of);
            }
            // The buffers a `Wait` on this statement uses: those of its contents.
            let contents = || fx.contents().into_iter().map(|(t, _)| t);
            match &p.stmts[s] {
                Stmt::ForLoop { body, .. } => self.walk(p, body, chain, comm_buffers, groups),
                Stmt::Communication(_) => {
                    comm_buffers.insert(s, contents().collect());
                }
                Stmt::P2PCommunication(_) => match groups.last_mut() {
                    Some(group) => {
                        group.buffers.extend(contents());
                        group.members.push(s);
                    }
                    None => {
                        comm_buffers.insert(s, contents().collect());
                    }
                },
                Stmt::StartCoalescing => groups.push(Group {
                    start: s,
                    buffers: Vec::new(),
                    members: Vec::new(),
                }),
                Stmt::EndCoalescing => {
                    if let Some(group) = groups.pop() {
                        for m in group.members {
                            self.group_of.insert(m, (group.start, s));
                        }
                        // A `Wait` on the group is a use of every buffer posted in it.
                        comm_buffers.insert(s, group.buffers);
                    }
                }
                Stmt::Allocate { .. }
                | Stmt::Deallocate { .. }
                | Stmt::ShardByStream { .. }
                | Stmt::GetCurrentStream { .. }
                | Stmt::SetCurrentStream { .. }
                | Stmt::Synchronize { .. }
                | Stmt::LaunchKernel { .. }
                | Stmt::Matmul { .. }
                | Stmt::Linear { .. }
                | Stmt::Wait { .. } => {}
            }
            chain.pop();
        }
    }

    /// The buffer at the root of `t`'s `ShardByStream` chain (`t` itself for a buffer).
    fn root(&self, mut t: HostTensorId) -> HostTensorId {
        // The bound guards against a malformed cycle of views.
        for _ in 0..=self.parent.len() {
            match self.parent.get(t) {
                Some(&up) => t = up,
                None => break,
            }
        }
        t
    }

    fn events(&self, t: HostTensorId) -> &[Event] {
        self.events.get(t).map_or(&[], Vec::as_slice)
    }

    /// (a): where `t` gets its `Allocate`, if it needs one, and the chain of the statement
    /// the `Allocate` precedes.
    fn allocation(&self, p: &HostProgram, t: HostTensorId) -> Option<(Edit, Vec<StmtId>)> {
        let events = self.events(t);
        if self.parent.contains_key(t)
            || p.inputs.contains(&t)
            || self.allocs.contains_key(t)
            || !events.iter().any(|e| e.access == Access::Write)
        {
            return None;
        }
        let chains: Vec<&[StmtId]> = events
            .iter()
            .map(|e| self.sites[e.site].chain.as_slice())
            .collect();
        let mut depth = if self.output_roots.contains_key(t) {
            // The caller reads an output after the last top-level statement.
            0
        } else {
            common_depth(&chains)
        };
        while depth > 0 && !self.iteration_private(t, events) {
            depth -= 1;
        }
        let anchor = chains
            .iter()
            .map(|c| c[depth])
            .min_by_key(|s| self.pos[*s])
            .expect("a written tensor has a use");
        let anchor = self.group_of.get(anchor).map_or(anchor, |g| g.0);
        let scope = if depth == 0 {
            None
        } else {
            Some(chains[0][depth - 1])
        };
        let mut chain = chains[0][..depth].to_vec();
        chain.push(anchor);
        let edit = Edit {
            scope,
            anchor,
            place: Place::Before,
            stmt: Stmt::Allocate {
                tensor: t,
                zero_init: false,
            },
        };
        Some((edit, chain))
    }

    /// Whether one iteration of any loop enclosing every use of `t` never reads what another
    /// wrote: no views (those index slices that belong to different iterations) and the first
    /// access is a direct write.
    fn iteration_private(&self, t: HostTensorId, events: &[Event]) -> bool {
        !events
            .iter()
            .any(|e| e.tensor != t || e.access == Access::Alias)
            && events
                .first()
                .is_some_and(|e| e.tensor == t && e.access == Access::Write)
    }

    /// (c): where `t` gets its `Deallocate`, if it needs one; `new_alloc` is the chain of the
    /// statement before which this run places an `Allocate` of `t`.
    fn deallocation(
        &self,
        p: &HostProgram,
        t: HostTensorId,
        new_alloc: Option<&[StmtId]>,
    ) -> Option<Edit> {
        if self.parent.contains_key(t)
            || p.inputs.contains(&t)
            || self.output_roots.contains_key(t)
            || self.deallocated.contains_key(t)
        {
            return None;
        }
        let mut chains: Vec<&[StmtId]> = self
            .events(t)
            .iter()
            .map(|e| self.sites[e.site].chain.as_slice())
            .collect();
        if let Some(allocs) = self.allocs.get(t) {
            chains.extend(allocs.iter().map(|&s| self.sites[s].chain.as_slice()));
        }
        chains.extend(new_alloc);
        if chains.is_empty() {
            return None;
        }
        let depth = common_depth(&chains);
        let last = chains
            .iter()
            .map(|c| c[depth])
            .max_by_key(|s| self.pos[*s])
            .expect("non-empty");
        let scope = if depth == 0 {
            None
        } else {
            Some(chains[0][depth - 1])
        };
        let last = self.group_of.get(last).map_or(last, |g| g.1);
        let anchor = skip_join(p, scope, last);
        Some(Edit {
            scope,
            anchor,
            place: Place::After,
            stmt: Stmt::Deallocate { tensor: t },
        })
    }

    /// (b): the slot rewrite of `t`, when `t` is a loop-local stream-parallel buffer.
    fn slot_plan(&self, p: &HostProgram, t: HostTensorId) -> Option<SlotPlan> {
        if self.parent.contains_key(t) || p.inputs.contains(&t) || self.output_roots.contains_key(t)
        {
            return None;
        }
        let events = self.events(t);
        // `t` itself may only be cut into views; everything else goes through them.
        if events
            .iter()
            .any(|e| e.tensor == t && e.access != Access::Alias)
        {
            return None;
        }
        let views: Vec<StmtId> = events
            .iter()
            .filter(|e| e.tensor == t)
            .map(|e| self.sites[e.site].stmt())
            .collect();
        let first_view = *views.first()?;
        let Stmt::ShardByStream {
            axis,
            chunks,
            index,
            ..
        } = p.stmts[first_view]
        else {
            return None;
        };
        // The loop whose own index selects the chunk.
        let lp = *self.sites[self.pos[first_view]]
            .chain
            .iter()
            .find(|&&s| matches!(p.stmts[s], Stmt::ForLoop { index: i, .. } if i == index))?;
        let Stmt::ForLoop {
            start, stop, body, ..
        } = &p.stmts[lp]
        else {
            return None;
        };
        if !is_const(p, *start, 0) || !same_scalar(p, chunks, *stop) {
            return None;
        }
        for &v in &views {
            match p.stmts[v] {
                Stmt::ShardByStream {
                    axis: a,
                    chunks: c,
                    index: i,
                    ..
                } if a == axis && i == index && same_scalar(p, c, chunks) => {}
                _ => return None,
            }
        }
        // Every use lies inside one iteration of `lp`.
        if !events
            .iter()
            .all(|e| self.sites[e.site].chain.contains(&lp))
        {
            return None;
        }
        // At most one `Allocate`, before `lp` in the scope that holds `lp`.
        match self.allocs.get(t).map(Vec::as_slice) {
            None | Some([]) => {}
            Some([site]) => {
                let a = &self.sites[*site].chain;
                let l = &self.sites[self.pos[lp]].chain;
                if a.len() != l.len()
                    || a[..a.len() - 1] != l[..l.len() - 1]
                    || site > &self.pos[lp]
                {
                    return None;
                }
            }
            Some(_) => return None,
        }
        // The first access of the slot in an iteration writes it.
        if !events
            .iter()
            .find(|e| e.access != Access::Alias)
            .is_some_and(|e| e.access == Access::Write && self.parent.get(e.tensor) == Some(&t))
        {
            return None;
        }
        // Iterations `i` and `i + n` must share a stream.
        if !streams_follow_slots(p, body, index) {
            return None;
        }
        if axis >= p.tensors[t].sizes.len() {
            return None;
        }
        Some(SlotPlan {
            tensor: t,
            axis,
            chunks,
            loop_index: index,
            views,
        })
    }
}

/// An open coalescing group during the walk.
struct Group {
    start: StmtId,
    buffers: Vec<HostTensorId>,
    members: Vec<StmtId>,
}

/// The rewrite of (b) for one buffer.
struct SlotPlan {
    tensor: HostTensorId,
    axis: usize,
    chunks: ScalarId,
    loop_index: ScalarId,
    views: Vec<StmtId>,
}

impl SlotPlan {
    fn apply(self, p: &mut HostProgram) {
        let n = number_of_streams(p);
        let s = self.chunks;
        let slots = binary(p, ScalarOp::Min, s, n);

        // The chunk size of the original view (`ShardByStream` cuts ceilDiv-sized chunks).
        let size = p.tensors[self.tensor].sizes[self.axis];
        let chunk = binary(p, ScalarOp::CeilDiv, size, s);
        let new_size = binary(p, ScalarOp::Mul, chunk, slots);
        p.tensors[self.tensor].sizes[self.axis] = new_size;

        // A slot is as long as the longest chunk; each view is narrowed to the chunk that its
        // iteration holds, which is shorter (or empty) at the end of an axis that `s` does
        // not divide.
        let holds = ChunkOf {
            chunk: self.loop_index,
            chunks: s,
            extent: size,
        };
        let slot = stream_slot(p, self.loop_index);
        for v in self.views {
            if let Stmt::ShardByStream {
                chunks,
                index,
                holds: h,
                ..
            } = &mut p.stmts[v]
            {
                *chunks = slots;
                *index = slot;
                *h = Some(holds);
            }
        }
    }
}

/// Whether every `SetCurrentStream` in `scope` (recursively) sets `Stream (index %
/// numberOfStreams)`.
fn streams_follow_slots(p: &HostProgram, scope: &[StmtId], index: ScalarId) -> bool {
    scope.iter().all(|&s| match &p.stmts[s] {
        Stmt::SetCurrentStream { stream } => {
            matches!(p.streams[*stream], Stream::Indexed(k) if is_stream_slot(p, k, index))
        }
        Stmt::ForLoop { body, .. } => streams_follow_slots(p, body, index),
        _ => true,
    })
}

/// Whether `s` is the constant `v`.
fn is_const(p: &HostProgram, s: ScalarId, v: i64) -> bool {
    matches!(&p.scalars[s], HostScalar::Value(x) if x.as_const() == Some(v))
}

/// Whether two scalars are the same expression (loop indices only when they are the same id).
fn same_scalar(p: &HostProgram, a: ScalarId, b: ScalarId) -> bool {
    if a == b {
        return true;
    }
    match (&p.scalars[a], &p.scalars[b]) {
        (HostScalar::Value(x), HostScalar::Value(y)) => x == y,
        (HostScalar::Binary(o1, a1, b1), HostScalar::Binary(o2, a2, b2)) => {
            o1 == o2 && same_scalar(p, *a1, *a2) && same_scalar(p, *b1, *b2)
        }
        _ => false,
    }
}

/// The tensors a statement uses and how, in the order it touches them: its
/// [`Stmt::effects`], and for a `Wait` every buffer of the communication it waits for.
/// `Allocate` and `Deallocate` are left out (the analysis records them apart).
fn uses(
    stmt: &Stmt,
    comm_buffers: &HashMap<StmtId, Vec<HostTensorId>>,
) -> Vec<(HostTensorId, Access)> {
    let fx = stmt.effects();
    let waited = fx
        .waits_for
        .and_then(|comm| comm_buffers.get(&comm))
        .into_iter()
        .flatten()
        .map(|&t| (t, Access::Other));
    fx.accesses
        .iter()
        .filter_map(|&(t, access)| match access {
            StmtAccess::Read => Some((t, Access::Read)),
            StmtAccess::Write => Some((t, Access::Write)),
            StmtAccess::View => Some((t, Access::Alias)),
            StmtAccess::Allocate | StmtAccess::Free => None,
        })
        .chain(waited)
        .collect()
}

/// The depth of the innermost scope holding every chain's statement: the largest `d` such
/// that every chain is longer than `d` and all agree on their first `d` loops. The scope is
/// then the body of `chain[d - 1]` (top level for `d = 0`) and `chain[d]` is the statement
/// of that scope that holds the use.
fn common_depth(chains: &[&[StmtId]]) -> usize {
    let min_len = chains.iter().map(|c| c.len()).min().unwrap_or(0);
    let mut d = 0;
    while d + 1 < min_len && chains.iter().all(|c| c[d] == chains[0][d]) {
        d += 1;
    }
    d
}

/// When `last` is a stream loop followed by its join (`SetCurrentStream` of a captured stream,
/// then a loop of `Synchronize` only), the join loop; else `last`.
fn skip_join(p: &HostProgram, scope: Option<StmtId>, last: StmtId) -> StmtId {
    if !matches!(p.stmts[last], Stmt::ForLoop { .. }) {
        return last;
    }
    let stmts = scope_of(p, scope);
    let Some(i) = stmts.iter().position(|&s| s == last) else {
        return last;
    };
    let (Some(&set), Some(&join)) = (stmts.get(i + 1), stmts.get(i + 2)) else {
        return last;
    };
    let sets_main = matches!(p.stmts[set], Stmt::SetCurrentStream { stream }
        if p.streams[stream] == Stream::Captured);
    let is_join = matches!(&p.stmts[join], Stmt::ForLoop { body, .. }
        if !body.is_empty()
            && body.iter().all(|&b| matches!(p.stmts[b], Stmt::Synchronize { .. })));
    if sets_main && is_join {
        join
    } else {
        last
    }
}

/// Where an [`Edit`] puts its statement relative to the anchor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    Before,
    After,
}

/// One statement to insert next to an anchor in a scope.
struct Edit {
    /// The loop whose body holds the anchor; `None` for top level.
    scope: Option<StmtId>,
    anchor: StmtId,
    place: Place,
    stmt: Stmt,
}

fn scope_of(p: &HostProgram, scope: Option<StmtId>) -> &[StmtId] {
    match scope {
        None => &p.top_level,
        Some(lp) => match &p.stmts[lp] {
            Stmt::ForLoop { body, .. } => body,
            _ => &[],
        },
    }
}

fn scope_mut(p: &mut HostProgram, scope: Option<StmtId>) -> Option<&mut Vec<StmtId>> {
    match scope {
        None => Some(&mut p.top_level),
        Some(lp) => match &mut p.stmts[lp] {
            Stmt::ForLoop { body, .. } => Some(body),
            _ => None,
        },
    }
}

/// Inserts the edits in order. Several `Before` edits on one anchor keep their order (each
/// lands right before the anchor); several `After` edits on one anchor too (each lands after
/// the previous one).
fn apply_edits(p: &mut HostProgram, edits: Vec<Edit>) {
    let mut last_after: HashMap<StmtId, StmtId> = HashMap::new();
    for edit in edits {
        let new = p.stmts.insert(edit.stmt);
        let Some(scope) = scope_mut(p, edit.scope) else {
            continue;
        };
        let (target, offset) = match edit.place {
            Place::Before => (edit.anchor, 0),
            Place::After => (*last_after.get(&edit.anchor).unwrap_or(&edit.anchor), 1),
        };
        let Some(i) = scope.iter().position(|&s| s == target) else {
            continue;
        };
        scope.insert(i + offset, new);
        if edit.place == Place::After {
            last_after.insert(edit.anchor, new);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weave_ir::Scalar;

    #[test]
    fn common_depth_finds_the_innermost_shared_scope() {
        let mut p = HostProgram::default();
        let s: Vec<StmtId> = (0..3)
            .map(|_| p.stmts.insert(Stmt::StartCoalescing))
            .collect();
        let (l, a, b) = (s[0], s[1], s[2]);
        assert_eq!(common_depth(&[&[l], &[l, a]]), 0);
        assert_eq!(common_depth(&[&[l, a], &[l, b]]), 1);
        assert_eq!(common_depth(&[&[l, a]]), 1);
        assert_eq!(common_depth(&[&[a], &[b]]), 0);
    }

    #[test]
    fn min_formula_is_min() {
        let (s, n) = (Scalar::named("S"), Scalar::named("n"));
        let slots = s.min(n);
        for sv in 1..12i64 {
            for nv in 1..9i64 {
                let lookup = |name: &str| match name {
                    "S" => Some(sv),
                    "n" => Some(nv),
                    _ => None,
                };
                assert_eq!(slots.eval(&lookup), Some(sv.min(nv)), "S={sv} n={nv}");
            }
        }
    }
}
