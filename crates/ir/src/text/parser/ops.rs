//! Parsing op statements and `output`: a tensor expression as written ([`VExpr`]: infix
//! operators, unary minus, calls, names, numbers) and the fresh names of its intermediate
//! results.

use super::{op_names, op_sig, Built, ExprState, PResult, Parser, VExpr};
use crate::diag::{Diagnostic, Span};
use crate::expr::{BinaryOp, ExprKind};
use crate::ids::TensorId;
use crate::text::lexer::{Punct, Tok};

impl Parser {
    pub(super) fn op_stmt(&mut self) -> PResult<()> {
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
        let ops = [(Punct::Plus, BinaryOp::Add), (Punct::Minus, BinaryOp::Sub)];
        self.left_chain(st, &ops, Self::vterm, vbin)
    }

    /// `vunary { ('*' | '/') vunary }`
    fn vterm(&mut self, st: &mut ExprState) -> PResult<VExpr> {
        let ops = [(Punct::Star, BinaryOp::Mul), (Punct::Slash, BinaryOp::Div)];
        self.left_chain(st, &ops, Self::vunary, vbin)
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
            Tok::Punct(Punct::LParen) => self.parenthesized(st, t.span, Self::vsum),
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
    pub(super) fn emit(
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
    pub(super) fn tensor_value(&self, b: Built, span: Span) -> PResult<Option<TensorId>> {
        match b {
            Built::Tensor(t) => Ok(Some(t)),
            Built::Lit(_) => Ok(None),
            Built::Name(n) => self.tensor_named(&n, span).map(Some),
        }
    }

    pub(super) fn output_stmt(&mut self) -> PResult<()> {
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
}

/// `lhs op rhs` written at `span`.
fn vbin(op: BinaryOp, lhs: VExpr, rhs: VExpr, span: Span) -> VExpr {
    VExpr::Bin(op, Box::new(lhs), Box::new(rhs), span)
}
