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
//!   A device sum whose stream chunks are its output's device blocks (Stream → DID, one
//!   chunk per device: a Reduce rooted at each iteration's device) runs in its producer's
//!   loop though its output has no Stream axis: as a P2P ring that visits the rank's own
//!   chunk last when it is the loop's only communication, each received partial added in
//!   place into the output zeroed before the loop; otherwise one Reduce per iteration. With
//!   `ring-pieces=K` such a ring whose partials a GEMM of its loop computes sums in that GEMM
//!   instead, each step cut into `K` pieces (`ring.rs`), and an allgather that alone reads
//!   such a ring's output goes out piece by piece in the ring's last step. A loop
//!   whose allgather is a P2P ring and whose sums ride a ring too is cut in two before the
//!   product that computes the sums (`split_ring_loops`).
//! * Accumulation: a matmul whose output has no Stream axis but whose contraction axis an
//!   operand's Stream axis is cut from (a weight gradient `dW = xᵀ · dy` over stream-split
//!   tokens) joins that axis' loop as `dW += a_chunk @ b_chunk` (`Stmt::Matmul` with
//!   `accumulate`), `dW` allocated whole with `zero_init` before the loop; unless a segment of
//!   a stream loop reads `dW` (it would see a partial sum): then it runs whole at top level.
//!   Likewise a sum over the axis an input's Stream axis is cut from, whose output has the
//!   input's axes but the reduced ones (the per-chunk shards of reduce-scattered weight
//!   gradients): one kernel per iteration adds the chunk's sum to the zeroed total in place
//!   (`LaunchKernel(.., inputs=(chunk, T), outputs=(T))`). `assign-streams` orders the
//!   accumulations across iterations.
//! * A [`Lowering`](crate::pass::Lowering): it changes the IR form.

use std::collections::{HashMap, HashSet};

use weave_host_ir::ids::SecondaryMap;
use weave_host_ir::{
    HostProgram, HostScalar, HostTensor, HostTensorId, ScalarId, Signature, Stmt, StmtId, TensorSig,
};
use weave_ir::{
    Diagnostic, ExprId, Fusion, IterDomainId, IterType, MemoryType, ParallelType, Scalar, TensorId,
};
use weave_segmenter::{SegmentId, SegmentKind, SegmentedFusion};
use weave_transform::id_graph::IdGraph;

use crate::pass::{self, Pass, PassError, PassOptionError, PassOptions};

mod collectives;
mod order;
mod ring;
mod segments;
mod tensors;

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
/// `lower-to-host-broadcast`) with [`StreamAllgather::Broadcast`]; `lower-to-host{ring-pieces=K}`
/// with [`LowerToHost::ring_pieces`].
#[derive(Clone, Copy, Debug, Default)]
pub struct LowerToHost {
    /// The lowering of a DID → Stream copy with one chunk per device.
    pub stream_allgather: StreamAllgather,
    /// `Some(k)`: every reduce ring whose partials a GEMM of its own loop computes
    /// accumulates in that GEMM, each ring step cut into `k` pieces (see
    /// `Lowering::lower_accumulating_ring`); a program without such a ring is refused.
    /// `None`: the ring adds each received partial with a kernel.
    pub ring_pieces: Option<i64>,
}

/// The most pieces a ring step may be cut into.
pub const MAX_RING_PIECES: i64 = 64;

impl LowerToHost {
    /// The pass with the given DID → Stream lowering.
    pub fn new(stream_allgather: StreamAllgather) -> LowerToHost {
        LowerToHost {
            stream_allgather,
            ring_pieces: None,
        }
    }

    /// The same pass whose reduce rings accumulate in their GEMMs, in `pieces` pieces per
    /// step.
    pub fn with_ring_pieces(self, pieces: i64) -> LowerToHost {
        LowerToHost {
            ring_pieces: Some(pieces),
            ..self
        }
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
        let mut items = Vec::new();
        if self.stream_allgather == StreamAllgather::Broadcast {
            items.push("allgather=broadcast".to_string());
        }
        if let Some(k) = self.ring_pieces {
            items.push(format!("ring-pieces={k}"));
        }
        items.join(" ")
    }
}

impl pass::Lowering<SegmentedFusion, HostProgram> for LowerToHost {
    fn run(&self, sf: SegmentedFusion) -> Result<HostProgram, PassError> {
        let pass = self.name();
        lower_program(&sf, *self).map_err(|diagnostic| PassError::Unsupported { pass, diagnostic })
    }
}

