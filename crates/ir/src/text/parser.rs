//! The `.weave` parser: tokens to a [`Fusion`] through the builder API. Every error is a
//! [`Diagnostic`] with the span of the offending token and an "expected ..., found ..." or
//! "unknown/undefined ..." message; the parser never panics and never recurses without bound.
//!
//! Span conventions:
//! * syntax errors point at the token where something else was expected;
//! * errors about a name (undefined tensor/mesh/parameter, duplicate name, unknown op, dtype,
//!   step or parallel type) point at that name;
//! * errors the builder reports for an op statement (arity, dtype, shape, axes) point at the
//!   **op name** (`linear` in `out = linear(inp, w)`); the expr's span is that token too;
//! * errors the builder reports for a declaration point at the declared name, which is also
//!   the span recorded on the tensor or mesh;
//! * an unterminated block points at the `{` that opened it;
//! * an unknown `--set` parameter points at the `fusion` keyword of the header.

use super::lexer::{lex, Punct, Tok, Token};
use crate::diag::{Diagnostic, Span};
use crate::domain::ParallelType;
use crate::dtype::DType;
use crate::expr::{BinaryOp, ExprKind, Literal, ReduceOp, UnaryOp};
use crate::fusion::{Fusion, ParamRole};
use crate::ids::{MeshId, TensorId};
use crate::scalar::Scalar;

mod build;
mod decls;
mod exprs;
mod ops;
mod schedules;

/// The deepest nesting of parentheses / `ceilDiv(..)` one expression may have.
pub(crate) const MAX_EXPR_DEPTH: usize = 64;
/// The most operators one expression may have (keeps every [`Scalar`] tree shallow).
pub(crate) const MAX_EXPR_OPS: usize = 256;
/// The most devices a `devices(..)` mesh may have.
pub(crate) const MAX_MESH_DEVICES: u64 = 1 << 16;

type PResult<T> = Result<T, Diagnostic>;

/// Returned by [`Parser::peek`] past the end; never reached because the token list always
/// ends with `Eof` or `Error` and the cursor stops there.
static EOF_TOKEN: Token = Token {
    tok: Tok::Eof,
    span: Span { line: 1, col: 1 },
};

const STEP_NAMES: &str =
    "outer_split, inner_split, merge, reorder, parallelize, swizzle1d, allocation, mesh, memory";

/// An expression with where it started and the parameter names it mentions.
struct ParsedExpr {
    value: Scalar,
    span: Span,
    idents: Vec<(String, Span)>,
}

/// Bookkeeping while one expression is parsed.
#[derive(Default)]
struct ExprState {
    depth: usize,
    ops: usize,
    idents: Vec<(String, Span)>,
}

/// One argument of an op call, once its tensor expression is built.
enum Arg {
    /// A name: a tensor, or cast's dtype.
    Name(String, Span),
    /// `[ expr, ... ]`.
    List(Vec<ParsedExpr>, Span),
    /// A number (`0.5`, `-1`, `inf`), which takes the dtype of the op's tensor operand.
    Lit(f64, Span),
}

impl Arg {
    fn span(&self) -> Span {
        match self {
            Arg::Name(_, s) | Arg::List(_, s) | Arg::Lit(_, s) => *s,
        }
    }

    fn describe(&self) -> String {
        match self {
            Arg::Name(n, _) => format!("`{n}`"),
            Arg::List(..) => "a `[...]` list".to_string(),
            Arg::Lit(v, _) => format!("the literal `{}`", Literal(*v).to_source()),
        }
    }
}

/// A tensor expression as written: the right-hand side of `NAME = ...` and each argument of
/// an op call (infix `+ - * /`, unary `-`, parentheses, op calls, names and numbers).
enum VExpr {
    /// A tensor, a dtype (cast's argument), or the literal `inf` / `nan` when no tensor has
    /// that name.
    Name(String, Span),
    /// A number.
    Lit(f64, Span),
    /// `[ expr, ... ]`: an axis list or a shape, only as an op's argument.
    List(Vec<ParsedExpr>, Span),
    /// `-x`, at the `-`.
    Neg(Box<VExpr>, Span),
    /// `a op b`, with the operator's span.
    Bin(BinaryOp, Box<VExpr>, Box<VExpr>, Span),
    /// `op(args)`, with the op name's span.
    Call(String, Span, Vec<VExpr>),
}

