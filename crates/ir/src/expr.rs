//! Operations of a fusion: pointwise, reductions, shape ops, matmul and linear.

use crate::diag::Span;
use crate::dtype::DType;
use crate::ids::TensorId;
use crate::scalar::Scalar;

/// Pointwise unary operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// `-x`
    Neg,
    /// `|x|`
    Abs,
    /// `e^x`
    Exp,
    /// `ln x`
    Log,
    /// `sin x`
    Sin,
    /// `cos x`
    Cos,
    /// `tanh x`
    Tanh,
    /// `sqrt x`
    Sqrt,
    /// `1 / sqrt x`
    Rsqrt,
    /// `1 / x`
    Reciprocal,
    /// `max(x, 0)`
    Relu,
    /// `1 / (1 + e^-x)`
    Sigmoid,
    /// logical not (bool only)
    Not,
    /// The error function `erf x`.
    Erf,
    /// `x Φ(x) = x (1 + erf(x / √2)) / 2`, the exact GELU.
    Gelu,
    /// `x (1 + tanh(√(2/π) (x + 0.044715 x³))) / 2`, GELU's tanh approximation.
    GeluTanh,
}

/// Pointwise binary operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b`
    Add,
    /// `a - b`
    Sub,
    /// `a * b`
    Mul,
    /// `a / b`
    Div,
    /// elementwise maximum
    Maximum,
    /// elementwise minimum
    Minimum,
    /// `a ^ b`
    Pow,
    /// `a == b` (bool result)
    Eq,
    /// `a != b` (bool result)
    Ne,
    /// `a < b` (bool result)
    Lt,
    /// `a <= b` (bool result)
    Le,
    /// `a > b` (bool result)
    Gt,
    /// `a >= b` (bool result)
    Ge,
    /// logical and (bool only)
    And,
    /// logical or (bool only)
    Or,
}

/// Reduction operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
}

macro_rules! named_enum {
    ($ty:ident { $($v:ident = $s:literal),* $(,)? }) => {
        impl $ty {
            /// Every variant.
            pub const ALL: &'static [$ty] = &[$($ty::$v),*];
            /// The op name used by the `.weave` format and the printer.
            pub fn name(self) -> &'static str {
                match self { $($ty::$v => $s),* }
            }
            /// Parses [`Self::name`].
            pub fn from_name(s: &str) -> Option<$ty> {
                Self::ALL.iter().copied().find(|v| v.name() == s)
            }
        }
    };
}

named_enum!(UnaryOp {
    Neg = "neg", Abs = "abs", Exp = "exp", Log = "log", Sin = "sin", Cos = "cos",
    Tanh = "tanh", Sqrt = "sqrt", Rsqrt = "rsqrt", Reciprocal = "reciprocal",
    Relu = "relu", Sigmoid = "sigmoid", Not = "not", Erf = "erf", Gelu = "gelu",
    GeluTanh = "gelu_tanh",
});
named_enum!(BinaryOp {
    Add = "add", Sub = "sub", Mul = "mul", Div = "div", Maximum = "maximum",
    Minimum = "minimum", Pow = "pow", Eq = "eq", Ne = "ne", Lt = "lt", Le = "le",
    Gt = "gt", Ge = "ge", And = "and", Or = "or",
});
named_enum!(ReduceOp { Sum = "sum", Max = "max", Min = "min" });

impl BinaryOp {
    /// True for comparisons, whose result is bool.
    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge
        )
    }

    /// True for the logical operators, which take and give bool.
    pub fn is_logical(self) -> bool {
        matches!(self, BinaryOp::And | BinaryOp::Or)
    }
}

impl UnaryOp {
    /// True for operators defined only on floating-point inputs.
    pub fn needs_float(self) -> bool {
        !matches!(
            self,
            UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu | UnaryOp::Not
        )
    }
}

