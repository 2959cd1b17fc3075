//! Symbolic integer expressions for extents and split factors, simplified as they are built.
//!
//! Extents of iter domains are [`Scalar`]s over the fusion's named parameters (`t`, `h`, ...).
//! Every constructor simplifies, so two extents that are equal by the rules below compare
//! equal structurally; this is what replay and mapping tests rely on.
//!
//! Rules (extents are positive, so `x / x = 1` is sound): constant folding; `x + 0`, `x * 1`,
//! `x * 0`, `x / 1`, `ceilDiv(x, 1)`, `x % 1`; constants gather on the left of `*` and the
//! right of `+`; `(c1 * x) / c2 = (c1 / c2) * x` when `c2` divides `c1` (same for `ceilDiv`
//! and `%`); `(a * b) / b = a`.

use std::fmt;
use std::sync::Arc;

/// The built-in scalar of host programs that is the running device's rank: free in every
/// host program, bound by the evaluator, never a fusion parameter.
pub const RANK: &str = "rank";

/// The built-in scalar of host programs that is the size of each rank's stream pool.
pub const NUMBER_OF_STREAMS: &str = "numberOfStreams";

/// The names no parameter may take: the host programs' built-in scalars.
pub const RESERVED_NAMES: [&str; 2] = [RANK, NUMBER_OF_STREAMS];

/// A built-in scalar of host programs: bound by the evaluator for each rank, never a fusion
/// parameter. Printed and parsed by its name ([`Builtin::name`]), which no parameter may
/// take; [`Scalar::named`] turns that name into [`Scalar::Builtin`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Builtin {
    /// `rank`: the running device's rank.
    Rank,
    /// `numberOfStreams`: the size of each rank's stream pool.
    NumberOfStreams,
}

impl Builtin {
    /// Every built-in scalar.
    pub const ALL: [Builtin; 2] = [Builtin::Rank, Builtin::NumberOfStreams];

    /// The name it is printed and parsed by.
    pub fn name(self) -> &'static str {
        match self {
            Builtin::Rank => RANK,
            Builtin::NumberOfStreams => NUMBER_OF_STREAMS,
        }
    }

    /// The built-in scalar named `name`, if any.
    pub fn from_name(name: &str) -> Option<Builtin> {
        Builtin::ALL.into_iter().find(|b| b.name() == name)
    }

    /// What it stands for, in words.
    pub fn meaning(self) -> &'static str {
        match self {
            Builtin::Rank => "the running device's rank",
            Builtin::NumberOfStreams => "the size of each rank's stream pool",
        }
    }
}

/// An operator of a [`Scalar`] expression.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScalarOp {
    /// `a + b`
    Add,
    /// `a - b`
    Sub,
    /// `a * b`
    Mul,
    /// `a / b` (floor division)
    Div,
    /// `a % b`
    Mod,
    /// `ceilDiv(a, b)`
    CeilDiv,
    /// `min(a, b)`
    Min,
    /// `max(a, b)`
    Max,
}

impl ScalarOp {
    /// The operator as written: `+`, `-`, `*`, `/`, `%`, or the call name `ceilDiv`, `min`, `max`.
    pub fn symbol(self) -> &'static str {
        match self {
            ScalarOp::Add => "+",
            ScalarOp::Sub => "-",
            ScalarOp::Mul => "*",
            ScalarOp::Div => "/",
            ScalarOp::Mod => "%",
            ScalarOp::CeilDiv => "ceilDiv",
            ScalarOp::Min => "min",
            ScalarOp::Max => "max",
        }
    }

    /// True for the operators written as calls (`ceilDiv(a, b)`, `min(a, b)`, `max(a, b)`).
    pub fn is_call(self) -> bool {
        matches!(self, ScalarOp::CeilDiv | ScalarOp::Min | ScalarOp::Max)
    }

    /// Binding strength in the `.weave` source form.
    fn precedence(self) -> u8 {
        match self {
            ScalarOp::Add | ScalarOp::Sub => 1,
            ScalarOp::Mul | ScalarOp::Div | ScalarOp::Mod => 2,
            ScalarOp::CeilDiv | ScalarOp::Min | ScalarOp::Max => 3,
        }
    }
}

