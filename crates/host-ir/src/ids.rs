//! Typed arena keys for every entity of a host program; never bare `usize`.
//!
//! Keys identify nodes inside one [`crate::HostProgram`]. They are not names: the printer
//! numbers statements, tensors and scalars in the order it prints them, so a pass that frees
//! a slot does not renumber unrelated lines of a snapshot.
//!
//! Side tables over these keys are [`SecondaryMap`]s ([`SparseSecondaryMap`] where few keys
//! have an entry), re-exported here so that a crate keeping one needs no `slotmap` of its own.

pub use slotmap::{SecondaryMap, SparseSecondaryMap};

slotmap::new_key_type! {
    /// A statement: one node of [`crate::Stmt`], placed in exactly one scope.
    pub struct StmtId;
    /// A tensor buffer (or an aliasing view of one) that statements read and write.
    pub struct HostTensorId;
    /// An integer scalar: a constant, a symbolic extent, a loop index or an expression of them.
    pub struct ScalarId;
    /// A stream value: the captured caller stream or a pool stream chosen by an index.
    pub struct StreamId;
    /// A compute segment compiled and launched as one kernel.
    pub struct KernelId;
}
