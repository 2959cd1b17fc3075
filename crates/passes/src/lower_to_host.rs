//! `lower-to-host`: turns a segmented fusion into the host program every rank runs — stream
//! `ForLoop`s over chunks, `ShardByStream` views, library calls, kernel launches and
//! `Communication` + `Wait` per chunk, and the P2P decomposition of a stream-split allgather.
//!
//! Contract
//! * Input: `Ir::Segmented` whose fusion has been through the pre-segmentation pipeline
//!   (every expr is pure compute or exactly one communication; allocation domains carry the
//!   DID splits and, for loop-local intermediates, the Stream split).
//! * Output: `Ir::Host`. No stream management (that is `assign-streams`), no allocation of
//!   library/kernel outputs and no deallocation (that is `allocate-and-deallocate`); the only
//!   `Allocate`s emitted here are the full-size buffers of stream-parallel tensors that are
//!   written chunk by chunk through `ShardByStream` views, hoisted before their loop.
//! * Order: the segmenter's run order, except that a segment without a Stream axis that sits
//!   between two segments of the same stream loop, and reads nothing that loop produced so
//!   far, moves before the loop, so the loop stays one (a replicated bias sliced for a
//!   column-parallel linear whose input is gathered chunk by chunk); and a later segment of
//!   that loop that reads nothing the segments after the loop produce moves up into it (a
//!   per-chunk transpose the segmenter ordered after a weight gradient's GEMM).
//! * Loops: one `ForLoop` per maximal run of consecutive segments (in that order) whose
//!   reference loop domains have exactly-mapped Stream axes, except that a segment reading a
//!   tensor its loop writes chunk by chunk along an axis that the segment's own exprs do not
//!   map to the axis it is chunked along (attention's keys, in a loop over queries) starts a
//!   new loop, after the one that writes the tensor whole; a segment without a Stream axis
//!   closes the loop and runs at top level.
//! * Stream chunks of each device's block (`outer_split(a, d) -> DIDx; outer_split(a + 1, s)
//!   -> Stream`): the loop cuts the local axis of every buffer (`e / d` elements) into `s`
//!   chunks, like any Stream split of an unsplit axis; load refuses the communications that
//!   would have to pair such chunks inside a loop (`load_checks`).
//! * A stream-parallel intermediate is loop-local (bound only inside its loop, later given
//!   `numberOfStreams` slots) when its allocation is stream-split and its producer and every
//!   consumer run in the same loop; otherwise its whole buffer is allocated before the loop
//!   that writes it, so a later loop or top-level segment reads it whole or chunk by chunk.
//! * Communications: a DID → Stream copy with one chunk per device is the rank-rotated P2P
//!   ring when it opens its loop and no other communication joins that loop (the rotation
//!   would make ranks post a collective for different chunks); otherwise Broadcasts rooted
//!   from the loop index, on pieces of a shard or of a chunk when the factors nest. A
//!   collective whose device split sits inside outer splits of the same axis (`[s, d, ..]`)
//!   and that no loop cuts into those pieces is posted once per piece, on views of it.
//! * Accumulation: a matmul whose output has no Stream axis but whose contraction axis an
//!   operand's Stream axis is cut from (a weight gradient `dW = xᵀ · dy` over stream-split
//!   tokens) joins that axis' loop as `dW += a_chunk @ b_chunk` (`Stmt::Matmul` with
//!   `accumulate`), `dW` allocated whole with `zero_init` before the loop; unless a segment of
//!   a stream loop reads `dW` (it would see a partial sum): then it runs whole at top level.
//!   `assign-streams` orders the accumulations across iterations.
//! * A [`Lowering`](crate::pass::Lowering): it changes the IR form.

use std::collections::{HashMap, HashSet};

use weave_host_ir::{
    Communication, CommunicationType, HostProgram, HostScalar, HostTensor, HostTensorId,
    KernelUnit, P2PCommunication, P2PDirection, ScalarId, Signature, Stmt, StmtId, TensorSig,
};
use weave_ir::{
    Diagnostic, ExprId, ExprKind, Fusion, IdExpr, IterDomainId, IterType, MemoryType, ParallelType,
    Scalar, ScalarOp, TensorId,
};
use weave_segmenter::{SegmentId, SegmentKind, SegmentedFusion};
use weave_transform::id_graph::IdGraph;

use crate::communication::{derive_communication, CommunicationInfo, RootKind};
use crate::finalize_multidevice_domains::should_allocate_per_stream_in;
use crate::pass::{self, Pass, PassError, PassOptions};

/// How a DID → Stream copy with one chunk per device is lowered when either form is right.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StreamAllgather {
    /// The rank-rotated P2P ring (seed 003, nvFuser's `p2p` / `collective_permute`): `d`
    /// coalesced send/recv pairs per rank, iteration 0 a local copy; used when the copy opens
    /// its loop and no other communication shares it.
    #[default]
    P2pRing,
    /// Iteration `i` is a Broadcast rooted at device `i` (nvFuser's `broadcast` variant of
    /// `AllgatherP2p` and of the column-parallel linear: `d` Broadcasts).
    Broadcast,
}

/// The `lower-to-host` pass; `lower-to-host{allgather=broadcast}` (also written
/// `lower-to-host-broadcast`) with [`StreamAllgather::Broadcast`].
#[derive(Clone, Copy, Debug, Default)]
pub struct LowerToHost {
    /// The lowering of a DID → Stream copy with one chunk per device.
    pub stream_allgather: StreamAllgather,
}

impl LowerToHost {
    /// The pass with the given DID → Stream lowering.
    pub fn new(stream_allgather: StreamAllgather) -> LowerToHost {
        LowerToHost { stream_allgather }
    }
}

