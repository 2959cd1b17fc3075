//! CUDA C text of generated kernels: expressions over strided views, element loops unrolled
//! over a vector width with 128-bit (or narrower) loads and stores, index arithmetic in
//! 32 bits where every offset fits, and the warp-shuffle block reduction of row kernels.
//!
//! The [`Emitter`] turns one expression tree ([`Node`]) into statements inside an element
//! loop `for (int j = 0; j < V; ++j)`: axis `a` of the loop's index space has the index
//! `base[a]` (plus `j` on the vector axis). A load whose innermost stride is 1 and whose
//! other strides and offset are multiples of `V` is read once per thread, before the loop,
//! as one vector (`uint4` for 16 bytes); the kernel then needs that buffer's address aligned
//! to the vector's bytes, which [`Emitter::align`] records for the launcher.

use std::collections::HashMap;
use std::fmt::Write as _;

use weave_ir::{BinaryOp, DType, ReduceOp, UnaryOp};

use crate::expr::{Buf, Node, View};

/// Helpers every generated kernel may use: bf16/f16 conversions by PTX (round to nearest
/// even) and the block reduction of row kernels.
pub const PRELUDE: &str = r#"
__device__ __forceinline__ float bf2f(unsigned short b) { return __uint_as_float(((unsigned int)b) << 16); }
__device__ __forceinline__ unsigned short f2bf(float f) { unsigned short r; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f)); return r; }
__device__ __forceinline__ float h2f(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short f2h(float f) { unsigned short r; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(f)); return r; }
// tanh to about 2^-11 (the hardware approximation from sm_75 on): for results stored in 16
// bits, whose rounding is coarser.
__device__ __forceinline__ float weave_tanh_fast(float x) {
#if __CUDA_ARCH__ >= 750
  float r; asm("tanh.approx.f32 %0, %1;" : "=f"(r) : "f"(x)); return r;
#else
  return tanhf(x);
#endif
}
struct WeaveSum { template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; } };
struct WeaveMax { template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return a != a ? a : (b != b ? b : (a > b ? a : b)); } };
struct WeaveMin { template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return a != a ? a : (b != b ? b : (a < b ? a : b)); } };
// Every thread of the block gets the combination of every thread's `v`; `smem` holds 32
// values. Safe to call repeatedly: it synchronizes before reusing `smem`.
template <class T, class Op> __device__ __forceinline__ T weave_block_reduce(T v, T* smem, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int nw = (blockDim.x + 31) >> 5;
  if (nw == 1) return v;
  __syncthreads();
  if ((threadIdx.x & 31) == 0) smem[threadIdx.x >> 5] = v;
  __syncthreads();
  v = smem[0];
  for (int w = 1; w < nw; ++w) v = op(v, smem[w]);
  return v;
}
"#;

/// The C type of a buffer's elements.
pub fn c_type(d: DType) -> &'static str {
    match d {
        DType::BF16 | DType::F16 => "unsigned short",
        DType::F32 => "float",
        DType::F64 => "double",
        DType::I64 => "long long",
        DType::Bool => "unsigned char",
    }
}

/// The element size in bytes.
pub fn size_of(d: DType) -> usize {
    match d {
        DType::Bool => 1,
        DType::BF16 | DType::F16 => 2,
        DType::F32 => 4,
        DType::F64 | DType::I64 => 8,
    }
}

/// The type moving `bytes` (a power of two up to 16) in one access.
fn vector_type(bytes: usize) -> &'static str {
    match bytes {
        16 => "uint4",
        8 => "uint2",
        4 => "unsigned int",
        2 => "unsigned short",
        _ => "unsigned char",
    }
}

/// The integer type of index arithmetic: 32-bit when every index and offset of the kernel
/// fits, else 64-bit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Width {
    /// `unsigned int`.
    Narrow,
    /// `long long`.
    Wide,
}

