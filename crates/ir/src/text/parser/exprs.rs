//! Parsing scalar expressions (extents, axis numbers, sizes) into [`Scalar`]s, within the
//! bounds on depth and operator count, and checking them against the fusion's parameters.

use super::{int_value, ExprState, PResult, ParsedExpr, Parser, MAX_EXPR_DEPTH, MAX_EXPR_OPS};
use crate::diag::{Diagnostic, Span};
use crate::scalar::{Scalar, ScalarOp};
use crate::text::lexer::{Punct, Tok};

impl Parser {
    pub(super) fn expr(&mut self) -> PResult<ParsedExpr> {
        let span = self.peek().span;
        let mut st = ExprState::default();
        let value = self.sum(&mut st)?;
        Ok(ParsedExpr {
            value,
            span,
            idents: st.idents,
        })
    }

    pub(super) fn count_op(&self, st: &mut ExprState, span: Span) -> PResult<()> {
        st.ops += 1;
        within(st.ops, MAX_EXPR_OPS, span, || {
            format!("expression is too long (more than {MAX_EXPR_OPS} operators)")
        })
    }

    pub(super) fn enter(&self, st: &mut ExprState, span: Span) -> PResult<()> {
        st.depth += 1;
        within(st.depth, MAX_EXPR_DEPTH, span, || {
            format!("expression nesting is too deep (more than {MAX_EXPR_DEPTH} levels)")
        })
    }

    /// `'(' inner ')'`, the `(` at `open` being the current token; one level deeper.
    pub(super) fn parenthesized<T>(
        &mut self,
        st: &mut ExprState,
        open: Span,
        inner: impl Fn(&mut Self, &mut ExprState) -> PResult<T>,
    ) -> PResult<T> {
        self.enter(st, open)?;
        self.bump();
        let e = inner(self, st)?;
        self.expect_punct(Punct::RParen, "to close the parenthesized expression")?;
        st.depth -= 1;
        Ok(e)
    }

    /// `operand { op operand }`, left-associative, the operators being the punctuation of
    /// `ops` (any other token ends the chain); `join(op, lhs, rhs, span)` applies one. Each
    /// operator counts towards the expression's bound.
    pub(super) fn left_chain<T, O: Copy>(
        &mut self,
        st: &mut ExprState,
        ops: &[(Punct, O)],
        operand: impl Fn(&mut Self, &mut ExprState) -> PResult<T>,
        join: impl Fn(O, T, T, Span) -> T,
    ) -> PResult<T> {
        let mut acc = operand(self, st)?;
        loop {
            let tok = &self.peek().tok;
            let Some(&(_, op)) = ops.iter().find(|(p, _)| *tok == Tok::Punct(*p)) else {
                return Ok(acc);
            };
            let span = self.bump().span;
            self.count_op(st, span)?;
            let rhs = operand(self, st)?;
            acc = join(op, acc, rhs, span);
        }
    }

    /// `term { ('+' | '-') term }`
    fn sum(&mut self, st: &mut ExprState) -> PResult<Scalar> {
        let ops = [(Punct::Plus, ScalarOp::Add), (Punct::Minus, ScalarOp::Sub)];
        self.left_chain(st, &ops, Self::term, scalar_binary)
    }

    /// `atom { ('*' | '/' | '%') atom }`
    fn term(&mut self, st: &mut ExprState) -> PResult<Scalar> {
        let ops = [
            (Punct::Star, ScalarOp::Mul),
            (Punct::Slash, ScalarOp::Div),
            (Punct::Percent, ScalarOp::Mod),
        ];
        self.left_chain(st, &ops, Self::atom, scalar_binary)
    }

    /// `INT | IDENT | ('ceilDiv' | 'min' | 'max') '(' expr ',' expr ')' | '(' expr ')'`
    fn atom(&mut self, st: &mut ExprState) -> PResult<Scalar> {
        let t = self.peek().clone();
        match t.tok {
            Tok::Int(s) => {
                self.bump();
                Ok(Scalar::c(int_value(&s, false, t.span)?))
            }
            Tok::Ident(s)
                if (s == "ceilDiv" || s == "min" || s == "max")
                    && self.peek_at(1).tok == Tok::Punct(Punct::LParen) =>
            {
                let op = match s.as_str() {
                    "min" => ScalarOp::Min,
                    "max" => ScalarOp::Max,
                    _ => ScalarOp::CeilDiv,
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
            Tok::Punct(Punct::LParen) => self.parenthesized(st, t.span, Self::sum),
            _ => Err(self.unexpected(
                "an expression (an integer, a parameter name, `ceilDiv(..)` or `(..)`)",
            )),
        }
    }

    /// Every parameter the expression names is declared and has a value, and the
    /// expression evaluates (no division by zero or overflow).
    pub(super) fn check_scalar(&self, e: &ParsedExpr) -> PResult<()> {
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
    pub(super) fn check_positive(
        &self,
        e: &ParsedExpr,
        what: impl FnOnce() -> String,
    ) -> PResult<()> {
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

/// `lhs op rhs` (its span is not kept).
fn scalar_binary(op: ScalarOp, lhs: Scalar, rhs: Scalar, _: Span) -> Scalar {
    Scalar::binary(op, lhs, rhs)
}

/// `Ok` while `count` is at most `max`, else the error `message()` at `span`.
fn within(count: usize, max: usize, span: Span, message: impl FnOnce() -> String) -> PResult<()> {
    if count > max {
        return Err(Diagnostic::at(span, message()));
    }
    Ok(())
}