impl VExpr {
    /// Where the expression starts.
    fn start(&self) -> Span {
        match self {
            VExpr::Name(_, s)
            | VExpr::Lit(_, s)
            | VExpr::List(_, s)
            | VExpr::Neg(_, s)
            | VExpr::Call(_, s, _) => *s,
            VExpr::Bin(_, a, _, _) => a.start(),
        }
    }
}

/// A built tensor expression: a tensor, a literal, or a name that is not a tensor (a dtype
/// for `cast`, or an undefined tensor reported where it is used).
enum Built {
    Tensor(TensorId),
    Lit(f64),
    Name(String),
}

/// Ops that take a tensor and a `[...]` list of axis numbers.
#[derive(Clone, Copy)]
enum AxisOp {
    Reduce(ReduceOp),
    Broadcast,
    Squeeze,
    Permute,
}

/// How an op's arguments are read.
enum Sig {
    /// Only tensors, between `min` and `max` of them.
    Tensors {
        kind: ExprKind,
        min: usize,
        max: usize,
    },
    /// `cast(a, DTYPE)`.
    Cast,
    /// `op(a, [axes])`.
    Axes(AxisOp),
    /// `reshape(a, [exprs])`.
    Reshape,
}

fn op_sig(name: &str) -> Option<Sig> {
    let tensors = |kind, min, max| Sig::Tensors { kind, min, max };
    Some(match name {
        "set" => tensors(ExprKind::Set, 1, 1),
        "segment_set" => tensors(ExprKind::SegmentSet, 1, 1),
        "cast" => Sig::Cast,
        "where" => tensors(ExprKind::Where, 3, 3),
        "broadcast" => Sig::Axes(AxisOp::Broadcast),
        "squeeze" => Sig::Axes(AxisOp::Squeeze),
        "permute" => Sig::Axes(AxisOp::Permute),
        "reshape" => Sig::Reshape,
        "matmul" => tensors(ExprKind::Matmul, 2, 2),
        "linear" => tensors(ExprKind::Linear, 2, 3),
        // Axis and size arguments, read by `Parser::indexed_op`.
        "iota" => tensors(ExprKind::Iota { axis: 0 }, 1, 1),
        "slice" => tensors(
            ExprKind::Slice {
                axis: 0,
                start: Scalar::c(0),
                stop: Scalar::c(0),
            },
            1,
            1,
        ),
        "concat" => tensors(ExprKind::Concat { axis: 0 }, 2, 2),
        "index_select" => tensors(
            ExprKind::IndexSelect {
                axis: 0,
                base: None,
            },
            2,
            2,
        ),
        // A sum and a division by the number of elements it adds (see `Parser::build`).
        "mean" => Sig::Axes(AxisOp::Reduce(ReduceOp::Sum)),
        // The mean, then the mean of the squared deviations (see `Fusion::var_ops`).
        "var" => Sig::Axes(AxisOp::Reduce(ReduceOp::Sum)),
        _ => {
            if let Some(u) = UnaryOp::from_name(name) {
                tensors(ExprKind::Unary(u), 1, 1)
            } else if let Some(b) = BinaryOp::from_name(name) {
                tensors(ExprKind::Binary(b), 2, 2)
            } else {
                Sig::Axes(AxisOp::Reduce(ReduceOp::from_name(name)?))
            }
        }
    })
}

/// Every op name, in the order the "unknown op" message lists them.
pub(crate) fn op_names() -> Vec<&'static str> {
    let mut v = vec!["set", "segment_set", "cast"];
    v.extend(UnaryOp::ALL.iter().map(|u| u.name()));
    v.extend(BinaryOp::ALL.iter().map(|b| b.name()));
    v.push("where");
    v.extend(ReduceOp::ALL.iter().map(|r| r.name()));
    v.push("mean");
    v.push("var");
    v.extend([
        "broadcast",
        "squeeze",
        "permute",
        "reshape",
        "matmul",
        "linear",
        "iota",
        "slice",
        "concat",
        "index_select",
    ]);
    v
}

