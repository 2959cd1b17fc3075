//! Parsing `schedule` blocks: one [`ScheduleStep`] per line.

use super::{PResult, Parser, STEP_NAMES};
use crate::diag::Diagnostic;
use crate::domain::ParallelType;
use crate::tensor::{MemoryType, ScheduleOp, ScheduleStep};
use crate::text::lexer::{Punct, Tok};

impl Parser {
    pub(super) fn schedule(&mut self) -> PResult<()> {
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
    /// `(AXIS, PARALLEL_TYPE)` after the name of the step `step`.
    fn axis_and_parallel_type(&mut self, step: &str) -> PResult<(usize, ParallelType)> {
        self.expect_punct(Punct::LParen, &format!("after `{step}`"))?;
        let axis = self.expect_axis(&format!("an axis number in `{step}`"))?;
        self.expect_punct(Punct::Comma, &format!("after the axis of `{step}`"))?;
        let parallel = self.parallel_type()?;
        self.expect_punct(Punct::RParen, &format!("to close `{step}(...)`"))?;
        Ok((axis, parallel))
    }

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
                let (axis, parallel) = self.axis_and_parallel_type("parallelize")?;
                ScheduleOp::Parallelize { axis, parallel }
            }
            "swizzle1d" => {
                let (axis, parallel) = self.axis_and_parallel_type("swizzle1d")?;
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
}