/// A number written in a program where a 0-d tensor of the other operand's dtype could be
/// (`x * 0.5`, `where(c, x, 0)`): it takes that operand's dtype, as PyTorch's weak scalars do.
/// Compared and hashed by its bits, so that `NaN` equals itself and a fusion compares equal
/// to its copy.
#[derive(Clone, Copy, Debug)]
pub struct Literal(pub f64);

impl PartialEq for Literal {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for Literal {}

impl std::hash::Hash for Literal {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.to_bits().hash(state)
    }
}

impl Literal {
    /// The literal as the `.weave` format writes it: an integer without a fraction (`2`,
    /// `-3`), other finite values in Rust's shortest round-trip form (`0.5`, `1e-9`), and
    /// `inf`, `-inf`, `nan`.
    pub fn to_source(self) -> String {
        let v = self.0;
        if v.is_nan() {
            "nan".to_string()
        } else if v.is_infinite() {
            if v > 0.0 { "inf" } else { "-inf" }.to_string()
        } else if v == v.trunc() && v.abs() < 1e15 && !(v == 0.0 && v.is_sign_negative()) {
            format!("{}", v as i64)
        } else {
            format!("{v:?}")
        }
    }
}

/// What an expr computes. Axis lists refer to the input's logical axes without reductions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExprKind {
    /// A copy; where producer and consumer shardings differ this is a communication.
    Set,
    /// A copy that also marks a segment boundary: the segmenter never fuses it with the op
    /// that produces its input (nvFuser's `segment_set`).
    SegmentSet,
    /// Conversion to another dtype.
    Cast(DType),
    /// Pointwise unary.
    Unary(UnaryOp),
    /// Pointwise binary with broadcasting of `b` axes.
    Binary(BinaryOp),
    /// `where(cond, a, b)`.
    Where,
    /// A binary op one of whose operands is a literal: `op(x, lit)`, or `op(lit, x)` when
    /// `lit_first`. The one input is the tensor operand; the literal takes its dtype.
    BinaryLit {
        /// The operator.
        op: BinaryOp,
        /// The literal operand.
        lit: Literal,
        /// Whether the literal is the first operand.
        lit_first: bool,
    },
    /// `where(cond, a, b)` with `a` or `b` a literal (not both: the tensor operand gives the
    /// literal its dtype); the inputs are `cond` and the tensor operand.
    WhereLit {
        /// `a`, when it is a literal.
        a: Option<Literal>,
        /// `b`, when it is a literal.
        b: Option<Literal>,
    },
    /// Reduction over `axes`; the output keeps them as reduction axes.
    Reduction {
        /// Sum, max or min.
        op: ReduceOp,
        /// Reduced axes, sorted.
        axes: Vec<usize>,
    },
    /// Inserts broadcast axes at the given output positions.
    Broadcast {
        /// Output positions of the new axes, sorted.
        axes: Vec<usize>,
    },
    /// Removes the given broadcast axes.
    Squeeze {
        /// Removed axes, sorted.
        axes: Vec<usize>,
    },
    /// Output axis `i` is input axis `perm[i]`.
    Permute {
        /// The permutation.
        perm: Vec<usize>,
    },
    /// Splits one axis in two or merges two adjacent axes.
    Reshape {
        /// The new shape.
        shape: Vec<Scalar>,
    },
    /// `iota(a, axis)`: an `i64` tensor of `a`'s shape whose every element is its index
    /// along `axis` (`a` gives the shape and the sharding, not values).
    Iota {
        /// The axis whose index each element holds.
        axis: usize,
    },
    /// `slice(a, axis, start, stop)`: the elements `start..stop` of `axis`, other axes whole.
    Slice {
        /// The sliced axis.
        axis: usize,
        /// First index kept.
        start: Scalar,
        /// One past the last index kept.
        stop: Scalar,
    },
    /// `concat(a, b, axis)`: `a` then `b` along `axis`; the other axes are equal.
    Concat {
        /// The axis the operands are joined along.
        axis: usize,
    },
    /// `index_select(table, ids, axis)`: the rows of `table` along `axis` that the `i64` ids
    /// name, in the ids' order (an embedding lookup): `table [.., v, ..]`, `ids [n]` →
    /// `[.., n, ..]`. The output keeps `v` as a trailing reduction axis (`[.., n, .., rv]`,
    /// as `linear` keeps its contraction axis), so that a device split of the table's `v`
    /// lowers like a device-split contraction: each device looks up the ids in its shard, the
    /// others give zero, and the partial results are added across the devices.
    IndexSelect {
        /// The axis of `table` the ids index.
        axis: usize,
        /// `None` as written: the op holds the whole axis (an id outside it is an error).
        /// `Some(b)` in the per-device partial of a lookup whose `axis` is device-split
        /// (`decompose-reshardings` writes it): the operand holds the rows `b..b + len` of the
        /// axis, `b` a size over the host programs' built-in `rank` (the device's shard
        /// offset), and an id outside them gives a zero row.
        base: Option<Scalar>,
    },
    /// `[.., m, k] x [.., k, n] -> [.., m, n]`.
    Matmul,
    /// `x [.., k], w [n, k] (, bias [n]) -> [.., n]`.
    Linear,
}

