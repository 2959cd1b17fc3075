//! Scalars and streams: loop indices used inside the `FOR` that binds them, captured streams
//! defined by a dominating `GetCurrentStream`.

use super::{State, VResult, Verifier, MAX_SCALAR_DEPTH};
use crate::ids::{ScalarId, StmtId, StreamId};
use crate::syntax::{HostScalar, Stream};

impl Verifier<'_> {
    pub(super) fn check_scalar(&mut self, s: StmtId, state: &State, x: ScalarId) -> VResult {
        match self.scalar_problem(state, x, 0) {
            Ok(()) => Ok(()),
            Err(problem) => {
                let text = self.names.scalar(self.p, x);
                Err(self.fail(s, format!("the scalar `{text}` {problem}")))
            }
        }
    }

    /// Why `x` cannot be evaluated here, if it cannot.
    pub(super) fn scalar_problem(
        &mut self,
        state: &State,
        x: ScalarId,
        depth: usize,
    ) -> Result<(), String> {
        if depth > MAX_SCALAR_DEPTH {
            return Err("is cyclic or nests too deeply".to_string());
        }
        match self.p.scalars.get(x) {
            None => Err("names a scalar that is not in the scalar arena".to_string()),
            Some(HostScalar::Value(_)) => Ok(()),
            Some(HostScalar::LoopIndex) if state.indices.contains_key(x) => Ok(()),
            Some(HostScalar::LoopIndex) => {
                let i = self.names.scalar(self.p, x);
                Err(format!("uses loop index {i} outside the FOR that binds it"))
            }
            Some(HostScalar::Binary(_, a, b)) => {
                let (a, b) = (*a, *b);
                self.scalar_problem(state, a, depth + 1)?;
                self.scalar_problem(state, b, depth + 1)
            }
        }
    }

    pub(super) fn check_stream(&mut self, s: StmtId, state: &State, st: StreamId) -> VResult {
        match self.p.streams.get(st) {
            None => Err(self.fail(s, "names a stream that is not in the stream arena")),
            Some(Stream::Captured) if state.streams.contains_key(st) => Ok(()),
            Some(Stream::Captured) => {
                let n = self.names.stream(self.p, st);
                Err(self.fail(
                    s,
                    format!("uses {n} before a dominating `GetCurrentStream` defines it"),
                ))
            }
            Some(Stream::Indexed(i)) => {
                let i = *i;
                self.check_scalar(s, state, i)
            }
        }
    }
}