fn dtype_names() -> String {
    let v: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
    v.join(", ")
}

fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("{n} {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// Parses a whole `.weave` source; see [`super::parse`].
pub(crate) fn parse(source: &str, overrides: &[(String, i64)]) -> PResult<Fusion> {
    let toks = lex(source);
    let written = toks
        .iter()
        .filter_map(|t| match &t.tok {
            Tok::Ident(s) => Some(s.clone()),
            _ => None,
        })
        .collect();
    let mut p = Parser {
        toks,
        pos: 0,
        fusion: Fusion::new(""),
        written,
    };
    p.file(overrides)?;
    Ok(p.fusion)
}

struct Parser {
    toks: Vec<Token>,
    pos: usize,
    fusion: Fusion,
    /// Every identifier of the source: the names given to the intermediate results of a
    /// tensor expression avoid them, so that no later statement's name is taken.
    written: std::collections::HashSet<String>,
}

impl Parser {
    // ----- token access -----------------------------------------------------------------

    fn peek_at(&self, ahead: usize) -> &Token {
        let last = self.toks.len().saturating_sub(1);
        let i = self.pos.saturating_add(ahead).min(last);
        self.toks.get(i).unwrap_or(&EOF_TOKEN)
    }

    fn peek(&self) -> &Token {
        self.peek_at(0)
    }

    fn bump(&mut self) -> Token {
        let t = self.peek().clone();
        if self.pos + 1 < self.toks.len() {
            self.pos += 1;
        }
        t
    }

    fn is_punct(&self, p: Punct) -> bool {
        self.peek().tok == Tok::Punct(p)
    }

    fn is_ident(&self, word: &str) -> bool {
        matches!(&self.peek().tok, Tok::Ident(s) if s == word)
    }

    fn eat_punct(&mut self, p: Punct) -> Option<Span> {
        if self.is_punct(p) {
            Some(self.bump().span)
        } else {
            None
        }
    }

    fn skip_newlines(&mut self) {
        while self.peek().tok == Tok::Newline {
            self.bump();
        }
    }

    /// "expected {expected}, found {current token}" at the current token, or the lexer's
    /// message when the current token is a lexing error.
    fn unexpected(&self, expected: &str) -> Diagnostic {
        let t = self.peek();
        match &t.tok {
            Tok::Error(m) => Diagnostic::at(t.span, m.clone()),
            _ => Diagnostic::at(
                t.span,
                format!("expected {expected}, found {}", t.describe()),
            ),
        }
    }

    /// Consumes `p` or fails with "expected `p` {context}, found ...".
    fn expect_punct(&mut self, p: Punct, context: &str) -> PResult<Span> {
        match self.eat_punct(p) {
            Some(s) => Ok(s),
            None => Err(self.unexpected(&format!("`{}` {context}", p.text()))),
        }
    }

    /// Consumes an identifier or fails with "expected {what}, found ...".
    fn expect_ident(&mut self, what: &str) -> PResult<(String, Span)> {
        match &self.peek().tok {
            Tok::Ident(s) => {
                let s = s.clone();
                Ok((s, self.bump().span))
            }
            _ => Err(self.unexpected(what)),
        }
    }

    /// Consumes a non-negative integer literal.
    fn expect_int(&mut self, what: &str) -> PResult<(i64, Span)> {
        match &self.peek().tok {
            Tok::Int(s) => {
                let s = s.clone();
                let span = self.bump().span;
                Ok((int_value(&s, false, span)?, span))
            }
            _ => Err(self.unexpected(what)),
        }
    }

    /// Consumes an axis number (a non-negative integer literal).
    fn expect_axis(&mut self, what: &str) -> PResult<usize> {
        let (v, span) = self.expect_int(what)?;
        usize::try_from(v).map_err(|_| Diagnostic::at(span, format!("axis {v} is out of range")))
    }

    // ----- file and header --------------------------------------------------------------

    fn file(&mut self, overrides: &[(String, i64)]) -> PResult<()> {
        self.skip_newlines();
        let header = self.peek().span;
        if !self.is_ident("fusion") {
            return Err(self.unexpected("`fusion` at the start of the file"));
        }
        self.bump();
        let (name, _) = self.expect_ident("the fusion's name after `fusion`")?;
        self.fusion = Fusion::new(&name);
        self.expect_punct(Punct::LParen, &format!("after the fusion name `{name}`"))?;
        if self.eat_punct(Punct::RParen).is_none() {
            let mut what = "a parameter name or `)`".to_string();
            loop {
                let (p, pspan) = self.expect_ident(&what)?;
                let role = if self.eat_punct(Punct::Colon).is_some() {
                    let (word, wspan) =
                        self.expect_ident(&format!("a role (`mesh` or `chunks`) after `{p}:`"))?;
                    match ParamRole::from_keyword(&word) {
                        Some(r) => Some((r, wspan)),
                        None => {
                            return Err(Diagnostic::at(
                                wspan,
                                format!(
                                    "unknown parameter role `{word}` for `{p}` (expected `mesh` or `chunks`)"
                                ),
                            ))
                        }
                    }
                } else {
                    None
                };
                let default = if self.eat_punct(Punct::Eq).is_some() {
                    Some(self.signed_int(&format!("an integer default for parameter `{p}`"))?)
                } else {
                    None
                };
                self.fusion
                    .add_param(&p, default)
                    .map_err(|d| d.or_at(Some(pspan)))?;
                if let Some((r, wspan)) = role {
                    self.fusion
                        .set_param_role(&p, r)
                        .map_err(|d| d.or_at(Some(wspan)))?;
                }
                if self.eat_punct(Punct::Comma).is_some() {
                    what = "a parameter name after `,`".to_string();
                    continue;
                }
                if self.eat_punct(Punct::RParen).is_some() {
                    break;
                }
                return Err(self.unexpected(&format!("`,` or `)` after parameter `{p}`")));
            }
        }
        for (k, v) in overrides {
            self.fusion
                .set_param(k, *v)
                .map_err(|d| d.or_at(Some(header)))?;
        }
        let open = self.expect_punct(
            Punct::LBrace,
            &format!("to open the body of fusion `{name}`"),
        )?;
        loop {
            self.skip_newlines();
            match self.peek().tok {
                Tok::Punct(Punct::RBrace) => {
                    self.bump();
                    break;
                }
                Tok::Eof => {
                    return Err(Diagnostic::at(
                        open,
                        format!("unterminated body of fusion `{name}` (expected `}}`)"),
                    ))
                }
                _ => {
                    self.statement()?;
                    self.end_statement()?;
                }
            }
        }
        self.skip_newlines();
        if self.peek().tok != Tok::Eof {
            return Err(self.unexpected(&format!(
                "end of file after the closing `}}` of fusion `{name}`"
            )));
        }
        Ok(())
    }

    /// `['-'] INT`, for parameter defaults.
    fn signed_int(&mut self, what: &str) -> PResult<i64> {
        let neg = self.is_punct(Punct::Minus) && matches!(self.peek_at(1).tok, Tok::Int(_));
        if neg {
            self.bump();
        }
        match &self.peek().tok {
            Tok::Int(s) => {
                let s = s.clone();
                let span = self.bump().span;
                int_value(&s, neg, span)
            }
            _ => Err(self.unexpected(what)),
        }
    }

    /// After a statement: a newline, or the body's `}` / end of file (left for the caller).
    fn end_statement(&mut self) -> PResult<()> {
        match self.peek().tok {
            Tok::Newline => {
                self.bump();
                Ok(())
            }
            Tok::Punct(Punct::RBrace) | Tok::Eof => Ok(()),
            _ => Err(self.unexpected("end of line after the statement")),
        }
    }

    fn statement(&mut self) -> PResult<()> {
        let word = match &self.peek().tok {
            Tok::Ident(s) => s.clone(),
            _ => {
                return Err(self.unexpected(
                    "a statement (`mesh`, `tensor`, `output`, `schedule` or `NAME = op(...)`)",
                ))
            }
        };
        // Keywords are only special where the grammar expects them: `mesh = set(a)` defines
        // a tensor named `mesh`.
        let defines = self.peek_at(1).tok == Tok::Punct(Punct::Eq);
        match word.as_str() {
            "mesh" if !defines => self.mesh_decl(),
            "tensor" if !defines => self.tensor_decl(),
            "output" if !defines => self.output_stmt(),
            "schedule" if !defines => self.schedule(),
            _ => self.op_stmt(),
        }
    }

    // ----- names ------------------------------------------------------------------------

    fn tensor_named(&self, name: &str, span: Span) -> PResult<TensorId> {
        self.fusion
            .tensor_by_name(name)
            .ok_or_else(|| Diagnostic::at(span, format!("undefined tensor `{name}`")))
    }

    fn mesh_named(&self, name: &str, span: Span) -> PResult<MeshId> {
        self.fusion
            .mesh_by_name(name)
            .ok_or_else(|| Diagnostic::at(span, format!("undefined mesh `{name}`")))
    }

    /// The builder's name checks, reported at the name.
    fn check_new_tensor_name(&self, name: &str, span: Span) -> PResult<()> {
        if self.fusion.has_builder_name(name) {
            return Err(Diagnostic::at(
                span,
                format!("duplicate tensor name `{name}`"),
            ));
        }
        if self.fusion.param(name).is_some() {
            return Err(Diagnostic::at(
                span,
                format!("tensor name `{name}` is already a parameter"),
            ));
        }
        Ok(())
    }

    fn dtype(&mut self) -> PResult<DType> {
        match &self.peek().tok {
            Tok::Ident(s) => {
                let s = s.clone();
                let span = self.bump().span;
                dtype_named(&s, span)
            }
            _ => Err(self.unexpected(&format!("a dtype ({})", dtype_names()))),
        }
    }

    fn parallel_type(&mut self) -> PResult<ParallelType> {
        match &self.peek().tok {
            Tok::Ident(s) => {
                let s = s.clone();
                let span = self.bump().span;
                ParallelType::from_name(&s).ok_or_else(|| {
                    Diagnostic::at(
                        span,
                        format!(
                            "unknown parallel type `{s}` (expected DIDx, DIDy, Stream or Serial)"
                        ),
                    )
                })
            }
            _ => Err(self.unexpected("a parallel type (DIDx, DIDy, Stream or Serial)")),
        }
    }
}

/// The value of an integer literal (digits only), negated when `neg`.
fn int_value(digits: &str, neg: bool, span: Span) -> PResult<i64> {
    let v: Option<i128> = digits
        .parse::<i128>()
        .ok()
        .map(|v| if neg { -v } else { v });
    match v.and_then(|v| i64::try_from(v).ok()) {
        Some(v) => Ok(v),
        None if neg => Err(Diagnostic::at(
            span,
            format!(
                "integer `-{digits}` is too small (the smallest is {})",
                i64::MIN
            ),
        )),
        None => Err(Diagnostic::at(
            span,
            format!(
                "integer `{digits}` is too large (the largest is {})",
                i64::MAX
            ),
        )),
    }
}

fn dtype_named(s: &str, span: Span) -> PResult<DType> {
    DType::from_name(s).ok_or_else(|| {
        Diagnostic::at(
            span,
            format!("unknown dtype `{s}` (expected one of {})", dtype_names()),
        )
    })
}

/// Exactly two arguments, or "{usage}, got N argument(s)" at the op name.
fn two_args(op_span: Span, usage: &str, args: Vec<Arg>) -> PResult<[Arg; 2]> {
    let n = args.len();
    <[Arg; 2]>::try_from(args)
        .map_err(|_| Diagnostic::at(op_span, format!("{usage}, got {}", plural(n, "argument"))))
}

/// The items of a `[...]` argument, or an error at the argument.
fn list_arg(op: &str, what: &str, example: &str, arg: Arg) -> PResult<Vec<ParsedExpr>> {
    match arg {
        Arg::List(items, _) => Ok(items),
        other => Err(Diagnostic::at(
            other.span(),
            format!(
                "`{op}` expects {what} as its second argument, e.g. `{example}`, found {}",
                other.describe()
            ),
        )),
    }
}