impl Pass for LowerToHost {
    fn name(&self) -> &'static str {
        "lower-to-host"
    }

    fn summary(&self) -> &'static str {
        "segmented fusion -> host program: stream loops, ShardByStream views, Communication + Wait per chunk"
    }

    fn options(&self) -> String {
        match self.stream_allgather {
            StreamAllgather::P2pRing => String::new(),
            StreamAllgather::Broadcast => "allgather=broadcast".to_string(),
        }
    }
}

impl pass::Lowering<SegmentedFusion, HostProgram> for LowerToHost {
    fn run(&self, sf: SegmentedFusion) -> Result<HostProgram, PassError> {
        let pass = self.name();
        lower_with(&sf, self.stream_allgather)
            .map_err(|diagnostic| PassError::Unsupported { pass, diagnostic })
    }
}

impl LowerToHost {
    /// The pass with the options of a pipeline item: `allgather=p2p-ring` (the default) or
    /// `allgather=broadcast`.
    pub fn with_options(options: &PassOptions) -> Result<LowerToHost, String> {
        let stream_allgather = match options.take("allgather") {
            None | Some("p2p-ring") => StreamAllgather::P2pRing,
            Some("broadcast") => StreamAllgather::Broadcast,
            Some(other) => {
                return Err(format!(
                    "`allgather={other}`: write `allgather=p2p-ring` or `allgather=broadcast`"
                ))
            }
        };
        options.finish()?;
        Ok(LowerToHost::new(stream_allgather))
    }
}

/// The loop currently open while segments are lowered in run order.
struct OpenLoop {
    stmt: StmtId,
    /// The loop's number in [`Lowering::loop_of`].
    number: Option<usize>,
    /// The Stream axis of the reference tensor of the segment that opened the loop.
    stream_id: IterDomainId,
    /// The logical axis that Stream axis chunks; a tensor is chunked by this loop along
    /// its axis exactly mapped to this one.
    stream_root: IterDomainId,
    /// The axes the stream root is made from by a reshape: an operand mapped to one of these
    /// but not to the root itself cannot be cut into this loop's chunks.
    stream_root_ancestors: Vec<IterDomainId>,
    /// Number of iterations (the Stream axis' extent).
    extent: i64,
    index: ScalarId,
    /// The chunk every `ShardByStream` of this loop selects: the loop index, or a rotation of
    /// it by the rank when the loop starts with a P2P allgather.
    view_index: ScalarId,
    /// Tensors bound inside this loop's body: chunk views and loop-local intermediates.
    bound: HashMap<TensorId, HostTensorId>,
}

struct Lowering<'a> {
    f: &'a Fusion,
    graph: IdGraph,
    p: HostProgram,
    /// Tensors bound at top level (inputs, full buffers, non-stream intermediates).
    top: HashMap<TensorId, HostTensorId>,
    open: Option<OpenLoop>,
    /// Whole-size buffers of loop-local intermediates, visible only through chunk views.
    loop_local: HashMap<TensorId, HostTensorId>,
    kernels: usize,
    /// Loops whose chunk views a `swizzle1d` rotated: (loop, its index, the rotated index).
    rotated: Vec<(StmtId, ScalarId, ScalarId)>,
    /// The stream loop each segment runs in (`None`: top level), numbered in order.
    loop_of: HashMap<SegmentId, Option<usize>>,
    /// The segment that defines each tensor, and the segments that read it.
    producer: HashMap<TensorId, SegmentId>,
    consumers: HashMap<TensorId, Vec<SegmentId>>,
    /// The communication segments, and the segment being lowered: a loop whose chunks are
    /// visited in a rank-dependent order (the P2P allgather) must hold no other
    /// communication.
    communications: HashSet<SegmentId>,
    current: Option<SegmentId>,
    /// The exprs of the segment being lowered and their own graph (see [`Self::chunk_root`]).
    current_graph: Option<(Vec<ExprId>, IdGraph)>,
    stream_allgather: StreamAllgather,
    /// The matmul segments that contract over a stream loop's axis, with the operand and
    /// Stream axis their loop is keyed by: each chunk's partial product is added into the
    /// output, allocated whole and zeroed before the loop (see [`Self::accumulating_stream`]).
    accumulating: HashMap<SegmentId, (TensorId, IterDomainId)>,
}

/// Lowers a segmented fusion to a host program (see the module contract).
pub fn lower(sf: &SegmentedFusion) -> Result<HostProgram, Diagnostic> {
    lower_with(sf, StreamAllgather::default())
}

/// [`lower`] with the given lowering of DID → Stream copies.
pub fn lower_with(
    sf: &SegmentedFusion,
    stream_allgather: StreamAllgather,
) -> Result<HostProgram, Diagnostic> {
    let f = sf.fusion();
    let mut l = Lowering {
        f,
        graph: IdGraph::build(f),
        p: HostProgram::default(),
        top: HashMap::new(),
        open: None,
        loop_local: HashMap::new(),
        kernels: 0,
        rotated: Vec::new(),
        loop_of: HashMap::new(),
        producer: HashMap::new(),
        consumers: HashMap::new(),
        communications: HashSet::new(),
        current: None,
        current_graph: None,
        stream_allgather,
        accumulating: HashMap::new(),
    };
    for (id, s) in sf.segments() {
        for t in s.produced(f) {
            l.producer.insert(t, id);
        }
        for t in s.inputs() {
            l.consumers.entry(*t).or_default().push(id);
        }
    }
    for (id, s) in sf.segments() {
        if s.kind() == SegmentKind::Communication {
            l.communications.insert(id);
        }
    }
    let order = l.run_order(sf)?;
    for t in f.inputs() {
        let h = l.new_tensor(*t, l.local_sizes(*t, false)?);
        l.p.inputs.push(h);
        l.top.insert(*t, h);
    }
    for seg in order {
        l.lower_segment(sf, seg)?;
    }
    l.open = None;
    for t in f.outputs() {
        let h = *l.top.get(t).ok_or_else(|| {
            Diagnostic::new(format!(
                "output `{}` is only defined inside a stream loop; an output must be allocated whole",
                f.tensor(*t).name
            ))
        })?;
        l.p.outputs.push(h);
    }
    l.unrotate_collective_loops();
    l.p.signature = Some(signature_of(f)?);
    Ok(l.p)
}

