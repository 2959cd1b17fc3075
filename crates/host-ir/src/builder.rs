//! The builder API: create tensors, scalars, streams and kernels, place statements in
//! scopes, move them, and walk the program in order.
//!
//! Definitions stay apart from order: creating an entity only adds it to its arena; a
//! statement runs only once [`HostProgram::push`] (or an `insert_*`) places its id in a scope.
//! Scopes are plain `Vec<StmtId>` ([`HostProgram::top_level`] and the `body` of each
//! [`Stmt::ForLoop`]), so a pass may also edit them directly through
//! [`HostProgram::scope_mut`].
//!
//! Misuse that can only be a bug of the caller (pushing into the body of a statement that is
//! not a loop, inserting next to a statement that is in no scope) panics with a message; the
//! parser never reaches those paths.

use slotmap::SparseSecondaryMap;
use weave_ir::{DType, Fusion, MemoryType, ReduceOp, Scalar, ScalarOp};

use crate::ids::{HostTensorId, KernelId, ScalarId, StmtId, StreamId};
use crate::syntax::{
    Communication, CommunicationType, HostProgram, HostScalar, HostTensor, KernelUnit, Stmt, Stream,
};

/// A scope: the top level of the program, or the body of one [`Stmt::ForLoop`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScopeRef {
    /// [`HostProgram::top_level`].
    Top,
    /// The body of the given `ForLoop` statement.
    Body(StmtId),
}

/// One statement met by [`HostProgram::walk`], with where it sits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Walked {
    /// The statement.
    pub stmt: StmtId,
    /// The scope that holds it.
    pub scope: ScopeRef,
    /// Its position in that scope.
    pub position: usize,
    /// The enclosing `ForLoop` statements, outermost first (empty at top level).
    pub loops: Vec<StmtId>,
}

/// Iterator of [`HostProgram::walk`]: pre-order, program order.
pub struct Walk<'a> {
    program: &'a HostProgram,
    /// `(scope, next position)`, outermost first.
    stack: Vec<(ScopeRef, usize)>,
    /// Loops whose body was entered; a loop met again (a malformed program that places one
    /// statement twice) is yielded but not entered again, so a cycle cannot hang the walk.
    entered: SparseSecondaryMap<StmtId, ()>,
}

impl Iterator for Walk<'_> {
    type Item = Walked;

    fn next(&mut self) -> Option<Walked> {
        loop {
            let (scope, pos) = *self.stack.last()?;
            let stmts = self.program.scope_opt(scope).unwrap_or(&[]);
            let Some(&stmt) = stmts.get(pos) else {
                self.stack.pop();
                continue;
            };
            if let Some(top) = self.stack.last_mut() {
                top.1 += 1;
            }
            let loops = self
                .stack
                .iter()
                .filter_map(|(s, _)| match s {
                    ScopeRef::Top => None,
                    ScopeRef::Body(l) => Some(*l),
                })
                .collect();
            let is_loop = matches!(self.program.stmts.get(stmt), Some(Stmt::ForLoop { .. }));
            if is_loop && self.entered.insert(stmt, ()).is_none() {
                self.stack.push((ScopeRef::Body(stmt), 0));
            }
            return Some(Walked {
                stmt,
                scope,
                position: pos,
                loops,
            });
        }
    }
}

impl HostProgram {
    /// An empty program: no inputs, outputs or statements.
    pub fn new() -> HostProgram {
        HostProgram::default()
    }

    // ----- tensors -------------------------------------------------------------------------

    /// Declares a program input of local sizes `sizes` (each becomes a
    /// [`HostScalar::Value`]) and appends it to [`HostProgram::inputs`].
    pub fn add_input(
        &mut self,
        dtype: DType,
        sizes: Vec<Scalar>,
        memory: MemoryType,
    ) -> HostTensorId {
        let t = self.new_tensor(dtype, sizes, memory);
        self.inputs.push(t);
        t
    }

    /// Appends `t` to [`HostProgram::outputs`].
    pub fn add_output(&mut self, t: HostTensorId) {
        self.outputs.push(t);
    }

    /// A tensor of local sizes `sizes` (each becomes a [`HostScalar::Value`]); nothing binds
    /// it until a statement does.
    pub fn new_tensor(
        &mut self,
        dtype: DType,
        sizes: Vec<Scalar>,
        memory: MemoryType,
    ) -> HostTensorId {
        let sizes = sizes.into_iter().map(|s| self.value(s)).collect();
        self.new_tensor_sized(dtype, sizes, memory)
    }

