//! Scalars as written (`3`, `t`, `( i0 % numberOfStreams )`), loop indices and streams.

use weave_ir::{Diagnostic, Scalar, ScalarOp};

use super::{PResult, Parser, MAX_DEPTH};
use crate::ids::{ScalarId, StreamId};
use crate::lexer::{clip, Tok};
use crate::syntax::HostScalar;

/// A parsed scalar expression, before it becomes host scalars.
enum SExpr {
    Const(i64),
    Named(String),
    Index(ScalarId),
    Bin(ScalarOp, Box<SExpr>, Box<SExpr>),
}

impl SExpr {
    fn has_index(&self) -> bool {
        match self {
            SExpr::Const(_) | SExpr::Named(_) => false,
            SExpr::Index(_) => true,
            SExpr::Bin(_, a, b) => a.has_index() || b.has_index(),
        }
    }

    /// The tree exactly as written (not simplified), so that it prints back the same.
    fn raw(&self) -> Scalar {
        match self {
            SExpr::Const(v) => Scalar::Const(*v),
            SExpr::Named(n) => Scalar::named(n),
            // Unreachable for index-free trees; a constant keeps this total.
            SExpr::Index(_) => Scalar::Const(0),
            SExpr::Bin(op, a, b) => Scalar::Binary(*op, Box::new(a.raw()), Box::new(b.raw())),
        }
    }
}

impl Parser<'_> {
    /// The loop index scalar named `name`, created on first sight. One name is one scalar
    /// across the program, so a use outside its loop reaches the verifier as such.
    pub(super) fn index(&mut self, name: &str) -> ScalarId {
        if let Some(s) = self.indices.get(name) {
            return *s;
        }
        let s = self.prog.loop_index();
        self.indices.insert(name.to_string(), s);
        s
    }

    /// `Stream 0` (captured), or `Stream <scalar>` (a pool stream by index).
    pub(super) fn stream(&mut self) -> PResult<StreamId> {
        self.expect_ident("Stream", "(a stream such as `Stream 0` or `Stream i0`)")?;
        if let Tok::Int(_) = self.peek().tok {
            let (n, _) = self.unsigned("a stream number")?;
            if let Some(s) = self.captured.get(&n) {
                return Ok(*s);
            }
            let s = self.prog.stream_captured();
            self.captured.insert(n, s);
            return Ok(s);
        }
        let index = self.scalar()?;
        Ok(self.prog.stream_indexed(index))
    }

    // ----- scalars ------------------------------------------------------------------------------

    /// `, KEY=` and a scalar: a further field, the `,` and the key expected `context`.
    pub(super) fn scalar_field(&mut self, key: &str, context: &str) -> PResult<ScalarId> {
        self.expect_punct(",", context)?;
        self.expect_key(key, context)?;
        self.scalar()
    }

    pub(super) fn scalar(&mut self) -> PResult<ScalarId> {
        let e = self.sexpr(0)?;
        Ok(self.lower(&e))
    }

    fn lower(&mut self, e: &SExpr) -> ScalarId {
        match e {
            SExpr::Index(s) => *s,
            SExpr::Bin(op, a, b) if e.has_index() => {
                let a = self.lower(a);
                let b = self.lower(b);
                self.prog.binary(*op, a, b)
            }
            _ => self.prog.scalar(HostScalar::Value(e.raw())),
        }
    }

    fn sexpr(&mut self, depth: usize) -> PResult<SExpr> {
        let t = self.bump();
        if depth > MAX_DEPTH {
            return Err(Diagnostic::at(
                t.span,
                format!("the expression nests too deeply (at most {MAX_DEPTH} levels)"),
            ));
        }
        match &t.tok {
            Tok::Int(s) => match s.parse::<i64>() {
                Ok(v) => Ok(SExpr::Const(v)),
                Err(_) => Err(Diagnostic::at(
                    t.span,
                    format!("integer `{}` is out of range", clip(s)),
                )),
            },
            Tok::Punct("-") => {
                let n = self.bump();
                match &n.tok {
                    Tok::Int(s) => format!("-{s}")
                        .parse::<i64>()
                        .map(SExpr::Const)
                        .map_err(|_| {
                            Diagnostic::at(
                                t.span,
                                format!("integer `-{}` is out of range", clip(s)),
                            )
                        }),
                    _ => self.err(&n, "an integer after `-`"),
                }
            }
            Tok::Ident(w) if (w == "ceilDiv" || w == "min" || w == "max") && self.at_punct("(") => {
                let op = match w.as_str() {
                    "min" => ScalarOp::Min,
                    "max" => ScalarOp::Max,
                    _ => ScalarOp::CeilDiv,
                };
                self.bump();
                let a = self.sexpr(depth + 1)?;
                self.expect_punct(",", &format!("between the operands of `{w}`"))?;
                let b = self.sexpr(depth + 1)?;
                self.expect_punct(")", &format!("to close `{w}(`"))?;
                Ok(SExpr::Bin(op, Box::new(a), Box::new(b)))
            }
            Tok::Ident(w) if is_index_name(w) => Ok(SExpr::Index(self.index(w))),
            Tok::Ident(w) => Ok(SExpr::Named(w.clone())),
            Tok::Punct("(") => {
                let a = self.sexpr(depth + 1)?;
                if self.at_punct(")") {
                    self.bump();
                    return Ok(a);
                }
                let o = self.bump();
                let op = match o.tok {
                    Tok::Punct("+") => ScalarOp::Add,
                    Tok::Punct("-") => ScalarOp::Sub,
                    Tok::Punct("*") => ScalarOp::Mul,
                    Tok::Punct("/") => ScalarOp::Div,
                    Tok::Punct("%") => ScalarOp::Mod,
                    _ => return self.err(&o, "an operator (`+`, `-`, `*`, `/`, `%`) or `)`"),
                };
                let b = self.sexpr(depth + 1)?;
                self.expect_punct(
                    ")",
                    &format!("to close the expression opened at {}", t.span),
                )?;
                Ok(SExpr::Bin(op, Box::new(a), Box::new(b)))
            }
            _ => self.err(
                &t,
                "a scalar (an integer, a name, or a parenthesized expression such as \
                 `( i0 % numberOfStreams )`)",
            ),
        }
    }
}

/// `i0`, `i17`: the names the format reserves for loop indices.
pub(super) fn is_index_name(s: &str) -> bool {
    s.len() > 1 && s.starts_with('i') && s[1..].bytes().all(|b| b.is_ascii_digit())
}
