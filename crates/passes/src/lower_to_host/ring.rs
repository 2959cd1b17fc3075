//! The reduce ring that sums in its GEMMs: each step's product added by an accumulating
//! GEMM (cuBLASLt's beta = 1) onto the partial received from the next rank, each step cut
//! into pieces so that a piece crosses while the next is computed, and no kernel adds.

use weave_host_ir::{CommunicationType, HostScalar, HostTensorId, ScalarId, Stmt};
use weave_ir::{Diagnostic, ExprId, ExprKind, IterDomainId, Scalar, ScalarOp, TensorId};
use weave_segmenter::{SegmentKind, SegmentedFusion};

use super::Lowering;
use crate::communication::{derive_communication, ShardedAxis};

impl Lowering<'_> {
    /// With [`super::LowerToHost::ring_pieces`], the GEMMs whose partials a reduce ring sums
    /// in their own loop: a library segment (one `linear` without a bias, which every step
    /// would add again, or one `matmul`) whose output only that Reduce reads. Recorded in
    /// [`Lowering::ring_products`].
    pub(super) fn find_ring_products(&mut self, sf: &SegmentedFusion) {
        if self.ring_pieces.is_none() {
            return;
        }
        let mut gathers = Vec::new();
        for (&reduce, &d) in self.ring_reduces.iter() {
            let Some(&e) = sf.segment(reduce).exprs().first() else {
                continue;
            };
            let p = self.f.expr(e).inputs[0];
            let Some(&seg) = self.producer.get(p) else {
                continue;
            };
            let s = sf.segment(seg);
            let [product] = s.exprs() else { continue };
            let gemm = matches!(
                self.f.expr(*product).kind,
                ExprKind::Linear | ExprKind::Matmul
            ) && self.f.expr(*product).inputs.len() == 2;
            let same_loop = self
                .loop_of
                .get(&seg)
                .copied()
                .flatten()
                .is_some_and(|l| self.loop_of.get(&reduce) == Some(&Some(l)));
            let only_reader = self
                .consumers
                .get(p)
                .is_some_and(|c| c.as_slice() == [reduce]);
            if s.kind() == SegmentKind::Library && gemm && same_loop && only_reader {
                self.ring_products.insert(p, *product);
                let y = self.f.expr(e).outputs[0];
                if let Some(g) = self.ring_gather_of(sf, y, d) {
                    gathers.push((y, g));
                }
            }
        }
        for (y, g) in gathers {
            self.ring_gathers.insert(y, g);
        }
    }

    /// The tensor `g` of `g = set(y)`, when that allgather of the ring's output `y` (to
    /// `d` devices, the world in rank order, along the rows the ring cuts) is all that
    /// reads `y`, at top level: the ring's last step then posts it piece by piece, each
    /// piece as soon as its sum is done, into a buffer that holds `g` (see
    /// [`Self::lower_accumulating_ring`]).
    fn ring_gather_of(&self, sf: &SegmentedFusion, y: TensorId, d: i64) -> Option<TensorId> {
        let f = self.f;
        if f.is_output(y) || d < 2 {
            return None;
        }
        let [seg] = self.consumers.get(y)?.as_slice() else {
            return None;
        };
        let s = sf.segment(*seg);
        let [e] = s.exprs() else { return None };
        if s.kind() != SegmentKind::Communication || self.loop_of.get(seg) != Some(&None) {
            return None;
        }
        let g = f.expr(*e).outputs[0];
        let info = derive_communication(f, *e).ok()?;
        let rows = |a: Option<ShardedAxis>| a.and_then(|a| a.axis) == Some(0);
        let gathers = info.kind == CommunicationType::Allgather
            && info.team.len() as i64 == d
            && super::collectives::ring_stride(&info.instances) == Some(None)
            && rows(info.producer_axis)
            && rows(info.consumer_axis)
            && f.tensor(g).dtype == f.tensor(y).dtype;
        gathers.then_some(g)
    }

    /// Whether the loop of the segment being lowered holds a GEMM of
    /// [`Lowering::ring_products`].
    pub(super) fn loop_accumulates_in_ring(&self) -> bool {
        let Some(l) = self.current_loop() else {
            return false;
        };
        self.ring_products.iter().any(|(p, _)| {
            self.producer
                .get(p)
                .is_some_and(|seg| self.loop_of.get(seg) == Some(&Some(l)))
        })
    }

    /// Whether the open loop accumulates the partials of `p` in the GEMM that computes them:
    /// that GEMM is lowered with the ring's exchange, not on its own.
    pub(super) fn product_rides_the_ring(&self, p: TensorId) -> bool {
        self.open.as_ref().is_some_and(|o| o.accumulating_ring)
            && self.ring_products.contains_key(p)
    }

    /// Refuses `k` pieces per step when the axis the loop cuts (`root` of `r`) does not fall
    /// into `extent * k` equal pieces: piece `q` of device block `c` must be the loop's chunk
    /// `c * k + q`.
    pub(super) fn check_ring_pieces(
        &self,
        root: IterDomainId,
        r: TensorId,
        extent: i64,
        k: i64,
    ) -> Result<(), Diagnostic> {
        let f = self.f;
        let name = &f.tensor(r).name;
        let Some(size) = f.eval(&f.id(root).extent) else {
            return Err(Diagnostic::new(format!(
                "ring-pieces={k}: the axis of `{name}` that the ring cuts has no constant size"
            )));
        };
        if size % (extent * k) != 0 {
            return Err(Diagnostic::new(format!(
                "ring-pieces={k}: the {size} rows of `{name}` do not fall into {extent} device blocks of {k} equal pieces ({} pieces)",
                extent * k
            )));
        }
        Ok(())
    }

    /// A reduce ring that sums in its GEMMs. With `d` devices and `k` pieces, the loop runs
    /// `d * k` iterations; iteration `i` is piece `q = i % k` of step `a = i / k`, which
    /// computes this rank's partial of piece `q` of device block `c = (rank + a + 1) % d`.
    /// The partials live in one buffer `R` of `d` blocks of `k` pieces each, zeroed before
    /// the loop; block `d - 1` is the output. Iteration `i`:
    /// * adds its product to slot `i` of `R` (`T += linear(..)`): the partial of the same
    ///   piece that the next rank, `rank + 1`, computed `k` iterations before and sent here
    ///   (nothing in step 0, whose slots stay zero);
    /// * sends slot `i` to the previous rank, `rank - 1`, whose step `a + 1` holds the same
    ///   block, while it receives into slot `i + k` the next rank's partial for its own step
    ///   `a + 1`, as one coalesced pair. In the last step the pair is slot `i` with itself:
    ///   the sum is in place, and a transfer to itself of one buffer moves nothing.
    ///
    /// Every rank holds its own block last, summed over all ranks; only the pieces of the
    /// last step wait for their transfers, and no kernel runs. `assign-streams` makes each
    /// accumulation wait for the iteration whose receive it adds to.
    ///
    /// With a gather ([`Self::ring_gather_of`]) `R` has `2d` blocks: the gathered tensor,
    /// then the steps' blocks. The last step adds into this rank's block of the gathered
    /// tensor, and its exchange also sends each summed piece to every other rank while their
    /// pieces arrive into their blocks.
    pub(super) fn lower_accumulating_ring(
        &mut self,
        consumer: TensorId,
        product: ExprId,
        d: i64,
    ) -> Result<(), Diagnostic> {
        let f = self.f;
        let (i, k) = match &self.open {
            Some(o) => (o.index, o.pieces),
            None => {
                return Err(Diagnostic::new(format!(
                    "internal: the ring that sums `{}` is lowered outside its loop",
                    f.tensor(consumer).name
                )))
            }
        };
        if self.top.contains_key(consumer) {
            return Err(Diagnostic::new(format!(
                "internal: `{}` is written twice",
                f.tensor(consumer).name
            )));
        }
        let sizes = self.local_sizes(consumer, false)?;
        let Some(rows) = sizes.first().cloned() else {
            return Err(Diagnostic::new(format!(
                "the sum that `{}` scatters by its stream chunks has no axis to cut",
                f.tensor(consumer).name
            )));
        };
        let gather = self
            .ring_gathers
            .get(consumer)
            .copied()
            .filter(|g| d > 1 && !self.top.contains_key(*g));
        // R: d blocks of the output's rows, the output its last block; with the gather,
        // 2d blocks: the gathered tensor (every rank's block, this rank's summed in place)
        // and then the blocks of the steps before the last.
        let blocks = if gather.is_some() { 2 * d } else { d };
        let mut all = sizes.clone();
        all[0] = rows.clone().mul(Scalar::c(blocks));
        let partials = self.new_tensor(consumer, all);
        self.emit_before_loop(Stmt::Allocate {
            tensor: partials,
            zero_init: true,
        });
        let rank = self.scalar(HostScalar::Value(Scalar::builtin(weave_ir::Builtin::Rank)));
        let dd = self.constant(d);
        let out = self.new_tensor(consumer, sizes.clone());
        if let Some(g) = gather {
            let mut gathered_sizes = sizes.clone();
            gathered_sizes[0] = rows.clone().mul(Scalar::c(d));
            let gathered = self.new_tensor(g, gathered_sizes);
            let (two, first) = (self.constant(2), self.constant(0));
            self.emit_before_loop(Stmt::ShardByStream {
                input: partials,
                axis: 0,
                chunks: two,
                index: first,
                holds: None,
                output: gathered,
            });
            self.emit_before_loop(Stmt::ShardByStream {
                input: gathered,
                axis: 0,
                chunks: dd,
                index: rank,
                holds: None,
                output: out,
            });
            self.top.insert(g, gathered);
            self.gathered_by_ring.insert(g, ());
        } else {
            let last = self.constant(d - 1);
            self.emit_before_loop(Stmt::ShardByStream {
                input: partials,
                axis: 0,
                chunks: dd,
                index: last,
                holds: None,
                output: out,
            });
        }
        self.top.insert(consumer, out);
        let mut piece = sizes;
        piece[0] = rows.ceil_div(Scalar::c(k));
        let kk = self.constant(k);
        let dm1 = self.constant(d - 1);
        // `last(x)` is 1 when ring position `x` (of `d * k`) is in the last step, else 0:
        // `(x / k) / (d - 1)`.
        let last_of = |l: &mut Self, x: ScalarId| {
            let step = l.scalar(HostScalar::Binary(ScalarOp::Div, x, kk));
            if d <= 2 {
                step
            } else {
                l.scalar(HostScalar::Binary(ScalarOp::Div, step, dm1))
            }
        };
        // With the gather, the slot of ring position `x` whose step is the last or not
        // (`last` 1 or 0), in the block of rank `owner` when it is the last: `x + d k` (after
        // the gathered blocks) before the last step, `x - (d - 1) k + owner · k` (that rank's
        // block of the gathered tensor) in it, as `(x + d k + last · owner · k) - last · (2d -
        // 1) k`, never negative on the way.
        let (dk, whole) = (self.constant(d * k), self.constant((2 * d - 1) * k));
        let gathered_slot = |l: &mut Self, x: ScalarId, last: ScalarId, owner: ScalarId| {
            let at = l.scalar(HostScalar::Binary(ScalarOp::Add, x, dk));
            let owner_k = l.scalar(HostScalar::Binary(ScalarOp::Mul, owner, kk));
            let owned = l.scalar(HostScalar::Binary(ScalarOp::Mul, last, owner_k));
            let at = l.scalar(HostScalar::Binary(ScalarOp::Add, at, owned));
            let back = l.scalar(HostScalar::Binary(ScalarOp::Mul, last, whole));
            l.scalar(HostScalar::Binary(ScalarOp::Sub, at, back))
        };
        // The slot of ring position `x`: `x` itself, or with the gather in this rank's block.
        let n_slots = blocks * k;
        let slot_of = |l: &mut Self, x: ScalarId| -> ScalarId {
            if gather.is_none() {
                return x;
            }
            let last = last_of(l, x);
            gathered_slot(l, x, last, rank)
        };
        let here = slot_of(self, i);
        let slot = self.slot(consumer, partials, &piece, n_slots, here);
        self.library_call(product, Some(slot), true)?;
        if d == 1 {
            return Ok(());
        }
        let in_last = last_of(self, i);
        // To `(rank + d - 1 + last) % d`, from `(rank + 1 + d - last) % d`.
        let back = self.scalar(HostScalar::Binary(ScalarOp::Add, rank, dm1));
        let back = self.scalar(HostScalar::Binary(ScalarOp::Add, back, in_last));
        let to = self.scalar(HostScalar::Binary(ScalarOp::Mod, back, dd));
        let d1 = self.constant(d + 1);
        let ahead = self.scalar(HostScalar::Binary(ScalarOp::Add, rank, d1));
        let ahead = self.scalar(HostScalar::Binary(ScalarOp::Sub, ahead, in_last));
        let from = self.scalar(HostScalar::Binary(ScalarOp::Mod, ahead, dd));
        // Into the slot of position `i + k - k * last`.
        let next = self.scalar(HostScalar::Binary(ScalarOp::Add, i, kk));
        let stay = self.scalar(HostScalar::Binary(ScalarOp::Mul, kk, in_last));
        let into = self.scalar(HostScalar::Binary(ScalarOp::Sub, next, stay));
        let into = slot_of(self, into);
        let received = self.slot(consumer, partials, &piece, n_slots, into);
        let mut pairs = vec![((from, received), (to, slot))];
        if gather.is_some() {
            // The gather: in the last step, the piece just summed goes to every other rank
            // (`rank + j`, j = 1 .. d - 1), while piece `q` of rank `src = rank - j`'s block
            // arrives into its place in the gathered tensor. In the steps before, each pair is
            // the slot with itself (`src` is this rank), which moves nothing.
            for j in 1..d {
                let jj = self.constant(j);
                let ahead = self.scalar(HostScalar::Binary(ScalarOp::Mul, jj, in_last));
                let ahead = self.scalar(HostScalar::Binary(ScalarOp::Add, rank, ahead));
                let peer_to = self.scalar(HostScalar::Binary(ScalarOp::Mod, ahead, dd));
                let back = self.constant(d - j);
                let back = self.scalar(HostScalar::Binary(ScalarOp::Mul, back, in_last));
                let back = self.scalar(HostScalar::Binary(ScalarOp::Add, rank, back));
                let src = self.scalar(HostScalar::Binary(ScalarOp::Mod, back, dd));
                let at = gathered_slot(self, i, in_last, src);
                let arriving = self.slot(consumer, partials, &piece, n_slots, at);
                pairs.push(((src, arriving), (peer_to, slot)));
            }
        }
        self.emit_exchanges(&pairs);
        self.accumulated_in_ring = true;
        Ok(())
    }

    /// The view of slot `index` of the `n` slots (of sizes `piece`) of `partials`, the
    /// buffer of `consumer`'s ring.
    fn slot(
        &mut self,
        consumer: TensorId,
        partials: HostTensorId,
        piece: &[Scalar],
        n: i64,
        index: ScalarId,
    ) -> HostTensorId {
        let view = self.new_tensor(consumer, piece.to_vec());
        let chunks = self.constant(n);
        self.emit(Stmt::ShardByStream {
            input: partials,
            axis: 0,
            chunks,
            index,
            holds: None,
            output: view,
        });
        view
    }
}
