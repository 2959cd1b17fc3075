//! Lowering communication segments: collectives posted whole, per piece or per chunk, stream
//! Broadcasts rooted from the loop index, and the P2P ring of a stream-split allgather.

use weave_host_ir::{
    Communication, CommunicationType, HostScalar, HostTensorId, P2PCommunication, P2PDirection,
    ScalarId, Stmt,
};
use weave_ir::{
    BinaryOp, Diagnostic, ExprId, ExprKind, Fusion, IterDomainId, IterType, Scalar, ScalarOp,
    TensorId,
};
use weave_transform::schedule::{walk_splits, SplitsEnd};

use super::{loop_axis, Lowering, OpenLoop, StreamAllgather};
use crate::communication::{derive_communication, CommunicationInfo, RootKind};

impl Lowering<'_> {
    pub(super) fn lower_communication(&mut self, e: ExprId) -> Result<(), Diagnostic> {
        let f = self.f;
        let expr = f.expr(e).clone();
        let (producer, consumer) = (expr.inputs[0], expr.outputs[0]);
        if self.gathered_by_ring.contains_key(consumer) {
            // Its pieces went out in the last step of the ring that computed its input.
            return Ok(());
        }
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
                        && !self.other_communication_in_loop(stride == Some(None))
                }) {
                    return self.lower_p2p_allgather(producer, consumer, d, stride);
                }
            }
        }
        if info.root == Some(RootKind::StreamIndex) && info.kind == CommunicationType::Reduce {
            return self.lower_stream_reduce(&info, producer, consumer);
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

    /// The stream loop whose index roots `info` (a collective rooted at each iteration's
    /// device), or the error naming `consumer` when it is posted outside any stream loop.
    fn rooting_loop(
        &self,
        info: &CommunicationInfo,
        consumer: TensorId,
    ) -> Result<&OpenLoop, Diagnostic> {
        self.open.as_ref().ok_or_else(|| {
            Diagnostic::new(format!(
                "the {} of `{}` takes its root from a stream loop index, but it is not inside a stream loop",
                info.kind.name(),
                self.f.tensor(consumer).name
            ))
        })
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
        let (i, s) = self
            .rooting_loop(info, consumer)
            .map(|o| (o.index, o.extent))?;
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

    /// A device sum whose stream chunks are its output's device blocks (Stream → DID, one
    /// chunk per device): the output is each rank's whole block, allocated before the loop.
    /// In a loop that is a P2P ring (iteration `i` of rank `r` holds chunk `c = (r + i + o)
    /// % d`: `o = 1` in a ring of its own, which leaves the own chunk for last; `o = 0` on an
    /// allgather's ring, which `split_ring_loops` leaves only where it cannot cut the loop),
    /// iteration `i` sends its chunk's partial to device `c` and receives, into slot `i` of a
    /// buffer of `d` blocks, the partial of this rank's block that device `(2r - c) mod d`
    /// computed in its iteration `i`, as one coalesced pair; one kernel then adds the slot
    /// into the block, zeroed before the loop (`assign-streams` orders these additions across
    /// iterations). The own chunk's partial is a send/recv with itself. Otherwise iteration
    /// `i` is a Reduce of its chunk rooted at device `i`.
    fn lower_stream_reduce(
        &mut self,
        info: &CommunicationInfo,
        producer: TensorId,
        consumer: TensorId,
    ) -> Result<(), Diagnostic> {
        let f = self.f;
        let (i, s, view_index, ring) = self
            .rooting_loop(info, consumer)
            .map(|o| (o.index, o.extent, o.view_index, o.ring))?;
        let d = info.team.len() as i64;
        if s != d {
            return Err(Diagnostic::new(format!(
                "the sum that `{}` scatters over {d} devices by its stream chunks needs one chunk per device, got {s} chunks",
                f.tensor(consumer).name
            )));
        }
        if ring && self.product_rides_the_ring(producer) {
            let product = self.ring_products[producer];
            return self.lower_accumulating_ring(consumer, product, d);
        }
        if self.top.contains_key(consumer) {
            return Err(Diagnostic::new(format!(
                "internal: `{}` is written twice",
                f.tensor(consumer).name
            )));
        }
        let input = self.resolve(producer, false)?;
        let sizes = self.local_sizes(consumer, false)?;
        let out = self.new_tensor(consumer, sizes.clone());
        let ring = ring && ring_stride(&info.instances) == Some(None);
        self.emit_before_loop(Stmt::Allocate {
            tensor: out,
            zero_init: ring,
        });
        self.top.insert(consumer, out);
        if !ring {
            return self.post(info, consumer, input, out, Some(i));
        }
        // The received partials: `d` blocks along the first axis, one per iteration.
        let mut slots = sizes;
        let Some(first) = slots.first_mut() else {
            return Err(Diagnostic::new(format!(
                "the sum that `{}` scatters by its stream chunks has no axis to cut",
                f.tensor(consumer).name
            )));
        };
        *first = first.clone().mul(Scalar::c(d));
        let received = self.new_tensor(consumer, slots);
        self.emit_before_loop(Stmt::Allocate {
            tensor: received,
            zero_init: false,
        });
        let slot = self.piece(received, 0, d, i)?;
        // The device whose iteration i holds this rank's chunk: with chunk `c = (r + i + o)
        // % d` in iteration i, `(2r - c) mod d`, written `(d + 2r - c) % d` (c < d).
        let rank = self.scalar(HostScalar::Value(Scalar::builtin(weave_ir::Builtin::Rank)));
        let dd = self.constant(d);
        let twice = self.scalar(HostScalar::Binary(ScalarOp::Add, rank, rank));
        let back = self.scalar(HostScalar::Binary(ScalarOp::Add, dd, twice));
        let back = self.scalar(HostScalar::Binary(ScalarOp::Sub, back, view_index));
        let from = self.scalar(HostScalar::Binary(ScalarOp::Mod, back, dd));
        self.emit_exchange((from, slot), (view_index, input));
        let unit = ring_sum_kernel(f, consumer, self.kernels)?;
        self.emit_accumulation(unit, slot, out);
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
        let end = walk_splits(
            f,
            did,
            |id| within.contains(&id),
            |cur, _, outer, inner| {
                if inner == cur {
                    pieces *= f.eval(&f.id(outer).extent).ok_or_else(|| {
                        Diagnostic::new(format!(
                            "the {pt} split of `{}` sits inside a split without a constant extent",
                            tv.name
                        ))
                    })?;
                }
                Ok(())
            },
        )?;
        let SplitsEnd::Stop(cur) = end else {
            return Ok(1);
        };
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
                Some(RootKind::StreamIndex) => Some(self.rooting_loop(info, consumer)?.index),
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
        self.top.get(t).copied().ok_or_else(|| {
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
                self.scalar(HostScalar::Value(Scalar::builtin(weave_ir::Builtin::Rank))),
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
                self.scalar(HostScalar::Value(Scalar::builtin(weave_ir::Builtin::Rank))),
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
        // The rank at position `at` of this rank's slice: `rank + (at - pos) * stride`.
        let peer = |l: &mut Self, at| {
            let delta = bin(l, ScalarOp::Sub, at, pos);
            let delta = scaled(l, delta);
            bin(l, ScalarOp::Add, rank, delta)
        };
        let sum = bin(self, ScalarOp::Add, pos, i);
        let chunk = bin(self, ScalarOp::Mod, sum, dd);
        let recv_peer = peer(self, chunk);
        let back = bin(self, ScalarOp::Add, dd, pos);
        let back = bin(self, ScalarOp::Sub, back, i);
        let back = bin(self, ScalarOp::Mod, back, dd);
        let send_peer = peer(self, back);
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
            open.ring = true;
        }
        // The whole local shard is sent, never a chunk of it.
        let send = self.whole(producer)?;
        let recv = self.resolve(consumer, true)?;
        self.emit_exchange((recv_peer, recv), (send_peer, send));
        Ok(())
    }

    /// One coalesced pair, waited for: receive `recv.1` from `recv.0` while sending `send.1`
    /// to `send.0`.
    pub(super) fn emit_exchange(
        &mut self,
        recv: (ScalarId, HostTensorId),
        send: (ScalarId, HostTensorId),
    ) {
        self.emit_exchanges(&[(recv, send)]);
    }

    /// [`Self::emit_exchange`] of several `(recv, send)` pairs in one coalesced group.
    pub(super) fn emit_exchanges(&mut self, pairs: &[ExchangePair]) {
        self.emit(Stmt::StartCoalescing);
        for (recv, send) in pairs {
            self.emit(Stmt::P2PCommunication(P2PCommunication {
                direction: P2PDirection::Recv,
                peer: recv.0,
                buffer: recv.1,
            }));
            self.emit(Stmt::P2PCommunication(P2PCommunication {
                direction: P2PDirection::Send,
                peer: send.0,
                buffer: send.1,
            }));
        }
        let end = self.emit(Stmt::EndCoalescing);
        self.emit(Stmt::Wait { comm: end });
    }
}

/// One receive and one send of an exchange: `(peer, buffer)` each.
pub(super) type ExchangePair = ((ScalarId, HostTensorId), (ScalarId, HostTensorId));

/// Whether the ring allgather can run on these teams, and how: `Some(None)` for one team
/// that is the world in rank order (peers are device numbers), `Some(Some(stride))` for
/// several teams that cover the world, each `t0, t0 + stride, …` with `t0 / stride` a
/// multiple of the team size (so a rank's team index is `(rank / stride) % d`), `None`
/// otherwise.
pub(super) fn ring_stride(instances: &[crate::communication::TeamInstance]) -> Option<Option<i64>> {
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

/// The kernel of one step of the ring that reduces onto `out`: `received + so_far`, both of
/// `out`'s global shape (the runtime binds the local block).
fn ring_sum_kernel(f: &Fusion, out: TensorId, k: usize) -> Result<Fusion, Diagnostic> {
    let mut u = Fusion::new(&format!("{}_kernel{k}", f.name));
    for p in f.params() {
        u.add_param(&p.name, p.value)?;
    }
    let tv = f.tensor(out);
    let extents: Vec<Scalar> = tv
        .logical
        .iter()
        .filter(|i| f.id(**i).iter_type != IterType::Reduction)
        .map(|i| f.id(*i).extent.clone())
        .collect();
    let received = u.add_input(
        &f.fresh_name(&format!("{}_received", tv.name)),
        tv.dtype,
        extents.clone(),
        None,
    )?;
    let so_far = u.add_input(
        &f.fresh_name(&format!("{}_so_far", tv.name)),
        tv.dtype,
        extents,
        None,
    )?;
    let next = u.add_op(
        &f.fresh_name(&format!("{}_accumulated", tv.name)),
        ExprKind::Binary(BinaryOp::Add),
        &[so_far, received],
    )?;
    u.add_output(next)?;
    Ok(u)
}

fn unreachable_loop<T>() -> Result<T, Diagnostic> {
    Err(Diagnostic::new(
        "internal: P2P allgather lowering outside a stream loop",
    ))
}
