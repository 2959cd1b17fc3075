//! CUDA C code generation for kernel segments: a fusion becomes a short list of generated
//! kernels over strided views of the segment's buffers.
//!
//! The generator follows the fusion interpreter (`interp`) op by op, but on *lazy values*:
//! a value is an expression over an index space (its sizes) whose leaves load from strided
//! views. View ops (set, broadcast, squeeze, permute, reshape) rewrite the leaves' strides and
//! move no data; pointwise ops build the expression. Sizes and strides are constants in the
//! source, so a source is specific to one chunk shape; sources are cached by their text
//! (chunks of a loop share one).
//!
//! Two plans, tried in order:
//!
//! * **Row kernels** (the persistent normalization pattern: softmax, LayerNorm, RMSNorm, a
//!   row sum). When every reduction of the fusion reduces the innermost axes of values that
//!   share their outer axes (the *rows*), and every output is a row or one value per row,
//!   the whole fusion is one kernel: a block per row computes each reduction in turn (a
//!   strided pass over the row, then a warp-shuffle block reduction; later passes may use
//!   earlier results, [`Node::Row`]) and finally writes the outputs. The row is read once
//!   from DRAM; later passes find it in L1/L2.
//! * **Kernel by kernel** otherwise: a reduction, an operand that must be broadcast after
//!   computation, or a view a stride rewrite cannot express materializes its value into a
//!   temporary with its own kernel; each output is finally materialized into its buffer.
//!   Reductions over the innermost axes run as row kernels of one pass; reductions over the
//!   outermost axes give each thread a column and split the rows over blocks (partial sums,
//!   then one more pass); other reductions loop per output element.
//!
//! Pointwise kernels and the passes of row kernels move `V` elements per access (16 bytes when
//! the types allow; a pointwise thread takes 4 such vectors per iteration), with a scalar
//! fallback kernel for buffers that are not aligned to the vector (see [`Launch::align`]);
//! they index in 32 bits where every offset fits and size their grid from the device's SM
//! count at launch. A row kernel whose row splits evenly over its block keeps each thread's
//! vectors in registers from the first pass to the last, so the row is read once.
//!
//! Arithmetic runs in `float` (or `double` when an f64 or i64 tensor is involved); bf16 and
//! f16 are loaded and stored through PTX conversions (round to nearest even), so no header
//! is needed. Kernels whose results are all stored in 16 bits use `__expf`, `__fdividef` and
//! the hardware `tanh.approx`, whose errors are below a 16-bit rounding. A `cast` rounds to
//! its type in place, as the interpreter does.

pub use super::expr::{Buf, Node, View};

use std::fmt::Write as _;

use weave_ir::{DType, ExprKind, Fusion, ReduceOp};

use super::emit::{self, decompose, Emitter, Width, PRELUDE};
use crate::interp::{broadcast_shapes, reshape_sizes};

/// How a segment's buffer is laid out: element type, sizes and element strides.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorArg {
    /// Element type.
    pub dtype: DType,
    /// Sizes.
    pub sizes: Vec<usize>,
    /// Element strides, one per axis.
    pub strides: Vec<usize>,
}

/// The most waves of blocks a grid-stride loop is launched with. The hardware starts a block
/// as another finishes, so many short-lived blocks leave a short tail, which one wave of
/// long-lived blocks, each looping over its share, did not: at 16384 × 8192 on an H100, one
/// wave ran softmax at 86% of memcpy, and LayerNorm, SiLU and add 4–9% slower than 16 waves
/// (docs/benchmarks.md). Beyond 16 waves every block still loops, which keeps very large
/// grids of tiny blocks from paying a block's start-up per element.
pub const GRID_WAVES: usize = 16;

/// How a kernel is launched: its grid, from the device's SM count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grid {
    /// A grid-stride loop over `n` work items, one per thread, blocks of `block` threads.
    Items {
        /// Work items.
        n: usize,
        /// Threads per block.
        block: u32,
    },
    /// A grid-stride loop over `rows` rows, one block of `block` threads per row.
    Rows {
        /// Rows.
        rows: usize,
        /// Threads per block.
        block: u32,
    },
    /// Exactly `blocks` blocks of `block` threads.
    Blocks {
        /// Blocks.
        blocks: usize,
        /// Threads per block.
        block: u32,
    },
}

impl Grid {
    /// `(blocks, threads per block)` on a device of `sms` SMs; `None` when there is no work.
    ///
    /// A grid-stride loop gets as many blocks as its work has, up to [`GRID_WAVES`] waves of
    /// them (a wave: every SM full at 2048 threads).
    pub fn dims(&self, sms: usize) -> Option<(u32, u32)> {
        let cap = |block: u32| GRID_WAVES * sms.max(1) * (2048 / block.max(32) as usize).max(1);
        let (blocks, block) = match *self {
            Grid::Items { n, block } => (n.div_ceil(block as usize).min(cap(block)), block),
            Grid::Rows { rows, block } => (rows.min(cap(block)), block),
            Grid::Blocks { blocks, block } => (blocks, block),
        };
        (blocks > 0).then(|| (blocks.min(u32::MAX as usize) as u32, block))
    }
}

/// One generated kernel.
#[derive(Clone, Debug)]
pub struct Launch {
    /// The kernel's name in `source`.
    pub name: String,
    /// CUDA C source.
    pub source: String,
    /// Its grid.
    pub grid: Grid,
    /// The kernel's parameters: the base address of each buffer, in order.
    pub args: Vec<Buf>,
    /// `(parameter, bytes)`: the alignment each vector access assumes of a parameter's
    /// address; when an address misses one, [`Launch::fallback`] runs instead.
    pub align: Vec<(usize, usize)>,
    /// The same kernel one element per iteration (no alignment needed).
    pub fallback: Option<Box<Launch>>,
}

impl Launch {
    /// The kernel to run for buffers at `addresses` (one per parameter): this one, or its
    /// fallback when an address is not aligned for the vector accesses.
    pub fn for_addresses(&self, addresses: &[u64]) -> &Launch {
        let aligned = self
            .align
            .iter()
            .all(|(k, bytes)| addresses.get(*k).is_some_and(|a| a % *bytes as u64 == 0));
        match (&self.fallback, aligned) {
            (Some(f), false) => f,
            _ => self,
        }
    }
}

/// What running a segment takes: temporaries to allocate, then kernels in order.
#[derive(Clone, Debug, Default)]
pub struct KernelPlan {
    /// Element type and element count of each temporary (contiguous).
    pub temps: Vec<(DType, usize)>,
    /// The kernels, in launch order.
    pub launches: Vec<Launch>,
}

#[derive(Clone, Debug)]
struct Lazy {
    dtype: DType,
    sizes: Vec<usize>,
    node: Node,
}

impl Node {
    /// Rewrites every leaf with `f`; `None` when some leaf cannot be rewritten.
    fn map_loads(&self, f: &dyn Fn(&View) -> Option<View>) -> Option<Node> {
        Some(match self {
            Node::Load(v) => Node::Load(f(v)?),
            Node::Row(k) => Node::Row(*k),
            Node::Lit(v) => Node::Lit(*v),
            Node::Index(v) => Node::Index(f(v)?),
            Node::Cast(d, x) => Node::Cast(*d, Box::new(x.map_loads(f)?)),
            Node::Unary(u, x) => Node::Unary(*u, Box::new(x.map_loads(f)?)),
            Node::Binary(b, x, y) => {
                Node::Binary(*b, Box::new(x.map_loads(f)?), Box::new(y.map_loads(f)?))
            }
            Node::Where(c, x, y) => Node::Where(
                Box::new(c.map_loads(f)?),
                Box::new(x.map_loads(f)?),
                Box::new(y.map_loads(f)?),
            ),
            Node::Gather {
                table,
                row_stride,
                rows,
                base,
                ids,
            } => Node::Gather {
                table: f(table)?,
                row_stride: *row_stride,
                rows: *rows,
                base: *base,
                ids: Box::new(ids.map_loads(f)?),
            },
        })
    }

