//! The generator: a fusion planned into kernels. It follows the fusion interpreter op by op,
//! on lazy values ([`Lazy`]); see the crate documentation for the two plans (one row kernel
//! for the whole fusion, else kernel by kernel). The ops are the `ops` module, reductions the
//! `reduce` module.

mod ops;
mod reduce;
#[cfg(test)]
mod tests;

use weave_ir::{DType, ExprKind, Fusion, ReduceOp};

use crate::expr::{Lazy, Rows};
use crate::source::{memory_dtypes, pointwise, row_source, vector_width};
use crate::view::{contiguous_strides, expand, numel, output_view, reshape_view};
use crate::{Buf, KernelPlan, Launch, Node, TensorArg, View};

struct Gen<'f> {
    fusion: &'f Fusion,
    name: String,
    plan: KernelPlan,
    sms: usize,
    /// `Some` while planning one row kernel for the whole fusion.
    rows: Option<Rows>,
}

/// Why a fusion cannot be planned on the buffers given.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The buffers given are not as many as the fusion's inputs and outputs.
    #[error(
        "kernel `{kernel}` takes {inputs} inputs and {outputs} outputs, got {given_inputs} and \
         {given_outputs}"
    )]
    Arity {
        /// The kernel's name.
        kernel: String,
        /// The fusion's inputs.
        inputs: usize,
        /// The fusion's outputs.
        outputs: usize,
        /// The input buffers given.
        given_inputs: usize,
        /// The output buffers given.
        given_outputs: usize,
    },
    /// The generator cannot express an op of the fusion on these layouts; the message names
    /// the op and what it cannot do.
    #[error("{0}")]
    Unsupported(String),
}

/// Plans the kernels that compute `fusion` from buffers laid out as `inputs` into buffers laid
/// out as `outputs`, for a device of `sms` SMs. Errors name the op and what it cannot do.
pub fn plan(
    fusion: &Fusion,
    name: &str,
    inputs: &[TensorArg],
    outputs: &[TensorArg],
    sms: usize,
) -> Result<KernelPlan, PlanError> {
    let declared = fusion.inputs();
    if inputs.len() != declared.len() || outputs.len() != fusion.outputs().len() {
        return Err(PlanError::Arity {
            kernel: name.to_string(),
            inputs: declared.len(),
            outputs: fusion.outputs().len(),
            given_inputs: inputs.len(),
            given_outputs: outputs.len(),
        });
    }
    let name: String = name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    let reduces = fusion
        .exprs()
        .iter()
        .any(|e| matches!(fusion.expr(*e).kind, ExprKind::Reduction { .. }));
    if reduces {
        let mut g = Gen::new(fusion, &name, sms, true);
        if g.run(inputs, outputs).is_ok() {
            return Ok(g.plan);
        }
    }
    let mut g = Gen::new(fusion, &name, sms, false);
    g.run(inputs, outputs).map_err(PlanError::Unsupported)?;
    Ok(g.plan)
}

/// Why a row kernel does not apply (the fusion is planned kernel by kernel instead).
const NOT_ROWS: &str = "not a row kernel";

