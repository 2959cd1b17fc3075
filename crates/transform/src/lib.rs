//! weave-transform: the meaning of schedules and the maps between iter domains.
//!
//! Contract. Given a [`weave_ir::Fusion`] built by the builder API or the `.weave` parser,
//! this crate
//!
//! * applies schedule steps to loop and allocation domains ([`schedule`]): splits and merges
//!   record [`weave_ir::IdExpr`]s through `Fusion::split_id` / `Fusion::merge_ids`, so every
//!   extent stays a symbolic [`weave_ir::Scalar`] that can be traced back to the logical
//!   domain; device (`DIDx`, `DIDy`) and `Stream` axes are checked to be unsplit logical axes
//!   or the outer output of an outer split, device splits against the tensor's mesh;
//! * maps the logical axes of a producer to the root (or logical) axes of its consumer for
//!   one expr ([`logical_map`], nvFuser's `PairwiseLogicalDomainMap`);
//! * builds the exact id graph of a whole fusion ([`id_graph`]): equivalence classes of
//!   iter domains that index the same elements, through pointwise ops, reductions,
//!   matmul/linear operands and identical split/merge transforms;
//! * replays a reference tensor's device/stream split chains onto another tensor's loop
//!   domain ([`replay`]), the building block of sharding propagation.
//!
//! Errors are [`weave_ir::Diagnostic`]s that name the tensor (by its user name) and the axis;
//! [`schedule::apply_schedules`] attaches the span of the offending schedule step.
//!
//! Architecture Invariant: weave-transform knows nothing of host programs, streams at run
//! time, communications or CUDA. It reads and rewrites iter domains, loop/allocation domains
//! and meshes of tensors only; it never adds, removes or reorders exprs or tensors. Deciding
//! *which* tensors to shard and inserting resharding copies belongs to `weave-passes`.

pub mod id_graph;
pub mod logical_map;
pub mod replay;
pub mod schedule;
#[cfg(test)]
mod test_util;

pub use id_graph::{IdClass, IdGraph};
pub use logical_map::{consumer_to_producer, pairwise_map};
pub use replay::{replay_loop_like, ReplayReport, ReplayedAxis, SkipReason, SkippedAxis};
pub use schedule::{
    apply_schedules, merge, parallelize, reorder, set_allocation_as_loop, split, DomainKind,
};