impl ExprKind {
    /// The op name in the `.weave` format and printer.
    pub fn op_name(&self) -> &'static str {
        match self {
            ExprKind::Set => "set",
            ExprKind::SegmentSet => "segment_set",
            ExprKind::Cast(_) => "cast",
            ExprKind::Unary(u) => u.name(),
            ExprKind::Binary(b) => b.name(),
            ExprKind::Where | ExprKind::WhereLit { .. } => "where",
            ExprKind::BinaryLit { op, .. } => op.name(),
            ExprKind::Reduction { op, .. } => op.name(),
            ExprKind::Broadcast { .. } => "broadcast",
            ExprKind::Squeeze { .. } => "squeeze",
            ExprKind::Permute { .. } => "permute",
            ExprKind::Reshape { .. } => "reshape",
            ExprKind::Iota { .. } => "iota",
            ExprKind::Slice { .. } => "slice",
            ExprKind::Concat { .. } => "concat",
            ExprKind::IndexSelect { .. } => "index_select",
            ExprKind::Matmul => "matmul",
            ExprKind::Linear => "linear",
        }
    }

    /// True for pointwise ops (set, cast, unary, binary, where, and binary and where with
    /// literal operands).
    pub fn is_pointwise(&self) -> bool {
        matches!(
            self,
            ExprKind::Set
                | ExprKind::SegmentSet
                | ExprKind::Cast(_)
                | ExprKind::Unary(_)
                | ExprKind::Binary(_)
                | ExprKind::Where
                | ExprKind::BinaryLit { .. }
                | ExprKind::WhereLit { .. }
        )
    }

    /// The number of tensor operands this kind takes, as a range.
    pub fn arity(&self) -> std::ops::RangeInclusive<usize> {
        match self {
            ExprKind::Binary(_)
            | ExprKind::Matmul
            | ExprKind::Concat { .. }
            | ExprKind::IndexSelect { .. } => 2..=2,
            ExprKind::Where => 3..=3,
            ExprKind::Linear => 2..=3,
            ExprKind::WhereLit { a, b } => {
                let n = 1 + usize::from(a.is_none()) + usize::from(b.is_none());
                n..=n
            }
            _ => 1..=1,
        }
    }
}

/// An operation: inputs, outputs (one today), and where it was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expr {
    /// What it computes.
    pub kind: ExprKind,
    /// Operand tensors, in order.
    pub inputs: Vec<TensorId>,
    /// Defined tensors.
    pub outputs: Vec<TensorId>,
    /// Source position of the statement.
    pub span: Option<Span>,
}

impl Expr {
    /// The span, if any.
    pub fn span(&self) -> Option<Span> {
        self.span
    }
}