    fn is_load(&self) -> bool {
        matches!(self, Node::Load(_))
    }

    fn dtypes(&self, out: &mut Vec<DType>) {
        match self {
            Node::Load(v) => out.push(v.dtype),
            Node::Row(_) | Node::Lit(_) => {}
            Node::Index(_) => out.push(DType::I64),
            Node::Cast(d, x) => {
                out.push(*d);
                x.dtypes(out)
            }
            Node::Unary(_, x) => x.dtypes(out),
            Node::Binary(_, x, y) => {
                x.dtypes(out);
                y.dtypes(out)
            }
            Node::Where(c, x, y) => {
                c.dtypes(out);
                x.dtypes(out);
                y.dtypes(out)
            }
            Node::Gather { table, ids, .. } => {
                out.push(table.dtype);
                ids.dtypes(out)
            }
        }
    }
}

fn contiguous_strides(sizes: &[usize]) -> Vec<isize> {
    let mut s = vec![1isize; sizes.len()];
    for a in (0..sizes.len().saturating_sub(1)).rev() {
        s[a] = s[a + 1] * sizes[a + 1] as isize;
    }
    s
}

fn numel(sizes: &[usize]) -> usize {
    sizes.iter().product()
}

/// The view `v` seen with `out` sizes: trailing axes aligned, size-1 and missing axes
/// broadcast (stride 0).
fn expand(v: &View, out: &[usize]) -> Option<View> {
    if v.sizes.len() > out.len() {
        return None;
    }
    let lead = out.len() - v.sizes.len();
    let mut strides = vec![0isize; out.len()];
    for (k, (&s, &st)) in v.sizes.iter().zip(&v.strides).enumerate() {
        let o = out[lead + k];
        if s == o {
            strides[lead + k] = st;
        } else if s != 1 {
            return None;
        }
    }
    Some(View {
        sizes: out.to_vec(),
        strides,
        ..v.clone()
    })
}

/// The view `v` reshaped to `to` (same element count) without moving data, when its strides
/// allow it.
fn reshape_view(v: &View, to: &[usize]) -> Option<View> {
    // Drop size-1 axes, then walk both shapes grouping axes with equal products.
    let (sizes, strides): (Vec<usize>, Vec<isize>) = v
        .sizes
        .iter()
        .zip(&v.strides)
        .filter(|(s, _)| **s != 1)
        .map(|(s, t)| (*s, *t))
        .unzip();
    let mut out_strides = vec![0isize; to.len()];
    let (mut i, mut j) = (0usize, 0usize);
    while j < to.len() {
        if to[j] == 1 {
            j += 1;
            continue;
        }
        if i >= sizes.len() {
            return None;
        }
        // A group: input axes i..i2 and output axes j..j2 with equal products.
        let (mut pi, mut pj) = (sizes[i], to[j]);
        let (mut i2, mut j2) = (i + 1, j + 1);
        while pi != pj {
            if pi < pj {
                pi *= *sizes.get(i2)?;
                i2 += 1;
            } else {
                pj *= *to.get(j2)?;
                j2 += 1;
            }
        }
        // The input group must be contiguous in itself.
        for k in i..i2 - 1 {
            if strides[k] != strides[k + 1] * sizes[k + 1] as isize {
                return None;
            }
        }
        let mut st = strides[i2 - 1];
        for k in (j..j2).rev() {
            out_strides[k] = st;
            st *= to[k] as isize;
        }
        i = i2;
        j = j2;
    }
    if i != sizes.len() {
        return None;
    }
    Some(View {
        sizes: to.to_vec(),
        strides: out_strides,
        ..v.clone()
    })
}

impl Node {
    /// Every view the expression loads.
    fn loads<'a>(&'a self, out: &mut Vec<&'a View>) {
        match self {
            Node::Load(v) => out.push(v),
            Node::Row(_) | Node::Lit(_) | Node::Index(_) => {}
            Node::Cast(_, x) | Node::Unary(_, x) => x.loads(out),
            Node::Binary(_, x, y) => {
                x.loads(out);
                y.loads(out)
            }
            Node::Where(c, x, y) => {
                c.loads(out);
                x.loads(out);
                y.loads(out)
            }
            Node::Gather { table, ids, .. } => {
                out.push(table);
                ids.loads(out)
            }
        }
    }

    /// Whether the expression uses a row kernel's reduction.
    fn has_row(&self) -> bool {
        match self {
            Node::Load(_) | Node::Lit(_) | Node::Index(_) => false,
            Node::Row(_) => true,
            Node::Cast(_, x) | Node::Unary(_, x) => x.has_row(),
            Node::Binary(_, x, y) => x.has_row() || y.has_row(),
            Node::Where(c, x, y) => c.has_row() || x.has_row() || y.has_row(),
            Node::Gather { ids, .. } => ids.has_row(),
        }
    }
}

/// The rows of a row kernel and its reduction passes.
#[derive(Clone, Debug, Default)]
struct Rows {
    /// The outer sizes (one row per index), set by the first reduction.
    outer: Option<Vec<usize>>,
    /// The sizes of a row.
    inner: Vec<usize>,
    /// Each pass: its reduction and the expression it reduces over `outer ++ inner`.
    passes: Vec<(ReduceOp, Node)>,
}

/// Threads per block of pointwise kernels.
const BLOCK: u32 = 256;

/// Vectors a pointwise kernel's thread handles per iteration of its grid-stride loop (their
/// loads issued together: more bytes in flight per thread).
const UNROLL: usize = 4;

/// The widest vector width (elements) that `views` and `dsts` allow along an innermost axis
/// of `inner` elements: 16 bytes of the widest type, halved until it divides the axis and
/// every destination can be stored as vectors.
fn vector_width(inner: usize, dtypes: &[DType], dsts: &[&View], base_len: usize) -> usize {
    let widest = dtypes.iter().map(|d| emit::size_of(*d)).max().unwrap_or(1);
    let mut v = (16 / widest).max(1);
    while v > 1 {
        let probe = Emitter::new(
            "float",
            false,
            Width::Wide,
            v,
            vec![String::new(); base_len],
        );
        if inner.is_multiple_of(v) && dsts.iter().all(|d| probe.vectorizable(d)) {
            return v;
        }
        v /= 2;
    }
    1
}

struct Gen<'f> {
    fusion: &'f Fusion,
    name: String,
    plan: KernelPlan,
    sms: usize,
    /// `Some` while planning one row kernel for the whole fusion.
    rows: Option<Rows>,
}

