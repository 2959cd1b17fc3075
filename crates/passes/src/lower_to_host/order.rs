//! The run order of segments and the stream loops they form: which segments move before or
//! into a loop, each segment's reference Stream axis, accumulating matmuls, opening and closing
//! loops.

use std::collections::HashMap;

use weave_host_ir::{HostScalar, Stmt};
use weave_ir::{
    Diagnostic, ExprId, ExprKind, IterDomainId, IterType, ParallelType, Scalar, ScalarOp, TensorId,
};
use weave_segmenter::{SegmentId, SegmentedFusion};

use super::{loop_axis, Lowering, OpenLoop};

impl Lowering<'_> {
    /// Whether segment `seg` reads a tensor that one of `segs` produces.
    fn reads_from(&self, sf: &SegmentedFusion, seg: SegmentId, segs: &[SegmentId]) -> bool {
        sf.segment(seg)
            .inputs()
            .iter()
            .any(|t| self.producer.get(*t).is_some_and(|p| segs.contains(p)))
    }

    /// The order segments are lowered in (see the module contract), and [`Self::loop_of`]
    /// for each.
    pub(super) fn run_order(&mut self, sf: &SegmentedFusion) -> Result<Vec<SegmentId>, Diagnostic> {
        let mut order: Vec<SegmentId> = sf.run_order().to_vec();
        let mut key: HashMap<SegmentId, Option<IterDomainId>> = HashMap::new();
        for &seg in &order {
            let stream = self.reference_stream(sf.segment(seg).exprs())?;
            key.insert(seg, stream.map(|(_, sid)| sid));
        }
        // A matmul that contracts over a streamed axis joins the loop of that axis and
        // accumulates chunk by chunk, unless a segment of a stream loop reads its result
        // (which would see a partial sum): then it runs whole at top level, as before.
        for &seg in &order {
            if key[&seg].is_some() {
                continue;
            }
            let exprs = sf.segment(seg).exprs();
            let rooted = self.stream_rooted_reduce(exprs);
            if let Some((_, Some(d))) = rooted {
                self.ring_reduces.insert(seg, d);
            }
            let Some(stream) = rooted
                .map(|(stream, _)| stream)
                .or_else(|| self.accumulating_stream(exprs))
            else {
                continue;
            };
            let read_in_a_loop = sf
                .segment(seg)
                .outputs()
                .iter()
                .flat_map(|t| self.consumers.get(*t).into_iter().flatten())
                .any(|c| key[c].is_some());
            if !read_in_a_loop {
                self.accumulating.insert(seg, stream);
            }
        }
        for (seg, (_, sid)) in &self.accumulating {
            key.insert(*seg, Some(*sid));
        }
        let mut i = 1;
        while i < order.len() {
            let (Some(prev), None) = (key[&order[i - 1]], key[&order[i]]) else {
                i += 1;
                continue;
            };
            // The next stream segment after this run of top-level segments.
            let next = order[i..].iter().find_map(|s| key[s]);
            if !next.is_some_and(|n| self.same_loop(prev, n)) {
                i += 1;
                continue;
            }
            // The start of the loop run that ends at i - 1.
            let mut start = i - 1;
            while start > 0 && key[&order[start - 1]].is_some_and(|k| self.same_loop(prev, k)) {
                start -= 1;
            }
            if self.reads_from(sf, order[i], &order[start..i]) {
                i += 1;
                continue;
            }
            let seg = order.remove(i);
            order.insert(start, seg);
            // Keep scanning from the same index: the next top-level segment may move too.
        }
        // The other way round: a later segment of the same loop that reads nothing the
        // top-level segments after the loop (or anything else in between) produce moves up
        // into the loop, so the loop stays one (a weight gradient's GEMM after the loop, and
        // the transpose of another per-chunk gradient that the segmenter ordered after it).
        let mut i = 1;
        while i < order.len() {
            let (Some(prev), None) = (key[&order[i - 1]], key[&order[i]]) else {
                i += 1;
                continue;
            };
            let Some(j) = (i + 1..order.len())
                .find(|j| key[&order[*j]].is_some_and(|k| self.same_loop(prev, k)))
            else {
                i += 1;
                continue;
            };
            if self.reads_from(sf, order[j], &order[i..j]) {
                i += 1;
                continue;
            }
            let seg = order.remove(j);
            order.insert(i, seg);
            i += 1;
        }
        let mut current: Option<(usize, IterDomainId)> = None;
        let mut run: Vec<SegmentId> = Vec::new();
        let mut loops = 0;
        for &seg in &order {
            current = match key[&seg] {
                None => None,
                Some(k) => match current {
                    Some((n, open))
                        if self.same_loop(open, k)
                            && !self.reads_across_chunks(sf, seg, &run, open) =>
                    {
                        Some((n, open))
                    }
                    _ => {
                        loops += 1;
                        run.clear();
                        Some((loops - 1, k))
                    }
                },
            };
            match current {
                Some(_) => run.push(seg),
                None => run.clear(),
            }
            self.loop_of.insert(seg, current.map(|(n, _)| n));
        }
        self.split_ring_loops(sf, &order, loops);
        Ok(order)
    }

    /// A loop whose allgather is a P2P ring (it visits the rank's own chunk first, which needs
    /// no transfer) and whose partial sums leave on a ring too is cut in two before the
    /// product that computes those sums: the first loop gathers and computes up to it, the
    /// second is a ring of its own that computes the rank's own chunk last. In one loop the
    /// sums of the last chunk would leave after everything else (a transfer of a whole block
    /// left exposed); cut, each ring hides its transfers behind its own GEMMs (async-TP's
    /// `fused_all_gather_matmul` and `fused_matmul_reduce_scatter`). The second loop starts
    /// once the first is done, and reads the tensor between them chunk by chunk.
    fn split_ring_loops(&mut self, sf: &SegmentedFusion, order: &[SegmentId], loops: usize) {
        if self.stream_allgather != super::StreamAllgather::P2pRing {
            return;
        }
        let mut next = loops;
        for l in 0..loops {
            let members: Vec<SegmentId> = order
                .iter()
                .copied()
                .filter(|s| self.loop_of.get(s) == Some(&Some(l)))
                .collect();
            let reduces: Vec<SegmentId> = members
                .iter()
                .copied()
                .filter(|s| self.ring_reduces.contains_key(s))
                .collect();
            let gathers: Vec<SegmentId> = members
                .iter()
                .copied()
                .filter(|s| self.communications.contains(s) && !reduces.contains(s))
                .collect();
            let [gather] = gathers[..] else { continue };
            let Some(extent) = reduces.first().map(|r| self.ring_reduces[r]) else {
                continue;
            };
            if !self.is_ring_gather(sf, gather, extent) {
                continue;
            }
            // The first producer of a reduced partial, in the loop after the gather.
            let at = reduces
                .iter()
                .filter_map(|r| {
                    let partial = *sf.segment(*r).inputs().first()?;
                    let g = *self.producer.get(partial)?;
                    members.iter().position(|m| *m == g)
                })
                .min();
            let Some(at) = at.filter(|&at| {
                members
                    .iter()
                    .position(|m| *m == gather)
                    .is_some_and(|g| g < at)
            }) else {
                continue;
            };
            for m in &members[at..] {
                self.loop_of.insert(*m, Some(next));
            }
            next += 1;
        }
    }

    /// Whether communication segment `seg` is a DID → Stream copy that the P2P ring of
    /// `extent` devices carries (a Broadcast rooted at each iteration's device, over the
    /// world in rank order, one chunk per device).
    fn is_ring_gather(&self, sf: &SegmentedFusion, seg: SegmentId, extent: i64) -> bool {
        let [e] = sf.segment(seg).exprs() else {
            return false;
        };
        crate::communication::derive_communication(self.f, *e).is_ok_and(|info| {
            info.kind == weave_host_ir::CommunicationType::Broadcast
                && info.root == Some(crate::communication::RootKind::StreamIndex)
                && info.team.len() as i64 == extent
                && super::collectives::ring_stride(&info.instances) == Some(None)
        })
    }

    /// True if `t` is written and read inside one stream loop only (see the module contract).
    pub(super) fn stays_in_one_loop(&self, t: TensorId) -> bool {
        let Some(Some(l)) = self.producer.get(t).map(|p| self.loop_of[p]) else {
            return false;
        };
        self.consumers
            .get(t)
            .into_iter()
            .flatten()
            .all(|c| self.loop_of[c] == Some(l))
    }

    /// The Stream axis of the most parallel output of the segment, if any.
    pub(super) fn reference_stream(
        &self,
        exprs: &[ExprId],
    ) -> Result<Option<(TensorId, IterDomainId)>, Diagnostic> {
        let f = self.f;
        let mut best: Option<(usize, TensorId)> = None;
        for e in exprs {
            for o in &f.expr(*e).outputs {
                let n = f
                    .tensor(*o)
                    .loop_domain
                    .iter()
                    .filter(|i| f.id(**i).parallel != ParallelType::Serial)
                    .count();
                if best.is_none_or(|(b, _)| n > b) {
                    best = Some((n, *o));
                }
            }
        }
        let Some((_, r)) = best else { return Ok(None) };
        if let Some(id) = f.tensor(r).loop_domain.iter().find(|i| {
            f.id(**i).parallel == ParallelType::Stream && f.id(**i).iter_type == IterType::Reduction
        }) {
            let _ = id;
            return Err(Diagnostic::new(format!(
                "`{}` is stream-parallel on a reduction axis; chunking a reduction needs a cross-chunk accumulation that lowering does not express",
                f.tensor(r).name
            )));
        }
        Ok(loop_axis(f, r, ParallelType::Stream).map(|s| (r, s)))
    }

    /// The producer and its Stream axis that key the loop of a reduction `exprs` (one expr)
    /// whose stream chunks are its output's device blocks (a Reduce rooted at each
    /// iteration's device, `derive_communication`'s `RootKind::StreamIndex`): it runs in the
    /// loop that produces its chunks, though its output has no Stream axis.
    /// With it, the team size when its teams let a P2P ring carry it (the world in rank
    /// order).
    fn stream_rooted_reduce(
        &self,
        exprs: &[ExprId],
    ) -> Option<((TensorId, IterDomainId), Option<i64>)> {
        let [e] = exprs else { return None };
        let info = crate::communication::derive_communication(self.f, *e).ok()?;
        let rooted = info.kind == weave_host_ir::CommunicationType::Reduce
            && info.root == Some(crate::communication::RootKind::StreamIndex);
        let producer = self.f.expr(*e).inputs[0];
        let ring = (super::collectives::ring_stride(&info.instances) == Some(None))
            .then_some(info.team.len() as i64);
        rooted
            .then(|| loop_axis(self.f, producer, ParallelType::Stream))
            .flatten()
            .map(|s| ((producer, s), ring))
    }

    /// The operand and its Stream axis that key the loop of a matmul `exprs` (one expr) whose
    /// contraction axis is streamed: its output has no Stream axis, both operands have rank 2
    /// or more, one operand has a Stream axis cut by outer splits from its contraction axis
    /// (`a`'s last axis, `b`'s second to last), the two contraction axes are mapped, the
    /// other operand's first axis mapped to them is its own contraction axis (so the loop cuts
    /// both along the contraction), and the output's reduction axes carry no parallel type.
    /// `None`: a matmul lowered as before.
    fn accumulating_stream(&self, exprs: &[ExprId]) -> Option<(TensorId, IterDomainId)> {
        let f = self.f;
        let [e] = exprs else { return None };
        let expr = f.expr(*e);
        if let ExprKind::Reduction { .. } = expr.kind {
            return self.accumulating_reduction(*e);
        }
        if !matches!(expr.kind, ExprKind::Matmul) || expr.inputs.len() != 2 {
            return None;
        }
        let out = expr.outputs[0];
        if loop_axis(f, out, ParallelType::Stream).is_some() {
            return None;
        }
        let parallel_reduction = f.tensor(out).loop_domain.iter().any(|i| {
            f.id(*i).iter_type == IterType::Reduction && f.id(*i).parallel != ParallelType::Serial
        });
        if parallel_reduction {
            return None;
        }
        let (a, b) = (expr.inputs[0], expr.inputs[1]);
        let (va, vb) = (f.visible_axes(a), f.visible_axes(b));
        if va.len() < 2 || vb.len() < 2 {
            return None;
        }
        let (ka, kb) = (va[va.len() - 1], vb[vb.len() - 2]);
        if !self.graph.are_mapped(ka, kb) {
            return None;
        }
        // The operand whose own Stream axis is cut from its contraction axis keys the loop.
        let streamed = |t: TensorId, k: IterDomainId| {
            loop_axis(f, t, ParallelType::Stream)
                .filter(|s| self.outer_split_root(t, *s) == Some(k))
                .map(|s| (t, s))
        };
        let (t, sid) = streamed(a, ka).or_else(|| streamed(b, kb))?;
        // The other operand is cut along its contraction axis: by a Stream axis of its own
        // cut from it, or as the first of its axes mapped to the loop's.
        let cut_alike = |u: TensorId, k: IterDomainId, axes: &[IterDomainId]| match loop_axis(
            f,
            u,
            ParallelType::Stream,
        ) {
            Some(s) => self.graph.are_mapped(s, sid) && self.outer_split_root(u, s) == Some(k),
            None => axes.iter().find(|x| self.graph.are_mapped(**x, ka)) == Some(&k),
        };
        let other_ok = if t == a {
            cut_alike(b, kb, &vb)
        } else {
            cut_alike(a, ka, &va)
        };
        other_ok.then_some((t, sid))
    }

    /// A sum over the axis an operand's Stream axis is cut from (the chunks of per-chunk
    /// weight-gradient shards, `grad_w = sum(gw, [0])` with `gw`'s chunk axis streamed): it
    /// joins that axis' loop and accumulates chunk by chunk (`acc += sum(chunk)`, see
    /// `lower_accumulating_reduction`). Requires: one input whose Stream axis is cut from a
    /// reduced axis, an output without a Stream axis, and no parallel reduction axis on the
    /// output (a reduction across devices is a communication, not a kernel).
    fn accumulating_reduction(&self, e: ExprId) -> Option<(TensorId, IterDomainId)> {
        let f = self.f;
        let expr = f.expr(e);
        let ExprKind::Reduction {
            op: weave_ir::ReduceOp::Sum,
            ref axes,
        } = expr.kind
        else {
            return None;
        };
        let ([input], [out]) = (expr.inputs.as_slice(), expr.outputs.as_slice()) else {
            return None;
        };
        if loop_axis(f, *out, ParallelType::Stream).is_some() {
            return None;
        }
        let parallel_reduction = f.tensor(*out).loop_domain.iter().any(|i| {
            f.id(*i).iter_type == IterType::Reduction && f.id(*i).parallel != ParallelType::Serial
        });
        if parallel_reduction {
            return None;
        }
        let visible = f.visible_axes(*input);
        // The running total is the kernel's sum itself: the output has the input's axes but
        // the reduced ones (a partial keeping a device axis of its own is summed after the
        // loop, as before).
        if f.visible_axes(*out).len() + axes.len() != visible.len() {
            return None;
        }
        let sid = loop_axis(f, *input, ParallelType::Stream)?;
        let root = self.outer_split_root(*input, sid)?;
        let position = visible.iter().position(|a| *a == root)?;
        axes.contains(&position).then_some((*input, sid))
    }

    pub(super) fn open_loop_for(
        &mut self,
        stream: Option<(TensorId, IterDomainId)>,
    ) -> Result<(), Diagnostic> {
        let Some((r, sid)) = stream else {
            self.open = None;
            return Ok(());
        };
        let extent = self.f.eval(&self.f.id(sid).extent).ok_or_else(|| {
            Diagnostic::new(format!(
                "the Stream axis of `{}` has no constant extent",
                self.f.tensor(r).name
            ))
        })?;
        if let Some(open) = &self.open {
            if open.extent == extent
                && self.graph.are_mapped(open.stream_id, sid)
                && open.number == self.current_loop()
            {
                return Ok(());
            }
        }
        self.open = None;
        let stream_root = self.outer_split_root(r, sid).ok_or_else(|| {
            Diagnostic::new(format!(
                "stream-parallel tensor `{}` cannot be sliced: its Stream axis does not come from outer splits of one logical axis",
                self.f.tensor(r).name
            ))
        })?;
        let index = self.scalar(HostScalar::LoopIndex);
        // A `swizzle1d(.., DIDx)` on the loop's stream axis (or an axis mapped to it) rotates
        // the chunks by the rank: iteration i visits chunk (rank + i) % extent in every view.
        // A loop whose only communications are Reduces rooted at each iteration's device
        // is a ring that leaves each rank's own chunk for last: iteration i computes chunk
        // (rank + i + 1) % extent and sends its partial to that device while the other
        // chunks' partials of this rank's block arrive (async-TP's matmul + reduce-scatter).
        let reduce_ring = self.only_ring_reduces_in(self.current_loop(), extent);
        // A reduce ring that accumulates in its GEMMs cuts each step into pieces: iteration i
        // is piece `i % k` of step `i / k`, and views piece `i % k` of chunk `(rank + i / k +
        // 1) % extent`, chunk `c * k + q` of `extent * k`.
        let accumulating_ring = reduce_ring && self.loop_accumulates_in_ring();
        let pieces = match self.ring_pieces {
            Some(k) if accumulating_ring => {
                self.check_ring_pieces(stream_root, r, extent, k)?;
                k
            }
            _ => 1,
        };
        let view_index = if reduce_ring {
            let rank = self.scalar(HostScalar::Value(Scalar::builtin(weave_ir::Builtin::Rank)));
            let one = self.constant(1);
            let next = self.scalar(HostScalar::Binary(ScalarOp::Add, rank, one));
            let step = if pieces > 1 {
                let k = self.constant(pieces);
                self.scalar(HostScalar::Binary(ScalarOp::Div, index, k))
            } else {
                index
            };
            let sum = self.scalar(HostScalar::Binary(ScalarOp::Add, next, step));
            let n = self.constant(extent);
            let chunk = self.scalar(HostScalar::Binary(ScalarOp::Mod, sum, n));
            if pieces > 1 {
                let k = self.constant(pieces);
                let first = self.scalar(HostScalar::Binary(ScalarOp::Mul, chunk, k));
                let q = self.scalar(HostScalar::Binary(ScalarOp::Mod, index, k));
                self.scalar(HostScalar::Binary(ScalarOp::Add, first, q))
            } else {
                chunk
            }
        } else if self.swizzled(sid) {
            let rank = self.scalar(HostScalar::Value(Scalar::builtin(weave_ir::Builtin::Rank)));
            let sum = self.scalar(HostScalar::Binary(ScalarOp::Add, rank, index));
            let n = self.constant(extent);
            self.scalar(HostScalar::Binary(ScalarOp::Mod, sum, n))
        } else {
            index
        };
        let start = self.constant(0);
        let stop = self.constant(extent * pieces);
        let stmt = self.emit(Stmt::ForLoop {
            index,
            start,
            stop,
            body: Vec::new(),
        });
        if view_index != index {
            self.rotated.push((stmt, index, view_index));
        }
        self.open = Some(OpenLoop {
            stmt,
            number: self.current_loop(),
            stream_id: sid,
            stream_root_ancestors: self.transform_ancestors(stream_root),
            stream_root,
            extent,
            index,
            view_index,
            bound: weave_host_ir::ids::SecondaryMap::new(),
            ring: reduce_ring,
            pieces,
            accumulating_ring,
        });
        Ok(())
    }

    /// The number of the stream loop the segment being lowered runs in (`None`: top level,
    /// or no segment).
    pub(super) fn current_loop(&self) -> Option<usize> {
        self.current
            .and_then(|c| self.loop_of.get(&c).copied().flatten())
    }

    /// Whether loop `l` holds communications, every one a Reduce that a ring of `extent`
    /// devices can carry ([`Self::ring_reduces`]), and rings are not turned off
    /// (`lower-to-host{allgather=broadcast}` posts collectives everywhere).
    fn only_ring_reduces_in(&self, l: Option<usize>, extent: i64) -> bool {
        let Some(l) = l else { return false };
        let mut in_loop = self
            .communications
            .iter()
            .filter(|c| self.loop_of.get(*c) == Some(&Some(l)))
            .peekable();
        self.stream_allgather == super::StreamAllgather::P2pRing
            && in_loop.peek().is_some()
            && in_loop.all(|c| self.ring_reduces.get(c) == Some(&extent))
    }

    /// A `swizzle1d` only reorders a loop's iterations on each rank. A collective posted per
    /// chunk needs every rank on the same chunk in the same iteration, so a loop that posts
    /// one keeps the natural order: its rotated chunk views go back to the loop index.
    pub(super) fn unrotate_collective_loops(&mut self) {
        for (lp, index, rotated) in std::mem::take(&mut self.rotated) {
            let Stmt::ForLoop { body, .. } = &self.p.stmts[lp] else {
                continue;
            };
            let body = body.clone();
            let collective = body
                .iter()
                .any(|s| matches!(self.p.stmts[*s], Stmt::Communication(_)));
            if !collective {
                continue;
            }
            for s in body {
                if let Stmt::ShardByStream { index: i, .. } = &mut self.p.stmts[s] {
                    if *i == rotated {
                        *i = index;
                    }
                }
            }
        }
    }

    /// Whether a loop axis of some tensor that is mapped to the Stream axis `sid` carries a
    /// `swizzle1d`.
    fn swizzled(&self, sid: IterDomainId) -> bool {
        let f = self.f;
        f.tensors_in_order().into_iter().any(|t| {
            f.tensor(t).loop_domain.iter().any(|x| {
                f.id(*x).swizzle.is_some() && (*x == sid || self.graph.are_mapped(*x, sid))
            })
        })
    }

    /// Whether another communication segment runs in the same stream loop as the segment
    /// being lowered: a loop whose chunks are visited in a rank-dependent order (the P2P
    /// allgather's rotation) must hold no other communication, since every rank has to post a
    /// collective for the same chunk.
    /// `reduces_may_ring`: the Reduces that the same ring can carry back (see
    /// [`Self::ring_reduces`]) do not count.
    pub(super) fn other_communication_in_loop(&self, reduces_may_ring: bool) -> bool {
        let Some(cur) = self.current else {
            return false;
        };
        let Some(Some(l)) = self.loop_of.get(&cur) else {
            return false;
        };
        self.communications
            .iter()
            .filter(|c| !(reduces_may_ring && self.ring_reduces.contains_key(*c)))
            .any(|c| *c != cur && self.loop_of.get(c) == Some(&Some(*l)))
    }
}