/// The program's signature as the fusion gives it: every parameter's value and each input's
/// and output's global shape and sharding. What only the fusion as the user wrote it knows
/// (before the passes that precede lowering), its definition and its parameter roles, is the
/// pass manager's to attach.
fn signature_of(f: &Fusion) -> Result<Signature, Diagnostic> {
    let entry = |t: &TensorId| TensorSig::of(f, *t).map_err(|e| Diagnostic::new(e.to_string()));
    Ok(Signature {
        params: f
            .params()
            .iter()
            .filter_map(|p| p.value.map(|v| (p.name.clone(), v)))
            .collect(),
        roles: Vec::new(),
        devices: {
            let mut d: Vec<i64> = f
                .meshes()
                .iter()
                .flat_map(|m| f.mesh(*m).mesh.devices().iter().copied())
                .collect();
            d.sort_unstable();
            d.dedup();
            d
        },
        inputs: f.inputs().iter().map(entry).collect::<Result<_, _>>()?,
        outputs: f.outputs().iter().map(entry).collect::<Result<_, _>>()?,
        definition: None,
    })
}

/// The axis of `t` parallelized as `pt` in its loop domain (reduction axes excluded).
fn loop_axis(f: &Fusion, t: TensorId, pt: ParallelType) -> Option<IterDomainId> {
    f.tensor(t)
        .loop_domain
        .iter()
        .copied()
        .find(|i| f.id(*i).parallel == pt && f.id(*i).iter_type != IterType::Reduction)
}

