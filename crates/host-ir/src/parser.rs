//! The host text parser: the printer's format (docs/host-ir-format.md) back to a
//! [`HostProgram`], so that host passes can be tested on hand-written programs.
//!
//! The format is line-oriented: the container header on one line, then one statement per
//! line, a loop's body indented deeper than its `FOR` line, the closing `}` line, and after it
//! the kernel blocks (`K0: fusion …` up to a line `}`), which are `.weave` text handed to
//! [`weave_ir::text::parse`].
//!
//! Names in the text are labels: `T3`, `i0`, `Stream 0`, `K0` and the numbers of
//! communication statements bind to fresh arena entities on first sight, whatever their
//! numbers. `print(parse(x)) == x` for every printed `x`; for other text, printing renumbers.
//!
//! The parser checks what the text must say to be read at all (a tensor's type at its first
//! mention, a label for every `Wait`, a block for every kernel) and leaves the meaning (is
//! `T4` written before it is read?) to [`crate::verify()`], so that wrong programs can be
//! written down and verified.
//!
//! Never panics. Every error carries the line:col of the token where something else was
//! expected (or of the name that is wrong) and says what was expected.

use std::collections::HashMap;

use weave_ir::{
    DType, DeviceMesh, Diagnostic, MemoryType, ParallelType, ParamRole, ReduceOp, Scalar, ScalarOp,
    Span, SplitKind,
};

use crate::builder::ScopeRef;
use crate::ids::{HostTensorId, KernelId, ScalarId, StmtId, StreamId};
use crate::lexer::{clip, lex_line, Tok, Token};
use crate::signature::{AxisSplit, Sharding, Signature, TensorSig};
use crate::syntax::{
    ChunkOf, Communication, CommunicationType, HostProgram, HostScalar, P2PCommunication,
    P2PDirection, Stmt,
};
use crate::verify::MAX_LOOP_DEPTH;

/// Parses host text into a program. Never panics; see the module docs for what is checked.
pub fn parse(source: &str) -> Result<HostProgram, Diagnostic> {
    let mut p = Parser {
        lines: source.split('\n').collect(),
        next_line: 0,
        toks: Vec::new(),
        pos: 0,
        prog: HostProgram::new(),
        tensors: HashMap::new(),
        indices: HashMap::new(),
        captured: HashMap::new(),
        kernels: HashMap::new(),
        labels: HashMap::new(),
        preorder: Vec::new(),
        waits: Vec::new(),
        definition_at: None,
    };
    p.program()?;
    // The definition is what a reference run evaluates: one that disagrees with the
    // signature (another shape, dtype or name, more or fewer outputs) is refused at its block.
    if let (Some(sig), Some(at)) = (&p.prog.signature, p.definition_at) {
        sig.check_definition().map_err(|m| Diagnostic::at(at, m))?;
    }
    Ok(p.prog)
}

/// At most this many nested parentheses in one scalar expression.
const MAX_DEPTH: usize = 64;

/// The statement keywords, for "expected a statement" messages.
const STATEMENTS: &str = "`T3 = ALLOCATE(..)`, `T3 = ShardByStream(..)`, `T3 = matmul(..)`, \
`T3 = linear(..)`, `Deallocate(..)`, `FOR`, `Stream 0 = GetCurrentStream()`, \
`SetCurrentStream(..)`, `Synchronize(..)`, `LaunchKernel(..)`, `Communication N (..)`, \
`P2PCommunication N (..)`, `StartCoalescing`, `EndCoalescing N` or `Wait(..)`";

/// The kinds a `Wait` can name, as labels.
const WAIT_KINDS: [&str; 4] = [
    "Communication",
    "P2PCommunication",
    "EndCoalescing",
    "Statement",
];

/// A scope being filled, with the indentation of its statements.
struct Frame {
    scope: ScopeRef,
    /// Column of the line that opened the scope (the header, or the `FOR`).
    parent_col: u32,
    /// Column of the scope's statements, known from its first statement.
    indent: Option<u32>,
}

/// A `Wait` whose label is resolved once every statement has been read.
struct PendingWait {
    stmt: StmtId,
    kind: &'static str,
    number: u64,
    span: Span,
}

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

struct Parser<'s> {
    lines: Vec<&'s str>,
    /// Index (0-based) of the next line to read.
    next_line: usize,
    toks: Vec<Token>,
    pos: usize,
    prog: HostProgram,
    /// `T3` → tensor.
    tensors: HashMap<String, HostTensorId>,
    /// `i0` → loop index scalar.
    indices: HashMap<String, ScalarId>,
    /// `Stream 0` (by number) → captured stream.
    captured: HashMap<u64, StreamId>,
    /// `K0` → kernel, where it was first launched, and whether its block was read.
    kernels: HashMap<String, (KernelId, Span, bool)>,
    /// `(Communication, 9)` → statement and where the label was written.
    labels: HashMap<(&'static str, u64), (StmtId, Span)>,
    /// Statements in file order (the printer's pre-order numbering), for `Statement N`.
    preorder: Vec<StmtId>,
    waits: Vec<PendingWait>,
    /// Where the `Definition:` block starts, once read.
    definition_at: Option<Span>,
}

