//! CUDA C code generation for kernel segments: a fusion becomes a short list of generated
//! kernels — pointwise chains fused into one expression per output element, reductions with
//! their pointwise producers inlined — over strided views of the segment's buffers.
//!
//! The generator follows the fusion interpreter (`interp`) op by op, but on *lazy values*:
//! a value is an expression over an index space (its sizes) whose leaves load from strided
//! views. View ops (set, broadcast, squeeze, permute, reshape) rewrite the leaves' strides and
//! move no data; pointwise ops build the expression; a reduction, an operand that must be
//! broadcast after computation, or a view a stride rewrite cannot express, materializes the
//! value into a temporary with its own kernel. Each fusion output is finally materialized
//! into its buffer. Sizes and strides are constants in the source, so a source is specific to
//! one chunk shape; sources are cached by hash (chunks of a loop share one).
//!
//! Arithmetic runs in `float` (or `double` when an f64 or i64 tensor is involved); bf16 and
//! f16 are loaded and stored through PTX conversions (round to nearest even), so no header
//! is needed. A `cast` rounds to its type in place, as the interpreter does.

use std::fmt::Write as _;

use weave_ir::{BinaryOp, DType, ExprKind, Fusion, ReduceOp, UnaryOp};

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

/// A buffer a generated kernel reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Buf {
    /// The segment's `n`-th input.
    Input(usize),
    /// The segment's `n`-th output.
    Output(usize),
    /// The plan's `n`-th temporary.
    Temp(usize),
}

