//! Iteration domains (axes), their iter and parallel types, and the split/merge transforms
//! that derive loop and allocation domains from logical ones.

use std::fmt;

use crate::ids::IterDomainId;
use crate::scalar::Scalar;

/// What an axis iterates over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IterType {
    /// An ordinary axis (`i`).
    Iteration,
    /// An axis reduced away by this tensor's definition (`r`).
    Reduction,
    /// An axis of extent 1 that broadcasts against any extent (`b`).
    Broadcast,
}

impl IterType {
    /// The printer's one-letter prefix.
    pub fn prefix(self) -> &'static str {
        match self {
            IterType::Iteration => "i",
            IterType::Reduction => "r",
            IterType::Broadcast => "b",
        }
    }
}

/// How an axis is executed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ParallelType {
    /// Split across devices, the last mesh axis.
    DIDx,
    /// Split across devices, the second-to-last mesh axis.
    DIDy,
    /// A host-side loop whose iterations run on a pool of streams.
    Stream,
    /// Not parallelized.
    Serial,
}

impl ParallelType {
    /// Every parallel type.
    pub const ALL: [ParallelType; 4] = [
        ParallelType::DIDx,
        ParallelType::DIDy,
        ParallelType::Stream,
        ParallelType::Serial,
    ];

    /// The spelling in `.weave` schedules (`DIDx`, `DIDy`, `Stream`, `Serial`).
    pub fn name(self) -> &'static str {
        match self {
            ParallelType::DIDx => "DIDx",
            ParallelType::DIDy => "DIDy",
            ParallelType::Stream => "Stream",
            ParallelType::Serial => "Serial",
        }
    }

    /// Parses [`ParallelType::name`].
    pub fn from_name(s: &str) -> Option<ParallelType> {
        ParallelType::ALL.into_iter().find(|p| p.name() == s)
    }

    /// The seed printer's spelling (`deviceIdx.x`, `deviceIdx.y`, `streamIdx`, `S`).
    pub fn print_name(self) -> &'static str {
        match self {
            ParallelType::DIDx => "deviceIdx.x",
            ParallelType::DIDy => "deviceIdx.y",
            ParallelType::Stream => "streamIdx",
            ParallelType::Serial => "S",
        }
    }

    /// True for the device parallel types.
    pub fn is_device(self) -> bool {
        matches!(self, ParallelType::DIDx | ParallelType::DIDy)
    }

    /// True for the device and stream parallel types (those that must come from outer splits).
    pub fn is_device_or_stream(self) -> bool {
        self != ParallelType::Serial
    }

    /// The mesh axis this device type indexes, counted from the last axis (DIDx = last).
    pub fn mesh_axis_from_end(self) -> Option<usize> {
        match self {
            ParallelType::DIDx => Some(0),
            ParallelType::DIDy => Some(1),
            _ => None,
        }
    }
}

impl fmt::Display for ParallelType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One axis: an extent, an iter type, a parallel type and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IterDomain {
    /// The number of indices (symbolic).
    pub extent: Scalar,
    /// Iteration, reduction or broadcast.
    pub iter_type: IterType,
    /// Serial, DIDx/DIDy or Stream.
    pub parallel: ParallelType,
    /// Set on the outputs of root→logical transforms (reshape, rfactor); printed as `rf`.
    pub rfactor: bool,
    /// Set by `swizzle1d(axis, DIDx)` (nvFuser's `Swizzle1D`): the stream loop over this axis
    /// visits its chunks rotated by the device index, chunk `(i + deviceIdx.x) % extent` in
    /// iteration `i`.
    pub swizzle: Option<ParallelType>,
    /// The split or merge that produced this axis, if any.
    pub definition: Option<crate::ids::IdExprId>,
}

impl IterDomain {
    /// A fresh serial axis.
    pub fn new(extent: Scalar, iter_type: IterType) -> IterDomain {
        IterDomain {
            extent,
            iter_type,
            parallel: ParallelType::Serial,
            rfactor: false,
            swizzle: None,
            definition: None,
        }
    }
}

/// Whether a split divides into `factor` chunks (outer) or chunks of `factor` elements (inner).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SplitKind {
    /// `outer_split(axis, f)`: outer extent `f`, inner extent `ceilDiv(e, f)`.
    Outer,
    /// `inner_split(axis, f)`: outer extent `ceilDiv(e, f)`, inner extent `f`.
    Inner,
}

/// A transform between iter domains, recorded so that indices can be traced back to the
/// logical domain (resharding proofs, allocation, replay).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IdExpr {
    /// `input` → `[outer, inner]`.
    Split {
        /// The axis split.
        input: IterDomainId,
        /// The outer output.
        outer: IterDomainId,
        /// The inner output.
        inner: IterDomainId,
        /// The factor as written.
        factor: Scalar,
        /// Which output the factor sizes.
        kind: SplitKind,
    },
    /// `[outer, inner]` → `output`.
    Merge {
        /// The outer input.
        outer: IterDomainId,
        /// The inner input.
        inner: IterDomainId,
        /// The merged axis.
        output: IterDomainId,
    },
}

impl IdExpr {
    /// The axes this transform reads.
    pub fn inputs(&self) -> Vec<IterDomainId> {
        match self {
            IdExpr::Split { input, .. } => vec![*input],
            IdExpr::Merge { outer, inner, .. } => vec![*outer, *inner],
        }
    }

    /// The axes this transform defines.
    pub fn outputs(&self) -> Vec<IterDomainId> {
        match self {
            IdExpr::Split { outer, inner, .. } => vec![*outer, *inner],
            IdExpr::Merge { output, .. } => vec![*output],
        }
    }
}
