//! The container: its header (inputs and outputs), its indented scopes and its closing line.

use weave_ir::{Diagnostic, Span};

use super::{PResult, Parser};
use crate::builder::ScopeRef;
use crate::ids::{HostTensorId, StmtId};
use crate::lexer::Tok;
use crate::syntax::Stmt;
use crate::verify::MAX_LOOP_DEPTH;

/// A scope being filled, with the indentation of its statements.
struct Frame {
    scope: ScopeRef,
    /// Column of the line that opened the scope (the header, or the `FOR`).
    parent_col: u32,
    /// Column of the scope's statements, known from its first statement.
    indent: Option<u32>,
}

impl Parser<'_> {
    pub(super) fn program(&mut self) -> PResult<()> {
        if !self.next_content_line() {
            return Err(Diagnostic::at(
                Span::new(1, 1),
                "expected `%HostIrContainer {`, found end of file",
            ));
        }
        self.expect_punct("%", "to start the container header `%HostIrContainer {`")?;
        self.expect_ident("HostIrContainer", "after `%`")?;
        let open = self.expect_punct("{", "after `%HostIrContainer`")?;
        self.expect_punct("(", "to open the list of program inputs")?;
        let inputs = self.tensor_list("a program input")?;
        self.expect_punct("->", "between the inputs and the outputs")?;
        self.expect_punct("(", "to open the list of program outputs")?;
        let outputs = self.tensor_list("a program output")?;
        self.expect_punct(":", "to end the container header")?;
        self.expect_eol("after the container header")?;
        self.prog.inputs = inputs;
        self.prog.outputs = outputs;
        self.body(open)?;
        self.resolve_waits()?;
        self.kernel_blocks()?;
        self.check_kernels()
    }

    /// `T0_g_f32[4], T1` up to the closing `)`.
    pub(super) fn tensor_list(&mut self, what: &str) -> PResult<Vec<HostTensorId>> {
        let mut v = Vec::new();
        if self.at_punct(")") {
            self.bump();
            return Ok(v);
        }
        loop {
            v.push(self.tensor_ref(what)?);
            if self.at_punct(",") {
                self.bump();
                continue;
            }
            self.expect_punct(")", "or `,` in the tensor list")?;
            return Ok(v);
        }
    }

    /// Statements up to the container's closing `}` line.
    pub(super) fn body(&mut self, open: Span) -> PResult<()> {
        let mut stack = vec![Frame {
            scope: ScopeRef::Top,
            // Top-level statements are indented past column 1, where the header starts.
            parent_col: 1,
            indent: None,
        }];
        loop {
            if !self.next_content_line() {
                return Err(Diagnostic::at(
                    open,
                    "the container opened here is never closed: expected a line \
                     `} // %HostIrContainer`",
                ));
            }
            let first = self.peek();
            if matches!(first.tok, Tok::Punct("}")) {
                self.bump();
                return self.expect_eol("after the `}` that closes the container");
            }
            let col = first.span.col;
            loop {
                let depth = stack.len();
                let Some(top) = stack.last_mut() else {
                    return Err(Diagnostic::at(first.span, "internal: no open scope"));
                };
                match top.indent {
                    None if col > top.parent_col => {
                        top.indent = Some(col);
                        break;
                    }
                    None if depth == 1 => {
                        return Err(Diagnostic::at(
                            first.span,
                            "expected a statement indented under the container header",
                        ));
                    }
                    None => {
                        stack.pop();
                    }
                    Some(ind) if col == ind => break,
                    Some(ind) if col < ind && depth > 1 => {
                        stack.pop();
                    }
                    Some(ind) => {
                        return Err(Diagnostic::at(
                            first.span,
                            format!(
                                "unexpected indentation: expected a statement at column {ind} \
                                 (or a dedent that matches an enclosing scope)"
                            ),
                        ));
                    }
                }
            }
            let scope = stack.last().map_or(ScopeRef::Top, |f| f.scope);
            let (stmt, is_loop) = self.statement(scope)?;
            if is_loop {
                if stack.len() > MAX_LOOP_DEPTH {
                    return Err(Diagnostic::at(
                        first.span,
                        format!("loops nest too deeply (at most {MAX_LOOP_DEPTH} levels)"),
                    ));
                }
                stack.push(Frame {
                    scope: ScopeRef::Body(stmt),
                    parent_col: col,
                    indent: None,
                });
            }
        }
    }

    pub(super) fn add(&mut self, scope: ScopeRef, stmt: Stmt) -> StmtId {
        let id = self.prog.stmts.insert(stmt);
        match scope {
            ScopeRef::Top => self.prog.top_level.push(id),
            ScopeRef::Body(l) => {
                if let Some(Stmt::ForLoop { body, .. }) = self.prog.stmts.get_mut(l) {
                    body.push(id);
                }
            }
        }
        self.preorder.push(id);
        id
    }
}