/// One generated kernel.
#[derive(Clone, Debug)]
pub struct Launch {
    /// The kernel's name in `source`.
    pub name: String,
    /// CUDA C source.
    pub source: String,
    /// Threads needed (one per element written).
    pub threads: usize,
    /// The kernel's parameters: the base address of each buffer, in order.
    pub args: Vec<Buf>,
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
struct View {
    buf: Buf,
    dtype: DType,
    offset: isize,
    sizes: Vec<usize>,
    strides: Vec<isize>,
}

#[derive(Clone, Debug)]
enum Node {
    Load(View),
    Cast(DType, Box<Node>),
    Unary(UnaryOp, Box<Node>),
    Binary(BinaryOp, Box<Node>, Box<Node>),
    Where(Box<Node>, Box<Node>, Box<Node>),
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
        })
    }

    fn is_load(&self) -> bool {
        matches!(self, Node::Load(_))
    }

    fn dtypes(&self, out: &mut Vec<DType>) {
        match self {
            Node::Load(v) => out.push(v.dtype),
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

struct Gen<'f> {
    fusion: &'f Fusion,
    name: String,
    plan: KernelPlan,
}

/// Plans the kernels that compute `fusion` from buffers laid out as `inputs` into buffers laid
/// out as `outputs`. Errors name the op and what it cannot do.
pub fn plan(
    fusion: &Fusion,
    name: &str,
    inputs: &[TensorArg],
    outputs: &[TensorArg],
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
    let mut g = Gen {
        fusion,
        name: name
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect(),
        plan: KernelPlan::default(),
    };
    let mut env = std::collections::HashMap::new();
    for (k, (t, a)) in declared.iter().zip(inputs).enumerate() {
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
        let value = g
            .op(&expr.kind, &expr.inputs, out_t, out_dtype, ins)
            .map_err(|m| format!("{op} `{}`: {m}", fusion.tensor(out_t).name))?;
        env.insert(out_t, value);
    }
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
        g.store(&value, &dst);
    }
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

impl Gen<'_> {
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
            ExprKind::Reduction { op, axes } => self.reduce(&x, *op, axes, dtype)?,
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
                self.reshape(x, sizes)
            }
            ExprKind::Squeeze { axes } => {
                let sizes = (0..x.sizes.len())
                    .filter(|k| !axes.contains(k))
                    .map(|k| x.sizes[k])
                    .collect();
                self.reshape(x, sizes)
            }
            ExprKind::Permute { perm } => {
                if perm.len() != x.sizes.len() || perm.iter().any(|p| *p >= perm.len()) {
                    return Err(format!("permutation {perm:?} of sizes {:?}", x.sizes));
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
                self.reshape(x, sizes)
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

    /// `x` with `sizes` (same element count), rewriting strides, or through a temporary.
    fn reshape(&mut self, x: Lazy, sizes: Vec<usize>) -> Lazy {
        let f = |v: &View| reshape_view(v, &sizes);
        let x = match x.node.map_loads(&f) {
            Some(node) => {
                return Lazy {
                    dtype: x.dtype,
                    sizes,
                    node,
                }
            }
            None => self.materialize(&x),
        };
        let node = x
            .node
            .map_loads(&f)
            .expect("a contiguous temporary reshapes to any sizes of its element count");
        Lazy {
            dtype: x.dtype,
            sizes,
            node,
        }
    }

    /// `x` as an expression over `sizes` (numpy broadcasting).
    fn broadcast(&mut self, x: Lazy, sizes: &[usize]) -> Result<Node, String> {
        if x.sizes == sizes {
            return Ok(x.node);
        }
        let f = |v: &View| expand(v, sizes);
        if x.node.is_load() {
            if let Some(n) = x.node.map_loads(&f) {
                return Ok(n);
            }
        }
        let m = self.materialize(&x);
        m.node
            .map_loads(&f)
            .ok_or_else(|| format!("sizes {:?} do not broadcast to {sizes:?}", x.sizes))
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

    /// Computes `x` into a fresh contiguous temporary and returns a load of it.
    fn materialize(&mut self, x: &Lazy) -> Lazy {
        let t = self.new_temp(x.dtype, &x.sizes);
        self.store(x, &t);
        Lazy {
            dtype: x.dtype,
            sizes: x.sizes.clone(),
            node: Node::Load(t),
        }
    }

    fn kernel_name(&self) -> String {
        format!("{}_{}", self.name, self.plan.launches.len())
    }

    /// Emits a kernel writing `x` into `dst` (same sizes).
    fn store(&mut self, x: &Lazy, dst: &View) {
        let mut e = Emitter::new(compute_type(&x.node, Some(dst.dtype)));
        e.index("i", &x.sizes);
        let v = e.expr(&x.node);
        let store = e.store(dst, &v);
        let n = numel(&x.sizes);
        let name = self.kernel_name();
        let source = e.finish(&name, n, &store);
        self.plan.launches.push(Launch {
            name,
            source,
            threads: n,
            args: e.bufs,
        });
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
        if numel(&red_sizes) == 0 && numel(&out_sizes) > 0 && op == ReduceOp::Max {
            return Err(format!(
                "max over axes {axes:?} of sizes {:?}, which are empty",
                x.sizes
            ));
        }
        let dst = self.new_temp(dtype, &out_sizes);
        let ct = compute_type(&x.node, Some(dtype));
        let mut e = Emitter::new(ct);
        e.index("o", &out_sizes);
        // The input index: kept axes from the output index, reduced axes from the loop.
        let mut body = String::new();
        let red_n = numel(&red_sizes);
        let init = match op {
            ReduceOp::Sum => "0".to_string(),
            ReduceOp::Max => format!("-{}", e.inf()),
        };
        let _ = writeln!(body, "    {ct} acc = {init};");
        let _ = writeln!(body, "    for (long long r = 0; r < {red_n}LL; ++r) {{");
        let _ = writeln!(body, "      long long rr = r;");
        let mut idx = vec![String::new(); rank];
        for (k, a) in kept.iter().enumerate() {
            idx[*a] = format!("o{k}");
        }
        for (k, a) in reduced.iter().enumerate().rev() {
            let _ = writeln!(
                body,
                "      long long x{a} = rr % {}LL; rr /= {}LL;",
                red_sizes[k], red_sizes[k]
            );
            idx[*a] = format!("x{a}");
        }
        for (a, name) in idx.iter().enumerate() {
            if kept.contains(&a) {
                let _ = writeln!(body, "      long long x{a} = {name};");
            }
        }
        let mut inner = Emitter::new(ct);
        inner.bufs = std::mem::take(&mut e.bufs);
        inner.index_names = (0..rank).map(|a| format!("x{a}")).collect();
        let v = inner.expr(&x.node);
        for line in inner.lines.drain(..) {
            let _ = writeln!(body, "    {line}");
        }
        match op {
            ReduceOp::Sum => {
                let _ = writeln!(body, "      acc += {v};");
            }
            ReduceOp::Max => {
                let _ = writeln!(
                    body,
                    "      acc = (acc != acc || {v} != {v}) ? {} : (acc > {v} ? acc : {v});",
                    e.nan()
                );
            }
        }
        let _ = writeln!(body, "    }}");
        e.bufs = inner.bufs;
        let store = e.store(&dst, "acc");
        let _ = write!(body, "{store}");
        let n = numel(&out_sizes);
        let name = self.kernel_name();
        let source = e.finish(&name, n, &body);
        self.plan.launches.push(Launch {
            name,
            source,
            threads: n,
            args: e.bufs,
        });
        Ok(Lazy {
            dtype,
            sizes: out_sizes,
            node: Node::Load(dst),
        })
    }
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

fn c_type(d: DType) -> &'static str {
    match d {
        DType::BF16 | DType::F16 => "unsigned short",
        DType::F32 => "float",
        DType::F64 => "double",
        DType::I64 => "long long",
        DType::Bool => "unsigned char",
    }
}

struct Emitter {
    ct: &'static str,
    lines: Vec<String>,
    bufs: Vec<Buf>,
    index_names: Vec<String>,
    next: usize,
}

const PRELUDE: &str = r#"
__device__ __forceinline__ float bf2f(unsigned short b) { return __uint_as_float(((unsigned int)b) << 16); }
__device__ __forceinline__ unsigned short f2bf(float f) { unsigned short r; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f)); return r; }
__device__ __forceinline__ float h2f(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short f2h(float f) { unsigned short r; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(f)); return r; }
"#;