impl LowerToHost {
    /// The pass with the options of a pipeline item: `allgather=p2p-ring` (the default) or
    /// `allgather=broadcast`; `ring-pieces=K` (1 to [`MAX_RING_PIECES`]).
    pub fn with_options(options: &PassOptions) -> Result<LowerToHost, PassOptionError> {
        let stream_allgather = options.take_choice(
            "allgather",
            &["p2p-ring", "broadcast"],
            &[StreamAllgather::P2pRing, StreamAllgather::Broadcast],
        )?;
        let ring_pieces = options.take_count("ring-pieces", MAX_RING_PIECES)?;
        options.finish()?;
        Ok(LowerToHost {
            stream_allgather,
            ring_pieces,
        })
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
    bound: SecondaryMap<TensorId, HostTensorId>,
    /// Whether the loop is a P2P ring (its allgather's, or one that only reduces): each
    /// rank visits the chunks in its own order, and a Reduce rooted at each iteration's
    /// device travels on the ring too.
    ring: bool,
    /// The pieces each chunk is cut into (1, or the ring's pieces in a reduce ring that
    /// accumulates in its GEMM): the loop runs `extent * pieces` iterations, and its chunk
    /// views are `extent * pieces` pieces of the axis it cuts.
    pieces: i64,
    /// Whether the loop is a reduce ring that accumulates in its GEMM ([`Lowering::ring_products`]).
    accumulating_ring: bool,
}

struct Lowering<'a> {
    f: &'a Fusion,
    graph: IdGraph,
    p: HostProgram,
    /// Tensors bound at top level (inputs, full buffers, non-stream intermediates).
    top: SecondaryMap<TensorId, HostTensorId>,
    open: Option<OpenLoop>,
    /// Whole-size buffers of loop-local intermediates, visible only through chunk views.
    loop_local: SecondaryMap<TensorId, HostTensorId>,
    kernels: usize,
    /// Loops whose chunk views a `swizzle1d` rotated: (loop, its index, the rotated index).
    rotated: Vec<(StmtId, ScalarId, ScalarId)>,
    /// The stream loop each segment runs in (`None`: top level), numbered in order.
    loop_of: HashMap<SegmentId, Option<usize>>,
    /// The segment that defines each tensor, and the segments that read it.
    producer: SecondaryMap<TensorId, SegmentId>,
    consumers: SecondaryMap<TensorId, Vec<SegmentId>>,
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
    /// Also the Reduces rooted at each iteration's device, keyed by their producer (see
    /// [`Self::stream_rooted_reduce`]).
    accumulating: HashMap<SegmentId, (TensorId, IterDomainId)>,
    /// Those Reduces whose teams are the world in rank order, with their team size: a loop
    /// whose allgather is the P2P ring carries them back on the same ring, and a loop that
    /// holds no other communication is a ring of its own.
    ring_reduces: HashMap<SegmentId, i64>,
    /// [`LowerToHost::ring_pieces`].
    ring_pieces: Option<i64>,
    /// The GEMMs whose partials a reduce ring sums by accumulating in them, by the tensor
    /// they compute: lowered with the ring's exchange (`lower_accumulating_ring`).
    ring_products: SecondaryMap<TensorId, ExprId>,
    /// Whether some ring accumulated in its GEMMs (a `ring_pieces` that none took is an
    /// error).
    accumulated_in_ring: bool,
    /// The allgathers that such a ring's last step posts piece by piece: by the ring's
    /// output, the gathered tensor (see `Lowering::find_ring_products`).
    ring_gathers: SecondaryMap<TensorId, TensorId>,
    /// The gathered tensors that a ring wrote: their own allgather posts nothing.
    gathered_by_ring: SecondaryMap<TensorId, ()>,
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
    lower_program(sf, LowerToHost::new(stream_allgather))
}

/// [`lower`] with every option of the pass.
pub fn lower_program(
    sf: &SegmentedFusion,
    options: LowerToHost,
) -> Result<HostProgram, Diagnostic> {
    let LowerToHost {
        stream_allgather,
        ring_pieces,
    } = options;
    let f = sf.fusion();
    let mut l = Lowering {
        f,
        graph: IdGraph::build(f),
        p: HostProgram::default(),
        top: SecondaryMap::new(),
        open: None,
        loop_local: SecondaryMap::new(),
        kernels: 0,
        rotated: Vec::new(),
        loop_of: HashMap::new(),
        producer: SecondaryMap::new(),
        consumers: SecondaryMap::new(),
        communications: HashSet::new(),
        current: None,
        current_graph: None,
        stream_allgather,
        accumulating: HashMap::new(),
        ring_reduces: HashMap::new(),
        ring_pieces,
        ring_products: SecondaryMap::new(),
        accumulated_in_ring: false,
        ring_gathers: SecondaryMap::new(),
        gathered_by_ring: SecondaryMap::new(),
    };
    for (id, s) in sf.segments() {
        for t in s.produced(f) {
            l.producer.insert(t, id);
        }
        for t in s.inputs() {
            crate::shared::push_to(&mut l.consumers, *t, id);
        }
    }
    for (id, s) in sf.segments() {
        if s.kind() == SegmentKind::Communication {
            l.communications.insert(id);
        }
    }
    let order = l.run_order(sf)?;
    l.find_ring_products(sf);
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
        let h = *l.top.get(*t).ok_or_else(|| {
            Diagnostic::new(format!(
                "output `{}` is only defined inside a stream loop; an output must be allocated whole",
                f.tensor(*t).name
            ))
        })?;
        l.p.outputs.push(h);
    }
    if let (Some(k), false) = (ring_pieces, l.accumulated_in_ring) {
        return Err(Diagnostic::new(format!(
            "ring-pieces={k}: `{}` has no reduce ring whose partials a GEMM of its loop computes (a sum scattered by stream chunks over the whole world in rank order, one chunk per device, in a loop with no other communication, its partials a linear without a bias or a matmul that nothing else reads)",
            f.name
        )));
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
}
