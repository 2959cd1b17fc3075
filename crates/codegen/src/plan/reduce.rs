//! Reductions: a pass of the row kernel being planned, or a kernel of their own (rows over
//! the innermost axes, columns over the outermost, else a loop per output element).

use weave_ir::{DType, ReduceOp};

use super::Gen;
use crate::expr::{Lazy, Rows};
use crate::source::{
    column_source, compute_type, memory_dtypes, row_source, serial_reduce, vector_width, BLOCK,
    COLUMNS_PER_BLOCK, COLUMN_LANES,
};
use crate::view::{contiguous_strides, numel};
use crate::{Node, View};

impl Gen<'_> {
    /// The reduction of `x` by `op` over `axes` (a value of `dtype`).
    pub(super) fn reduce(
        &mut self,
        x: &Lazy,
        op: ReduceOp,
        axes: &[usize],
        dtype: DType,
    ) -> Result<Lazy, String> {
        let rank = x.sizes.len();
        if axes.iter().any(|a| *a >= rank) {
            return Err(format!(
                "axes {axes:?} out of range for sizes {:?}",
                x.sizes
            ));
        }
        let kept: Vec<usize> = (0..rank).filter(|a| !axes.contains(a)).collect();
        let mut reduced = axes.to_vec();
        reduced.sort_unstable();
        reduced.dedup();
        let out_sizes: Vec<usize> = kept.iter().map(|a| x.sizes[*a]).collect();
        let red_sizes: Vec<usize> = reduced.iter().map(|a| x.sizes[*a]).collect();
        if numel(&red_sizes) == 0 && numel(&out_sizes) > 0 && op != ReduceOp::Sum {
            return Err(format!(
                "{} over axes {axes:?} of sizes {:?}, which are empty",
                op.name(),
                x.sizes
            ));
        }
        let dst = self.new_temp(dtype, &out_sizes);
        let k = kept.len();
        let name = self.kernel_name();
        if !reduced.is_empty() && reduced == (k..rank).collect::<Vec<_>>() && numel(&red_sizes) > 0
        {
            // Innermost axes: a row kernel of one pass; few long rows are split over blocks
            // (partials, then a row kernel over them).
            let rows = Rows {
                outer: Some(out_sizes.clone()),
                inner: red_sizes.clone(),
                passes: vec![(op, x.node.clone())],
            };
            let mut dtypes = Vec::new();
            x.node.dtypes(&mut dtypes);
            dtypes.push(dtype);
            let inner_n = red_sizes.last().copied().unwrap_or(1);
            let vec = vector_width(inner_n, &memory_dtypes(&x.node), &[], rank);
            let nrows = numel(&out_sizes);
            let nv = numel(&red_sizes) / vec;
            let splits = if nrows * 2 < self.sms {
                (self.sms * 4).div_ceil(nrows).min(nv / 1024).max(1)
            } else {
                1
            };
            let (target, partial) = if splits > 1 {
                let ct = compute_type(&x.node, Some(dtype));
                let pdt = if ct == "double" {
                    DType::F64
                } else {
                    DType::F32
                };
                let sizes = [out_sizes.clone(), vec![splits]].concat();
                let t = self.new_temp(pdt, &sizes);
                (t.clone(), Some(t))
            } else {
                (
                    View {
                        sizes: out_sizes.clone(),
                        ..dst.clone()
                    },
                    None,
                )
            };
            let per_row = [(Node::Row(0), target)];
            let source = |vec: usize| {
                row_source(
                    &name,
                    &rows,
                    &out_sizes,
                    &[],
                    &per_row,
                    vec,
                    &dtypes,
                    splits,
                )
            };
            let mut launch = source(vec);
            if vec > 1 {
                launch.fallback = Some(Box::new(source(1)));
            }
            self.plan.launches.push(launch);
            if let Some(partial) = partial {
                // The partials, `[rows.., splits]`, reduced over their last axis.
                let rows = Rows {
                    outer: Some(out_sizes.clone()),
                    inner: vec![splits],
                    passes: vec![(op, Node::Load(partial.clone()))],
                };
                let per_row = [(
                    Node::Row(0),
                    View {
                        sizes: out_sizes.clone(),
                        ..dst.clone()
                    },
                )];
                let name = self.kernel_name();
                let launch = row_source(
                    &name,
                    &rows,
                    &out_sizes,
                    &[],
                    &per_row,
                    1,
                    &[partial.dtype, dtype],
                    1,
                );
                self.plan.launches.push(launch);
            }
        } else if !reduced.is_empty()
            && reduced == (0..reduced.len()).collect::<Vec<_>>()
            && k > 0
            && numel(&red_sizes) > 0
        {
            // Outermost axes: a column per thread, the rows split over blocks.
            // As many parts as one wave of blocks holds (each part is `COLUMN_LANES` threads
            // per column; a second, partial wave would leave most SMs idle while it runs),
            // each of at least `32 * COLUMN_LANES` rows (a lane adds 32 rows or more).
            let m = numel(&out_sizes);
            let nr = numel(&red_sizes);
            let xb = m.div_ceil(COLUMNS_PER_BLOCK);
            let want = (self.sms.max(1) * 2048) / (xb * BLOCK as usize);
            let splits = want.clamp(1, nr.div_ceil(32 * COLUMN_LANES).max(1));
            if splits == 1 {
                let launch = column_source(&name, &x.node, &red_sizes, &out_sizes, op, &dst, 1);
                self.plan.launches.push(launch);
            } else {
                let ct = compute_type(&x.node, Some(dtype));
                let pdt = if ct == "double" {
                    DType::F64
                } else {
                    DType::F32
                };
                let partial = self.new_temp(pdt, &[splits, m]);
                let launch = column_source(
                    &name,
                    &x.node,
                    &red_sizes,
                    &out_sizes,
                    op,
                    &View {
                        sizes: out_sizes.clone(),
                        strides: contiguous_strides(&out_sizes),
                        ..partial.clone()
                    },
                    splits,
                );
                self.plan.launches.push(launch);
                // The partials, `[splits, m]`, reduced over their first axis.
                let sum = Node::Load(View {
                    sizes: [vec![splits], out_sizes.clone()].concat(),
                    strides: [vec![m as isize], contiguous_strides(&out_sizes)].concat(),
                    ..partial
                });
                let name = self.kernel_name();
                let launch = column_source(&name, &sum, &[splits], &out_sizes, op, &dst, 1);
                self.plan.launches.push(launch);
            }
        } else {
            let launch = serial_reduce(&name, x, op, &kept, &reduced, &out_sizes, &dst);
            self.plan.launches.push(launch);
        }
        Ok(Lazy {
            dtype,
            sizes: out_sizes,
            node: Node::Load(dst),
        })
    }
}