/// A symbolic integer: a constant, a named parameter, or an operator applied to two scalars.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Scalar {
    /// An integer literal.
    Const(i64),
    /// A named parameter of the fusion.
    Named(Arc<str>),
    /// A built-in scalar of host programs (`rank`, `numberOfStreams`).
    Builtin(Builtin),
    /// `lhs op rhs`, already simplified.
    Binary(ScalarOp, Box<Scalar>, Box<Scalar>),
}

impl From<i64> for Scalar {
    fn from(v: i64) -> Scalar {
        Scalar::Const(v)
    }
}

// The builder methods are named after the operators on purpose; they take `impl Into<Scalar>`
// and simplify, which the `std::ops` traits (also implemented below) forward to.
#[allow(clippy::should_implement_trait)]
impl Scalar {
    /// The constant `v`.
    pub fn c(v: i64) -> Scalar {
        Scalar::Const(v)
    }

    /// The symbol `name`: the built-in scalar of that name ([`Builtin::from_name`]), else
    /// the parameter.
    pub fn named(name: &str) -> Scalar {
        match Builtin::from_name(name) {
            Some(b) => Scalar::Builtin(b),
            None => Scalar::Named(Arc::from(name)),
        }
    }

    /// The built-in scalar `b`.
    pub fn builtin(b: Builtin) -> Scalar {
        Scalar::Builtin(b)
    }

    /// Whether this expression mentions the built-in scalar `b`.
    pub fn mentions(&self, b: Builtin) -> bool {
        match self {
            Scalar::Builtin(x) => *x == b,
            Scalar::Const(_) | Scalar::Named(_) => false,
            Scalar::Binary(_, l, r) => l.mentions(b) || r.mentions(b),
        }
    }

    /// The value if this is a constant.
    pub fn as_const(&self) -> Option<i64> {
        match self {
            Scalar::Const(v) => Some(*v),
            _ => None,
        }
    }

    /// Builds `lhs op rhs` and simplifies it.
    pub fn binary(op: ScalarOp, lhs: Scalar, rhs: Scalar) -> Scalar {
        simplify_binary(op, lhs, rhs)
    }

    /// `self + rhs`
    pub fn add(self, rhs: impl Into<Scalar>) -> Scalar {
        Scalar::binary(ScalarOp::Add, self, rhs.into())
    }
    /// `self - rhs`
    pub fn sub(self, rhs: impl Into<Scalar>) -> Scalar {
        Scalar::binary(ScalarOp::Sub, self, rhs.into())
    }
    /// `self * rhs`
    pub fn mul(self, rhs: impl Into<Scalar>) -> Scalar {
        Scalar::binary(ScalarOp::Mul, self, rhs.into())
    }
    /// `self / rhs` (floor)
    pub fn div(self, rhs: impl Into<Scalar>) -> Scalar {
        Scalar::binary(ScalarOp::Div, self, rhs.into())
    }
    /// `self % rhs`
    pub fn rem(self, rhs: impl Into<Scalar>) -> Scalar {
        Scalar::binary(ScalarOp::Mod, self, rhs.into())
    }
    /// `min(self, rhs)`
    pub fn min(self, rhs: impl Into<Scalar>) -> Scalar {
        Scalar::binary(ScalarOp::Min, self, rhs.into())
    }
    /// `max(self, rhs)`
    pub fn max(self, rhs: impl Into<Scalar>) -> Scalar {
        Scalar::binary(ScalarOp::Max, self, rhs.into())
    }
    /// `ceilDiv(self, rhs)`
    pub fn ceil_div(self, rhs: impl Into<Scalar>) -> Scalar {
        Scalar::binary(ScalarOp::CeilDiv, self, rhs.into())
    }

    /// Evaluates with `lookup` giving the value of each symbol by name (a built-in's is
    /// [`Builtin::name`]). `None` when a symbol is unbound, on division by zero, or on
    /// overflow.
    pub fn eval(&self, lookup: &dyn Fn(&str) -> Option<i64>) -> Option<i64> {
        match self {
            Scalar::Const(v) => Some(*v),
            Scalar::Named(n) => lookup(n),
            Scalar::Builtin(b) => lookup(b.name()),
            Scalar::Binary(op, a, b) => fold(*op, a.eval(lookup)?, b.eval(lookup)?),
        }
    }