impl Lowering<'_> {
    fn scalar(&mut self, s: HostScalar) -> ScalarId {
        self.p.scalars.insert(s)
    }

    fn constant(&mut self, v: i64) -> ScalarId {
        self.scalar(HostScalar::Value(Scalar::c(v)))
    }

    fn new_tensor(&mut self, origin: TensorId, sizes: Vec<Scalar>) -> HostTensorId {
        let tv = self.f.tensor(origin);
        let sizes = sizes
            .into_iter()
            .map(|s| self.p.scalars.insert(HostScalar::Value(s)))
            .collect();
        self.p.tensors.insert(HostTensor {
            dtype: tv.dtype,
            sizes,
            memory: if tv.memory == MemoryType::Symmetric {
                MemoryType::Symmetric
            } else {
                MemoryType::Global
            },
        })
    }

    /// Appends a statement to the open loop's body or to the top level.
    fn emit(&mut self, s: Stmt) -> StmtId {
        let id = self.p.stmts.insert(s);
        match &self.open {
            Some(open) => {
                if let Stmt::ForLoop { body, .. } = &mut self.p.stmts[open.stmt] {
                    body.push(id);
                }
            }
            None => self.p.top_level.push(id),
        }
        id
    }

    /// Inserts a statement at top level right before the open loop (hoisting), or appends it
    /// at top level when no loop is open.
    fn emit_before_loop(&mut self, s: Stmt) -> StmtId {
        let id = self.p.stmts.insert(s);
        match &self.open {
            Some(open) => {
                let pos = self
                    .p
                    .top_level
                    .iter()
                    .position(|x| *x == open.stmt)
                    .unwrap_or(self.p.top_level.len());
                self.p.top_level.insert(pos, id);
            }
            None => self.p.top_level.push(id),
        }
        id
    }

    /// Local sizes of `t` on one rank, one per materialized logical axis: device-split axes
    /// divided by the device count; with `per_chunk`, the Stream-split axis divided by the
    /// chunk count too.
    fn local_sizes(&self, t: TensorId, per_chunk: bool) -> Result<Vec<Scalar>, Diagnostic> {
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
    fn outer_split_root(&self, t: TensorId, id: IterDomainId) -> Option<IterDomainId> {
        weave_transform::schedule::stream_split_root(self.f, t, id)
    }

    /// The axes `id` is made from by root→logical transforms (reshape, rfactor), transitively.
    fn transform_ancestors(&self, id: IterDomainId) -> Vec<IterDomainId> {
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
    fn same_loop(&self, a: IterDomainId, b: IterDomainId) -> bool {
        let f = self.f;
        f.eval(&f.id(a).extent) == f.eval(&f.id(b).extent) && self.graph.are_mapped(a, b)
    }

    /// The order segments are lowered in (see the module contract), and [`Self::loop_of`]
    /// for each.
    fn run_order(&mut self, sf: &SegmentedFusion) -> Result<Vec<SegmentId>, Diagnostic> {
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
            let Some(stream) = self.accumulating_stream(sf.segment(seg).exprs()) else {
                continue;
            };
            let read_in_a_loop = sf
                .segment(seg)
                .outputs()
                .iter()
                .flat_map(|t| self.consumers.get(t).into_iter().flatten())
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
            let run: Vec<SegmentId> = order[start..i].to_vec();
            let depends = sf
                .segment(order[i])
                .inputs()
                .iter()
                .any(|t| self.producer.get(t).is_some_and(|p| run.contains(p)));
            if depends {
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
            let between: Vec<SegmentId> = order[i..j].to_vec();
            let depends = sf
                .segment(order[j])
                .inputs()
                .iter()
                .any(|t| self.producer.get(t).is_some_and(|p| between.contains(p)));
            if depends {
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
        Ok(order)
    }

    /// True if `t` is written and read inside one stream loop only (see the module contract).
    fn stays_in_one_loop(&self, t: TensorId) -> bool {
        let Some(Some(l)) = self.producer.get(&t).map(|p| self.loop_of[p]) else {
            return false;
        };
        self.consumers
            .get(&t)
            .into_iter()
            .flatten()
            .all(|c| self.loop_of[c] == Some(l))
    }

    /// The Stream axis of the most parallel output of the segment, if any.
    fn reference_stream(
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

    fn open_loop_for(
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
        let view_index = if self.swizzled(sid) {
            let rank = self.scalar(HostScalar::Value(Scalar::named(weave_ir::RANK)));
            let sum = self.scalar(HostScalar::Binary(ScalarOp::Add, rank, index));
            let n = self.constant(extent);
            self.scalar(HostScalar::Binary(ScalarOp::Mod, sum, n))
        } else {
            index
        };
        let start = self.constant(0);
        let stop = self.constant(extent);
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
            bound: HashMap::new(),
        });
        Ok(())
    }

    /// The number of the stream loop the segment being lowered runs in (`None`: top level,
    /// or no segment).
    fn current_loop(&self) -> Option<usize> {
        self.current
            .and_then(|c| self.loop_of.get(&c).copied().flatten())
    }

    /// A `swizzle1d` only reorders a loop's iterations on each rank. A collective posted per
    /// chunk needs every rank on the same chunk in the same iteration, so a loop that posts
    /// one keeps the natural order: its rotated chunk views go back to the loop index.
    fn unrotate_collective_loops(&mut self) {
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
    fn other_communication_in_loop(&self) -> bool {
        let Some(cur) = self.current else {
            return false;
        };
        let Some(Some(l)) = self.loop_of.get(&cur) else {
            return false;
        };
        self.communications
            .iter()
            .any(|c| *c != cur && self.loop_of.get(c) == Some(&Some(*l)))
    }

    /// The axis of `t` the open loop cuts into chunks: `t`'s own Stream axis mapped to the
    /// loop's, or (an operand without a Stream split of its own) one of its logical axes
    /// mapped to the logical axis the loop chunks.
    fn chunk_root(&self, t: TensorId) -> Option<IterDomainId> {
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
    fn reads_across_chunks(
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
            if !self.producer.get(u).is_some_and(|p| run.contains(p)) {
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
    fn resolve(&mut self, t: TensorId, write: bool) -> Result<HostTensorId, Diagnostic> {
        let f = self.f;
        let name = f.tensor(t).name.clone();
        // Chunked by the open loop: `t`'s own Stream axis is mapped to the loop's, or (an
        // operand without a Stream split of its own) one of its logical axes is mapped to the
        // logical axis the loop chunks.
        let chunked = match &self.open {
            Some(open) => self
                .chunk_root(t)
                .map(|root| (root, open.view_index, open.extent)),
            None => None,
        };
        if let Some(open) = &self.open {
            if let Some(h) = open.bound.get(&t) {
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
            if let Some(h) = self.top.get(&t) {
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
        let full = match self.top.get(&t) {
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

    fn lower_segment(&mut self, sf: &SegmentedFusion, seg: SegmentId) -> Result<(), Diagnostic> {
        let s = sf.segment(seg);
        let exprs: Vec<ExprId> = s.exprs().to_vec();
        let stream = match self.accumulating.get(&seg) {
            Some(s) => Some(*s),
            None => self.reference_stream(&exprs)?,
        };
        self.current = Some(seg);
        self.open_loop_for(stream)?;
        self.current_graph = Some((exprs.clone(), IdGraph::build_for_exprs(self.f, &exprs)));
        match s.kind() {
            SegmentKind::Library if self.accumulating.contains_key(&seg) => {
                self.lower_accumulating_matmul(exprs[0])
            }
            SegmentKind::Library => self.lower_library(exprs[0]),
            SegmentKind::Communication => self.lower_communication(exprs[0]),
            SegmentKind::Kernel => self.lower_kernel(sf, seg),
        }
    }

    fn lower_library(&mut self, e: ExprId) -> Result<(), Diagnostic> {
        let expr = self.f.expr(e).clone();
        let ins: Vec<HostTensorId> = expr
            .inputs
            .iter()
            .map(|t| self.resolve(*t, false))
            .collect::<Result<_, _>>()?;
        let out = self.resolve(expr.outputs[0], true)?;
        let stmt = match expr.kind {
            ExprKind::Matmul => Stmt::Matmul {
                a: ins[0],
                b: ins[1],
                out,
                accumulate: false,
            },
            ExprKind::Linear => Stmt::Linear {
                input: ins[0],
                weight: ins[1],
                bias: ins.get(2).copied(),
                out,
            },
            ref k => {
                return Err(Diagnostic::new(format!(
                    "a library segment holds `{}`, which is not a matmul or linear",
                    k.op_name()
                )))
            }
        };
        self.emit(stmt);
        Ok(())
    }

    /// A matmul that contracts over the open loop's streamed axis (see
    /// [`Self::accumulating_stream`]): `out += a_chunk @ b_chunk` in every iteration, `out`
    /// allocated whole and zeroed before the loop. `assign-streams` orders each iteration's
    /// accumulation after the previous one's.
    fn lower_accumulating_matmul(&mut self, e: ExprId) -> Result<(), Diagnostic> {
        let f = self.f;
        let expr = f.expr(e).clone();
        let (a, b, out) = (expr.inputs[0], expr.inputs[1], expr.outputs[0]);
        let (va, vb) = (f.visible_axes(a), f.visible_axes(b));
        let (ka, kb) = (va[va.len() - 1], vb[vb.len() - 2]);
        if self.chunk_root(a) != Some(ka) || self.chunk_root(b) != Some(kb) {
            return Err(Diagnostic::new(format!(
                "internal: the stream loop does not cut `{}` and `{}` along the contraction axis of `{}`",
                f.tensor(a).name,
                f.tensor(b).name,
                f.tensor(out).name
            )));
        }
        let a = self.resolve(a, false)?;
        let b = self.resolve(b, false)?;
        if self.top.contains_key(&out) {
            return Err(Diagnostic::new(format!(
                "internal: `{}` is written twice",
                f.tensor(out).name
            )));
        }
        let sum = self.new_tensor(out, self.local_sizes(out, false)?);
        self.emit_before_loop(Stmt::Allocate {
            tensor: sum,
            zero_init: true,
        });
        self.top.insert(out, sum);
        self.emit(Stmt::Matmul {
            a,
            b,
            out: sum,
            accumulate: true,
        });
        Ok(())
    }

    fn lower_kernel(&mut self, sf: &SegmentedFusion, seg: SegmentId) -> Result<(), Diagnostic> {
        let s = sf.segment(seg);
        let inputs: Vec<TensorId> = s.inputs().to_vec();
        let outputs: Vec<TensorId> = s.outputs().to_vec();
        let unit = kernel_fusion(self.f, s.exprs(), &inputs, &outputs, self.kernels)?;
        self.kernels += 1;
        let kernel = self.p.kernels.insert(KernelUnit {
            fusion: std::sync::Arc::new(unit),
        });
        let ins = inputs
            .iter()
            .map(|t| self.resolve(*t, false))
            .collect::<Result<Vec<_>, _>>()?;
        let outs = outputs
            .iter()
            .map(|t| self.resolve(*t, true))
            .collect::<Result<Vec<_>, _>>()?;
        self.emit(Stmt::LaunchKernel {
            kernel,
            inputs: ins,
            outputs: outs,
        });
        Ok(())
    }
}

impl Lowering<'_> {
    fn lower_communication(&mut self, e: ExprId) -> Result<(), Diagnostic> {
        let f = self.f;
        let expr = f.expr(e).clone();
        let (producer, consumer) = (expr.inputs[0], expr.outputs[0]);
        let info = derive_communication(f, e)?;
        if let Some(open) = &self.open {
            if info.kind == CommunicationType::Broadcast && info.root == Some(RootKind::StreamIndex)
            {
                // The ring's peers are computed from the rank, so its teams must be evenly
                // strided slices of the world (the whole world in rank order, or the rows or
                // columns of a `devices(dy, dx)` mesh).
                let first_in_loop = open.bound.is_empty();
                let d = info.team.len() as i64;
                let stride = ring_stride(&info.instances).filter(|_| first_in_loop);
                if let Some(stride) = stride.filter(|_| {
                    self.stream_allgather == StreamAllgather::P2pRing
                        && open.extent == d
                        && !self.other_communication_in_loop()
                }) {
                    return self.lower_p2p_allgather(producer, consumer, d, stride);
                }
            }
        }
        if info.root == Some(RootKind::StreamIndex) {
            return self.lower_stream_broadcast(&info, producer, consumer);
        }
        let input = self.resolve(producer, false)?;
        let output = self.resolve(consumer, true)?;
        let pieces = self.nested_pieces(&info, producer, consumer)?;
        if pieces > 1 {
            let axes = info
                .producer_axis
                .and_then(|a| a.axis)
                .zip(info.consumer_axis.and_then(|a| a.axis));
            let Some((pa, ca)) = axes else {
                return Err(Diagnostic::new(format!(
                    "the {} from `{}` to `{}` has a device split nested inside an outer split, but no axis to cut into pieces",
                    info.kind.name(),
                    f.tensor(producer).name,
                    f.tensor(consumer).name
                )));
            };
            for k in 0..pieces {
                let k = self.constant(k);
                let input = self.piece(input, pa, pieces, k)?;
                let output = self.piece(output, ca, pieces, k)?;
                self.post_pieces_or_all(&info, consumer, input, output)?;
            }
            return Ok(());
        }
        self.post_pieces_or_all(&info, consumer, input, output)
    }

    /// Posts `info` with [`Self::post`], or, for a Scatter whose root is outside the receiver
    /// mesh ([`CommunicationInfo::root_sends_pieces`]), one SendRecv per receiver of its
    /// piece of the root's input (piece `i` of as many as receivers, along the scattered
    /// axis), each waited for before the next.
    fn post_pieces_or_all(
        &mut self,
        info: &CommunicationInfo,
        consumer: TensorId,
        input: HostTensorId,
        output: HostTensorId,
    ) -> Result<(), Diagnostic> {
        if !info.root_sends_pieces {
            return self.post(info, consumer, input, output, None);
        }
        let Some(pa) = info.producer_axis.and_then(|a| a.axis) else {
            return Err(Diagnostic::new(format!(
                "the Scatter to `{}` has no axis of its input to cut into pieces",
                self.f.tensor(consumer).name
            )));
        };
        let n = info.instances.len() as i64;
        for (i, inst) in info.instances.iter().enumerate() {
            let k = self.constant(i as i64);
            let piece = self.piece(input, pa, n, k)?;
            let Some(RootKind::Member { index, .. }) = inst.root else {
                return Err(Diagnostic::new(format!(
                    "internal: a piece of the Scatter to `{}` has no fixed sender",
                    self.f.tensor(consumer).name
                )));
            };
            let root = Some(self.constant(index as i64));
            let comm = self.emit(Stmt::Communication(Communication {
                kind: CommunicationType::SendRecv,
                teams: vec![inst.team.clone()],
                root,
                red_op: None,
                input: piece,
                output,
            }));
            self.emit(Stmt::Wait { comm });
        }
        Ok(())
    }

    /// A DID → Stream copy as broadcasts (iteration `i` of `s` obtains stream chunk `i`): with
    /// as many chunks as devices, device `i` broadcasts its whole shard; with `s = k * d`,
    /// device `i / k` broadcasts piece `i % k` of its shard; with `d = k * s`, devices
    /// `i * k + j` broadcast their shards into piece `j` of the chunk.
    fn lower_stream_broadcast(
        &mut self,
        info: &CommunicationInfo,
        producer: TensorId,
        consumer: TensorId,
    ) -> Result<(), Diagnostic> {
        let f = self.f;
        let Some((i, s)) = self.open.as_ref().map(|o| (o.index, o.extent)) else {
            return Err(Diagnostic::new(format!(
                "the {} of `{}` takes its root from a stream loop index, but it is not inside a stream loop",
                info.kind.name(),
                f.tensor(consumer).name
            )));
        };
        let d = info.team.len() as i64;
        let input = self.whole(producer)?;
        let output = self.resolve(consumer, true)?;
        let axes = info
            .producer_axis
            .and_then(|a| a.axis)
            .zip(info.consumer_axis.and_then(|a| a.axis));
        if s == d {
            return self.post(info, consumer, input, output, Some(i));
        }
        let Some((pa, ca)) = axes.filter(|_| s % d == 0 || d % s == 0) else {
            return Err(Diagnostic::new(format!(
                "the broadcasts that gather `{}` need {s} stream chunks and {d} devices, one a multiple of the other",
                f.tensor(consumer).name
            )));
        };
        if s > d {
            let k = self.constant(s / d);
            let root = self.scalar(HostScalar::Binary(ScalarOp::Div, i, k));
            let j = self.scalar(HostScalar::Binary(ScalarOp::Mod, i, k));
            let input = self.piece(input, pa, s / d, j)?;
            return self.post(info, consumer, input, output, Some(root));
        }
        let k = self.constant(d / s);
        let first = self.scalar(HostScalar::Binary(ScalarOp::Mul, i, k));
        for j in 0..d / s {
            let jj = self.constant(j);
            let root = self.scalar(HostScalar::Binary(ScalarOp::Add, first, jj));
            let out = self.piece(output, ca, d / s, jj)?;
            self.post(info, consumer, input, out, Some(root))?;
        }
        Ok(())
    }

    /// A view of piece `k` of `pieces` equal pieces of `h` along `axis`.
    fn piece(
        &mut self,
        h: HostTensorId,
        axis: usize,
        pieces: i64,
        k: ScalarId,
    ) -> Result<HostTensorId, Diagnostic> {
        let mut tensor = self.p.tensors[h].clone();
        let size = match tensor.sizes.get(axis).map(|s| &self.p.scalars[*s]) {
            Some(HostScalar::Value(v)) => v.clone(),
            _ => {
                return Err(Diagnostic::new(format!(
                    "internal: a view of axis {axis} cut into {pieces} pieces has no loop-invariant size"
                )))
            }
        };
        tensor.sizes[axis] = self.scalar(HostScalar::Value(size.ceil_div(Scalar::c(pieces))));
        let view = self.p.tensors.insert(tensor);
        let chunks = self.constant(pieces);
        self.emit(Stmt::ShardByStream {
            input: h,
            axis,
            chunks,
            index: k,
            holds: None,
            output: view,
        });
        Ok(view)
    }

    /// How many pieces a communication must be posted in: the product of the outer extents
    /// of the splits whose inner output the device axis of the sharded side is cut from (a
    /// device split inside stream chunks, `outer_split(0, s) -> Stream; outer_split(1, d) ->
    /// DIDx`, gives `s`). Each rank holds one block of every piece, so a collective over the
    /// whole buffer would order the blocks as if the device split were outermost. When the
    /// open stream loop already cuts that side into those pieces, the chunk views it binds
    /// are single pieces, and the answer is 1.
    fn nested_pieces(
        &self,
        info: &CommunicationInfo,
        producer: TensorId,
        consumer: TensorId,
    ) -> Result<i64, Diagnostic> {
        let f = self.f;
        let Some(pt) = info.parallel else {
            return Ok(1);
        };
        let sharded = match info.kind {
            CommunicationType::Allgather | CommunicationType::Gather => producer,
            CommunicationType::Scatter | CommunicationType::ReduceScatter => consumer,
            _ => return Ok(1),
        };
        let Some(did) = loop_axis(f, sharded, pt) else {
            return Ok(1);
        };
        let tv = f.tensor(sharded);
        let within: &[IterDomainId] = if sharded == consumer {
            tv.root_domain()
        } else {
            &tv.logical
        };
        let mut pieces = 1;
        let mut cur = did;
        while !within.contains(&cur) {
            let Some(def) = f.id(cur).definition else {
                return Ok(1);
            };
            match f.id_expr(def) {
                IdExpr::Split {
                    input,
                    outer,
                    inner,
                    ..
                } => {
                    if *inner == cur {
                        pieces *= f.eval(&f.id(*outer).extent).ok_or_else(|| {
                            Diagnostic::new(format!(
                                "the {pt} split of `{}` sits inside a split without a constant extent",
                                tv.name
                            ))
                        })?;
                    }
                    cur = *input;
                }
                IdExpr::Merge { .. } => return Ok(1),
            }
        }
        if pieces > 1 && self.chunk_root(sharded) == Some(cur) {
            let extent = self.open.as_ref().map_or(1, |o| o.extent);
            if extent != pieces {
                return Err(Diagnostic::new(format!(
                    "the {pt} split of `{}` sits inside {pieces} pieces of its axis, which the stream loop does not cut alike",
                    tv.name
                )));
            }
            return Ok(1);
        }
        Ok(pieces)
    }

    /// Posts the team instances of `info` as few nodes as possible: consecutive instances
    /// with the same root and disjoint teams (the slices of a multi-dimensional mesh, disjoint
    /// SendRecv pairs) share one node, where each rank posts on the team that contains it;
    /// overlapping ones (Gather/Reduce with several receivers) get one node each, and a rank
    /// skips the nodes whose teams it is not in. Each node is waited for before the next is
    /// posted: they share buffers. `stream_root` is the root of a DID → Stream broadcast.
    fn post(
        &mut self,
        info: &CommunicationInfo,
        consumer: TensorId,
        input: HostTensorId,
        output: HostTensorId,
        stream_root: Option<ScalarId>,
    ) -> Result<(), Diagnostic> {
        let f = self.f;
        let mut groups: Vec<(Option<RootKind>, Vec<Vec<i64>>)> = Vec::new();
        for inst in &info.instances {
            let joins = groups.last().is_some_and(|(root, teams)| {
                same_root_index(*root, inst.root)
                    && teams.iter().flatten().all(|d| !inst.team.contains(d))
            });
            match groups.last_mut() {
                Some((_, teams)) if joins => teams.push(inst.team.clone()),
                _ => groups.push((inst.root, vec![inst.team.clone()])),
            }
        }
        for (inst_root, teams) in groups {
            let root = match inst_root {
                Some(RootKind::StreamIndex) if stream_root.is_some() => stream_root,
                None => None,
                Some(RootKind::Member { index, .. }) => Some(self.constant(index as i64)),
                Some(RootKind::StreamIndex) => match &self.open {
                    Some(open) => Some(open.index),
                    None => {
                        return Err(Diagnostic::new(format!(
                            "the {} of `{}` takes its root from a stream loop index, but it is not inside a stream loop",
                            info.kind.name(),
                            f.tensor(consumer).name
                        )))
                    }
                },
            };
            let comm = self.emit(Stmt::Communication(Communication {
                kind: info.kind,
                teams,
                root,
                red_op: info.red_op,
                input,
                output,
            }));
            self.emit(Stmt::Wait { comm });
        }
        Ok(())
    }

    /// The whole tensor `t` as bound outside any loop.
    fn whole(&self, t: TensorId) -> Result<HostTensorId, Diagnostic> {
        self.top.get(&t).copied().ok_or_else(|| {
            Diagnostic::new(format!(
                "`{}` is read before it is defined",
                self.f.tensor(t).name
            ))
        })
    }

    /// The P2P decomposition of a stream-split allgather (DID → Stream on the same axis, one
    /// chunk per device): iteration `i` of every rank `r` receives the shard of device
    /// `(r + i) % d` into chunk `(r + i) % d` and sends its own shard to device
    /// `(d + r - i) % d`, as one coalesced group. Iteration 0 is each rank's own shard (a
    /// send/recv with itself, which the runtime turns into a local copy). Every chunk view of
    /// this loop uses the same rotated index, so the compute that follows reads the chunk that
    /// just arrived.
    ///
    /// With teams that are slices of the world with a stride (the rows, `stride = 1`, or the
    /// columns, `stride = dx`, of a `devices(dy, dx)` mesh), the same ring runs within each
    /// slice on team indices: `r`'s index is `p = (r / stride) % d`, the chunk of iteration `i`
    /// is `k = (p + i) % d`, received from device `r + (k - p) * stride`, and the shard goes
    /// to device `r + ((d + p - i) % d - p) * stride`.
    fn lower_p2p_allgather(
        &mut self,
        producer: TensorId,
        consumer: TensorId,
        d: i64,
        stride: Option<i64>,
    ) -> Result<(), Diagnostic> {
        if let Some(stride) = stride {
            return self.lower_strided_p2p_allgather(producer, consumer, d, stride);
        }
        let (i, rank) = match &self.open {
            Some(open) => (
                open.index,
                self.scalar(HostScalar::Value(Scalar::named(weave_ir::RANK))),
            ),
            None => unreachable_loop()?,
        };
        let dd = self.constant(d);
        let sum = self.scalar(HostScalar::Binary(ScalarOp::Add, rank, i));
        let recv_peer = self.scalar(HostScalar::Binary(ScalarOp::Mod, sum, dd));
        let back = self.scalar(HostScalar::Binary(ScalarOp::Add, dd, rank));
        let back = self.scalar(HostScalar::Binary(ScalarOp::Sub, back, i));
        let send_peer = self.scalar(HostScalar::Binary(ScalarOp::Mod, back, dd));
        self.emit_ring_exchange(producer, consumer, recv_peer, recv_peer, send_peer)
    }
}

/// Whether two instances' roots are the same index into their teams (the devices may differ).
fn same_root_index(a: Option<RootKind>, b: Option<RootKind>) -> bool {
    match (a, b) {
        (Some(RootKind::Member { index: x, .. }), Some(RootKind::Member { index: y, .. })) => {
            x == y
        }
        _ => a == b,
    }
}

impl Lowering<'_> {
    /// [`Lowering::lower_p2p_allgather`] within strided slices of the world.
    fn lower_strided_p2p_allgather(
        &mut self,
        producer: TensorId,
        consumer: TensorId,
        d: i64,
        stride: i64,
    ) -> Result<(), Diagnostic> {
        let (i, rank) = match &self.open {
            Some(open) => (
                open.index,
                self.scalar(HostScalar::Value(Scalar::named(weave_ir::RANK))),
            ),
            None => unreachable_loop()?,
        };
        let bin = |l: &mut Self, op, a, b| l.scalar(HostScalar::Binary(op, a, b));
        let dd = self.constant(d);
        let st = self.constant(stride);
        // `x * stride` and `rank / stride`, written without a unit stride.
        let scaled = |l: &mut Self, x| {
            if stride == 1 {
                x
            } else {
                bin(l, ScalarOp::Mul, x, st)
            }
        };
        let row = if stride == 1 {
            rank
        } else {
            bin(self, ScalarOp::Div, rank, st)
        };
        let pos = bin(self, ScalarOp::Mod, row, dd);
        let sum = bin(self, ScalarOp::Add, pos, i);
        let chunk = bin(self, ScalarOp::Mod, sum, dd);
        let delta = bin(self, ScalarOp::Sub, chunk, pos);
        let delta = scaled(self, delta);
        let recv_peer = bin(self, ScalarOp::Add, rank, delta);
        let back = bin(self, ScalarOp::Add, dd, pos);
        let back = bin(self, ScalarOp::Sub, back, i);
        let back = bin(self, ScalarOp::Mod, back, dd);
        let delta = bin(self, ScalarOp::Sub, back, pos);
        let delta = scaled(self, delta);
        let send_peer = bin(self, ScalarOp::Add, rank, delta);
        self.emit_ring_exchange(producer, consumer, chunk, recv_peer, send_peer)
    }

    /// One step of the ring: the iteration's views take chunk `chunk` of the consumer, which
    /// is received from `recv_peer` while the whole local shard of the producer goes to
    /// `send_peer`, as one coalesced pair, waited for.
    fn emit_ring_exchange(
        &mut self,
        producer: TensorId,
        consumer: TensorId,
        chunk: ScalarId,
        recv_peer: ScalarId,
        send_peer: ScalarId,
    ) -> Result<(), Diagnostic> {
        if let Some(open) = self.open.as_mut() {
            open.view_index = chunk;
        }
        // The whole local shard is sent, never a chunk of it.
        let send = self.whole(producer)?;
        let recv = self.resolve(consumer, true)?;
        self.emit(Stmt::StartCoalescing);
        self.emit(Stmt::P2PCommunication(P2PCommunication {
            direction: P2PDirection::Recv,
            peer: recv_peer,
            buffer: recv,
        }));
        self.emit(Stmt::P2PCommunication(P2PCommunication {
            direction: P2PDirection::Send,
            peer: send_peer,
            buffer: send,
        }));
        let end = self.emit(Stmt::EndCoalescing);
        self.emit(Stmt::Wait { comm: end });
        Ok(())
    }
}

/// Whether the ring allgather can run on these teams, and how: `Some(None)` for one team
/// that is the world in rank order (peers are device numbers), `Some(Some(stride))` for
/// several teams that cover the world, each `t0, t0 + stride, …` with `t0 / stride` a
/// multiple of the team size (so a rank's team index is `(rank / stride) % d`), `None`
/// otherwise.
fn ring_stride(instances: &[crate::communication::TeamInstance]) -> Option<Option<i64>> {
    let first = &instances.first()?.team;
    let d = first.len() as i64;
    if instances.len() == 1 {
        let arange = first.iter().enumerate().all(|(k, dev)| *dev == k as i64);
        return arange.then_some(None);
    }
    let stride = if d > 1 { first[1] - first[0] } else { 1 };
    if stride <= 0 || d == 0 {
        return None;
    }
    let mut all: Vec<i64> = instances.iter().flat_map(|t| t.team.clone()).collect();
    all.sort_unstable();
    if all.iter().enumerate().any(|(k, dev)| *dev != k as i64) {
        return None;
    }
    for t in instances.iter().map(|t| &t.team) {
        let regular = t.len() as i64 == d
            && (t[0] / stride) % d == 0
            && t.iter()
                .enumerate()
                .all(|(k, dev)| *dev == t[0] + k as i64 * stride);
        if !regular {
            return None;
        }
    }
    Some(Some(stride))
}

fn unreachable_loop<T>() -> Result<T, Diagnostic> {
    Err(Diagnostic::new(
        "internal: P2P allgather lowering outside a stream loop",
    ))
}

/// The fusion a kernel segment runs: its exprs replayed over fresh inputs that stand for the
/// segment's inputs (global shapes; the runtime binds local chunks).
fn kernel_fusion(
    f: &Fusion,
    exprs: &[ExprId],
    inputs: &[TensorId],
    outputs: &[TensorId],
    k: usize,
) -> Result<Fusion, Diagnostic> {
    let mut u = Fusion::new(&format!("{}_kernel{k}", f.name));
    for p in f.params() {
        u.add_param(&p.name, p.value)?;
    }
    let mut map: HashMap<TensorId, TensorId> = HashMap::new();
    for t in inputs {
        let tv = f.tensor(*t);
        let axes = f.visible_axes(*t);
        let ext = axes.iter().map(|i| f.id(*i).extent.clone()).collect();
        let n = u.add_input(&tv.name, tv.dtype, ext, None)?;
        let new_axes = u.tensor(n).logical.clone();
        let mut broadcast = Vec::new();
        for (k, (old, new)) in axes.iter().zip(new_axes).enumerate() {
            match f.id(*old).iter_type {
                IterType::Broadcast => broadcast.push(k),
                it => u.id_mut(new).iter_type = it,
            }
        }
        // A `.weave` declaration has no broadcast axes, and the kernel must read back from
        // the host IR text as it is: the input is declared with extent-1 axes, squeezed and
        // broadcast again, so the ops that follow stretch them as before.
        let value = if broadcast.is_empty() {
            n
        } else {
            let squeezed = u.add_op(
                &f.fresh_name(&format!("{}_squeezed", tv.name)),
                ExprKind::Squeeze {
                    axes: broadcast.clone(),
                },
                &[n],
            )?;
            u.add_op(
                &f.fresh_name(&format!("{}_stretched", tv.name)),
                ExprKind::Broadcast { axes: broadcast },
                &[squeezed],
            )?
        };
        map.insert(*t, value);
    }
    for e in exprs {
        let ex = f.expr(*e);
        let ins: Vec<TensorId> = ex.inputs.iter().map(|t| map[t]).collect();
        let o = ex.outputs[0];
        let n = u.add_op(&f.tensor(o).name, ex.kind.clone(), &ins)?;
        map.insert(o, n);
    }
    for t in outputs {
        u.add_output(map[t])?;
    }
    Ok(u)
}
