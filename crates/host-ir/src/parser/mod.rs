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
//!
//! The parser is one `Parser` whose methods live by concern: `tokens` (lines and tokens),
//! `program` (the container and its scopes), `stmt` (one statement line, a handler per kind),
//! `tensor` (tensor names and the statements that define a tensor), `scalar` (scalar
//! expressions, loop indices and streams) and `blocks` (the signature, definition and kernel
//! blocks after the container).

use std::collections::HashMap;

use weave_ir::{Diagnostic, Span};

use crate::ids::{HostTensorId, KernelId, ScalarId, StmtId, StreamId};
use crate::lexer::Token;
use crate::syntax::HostProgram;

mod blocks;
mod program;
mod scalar;
mod stmt;
mod tensor;
mod tokens;

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
        sig.check_definition()
            .map_err(|e| Diagnostic::at(at, e.to_string()))?;
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

/// A `Wait` whose label is resolved once every statement has been read.
struct PendingWait {
    stmt: StmtId,
    kind: &'static str,
    number: u64,
    span: Span,
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

#[cfg(test)]
mod tests {
    use weave_ir::{Scalar, ScalarOp};

    use super::*;
    use crate::printer::print;
    use crate::syntax::{HostScalar, Stmt};

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