    /// A tensor whose sizes are existing scalars (for sizes that depend on a loop index or on
    /// another host scalar).
    pub fn new_tensor_sized(
        &mut self,
        dtype: DType,
        sizes: Vec<ScalarId>,
        memory: MemoryType,
    ) -> HostTensorId {
        self.tensors.insert(HostTensor {
            dtype,
            sizes,
            memory,
        })
    }

    /// A new tensor with the dtype, sizes (the same scalar ids) and memory of `like`.
    ///
    /// # Panics
    /// If `like` is not a tensor of this program.
    pub fn tensor_like(&mut self, like: HostTensorId) -> HostTensorId {
        let t = self
            .tensors
            .get(like)
            .expect("tensor_like: not a tensor of this program")
            .clone();
        self.tensors.insert(t)
    }

    // ----- scalars -------------------------------------------------------------------------

    /// Adds a scalar.
    pub fn scalar(&mut self, s: HostScalar) -> ScalarId {
        self.scalars.insert(s)
    }

    /// The constant `v`.
    pub fn constant(&mut self, v: i64) -> ScalarId {
        self.value(Scalar::Const(v))
    }

    /// The free symbol `name`: `rank`, `numberOfStreams` or a fusion parameter. Names of the
    /// form `i<digits>` are reserved for loop indices by the text format.
    pub fn named(&mut self, name: &str) -> ScalarId {
        self.value(Scalar::named(name))
    }

    /// A loop-invariant symbolic value such as `ceilDiv(t, 3)`.
    pub fn value(&mut self, v: Scalar) -> ScalarId {
        self.scalar(HostScalar::Value(v))
    }

    /// A fresh loop index, to be named by exactly one [`Stmt::ForLoop`]
    /// (see [`HostProgram::push_for`]).
    pub fn loop_index(&mut self) -> ScalarId {
        self.scalar(HostScalar::LoopIndex)
    }

    /// `a op b` over host scalars, such as `( i0 % numberOfStreams )`.
    pub fn binary(&mut self, op: ScalarOp, a: ScalarId, b: ScalarId) -> ScalarId {
        self.scalar(HostScalar::Binary(op, a, b))
    }

    // ----- streams and kernels ---------------------------------------------------------------

    /// A captured stream value, to be defined by a [`Stmt::GetCurrentStream`].
    pub fn stream_captured(&mut self) -> StreamId {
        self.streams.insert(Stream::Captured)
    }

    /// The pool stream chosen by the runtime value of `index` (`Stream i0`).
    pub fn stream_indexed(&mut self, index: ScalarId) -> StreamId {
        self.streams.insert(Stream::Indexed(index))
    }

    /// Adds a compute segment for [`Stmt::LaunchKernel`] to run.
    pub fn add_kernel(&mut self, fusion: Fusion) -> KernelId {
        self.kernels.insert(KernelUnit {
            fusion: std::sync::Arc::new(fusion),
        })
    }

    // ----- placing statements ----------------------------------------------------------------

    /// The statements of `scope`, or `None` when `scope` names something that is not a loop
    /// of this program.
    pub fn scope_opt(&self, scope: ScopeRef) -> Option<&[StmtId]> {
        match scope {
            ScopeRef::Top => Some(&self.top_level),
            ScopeRef::Body(l) => match self.stmts.get(l) {
                Some(Stmt::ForLoop { body, .. }) => Some(body),
                _ => None,
            },
        }
    }

    /// The statements of `scope`.
    ///
    /// # Panics
    /// If `scope` is the body of a statement that is not a `ForLoop` of this program.
    pub fn scope(&self, scope: ScopeRef) -> &[StmtId] {
        self.scope_opt(scope)
            .unwrap_or_else(|| panic!("{scope:?} is not a scope of this program"))
    }

    /// The statements of `scope`, for editing in place.
    ///
    /// # Panics
    /// If `scope` is the body of a statement that is not a `ForLoop` of this program.
    pub fn scope_mut(&mut self, scope: ScopeRef) -> &mut Vec<StmtId> {
        match scope {
            ScopeRef::Top => &mut self.top_level,
            ScopeRef::Body(l) => match self.stmts.get_mut(l) {
                Some(Stmt::ForLoop { body, .. }) => body,
                _ => panic!("{scope:?} is not a scope of this program"),
            },
        }
    }