impl<'f> Gen<'f> {
    fn new(fusion: &'f Fusion, name: &str, sms: usize, rows: bool) -> Gen<'f> {
        Gen {
            fusion,
            name: name.to_string(),
            plan: KernelPlan::default(),
            sms,
            rows: rows.then(Rows::default),
        }
    }

    fn run(&mut self, inputs: &[TensorArg], outputs: &[TensorArg]) -> Result<(), String> {
        let fusion = self.fusion;
        let mut env = std::collections::HashMap::new();
        for (k, (t, a)) in fusion.inputs().iter().zip(inputs).enumerate() {
            env.insert(
                *t,
                Lazy {
                    dtype: a.dtype,
                    sizes: a.sizes.clone(),
                    node: Node::Load(View {
                        buf: Buf::Input(k),
                        dtype: a.dtype,
                        offset: 0,
                        sizes: a.sizes.clone(),
                        strides: a.strides.iter().map(|s| *s as isize).collect(),
                    }),
                },
            );
        }
        for e in fusion.exprs() {
            let expr = fusion.expr(*e);
            let op = expr.kind.op_name();
            let out_t = match expr.outputs.as_slice() {
                [o] => *o,
                _ => return Err(format!("{op} has {} outputs", expr.outputs.len())),
            };
            let out_dtype = fusion.tensor(out_t).dtype;
            let mut ins = Vec::new();
            for t in &expr.inputs {
                ins.push(env.get(t).cloned().ok_or_else(|| {
                    format!("{op}: operand `{}` is not defined", fusion.tensor(*t).name)
                })?);
            }
            let value = self
                .op(&expr.kind, &expr.inputs, out_t, out_dtype, ins)
                .map_err(|m| format!("{op} `{}`: {m}", fusion.tensor(out_t).name))?;
            self.check_rows(&value)?;
            env.insert(out_t, value);
        }
        let mut stores = Vec::new();
        for (k, (t, a)) in fusion.outputs().iter().zip(outputs).enumerate() {
            let value = env
                .get(t)
                .cloned()
                .ok_or_else(|| format!("output `{}` is never defined", fusion.tensor(*t).name))?;
            let dst = output_view(Buf::Output(k), a, &value.sizes).ok_or_else(|| {
                format!(
                    "output `{}` has sizes {:?} but its buffer has sizes {:?}",
                    fusion.tensor(*t).name,
                    value.sizes,
                    a.sizes
                )
            })?;
            stores.push((value, dst));
        }
        match self.rows.take() {
            Some(rows) => {
                let launch = self.row_kernel(&rows, &stores)?;
                self.plan.launches.push(launch);
            }
            None => {
                for (value, dst) in &stores {
                    if !self.retarget(value, dst, &stores) {
                        self.store(value, dst);
                    }
                }
            }
        }
        Ok(())
    }

    /// When output `dst` is a plain copy of a temporary laid out like it (a reduction's
    /// result, say) that no other output reads, the kernels write the output instead and the
    /// copy is not needed; returns whether it did that.
    fn retarget(&mut self, value: &Lazy, dst: &View, stores: &[(Lazy, View)]) -> bool {
        let Node::Load(v) = &value.node else {
            return false;
        };
        let Buf::Temp(i) = v.buf else { return false };
        let same_layout = v.dtype == dst.dtype
            && v.offset == 0
            && dst.offset == 0
            && v.strides == contiguous_strides(&v.sizes)
            && v.sizes
                .iter()
                .zip(v.strides.iter().zip(&dst.strides))
                .all(|(n, (a, b))| *n == 1 || a == b);
        let readers = stores
            .iter()
            .filter(|(l, _)| {
                let mut views = Vec::new();
                l.node.loads(&mut views);
                views.iter().any(|w| w.buf == Buf::Temp(i))
            })
            .count();
        if !same_layout || readers != 1 {
            return false;
        }
        for l in &mut self.plan.launches {
            for b in &mut l.args {
                if *b == Buf::Temp(i) {
                    *b = dst.buf;
                }
            }
            if let Some(f) = &mut l.fallback {
                for b in &mut f.args {
                    if *b == Buf::Temp(i) {
                        *b = dst.buf;
                    }
                }
            }
        }
        self.plan.temps[i].1 = 0;
        true
    }

    /// In a row kernel, a value using a reduction must keep the rows as its outer axes.
    fn check_rows(&self, value: &Lazy) -> Result<(), String> {
        if let Some(Rows {
            outer: Some(outer), ..
        }) = &self.rows
        {
            if value.node.has_row() && !value.sizes.starts_with(outer) {
                return Err(NOT_ROWS.into());
            }
        }
        Ok(())
    }
}

impl<'f> Gen<'f> {
    /// The number of outer axes of the row kernel being planned (0 before its first pass).
    fn outer_rank(&self) -> usize {
        self.rows
            .as_ref()
            .and_then(|r| r.outer.as_ref())
            .map_or(0, Vec::len)
    }

