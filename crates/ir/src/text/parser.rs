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
use crate::fusion::{Fusion, MeshSpec, ParamRole};
use crate::ids::{MeshId, TensorId};
use crate::scalar::{Scalar, ScalarOp};
use crate::tensor::{MemoryType, ScheduleOp, ScheduleStep};

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

    // ----- meshes and inputs ------------------------------------------------------------

    fn mesh_decl(&mut self) -> PResult<()> {
        self.bump();
        let (name, span) = self.expect_ident("a mesh name after `mesh`")?;
        self.expect_punct(Punct::Eq, &format!("after mesh name `{name}`"))?;
        let spec = if self.is_ident("devices") {
            self.bump();
            self.expect_punct(Punct::LParen, "after `devices`")?;
            let mut dims = vec![self.expr()?];
            if self.eat_punct(Punct::Comma).is_some() {
                dims.push(self.expr()?);
            }
            self.expect_punct(Punct::RParen, "to close `devices(...)`")?;
            let mut total: u64 = 1;
            for d in &dims {
                self.check_scalar(d)?;
                if let Some(v) = self.fusion.eval(&d.value) {
                    total = total.saturating_mul(v.max(1).unsigned_abs());
                }
            }
            if total > MAX_MESH_DEVICES {
                return Err(Diagnostic::at(
                    span,
                    format!(
                        "mesh `{name}` has too many devices (at most {MAX_MESH_DEVICES} are supported)"
                    ),
                ));
            }
            MeshSpec::Devices(dims.into_iter().map(|d| d.value).collect())
        } else if self.is_punct(Punct::LBracket) {
            self.device_list(&name)?
        } else {
            return Err(self.unexpected(&format!(
                "`devices(...)` or a device list `[...]` after `mesh {name} =`"
            )));
        };
        let id = self
            .fusion
            .add_mesh(&name, spec)
            .map_err(|d| d.or_at(Some(span)))?;
        self.fusion.mesh_mut(id).span = Some(span);
        Ok(())
    }

    /// `[0, 1, 2]` or `[[0, 1], [2, 3]]`, the opening `[` being current.
    fn device_list(&mut self, name: &str) -> PResult<MeshSpec> {
        self.bump();
        if !self.is_punct(Punct::LBracket) {
            let devices = self.device_ids()?;
            return Ok(MeshSpec::Explicit {
                shape: vec![devices.len()],
                devices,
            });
        }
        let mut rows: Vec<(Vec<i64>, Span)> = Vec::new();
        loop {
            let row_span =
                self.expect_punct(Punct::LBracket, "to start a row of the device list")?;
            rows.push((self.device_ids()?, row_span));
            if self.eat_punct(Punct::Comma).is_some() {
                continue;
            }
            if self.eat_punct(Punct::RBracket).is_some() {
                break;
            }
            return Err(self.unexpected("`,` or `]` in the device list"));
        }
        let cols = rows.first().map_or(0, |r| r.0.len());
        for (i, (row, span)) in rows.iter().enumerate() {
            if row.len() != cols {
                return Err(Diagnostic::at(
                    *span,
                    format!(
                        "mesh `{name}`: row {i} has {} but row 0 has {}",
                        plural(row.len(), "device"),
                        plural(cols, "device")
                    ),
                ));
            }
        }
        let shape = vec![rows.len(), cols];
        let devices = rows.into_iter().flat_map(|r| r.0).collect();
        Ok(MeshSpec::Explicit { shape, devices })
    }

    /// `INT { ',' INT } ']'` (the `[` already consumed).
    fn device_ids(&mut self) -> PResult<Vec<i64>> {
        let mut v = Vec::new();
        loop {
            v.push(self.expect_int("a device id (a non-negative integer)")?.0);
            if self.eat_punct(Punct::Comma).is_some() {
                continue;
            }
            if self.eat_punct(Punct::RBracket).is_some() {
                return Ok(v);
            }
            return Err(self.unexpected("`,` or `]` in the device list"));
        }
    }

    fn tensor_decl(&mut self) -> PResult<()> {
        self.bump();
        let (name, span) = self.expect_ident("a tensor name after `tensor`")?;
        self.check_new_tensor_name(&name, span)?;
        self.expect_punct(Punct::Colon, &format!("after tensor name `{name}`"))?;
        let dtype = self.dtype()?;
        self.expect_punct(Punct::LBracket, &format!("to start the shape of `{name}`"))?;
        let mut extents = Vec::new();
        if self.eat_punct(Punct::RBracket).is_none() {
            loop {
                let e = self.expr()?;
                self.check_scalar(&e)?;
                self.check_positive(&e, || {
                    format!("tensor `{name}` axis {}: extent", extents.len())
                })?;
                extents.push(e.value);
                if self.eat_punct(Punct::Comma).is_some() {
                    continue;
                }
                if self.eat_punct(Punct::RBracket).is_some() {
                    break;
                }
                return Err(self.unexpected(&format!("`,` or `]` in the shape of `{name}`")));
            }
        }
        let mesh = if self.is_ident("on") {
            self.bump();
            let (m, mspan) = self.expect_ident("a mesh name after `on`")?;
            Some(self.mesh_named(&m, mspan)?)
        } else {
            None
        };
        let draw = if self.is_ident("drawn") {
            self.bump();
            Some(self.draw(&name, dtype)?)
        } else {
            None
        };
        let t = self
            .fusion
            .add_input(&name, dtype, extents, mesh)
            .map_err(|d| d.or_at(Some(span)))?;
        self.fusion.tensor_mut(t).span = Some(span);
        if let Some(draw) = draw {
            self.fusion.set_draw(t, draw);
        }
        Ok(())
    }

    /// `uniform(lo, hi)` or `const(v)` after `drawn` (numbers, optionally negative): how the
    /// generated values of input `name` are drawn.
    fn draw(&mut self, name: &str, dtype: DType) -> PResult<crate::fusion::Draw> {
        use crate::fusion::Draw;
        let what = format!("`uniform(lo, hi)` or `const(v)` after `drawn` for `{name}`");
        let (kind, kspan) = self.expect_ident(&what)?;
        if kind != "uniform" && kind != "const" {
            return Err(Diagnostic::at(kspan, format!(
                "unknown draw `{kind}` for `{name}`: expected `uniform(lo, hi)` (uniform in [lo, hi)) or `const(v)`"
            )));
        }
        self.expect_punct(Punct::LParen, &format!("after `{kind}`"))?;
        let mut values = Vec::new();
        loop {
            let start = self.peek().span;
            let negative = self.eat_punct(Punct::Minus).is_some();
            let v = match self.peek().tok.clone() {
                Tok::Int(t) | Tok::Float(t) => t.parse::<f64>().ok(),
                _ => None,
            };
            let Some(v) = v else {
                return Err(self.unexpected(&format!("a number in `{kind}(…)`")));
            };
            self.bump();
            let v = if negative { -v } else { v };
            if !v.is_finite() {
                return Err(Diagnostic::at(
                    start,
                    format!("`{kind}` of `{name}` needs finite numbers"),
                ));
            }
            values.push(v);
            if self.eat_punct(Punct::Comma).is_some() {
                continue;
            }
            self.expect_punct(Punct::RParen, &format!("to close `{kind}(`"))?;
            break;
        }
        let draw = match (kind.as_str(), values.as_slice()) {
            ("uniform", &[lo, hi]) if lo < hi => Draw::Uniform(lo, hi),
            ("uniform", &[lo, hi]) => {
                return Err(Diagnostic::at(
                    kspan,
                    format!("`uniform({lo}, {hi})` of `{name}` is empty: lo must be below hi"),
                ))
            }
            ("const", &[v]) => Draw::Const(v),
            _ => {
                return Err(Diagnostic::at(
                    kspan,
                    format!(
                        "`{kind}` of `{name}` takes {} number(s), got {}",
                        if kind == "uniform" { 2 } else { 1 },
                        values.len()
                    ),
                ))
            }
        };
        if matches!(dtype, DType::Bool) {
            return Err(Diagnostic::at(
                kspan,
                format!("`{name}` is bool: its values are drawn 0 or 1, not from `{kind}`"),
            ));
        }
        Ok(draw)
    }

    // ----- ops and outputs --------------------------------------------------------------

    fn op_stmt(&mut self) -> PResult<()> {
        let (name, span) = self.expect_ident("a tensor name")?;
        self.expect_punct(Punct::Eq, &format!("after `{name}`"))?;
        self.check_new_tensor_name(&name, span)?;
        let what = format!("an op call or a tensor expression after `{name} =`");
        if !self.starts_value() {
            return Err(self.unexpected(&what));
        }
        let mut st = ExprState::default();
        let e = self.vsum(&mut st)?;
        self.build(&e, &name, Some(span))?;
        Ok(())
    }

    /// Whether the current token can start a tensor expression.
    fn starts_value(&self) -> bool {
        matches!(
            self.peek().tok,
            Tok::Ident(_)
                | Tok::Int(_)
                | Tok::Float(_)
                | Tok::Punct(Punct::LParen)
                | Tok::Punct(Punct::Minus)
        )
    }

    /// `vterm { ('+' | '-') vterm }`
    fn vsum(&mut self, st: &mut ExprState) -> PResult<VExpr> {
        let mut acc = self.vterm(st)?;
        loop {
            let op = match self.peek().tok {
                Tok::Punct(Punct::Plus) => BinaryOp::Add,
                Tok::Punct(Punct::Minus) => BinaryOp::Sub,
                _ => return Ok(acc),
            };
            let span = self.bump().span;
            self.count_op(st, span)?;
            let rhs = self.vterm(st)?;
            acc = VExpr::Bin(op, Box::new(acc), Box::new(rhs), span);
        }
    }

    /// `vunary { ('*' | '/') vunary }`
    fn vterm(&mut self, st: &mut ExprState) -> PResult<VExpr> {
        let mut acc = self.vunary(st)?;
        loop {
            let op = match self.peek().tok {
                Tok::Punct(Punct::Star) => BinaryOp::Mul,
                Tok::Punct(Punct::Slash) => BinaryOp::Div,
                _ => return Ok(acc),
            };
            let span = self.bump().span;
            self.count_op(st, span)?;
            let rhs = self.vunary(st)?;
            acc = VExpr::Bin(op, Box::new(acc), Box::new(rhs), span);
        }
    }

    /// `'-' vunary | vatom`
    fn vunary(&mut self, st: &mut ExprState) -> PResult<VExpr> {
        if let Some(span) = self.eat_punct(Punct::Minus) {
            self.enter(st, span)?;
            self.count_op(st, span)?;
            let x = self.vunary(st)?;
            st.depth -= 1;
            return Ok(VExpr::Neg(Box::new(x), span));
        }
        self.vatom(st)
    }

    /// `NUMBER | IDENT | OP '(' [ arg { ',' arg } ] ')' | '(' vsum ')'`
    fn vatom(&mut self, st: &mut ExprState) -> PResult<VExpr> {
        let t = self.peek().clone();
        match t.tok {
            Tok::Int(s) | Tok::Float(s) => {
                self.bump();
                match s.parse::<f64>() {
                    Ok(v) if v.is_finite() => Ok(VExpr::Lit(v, t.span)),
                    _ => Err(Diagnostic::at(
                        t.span,
                        format!("the literal `{s}` is out of the range of f64"),
                    )),
                }
            }
            Tok::Ident(op) if self.peek_at(1).tok == Tok::Punct(Punct::LParen) => {
                op_sig(&op).ok_or_else(|| {
                    Diagnostic::at(
                        t.span,
                        format!(
                            "unknown op `{op}` (expected one of: {})",
                            op_names().join(", ")
                        ),
                    )
                })?;
                self.enter(st, t.span)?;
                self.count_op(st, t.span)?;
                self.bump();
                self.bump();
                let args = self.call_args(&op, st)?;
                st.depth -= 1;
                Ok(VExpr::Call(op, t.span, args))
            }
            Tok::Ident(s) => {
                self.bump();
                Ok(VExpr::Name(s, t.span))
            }
            Tok::Punct(Punct::LParen) => {
                self.enter(st, t.span)?;
                self.bump();
                let e = self.vsum(st)?;
                self.expect_punct(Punct::RParen, "to close the parenthesized expression")?;
                st.depth -= 1;
                Ok(e)
            }
            _ => Err(self
                .unexpected("a tensor, a number, an op call or `(..)` in the tensor expression")),
        }
    }

    /// The arguments up to and including the closing `)` (the `(` already consumed).
    fn call_args(&mut self, op: &str, st: &mut ExprState) -> PResult<Vec<VExpr>> {
        let mut args = Vec::new();
        if self.eat_punct(Punct::RParen).is_some() {
            return Ok(args);
        }
        loop {
            let t = self.peek().clone();
            if t.tok == Tok::Punct(Punct::LBracket) {
                self.bump();
                let mut items = Vec::new();
                if self.eat_punct(Punct::RBracket).is_none() {
                    loop {
                        items.push(self.expr()?);
                        if self.eat_punct(Punct::Comma).is_some() {
                            continue;
                        }
                        if self.eat_punct(Punct::RBracket).is_some() {
                            break;
                        }
                        return Err(
                            self.unexpected(&format!("`,` or `]` in the list argument of `{op}`"))
                        );
                    }
                }
                args.push(VExpr::List(items, t.span));
            } else if self.starts_value() {
                args.push(self.vsum(st)?);
            } else {
                return Err(self.unexpected(&format!(
                    "an argument of `{op}` (a tensor name or a `[...]` list)"
                )));
            }
            if self.eat_punct(Punct::Comma).is_some() {
                continue;
            }
            self.expect_punct(
                Punct::RParen,
                &format!("to close the argument list of `{op}`"),
            )?;
            return Ok(args);
        }
    }

    /// A name for an intermediate result of the statement defining `stmt`: `stmt_1`,
    /// `stmt_2`, ..., skipping every identifier the source writes and every tensor name.
    fn fresh_name(&self, stmt: &str) -> String {
        (1..)
            .map(|k| format!("{stmt}_{k}"))
            .find(|n| {
                !self.written.contains(n)
                    && !self.fusion.has_builder_name(n)
                    && self.fusion.param(n).is_none()
            })
            .unwrap_or_default()
    }

    /// Adds the op `kind` over `inputs`, naming its output `out` (the statement's tensor) or a
    /// fresh name; errors point at `op_span`, which is also the expr's span.
    fn emit(
        &mut self,
        kind: ExprKind,
        inputs: &[TensorId],
        stmt: &str,
        out: Option<Span>,
        op_span: Span,
    ) -> PResult<TensorId> {
        let name = match out {
            Some(_) => stmt.to_string(),
            None => self.fresh_name(stmt),
        };
        let t = self
            .fusion
            .add_op(&name, kind, inputs)
            .map_err(|d| d.or_at(Some(op_span)))?;
        self.fusion.tensor_mut(t).span = Some(out.unwrap_or(op_span));
        if let Some(e) = self.fusion.tensor(t).definition {
            self.fusion.expr_mut(e).span = Some(op_span);
        }
        Ok(t)
    }

    /// The tensor `name` denotes, or the error at its span.
    fn tensor_value(&self, b: Built, span: Span) -> PResult<Option<TensorId>> {
        match b {
            Built::Tensor(t) => Ok(Some(t)),
            Built::Lit(_) => Ok(None),
            Built::Name(n) => self.tensor_named(&n, span).map(Some),
        }
    }

    /// Builds the ops of `e`. With `out` (the statement's name span), `e`'s own op defines
    /// the statement's tensor `stmt`; the ops inside it get fresh names.
    fn build(&mut self, e: &VExpr, stmt: &str, out: Option<Span>) -> PResult<Built> {
        let alone = |span: Span, what: &str| {
            Diagnostic::at(
                span,
                format!(
                    "`{stmt} = ...` must compute a tensor, and {what} (write an op: `{stmt} = set(x)` copies `x`, a literal takes the dtype of a tensor operand as in `mul(x, 0.5)`)"
                ),
            )
        };
        match e {
            VExpr::Name(n, span) => {
                if out.is_some() {
                    return Err(alone(*span, &format!("`{n}` alone computes nothing")));
                }
                Ok(match self.fusion.tensor_by_name(n) {
                    Some(t) => Built::Tensor(t),
                    None if n == "inf" => Built::Lit(f64::INFINITY),
                    None if n == "nan" => Built::Lit(f64::NAN),
                    None => Built::Name(n.clone()),
                })
            }
            VExpr::Lit(v, span) => {
                if out.is_some() {
                    return Err(alone(*span, "a literal alone has no dtype"));
                }
                Ok(Built::Lit(*v))
            }
            VExpr::List(_, span) => Err(Diagnostic::at(
                *span,
                "a `[...]` list is an argument of an op (axes, a shape), not a tensor",
            )),
            VExpr::Neg(x, span) => match self.build(x, stmt, None)? {
                Built::Lit(v) => {
                    if out.is_some() {
                        return Err(alone(*span, "a literal alone has no dtype"));
                    }
                    Ok(Built::Lit(-v))
                }
                b => {
                    let t = self.tensor_value(b, x.start())?;
                    let t = t.ok_or_else(|| Diagnostic::at(x.start(), "expected a tensor"))?;
                    self.emit(ExprKind::Unary(UnaryOp::Neg), &[t], stmt, out, *span)
                        .map(Built::Tensor)
                }
            },
            VExpr::Bin(op, a, b, span) => {
                let ba = self.build(a, stmt, None)?;
                let la = if let Built::Lit(v) = ba {
                    Some(v)
                } else {
                    None
                };
                let ta = self.tensor_value(ba, a.start())?;
                let bb = self.build(b, stmt, None)?;
                let lb = if let Built::Lit(v) = bb {
                    Some(v)
                } else {
                    None
                };
                let tb = self.tensor_value(bb, b.start())?;
                let (kind, inputs) = match (ta, tb) {
                    (Some(x), Some(y)) => (ExprKind::Binary(*op), vec![x, y]),
                    (Some(x), None) => (
                        ExprKind::BinaryLit {
                            op: *op,
                            lit: Literal(lb.unwrap_or_default()),
                            lit_first: false,
                        },
                        vec![x],
                    ),
                    (None, Some(y)) => (
                        ExprKind::BinaryLit {
                            op: *op,
                            lit: Literal(la.unwrap_or_default()),
                            lit_first: true,
                        },
                        vec![y],
                    ),
                    (None, None) => {
                        if out.is_some() {
                            return Err(alone(*span, "arithmetic on literals alone has no dtype"));
                        }
                        let (x, y) = (la.unwrap_or_default(), lb.unwrap_or_default());
                        return Ok(Built::Lit(match op {
                            BinaryOp::Add => x + y,
                            BinaryOp::Sub => x - y,
                            BinaryOp::Mul => x * y,
                            _ => x / y,
                        }));
                    }
                };
                self.emit(kind, &inputs, stmt, out, *span)
                    .map(Built::Tensor)
            }
            VExpr::Call(op, op_span, args)
                if matches!(op.as_str(), "iota" | "slice" | "concat" | "index_select") =>
            {
                let (kind, inputs) = self.indexed_op(op, *op_span, args, stmt)?;
                self.emit(kind, &inputs, stmt, out, *op_span)
                    .map(Built::Tensor)
            }
            VExpr::Call(op, op_span, args) => {
                let sig = op_sig(op)
                    .ok_or_else(|| Diagnostic::at(*op_span, format!("unknown op `{op}`")))?;
                let mut built = Vec::with_capacity(args.len());
                for a in args {
                    let span = a.start();
                    built.push(match a {
                        VExpr::List(items, span) => Arg::List(
                            items
                                .iter()
                                .map(|p| ParsedExpr {
                                    value: p.value.clone(),
                                    span: p.span,
                                    idents: p.idents.clone(),
                                })
                                .collect(),
                            *span,
                        ),
                        _ => match self.build(a, stmt, None)? {
                            Built::Tensor(t) => Arg::Name(self.fusion.tensor(t).name.clone(), span),
                            Built::Lit(v) => Arg::Lit(v, span),
                            Built::Name(n) => Arg::Name(n, span),
                        },
                    });
                }
                // `var(x, axes, correction)`: an optional third argument, a non-negative
                // integer literal (the divisor of the squared deviations is `n - correction`).
                let mut correction = 0u64;
                if op == "var" {
                    if built.len() > 3 {
                        return Err(Diagnostic::at(
                            *op_span,
                            format!(
                                "`var` takes a tensor, an axis list and an optional correction, e.g. `var(a, [1])` or `var(a, [1], 1)`, got {} arguments",
                                built.len()
                            ),
                        ));
                    }
                    if built.len() == 3 {
                        let arg = built.pop().expect("three arguments");
                        correction = match arg {
                            Arg::Lit(v, _)
                                if v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v < 1e15 =>
                            {
                                v as u64
                            }
                            other => {
                                return Err(Diagnostic::at(
                                    other.span(),
                                    format!(
                                        "`var`: the correction must be a non-negative integer (`var(a, [1], 1)` divides by n - 1, the sample variance), found {}",
                                        other.describe()
                                    ),
                                ))
                            }
                        };
                    }
                }
                let (kind, inputs) = self.resolve(op, *op_span, sig, built)?;
                if op == "mean" {
                    // `mean(x, axes)` is `sum(x, axes) / n`, `n` the elements each sum adds.
                    let ExprKind::Reduction { axes, .. } = &kind else {
                        unreachable!("mean resolves as a sum")
                    };
                    let n = self
                        .fusion
                        .reduced_count(inputs[0], axes)
                        .map_err(|d| d.or_at(Some(*op_span)))?;
                    let s = self.emit(kind, &inputs, stmt, None, *op_span)?;
                    let div = ExprKind::BinaryLit {
                        op: BinaryOp::Div,
                        lit: Literal(n),
                        lit_first: false,
                    };
                    return self.emit(div, &[s], stmt, out, *op_span).map(Built::Tensor);
                }
                if op == "var" {
                    // Two passes: `m = sum(x, axes) / n`, then `sum((x - m)^2, axes) / (n - correction)`.
                    let ExprKind::Reduction { axes, .. } = &kind else {
                        unreachable!("var resolves as a sum")
                    };
                    let axes = axes.clone();
                    let x = inputs[0];
                    let n = self.fusion.reduced_count(x, &axes).map_err(|d| {
                        Diagnostic::new(d.message.replacen("mean:", "var:", 1))
                            .or_at(Some(*op_span))
                    })?;
                    let divisor = self
                        .fusion
                        .var_divisor(x, &axes, n, correction)
                        .map_err(|d| d.or_at(Some(*op_span)))?;
                    let div = ExprKind::BinaryLit {
                        op: BinaryOp::Div,
                        lit: Literal(n),
                        lit_first: false,
                    };
                    let s = self.emit(kind, &inputs, stmt, None, *op_span)?;
                    let m = self.emit(div, &[s], stmt, None, *op_span)?;
                    let b = ExprKind::Broadcast { axes: axes.clone() };
                    let mb = self.emit(b, &[m], stmt, None, *op_span)?;
                    let sub = ExprKind::Binary(BinaryOp::Sub);
                    let d = self.emit(sub, &[x, mb], stmt, None, *op_span)?;
                    let mul = ExprKind::Binary(BinaryOp::Mul);
                    let sq = self.emit(mul, &[d, d], stmt, None, *op_span)?;
                    let red = ExprKind::Reduction {
                        op: ReduceOp::Sum,
                        axes,
                    };
                    let s2 = self.emit(red, &[sq], stmt, None, *op_span)?;
                    let div = ExprKind::BinaryLit {
                        op: BinaryOp::Div,
                        lit: Literal(divisor),
                        lit_first: false,
                    };
                    return self
                        .emit(div, &[s2], stmt, out, *op_span)
                        .map(Built::Tensor);
                }
                self.emit(kind, &inputs, stmt, out, *op_span)
                    .map(Built::Tensor)
            }
        }
    }

    /// `iota(a, axis)`, `slice(a, axis, start, stop)`, `concat(a, b, axis)` and
    /// `index_select(table, ids, axis [, base])`: tensor operands (any tensor expression), an
    /// axis number, and sizes (integers, parameters and `+ - * /` on them; an index_select's
    /// base row, which only a vocabulary-parallel lookup's partial carries, may also use
    /// the built-in `rank`).
    fn indexed_op(
        &mut self,
        op: &str,
        op_span: Span,
        args: &[VExpr],
        stmt: &str,
    ) -> PResult<(ExprKind, Vec<TensorId>)> {
        let (usage, tensors) = match op {
            "iota" => ("`iota` takes a tensor and an axis, e.g. `iota(s, 0)`", 1),
            "slice" => (
                "`slice` takes a tensor, an axis, a start and a stop, e.g. `slice(w, 0, h, 2 * h)`",
                1,
            ),
            "index_select" => (
                "`index_select` takes a table, i64 ids and the table's axis they index, e.g. `index_select(table, ids, 0)`",
                2,
            ),
            _ => (
                "`concat` takes two tensors and an axis, e.g. `concat(a, b, 0)`",
                2,
            ),
        };
        let want = if op == "slice" { 4 } else { tensors + 1 };
        // A lookup's per-device partial prints its base row as a fourth argument.
        let fits = args.len() == want || (op == "index_select" && args.len() == want + 1);
        if !fits {
            return Err(Diagnostic::at(
                op_span,
                format!("{usage}; got {} arguments", args.len()),
            ));
        }
        let mut inputs = Vec::new();
        for (i, a) in args[..tensors].iter().enumerate() {
            let span = a.start();
            let arg = match self.build(a, stmt, None)? {
                Built::Tensor(t) => Arg::Name(self.fusion.tensor(t).name.clone(), span),
                Built::Lit(v) => Arg::Lit(v, span),
                Built::Name(n) => Arg::Name(n, span),
            };
            inputs.push(self.operand(op, i, &arg)?);
        }
        let axis_arg = &args[tensors];
        let axis = match axis_arg {
            VExpr::Lit(v, _) if *v >= 0.0 && v.fract() == 0.0 && *v < 1e9 => *v as usize,
            other => {
                return Err(Diagnostic::at(
                    other.start(),
                    format!(
                    "`{op}`: argument {} must be an axis number (a non-negative integer); {usage}",
                    tensors + 1
                ),
                ))
            }
        };
        let kind = match op {
            "iota" => ExprKind::Iota { axis },
            "concat" => ExprKind::Concat { axis },
            "index_select" => ExprKind::IndexSelect {
                axis,
                base: match args.get(3) {
                    Some(b) => Some(self.size_arg(op, b)?),
                    None => None,
                },
            },
            _ => ExprKind::Slice {
                axis,
                start: self.size_arg(op, &args[2])?,
                stop: self.size_arg(op, &args[3])?,
            },
        };
        Ok((kind, inputs))
    }

    /// A size argument written as a tensor expression: an integer, a parameter, or `+ - * /`
    /// and unary `-` on them.
    fn size_arg(&self, op: &str, e: &VExpr) -> PResult<Scalar> {
        Ok(match e {
            VExpr::Lit(v, s) => {
                if v.fract() != 0.0 || !v.is_finite() || v.abs() > 9.0e15 {
                    return Err(Diagnostic::at(
                        *s,
                        format!(
                            "`{op}`: a size is an integer, not `{}`",
                            Literal(*v).to_source()
                        ),
                    ));
                }
                Scalar::c(*v as i64)
            }
            VExpr::Name(n, _) if op == "index_select" && n == crate::scalar::RANK => {
                Scalar::named(n)
            }
            VExpr::Name(n, s) => {
                if self.fusion.param(n).is_none() {
                    return Err(Diagnostic::at(
                        *s,
                        format!("`{op}`: `{n}` is not a parameter (a size is an integer, a parameter or arithmetic on them)"),
                    ));
                }
                Scalar::named(n)
            }
            VExpr::Neg(x, _) => Scalar::c(0).sub(self.size_arg(op, x)?),
            VExpr::Bin(b, x, y, s) => {
                let (x, y) = (self.size_arg(op, x)?, self.size_arg(op, y)?);
                match b {
                    BinaryOp::Add => x.add(y),
                    BinaryOp::Sub => x.sub(y),
                    BinaryOp::Mul => x.mul(y),
                    BinaryOp::Div => x.div(y),
                    _ => return Err(Diagnostic::at(*s, format!("`{op}`: not a size operator"))),
                }
            }
            other => {
                return Err(Diagnostic::at(
                    other.start(),
                    format!(
                        "`{op}`: expected a size (an integer, a parameter or arithmetic on them)"
                    ),
                ))
            }
        })
    }

    fn operand(&self, op: &str, index: usize, arg: &Arg) -> PResult<TensorId> {
        match arg {
            Arg::Name(n, s) => self.tensor_named(n, *s),
            Arg::Lit(..) => Err(Diagnostic::at(
                arg.span(),
                format!(
                    "operand {} of `{op}` must be a tensor, found {}",
                    index + 1,
                    arg.describe()
                ),
            )),
            Arg::List(_, s) => Err(Diagnostic::at(
                *s,
                format!(
                    "operand {} of `{op}` must be a tensor, found a `[...]` list",
                    index + 1
                ),
            )),
        }
    }

    /// Checks an op's arguments against its signature and turns them into the builder's
    /// `ExprKind` and input tensors.
    fn resolve(
        &self,
        op: &str,
        op_span: Span,
        sig: Sig,
        args: Vec<Arg>,
    ) -> PResult<(ExprKind, Vec<TensorId>)> {
        let n = args.len();
        match sig {
            Sig::Tensors { kind, min, max } => {
                if n < min || n > max {
                    let want = if min == max {
                        plural(min, "tensor operand")
                    } else {
                        format!("{min} or {max} tensor operands")
                    };
                    return Err(Diagnostic::at(
                        op_span,
                        format!("`{op}` takes {want}, got {n}"),
                    ));
                }
                let lit = |a: &Arg| match a {
                    Arg::Lit(v, _) => Some(Literal(*v)),
                    _ => None,
                };
                let lits = args.iter().filter(|a| lit(a).is_some()).count();
                let kind = match (&kind, args.as_slice()) {
                    (_, _) if lits == 0 => kind,
                    (ExprKind::Binary(_), [a, b]) if lits == 2 => {
                        return Err(Diagnostic::at(
                            a.span().min(b.span()),
                            format!(
                                "`{op}` of two literals has no dtype: a literal takes the dtype of the other operand, which must be a tensor"
                            ),
                        ))
                    }
                    (ExprKind::Binary(b), [x, _]) => ExprKind::BinaryLit {
                        op: *b,
                        lit: lit(x).or(lit(&args[1])).unwrap_or(Literal(0.0)),
                        lit_first: lit(x).is_some(),
                    },
                    (ExprKind::Where, [c, a, b]) if lit(c).is_none() => ExprKind::WhereLit {
                        a: lit(a),
                        b: lit(b),
                    },
                    _ => kind,
                };
                let inputs = args
                    .iter()
                    .enumerate()
                    .filter(|(_, a)| {
                        !matches!(kind, ExprKind::BinaryLit { .. } | ExprKind::WhereLit { .. })
                            || lit(a).is_none()
                    })
                    .map(|(i, a)| self.operand(op, i, a))
                    .collect::<PResult<Vec<_>>>()?;
                Ok((kind, inputs))
            }
            Sig::Cast => {
                let [a, d] = two_args(
                    op_span,
                    "`cast` takes a tensor and a dtype, e.g. `cast(a, f32)`",
                    args,
                )?;
                let input = self.operand(op, 0, &a)?;
                let dtype = match &d {
                    Arg::Name(s, span) => dtype_named(s, *span)?,
                    Arg::List(_, span) | Arg::Lit(_, span) => {
                        return Err(Diagnostic::at(
                            *span,
                            format!(
                                "`cast` expects a dtype ({}) as its second argument, found {}",
                                dtype_names(),
                                d.describe()
                            ),
                        ))
                    }
                };
                Ok((ExprKind::Cast(dtype), vec![input]))
            }
            Sig::Axes(axis_op) => {
                let (what, example) = match axis_op {
                    AxisOp::Reduce(_) => ("an axis list", format!("{op}(a, [1])")),
                    AxisOp::Broadcast => {
                        ("a list of new axis positions", format!("{op}(a, [0, 2])"))
                    }
                    AxisOp::Squeeze => ("an axis list", format!("{op}(a, [0])")),
                    AxisOp::Permute => ("a permutation", format!("{op}(a, [1, 0])")),
                };
                let [a, l] = two_args(
                    op_span,
                    &format!("`{op}` takes a tensor and {what}, e.g. `{example}`"),
                    args,
                )?;
                let input = self.operand(op, 0, &a)?;
                let items = list_arg(op, what, &example, l)?;
                let mut axes = Vec::new();
                for e in &items {
                    let axis = e
                        .value
                        .as_const()
                        .filter(|_| e.idents.is_empty())
                        .and_then(|v| usize::try_from(v).ok());
                    match axis {
                        Some(v) => axes.push(v),
                        None => {
                            return Err(Diagnostic::at(
                                e.span,
                                format!(
                                    "`{op}`: `{}` is not an axis number (axes are non-negative integers)",
                                    e.value.to_source()
                                ),
                            ))
                        }
                    }
                }
                let kind = match axis_op {
                    AxisOp::Permute => ExprKind::Permute { perm: axes },
                    other => {
                        // Sorted for the builder; a repeated axis stays and is reported there.
                        axes.sort_unstable();
                        match other {
                            AxisOp::Reduce(r) => ExprKind::Reduction { op: r, axes },
                            AxisOp::Broadcast => ExprKind::Broadcast { axes },
                            _ => ExprKind::Squeeze { axes },
                        }
                    }
                };
                Ok((kind, vec![input]))
            }
            Sig::Reshape => {
                let example = "reshape(a, [t, 2, h])";
                let [a, l] = two_args(
                    op_span,
                    &format!("`reshape` takes a tensor and a shape, e.g. `{example}`"),
                    args,
                )?;
                let input = self.operand(op, 0, &a)?;
                let items = list_arg(op, "a shape", example, l)?;
                let mut shape = Vec::new();
                for e in items {
                    self.check_scalar(&e)?;
                    self.check_positive(&e, || "`reshape`: shape entry".to_string())?;
                    shape.push(e.value);
                }
                Ok((ExprKind::Reshape { shape }, vec![input]))
            }
        }
    }

    fn output_stmt(&mut self) -> PResult<()> {
        self.bump();
        let mut what = "a tensor name after `output`";
        loop {
            let (name, span) = self.expect_ident(what)?;
            let t = self.tensor_named(&name, span)?;
            self.fusion.add_output(t).map_err(|d| d.or_at(Some(span)))?;
            if self.eat_punct(Punct::Comma).is_none() {
                return Ok(());
            }
            what = "a tensor name after `,`";
        }
    }

    // ----- schedules --------------------------------------------------------------------

    fn schedule(&mut self) -> PResult<()> {
        self.bump();
        let (name, span) = self.expect_ident("a tensor name after `schedule`")?;
        let t = self.tensor_named(&name, span)?;
        let open = self.expect_punct(
            Punct::LBrace,
            &format!("to open the schedule block of `{name}`"),
        )?;
        let unterminated = || {
            Diagnostic::at(
                open,
                format!("unterminated schedule block for `{name}` (expected `}}`)"),
            )
        };
        loop {
            while matches!(self.peek().tok, Tok::Newline | Tok::Punct(Punct::Semi)) {
                self.bump();
            }
            match &self.peek().tok {
                Tok::Punct(Punct::RBrace) => {
                    self.bump();
                    return Ok(());
                }
                Tok::Eof => return Err(unterminated()),
                Tok::Ident(w) if self.starts_statement(w) => return Err(unterminated()),
                _ => {}
            }
            let step = self.step()?;
            self.fusion.tensor_mut(t).schedule.push(step);
            if !matches!(
                self.peek().tok,
                Tok::Newline | Tok::Eof | Tok::Punct(Punct::Semi | Punct::RBrace)
            ) {
                return Err(self.unexpected("`;`, a new line or `}` after a schedule step"));
            }
        }
    }

    /// True when the word at a step position is really the next statement (a schedule block
    /// missing its `}`).
    fn starts_statement(&self, word: &str) -> bool {
        let defines = self.peek_at(1).tok == Tok::Punct(Punct::Eq);
        match word {
            "output" | "tensor" | "schedule" => true,
            "mesh" => !defines,
            "outer_split" | "inner_split" | "merge" | "reorder" | "parallelize" | "swizzle1d"
            | "allocation" | "memory" => false,
            _ => defines,
        }
    }

    fn step(&mut self) -> PResult<ScheduleStep> {
        let (word, span) = self.expect_ident("a schedule step")?;
        let op = match word.as_str() {
            "outer_split" | "inner_split" => {
                self.expect_punct(Punct::LParen, &format!("after `{word}`"))?;
                let axis = self.expect_axis(&format!("an axis number in `{word}`"))?;
                self.expect_punct(Punct::Comma, &format!("after the axis of `{word}`"))?;
                let f = self.expr()?;
                self.check_scalar(&f)?;
                self.expect_punct(Punct::RParen, &format!("to close `{word}(...)`"))?;
                let parallel = if self.eat_punct(Punct::Arrow).is_some() {
                    Some(self.parallel_type()?)
                } else {
                    None
                };
                let factor = f.value;
                if word == "outer_split" {
                    ScheduleOp::OuterSplit {
                        axis,
                        factor,
                        parallel,
                    }
                } else {
                    ScheduleOp::InnerSplit {
                        axis,
                        factor,
                        parallel,
                    }
                }
            }
            "merge" => {
                self.expect_punct(Punct::LParen, "after `merge`")?;
                let outer = self.expect_axis("an axis number in `merge`")?;
                self.expect_punct(Punct::Comma, "between the axes of `merge`")?;
                let inner = self.expect_axis("an axis number in `merge`")?;
                self.expect_punct(Punct::RParen, "to close `merge(...)`")?;
                ScheduleOp::Merge { outer, inner }
            }
            "reorder" => {
                self.expect_punct(Punct::LParen, "after `reorder`")?;
                let mut moves = Vec::new();
                loop {
                    let from = self.expect_axis("an axis number in `reorder`")?;
                    self.expect_punct(Punct::Arrow, "in a `reorder` move `from -> to`")?;
                    let to = self.expect_axis("an axis number in `reorder`")?;
                    moves.push((from, to));
                    if self.eat_punct(Punct::Comma).is_none() {
                        break;
                    }
                }
                self.expect_punct(Punct::RParen, "to close `reorder(...)`")?;
                ScheduleOp::Reorder { moves }
            }
            "parallelize" => {
                self.expect_punct(Punct::LParen, "after `parallelize`")?;
                let axis = self.expect_axis("an axis number in `parallelize`")?;
                self.expect_punct(Punct::Comma, "after the axis of `parallelize`")?;
                let parallel = self.parallel_type()?;
                self.expect_punct(Punct::RParen, "to close `parallelize(...)`")?;
                ScheduleOp::Parallelize { axis, parallel }
            }
            "swizzle1d" => {
                self.expect_punct(Punct::LParen, "after `swizzle1d`")?;
                let axis = self.expect_axis("an axis number in `swizzle1d`")?;
                self.expect_punct(Punct::Comma, "after the axis of `swizzle1d`")?;
                let parallel = self.parallel_type()?;
                self.expect_punct(Punct::RParen, "to close `swizzle1d(...)`")?;
                ScheduleOp::Swizzle1d { axis, parallel }
            }
            "allocation" => {
                self.expect_punct(Punct::Eq, "after `allocation`")?;
                if !self.is_ident("loop") {
                    return Err(self.unexpected("`loop` after `allocation =`"));
                }
                self.bump();
                ScheduleOp::AllocationAsLoop
            }
            "mesh" => {
                self.expect_punct(Punct::Eq, "after `mesh`")?;
                let (m, mspan) = self.expect_ident("a mesh name after `mesh =`")?;
                ScheduleOp::SetMesh(self.mesh_named(&m, mspan)?)
            }
            "memory" => {
                self.expect_punct(Punct::Eq, "after `memory`")?;
                let (m, mspan) = self.expect_ident("a memory type (global, local or symmetric)")?;
                let mem = MemoryType::from_name(&m).ok_or_else(|| {
                    Diagnostic::at(
                        mspan,
                        format!("unknown memory type `{m}` (expected global, local or symmetric)"),
                    )
                })?;
                ScheduleOp::SetMemory(mem)
            }
            _ => {
                return Err(Diagnostic::at(
                    span,
                    format!("unknown schedule step `{word}` (expected one of {STEP_NAMES})"),
                ))
            }
        };
        Ok(ScheduleStep {
            op,
            span: Some(span),
        })
    }

    // ----- expressions ------------------------------------------------------------------

    fn expr(&mut self) -> PResult<ParsedExpr> {
        let span = self.peek().span;
        let mut st = ExprState::default();
        let value = self.sum(&mut st)?;
        Ok(ParsedExpr {
            value,
            span,
            idents: st.idents,
        })
    }

    fn count_op(&self, st: &mut ExprState, span: Span) -> PResult<()> {
        st.ops += 1;
        if st.ops > MAX_EXPR_OPS {
            return Err(Diagnostic::at(
                span,
                format!("expression is too long (more than {MAX_EXPR_OPS} operators)"),
            ));
        }
        Ok(())
    }

    fn enter(&self, st: &mut ExprState, span: Span) -> PResult<()> {
        st.depth += 1;
        if st.depth > MAX_EXPR_DEPTH {
            return Err(Diagnostic::at(
                span,
                format!("expression nesting is too deep (more than {MAX_EXPR_DEPTH} levels)"),
            ));
        }
        Ok(())
    }

    /// `term { ('+' | '-') term }`
    fn sum(&mut self, st: &mut ExprState) -> PResult<Scalar> {
        let mut acc = self.term(st)?;
        loop {
            let op = match self.peek().tok {
                Tok::Punct(Punct::Plus) => ScalarOp::Add,
                Tok::Punct(Punct::Minus) => ScalarOp::Sub,
                _ => return Ok(acc),
            };
            let span = self.bump().span;
            self.count_op(st, span)?;
            let rhs = self.term(st)?;
            acc = Scalar::binary(op, acc, rhs);
        }
    }

    /// `atom { ('*' | '/' | '%') atom }`
    fn term(&mut self, st: &mut ExprState) -> PResult<Scalar> {
        let mut acc = self.atom(st)?;
        loop {
            let op = match self.peek().tok {
                Tok::Punct(Punct::Star) => ScalarOp::Mul,
                Tok::Punct(Punct::Slash) => ScalarOp::Div,
                Tok::Punct(Punct::Percent) => ScalarOp::Mod,
                _ => return Ok(acc),
            };
            let span = self.bump().span;
            self.count_op(st, span)?;
            let rhs = self.atom(st)?;
            acc = Scalar::binary(op, acc, rhs);
        }
    }

    /// `INT | IDENT | 'ceilDiv' '(' expr ',' expr ')' | '(' expr ')'`
    fn atom(&mut self, st: &mut ExprState) -> PResult<Scalar> {
        let t = self.peek().clone();
        match t.tok {
            Tok::Int(s) => {
                self.bump();
                Ok(Scalar::c(int_value(&s, false, t.span)?))
            }
            Tok::Ident(s)
                if (s == "ceilDiv" || s == "min")
                    && self.peek_at(1).tok == Tok::Punct(Punct::LParen) =>
            {
                let op = if s == "min" {
                    ScalarOp::Min
                } else {
                    ScalarOp::CeilDiv
                };
                self.enter(st, t.span)?;
                self.count_op(st, t.span)?;
                self.bump();
                self.bump();
                let a = self.sum(st)?;
                self.expect_punct(Punct::Comma, &format!("between the arguments of `{s}`"))?;
                let b = self.sum(st)?;
                self.expect_punct(Punct::RParen, &format!("to close `{s}(...)`"))?;
                st.depth -= 1;
                Ok(Scalar::binary(op, a, b))
            }
            Tok::Ident(s) => {
                self.bump();
                let value = Scalar::named(&s);
                st.idents.push((s, t.span));
                Ok(value)
            }
            Tok::Punct(Punct::LParen) => {
                self.enter(st, t.span)?;
                self.bump();
                let e = self.sum(st)?;
                self.expect_punct(Punct::RParen, "to close the parenthesized expression")?;
                st.depth -= 1;
                Ok(e)
            }
            _ => Err(self.unexpected(
                "an expression (an integer, a parameter name, `ceilDiv(..)` or `(..)`)",
            )),
        }
    }

    /// Every parameter the expression names is declared and has a value, and the
    /// expression evaluates (no division by zero or overflow).
    fn check_scalar(&self, e: &ParsedExpr) -> PResult<()> {
        let is_param = |n: &str| self.fusion.param(n).is_some();
        if let Err(d) = self.fusion.check_symbols(&e.value) {
            let at = e
                .value
                .symbols()
                .into_iter()
                .find(|s| !is_param(s))
                .and_then(|s| e.idents.iter().find(|(n, _)| **n == *s))
                .map_or(e.span, |(_, sp)| *sp);
            return Err(d.or_at(Some(at)));
        }
        for (n, sp) in &e.idents {
            match self.fusion.param(n) {
                None => {
                    return Err(Diagnostic::at(*sp, format!("undefined parameter `{n}`")));
                }
                Some(p) if p.value.is_none() => {
                    return Err(Diagnostic::at(
                        *sp,
                        format!(
                            "parameter `{n}` has no value (give it a default in the header or pass --set {n}=VALUE)"
                        ),
                    ));
                }
                Some(_) => {}
            }
        }
        if self.fusion.eval(&e.value).is_none() {
            return Err(Diagnostic::at(
                e.span,
                format!(
                    "cannot evaluate `{}` (division by zero, a non-positive `ceilDiv` divisor, or overflow)",
                    e.value.to_source()
                ),
            ));
        }
        Ok(())
    }

    /// The expression (already [`Self::check_scalar`]ed) is positive.
    fn check_positive(&self, e: &ParsedExpr, what: impl FnOnce() -> String) -> PResult<()> {
        match self.fusion.eval(&e.value) {
            Some(v) if v <= 0 => Err(Diagnostic::at(
                e.span,
                format!(
                    "{} `{}` = {v} must be positive",
                    what(),
                    e.value.to_source()
                ),
            )),
            _ => Ok(()),
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