type PResult<T> = Result<T, Diagnostic>;

fn line_number(index: usize) -> u32 {
    u32::try_from(index.saturating_add(1)).unwrap_or(u32::MAX)
}

impl Parser<'_> {
    // ----- lines and tokens ----------------------------------------------------------------

    /// Loads the next line that holds a token (skipping blank and comment-only lines);
    /// `false` at the end of the source.
    fn next_content_line(&mut self) -> bool {
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

    fn peek(&self) -> Token {
        match self.toks.get(self.pos).or_else(|| self.toks.last()) {
            Some(t) => t.clone(),
            None => Token {
                tok: Tok::Eol,
                span: Span::new(line_number(self.next_line), 1),
            },
        }
    }

    fn bump(&mut self) -> Token {
        let t = self.peek();
        if self.pos < self.toks.len() {
            self.pos += 1;
        }
        t
    }

    fn at_punct(&self, p: &str) -> bool {
        matches!(self.peek().tok, Tok::Punct(q) if q == p)
    }

    fn at_ident(&self, s: &str) -> bool {
        matches!(&self.peek().tok, Tok::Ident(q) if q == s)
    }

    /// "expected …, found …" at `tok`; a lexer error speaks for itself.
    fn err<T>(&self, tok: &Token, expected: &str) -> PResult<T> {
        if let Tok::Error(m) = &tok.tok {
            return Err(Diagnostic::at(tok.span, m.clone()));
        }
        Err(Diagnostic::at(
            tok.span,
            format!("expected {expected}, found {}", tok.describe()),
        ))
    }

    fn expect_punct(&mut self, p: &str, context: &str) -> PResult<Span> {
        let t = self.bump();
        match t.tok {
            Tok::Punct(q) if q == p => Ok(t.span),
            _ => self.err(&t, &format!("`{p}` {context}")),
        }
    }

    fn expect_ident(&mut self, word: &str, context: &str) -> PResult<Span> {
        let t = self.bump();
        match &t.tok {
            Tok::Ident(q) if q == word => Ok(t.span),
            _ => self.err(&t, &format!("`{word}` {context}")),
        }
    }

    /// `key=`.
    fn expect_key(&mut self, key: &str, context: &str) -> PResult<()> {
        self.expect_ident(key, context)?;
        self.expect_punct("=", &format!("after `{key}`"))?;
        Ok(())
    }

    fn expect_eol(&mut self, context: &str) -> PResult<()> {
        let t = self.bump();
        match t.tok {
            Tok::Eol => Ok(()),
            _ => self.err(&t, &format!("end of line {context}")),
        }
    }

    fn ident(&mut self, expected: &str) -> PResult<(String, Span)> {
        let t = self.bump();
        match t.tok {
            Tok::Ident(s) => Ok((s, t.span)),
            _ => self.err(&t, expected),
        }
    }

    fn unsigned(&mut self, expected: &str) -> PResult<(u64, Span)> {
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
    fn signed(&mut self, expected: &str) -> PResult<i64> {
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

    // ----- the program ----------------------------------------------------------------------

    fn program(&mut self) -> PResult<()> {
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
    fn tensor_list(&mut self, what: &str) -> PResult<Vec<HostTensorId>> {
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
    fn body(&mut self, open: Span) -> PResult<()> {
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

    fn add(&mut self, scope: ScopeRef, stmt: Stmt) -> StmtId {
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

    /// One statement line; returns it and whether it opens a loop body.
    fn statement(&mut self, scope: ScopeRef) -> PResult<(StmtId, bool)> {
        let first = self.peek();
        let word = match &first.tok {
            Tok::Ident(w) => w.clone(),
            _ => return self.err(&first, &format!("a statement ({STATEMENTS})")),
        };
        let mut is_loop = false;
        let stmt = match word.as_str() {
            "FOR" => {
                is_loop = true;
                self.for_loop(scope)?
            }
            "Deallocate" => {
                self.bump();
                self.expect_punct("(", "after `Deallocate`")?;
                let tensor = self.tensor_ref("the tensor to deallocate")?;
                self.expect_punct(")", "to close `Deallocate(`")?;
                self.add(scope, Stmt::Deallocate { tensor })
            }
            "SetCurrentStream" | "Synchronize" => {
                self.bump();
                self.expect_punct("(", &format!("after `{word}`"))?;
                let stream = self.stream()?;
                self.expect_punct(")", &format!("to close `{word}(`"))?;
                let stmt = if word == "Synchronize" {
                    Stmt::Synchronize { stream }
                } else {
                    Stmt::SetCurrentStream { stream }
                };
                self.add(scope, stmt)
            }
            "Stream" => {
                let out = self.stream()?;
                self.expect_punct("=", "after the stream that `GetCurrentStream()` defines")?;
                self.expect_ident("GetCurrentStream", "after `Stream … =`")?;
                self.expect_punct("(", "after `GetCurrentStream`")?;
                self.expect_punct(")", "to close `GetCurrentStream(`")?;
                self.add(scope, Stmt::GetCurrentStream { out })
            }
            "Wait" => self.wait(scope)?,
            "LaunchKernel" => self.launch_kernel(scope)?,
            "StartCoalescing" => {
                self.bump();
                self.add(scope, Stmt::StartCoalescing)
            }
            "EndCoalescing" => {
                self.bump();
                let id = self.add(scope, Stmt::EndCoalescing);
                self.label("EndCoalescing", id)?;
                id
            }
            "Communication" => self.communication(scope)?,
            "P2PCommunication" => self.p2p(scope)?,
            w if split_tensor_name(w).is_some() => self.tensor_statement(scope)?,
            _ => return self.err(&first, &format!("a statement ({STATEMENTS})")),
        };
        self.expect_eol("after the statement")?;
        Ok((stmt, is_loop))
    }

    /// The number after `Communication`, `P2PCommunication` or `EndCoalescing`.
    fn label(&mut self, kind: &'static str, stmt: StmtId) -> PResult<()> {
        let (n, span) = self.unsigned(&format!("the number of the `{kind}` statement"))?;
        self.record_label(kind, n, span, stmt)
    }

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
        Ok(self.add(
            scope,
            Stmt::ForLoop {
                index,
                start,
                stop,
                body: Vec::new(),
            },
        ))
    }

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

    fn resolve_waits(&mut self) -> PResult<()> {
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

    fn communication(&mut self, scope: ScopeRef) -> PResult<StmtId> {
        self.bump();
        // The statement is added after its fields so that its tensors are declared in text
        // order; the label is checked first so that its error points at the number.
        let (n, label_span) = self.unsigned("the number of the `Communication` statement")?;
        self.expect_punct("(", "to open the fields of the communication")?;
        self.expect_key("type", "as the first field of the communication")?;
        let (tname, tspan) = self.ident("a communication type")?;
        let Some(kind) = CommunicationType::ALL
            .into_iter()
            .find(|k| k.name() == tname)
        else {
            let all: Vec<&str> = CommunicationType::ALL.iter().map(|k| k.name()).collect();
            return Err(Diagnostic::at(
                tspan,
                format!(
                    "unknown communication type `{}` (expected one of {})",
                    clip(&tname),
                    all.join(", ")
                ),
            ));
        };
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
                let (op, span) = self.ident("a reduction (`sum` or `max`)")?;
                let Some(op) = ReduceOp::from_name(&op) else {
                    return Err(Diagnostic::at(
                        span,
                        format!(
                            "unknown reduction `{}` (expected `sum` or `max`)",
                            clip(&op)
                        ),
                    ));
                };
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
        self.expect_punct(")", "to close the fields of the communication")?;
        let id = self.add(
            scope,
            Stmt::Communication(Communication {
                kind,
                teams,
                root,
                red_op,
                input,
                output,
            }),
        );
        self.record_label("Communication", n, label_span, id)?;
        Ok(id)
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

    fn p2p(&mut self, scope: ScopeRef) -> PResult<StmtId> {
        self.bump();
        let (n, label_span) = self.unsigned("the number of the `P2PCommunication` statement")?;
        self.expect_punct("(", "to open the fields of the communication")?;
        self.expect_key("type", "as the first field of the communication")?;
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
        self.expect_punct(",", "after the buffer")?;
        self.expect_key("peer", "after the buffer")?;
        let peer = self.scalar()?;
        if self.at_punct(",") {
            self.bump();
            self.expect_key("backend", "after the peer")?;
            self.backend()?;
        }
        self.expect_punct(")", "to close the fields of the communication")?;
        let id = self.add(
            scope,
            Stmt::P2PCommunication(P2PCommunication {
                direction,
                peer,
                buffer,
            }),
        );
        self.record_label("P2PCommunication", n, label_span, id)?;
        Ok(id)
    }

    /// `T3 = ALLOCATE(..)`, `T3 = ShardByStream(..)`, `T3 = matmul(..)`, `T3 += matmul(..)`,
    /// `T3 = linear(..)`.
    fn tensor_statement(&mut self, scope: ScopeRef) -> PResult<StmtId> {
        let out = self.tensor_ref("a tensor")?;
        // `T4 += matmul(..)`: an accumulating GEMM.
        let accumulate = if self.at_punct("+") {
            self.bump();
            self.expect_punct("=", "after `+` (an accumulating `T… += matmul(..)`)")?;
            true
        } else {
            self.expect_punct("=", "after the tensor a statement defines")?;
            false
        };
        let t = self.bump();
        let op = match &t.tok {
            Tok::Ident(op) => op.clone(),
            _ => String::new(),
        };
        if accumulate && op != "matmul" {
            return self.err(&t, "`matmul` after `T… +=` (only a GEMM accumulates)");
        }
        let stmt = match op.as_str() {
            "ALLOCATE" => {
                self.expect_punct("(", "after `ALLOCATE`")?;
                self.expect_key("mem_type", "as the first field of `ALLOCATE`")?;
                let (mem, span) = self.ident("a memory type (`global`, `local`, `symmetric`)")?;
                let Some(mem) = MemoryType::from_name(&mem) else {
                    return Err(Diagnostic::at(
                        span,
                        format!(
                            "unknown memory type `{}` (expected `global`, `local` or `symmetric`)",
                            clip(&mem)
                        ),
                    ));
                };
                let declared = self.prog.tensors.get(out).map(|t| t.memory);
                if let Some(declared) = declared.filter(|d| *d != mem) {
                    return Err(Diagnostic::at(
                        span,
                        format!(
                            "`mem_type={}` does not match the tensor's type, which says `{}`",
                            mem.name(),
                            declared.short()
                        ),
                    ));
                }
                self.expect_punct(",", "after the memory type")?;
                self.expect_key("zero_init", "after the memory type")?;
                let (b, span) = self.ident("`true` or `false`")?;
                let zero_init = match b.as_str() {
                    "true" => true,
                    "false" => false,
                    _ => {
                        return Err(Diagnostic::at(
                            span,
                            format!("expected `true` or `false`, found `{}`", clip(&b)),
                        ))
                    }
                };
                self.expect_punct(")", "to close `ALLOCATE(`")?;
                Stmt::Allocate {
                    tensor: out,
                    zero_init,
                }
            }
            "ShardByStream" => {
                self.expect_punct("(", "after `ShardByStream`")?;
                let input = self.tensor_ref("the tensor to cut into chunks")?;
                self.expect_punct(",", "after the tensor")?;
                self.expect_key("axis", "after the tensor")?;
                let (axis, span) = self.unsigned("an axis number")?;
                let axis = usize::try_from(axis)
                    .map_err(|_| Diagnostic::at(span, format!("axis `{axis}` is out of range")))?;
                self.expect_punct(",", "after the axis")?;
                self.expect_key("chunks", "after the axis")?;
                let chunks = self.scalar()?;
                self.expect_punct(",", "after the number of chunks")?;
                self.expect_key("stream_index", "after the number of chunks")?;
                let index = self.scalar()?;
                let holds = if self.at_punct(",") {
                    self.expect_punct(",", "after the stream index")?;
                    self.expect_key("holds", "after the stream index")?;
                    self.expect_punct("(", "after `holds=`")?;
                    self.expect_key("chunk", "after `holds=(`")?;
                    let chunk = self.scalar()?;
                    self.expect_punct(",", "after the chunk held")?;
                    self.expect_key("chunks", "after the chunk held")?;
                    let chunks = self.scalar()?;
                    self.expect_punct(",", "after the number of chunks held")?;
                    self.expect_key("extent", "after the number of chunks held")?;
                    let extent = self.scalar()?;
                    self.expect_punct(")", "to close `holds=(`")?;
                    Some(ChunkOf {
                        chunk,
                        chunks,
                        extent,
                    })
                } else {
                    None
                };
                self.expect_punct(")", "to close `ShardByStream(`")?;
                Stmt::ShardByStream {
                    input,
                    axis,
                    chunks,
                    index,
                    holds,
                    output: out,
                }
            }
            "matmul" => {
                self.expect_punct("(", "after `matmul`")?;
                let a = self.tensor_ref("the left operand")?;
                self.expect_punct(",", "after the left operand")?;
                let b = self.tensor_ref("the right operand")?;
                self.expect_punct(")", "to close `matmul(`")?;
                Stmt::Matmul {
                    a,
                    b,
                    out,
                    accumulate,
                }
            }
            "linear" => {
                self.expect_punct("(", "after `linear`")?;
                let input = self.tensor_ref("the activations")?;
                self.expect_punct(",", "after the activations")?;
                let weight = self.tensor_ref("the weight")?;
                let mut bias = None;
                if self.at_punct(",") {
                    self.bump();
                    bias = Some(self.tensor_ref("the bias")?);
                }
                self.expect_punct(")", "or `,` with a bias to close `linear(`")?;
                Stmt::Linear {
                    input,
                    weight,
                    bias,
                    out,
                }
            }
            _ => {
                return self.err(
                    &t,
                    "`ALLOCATE`, `ShardByStream`, `matmul` or `linear` after `T… =`",
                )
            }
        };
        Ok(self.add(scope, stmt))
    }

    // ----- names ------------------------------------------------------------------------------

    /// `T3`, or at a tensor's first mention `T3_g_f32[4, ( ceilDiv(t, 3) )]`.
    fn tensor_ref(&mut self, what: &str) -> PResult<HostTensorId> {
        let t = self.bump();
        let Tok::Ident(word) = &t.tok else {
            return self.err(&t, &format!("{what} (a tensor such as `T3`)"));
        };
        let (name, ty) = match split_tensor_name(word) {
            Some(Ok(parts)) => parts,
            Some(Err(m)) => return Err(Diagnostic::at(t.span, m)),
            None => return self.err(&t, &format!("{what} (a tensor such as `T3`)")),
        };
        match ty {
            Some((memory, dtype)) => {
                self.expect_punct("[", &format!("with the sizes of `{name}`"))?;
                let mut sizes = Vec::new();
                if !self.at_punct("]") {
                    loop {
                        sizes.push(self.scalar()?);
                        if self.at_punct(",") {
                            self.bump();
                            continue;
                        }
                        break;
                    }
                }
                self.expect_punct("]", "or `,` in the sizes")?;
                if self.tensors.contains_key(name) {
                    return Err(Diagnostic::at(
                        t.span,
                        format!(
                            "`{name}` is declared again; after its first mention a tensor is \
                             written bare (`{name}`)"
                        ),
                    ));
                }
                let id = self.prog.new_tensor_sized(dtype, sizes, memory);
                self.tensors.insert(name.to_string(), id);
                Ok(id)
            }
            None => match self.tensors.get(name) {
                Some(id) => Ok(*id),
                None => Err(Diagnostic::at(
                    t.span,
                    format!(
                        "`{name}` is used before its type is declared; its first mention must \
                         read like `{name}_g_f32[4, 8]`"
                    ),
                )),
            },
        }
    }

    /// The loop index scalar named `name`, created on first sight. One name is one scalar
    /// across the program, so a use outside its loop reaches the verifier as such.
    fn index(&mut self, name: &str) -> ScalarId {
        if let Some(s) = self.indices.get(name) {
            return *s;
        }
        let s = self.prog.loop_index();
        self.indices.insert(name.to_string(), s);
        s
    }

    /// `Stream 0` (captured), or `Stream <scalar>` (a pool stream by index).
    fn stream(&mut self) -> PResult<StreamId> {
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

    fn scalar(&mut self) -> PResult<ScalarId> {
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
            Tok::Ident(w) if (w == "ceilDiv" || w == "min") && self.at_punct("(") => {
                let op = if w == "min" {
                    ScalarOp::Min
                } else {
                    ScalarOp::CeilDiv
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

    // ----- kernel blocks --------------------------------------------------------------------

    /// After the container: the `Signature:` block (its entries indented on the lines
    /// below), the `Definition: fusion …` block and the `K0: fusion …` blocks, each fusion
    /// block up to a line that is exactly `}`.
    fn kernel_blocks(&mut self) -> PResult<()> {
        while let Some(text) = self.lines.get(self.next_line).copied() {
            let start = self.next_line;
            self.next_line += 1;
            let trimmed = text.trim();
            if trimmed.is_empty() || trimmed.starts_with("//") {
                continue;
            }
            let toks = lex_line(text, line_number(start));
            let (name, colon_col) = match (toks.first(), toks.get(1)) {
                (
                    Some(Token {
                        tok: Tok::Ident(name),
                        ..
                    }),
                    Some(Token {
                        tok: Tok::Punct(":"),
                        span,
                    }),
                ) if is_kernel_name(name) || name == "Signature" || name == "Definition" => {
                    (name.clone(), span.col)
                }
                (Some(t), _) => {
                    return self.err(
                        t,
                        "a block `Signature:`, `Definition: fusion …` or `K0: fusion …` after the container",
                    )
                }
                (None, _) => continue,
            };
            let name_span = Span::new(line_number(start), toks.first().map_or(1, |t| t.span.col));
            if name == "Signature" {
                self.toks = toks;
                self.pos = 2;
                self.signature_block(name_span)?;
                continue;
            }
            let fusion = self.fusion_block(&name, start, text, colon_col, name_span)?;
            if name == "Definition" {
                let sig = self.prog.signature.get_or_insert_with(Signature::default);
                if sig.definition.is_some() {
                    return Err(Diagnostic::at(name_span, "a second `Definition:` block"));
                }
                sig.definition = Some(fusion);
                self.definition_at = Some(name_span);
                continue;
            }
            match self.kernels.get_mut(&name) {
                Some((_, _, true)) => {
                    return Err(Diagnostic::at(
                        name_span,
                        format!("kernel `{name}` has a second block"),
                    ))
                }
                Some((k, _, defined)) => {
                    *defined = true;
                    if let Some(unit) = self.prog.kernels.get_mut(*k) {
                        unit.fusion = std::sync::Arc::new(fusion);
                    }
                }
                None => {
                    let k = self.prog.add_kernel(fusion);
                    self.kernels.insert(name, (k, name_span, true));
                }
            }
        }
        Ok(())
    }

    /// The `.weave` text of a block that starts on line `start` (`text`, its name ending at
    /// `colon_col`) and ends at the next line that is exactly `}`.
    fn fusion_block(
        &mut self,
        name: &str,
        start: usize,
        text: &str,
        colon_col: u32,
        name_span: Span,
    ) -> PResult<weave_ir::Fusion> {
        let what = if name == "Definition" {
            "the definition".to_string()
        } else {
            format!("kernel `{name}`")
        };
        let Some(end) = (start..self.lines.len())
            .skip(1)
            .find(|i| self.lines.get(*i).is_some_and(|l| l.trim_end() == "}"))
        else {
            return Err(Diagnostic::at(
                name_span,
                format!("the block of {what} is never closed: expected a line `}}`"),
            ));
        };
        // The `.weave` text, with `K0:` blanked out so that columns stay those of the file.
        let prefix = usize::try_from(colon_col).unwrap_or(usize::MAX);
        let mut fusion_text: String = " ".repeat(prefix.min(text.chars().count()));
        fusion_text.extend(text.chars().skip(prefix));
        for line in self.lines.get(start + 1..=end).unwrap_or(&[]) {
            fusion_text.push('\n');
            fusion_text.push_str(line);
        }
        fusion_text.push('\n');
        self.next_line = end + 1;
        weave_ir::text::parse(&fusion_text, &[]).map_err(|e| {
            let span = e.span.map(|s| {
                Span::new(
                    s.line.saturating_add(line_number(start)).saturating_sub(1),
                    s.col,
                )
            });
            Diagnostic {
                message: format!("in {what}: {}", e.message),
                span: span.or(Some(name_span)),
            }
        })
    }

    // ----- the signature ---------------------------------------------------------------------

    /// `Signature:` then, on the indented lines below, `params(..) [roles(..)]` and one
    /// `input …`/`output …` line per program input and output, in order.
    fn signature_block(&mut self, name_span: Span) -> PResult<()> {
        self.expect_eol("after `Signature:`")?;
        let sig = self.prog.signature.get_or_insert_with(Signature::default);
        if !sig.params.is_empty() || !sig.inputs.is_empty() || !sig.outputs.is_empty() {
            return Err(Diagnostic::at(name_span, "a second `Signature:` block"));
        }
        let mut seen_params = false;
        while let Some(text) = self.lines.get(self.next_line).copied() {
            if !text.starts_with(' ') && !text.trim().is_empty() {
                break;
            }
            if !self.next_content_line() {
                break;
            }
            let t = self.peek();
            match &t.tok {
                Tok::Ident(w) if w == "params" && !seen_params => {
                    self.bump();
                    seen_params = true;
                    self.signature_params()?;
                }
                Tok::Ident(w) if seen_params && (w == "input" || w == "output") => {
                    let output = w == "output";
                    self.bump();
                    let entry = self.tensor_sig()?;
                    let sig = self.prog.signature.get_or_insert_with(Signature::default);
                    if output {
                        sig.outputs.push(entry);
                    } else {
                        sig.inputs.push(entry);
                    }
                }
                _ => {
                    return self.err(
                        &t,
                        if seen_params {
                            "a signature entry `input NAME: …` or `output NAME: …`"
                        } else {
                            "`params(..)` as the first line of the signature"
                        },
                    )
                }
            }
            self.expect_eol("after the signature entry")?;
        }
        if !seen_params {
            return Err(Diagnostic::at(
                name_span,
                "the signature has no `params(..)` line",
            ));
        }
        Ok(())
    }

    /// `(t=8, d=2) [devices(0 1)] [roles(mesh=d, chunks=s)]`, after `params`.
    fn signature_params(&mut self) -> PResult<()> {
        self.expect_punct("(", "after `params`")?;
        let mut params = Vec::new();
        while !self.at_punct(")") {
            if !params.is_empty() {
                self.expect_punct(",", "between parameters")?;
            }
            let (name, span) = self.ident("a parameter name")?;
            if weave_ir::RESERVED_NAMES.contains(&name.as_str()) {
                return Err(Diagnostic::at(
                    span,
                    format!(
                        "`{name}` is a built-in scalar of host programs, bound when the program \
                         runs; no parameter may take its name"
                    ),
                ));
            }
            if params.iter().any(|(n, _)| *n == name) {
                return Err(Diagnostic::at(
                    span,
                    format!("parameter `{name}` is given twice"),
                ));
            }
            self.expect_punct("=", &format!("after parameter `{name}`"))?;
            let v = self.signed(&format!("the value of parameter `{name}`"))?;
            params.push((name, v));
        }
        self.bump();
        let mut devices = Vec::new();
        if self.at_ident("devices") {
            self.bump();
            self.expect_punct("(", "after `devices`")?;
            devices = self.device_list()?;
        }
        let mut roles = Vec::new();
        if self.at_ident("roles") {
            self.bump();
            self.expect_punct("(", "after `roles`")?;
            while !self.at_punct(")") {
                if !roles.is_empty() {
                    self.expect_punct(",", "between roles")?;
                }
                let (word, span) = self.ident("a role `mesh` or `chunks`")?;
                let Some(role) = ParamRole::from_keyword(&word) else {
                    return Err(Diagnostic::at(
                        span,
                        format!("unknown parameter role `{word}` (expected `mesh` or `chunks`)"),
                    ));
                };
                self.expect_punct("=", &format!("after `{word}`"))?;
                let (name, span) = self.ident("a parameter name")?;
                if !params.iter().any(|(n, _)| *n == name) {
                    return Err(Diagnostic::at(
                        span,
                        format!("role `{word}` names `{name}`, which is not among the params"),
                    ));
                }
                roles.push((role, name));
            }
            self.bump();
        }
        let sig = self.prog.signature.get_or_insert_with(Signature::default);
        sig.params = params;
        sig.devices = devices;
        sig.roles = roles;
        Ok(())
    }

    /// Device numbers separated by spaces, up to and including the closing `)`.
    fn device_list(&mut self) -> PResult<Vec<i64>> {
        let mut devices = Vec::new();
        while !self.at_punct(")") {
            let (v, span) = self.unsigned("a device number")?;
            devices.push(
                i64::try_from(v)
                    .map_err(|_| Diagnostic::at(span, format!("device {v} is out of range")))?,
            );
        }
        self.bump();
        Ok(devices)
    }

    /// `inp: bf16[8, 8] [on [2](0 1)] split(outer(4, Stream, Serial), DIDx)`.
    fn tensor_sig(&mut self) -> PResult<TensorSig> {
        let (name, _) = self.ident("the tensor's name")?;
        self.expect_punct(":", &format!("after `{name}`"))?;
        let (dt, span) = self.ident("a dtype such as `bf16`")?;
        let dtype = DType::from_name(&dt)
            .ok_or_else(|| Diagnostic::at(span, format!("unknown dtype `{dt}`")))?;
        self.expect_punct("[", "to open the global sizes")?;
        let mut global = Vec::new();
        while !self.at_punct("]") {
            if !global.is_empty() {
                self.expect_punct(",", "between sizes")?;
            }
            let (v, span) = self.unsigned("a size")?;
            global.push(
                usize::try_from(v)
                    .map_err(|_| Diagnostic::at(span, format!("size {v} is out of range")))?,
            );
        }
        self.bump();
        let mut mesh = None;
        if self.at_ident("on") {
            let on = self.bump();
            self.expect_punct("[", "to open the mesh shape")?;
            let mut shape = Vec::new();
            while !self.at_punct("]") {
                if !shape.is_empty() {
                    self.expect_punct(",", "between mesh axes")?;
                }
                let (v, span) = self.unsigned("a mesh axis size")?;
                shape.push(usize::try_from(v).map_err(|_| {
                    Diagnostic::at(span, format!("mesh axis size {v} is out of range"))
                })?);
            }
            self.bump();
            self.expect_punct("(", "to open the mesh's devices")?;
            let devices = self.device_list()?;
            mesh = Some(
                DeviceMesh::new(shape, devices)
                    .map_err(|m| Diagnostic::at(on.span, format!("mesh of `{name}`: {m}")))?,
            );
        }
        self.expect_ident("split", "before the split trees of the axes")?;
        self.expect_punct("(", "after `split`")?;
        let mut axes = Vec::new();
        while !self.at_punct(")") {
            if !axes.is_empty() {
                self.expect_punct(",", "between axes")?;
            }
            axes.push(self.axis_split(0)?);
        }
        let close = self.bump();
        if axes.len() != global.len() {
            return Err(Diagnostic::at(
                close.span,
                format!(
                    "`{name}` has {} sizes but {} split trees",
                    global.len(),
                    axes.len()
                ),
            ));
        }
        Ok(TensorSig {
            name,
            dtype,
            shape: global,
            sharding: Sharding { mesh, axes },
        })
    }

    /// `Serial`, `DIDx`, … or `outer(F, TREE, TREE)` / `inner(F, TREE, TREE)`.
    fn axis_split(&mut self, depth: usize) -> PResult<AxisSplit> {
        let (word, span) = self.ident("a parallel type or `outer(..)`/`inner(..)`")?;
        if depth > MAX_DEPTH {
            return Err(Diagnostic::at(span, "split tree nested too deeply"));
        }
        let kind = match word.as_str() {
            "outer" => SplitKind::Outer,
            "inner" => SplitKind::Inner,
            _ => {
                return ParallelType::from_name(&word)
                    .map(AxisSplit::Leaf)
                    .ok_or_else(|| {
                        Diagnostic::at(
                            span,
                            format!(
                                "expected a parallel type (`Serial`, `Stream`, `DIDx`, `DIDy`) or `outer(..)`/`inner(..)`, found `{}`",
                                clip(&word)
                            ),
                        )
                    })
            }
        };
        self.expect_punct("(", &format!("after `{word}`"))?;
        let (f, fspan) = self.unsigned("the split factor")?;
        let factor = usize::try_from(f)
            .ok()
            .filter(|f| *f > 0)
            .ok_or_else(|| Diagnostic::at(fspan, format!("split factor {f} is out of range")))?;
        self.expect_punct(",", "after the split factor")?;
        let outer = self.axis_split(depth + 1)?;
        self.expect_punct(",", "between the outer and the inner tree")?;
        let inner = self.axis_split(depth + 1)?;
        self.expect_punct(")", &format!("to close `{word}(`"))?;
        Ok(AxisSplit::Split {
            kind,
            factor,
            outer: Box::new(outer),
            inner: Box::new(inner),
        })
    }

    fn check_kernels(&self) -> PResult<()> {
        let mut missing: Vec<(&String, Span)> = self
            .kernels
            .iter()
            .filter(|(_, (_, _, defined))| !defined)
            .map(|(n, (_, span, _))| (n, *span))
            .collect();
        missing.sort_by_key(|(_, s)| *s);
        match missing.first() {
            Some((name, span)) => Err(Diagnostic::at(
                *span,
                format!(
                    "kernel `{name}` is launched but has no block `{name}: fusion …` after the \
                     container"
                ),
            )),
            None => Ok(()),
        }
    }
}

/// `i0`, `i17`: the names the format reserves for loop indices.
fn is_index_name(s: &str) -> bool {
    s.len() > 1 && s.starts_with('i') && s[1..].bytes().all(|b| b.is_ascii_digit())
}

/// `K0`, `K3`.
fn is_kernel_name(s: &str) -> bool {
    s.len() > 1 && s.starts_with('K') && s[1..].bytes().all(|b| b.is_ascii_digit())
}

type TensorName<'a> = (&'a str, Option<(MemoryType, DType)>);

/// Splits `T3` or `T3_g_bf16` into the name and the type. `None` when the word is not a
/// tensor name at all; `Some(Err(..))` when it is one with a malformed type.
fn split_tensor_name(word: &str) -> Option<Result<TensorName<'_>, String>> {
    let rest = word.strip_prefix('T')?;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    let (name, suffix) = word.split_at(1 + digits);
    if suffix.is_empty() {
        return Some(Ok((name, None)));
    }
    let suffix = suffix.strip_prefix('_')?;
    let Some((mem, dtype)) = suffix.split_once('_') else {
        return Some(Err(format!(
            "expected a tensor type such as `{name}_g_f32`, found `{}`",
            clip(word)
        )));
    };
    let memory = match mem {
        "g" => MemoryType::Global,
        "l" => MemoryType::Local,
        "sym" => MemoryType::Symmetric,
        _ => {
            return Some(Err(format!(
                "unknown memory type `{}` in `{}` (expected `g`, `l` or `sym`)",
                clip(mem),
                clip(word)
            )))
        }
    };
    let Some(dtype) = DType::from_name(dtype) else {
        let all: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
        return Some(Err(format!(
            "unknown dtype `{}` in `{}` (expected one of {})",
            clip(dtype),
            clip(word),
            all.join(", ")
        )));
    };
    Some(Ok((name, Some((memory, dtype)))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::printer::print;

    #[test]
    fn hand_written_labels_are_renumbered_by_the_printer() {
        let src = "%HostIrContainer { (T7_g_f32[4]) -> () :\n  \
                   Wait(Communication 42)\n  \
                   Communication 42 (type=Allgather, team=(0 1), input=T7, output=T7)\n\
                   } // %HostIrContainer\n";
        let p = parse(src).unwrap();
        // The forward reference parses; it is the verifier's business that it is wrong.
        assert_eq!(
            print(&p),
            "%HostIrContainer { (T0_g_f32[4]) -> () :\n  Wait(Communication 1)\n  \
             Communication 1 (type=Allgather, team=(0 1), input=T0, output=T0, backend=NCCL)\n\
             } // %HostIrContainer\n"
        );
    }

    #[test]
    fn scalars_keep_their_written_shape_and_loop_indices_are_shared() {
        let src = "%HostIrContainer { () -> () :\n  \
                   FOR i3 from ( 2 * 1 ) to ceilDiv(t, 3):\n    \
                   SetCurrentStream(Stream ( i3 % numberOfStreams ))\n    \
                   Synchronize(Stream ( -1 ))\n\
                   } // %HostIrContainer\n";
        let p = parse(src).unwrap();
        let Some(Stmt::ForLoop { index, start, .. }) = p.stmts.get(p.top_level[0]) else {
            panic!("not a loop");
        };
        assert_eq!(
            p.scalars[*start],
            HostScalar::Value(Scalar::Binary(
                ScalarOp::Mul,
                Box::new(Scalar::Const(2)),
                Box::new(Scalar::Const(1))
            ))
        );
        let body = p.stmts[p.top_level[0]].body().unwrap().to_vec();
        let Some(Stmt::SetCurrentStream { stream }) = p.stmts.get(body[0]) else {
            panic!("not SetCurrentStream");
        };
        let crate::syntax::Stream::Indexed(x) = p.streams[*stream] else {
            panic!("not indexed");
        };
        assert!(matches!(p.scalars[x], HostScalar::Binary(ScalarOp::Mod, i, _) if i == *index));
        assert_eq!(
            print(&p),
            "%HostIrContainer { () -> () :\n  FOR i0 from ( 2 * 1 ) to ( ceilDiv(t, 3) ):\n    \
             SetCurrentStream(Stream ( i0 % numberOfStreams ))\n    Synchronize(Stream ( -1 ))\n\
             } // %HostIrContainer\n"
        );
    }
}