    /// Replaces every named symbol for which `lookup` answers by that value, re-simplifying.
    pub fn substitute(&self, lookup: &dyn Fn(&str) -> Option<Scalar>) -> Scalar {
        match self {
            Scalar::Const(_) => self.clone(),
            Scalar::Named(n) => lookup(n).unwrap_or_else(|| self.clone()),
            Scalar::Builtin(b) => lookup(b.name()).unwrap_or_else(|| self.clone()),
            Scalar::Binary(op, a, b) => {
                Scalar::binary(*op, a.substitute(lookup), b.substitute(lookup))
            }
        }
    }

    /// The named symbols this expression mentions, in first-occurrence order.
    pub fn symbols(&self) -> Vec<Arc<str>> {
        let mut out: Vec<Arc<str>> = Vec::new();
        self.collect_symbols(&mut out);
        out
    }

    fn collect_symbols(&self, out: &mut Vec<Arc<str>>) {
        match self {
            Scalar::Const(_) => {}
            Scalar::Named(n) => {
                if !out.iter().any(|o| o == n) {
                    out.push(n.clone());
                }
            }
            Scalar::Builtin(b) => {
                if !out.iter().any(|o| &**o == b.name()) {
                    out.push(Arc::from(b.name()));
                }
            }
            Scalar::Binary(_, a, b) => {
                a.collect_symbols(out);
                b.collect_symbols(out);
            }
        }
    }

    /// Formats in `.weave` source syntax: infix with minimal parentheses, `ceilDiv(a, b)`.
    pub fn to_source(&self) -> String {
        self.to_source_with(&|v| v.to_string())
    }

    /// [`Scalar::to_source`], spelling each constant with `constant`.
    pub(crate) fn to_source_with(&self, constant: &dyn Fn(i64) -> String) -> String {
        let mut s = String::new();
        self.write_source(&mut s, 0, constant);
        s
    }

    fn write_source(&self, out: &mut String, parent_prec: u8, constant: &dyn Fn(i64) -> String) {
        match self {
            Scalar::Const(v) => out.push_str(&constant(*v)),
            Scalar::Named(n) => out.push_str(n),
            Scalar::Builtin(b) => out.push_str(b.name()),
            Scalar::Binary(op, a, b) if op.is_call() => {
                out.push_str(op.symbol());
                out.push('(');
                a.write_source(out, 0, constant);
                out.push_str(", ");
                b.write_source(out, 0, constant);
                out.push(')');
            }
            Scalar::Binary(op, a, b) => {
                let prec = op.precedence();
                let paren = prec < parent_prec;
                if paren {
                    out.push('(');
                }
                a.write_source(out, prec, constant);
                out.push(' ');
                out.push_str(op.symbol());
                out.push(' ');
                // Left-associative: the right operand needs parentheses at equal precedence.
                b.write_source(out, prec + 1, constant);
                if paren {
                    out.push(')');
                }
            }
        }
    }
}

macro_rules! forward_op {
    ($tr:ident, $m:ident, $op:ident) => {
        impl<T: Into<Scalar>> std::ops::$tr<T> for Scalar {
            type Output = Scalar;
            fn $m(self, rhs: T) -> Scalar {
                Scalar::binary(ScalarOp::$op, self, rhs.into())
            }
        }
    };
}
forward_op!(Add, add, Add);
forward_op!(Sub, sub, Sub);
forward_op!(Mul, mul, Mul);
forward_op!(Div, div, Div);
forward_op!(Rem, rem, Mod);

/// Seed-style printing: leaves bare, every operator wrapped as `( a * b )` or
/// `( ceilDiv(a, b) )`, exactly as nvFuser prints extents.
impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Const(v) => write!(f, "{v}"),
            Scalar::Named(n) => f.write_str(n),
            Scalar::Builtin(b) => f.write_str(b.name()),
            Scalar::Binary(op, a, b) if op.is_call() => write!(f, "( {}({a}, {b}) )", op.symbol()),
            Scalar::Binary(op, a, b) => write!(f, "( {a} {} {b} )", op.symbol()),
        }
    }
}