    /// `x` with `sizes` (same element count), rewriting strides, or through a temporary.
    fn reshape(&mut self, x: Lazy, sizes: Vec<usize>) -> Result<Lazy, String> {
        if x.node.has_row() {
            let k = self.outer_rank();
            if x.sizes.get(..k) != sizes.get(..k) {
                return Err(NOT_ROWS.into());
            }
        }
        let f = |v: &View| reshape_view(v, &sizes);
        let x = match x.node.map_loads(&f) {
            Some(node) => {
                return Ok(Lazy {
                    dtype: x.dtype,
                    sizes,
                    node,
                })
            }
            None => self.materialize(&x)?,
        };
        let node = x
            .node
            .map_loads(&f)
            .ok_or("a contiguous temporary does not reshape")?;
        Ok(Lazy {
            dtype: x.dtype,
            sizes,
            node,
        })
    }

    /// `x` as an expression over `sizes` (numpy broadcasting).
    fn broadcast(&mut self, x: Lazy, sizes: &[usize]) -> Result<Node, String> {
        if x.sizes == sizes {
            return Ok(x.node);
        }
        if x.node.has_row() {
            // A row value broadcasts along the row only: same rank, the rows first, every
            // other axis of size 1.
            let k = self.outer_rank();
            let ok = x.sizes.len() == sizes.len()
                && x.sizes[..k] == sizes[..k]
                && x.sizes[k..].iter().all(|s| *s == 1);
            return if ok && !x.node.loads_any() {
                Ok(x.node)
            } else if ok {
                let f = |v: &View| expand(v, sizes);
                x.node.map_loads(&f).ok_or_else(|| NOT_ROWS.to_string())
            } else {
                Err(NOT_ROWS.into())
            };
        }
        // A load, or (in a row kernel, which cannot materialize) any expression, is
        // broadcast by expanding its leaves: each broadcast element recomputes the value,
        // which for a cast weight or a scaled constant costs less than a kernel and a buffer.
        let f = |v: &View| expand(v, sizes);
        if x.node.is_load()
            || matches!(&x.node, Node::Cast(_, l) if l.is_load())
            || self.rows.is_some()
        {
            if let Some(n) = x.node.map_loads(&f) {
                return Ok(n);
            }
        }
        let m = self.materialize(&x)?;
        m.node
            .map_loads(&f)
            .ok_or_else(|| format!("sizes {:?} do not broadcast to {sizes:?}", x.sizes))
    }

    /// `iota`, `slice` and `concat` index their axis globally: an error where this kernel
    /// holds a device's or a stream chunk's part of it (as the CPU interpreter says).
    fn whole_axis(
        &self,
        kind: &ExprKind,
        t: weave_ir::TensorId,
        axis: usize,
        sizes: &[usize],
    ) -> Result<(), String> {
        let local = *sizes
            .get(axis)
            .ok_or_else(|| format!("axis {axis} of sizes {sizes:?}"))?;
        let vis = self.fusion.visible_axes(t);
        match vis.get(axis).and_then(|id| self.fusion.eval(&self.fusion.id(*id).extent)) {
            Some(n) if n as usize != local => Err(format!(
                "{}: axis {axis} of `{}` is cut to {local} of its {n} elements here (a device or stream split of that axis reached this op); {} needs the whole axis: keep it unsplit, or split another axis",
                kind.op_name(),
                self.fusion.tensor(t).name,
                kind.op_name()
            )),
            _ => Ok(()),
        }
    }

    fn new_temp(&mut self, dtype: DType, sizes: &[usize]) -> View {
        self.plan.temps.push((dtype, numel(sizes)));
        View {
            buf: Buf::Temp(self.plan.temps.len() - 1),
            dtype,
            offset: 0,
            sizes: sizes.to_vec(),
            strides: contiguous_strides(sizes),
        }
    }

    /// Computes `x` into a fresh contiguous temporary and returns a load of it (never in a
    /// row kernel, which is one kernel).
    fn materialize(&mut self, x: &Lazy) -> Result<Lazy, String> {
        if self.rows.is_some() {
            return Err(NOT_ROWS.into());
        }
        let t = self.new_temp(x.dtype, &x.sizes);
        self.store(x, &t);
        Ok(Lazy {
            dtype: x.dtype,
            sizes: x.sizes.clone(),
            node: Node::Load(t),
        })
    }

    fn kernel_name(&self) -> String {
        format!("{}_{}", self.name, self.plan.launches.len())
    }

