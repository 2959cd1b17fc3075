//! Lines and tokens: the cursor over the source that every other part of the parser reads.

use weave_ir::{Diagnostic, Span};

use super::{line_number, PResult, Parser};
use crate::lexer::{clip, lex_line, Tok, Token};

impl Parser<'_> {
    /// Loads the next line that holds a token (skipping blank and comment-only lines);
    /// `false` at the end of the source.
    pub(super) fn next_content_line(&mut self) -> bool {
        while let Some(text) = self.lines.get(self.next_line) {
            let toks = lex_line(text, line_number(self.next_line));
            self.next_line += 1;
            if !matches!(toks.first().map(|t| &t.tok), Some(Tok::Eol) | None) {
                self.toks = toks;
                self.pos = 0;
                return true;
            }
        }
        false
    }

    pub(super) fn peek(&self) -> Token {
        match self.toks.get(self.pos).or_else(|| self.toks.last()) {
            Some(t) => t.clone(),
            None => Token {
                tok: Tok::Eol,
                span: Span::new(line_number(self.next_line), 1),
            },
        }
    }

    pub(super) fn bump(&mut self) -> Token {
        let t = self.peek();
        if self.pos < self.toks.len() {
            self.pos += 1;
        }
        t
    }

    pub(super) fn at_punct(&self, p: &str) -> bool {
        matches!(self.peek().tok, Tok::Punct(q) if q == p)
    }

    pub(super) fn at_ident(&self, s: &str) -> bool {
        matches!(&self.peek().tok, Tok::Ident(q) if q == s)
    }

    /// "expected …, found …" at `tok`; a lexer error speaks for itself.
    pub(super) fn err<T>(&self, tok: &Token, expected: &str) -> PResult<T> {
        if let Tok::Error(m) = &tok.tok {
            return Err(Diagnostic::at(tok.span, m.clone()));
        }
        Err(Diagnostic::at(
            tok.span,
            format!("expected {expected}, found {}", tok.describe()),
        ))
    }

    pub(super) fn expect_punct(&mut self, p: &str, context: &str) -> PResult<Span> {
        let t = self.bump();
        match t.tok {
            Tok::Punct(q) if q == p => Ok(t.span),
            _ => self.err(&t, &format!("`{p}` {context}")),
        }
    }

    /// Items separated by `,` up to the punctuation `close`, which is left for the caller:
    /// `item` parses one, given those before it; `between` says where a missing `,` is.
    pub(super) fn comma_list<T>(
        &mut self,
        close: &str,
        between: &str,
        mut item: impl FnMut(&mut Self, &[T]) -> PResult<T>,
    ) -> PResult<Vec<T>> {
        let mut items = Vec::new();
        while !self.at_punct(close) {
            if !items.is_empty() {
                self.expect_punct(",", between)?;
            }
            let next = item(self, &items)?;
            items.push(next);
        }
        Ok(items)
    }

    /// An identifier (`expected` describes it) that `lookup` knows; any other is refused as
    /// an unknown `what`, `options` saying what was expected.
    pub(super) fn named<T>(
        &mut self,
        expected: &str,
        what: &str,
        options: &str,
        lookup: impl FnOnce(&str) -> Option<T>,
    ) -> PResult<(T, Span)> {
        let (word, span) = self.ident(expected)?;
        match lookup(&word) {
            Some(v) => Ok((v, span)),
            None => Err(Diagnostic::at(
                span,
                format!("unknown {what} `{}` (expected {options})", clip(&word)),
            )),
        }
    }

    pub(super) fn expect_ident(&mut self, word: &str, context: &str) -> PResult<Span> {
        let t = self.bump();
        match &t.tok {
            Tok::Ident(q) if q == word => Ok(t.span),
            _ => self.err(&t, &format!("`{word}` {context}")),
        }
    }

    /// `key=`.
    pub(super) fn expect_key(&mut self, key: &str, context: &str) -> PResult<()> {
        self.expect_ident(key, context)?;
        self.expect_punct("=", &format!("after `{key}`"))?;
        Ok(())
    }

    pub(super) fn expect_eol(&mut self, context: &str) -> PResult<()> {
        let t = self.bump();
        match t.tok {
            Tok::Eol => Ok(()),
            _ => self.err(&t, &format!("end of line {context}")),
        }
    }

    pub(super) fn ident(&mut self, expected: &str) -> PResult<(String, Span)> {
        let t = self.bump();
        match t.tok {
            Tok::Ident(s) => Ok((s, t.span)),
            _ => self.err(&t, expected),
        }
    }

    pub(super) fn unsigned(&mut self, expected: &str) -> PResult<(u64, Span)> {
        let t = self.bump();
        match &t.tok {
            Tok::Int(s) => match s.parse::<u64>() {
                Ok(v) => Ok((v, t.span)),
                Err(_) => Err(Diagnostic::at(
                    t.span,
                    format!("integer `{}` is out of range", clip(s)),
                )),
            },
            _ => self.err(&t, expected),
        }
    }

    /// An integer, possibly negative (`-1`).
    pub(super) fn signed(&mut self, expected: &str) -> PResult<i64> {
        let first = self.peek();
        let negative = matches!(first.tok, Tok::Punct("-"));
        if negative {
            self.bump();
        }
        let t = self.bump();
        match &t.tok {
            Tok::Int(s) => {
                let text = if negative { format!("-{s}") } else { s.clone() };
                text.parse::<i64>().map_err(|_| {
                    Diagnostic::at(
                        first.span,
                        format!("integer `{}` is out of range", clip(&text)),
                    )
                })
            }
            _ => self.err(&t, expected),
        }
    }
}
