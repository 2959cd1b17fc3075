//! The reduce ring that sums in its GEMMs: each step's product added by an accumulating
//! GEMM (cuBLASLt's beta = 1) onto the partial received from the next rank, each step cut
//! into pieces so that a piece crosses while the next is computed, and no kernel adds.

use weave_host_ir::{HostScalar, HostTensorId, ScalarId, Stmt};
use weave_ir::{Diagnostic, ExprId, ExprKind, IterDomainId, Scalar, ScalarOp, TensorId};
use weave_segmenter::{SegmentKind, SegmentedFusion};

use super::Lowering;

impl Lowering<'_> {
    /// With [`super::LowerToHost::ring_pieces`], the GEMMs whose partials a reduce ring sums
    /// in their own loop: a library segment (one `linear` without a bias, which every step
    /// would add again, or one `matmul`) whose output only that Reduce reads. Recorded in
    /// [`Lowering::ring_products`].
    pub(super) fn find_ring_products(&mut self, sf: &SegmentedFusion) {
        if self.ring_pieces.is_none() {
            return;
        }
        for (&reduce, _) in self.ring_reduces.iter() {
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
            }
        }
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
        // R: d blocks of the output's rows; the output is its last block.
        let mut all = sizes.clone();
        all[0] = rows.clone().mul(Scalar::c(d));
        let partials = self.new_tensor(consumer, all);
        self.emit_before_loop(Stmt::Allocate {
            tensor: partials,
            zero_init: true,
        });
        let out = self.new_tensor(consumer, sizes.clone());
        let (blocks, last) = (self.constant(d), self.constant(d - 1));
        self.emit_before_loop(Stmt::ShardByStream {
            input: partials,
            axis: 0,
            chunks: blocks,
            index: last,
            holds: None,
            output: out,
        });
        self.top.insert(consumer, out);
        let mut piece = sizes;
        piece[0] = rows.ceil_div(Scalar::c(k));
        let slot = self.slot(consumer, partials, &piece, d * k, i);
        self.library_call(product, Some(slot), true)?;
        if d == 1 {
            return Ok(());
        }
        // `last` is 1 in the last step, else 0: `(i / k) / (d - 1)`.
        let kk = self.constant(k);
        let step = self.scalar(HostScalar::Binary(ScalarOp::Div, i, kk));
        let dm1 = self.constant(d - 1);
        let in_last = if d == 2 {
            step
        } else {
            self.scalar(HostScalar::Binary(ScalarOp::Div, step, dm1))
        };
        let rank = self.scalar(HostScalar::Value(Scalar::builtin(weave_ir::Builtin::Rank)));
        let dd = self.constant(d);
        // To `(rank + d - 1 + last) % d`, from `(rank + 1 + d - last) % d`.
        let back = self.scalar(HostScalar::Binary(ScalarOp::Add, rank, dm1));
        let back = self.scalar(HostScalar::Binary(ScalarOp::Add, back, in_last));
        let to = self.scalar(HostScalar::Binary(ScalarOp::Mod, back, dd));
        let d1 = self.constant(d + 1);
        let ahead = self.scalar(HostScalar::Binary(ScalarOp::Add, rank, d1));
        let ahead = self.scalar(HostScalar::Binary(ScalarOp::Sub, ahead, in_last));
        let from = self.scalar(HostScalar::Binary(ScalarOp::Mod, ahead, dd));
        // Into slot `i + k - k * last`.
        let next = self.scalar(HostScalar::Binary(ScalarOp::Add, i, kk));
        let stay = self.scalar(HostScalar::Binary(ScalarOp::Mul, kk, in_last));
        let into = self.scalar(HostScalar::Binary(ScalarOp::Sub, next, stay));
        let received = self.slot(consumer, partials, &piece, d * k, into);
        self.emit_exchange((from, received), (to, slot));
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