    /// Adds `stmt` to the arena and appends it to `scope`.
    ///
    /// # Panics
    /// If `scope` is the body of a statement that is not a `ForLoop` of this program.
    pub fn push(&mut self, scope: ScopeRef, stmt: Stmt) -> StmtId {
        // Check the scope before touching the arena, so a panic leaves no orphan.
        let _ = self.scope(scope);
        let id = self.stmts.insert(stmt);
        self.scope_mut(scope).push(id);
        id
    }

    /// Adds `stmt` to the arena and inserts it at `position` of `scope` (clamped to its
    /// length).
    ///
    /// # Panics
    /// If `scope` is the body of a statement that is not a `ForLoop` of this program.
    pub fn insert_at(&mut self, scope: ScopeRef, position: usize, stmt: Stmt) -> StmtId {
        let _ = self.scope(scope);
        let id = self.stmts.insert(stmt);
        let v = self.scope_mut(scope);
        let position = position.min(v.len());
        v.insert(position, id);
        id
    }

    /// Adds a `ForLoop` over `[start, stop)` with a fresh loop index and an empty body to
    /// `scope`; returns the loop and its index. Push into its body with
    /// `ScopeRef::Body(loop)`.
    pub fn push_for(
        &mut self,
        scope: ScopeRef,
        start: ScalarId,
        stop: ScalarId,
    ) -> (StmtId, ScalarId) {
        let index = self.loop_index();
        let l = self.push(scope, Stmt::empty_loop(index, start, stop));
        (l, index)
    }

    /// Where `stmt` is placed: its scope and position. `None` when it is in no scope.
    /// Linear in the size of the program.
    pub fn locate(&self, stmt: StmtId) -> Option<(ScopeRef, usize)> {
        self.walk()
            .find(|w| w.stmt == stmt)
            .map(|w| (w.scope, w.position))
    }

    /// The `ForLoop`s around `stmt`, outermost first; `None` when it is in no scope.
    pub fn enclosing_loops(&self, stmt: StmtId) -> Option<Vec<StmtId>> {
        self.walk().find(|w| w.stmt == stmt).map(|w| w.loops)
    }

    /// Inserts `stmt` just before `anchor`, in `anchor`'s scope.
    ///
    /// # Panics
    /// If `anchor` is in no scope.
    pub fn insert_before(&mut self, anchor: StmtId, stmt: Stmt) -> StmtId {
        let (scope, pos) = self
            .locate(anchor)
            .expect("insert_before: the anchor statement is in no scope");
        self.insert_at(scope, pos, stmt)
    }

    /// Inserts `stmt` just after `anchor`, in `anchor`'s scope.
    ///
    /// # Panics
    /// If `anchor` is in no scope.
    pub fn insert_after(&mut self, anchor: StmtId, stmt: Stmt) -> StmtId {
        let (scope, pos) = self
            .locate(anchor)
            .expect("insert_after: the anchor statement is in no scope");
        self.insert_at(scope, pos + 1, stmt)
    }

    /// Takes `stmt` out of its scope, keeping it (and, for a loop, its body) in the arena so
    /// that it can be placed elsewhere. Returns where it was.
    pub fn detach(&mut self, stmt: StmtId) -> Option<(ScopeRef, usize)> {
        let (scope, pos) = self.locate(stmt)?;
        self.scope_mut(scope).remove(pos);
        Some((scope, pos))
    }

    /// Moves `stmt` (already in the arena, placed or not) to `position` of `scope`.
    ///
    /// # Panics
    /// If `scope` is the body of a statement that is not a `ForLoop` of this program.
    pub fn place(&mut self, stmt: StmtId, scope: ScopeRef, position: usize) {
        self.detach(stmt);
        let v = self.scope_mut(scope);
        let position = position.min(v.len());
        v.insert(position, stmt);
    }