impl Emitter {
    fn new(ct: &'static str) -> Emitter {
        Emitter {
            ct,
            lines: Vec::new(),
            bufs: Vec::new(),
            index_names: Vec::new(),
            next: 0,
        }
    }

    fn float(&self) -> bool {
        self.ct == "float"
    }

    fn inf(&self) -> &'static str {
        if self.float() {
            "__int_as_float(0x7f800000)"
        } else {
            "__longlong_as_double(0x7ff0000000000000LL)"
        }
    }

    fn nan(&self) -> &'static str {
        if self.float() {
            "__int_as_float(0x7fffffff)"
        } else {
            "__longlong_as_double(0x7ff8000000000000LL)"
        }
    }

    /// Declares the multi-index `{prefix}k` of the flat index `i` over `sizes` (row-major).
    fn index(&mut self, prefix: &str, sizes: &[usize]) {
        self.lines.push("long long rem = i;".into());
        let mut names = vec![String::new(); sizes.len()];
        for a in (0..sizes.len()).rev() {
            self.lines.push(format!(
                "long long {prefix}{a} = rem % {s}LL; rem /= {s}LL;",
                s = sizes[a].max(1)
            ));
            names[a] = format!("{prefix}{a}");
        }
        self.index_names = names;
    }

    fn arg(&mut self, b: Buf) -> usize {
        match self.bufs.iter().position(|x| *x == b) {
            Some(k) => k,
            None => {
                self.bufs.push(b);
                self.bufs.len() - 1
            }
        }
    }

    fn offset(&self, v: &View) -> String {
        let mut s = format!("{}LL", v.offset);
        for (a, st) in v.strides.iter().enumerate() {
            if *st != 0 && v.sizes[a] != 1 {
                let _ = write!(s, " + {} * {st}LL", self.index_names[a]);
            }
        }
        s
    }

    fn fresh(&mut self) -> String {
        self.next += 1;
        format!("v{}", self.next)
    }

    fn to_ct(&self, d: DType, raw: &str) -> String {
        let ct = self.ct;
        match d {
            DType::BF16 => format!("({ct})bf2f({raw})"),
            DType::F16 => format!("({ct})h2f({raw})"),
            _ => format!("({ct})({raw})"),
        }
    }

    /// `v` (compute type) rounded to `d`, as a raw value of `d`'s C type.
    fn round_to_c(&self, d: DType, v: &str) -> String {
        match d {
            DType::BF16 => format!("f2bf((float)({v}))"),
            DType::F16 => format!("f2h((float)({v}))"),
            DType::F32 => format!("(float)({v})"),
            DType::F64 => format!("(double)({v})"),
            DType::I64 => format!("(long long)({v})"),
            DType::Bool => format!("(unsigned char)(({v}) != 0)"),
        }
    }

    fn expr(&mut self, n: &Node) -> String {
        let ct = self.ct;
        let f = self.float();
        let rhs = match n {
            Node::Load(v) => {
                let k = self.arg(v.buf);
                let raw = format!("((const {}*)p{k})[{}]", c_type(v.dtype), self.offset(v));
                self.to_ct(v.dtype, &raw)
            }
            Node::Cast(d, x) => {
                let a = self.expr(x);
                let raw = self.round_to_c(*d, &a);
                self.to_ct(*d, &raw)
            }
            Node::Unary(u, x) => {
                let a = self.expr(x);
                let m = |name: &str| {
                    if f {
                        format!("{name}f({a})")
                    } else {
                        format!("{name}({a})")
                    }
                };
                match u {
                    UnaryOp::Neg => format!("-{a}"),
                    UnaryOp::Abs => m("fabs"),
                    UnaryOp::Exp => m("exp"),
                    UnaryOp::Log => m("log"),
                    UnaryOp::Sin => m("sin"),
                    UnaryOp::Cos => m("cos"),
                    UnaryOp::Tanh => m("tanh"),
                    UnaryOp::Sqrt => m("sqrt"),
                    UnaryOp::Rsqrt => format!("(({ct})1 / {})", m("sqrt")),
                    UnaryOp::Reciprocal => format!("(({ct})1 / {a})"),
                    UnaryOp::Relu => format!("({a} < ({ct})0 ? ({ct})0 : {a})"),
                    UnaryOp::Sigmoid => {
                        let e = if f {
                            format!("expf(-{a})")
                        } else {
                            format!("exp(-{a})")
                        };
                        format!("(({ct})1 / (({ct})1 + {e}))")
                    }
                    UnaryOp::Not => format!("({a} == ({ct})0 ? ({ct})1 : ({ct})0)"),
                }
            }
            Node::Binary(b, x, y) => {
                let a = self.expr(x);
                let c = self.expr(y);
                let cmp = |op: &str| format!("({a} {op} {c} ? ({ct})1 : ({ct})0)");
                let nan = self.nan();
                match b {
                    BinaryOp::Add => format!("{a} + {c}"),
                    BinaryOp::Sub => format!("{a} - {c}"),
                    BinaryOp::Mul => format!("{a} * {c}"),
                    BinaryOp::Div => format!("{a} / {c}"),
                    BinaryOp::Maximum => {
                        format!("(({a} != {a} || {c} != {c}) ? {nan} : ({a} > {c} ? {a} : {c}))")
                    }
                    BinaryOp::Minimum => {
                        format!("(({a} != {a} || {c} != {c}) ? {nan} : ({a} < {c} ? {a} : {c}))")
                    }
                    BinaryOp::Pow => {
                        if f {
                            format!("powf({a}, {c})")
                        } else {
                            format!("pow({a}, {c})")
                        }
                    }
                    BinaryOp::Eq => cmp("=="),
                    BinaryOp::Ne => cmp("!="),
                    BinaryOp::Lt => cmp("<"),
                    BinaryOp::Le => cmp("<="),
                    BinaryOp::Gt => cmp(">"),
                    BinaryOp::Ge => cmp(">="),
                    BinaryOp::And => {
                        format!("(({a} != ({ct})0 && {c} != ({ct})0) ? ({ct})1 : ({ct})0)")
                    }
                    BinaryOp::Or => {
                        format!("(({a} != ({ct})0 || {c} != ({ct})0) ? ({ct})1 : ({ct})0)")
                    }
                }
            }
            Node::Where(c, x, y) => {
                let cv = self.expr(c);
                let a = self.expr(x);
                let b = self.expr(y);
                format!("({cv} != ({ct})0 ? {a} : {b})")
            }
        };
        let name = self.fresh();
        self.lines.push(format!("{ct} {name} = {rhs};"));
        name
    }

    /// The statement storing `v` (compute type) into `dst` at the current index.
    fn store(&mut self, dst: &View, v: &str) -> String {
        let k = self.arg(dst.buf);
        let mut e = Emitter::new(self.ct);
        e.index_names = self.index_names.clone();
        format!(
            "    (({}*)p{k})[{}] = {};\n",
            c_type(dst.dtype),
            e.offset(dst),
            self.round_to_c(dst.dtype, v)
        )
    }

    fn finish(&self, name: &str, n: usize, tail: &str) -> String {
        let params: Vec<String> = (0..self.bufs.len())
            .map(|k| format!("unsigned long long p{k}"))
            .collect();
        let mut s = String::from(PRELUDE);
        let _ = writeln!(
            s,
            "extern \"C\" __global__ void {name}({}) {{",
            params.join(", ")
        );
        let _ = writeln!(
            s,
            "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < {n}LL; \
             i += (long long)gridDim.x * blockDim.x) {{"
        );
        for l in &self.lines {
            let _ = writeln!(s, "    {l}");
        }
        s.push_str(tail);
        s.push_str("  }\n}\n");
        s
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