impl Width {
    /// The C type.
    pub fn ty(self) -> &'static str {
        match self {
            Width::Narrow => "unsigned int",
            Width::Wide => "long long",
        }
    }

    /// The literal `n` in this type.
    pub fn lit(self, n: i64) -> String {
        match self {
            Width::Narrow => format!("{n}u"),
            Width::Wide => format!("{n}LL"),
        }
    }

    /// The narrowest width for indices below `max_index` and views whose offsets are those
    /// of `views` (all non-negative for the narrow one).
    pub fn for_views<'v>(max_index: usize, views: impl IntoIterator<Item = &'v View>) -> Width {
        let limit = i32::MAX as i128;
        let mut fits = (max_index as i128) < limit;
        for v in views {
            if v.offset < 0 || v.strides.iter().any(|s| *s < 0) {
                fits = false;
            }
            let far: i128 = v.offset as i128
                + v.sizes
                    .iter()
                    .zip(&v.strides)
                    .map(|(n, s)| (*n as i128 - 1).max(0) * *s as i128)
                    .sum::<i128>();
            if far >= limit {
                fits = false;
            }
        }
        if fits {
            Width::Narrow
        } else {
            Width::Wide
        }
    }
}

/// Writes expressions and stores inside one element loop (see the module documentation).
pub struct Emitter {
    /// The compute type: `float` or `double`.
    pub ct: &'static str,
    /// Fast intrinsics (`__expf`, `__fdividef`, `tanh.approx`) for results stored in 16 bits.
    pub fast: bool,
    /// The index width.
    pub width: Width,
    /// The vector width `V`.
    pub vec: usize,
    /// The axis `j` runs along (the innermost of the loop's index space) when `vec > 1`.
    pub vec_axis: Option<usize>,
    /// Each axis's index at `j = 0`.
    pub base: Vec<String>,
    /// Statements before the element loop (vector loads).
    pub pre: Vec<String>,
    /// Statements inside the element loop.
    pub lines: Vec<String>,
    /// The kernel's parameters, in order.
    pub bufs: Vec<Buf>,
    /// Each parameter's element type and whether the kernel loads from and stores to it.
    roles: Vec<(DType, bool, bool)>,
    /// `(parameter, bytes)`: alignments the vector accesses assume.
    pub align: Vec<(usize, usize)>,
    preloaded: HashMap<(Buf, String), String>,
    /// Row kernels whose threads each take `it` vectors of a row: vector loads are kept in
    /// registers (`a[it][V]`) from the pass that first loads them to the last.
    persist: Option<usize>,
    /// Those arrays: (buffer, offset) → name; declared once per kernel ([`Emitter::decls`]).
    persisted: HashMap<(Buf, String), String>,
    /// Declarations of the persisted arrays.
    pub decls: Vec<String>,
    next: usize,
}

impl Emitter {
    /// An emitter for expressions over the index `base` (one name per axis).
    pub fn new(ct: &'static str, fast: bool, width: Width, vec: usize, base: Vec<String>) -> Self {
        let vec_axis = (vec > 1 && !base.is_empty()).then(|| base.len() - 1);
        Emitter {
            ct,
            fast,
            width,
            vec,
            vec_axis,
            base,
            pre: Vec::new(),
            lines: Vec::new(),
            bufs: Vec::new(),
            roles: Vec::new(),
            align: Vec::new(),
            preloaded: HashMap::new(),
            persist: None,
            persisted: HashMap::new(),
            decls: Vec::new(),
            next: 0,
        }
    }

    /// Starts a new element loop over the same parameters: statements and vector loads are
    /// cleared, names stay fresh.
    pub fn reset(&mut self, base: Vec<String>) {
        self.base = base;
        self.vec_axis = (self.vec > 1 && !self.base.is_empty()).then(|| self.base.len() - 1);
        self.pre.clear();
        self.lines.clear();
        self.preloaded.clear();
    }

    fn float(&self) -> bool {
        self.ct == "float"
    }