    /// Emits a pointwise kernel writing `x` into `dst` (same sizes).
    fn store(&mut self, x: &Lazy, dst: &View) {
        let name = self.kernel_name();
        let mut dtypes = memory_dtypes(&x.node);
        dtypes.push(dst.dtype);
        let inner = x.sizes.last().copied().unwrap_or(1);
        let vec = vector_width(inner, &dtypes, &[dst], x.sizes.len());
        let mut launch = pointwise(&name, x, dst, vec);
        if vec > 1 {
            launch.fallback = Some(Box::new(pointwise(&name, x, dst, 1)));
        }
        self.plan.launches.push(launch);
    }

    /// A row kernel pass: the reduction of `x` over its innermost axes.
    fn row_pass(
        &mut self,
        x: &Lazy,
        op: ReduceOp,
        axes: &[usize],
        dtype: DType,
    ) -> Result<Lazy, String> {
        let rank = x.sizes.len();
        let mut reduced = axes.to_vec();
        reduced.sort_unstable();
        reduced.dedup();
        let k = rank.checked_sub(reduced.len()).ok_or(NOT_ROWS)?;
        if reduced.is_empty() || reduced != (k..rank).collect::<Vec<_>>() {
            return Err(NOT_ROWS.into());
        }
        let (outer, inner) = x.sizes.split_at(k);
        if numel(inner) == 0 {
            return Err(NOT_ROWS.into());
        }
        let rows = self.rows.as_mut().ok_or(NOT_ROWS)?;
        match &rows.outer {
            None => {
                rows.outer = Some(outer.to_vec());
                rows.inner = inner.to_vec();
            }
            Some(o) if o == outer && rows.inner == inner => {}
            Some(_) => return Err(NOT_ROWS.into()),
        }
        rows.passes.push((op, x.node.clone()));
        Ok(Lazy {
            dtype,
            sizes: outer.to_vec(),
            node: Node::Row(rows.passes.len() - 1),
        })
    }

    /// The row kernel computing `rows`' passes and writing `stores`: whole rows
    /// (`outer ++ inner`) in a last pass, one value per row (`outer`, then axes of size 1)
    /// by the first thread.
    fn row_kernel(&self, rows: &Rows, stores: &[(Lazy, View)]) -> Result<Launch, String> {
        let outer = rows.outer.clone().ok_or(NOT_ROWS)?;
        let k = outer.len();
        // Too few rows to fill the GPU one block per row: kernel by kernel, where long rows
        // split over blocks.
        if numel(&outer) * 2 < self.sms && numel(&rows.inner) >= 1 << 16 {
            return Err(NOT_ROWS.into());
        }
        let mut full = Vec::new();
        let mut per_row = Vec::new();
        for (value, dst) in stores {
            if value.sizes[..] == [outer.clone(), rows.inner.clone()].concat()[..] {
                full.push((value.node.clone(), dst.clone()));
            } else if value.sizes.starts_with(&outer) && value.sizes[k..].iter().all(|s| *s == 1) {
                per_row.push((value.node.clone(), dst.clone()));
            } else {
                return Err(NOT_ROWS.into());
            }
        }
        let mut dtypes = Vec::new();
        let mut memory = Vec::new();
        for (_, n) in &rows.passes {
            n.dtypes(&mut dtypes);
            memory.extend(memory_dtypes(n));
        }
        for (n, d) in full.iter().chain(&per_row) {
            n.dtypes(&mut dtypes);
            dtypes.push(d.dtype);
            memory.extend(memory_dtypes(n));
        }
        memory.extend(full.iter().map(|(_, d)| d.dtype));
        let inner_n = rows.inner.last().copied().unwrap_or(1);
        let dsts: Vec<&View> = full.iter().map(|(_, d)| d).collect();
        let rank = k + rows.inner.len();
        let vec = vector_width(inner_n, &memory, &dsts, rank);
        let name = self.kernel_name();
        let mut launch = row_source(&name, rows, &outer, &full, &per_row, vec, &dtypes, 1);
        if vec > 1 {
            launch.fallback = Some(Box::new(row_source(
                &name, rows, &outer, &full, &per_row, 1, &dtypes, 1,
            )));
        }
        Ok(launch)
    }
}
