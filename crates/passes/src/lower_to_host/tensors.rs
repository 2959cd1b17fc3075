//! The host tensors of fusion tensors: local and per-chunk sizes, the axes a Stream loop cuts
//! (split roots, chunk roots), and [`Lowering::resolve`], which binds a fusion tensor to its
//! buffer, its loop-local chunk or a `ShardByStream` view.

use std::collections::HashMap;

use weave_host_ir::{HostScalar, HostTensorId, Stmt};
use weave_ir::{
    Diagnostic, ExprId, IdExpr, IterDomainId, IterType, ParallelType, Scalar, TensorId,
};
use weave_segmenter::{SegmentId, SegmentedFusion};
use weave_transform::id_graph::IdGraph;

use super::{loop_axis, Lowering};
use crate::finalize_multidevice_domains::should_allocate_per_stream_in;

impl Lowering<'_> {
    /// Local sizes of `t` on one rank, one per materialized logical axis: device-split axes
    /// divided by the device count; with `per_chunk`, the Stream-split axis divided by the
    /// chunk count too.
    pub(super) fn local_sizes(
        &self,
        t: TensorId,
        per_chunk: bool,
    ) -> Result<Vec<Scalar>, Diagnostic> {
        let f = self.f;
        let tv = f.tensor(t);
        // Where the sharding lives: the allocation domain once finalized, else the loop domain.
        let mut sharded: Vec<IterDomainId> = tv.allocation_domain().to_vec();
        sharded.extend(tv.loop_domain.iter().copied());
        // The sharded axes that cut a logical axis, by the axis they cut, in domain order
        // (found once: a tensor of many axes has few parallel ones).
        let mut cuts: HashMap<IterDomainId, Vec<IterDomainId>> = HashMap::new();
        for id in &sharded {
            let pt = f.id(*id).parallel;
            let wanted = pt.is_device() || (per_chunk && pt == ParallelType::Stream);
            if !wanted || f.id(*id).iter_type == IterType::Reduction {
                continue;
            }
            if let Some(root) = self.split_root(t, *id) {
                cuts.entry(root).or_default().push(*id);
            }
        }
        let mut out = Vec::new();
        for l in f.visible_axes(t) {
            let d = f.id(l);
            if d.parallel.is_device() {
                out.push(Scalar::c(1));
                continue;
            }
            let mut size = d.extent.clone();
            let mut seen: Vec<ParallelType> = Vec::new();
            for id in cuts.get(&l).into_iter().flatten() {
                let pt = f.id(*id).parallel;
                if seen.contains(&pt) {
                    continue;
                }
                seen.push(pt);
                size = size.ceil_div(f.id(*id).extent.clone());
            }
            out.push(size);
        }
        Ok(out)
    }

    /// Follows `id` of tensor `t` up through split outputs (outer or inner) to `t`'s logical
    /// axis it was split from; `None` when the chain passes through a merge. A device axis
    /// found this way divides that axis' local size wherever it sits in the split tree (e.g.
    /// inside each stream chunk).
    fn split_root(&self, t: TensorId, mut id: IterDomainId) -> Option<IterDomainId> {
        let logical = &self.f.tensor(t).logical;
        loop {
            if logical.contains(&id) {
                return Some(id);
            }
            match self.f.id(id).definition.map(|e| self.f.id_expr(e)) {
                Some(IdExpr::Split { input, .. }) => id = *input,
                _ => return None,
            }
        }
    }

    /// Follows the Stream axis `id` of tensor `t` up through outer outputs of splits (and the
    /// inner output of a device split of the logical axis: stream chunks of each device's
    /// block) to `t`'s logical axis; `None` when the chain passes through a merge or another
    /// inner output. See [`weave_transform::schedule::stream_split_root`].
    pub(super) fn outer_split_root(&self, t: TensorId, id: IterDomainId) -> Option<IterDomainId> {
        weave_transform::schedule::stream_split_root(self.f, t, id)
    }

    /// The axes `id` is made from by root→logical transforms (reshape, rfactor), transitively.
    pub(super) fn transform_ancestors(&self, id: IterDomainId) -> Vec<IterDomainId> {
        let mut out = Vec::new();
        let mut work = vec![id];
        while let Some(x) = work.pop() {
            if let Some(e) = self.f.id(x).definition {
                for i in self.f.id_expr(e).inputs() {
                    if !out.contains(&i) {
                        out.push(i);
                        work.push(i);
                    }
                }
            }
        }
        out
    }

    /// The stream loop a segment with reference Stream axis `a` shares with one with `b`:
    /// equal chunk counts and exactly mapped axes (what [`Self::open_loop_for`] merges).
    pub(super) fn same_loop(&self, a: IterDomainId, b: IterDomainId) -> bool {
        let f = self.f;
        f.eval(&f.id(a).extent) == f.eval(&f.id(b).extent) && self.graph.are_mapped(a, b)
    }

    /// The axis of `t` the open loop cuts into chunks: `t`'s own Stream axis mapped to the
    /// loop's, or (an operand without a Stream split of its own) one of its logical axes
    /// mapped to the logical axis the loop chunks.
    pub(super) fn chunk_root(&self, t: TensorId) -> Option<IterDomainId> {
        let f = self.f;
        let open = self.open.as_ref()?;
        // An operand of the segment being lowered is cut along the axis that the segment's
        // own exprs map to the axis its outputs are chunked along (see [`Self::cut_alike`]).
        let alike = |a: IterDomainId| match &self.current_graph {
            Some((exprs, local)) => self.cut_alike(exprs, local, t, a, open.stream_id),
            None => true,
        };
        let own = loop_axis(f, t, ParallelType::Stream)
            .filter(|s| self.graph.are_mapped(*s, open.stream_id))
            .and_then(|s| self.outer_split_root(t, s))
            .filter(|r| alike(*r));
        own.or_else(|| {
            f.visible_axes(t)
                .into_iter()
                .find(|a| self.graph.are_mapped(*a, open.stream_root) && alike(*a))
        })
    }

    /// Whether operand `t` of `exprs` (a segment, whose own graph is `local`) is cut into the
    /// chunks of the loop over Stream axis `sid` along its axis `axis`: true unless `t` is
    /// read (not written) by `exprs` and their outputs are chunked along logical axes that
    /// `local` does not map to `axis`. The whole fusion's graph is not enough: it maps the
    /// key axis of `scores = matmul(q, k)` to the query axis when `q` and `k` come from one
    /// token axis, and `k` must be read whole (or from an earlier loop) while this loop cuts
    /// the queries.
    fn cut_alike(
        &self,
        exprs: &[ExprId],
        local: &IdGraph,
        t: TensorId,
        axis: IterDomainId,
        sid: IterDomainId,
    ) -> bool {
        let f = self.f;
        let written = exprs.iter().any(|e| f.expr(*e).outputs.contains(&t));
        let read = exprs.iter().any(|e| f.expr(*e).inputs.contains(&t));
        if written || !read {
            return true;
        }
        let roots: Vec<IterDomainId> = exprs
            .iter()
            .flat_map(|e| f.expr(*e).outputs.iter().copied())
            .filter_map(|u| {
                loop_axis(f, u, ParallelType::Stream)
                    .filter(|s| self.graph.are_mapped(*s, sid))
                    .and_then(|s| self.outer_split_root(u, s))
            })
            .collect();
        roots.is_empty() || roots.iter().any(|r| local.are_mapped(axis, *r))
    }

    /// Whether segment `seg` reads a tensor that an earlier segment of `run` (the segments
    /// of the loop over Stream axis `sid` so far) writes chunk by chunk along an axis that
    /// `seg` does not cut alike: it needs every chunk of it, so it runs in a loop of its own
    /// after that one.
    pub(super) fn reads_across_chunks(
        &self,
        sf: &SegmentedFusion,
        seg: SegmentId,
        run: &[SegmentId],
        sid: IterDomainId,
    ) -> bool {
        let f = self.f;
        let exprs = sf.segment(seg).exprs();
        let mut local: Option<IdGraph> = None;
        sf.segment(seg).inputs().iter().any(|u| {
            if !self.producer.get(*u).is_some_and(|p| run.contains(p)) {
                return false;
            }
            let Some(root) = loop_axis(f, *u, ParallelType::Stream)
                .filter(|s| self.graph.are_mapped(*s, sid))
                .and_then(|s| self.outer_split_root(*u, s))
            else {
                return false;
            };
            let local = local.get_or_insert_with(|| IdGraph::build_for_exprs(f, exprs));
            !self.cut_alike(exprs, local, *u, root, sid)
        })
    }

    /// The host tensor that stands for `t` at the current point: inside a loop, a chunk view
    /// of a full buffer or a loop-local tensor; otherwise the whole tensor. `write` creates the
    /// binding when `t` has none yet.
    pub(super) fn resolve(&mut self, t: TensorId, write: bool) -> Result<HostTensorId, Diagnostic> {
        let f = self.f;
        let name = f.tensor(t).name.clone();
        // Chunked by the open loop: `t`'s own Stream axis is mapped to the loop's, or (an
        // operand without a Stream split of its own) one of its logical axes is mapped to the
        // logical axis the loop chunks.
        let chunked = match &self.open {
            Some(open) => self
                .chunk_root(t)
                .map(|root| (root, open.view_index, open.extent * open.pieces)),
            None => None,
        };
        if let Some(open) = &self.open {
            if let Some(h) = open.bound.get(t) {
                return Ok(*h);
            }
        }
        let Some((root, index, extent)) = chunked else {
            // Not chunked by this loop: the whole tensor. That is right only when no axis of
            // it feeds the chunked axis.
            if let Some(open) = &self.open {
                let feeds = f.visible_axes(t).into_iter().any(|a| {
                    open.stream_root_ancestors
                        .iter()
                        .any(|x| self.graph.are_mapped(a, *x))
                });
                if feeds && !write {
                    return Err(Diagnostic::new(format!(
                        "`{name}` cannot be sliced into this stream loop's chunks: it reaches the stream-parallel axis only through a reshape (split the tensor before the reshape instead)"
                    )));
                }
            }
            if let Some(h) = self.top.get(t) {
                return Ok(*h);
            }
            if !write {
                return Err(Diagnostic::new(format!(
                    "`{name}` is read before it is defined"
                )));
            }
            let h = self.new_tensor(t, self.local_sizes(t, false)?);
            if self.open.is_some() {
                // Written whole inside a loop: every iteration writes all of it. Bind it
                // inside the loop (a loop-local tensor).
                self.open.as_mut().map(|o| o.bound.insert(t, h));
            } else {
                self.top.insert(t, h);
            }
            return Ok(h);
        };
        // A buffer viewed chunk by chunk. A loop-local intermediate (allocated per stream
        // chunk) gets no binding outside the loop and no Allocate here:
        // `allocate-and-deallocate` allocates it before the loop with `numberOfStreams` slots.
        // Any other stream-parallel tensor is allocated whole, hoisted before its loop.
        let loop_local =
            should_allocate_per_stream_in(f, t, &self.graph) && self.stays_in_one_loop(t);
        let full = match self.top.get(t) {
            Some(h) => *h,
            None => {
                if !write {
                    return Err(Diagnostic::new(format!(
                        "`{name}` is read before it is defined"
                    )));
                }
                let h = self.new_tensor(t, self.local_sizes(t, false)?);
                if loop_local {
                    self.loop_local.insert(t, h);
                } else {
                    self.emit_before_loop(Stmt::Allocate {
                        tensor: h,
                        zero_init: false,
                    });
                    self.top.insert(t, h);
                }
                h
            }
        };
        let axis = f
            .visible_axes(t)
            .iter()
            .position(|x| *x == root)
            .ok_or_else(|| {
                Diagnostic::new(format!(
                    "stream-parallel tensor `{name}` cannot be sliced: its Stream axis is a reduction axis"
                ))
            })?;
        let chunks = Scalar::c(extent);
        let mut sizes = self.local_sizes(t, false)?;
        sizes[axis] = sizes[axis].clone().ceil_div(chunks.clone());
        let view = self.new_tensor(t, sizes);
        let chunks = self.scalar(HostScalar::Value(chunks));
        self.emit(Stmt::ShardByStream {
            input: full,
            axis,
            chunks,
            index,
            holds: None,
            output: view,
        });
        self.open.as_mut().map(|o| o.bound.insert(t, view));
        Ok(view)
    }
}
