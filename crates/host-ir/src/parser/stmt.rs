//! One statement line: a short dispatch on its first word, and a handler per statement kind.

use weave_ir::{Diagnostic, ReduceOp, Span};

use super::scalar::is_index_name;
use super::tensor::split_tensor_name;
use super::{PResult, Parser, PendingWait, STATEMENTS, WAIT_KINDS};
use crate::builder::ScopeRef;
use crate::ids::StmtId;
use crate::lexer::{clip, Tok};
use crate::syntax::{Communication, CommunicationType, P2PCommunication, P2PDirection, Stmt};

impl Parser<'_> {
    /// One statement line; returns it and whether it opens a loop body. The first word
    /// picks the handler of the statement's kind.
    pub(super) fn statement(&mut self, scope: ScopeRef) -> PResult<(StmtId, bool)> {
        let first = self.peek();
        let word = match &first.tok {
            Tok::Ident(w) => w.clone(),
            _ => return self.err(&first, &format!("a statement ({STATEMENTS})")),
        };
        let stmt = match word.as_str() {
            "FOR" => self.for_loop(scope)?,
            "Deallocate" => self.deallocate(scope)?,
            "SetCurrentStream" | "Synchronize" => self.on_stream(scope, &word)?,
            "Stream" => self.get_current_stream(scope)?,
            "Wait" => self.wait(scope)?,
            "LaunchKernel" => self.launch_kernel(scope)?,
            "StartCoalescing" => self.start_coalescing(scope),
            "EndCoalescing" => self.end_coalescing(scope)?,
            "Communication" => self.communication(scope)?,
            "P2PCommunication" => self.p2p(scope)?,
            w if split_tensor_name(w).is_some() => self.tensor_statement(scope)?,
            _ => return self.err(&first, &format!("a statement ({STATEMENTS})")),
        };
        self.expect_eol("after the statement")?;
        Ok((stmt, word == "FOR"))
    }

    /// `Deallocate(T3)`.
    fn deallocate(&mut self, scope: ScopeRef) -> PResult<StmtId> {
        self.bump();
        self.expect_punct("(", "after `Deallocate`")?;
        let tensor = self.tensor_ref("the tensor to deallocate")?;
        self.expect_punct(")", "to close `Deallocate(`")?;
        Ok(self.add(scope, Stmt::Deallocate { tensor }))
    }

    /// `SetCurrentStream(Stream …)` or `Synchronize(Stream …)`, as `word` says.
    fn on_stream(&mut self, scope: ScopeRef, word: &str) -> PResult<StmtId> {
        self.bump();
        self.expect_punct("(", &format!("after `{word}`"))?;
        let stream = self.stream()?;
        self.expect_punct(")", &format!("to close `{word}(`"))?;
        let stmt = if word == "Synchronize" {
            Stmt::Synchronize { stream }
        } else {
            Stmt::SetCurrentStream { stream }
        };
        Ok(self.add(scope, stmt))
    }

    /// `Stream 0 = GetCurrentStream()`.
    fn get_current_stream(&mut self, scope: ScopeRef) -> PResult<StmtId> {
        let out = self.stream()?;
        self.expect_punct("=", "after the stream that `GetCurrentStream()` defines")?;
        self.expect_ident("GetCurrentStream", "after `Stream … =`")?;
        self.expect_punct("(", "after `GetCurrentStream`")?;
        self.expect_punct(")", "to close `GetCurrentStream(`")?;
        Ok(self.add(scope, Stmt::GetCurrentStream { out }))
    }

    /// `StartCoalescing`.
    fn start_coalescing(&mut self, scope: ScopeRef) -> StmtId {
        self.bump();
        self.add(scope, Stmt::StartCoalescing)
    }

    /// `EndCoalescing 14`.
    fn end_coalescing(&mut self, scope: ScopeRef) -> PResult<StmtId> {
        self.bump();
        let id = self.add(scope, Stmt::EndCoalescing);
        self.label("EndCoalescing", id)?;
        Ok(id)
    }

    /// The number after `Communication`, `P2PCommunication` or `EndCoalescing`.
    fn label(&mut self, kind: &'static str, stmt: StmtId) -> PResult<()> {
        let (n, span) = self.unsigned(&format!("the number of the `{kind}` statement"))?;
        self.record_label(kind, n, span, stmt)
    }

    /// `FOR i0 from 0 to 3:` (its body follows on the lines indented deeper).
    fn for_loop(&mut self, scope: ScopeRef) -> PResult<StmtId> {
        self.bump();
        let t = self.bump();
        let index = match &t.tok {
            Tok::Ident(name) if is_index_name(name) => self.index(name),
            _ => return self.err(&t, "a loop index such as `i0` after `FOR`"),
        };
        self.expect_ident("from", "after the loop index")?;
        let start = self.scalar()?;
        self.expect_ident("to", "after the loop's start")?;
        let stop = self.scalar()?;
        self.expect_punct(":", "to end the `FOR` header")?;
        Ok(self.add(scope, Stmt::empty_loop(index, start, stop)))
    }

    /// `Wait(Communication 9)`: the label is resolved once every statement has been read.
    fn wait(&mut self, scope: ScopeRef) -> PResult<StmtId> {
        self.bump();
        self.expect_punct("(", "after `Wait`")?;
        let t = self.bump();
        let kind = match &t.tok {
            Tok::Ident(k) => WAIT_KINDS.iter().copied().find(|w| w == k),
            _ => None,
        };
        let Some(kind) = kind else {
            return self.err(
                &t,
                "what the `Wait` waits for: `Communication N`, `P2PCommunication N`, \
                 `EndCoalescing N` or `Statement N`",
            );
        };
        let (number, _) = self.unsigned(&format!("the number of the `{kind}`"))?;
        self.expect_punct(")", "to close `Wait(`")?;
        // The label may come later in the text; it is resolved after the last statement.
        let stmt = self.add(
            scope,
            Stmt::Wait {
                comm: StmtId::default(),
            },
        );
        self.waits.push(PendingWait {
            stmt,
            kind,
            number,
            span: t.span,
        });
        Ok(stmt)
    }

    pub(super) fn resolve_waits(&mut self) -> PResult<()> {
        for w in std::mem::take(&mut self.waits) {
            let target = if w.kind == "Statement" {
                usize::try_from(w.number)
                    .ok()
                    .and_then(|n| self.preorder.get(n).copied())
            } else {
                self.labels.get(&(w.kind, w.number)).map(|(s, _)| *s)
            };
            let Some(target) = target else {
                return Err(Diagnostic::at(
                    w.span,
                    format!(
                        "`Wait` names `{} {}`, but no statement of the program has that label",
                        w.kind, w.number
                    ),
                ));
            };
            if let Some(Stmt::Wait { comm }) = self.prog.stmts.get_mut(w.stmt) {
                *comm = target;
            }
        }
        Ok(())
    }

    /// `LaunchKernel(kernel=K0, inputs=(..), outputs=(..))`.
    fn launch_kernel(&mut self, scope: ScopeRef) -> PResult<StmtId> {
        self.bump();
        self.expect_punct("(", "after `LaunchKernel`")?;
        self.expect_key("kernel", "as the first argument of `LaunchKernel`")?;
        let (name, span) = self.ident("a kernel name such as `K0`")?;
        if !is_kernel_name(&name) {
            return Err(Diagnostic::at(
                span,
                format!(
                    "expected a kernel name such as `K0`, found `{}`",
                    clip(&name)
                ),
            ));
        }
        let kernel = match self.kernels.get(&name) {
            Some((k, _, _)) => *k,
            None => {
                // Filled when the kernel's block after the container is read.
                let k = self.prog.add_kernel(weave_ir::Fusion::default());
                self.kernels.insert(name, (k, span, false));
                k
            }
        };
        self.expect_punct(",", "after the kernel")?;
        self.expect_key("inputs", "after the kernel")?;
        self.expect_punct("(", "to open the kernel's inputs")?;
        let inputs = self.tensor_list("a kernel input")?;
        self.expect_punct(",", "after the kernel's inputs")?;
        self.expect_key("outputs", "after the kernel's inputs")?;
        self.expect_punct("(", "to open the kernel's outputs")?;
        let outputs = self.tensor_list("a kernel output")?;
        self.expect_punct(")", "to close `LaunchKernel(`")?;
        Ok(self.add(
            scope,
            Stmt::LaunchKernel {
                kernel,
                inputs,
                outputs,
            },
        ))
    }

    fn backend(&mut self) -> PResult<()> {
        let (b, span) = self.ident("a backend (`NCCL`)")?;
        if b != "NCCL" {
            return Err(Diagnostic::at(
                span,
                format!("unknown backend `{}` (only `NCCL` is supported)", clip(&b)),
            ));
        }
        Ok(())
    }

    /// `Communication 9 (type=…, team=(..), [root=…,] input=…, output=…[, red_op=…][, backend=NCCL])`.
    fn communication(&mut self, scope: ScopeRef) -> PResult<StmtId> {
        // The statement is added after its fields so that its tensors are declared in text
        // order; the label is checked first so that its error points at the number.
        let label = self.comm_header("Communication")?;
        let all: Vec<&str> = CommunicationType::ALL.iter().map(|k| k.name()).collect();
        let (kind, _) = self.named(
            "a communication type",
            "communication type",
            &format!("one of {}", all.join(", ")),
            |tname| {
                CommunicationType::ALL
                    .into_iter()
                    .find(|k| k.name() == tname)
            },
        )?;
        self.expect_punct(",", "after the communication type")?;
        self.expect_key("team", "after the communication type")?;
        self.expect_punct("(", "to open the team")?;
        // `(0 1)`, or disjoint teams separated by `|`: `(0 1 | 2 3)`.
        let mut teams = vec![Vec::new()];
        while !self.at_punct(")") {
            if self.at_punct("|") {
                self.bump();
                teams.push(Vec::new());
                continue;
            }
            let device = self.signed("a device id, `|` or `)` in the team")?;
            if let Some(team) = teams.last_mut() {
                team.push(device);
            }
        }
        self.bump();
        self.expect_punct(",", "after the team")?;
        let mut root = None;
        if self.at_ident("root") {
            self.expect_key("root", "")?;
            root = Some(self.scalar()?);
            self.expect_punct(",", "after the root")?;
        }
        self.expect_key("input", "(or `root=`) after the team")?;
        let input = self.tensor_ref("the communication's input")?;
        self.expect_punct(",", "after the input")?;
        self.expect_key("output", "after the input")?;
        let output = self.tensor_ref("the communication's output")?;
        let mut red_op = None;
        let mut backend = false;
        while self.at_punct(",") {
            self.bump();
            let t = self.peek();
            if red_op.is_none() && !backend && self.at_ident("red_op") {
                self.expect_key("red_op", "")?;
                let (op, _) = self.named(
                    "a reduction (`sum` or `max`)",
                    "reduction",
                    "`sum` or `max`",
                    ReduceOp::from_name,
                )?;
                red_op = Some(op);
            } else if !backend && self.at_ident("backend") {
                self.expect_key("backend", "")?;
                self.backend()?;
                backend = true;
            } else {
                let expected = match (red_op.is_some(), backend) {
                    (false, false) => "`red_op=` or `backend=`",
                    _ => "`backend=`",
                };
                return self.err(&t, expected);
            }
        }
        let stmt = Stmt::Communication(Communication {
            kind,
            teams,
            root,
            red_op,
            input,
            output,
        });
        self.comm_end(scope, label, stmt)
    }

    fn record_label(
        &mut self,
        kind: &'static str,
        n: u64,
        span: Span,
        stmt: StmtId,
    ) -> PResult<()> {
        if let Some((_, first)) = self.labels.get(&(kind, n)) {
            return Err(Diagnostic::at(
                span,
                format!("`{kind} {n}` is already the label of the statement at {first}"),
            ));
        }
        self.labels.insert((kind, n), (stmt, span));
        Ok(())
    }

    /// The label of a `stmt` statement (`Communication`, `P2PCommunication`): the kind, its
    /// number and where the number is; the fields are opened up to `type=`.
    fn comm_header(&mut self, stmt: &'static str) -> PResult<(&'static str, u64, Span)> {
        self.bump();
        let (n, span) = self.unsigned(&format!("the number of the `{stmt}` statement"))?;
        self.expect_punct("(", "to open the fields of the communication")?;
        self.expect_key("type", "as the first field of the communication")?;
        Ok((stmt, n, span))
    }

    /// Closes the fields that [`Self::comm_header`] opened and adds `stmt` to `scope` under
    /// the `label` that the header read.
    fn comm_end(
        &mut self,
        scope: ScopeRef,
        (kind, n, span): (&'static str, u64, Span),
        stmt: Stmt,
    ) -> PResult<StmtId> {
        self.expect_punct(")", "to close the fields of the communication")?;
        let id = self.add(scope, stmt);
        self.record_label(kind, n, span, id)?;
        Ok(id)
    }

    /// `P2PCommunication 12 (type=send|recv, buffer=…, peer=…[, backend=NCCL])`.
    fn p2p(&mut self, scope: ScopeRef) -> PResult<StmtId> {
        let label = self.comm_header("P2PCommunication")?;
        let (dir, span) = self.ident("`send` or `recv`")?;
        let direction = match dir.as_str() {
            "send" => P2PDirection::Send,
            "recv" => P2PDirection::Recv,
            _ => {
                return Err(Diagnostic::at(
                    span,
                    format!("expected `send` or `recv`, found `{}`", clip(&dir)),
                ))
            }
        };
        self.expect_punct(",", "after the type")?;
        self.expect_key("buffer", "after the type")?;
        let buffer = self.tensor_ref("the buffer sent or received")?;
        let peer = self.scalar_field("peer", "after the buffer")?;
        if self.at_punct(",") {
            self.bump();
            self.expect_key("backend", "after the peer")?;
            self.backend()?;
        }
        let stmt = Stmt::P2PCommunication(P2PCommunication {
            direction,
            peer,
            buffer,
        });
        self.comm_end(scope, label, stmt)
    }
}

/// `K0`, `K3`.
pub(super) fn is_kernel_name(s: &str) -> bool {
    s.len() > 1 && s.starts_with('K') && s[1..].bytes().all(|b| b.is_ascii_digit())
}