    /// Detaches `stmt` and deletes it from the arena, with the whole body of a loop. Returns
    /// the removed statement. Tensors, scalars and streams it named stay in their arenas.
    pub fn remove(&mut self, stmt: StmtId) -> Option<Stmt> {
        self.detach(stmt);
        let removed = self.stmts.remove(stmt)?;
        let mut stack: Vec<StmtId> = removed.body().map(<[_]>::to_vec).unwrap_or_default();
        while let Some(s) = stack.pop() {
            if let Some(inner) = self.stmts.remove(s) {
                stack.extend(inner.body().unwrap_or(&[]));
            }
        }
        Some(removed)
    }

    // ----- walking -----------------------------------------------------------------------

    /// Every placed statement in program order (pre-order: a loop, then its body), with its
    /// scope, position and enclosing loops. This is the order in which the printer numbers
    /// statements (`Communication 9` is the tenth statement walked).
    pub fn walk(&self) -> Walk<'_> {
        Walk {
            program: self,
            stack: vec![(ScopeRef::Top, 0)],
            entered: SparseSecondaryMap::new(),
        }
    }
}

impl Stmt {
    /// A `ForLoop` of `index` over `[start, stop)` with an empty body.
    pub fn empty_loop(index: ScalarId, start: ScalarId, stop: ScalarId) -> Stmt {
        Stmt::ForLoop {
            index,
            start,
            stop,
            body: Vec::new(),
        }
    }
}

impl Communication {
    /// An allreduce by `op` over `teams` of `input` into `output` (an allreduce has no root).
    pub fn allreduce(
        teams: Vec<Vec<i64>>,
        op: ReduceOp,
        input: HostTensorId,
        output: HostTensorId,
    ) -> Communication {
        Communication {
            kind: CommunicationType::Allreduce,
            teams,
            root: None,
            red_op: Some(op),
            input,
            output,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program_with_loop() -> (HostProgram, StmtId, StmtId, StmtId) {
        let mut p = HostProgram::new();
        let t = p.new_tensor(DType::F32, vec![Scalar::c(4)], MemoryType::Global);
        let a = p.push(
            ScopeRef::Top,
            Stmt::Allocate {
                tensor: t,
                zero_init: false,
            },
        );
        let (zero, three) = (p.constant(0), p.constant(3));
        let (l, _) = p.push_for(ScopeRef::Top, zero, three);
        let d = p.push(ScopeRef::Body(l), Stmt::Deallocate { tensor: t });
        (p, a, l, d)
    }

    #[test]
    fn push_and_walk_in_program_order() {
        let (p, a, l, d) = program_with_loop();
        let walked: Vec<(StmtId, usize, usize)> = p
            .walk()
            .map(|w| (w.stmt, w.position, w.loops.len()))
            .collect();
        assert_eq!(walked, vec![(a, 0, 0), (l, 1, 0), (d, 0, 1)]);
        assert_eq!(p.locate(d), Some((ScopeRef::Body(l), 0)));
        assert_eq!(p.enclosing_loops(d), Some(vec![l]));
    }

    #[test]
    fn insert_before_after_detach_remove() {
        let (mut p, a, l, d) = program_with_loop();
        let s1 = p.insert_before(d, Stmt::StartCoalescing);
        let s2 = p.insert_after(d, Stmt::EndCoalescing);
        let s0 = p.insert_after(a, Stmt::StartCoalescing);
        assert_eq!(p.top_level, vec![a, s0, l]);
        assert_eq!(p.scope(ScopeRef::Body(l)), &[s1, d, s2]);
        assert_eq!(p.detach(d), Some((ScopeRef::Body(l), 1)));
        assert_eq!(p.scope(ScopeRef::Body(l)), &[s1, s2]);
        p.place(d, ScopeRef::Top, 0);
        assert_eq!(p.top_level, vec![d, a, s0, l]);
        assert!(matches!(p.remove(l), Some(Stmt::ForLoop { .. })));
        assert!(!p.stmts.contains_key(s1) && !p.stmts.contains_key(s2));
        assert_eq!(p.top_level, vec![d, a, s0]);
    }

    #[test]
    #[should_panic(expected = "is not a scope of this program")]
    fn pushing_into_a_non_loop_panics() {
        let (mut p, a, _, _) = program_with_loop();
        p.push(ScopeRef::Body(a), Stmt::StartCoalescing);
    }

    #[test]
    fn a_cyclic_loop_is_walked_once() {
        let (mut p, _, l, _) = program_with_loop();
        p.scope_mut(ScopeRef::Body(l)).push(l);
        assert_eq!(p.walk().count(), 4);
    }
}