/// Plans the kernels that compute `fusion` from buffers laid out as `inputs` into buffers laid
/// out as `outputs`, for a device of `sms` SMs. Errors name the op and what it cannot do.
pub fn plan(
    fusion: &Fusion,
    name: &str,
    inputs: &[TensorArg],
    outputs: &[TensorArg],
    sms: usize,
) -> Result<KernelPlan, String> {
    let declared = fusion.inputs();
    if inputs.len() != declared.len() || outputs.len() != fusion.outputs().len() {
        return Err(format!(
            "kernel `{name}` takes {} inputs and {} outputs, got {} and {}",
            declared.len(),
            fusion.outputs().len(),
            inputs.len(),
            outputs.len()
        ));
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
    g.run(inputs, outputs)?;
    Ok(g.plan)
}

/// A view of the buffer `a` with the value's `sizes`: equal except for size-1 axes.
fn output_view(buf: Buf, a: &TensorArg, sizes: &[usize]) -> Option<View> {
    let target: Vec<(usize, usize)> = a
        .sizes
        .iter()
        .zip(&a.strides)
        .filter(|(s, _)| **s != 1)
        .map(|(s, t)| (*s, *t))
        .collect();
    let mut it = target.iter();
    let mut strides = Vec::with_capacity(sizes.len());
    for &s in sizes {
        if s == 1 {
            strides.push(0);
        } else {
            let (ts, tt) = it.next()?;
            if *ts != s {
                return None;
            }
            strides.push(*tt as isize);
        }
    }
    if it.next().is_some() {
        return None;
    }
    Some(View {
        buf,
        dtype: a.dtype,
        offset: 0,
        sizes: sizes.to_vec(),
        strides,
    })
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

    fn op(
        &mut self,
        kind: &ExprKind,
        in_ids: &[weave_ir::TensorId],
        out_t: weave_ir::TensorId,
        dtype: DType,
        ins: Vec<Lazy>,
    ) -> Result<Lazy, String> {
        let x = ins.first().cloned().ok_or("no operand")?;
        Ok(match kind {
            ExprKind::Set | ExprKind::SegmentSet => x,
            ExprKind::Cast(d) => Lazy {
                dtype,
                sizes: x.sizes,
                node: Node::Cast(*d, Box::new(x.node)),
            },
            ExprKind::Unary(u) => Lazy {
                dtype,
                sizes: x.sizes,
                node: Node::Unary(*u, Box::new(x.node)),
            },
            ExprKind::BinaryLit { op, lit, lit_first } => {
                let (l, v) = (Box::new(Node::Lit(lit.0)), Box::new(x.node));
                let node = if *lit_first {
                    Node::Binary(*op, l, v)
                } else {
                    Node::Binary(*op, v, l)
                };
                Lazy {
                    dtype,
                    sizes: x.sizes,
                    node,
                }
            }
            ExprKind::WhereLit { a, b } => {
                let shapes: Vec<&[usize]> = ins.iter().map(|l| l.sizes.as_slice()).collect();
                let sizes = broadcast_shapes(&shapes)?;
                let mut nodes = Vec::new();
                for l in ins {
                    nodes.push(self.broadcast(l, &sizes)?);
                }
                let [c, v] = <[Node; 2]>::try_from(nodes)
                    .map_err(|n| format!("expected a condition and a tensor, got {}", n.len()))?;
                let pick = |lit: &Option<weave_ir::Literal>| match lit {
                    Some(l) => Box::new(Node::Lit(l.0)),
                    None => Box::new(v.clone()),
                };
                let node = Node::Where(Box::new(c.clone()), pick(a), pick(b));
                Lazy { dtype, sizes, node }
            }
            ExprKind::Binary(_) | ExprKind::Where => {
                let shapes: Vec<&[usize]> = ins.iter().map(|l| l.sizes.as_slice()).collect();
                let sizes = broadcast_shapes(&shapes)?;
                let mut nodes = Vec::new();
                for l in ins {
                    nodes.push(self.broadcast(l, &sizes)?);
                }
                let node = match (kind, nodes.as_slice()) {
                    (ExprKind::Binary(b), [a, c]) => {
                        Node::Binary(*b, Box::new(a.clone()), Box::new(c.clone()))
                    }
                    (ExprKind::Where, [c, a, b]) => Node::Where(
                        Box::new(c.clone()),
                        Box::new(a.clone()),
                        Box::new(b.clone()),
                    ),
                    _ => return Err(format!("expected its operands, got {}", nodes.len())),
                };
                Lazy { dtype, sizes, node }
            }
            ExprKind::Reduction { op, axes } => {
                if self.rows.is_some() {
                    self.row_pass(&x, *op, axes, dtype)?
                } else {
                    self.reduce(&x, *op, axes, dtype)?
                }
            }
            ExprKind::Broadcast { axes } => {
                let rank = x.sizes.len() + axes.len();
                let mut sizes = Vec::with_capacity(rank);
                let mut src = x.sizes.iter();
                for k in 0..rank {
                    sizes.push(if axes.contains(&k) {
                        1
                    } else {
                        *src.next().unwrap_or(&1)
                    });
                }
                self.reshape(x, sizes)?
            }
            ExprKind::Squeeze { axes } => {
                let sizes = (0..x.sizes.len())
                    .filter(|k| !axes.contains(k))
                    .map(|k| x.sizes[k])
                    .collect();
                self.reshape(x, sizes)?
            }
            ExprKind::Permute { perm } => {
                if perm.len() != x.sizes.len() || perm.iter().any(|p| *p >= perm.len()) {
                    return Err(format!("permutation {perm:?} of sizes {:?}", x.sizes));
                }
                if x.node.has_row() {
                    let k = self.outer_rank();
                    if perm.iter().take(k).enumerate().any(|(a, p)| a != *p) {
                        return Err(NOT_ROWS.into());
                    }
                }
                let f = |v: &View| {
                    Some(View {
                        sizes: perm.iter().map(|p| v.sizes[*p]).collect(),
                        strides: perm.iter().map(|p| v.strides[*p]).collect(),
                        ..v.clone()
                    })
                };
                let sizes = perm.iter().map(|p| x.sizes[*p]).collect();
                let node = x.node.map_loads(&f).ok_or("cannot permute")?;
                Lazy {
                    dtype: x.dtype,
                    sizes,
                    node,
                }
            }
            ExprKind::Reshape { shape } => {
                let sizes = reshape_sizes(self.fusion, in_ids[0], out_t, shape, &x.sizes)?;
                self.reshape(x, sizes)?
            }
            ExprKind::Iota { axis } => {
                self.whole_axis(kind, in_ids[0], *axis, &x.sizes)?;
                let mut strides = vec![0; x.sizes.len()];
                strides[*axis] = 1;
                let v = View {
                    buf: Buf::Input(0),
                    dtype: DType::I64,
                    offset: 0,
                    sizes: x.sizes.clone(),
                    strides,
                };
                Lazy {
                    dtype,
                    sizes: x.sizes,
                    node: Node::Index(v),
                }
            }
            ExprKind::Slice { axis, start, stop } => {
                self.whole_axis(kind, in_ids[0], *axis, &x.sizes)?;
                if x.node.has_row() {
                    return Err(NOT_ROWS.into());
                }
                let bound = |s: &weave_ir::Scalar| {
                    self.fusion
                        .eval(s)
                        .and_then(|v| usize::try_from(v).ok())
                        .ok_or_else(|| format!("slice bound `{}` has no value", s.to_source()))
                };
                let (b, e) = (bound(start)?, bound(stop)?);
                if b > e || e > x.sizes[*axis] {
                    return Err(format!(
                        "slice {b}..{e} of axis {axis} of sizes {:?}",
                        x.sizes
                    ));
                }
                let (a, len) = (*axis, e - b);
                let f = |v: &View| {
                    let mut sizes = v.sizes.clone();
                    sizes[a] = len;
                    Some(View {
                        offset: v.offset + b as isize * v.strides[a],
                        sizes,
                        ..v.clone()
                    })
                };
                let mut sizes = x.sizes.clone();
                sizes[a] = len;
                let node = x.node.map_loads(&f).ok_or("cannot slice")?;
                Lazy {
                    dtype: x.dtype,
                    sizes,
                    node,
                }
            }
            ExprKind::Concat { axis } => {
                let y = ins.get(1).cloned().ok_or("concat takes two operands")?;
                self.whole_axis(kind, in_ids[0], *axis, &x.sizes)?;
                self.whole_axis(kind, in_ids[1], *axis, &y.sizes)?;
                let a = *axis;
                let mut sizes = x.sizes.clone();
                sizes[a] += y.sizes[a];
                // Two stores into one temporary: `x` into its first part, `y` after it.
                if self.rows.is_some() {
                    return Err(NOT_ROWS.into());
                }
                let t = self.new_temp(dtype, &sizes);
                let part = |n: usize, at: usize| {
                    let mut s = t.sizes.clone();
                    s[a] = n;
                    View {
                        offset: at as isize * t.strides[a],
                        sizes: s,
                        ..t.clone()
                    }
                };
                let (first, second) = (part(x.sizes[a], 0), part(y.sizes[a], x.sizes[a]));
                self.store(&x, &first);
                self.store(&y, &second);
                Lazy {
                    dtype,
                    sizes,
                    node: Node::Load(t),
                }
            }
            ExprKind::IndexSelect { axis, base } => {
                let ids = ins
                    .get(1)
                    .cloned()
                    .ok_or("index_select takes a table and ids")?;
                let a = *axis;
                if a >= x.sizes.len() || ids.sizes.len() != 1 {
                    return Err(format!(
                        "index_select along axis {a} of sizes {:?} by ids of sizes {:?}",
                        x.sizes, ids.sizes
                    ));
                }
                let first = match base {
                    None => {
                        self.whole_axis(kind, in_ids[0], a, &x.sizes)?;
                        0
                    }
                    Some(b) => self.fusion.eval(b).ok_or_else(|| {
                        format!(
                            "index_select: the first row `{}` of this device's block has no value (a vocabulary-parallel lookup's partial runs on a device, which gives `rank` its value)",
                            b.to_source()
                        )
                    })?,
                };
                if x.node.has_row() || ids.node.has_row() {
                    return Err(NOT_ROWS.into());
                }
                let mut sizes = x.sizes.clone();
                sizes[a] = ids.sizes[0];
                // The table as a view of a buffer (a temporary when it is computed).
                let table = match &x.node {
                    Node::Load(v) => v.clone(),
                    _ => match self.materialize(&x)?.node {
                        Node::Load(v) => v,
                        _ => return Err("a temporary is a load".into()),
                    },
                };
                let (rows, row_stride) = (table.sizes[a], table.strides[a]);
                let mut strides = table.strides.clone();
                strides[a] = 0;
                let table = View {
                    sizes: sizes.clone(),
                    strides,
                    ..table
                };
                // The ids along the result's axis `a`, constant along the others.
                let along = |v: &View| {
                    let mut strides = vec![0isize; sizes.len()];
                    strides[a] = *v.strides.first()?;
                    Some(View {
                        sizes: sizes.clone(),
                        strides,
                        ..v.clone()
                    })
                };
                let ids = match ids.node.map_loads(&along) {
                    Some(n) => n,
                    None => self
                        .materialize(&ids)?
                        .node
                        .map_loads(&along)
                        .ok_or("the ids do not index the result")?,
                };
                Lazy {
                    dtype: x.dtype,
                    sizes,
                    node: Node::Gather {
                        table,
                        row_stride,
                        rows,
                        base: first,
                        ids: Box::new(ids),
                    },
                }
            }
            ExprKind::Matmul | ExprKind::Linear => {
                return Err(
                    "a GEMM inside a kernel segment is not supported by the code generator \
                     (GEMMs run as their own host statements)"
                        .into(),
                )
            }
        })
    }

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

    fn reduce(
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

impl Node {
    /// Whether the expression loads anything.
    fn loads_any(&self) -> bool {
        let mut v = Vec::new();
        self.loads(&mut v);
        !v.is_empty()
    }
}

/// A pointwise kernel writing `x` into `dst`, `vec` elements per thread.
fn pointwise(name: &str, x: &Lazy, dst: &View, vec: usize) -> Launch {
    let mut views = Vec::new();
    x.node.loads(&mut views);
    views.push(dst);
    let n = numel(&x.sizes);
    let width = Width::for_views(n, views.iter().copied());
    let ct = compute_type(&x.node, Some(dst.dtype));
    let fast = matches!(dst.dtype, DType::BF16 | DType::F16);
    let (index, base) = decompose(width, "q", "i", &x.sizes, vec);
    let mut e = Emitter::new(ct, fast, width, vec, base);
    let v = e.expr(&x.node);
    let after = e.store(dst, &v);
    let ty = width.ty();
    let nq = n / vec.max(1);
    let mut s = String::from(PRELUDE);
    let _ = writeln!(s, "{} {{", e.signature(name));
    let _ = writeln!(
        s,
        "  const {ty} stride = ({ty})gridDim.x * blockDim.x;\n  \
         for ({ty} q0 = ({ty})blockIdx.x * blockDim.x + threadIdx.x; q0 < {nq}; \
         q0 += stride * {u}) {{\n    #pragma unroll\n    for (int u = 0; u < {UNROLL}; ++u) {{\n      \
         const {ty} q = q0 + u * stride;\n      if (q >= {nq}) break;",
        nq = width.lit(nq as i64),
        u = width.lit(UNROLL as i64),
    );
    for l in &index {
        let _ = writeln!(s, "      {l}");
    }
    s.push_str(&e.element_loop("      "));
    for l in &after {
        let _ = writeln!(s, "      {l}");
    }
    s.push_str("    }\n  }\n}\n");
    Launch {
        name: name.to_string(),
        source: s,
        grid: Grid::Items {
            n: nq.div_ceil(UNROLL),
            block: BLOCK,
        },
        args: e.bufs,
        align: e.align,
        fallback: None,
    }
}

/// The row kernel of `rows` (see [`Gen::row_kernel`]), `vec` elements per thread. With
/// `splits > 1` (one pass, no whole-row outputs), each row is cut into `splits` parts reduced
/// by different blocks: a per-row output then has one more axis, the part (partials).
#[allow(clippy::too_many_arguments)]
fn row_source(
    name: &str,
    rows: &Rows,
    outer: &[usize],
    full: &[(Node, View)],
    per_row: &[(Node, View)],
    vec: usize,
    dtypes: &[DType],
    splits: usize,
) -> Launch {
    let k = outer.len();
    let splits = splits.max(1);
    let nrows = numel(outer);
    let inner_numel = numel(&rows.inner);
    let mut views: Vec<&View> = Vec::new();
    for (_, n) in &rows.passes {
        n.loads(&mut views);
    }
    for (n, d) in full.iter().chain(per_row) {
        n.loads(&mut views);
        views.push(d);
    }
    let width = Width::for_views(nrows.saturating_mul(inner_numel), views.iter().copied());
    let ct = if dtypes.iter().any(|d| matches!(d, DType::F64 | DType::I64)) {
        "double"
    } else {
        "float"
    };
    let fast = ct == "float"
        && !full.is_empty()
        && full
            .iter()
            .chain(per_row)
            .all(|(_, d)| matches!(d.dtype, DType::BF16 | DType::F16));
    let ty = width.ty();
    let nv = inner_numel / vec.max(1);
    // Rows whose vectors split evenly over a block, a few per thread: each thread keeps its
    // vectors in registers from the first pass to the last (one read of the row in all).
    let persist = if splits == 1 && rows.passes.len() + usize::from(!full.is_empty()) > 1 {
        [256usize, 512, 128, 64]
            .into_iter()
            .find(|b| nv.is_multiple_of(*b) && nv / b <= 8)
            .map(|b| (b, nv / b))
    } else {
        None
    };
    let block = match persist {
        Some((b, _)) => b as u32,
        None => (nv.next_power_of_two()).clamp(32, 256) as u32,
    };
    let (row_index, outer_names) = if splits > 1 {
        let (mut lines, names) = decompose(width, "rrow", "o", outer, 1);
        let s = width.lit(splits as i64);
        lines.insert(
            0,
            format!("const {ty} part = row % {s}; const {ty} rrow = row / {s};"),
        );
        (lines, names)
    } else {
        decompose(width, "row", "o", outer, 1)
    };
    let (inner_index, inner_names) = decompose(width, "cv", "i", &rows.inner, vec);
    let base: Vec<String> = outer_names.iter().chain(&inner_names).cloned().collect();
    // Persisted loads need constant indices: the vectors of a thread are unrolled fully.
    let unroll = if persist.is_some() {
        "#pragma unroll"
    } else {
        "#pragma unroll 4"
    };
    let mut e = Emitter::new(ct, fast, width, vec, base.clone());
    if let Some((_, its)) = persist {
        e.persist(its);
    }
    let mut body = String::new();
    let w = |body: &mut String, indent: &str, l: &str| {
        let _ = writeln!(body, "{indent}{l}");
    };
    let row_loop = if let Some((b, its)) = persist {
        format!(
            "for (int it = 0; it < {its}; ++it) {{ const {ty} cv = threadIdx.x + ({ty})it * {};",
            width.lit(b as i64)
        )
    } else if splits > 1 {
        let per = nv.div_ceil(splits);
        format!(
            "for ({ty} cv = part * {per} + threadIdx.x; cv < part * {per} + {per} && cv < {nv}; \
             cv += blockDim.x) {{",
            per = width.lit(per as i64),
            nv = width.lit(nv as i64)
        )
    } else {
        format!(
            "for ({ty} cv = threadIdx.x; cv < {}; cv += blockDim.x) {{",
            width.lit(nv as i64)
        )
    };
    for (p, (op, node)) in rows.passes.iter().enumerate() {
        e.reset(base.clone());
        let v = e.expr(node);
        e.accumulate("acc", *op, &v);
        w(&mut body, "    ", &format!("{ct} r{p};"));
        w(&mut body, "    ", "{");
        w(&mut body, "      ", &format!("{ct} acc = {};", e.init(*op)));
        w(&mut body, "      ", unroll);
        w(&mut body, "      ", &row_loop);
        for l in &inner_index {
            w(&mut body, "        ", l);
        }
        body.push_str(&e.element_loop("        "));
        w(&mut body, "      ", "}");
        let f = match op {
            ReduceOp::Sum => "WeaveSum()",
            ReduceOp::Max => "WeaveMax()",
            ReduceOp::Min => "WeaveMin()",
        };
        w(
            &mut body,
            "      ",
            &format!("r{p} = weave_block_reduce(acc, weave_smem, {f});"),
        );
        w(&mut body, "    ", "}");
    }
    if !full.is_empty() {
        w(&mut body, "    ", unroll);
        e.reset(base.clone());
        let mut after = Vec::new();
        for (node, dst) in full {
            let v = e.expr(node);
            after.extend(e.store(dst, &v));
        }
        w(&mut body, "    ", &row_loop);
        for l in &inner_index {
            w(&mut body, "      ", l);
        }
        body.push_str(&e.element_loop("      "));
        for l in &after {
            w(&mut body, "      ", l);
        }
        w(&mut body, "    ", "}");
    }
    if !per_row.is_empty() {
        let vec_saved = e.vec;
        e.vec = 1;
        let last = if splits > 1 { "part" } else { "0" };
        let names: Vec<String> = outer_names
            .iter()
            .cloned()
            .chain(std::iter::once(last.to_string()))
            .chain(std::iter::repeat("0".to_string()))
            .take(
                per_row
                    .iter()
                    .map(|(_, d)| d.sizes.len())
                    .max()
                    .unwrap_or(k),
            )
            .collect();
        e.reset(names);
        for (node, dst) in per_row {
            let v = e.expr(node);
            e.store(dst, &v);
        }
        w(&mut body, "    ", "if (threadIdx.x == 0) {");
        body.push_str(&e.element_loop("      "));
        w(&mut body, "    ", "}");
        e.vec = vec_saved;
    }
    let mut s = String::from(PRELUDE);
    let _ = writeln!(s, "{} {{", e.signature(name));
    let _ = writeln!(s, "  __shared__ {ct} weave_smem[32];");
    for d in &e.decls {
        let _ = writeln!(s, "  {d}");
    }
    let _ = writeln!(
        s,
        "  for ({ty} row = blockIdx.x; row < {}; row += gridDim.x) {{",
        width.lit((nrows * splits) as i64)
    );
    for l in &row_index {
        let _ = writeln!(s, "    {l}");
    }
    s.push_str(&body);
    s.push_str("  }\n}\n");
    Launch {
        name: name.to_string(),
        source: s,
        grid: Grid::Rows {
            rows: nrows * splits,
            block,
        },
        args: e.bufs,
        align: e.align,
        fallback: None,
    }
}

/// Threads that reduce one column (kept element) of a column reduction together, each a warp
/// of a block, combined in shared memory: a block is [`COLUMNS_PER_BLOCK`] columns by
/// `COLUMN_LANES` lanes. Eight lanes keep eight times as many loads in flight as a thread
/// per column, so that few columns (a stream chunk of them, the partials' second pass) still
/// stream at bandwidth.
const COLUMN_LANES: usize = BLOCK as usize / COLUMNS_PER_BLOCK;

/// Columns of a column-reduction block: a warp, so that each lane's loads of a row are one
/// contiguous access.
const COLUMNS_PER_BLOCK: usize = 32;

/// The reduction of `node` (over `red ++ kept` sizes) over its outermost `red` axes: a block
/// per [`COLUMNS_PER_BLOCK`] kept elements (columns) and part of the reduced elements, each
/// warp of it (a lane) taking every `COLUMN_LANES`-th reduced element of the part, the lanes
/// combined in shared memory in lane order (a fixed order: the same sums every run). The
/// reduced elements are split into `splits` parts; part `p` goes to `dst` offset by `p` times
/// the kept elements (partials) when `splits > 1`.
fn column_source(
    name: &str,
    node: &Node,
    red: &[usize],
    kept: &[usize],
    op: ReduceOp,
    dst: &View,
    splits: usize,
) -> Launch {
    let m = numel(kept);
    let nr = numel(red);
    let chunk = nr.div_ceil(splits.max(1));
    let xb = m.div_ceil(COLUMNS_PER_BLOCK);
    let mut views = Vec::new();
    node.loads(&mut views);
    let partials = View {
        sizes: [vec![splits], kept.to_vec()].concat(),
        strides: [vec![m as isize], dst.strides.clone()].concat(),
        ..dst.clone()
    };
    views.push(&partials);
    let width = Width::for_views(nr.saturating_mul(m), views.iter().copied());
    let ct = compute_type(node, Some(dst.dtype));
    let ty = width.ty();
    let (red_index, red_names) = decompose(width, "r", "x", red, 1);
    let (kept_index, kept_names) = decompose(width, "m", "k", kept, 1);
    let base: Vec<String> = red_names.iter().chain(&kept_names).cloned().collect();
    let mut e = Emitter::new(ct, false, width, 1, base);
    let v = e.expr(node);
    e.accumulate("acc", op, &v);
    // The result (or this part's partial) for column m.
    let mut st = Emitter::new(
        ct,
        false,
        width,
        1,
        std::iter::once("part".to_string())
            .chain(kept_names)
            .collect(),
    );
    st.adopt(&e);
    st.store(&partials, "acc");
    let mut s = String::from(PRELUDE);
    let _ = writeln!(s, "{} {{", st.signature(name));
    let lit = |n: usize| width.lit(n as i64);
    let (cols, lanes) = (COLUMNS_PER_BLOCK, COLUMN_LANES);
    let _ = writeln!(
        s,
        "  const {ty} m = ({ty})(blockIdx.x % {}) * {} + (threadIdx.x % {cols}u);",
        lit(xb),
        lit(cols)
    );
    let _ = writeln!(s, "  const {ty} lane = ({ty})(threadIdx.x / {cols}u);");
    let _ = writeln!(s, "  const {ty} part = ({ty})(blockIdx.x / {});", lit(xb));
    // Index math of a column past the end is harmless: nothing is loaded or stored there.
    for l in &kept_index {
        let _ = writeln!(s, "  {l}");
    }
    let _ = writeln!(s, "  {ct} acc = {};", e.init(op));
    let _ = writeln!(s, "  const {ty} r0 = part * {};", lit(chunk));
    let _ = writeln!(
        s,
        "  const {ty} r1 = r0 + {c} < {nr} ? r0 + {c} : {nr};",
        c = lit(chunk),
        nr = lit(nr)
    );
    let _ = writeln!(s, "  if (m < {}) {{", lit(m));
    let _ = writeln!(s, "  #pragma unroll 4");
    let _ = writeln!(
        s,
        "  for ({ty} r = r0 + lane; r < r1; r += {}) {{",
        lit(lanes)
    );
    for l in &red_index {
        let _ = writeln!(s, "    {l}");
    }
    s.push_str(&e.element_loop("    "));
    let _ = writeln!(s, "  }}");
    let _ = writeln!(s, "  }}");
    let _ = writeln!(s, "  __shared__ {ct} lanes_acc[{lanes}][{cols}];");
    let _ = writeln!(s, "  lanes_acc[lane][threadIdx.x % {cols}u] = acc;");
    let _ = writeln!(s, "  __syncthreads();");
    let _ = writeln!(s, "  if (lane != 0 || m >= {}) return;", lit(m));
    let combine = match op {
        ReduceOp::Sum => "WeaveSum()",
        ReduceOp::Max => "WeaveMax()",
        ReduceOp::Min => "WeaveMin()",
    };
    let _ = writeln!(
        s,
        "  for (int l = 1; l < {lanes}; ++l) acc = {combine}(acc, lanes_acc[l][threadIdx.x % {cols}u]);"
    );
    for l in &st.lines {
        let _ = writeln!(s, "  {l}");
    }
    s.push_str("}\n");
    Launch {
        name: name.to_string(),
        source: s,
        grid: Grid::Blocks {
            blocks: xb * splits.max(1),
            block: BLOCK,
        },
        args: st.bufs,
        align: Vec::new(),
        fallback: None,
    }
}

/// A reduction over any axes: a thread per output element, looping over the reduced ones.
fn serial_reduce(
    name: &str,
    x: &Lazy,
    op: ReduceOp,
    kept: &[usize],
    reduced: &[usize],
    out_sizes: &[usize],
    dst: &View,
) -> Launch {
    let rank = x.sizes.len();
    let red_sizes: Vec<usize> = reduced.iter().map(|a| x.sizes[*a]).collect();
    let n = numel(out_sizes);
    let red_n = numel(&red_sizes);
    let mut views = Vec::new();
    x.node.loads(&mut views);
    views.push(dst);
    let width = Width::for_views(n.saturating_mul(red_n.max(1)), views.iter().copied());
    let ct = compute_type(&x.node, Some(dst.dtype));
    let ty = width.ty();
    let (out_index, out_names) = decompose(width, "q", "o", out_sizes, 1);
    let (red_index, red_names) = decompose(width, "r", "x", &red_sizes, 1);
    let mut base = vec![String::new(); rank];
    for (k, a) in kept.iter().enumerate() {
        base[*a] = out_names[k].clone();
    }
    for (k, a) in reduced.iter().enumerate() {
        base[*a] = red_names[k].clone();
    }
    let mut e = Emitter::new(ct, false, width, 1, base);
    let v = e.expr(&x.node);
    e.accumulate("acc", op, &v);
    let mut st = Emitter::new(ct, false, width, 1, out_names);
    st.adopt(&e);
    st.store(dst, "acc");
    let lit = |n: usize| width.lit(n as i64);
    let mut s = String::from(PRELUDE);
    let _ = writeln!(s, "{} {{", st.signature(name));
    let _ = writeln!(
        s,
        "  for ({ty} q = ({ty})blockIdx.x * blockDim.x + threadIdx.x; q < {}; \
         q += ({ty})gridDim.x * blockDim.x) {{",
        lit(n)
    );
    for l in &out_index {
        let _ = writeln!(s, "    {l}");
    }
    let _ = writeln!(s, "    {ct} acc = {};", e.init(op));
    let _ = writeln!(s, "    for ({ty} r = 0; r < {}; ++r) {{", lit(red_n));
    for l in &red_index {
        let _ = writeln!(s, "      {l}");
    }
    // `st` took over `e`'s parameters in order, so the element loop's `p{k}` stay right.
    s.push_str(&e.element_loop("      "));
    let _ = writeln!(s, "    }}");
    for l in &st.lines {
        let _ = writeln!(s, "    {l}");
    }
    s.push_str("  }\n}\n");
    Launch {
        name: name.to_string(),
        source: s,
        grid: Grid::Items { n, block: BLOCK },
        args: st.bufs,
        align: Vec::new(),
        fallback: None,
    }
}

/// The element types `node` loads from memory.
fn memory_dtypes(node: &Node) -> Vec<DType> {
    let mut views = Vec::new();
    node.loads(&mut views);
    views.iter().map(|v| v.dtype).collect()
}

/// `double` when an f64 or i64 value is involved, else `float`.
fn compute_type(node: &Node, out: Option<DType>) -> &'static str {
    let mut ds = Vec::new();
    node.dtypes(&mut ds);
    ds.extend(out);
    if ds.iter().any(|d| matches!(d, DType::F64 | DType::I64)) {
        "double"
    } else {
        "float"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(sizes: &[usize], strides: &[isize]) -> View {
        View {
            buf: Buf::Input(0),
            dtype: DType::F32,
            offset: 0,
            sizes: sizes.to_vec(),
            strides: strides.to_vec(),
        }
    }

    fn contiguous(dtype: DType, sizes: &[usize]) -> TensorArg {
        TensorArg {
            dtype,
            sizes: sizes.to_vec(),
            strides: contiguous_strides(sizes)
                .iter()
                .map(|s| *s as usize)
                .collect(),
        }
    }

    /// Plans `body` (a fusion body over `t`, `h`) for contiguous buffers on 132 SMs.
    fn plan_of(body: &str, t: usize, h: usize) -> KernelPlan {
        let source = format!("fusion k(t = {t}, h = {h}) {{\n{body}\n}}\n");
        let fusion = weave_ir::text::parse(&source, &[]).expect("parses");
        let args = |ts: &[weave_ir::TensorId]| -> Vec<TensorArg> {
            ts.iter()
                .map(|t| {
                    let sizes: Vec<usize> = fusion
                        .visible_axes(*t)
                        .iter()
                        .map(|id| fusion.eval(&fusion.id(*id).extent).expect("a size") as usize)
                        .collect();
                    contiguous(fusion.tensor(*t).dtype, &sizes)
                })
                .collect()
        };
        let (ins, outs) = (args(fusion.inputs()), args(fusion.outputs()));
        plan(&fusion, "k", &ins, &outs, 132).expect("plans")
    }

    #[test]
    fn literals_erf_and_gelu_fuse_into_one_pointwise_kernel() {
        let p = plan_of(
            "tensor a: f32[t, h]\n tensor m: bool[t, h]\n y = a * 0.5 + 2\n g = gelu(y) - gelu_tanh(y)\n \
             e = erf(-g)\n z = where(m, e, -inf)\n output z",
            8,
            64,
        );
        assert_eq!(p.launches.len(), 1, "one fused kernel");
        let src = &p.launches[0].source;
        for want in [
            "(0.5f)",
            "(2.0f)",
            "erff(",
            "0.70710678118654752440",
            "0.044715",
            "(-__int_as_float(0x7f800000))",
        ] {
            assert!(src.contains(want), "`{want}` missing from:\n{src}");
        }
        // A double kernel (f64 values) writes double literals.
        let p = plan_of("tensor a: f64[t, h]\n y = 0.1 - a\n output y", 4, 4);
        assert!(
            p.launches[0].source.contains("double v1 = (0.1);"),
            "{}",
            p.launches[0].source
        );
    }

    #[test]
    fn min_and_two_pass_var_are_row_kernels_with_their_combiners() {
        let p = plan_of(
            "tensor x: f32[t, h]\n lo = min(x, [1])\n v = var(x, [1])\n output lo, v",
            64,
            512,
        );
        let src: String = p.launches.iter().map(|l| l.source.as_str()).collect();
        assert!(src.contains("WeaveMin()"), "{src}");
        // min starts from +inf; the two passes of var are two sums.
        assert!(src.contains("acc = __int_as_float(0x7f800000);"), "{src}");
        assert!(src.matches("WeaveSum()").count() >= 2, "{src}");
        assert!(src.contains("(512.0f)"), "{src}");
    }

    #[test]
    fn index_select_gathers_rows_and_reads_zero_outside_its_block() {
        // The whole table: ids in 0..t read their row; any other id reads zero (never out
        // of bounds): the load is guarded by the row's range.
        let p = plan_of(
            "tensor table: bf16[t, h]\n tensor ids: i64[h]\n e = index_select(table, ids, 0)\n \
             y = cast(e, f32)\n output y",
            16,
            8,
        );
        assert_eq!(p.launches.len(), 1, "{:#?}", p.launches);
        let src = &p.launches[0].source;
        assert!(src.contains("- 0LL;"), "{src}");
        assert!(
            src.contains(">= 0LL &&") && src.contains("< 16LL)"),
            "{src}"
        );
        assert!(src.contains("* 8LL] : (unsigned short)0)"), "{src}");
        // A device's block of a vocabulary-split table (rows 8..16 of 16 here): the row is
        // the id less the block's first row; a lookup along axis 1 strides by one element.
        let p = plan_of(
            "tensor table: f32[t, h]\n tensor ids: i64[t]\n e = index_select(table, ids, 0, 8)\n \
             c = index_select(table, ids, 1)\n output e, c",
            8,
            8,
        );
        let all: String = p.launches.iter().map(|l| l.source.as_str()).collect();
        assert!(all.contains("- 8LL;"), "{all}");
        assert!(all.contains("* 1LL] : (float)0)"), "{all}");
    }

    #[test]
    fn iota_fuses_as_an_index_and_slice_and_concat_move_views() {
        // A causal mask: two indices compared, no load of them, one fused kernel.
        let p = plan_of(
            "tensor s: f32[t, h]\n keep = ge(iota(s, 0), iota(s, 1))\n \
             out = where(keep, s, -inf)\n output out",
            16,
            16,
        );
        assert_eq!(p.launches.len(), 1, "{:#?}", p.launches);
        let src = &p.launches[0].source;
        assert!(src.contains("double v1 = (double)(0u + i0 * 1u);"), "{src}");
        assert!(src.contains("(double)(0u + (i1 + j) * 1u);"), "{src}");
        assert!(src.contains("(v1 >= v2 ?"), "{src}");
        // A slice is an offset into its operand; a concat two stores into one temporary.
        let p = plan_of(
            "tensor w: f32[t, h]\n q = slice(w, 0, 4, 12)\n output q",
            16,
            8,
        );
        assert_eq!(p.launches.len(), 1);
        assert!(
            p.launches[0].source.contains("(32u + "),
            "{}",
            p.launches[0].source
        );
        let p = plan_of(
            "tensor a: f32[t, h]\n tensor b: f32[t, h]\n c = concat(a, b, 1)\n output c",
            4,
            8,
        );
        // Both stores go straight into the output (its temporary retargeted), `b` after `a`.
        assert_eq!(p.launches.len(), 2, "{:#?}", p.launches);
        assert!(
            p.launches[0]
                .source
                .contains("(((float*)p1) + (0u + i0 * 16u"),
            "{:#?}",
            p.launches
        );
        assert!(
            p.launches[1]
                .source
                .contains("(((float*)p1) + (8u + i0 * 16u"),
            "{:#?}",
            p.launches
        );
    }

    const SOFTMAX: &str = "tensor x: bf16[t, h]\n xf = cast(x, f32)\n m = max(xf, [1])\n \
        mb = broadcast(m, [1])\n d = sub(xf, mb)\n e = exp(d)\n z = sum(e, [1])\n \
        zb = broadcast(z, [1])\n yf = div(e, zb)\n y = cast(yf, bf16)\n output y";

    #[test]
    fn a_contiguous_bf16_add_moves_16_bytes_per_access_in_32_bit_indices() {
        let p = plan_of(
            "tensor a: bf16[t, h]\n tensor b: bf16[t, h]\n y = add(a, b)\n output y",
            16384,
            8192,
        );
        assert_eq!(p.launches.len(), 1);
        let l = &p.launches[0];
        assert_eq!(
            l.grid,
            Grid::Items {
                n: 16384 * 8192 / 8 / UNROLL,
                block: BLOCK
            }
        );
        assert!(
            l.source.contains("const unsigned short* __restrict__ p0")
                && l.source.contains("unsigned short* __restrict__ p2"),
            "{}",
            l.source
        );
        assert_eq!(l.source.matches("uint4").count(), 6, "{}", l.source);
        assert!(l.source.contains("unsigned int q"), "{}", l.source);
        assert_eq!(l.align, vec![(0, 16), (1, 16), (2, 16)]);
        // Unaligned buffers take the scalar kernel.
        let fallback = l.fallback.as_deref().expect("a scalar fallback");
        assert!(!fallback.source.contains("uint4"));
        assert!(std::ptr::eq(l.for_addresses(&[256, 512, 1024]), l));
        assert!(std::ptr::eq(l.for_addresses(&[256, 514, 1024]), fallback));
        // 128 SMs of 2048 threads hold 1024 blocks of 256: 16 waves, 16384 blocks at most.
        assert_eq!(l.grid.dims(128), Some((16384, 256)));
        // Work for fewer blocks gets one block per 256 items.
        let few = Grid::Items {
            n: 1000 * 256 + 1,
            block: 256,
        };
        assert_eq!(few.dims(128), Some((1001, 256)));
        let rows = Grid::Rows {
            rows: 1 << 20,
            block: 32,
        };
        // 64 blocks of 32 threads an SM, 16 waves.
        assert_eq!(rows.dims(2), Some((2 * 64 * 16, 32)));
    }

    #[test]
    fn softmax_is_one_row_kernel_of_two_passes_and_a_vector_store() {
        let p = plan_of(SOFTMAX, 4096, 4096);
        assert_eq!(p.launches.len(), 1, "{:#?}", p.launches);
        assert!(p.temps.is_empty());
        let l = &p.launches[0];
        assert_eq!(
            l.grid,
            Grid::Rows {
                rows: 4096,
                block: 256
            }
        );
        assert_eq!(l.source.matches("weave_block_reduce(acc").count(), 2);
        assert!(l.source.contains("WeaveMax()") && l.source.contains("WeaveSum()"));
        assert!(l.source.contains("__expf"), "bf16 results use fast exp");
        // bf16 in and out: 8 elements, 16 bytes per access (the f32 math does not narrow it).
        assert!(
            l.source.contains("for (int j = 0; j < 8; ++j)"),
            "{}",
            l.source
        );
        // The row is read once: the first pass keeps each thread's vectors in registers
        // (4096 elements: 512 vectors, 2 per thread of 256) for the later passes.
        assert_eq!(l.align, vec![(0, 16), (1, 16)]);
        assert_eq!(l.source.matches("((const unsigned short*)p0) +").count(), 1);
        assert!(
            l.source.contains("alignas(16) unsigned short a1[2][8];"),
            "{}",
            l.source
        );
        assert!(l.fallback.is_some());
    }

    #[test]
    fn a_column_sum_splits_its_rows_over_blocks_then_adds_the_partials() {
        let p = plan_of(
            "tensor x: f32[t, h]\n y = sum(x, [0])\n output y",
            16384,
            8192,
        );
        assert_eq!(p.launches.len(), 2);
        let splits = p.temps[1].1 / 8192;
        assert!(
            splits > 1 && p.temps[1].1.is_multiple_of(8192),
            "{:?}",
            p.temps
        );
        // A block per 32 columns and part, 8 warps (lanes) of it per column.
        assert_eq!(
            p.launches[0].grid,
            Grid::Blocks {
                blocks: 8192 / 32 * splits,
                block: BLOCK
            }
        );
        assert!(p.launches[0].source.contains("lanes_acc[8][32]"));
        // 132 SMs: 4 parts of 256 blocks of 256 threads fill one wave (8 blocks an SM).
        assert_eq!(splits, 4);
        // A stream chunk of 1024 columns: a wave would hold 33 parts, but each lane adds at
        // least 32 rows, so 16 parts of 256 rows; the second pass over them has its 8 lanes
        // per column too.
        let p = plan_of(
            "tensor x: f32[t, h]\n y = sum(x, [0])\n output y",
            4096,
            1024,
        );
        assert_eq!(p.temps[1], (DType::F32, 16 * 1024));
        assert_eq!(
            p.launches[1].grid,
            Grid::Blocks {
                blocks: 32,
                block: BLOCK
            }
        );
        assert!(p.launches[1].source.contains("r += 8u"));
        // A row sum is a row kernel of one pass.
        let p = plan_of(
            "tensor x: f32[t, h]\n y = sum(x, [1])\n output y",
            16384,
            8192,
        );
        assert_eq!(p.launches.len(), 1);
        assert!(matches!(p.launches[0].grid, Grid::Rows { rows: 16384, .. }));
        assert!(p.launches[0].source.contains("uint4"));
    }

    #[test]
    fn few_long_rows_split_over_blocks_and_many_rows_take_a_block_each() {
        let p = plan_of(
            "tensor x: f32[t, h]\n y = sum(x, [0, 1])\n output y",
            4096,
            4096,
        );
        assert_eq!(p.launches.len(), 2, "partials, then their sum");
        // 132 SMs, one row: 528 parts of at least 1024 vectors (4096 here).
        assert_eq!(p.temps[1], (DType::F32, 528));
        assert!(matches!(p.launches[0].grid, Grid::Rows { rows: 528, .. }));
        assert!(p.launches[0].source.contains("part * "));
        let p = plan_of(SOFTMAX, 8, 1 << 17);
        assert!(
            p.launches.len() > 1,
            "8 long rows: softmax kernel by kernel"
        );
        let p = plan_of(SOFTMAX, 512, 1 << 17);
        assert_eq!(p.launches.len(), 1);
    }

    #[test]
    fn transposed_reads_stay_scalar_and_huge_buffers_index_in_64_bits() {
        let p = plan_of(
            "tensor x: f32[h, t]\n xt = permute(x, [1, 0])\n y = add(xt, xt)\n output y",
            64,
            64,
        );
        let l = &p.launches[0];
        assert_eq!(
            l.align,
            vec![(1, 16)],
            "only the store is a vector: {}",
            l.source
        );
        let p = plan_of("tensor a: bf16[t, h]\n y = neg(a)\n output y", 65536, 65536);
        assert!(p.launches[0].source.contains("long long q"));
    }

    #[test]
    fn reshape_splits_and_merges_contiguous_views() {
        let v = view(&[4, 6], &[6, 1]);
        assert_eq!(reshape_view(&v, &[4, 2, 3]).unwrap().strides, vec![6, 3, 1]);
        assert_eq!(reshape_view(&v, &[24]).unwrap().strides, vec![1]);
        assert_eq!(
            reshape_view(&v, &[1, 4, 6, 1]).unwrap().strides,
            vec![0, 6, 1, 0]
        );
        // A chunk of a wider buffer: rows are 10 apart, so rows cannot merge.
        let chunk = view(&[4, 6], &[10, 1]);
        assert!(reshape_view(&chunk, &[24]).is_none());
        assert_eq!(
            reshape_view(&chunk, &[2, 2, 6]).unwrap().strides,
            vec![20, 10, 1]
        );
        // A transposed view cannot split its inner axis into a row-major pair.
        let t = view(&[6, 4], &[1, 6]);
        assert!(reshape_view(&t, &[24]).is_none());
    }

    #[test]
    fn expand_broadcasts_size_one_and_missing_axes() {
        let v = view(&[1, 5], &[5, 1]);
        let e = expand(&v, &[3, 4, 5]).unwrap();
        assert_eq!(e.strides, vec![0, 0, 1]);
        assert!(expand(&view(&[2, 5], &[5, 1]), &[3, 5]).is_none());
    }

    #[test]
    fn output_views_ignore_size_one_axes() {
        let a = TensorArg {
            dtype: DType::BF16,
            sizes: vec![8, 16, 1],
            strides: vec![16, 1, 1],
        };
        let v = output_view(Buf::Output(0), &a, &[8, 16]).unwrap();
        assert_eq!(v.strides, vec![16, 1]);
        assert!(output_view(Buf::Output(0), &a, &[16, 8]).is_none());
    }
}