    /// Positive infinity in the compute type.
    pub fn inf(&self) -> &'static str {
        if self.float() {
            "__int_as_float(0x7f800000)"
        } else {
            "__longlong_as_double(0x7ff0000000000000LL)"
        }
    }

    /// The literal `v` in the compute type: a `float` or `double` constant, the infinities and
    /// NaN by their bits.
    pub fn literal(&self, v: f64) -> String {
        if v.is_nan() {
            self.nan().to_string()
        } else if v.is_infinite() {
            let inf = self.inf();
            if v > 0.0 {
                inf.to_string()
            } else {
                format!("(-{inf})")
            }
        } else if self.float() {
            format!("({:?}f)", v as f32)
        } else {
            format!("({v:?})")
        }
    }

    /// A quiet NaN in the compute type.
    pub fn nan(&self) -> &'static str {
        if self.float() {
            "__int_as_float(0x7fffffff)"
        } else {
            "__longlong_as_double(0x7ff8000000000000LL)"
        }
    }

    /// The parameter number of `b`, a buffer of `dtype` that the kernel loads from (or
    /// stores to, `store`).
    pub fn arg(&mut self, b: Buf, dtype: DType, store: bool) -> usize {
        let k = match self.bufs.iter().position(|x| *x == b) {
            Some(k) => k,
            None => {
                self.bufs.push(b);
                self.roles.push((dtype, false, false));
                self.bufs.len() - 1
            }
        };
        if store {
            self.roles[k].2 = true;
        } else {
            self.roles[k].1 = true;
        }
        k
    }

    /// Takes over `other`'s parameters (to write more statements of the same kernel).
    pub fn adopt(&mut self, other: &Emitter) {
        self.bufs = other.bufs.clone();
        self.roles = other.roles.clone();
    }

    /// The index of axis `a` inside the element loop.
    fn elem(&self, a: usize) -> String {
        if self.vec_axis == Some(a) {
            format!("({} + j)", self.base[a])
        } else {
            self.base[a].clone()
        }
    }

    /// The element offset of `v` at the loop's index (`at_base`: with `j = 0`).
    fn offset(&self, v: &View, at_base: bool) -> String {
        let w = self.width;
        let mut s = w.lit(v.offset as i64);
        for (a, st) in v.strides.iter().enumerate() {
            if *st != 0 && v.sizes[a] != 1 {
                let name = if at_base {
                    self.base[a].clone()
                } else {
                    self.elem(a)
                };
                let _ = write!(s, " + {name} * {}", w.lit(*st as i64));
            }
        }
        s
    }

    /// Whether `v` can be read (or written) as one vector per thread: innermost stride 1
    /// along the vector axis, every other stride and the offset multiples of `V`.
    pub fn vectorizable(&self, v: &View) -> bool {
        let Some(a) = self.vec_axis else { return false };
        v.strides.len() == self.base.len()
            && v.strides[a] == 1
            && v.offset % self.vec as isize == 0
            && v.strides
                .iter()
                .enumerate()
                .all(|(k, s)| k == a || *s % self.vec as isize == 0 || v.sizes[k] == 1)
            && size_of(v.dtype) * self.vec <= 16
    }

    fn fresh(&mut self, prefix: &str) -> String {
        self.next += 1;
        format!("{prefix}{}", self.next)
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
    pub fn round_to_c(&self, d: DType, v: &str) -> String {
        match d {
            DType::BF16 => format!("f2bf((float)({v}))"),
            DType::F16 => format!("f2h((float)({v}))"),
            DType::F32 => format!("(float)({v})"),
            DType::F64 => format!("(double)({v})"),
            DType::I64 => format!("(long long)({v})"),
            DType::Bool => format!("(unsigned char)(({v}) != 0)"),
        }
    }

    /// Keeps vector loads in registers across the passes of a row kernel whose threads take
    /// `iterations` vectors of each row (their element loops run inside `for (int it …)`).
    pub fn persist(&mut self, iterations: usize) {
        self.persist = Some(iterations);
    }

    fn load(&mut self, v: &View) -> String {
        let k = self.arg(v.buf, v.dtype, false);
        let ty = c_type(v.dtype);
        if let (Some(its), true) = (self.persist, self.vectorizable(v)) {
            let off = self.offset(v, true);
            let key = (v.buf, off.clone());
            if let Some(n) = self.preloaded.get(&key) {
                return self.to_ct(v.dtype, &format!("{n}[it][j]"));
            }
            let bytes = size_of(v.dtype) * self.vec;
            let vt = vector_type(bytes);
            let name = match self.persisted.get(&key) {
                Some(n) => n.clone(),
                None => {
                    // First loaded in this pass: declared for the kernel, filled here.
                    let n = self.fresh("a");
                    self.decls
                        .push(format!("alignas(16) {ty} {n}[{its}][{}];", self.vec));
                    self.pre.push(format!(
                        "*reinterpret_cast<{vt}*>({n}[it]) = \
                         *reinterpret_cast<const {vt}*>(((const {ty}*)p{k}) + ({off}));"
                    ));
                    self.align.push((k, bytes));
                    self.persisted.insert(key.clone(), n.clone());
                    n
                }
            };
            self.preloaded.insert(key, name.clone());
            return self.to_ct(v.dtype, &format!("{name}[it][j]"));
        }
        if self.vectorizable(v) {
            let off = self.offset(v, true);
            let key = (v.buf, off.clone());
            let name = match self.preloaded.get(&key) {
                Some(n) => n.clone(),
                None => {
                    let n = self.fresh("a");
                    let bytes = size_of(v.dtype) * self.vec;
                    let vt = vector_type(bytes);
                    self.pre.push(format!(
                        "alignas(16) {ty} {n}[{}]; *reinterpret_cast<{vt}*>({n}) = \
                         *reinterpret_cast<const {vt}*>(((const {ty}*)p{k}) + ({off}));",
                        self.vec
                    ));
                    self.align.push((k, bytes));
                    self.preloaded.insert(key, n.clone());
                    n
                }
            };
            return self.to_ct(v.dtype, &format!("{name}[j]"));
        }
        let invariant = match self.vec_axis {
            Some(a) => v.strides.get(a).is_some_and(|s| *s == 0) || v.sizes.get(a) == Some(&1),
            None => true,
        };
        if invariant {
            // The same element for every `j` (a broadcast along the vector axis, a scalar):
            // loaded once, before the element loop.
            let off = self.offset(v, true);
            let key = (v.buf, format!("scalar {off}"));
            let name = match self.preloaded.get(&key) {
                Some(n) => n.clone(),
                None => {
                    let n = self.fresh("s");
                    self.pre
                        .push(format!("const {ty} {n} = ((const {ty}*)p{k})[{off}];"));
                    self.preloaded.insert(key, n.clone());
                    n
                }
            };
            return self.to_ct(v.dtype, &name);
        }
        let raw = format!("((const {ty}*)p{k})[{}]", self.offset(v, false));
        self.to_ct(v.dtype, &raw)
    }

    /// Statements computing `n` inside the loop; returns the name of its value.
    pub fn expr(&mut self, n: &Node) -> String {
        let ct = self.ct;
        let f = self.float();
        let fast = self.fast && f;
        let rhs = match n {
            Node::Load(v) => self.load(v),
            Node::Row(k) => format!("r{k}"),
            Node::Lit(v) => self.literal(*v),
            Node::Index(v) => format!("({ct})({})", self.offset(v, false)),
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
                let exp = |arg: &str| {
                    if fast {
                        format!("__expf({arg})")
                    } else if f {
                        format!("expf({arg})")
                    } else {
                        format!("exp({arg})")
                    }
                };
                match u {
                    UnaryOp::Neg => format!("-{a}"),
                    UnaryOp::Abs => m("fabs"),
                    UnaryOp::Exp => exp(&a),
                    UnaryOp::Log => m("log"),
                    UnaryOp::Sin => m("sin"),
                    UnaryOp::Cos => m("cos"),
                    UnaryOp::Tanh if fast => format!("weave_tanh_fast({a})"),
                    UnaryOp::Tanh => m("tanh"),
                    UnaryOp::Sqrt => m("sqrt"),
                    UnaryOp::Rsqrt => {
                        if f {
                            format!("rsqrtf({a})")
                        } else {
                            format!("(1.0 / sqrt({a}))")
                        }
                    }
                    UnaryOp::Reciprocal => format!("(({ct})1 / {a})"),
                    UnaryOp::Relu => format!("({a} < ({ct})0 ? ({ct})0 : {a})"),
                    UnaryOp::Sigmoid => {
                        let e = exp(&format!("-{a}"));
                        if fast {
                            format!("__fdividef(1.0f, 1.0f + {e})")
                        } else {
                            format!("(({ct})1 / (({ct})1 + {e}))")
                        }
                    }
                    UnaryOp::Not => format!("({a} == ({ct})0 ? ({ct})1 : ({ct})0)"),
                    UnaryOp::Erf => m("erf"),
                    UnaryOp::Gelu => {
                        let erf = if f { "erff" } else { "erf" };
                        format!(
                            "(({ct})0.5 * {a} * (({ct})1 + {erf}({a} * ({ct})0.70710678118654752440)))"
                        )
                    }
                    UnaryOp::GeluTanh => {
                        let inner = format!(
                            "({ct})0.79788456080286535588 * ({a} + ({ct})0.044715 * {a} * {a} * {a})"
                        );
                        let t = if fast {
                            format!("weave_tanh_fast({inner})")
                        } else if f {
                            format!("tanhf({inner})")
                        } else {
                            format!("tanh({inner})")
                        };
                        format!("(({ct})0.5 * {a} * (({ct})1 + {t}))")
                    }
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
                    BinaryOp::Div => {
                        if fast {
                            format!("__fdividef({a}, {c})")
                        } else {
                            format!("{a} / {c}")
                        }
                    }
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
            Node::Gather {
                table,
                row_stride,
                rows,
                base,
                ids,
            } => {
                let id = self.expr(ids);
                let k = self.arg(table.buf, table.dtype, false);
                let ty = c_type(table.dtype);
                let row = self.fresh("g");
                self.lines.push(format!(
                    "const long long {row} = (long long)({id}) - {base}LL;"
                ));
                let off = self.offset(table, false);
                // A row outside the operand's block (another device's, or no row at all)
                // reads zero: the load is never issued.
                let raw = format!(
                    "(({row} >= 0LL && {row} < {rows}LL) ? ((const {ty}*)p{k})[(long long)({off}) + {row} * {row_stride}LL] : ({ty})0)"
                );
                self.to_ct(table.dtype, &raw)
            }
        };
        let name = self.fresh("v");
        self.lines.push(format!("{ct} {name} = {rhs};"));
        name
    }

    /// Stores `v` (compute type) into `dst` inside the loop: into a staging array written
    /// out as one vector after the loop when `dst` is vectorizable, else directly. Returns
    /// the statements that go after the loop.
    pub fn store(&mut self, dst: &View, v: &str) -> Vec<String> {
        let k = self.arg(dst.buf, dst.dtype, true);
        let ty = c_type(dst.dtype);
        let value = self.round_to_c(dst.dtype, v);
        if self.vectorizable(dst) {
            let n = self.fresh("o");
            let bytes = size_of(dst.dtype) * self.vec;
            let vt = vector_type(bytes);
            self.pre
                .push(format!("alignas(16) {ty} {n}[{}];", self.vec));
            self.lines.push(format!("{n}[j] = {value};"));
            self.align.push((k, bytes));
            let off = self.offset(dst, true);
            vec![format!(
                "*reinterpret_cast<{vt}*>(((({ty}*)p{k}) + ({off}))) = \
                 *reinterpret_cast<const {vt}*>({n});"
            )]
        } else {
            let off = self.offset(dst, false);
            self.lines.push(format!("(({ty}*)p{k})[{off}] = {value};"));
            Vec::new()
        }
    }

    /// Folds `v` into the accumulator `acc` of `op`, inside the loop.
    pub fn accumulate(&mut self, acc: &str, op: ReduceOp, v: &str) {
        self.lines.push(match op {
            ReduceOp::Sum => format!("{acc} += {v};"),
            ReduceOp::Max => format!("{acc} = WeaveMax()({acc}, {v});"),
            ReduceOp::Min => format!("{acc} = WeaveMin()({acc}, {v});"),
        });
    }

    /// The identity of `op` in the compute type.
    pub fn init(&self, op: ReduceOp) -> String {
        match op {
            ReduceOp::Sum => format!("({})0", self.ct),
            ReduceOp::Max => format!("-{}", self.inf()),
            ReduceOp::Min => self.inf().to_string(),
        }
    }

    /// The element loop: vector loads, then `V` unrolled iterations of the statements.
    pub fn element_loop(&self, indent: &str) -> String {
        let mut s = String::new();
        for l in &self.pre {
            let _ = writeln!(s, "{indent}{l}");
        }
        let _ = writeln!(s, "{indent}#pragma unroll");
        let _ = writeln!(s, "{indent}for (int j = 0; j < {}; ++j) {{", self.vec);
        for l in &self.lines {
            let _ = writeln!(s, "{indent}  {l}");
        }
        let _ = writeln!(s, "{indent}}}");
        s
    }

    /// The kernel's signature: one address per parameter, typed, and `__restrict__` where
    /// the kernel only loads from or only stores to it (the buffers of one launch never
    /// overlap), so loads can move ahead of stores.
    pub fn signature(&self, name: &str) -> String {
        let params: Vec<String> = self
            .roles
            .iter()
            .enumerate()
            .map(|(k, (d, load, store))| {
                let ty = c_type(*d);
                match (load, store) {
                    (true, false) => format!("const {ty}* __restrict__ p{k}"),
                    (false, true) => format!("{ty}* __restrict__ p{k}"),
                    _ => format!("{ty}* p{k}"),
                }
            })
            .collect();
        format!("extern \"C\" __global__ void {name}({})", params.join(", "))
    }
}

/// Statements declaring `{prefix}{a}` for each axis of `sizes` from the flat index `var`
/// (row-major), in `width`; the last axis counts in steps of `vec` (`var` counts vectors).
pub fn decompose(
    width: Width,
    var: &str,
    prefix: &str,
    sizes: &[usize],
    vec: usize,
) -> (Vec<String>, Vec<String>) {
    let ty = width.ty();
    let mut lines = Vec::new();
    let mut names = vec![String::new(); sizes.len()];
    if sizes.is_empty() {
        return (lines, names);
    }
    let rem = format!("{prefix}rem");
    lines.push(format!("{ty} {rem} = {var};"));
    for a in (0..sizes.len()).rev() {
        let last = a + 1 == sizes.len();
        let n = if last {
            sizes[a] / vec.max(1)
        } else {
            sizes[a]
        }
        .max(1);
        let name = format!("{prefix}{a}");
        let scale = if last && vec > 1 {
            format!(" * {}", width.lit(vec as i64))
        } else {
            String::new()
        };
        if a == 0 {
            lines.push(format!("{ty} {name} = {rem}{scale};"));
        } else {
            let s = width.lit(n as i64);
            lines.push(format!("{ty} {name} = ({rem} % {s}){scale}; {rem} /= {s};"));
        }
        names[a] = name;
    }
    (lines, names)
}