fn fold(op: ScalarOp, a: i64, b: i64) -> Option<i64> {
    match op {
        ScalarOp::Add => a.checked_add(b),
        ScalarOp::Sub => a.checked_sub(b),
        ScalarOp::Mul => a.checked_mul(b),
        ScalarOp::Div => {
            // checked: `i64::MIN / -1` overflows.
            a.checked_div_euclid(b)
        }
        ScalarOp::Mod => {
            // checked: `i64::MIN % -1` overflows.
            a.checked_rem_euclid(b)
        }
        ScalarOp::CeilDiv => {
            if b <= 0 {
                None
            } else {
                Some(a.checked_add(b - 1)?.div_euclid(b))
            }
        }
        ScalarOp::Min => Some(a.min(b)),
        ScalarOp::Max => Some(a.max(b)),
    }
}

/// `(c * x)` split into its constant factor and the rest, when it has that shape.
fn const_factor(s: &Scalar) -> Option<(i64, &Scalar)> {
    match s {
        Scalar::Binary(ScalarOp::Mul, a, b) => a.as_const().map(|c| (c, b.as_ref())),
        _ => None,
    }
}

fn bin(op: ScalarOp, a: Scalar, b: Scalar) -> Scalar {
    Scalar::Binary(op, Box::new(a), Box::new(b))
}

fn simplify_binary(op: ScalarOp, a: Scalar, b: Scalar) -> Scalar {
    use ScalarOp::*;
    if let (Some(x), Some(y)) = (a.as_const(), b.as_const()) {
        if let Some(v) = fold(op, x, y) {
            return Scalar::Const(v);
        }
        return bin(op, a, b);
    }
    match op {
        Add => {
            if a.as_const() == Some(0) {
                return b;
            }
            if b.as_const() == Some(0) {
                return a;
            }
            // Constants to the right: `c + x` -> `x + c`; `(x + c1) + c2` -> `x + (c1 + c2)`.
            if a.as_const().is_some() {
                return simplify_binary(Add, b, a);
            }
            if let (Scalar::Binary(Add, x, c1), Some(c2)) = (&a, b.as_const()) {
                if let Some(c1) = c1.as_const() {
                    if let Some(sum) = c1.checked_add(c2) {
                        return simplify_binary(Add, (**x).clone(), Scalar::Const(sum));
                    }
                }
            }
            bin(Add, a, b)
        }
        Sub => {
            if b.as_const() == Some(0) {
                return a;
            }
            if a == b {
                return Scalar::Const(0);
            }
            bin(Sub, a, b)
        }
        Mul => {
            if a.as_const() == Some(0) || b.as_const() == Some(0) {
                return Scalar::Const(0);
            }
            if a.as_const() == Some(1) {
                return b;
            }
            if b.as_const() == Some(1) {
                return a;
            }
            // Constants to the left: `x * c` -> `c * x`; `c1 * (c2 * x)` -> `(c1 * c2) * x`.
            if b.as_const().is_some() {
                return simplify_binary(Mul, b, a);
            }
            if let Some(c1) = a.as_const() {
                if let Some((c2, x)) = const_factor(&b) {
                    if let Some(p) = c1.checked_mul(c2) {
                        return simplify_binary(Mul, Scalar::Const(p), x.clone());
                    }
                }
            }
            bin(Mul, a, b)
        }
        Div | CeilDiv => {
            if b.as_const() == Some(1) {
                return a;
            }
            if a == b {
                return Scalar::Const(1);
            }
            if a.as_const() == Some(0) {
                return Scalar::Const(0);
            }
            if let (Some((c1, x)), Some(c2)) = (const_factor(&a), b.as_const()) {
                if c2 > 0 && c1 % c2 == 0 {
                    return simplify_binary(Mul, Scalar::Const(c1 / c2), x.clone());
                }
            }
            if let Scalar::Binary(Mul, x, y) = &a {
                if **y == b {
                    return (**x).clone();
                }
                if **x == b {
                    return (**y).clone();
                }
            }
            // Nested divisions by positive constants fold: ceil(ceil(x / a) / b) =
            // ceil(x / (a * b)), and the same for floor.
            if let (Scalar::Binary(inner, x, c1), Some(c2)) = (&a, b.as_const()) {
                if *inner == op {
                    if let Some(c1) = c1.as_const() {
                        if c1 > 0 && c2 > 0 {
                            if let Some(p) = c1.checked_mul(c2) {
                                return simplify_binary(op, (**x).clone(), Scalar::Const(p));
                            }
                        }
                    }
                }
            }
            bin(op, a, b)
        }
        Min | Max => {
            if a == b {
                return a;
            }
            bin(op, a, b)
        }
        Mod => {
            if b.as_const() == Some(1) || a == b {
                return Scalar::Const(0);
            }
            if let (Some((c1, _)), Some(c2)) = (const_factor(&a), b.as_const()) {
                if c2 > 0 && c1 % c2 == 0 {
                    return Scalar::Const(0);
                }
            }
            if let Scalar::Binary(Mul, x, y) = &a {
                if **y == b || **x == b {
                    return Scalar::Const(0);
                }
            }
            bin(Mod, a, b)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> Scalar {
        Scalar::named(s)
    }

    #[test]
    fn folds_and_prints_like_the_seeds() {
        assert_eq!(Scalar::c(7).ceil_div(3), Scalar::c(3));
        assert_eq!(n("i0").ceil_div(3).to_string(), "( ceilDiv(i0, 3) )");
        assert_eq!(
            n("i0").ceil_div(3).mul(12).to_string(),
            "( 12 * ( ceilDiv(i0, 3) ) )"
        );
        assert_eq!(n("h").mul(4).ceil_div(2), n("h").mul(2));
        assert_eq!(n("h").mul(4).div(n("h")), Scalar::c(4));
        assert_eq!(n("t").mul(n("s")).div(n("s")), n("t"));
        assert_eq!(n("t").add(0).mul(1), n("t"));
        assert_eq!(Scalar::c(2).mul(n("h").mul(3)), n("h").mul(6));
        assert_eq!(n("t").ceil_div(4).ceil_div(2), n("t").ceil_div(8));
        assert_eq!(n("t").div(4).div(2), n("t").div(8));
        // min and max fold, print as calls, and collapse equal operands.
        assert_eq!(Scalar::c(3).max(5), Scalar::c(5));
        assert_eq!(Scalar::c(3).min(5), Scalar::c(3));
        assert_eq!(Scalar::c(-4).max(0), Scalar::c(0));
        assert_eq!(n("k").max(2).to_string(), "( max(k, 2) )");
        assert_eq!(n("k").max(2).to_source(), "max(k, 2)");
        assert_eq!(n("k").max(n("k")), n("k"));
        assert_eq!(
            n("s")
                .min(n("k").max(2))
                .eval(&|v| (v == "k").then_some(1).or(Some(4))),
            Some(2)
        );
    }

    #[test]
    fn source_form_uses_minimal_parentheses() {
        let e = n("t").add(1).mul(n("h"));
        assert_eq!(e.to_source(), "(t + 1) * h");
        assert_eq!(n("a").sub(n("b").sub(n("c"))).to_source(), "a - (b - c)");
        assert_eq!(n("t").ceil_div(n("s")).to_source(), "ceilDiv(t, s)");
    }

    #[test]
    fn built_in_names_are_typed_and_print_and_evaluate_by_name() {
        for b in Builtin::ALL {
            let s = Scalar::named(b.name());
            assert_eq!(s, Scalar::Builtin(b), "{}", b.name());
            assert_eq!(Builtin::from_name(b.name()), Some(b));
            assert!(RESERVED_NAMES.contains(&b.name()));
            let e = s.clone().add(n("t"));
            assert!(e.mentions(b));
            assert_eq!(e.to_source(), format!("{} + t", b.name()));
            assert_eq!(e.symbols(), vec![Arc::from(b.name()), Arc::from("t")]);
            let lookup = |x: &str| match x {
                "t" => Some(10),
                _ if x == b.name() => Some(3),
                _ => None,
            };
            assert_eq!(e.eval(&lookup), Some(13));
            assert_eq!(e.substitute(&|_| None), e);
        }
        // A parameter is not a built-in, and mentions none.
        assert_eq!(Builtin::from_name("ranks"), None);
        let p = n("ranks");
        assert!(matches!(p, Scalar::Named(_)));
        assert!(!p.mentions(Builtin::Rank));
        assert!(!n("rank").mentions(Builtin::NumberOfStreams));
    }

    #[test]
    fn eval_reports_unbound_symbols_and_division_by_zero() {
        let env = |s: &str| (s == "t").then_some(10);
        assert_eq!(n("t").ceil_div(3).eval(&env), Some(4));
        assert_eq!(n("u").eval(&env), None);
        assert_eq!(n("t").div(Scalar::c(0)).eval(&env), None);
    }
}
