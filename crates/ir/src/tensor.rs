//! Tensor views: a dtype, the logical/root/loop/allocation domains, a mesh, a memory type,
//! and the schedule recipe the user wrote for it.

use crate::diag::Span;
use crate::domain::{ParallelType, SplitKind};
use crate::dtype::DType;
use crate::ids::{ExprId, IterDomainId, MeshId};
use crate::scalar::Scalar;

/// Where a tensor lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryType {
    /// Device global memory (`_g`).
    Global,
    /// A kernel-local temporary (`_l`).
    Local,
    /// Symmetric memory registered with every peer (`_sym`), for copy-engine collectives.
    Symmetric,
}

impl MemoryType {
    /// The printer's infix (`g`, `l`, `sym`).
    pub fn short(self) -> &'static str {
        match self {
            MemoryType::Global => "g",
            MemoryType::Local => "l",
            MemoryType::Symmetric => "sym",
        }
    }

    /// The `.weave` spelling (`global`, `local`, `symmetric`).
    pub fn name(self) -> &'static str {
        match self {
            MemoryType::Global => "global",
            MemoryType::Local => "local",
            MemoryType::Symmetric => "symmetric",
        }
    }

    /// Parses [`MemoryType::name`].
    pub fn from_name(s: &str) -> Option<MemoryType> {
        [MemoryType::Global, MemoryType::Local, MemoryType::Symmetric]
            .into_iter()
            .find(|m| m.name() == s)
    }
}

/// One step of a tensor's schedule, as the user wrote it. Axis numbers refer to the loop
/// domain as it is when the step runs. `weave_transform::schedule` gives the steps meaning.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScheduleOp {
    /// `outer_split(axis, factor) [-> P]`: `factor` chunks; `P` parallelizes the outer output.
    OuterSplit {
        /// Loop axis to split.
        axis: usize,
        /// Number of chunks (must evaluate to a constant when applied).
        factor: Scalar,
        /// Parallel type for the outer output.
        parallel: Option<ParallelType>,
    },
    /// `inner_split(axis, factor) [-> P]`: chunks of `factor`; `P` parallelizes the outer output.
    InnerSplit {
        /// Loop axis to split.
        axis: usize,
        /// Chunk size.
        factor: Scalar,
        /// Parallel type for the outer output.
        parallel: Option<ParallelType>,
    },
    /// `merge(outer, inner)`: the two loop axes become one at `outer`'s position.
    Merge {
        /// Outer axis.
        outer: usize,
        /// Inner axis.
        inner: usize,
    },
    /// `reorder(a -> b, ...)`: move loop axis `a` to position `b`; unnamed axes keep order.
    Reorder {
        /// `(from, to)` pairs.
        moves: Vec<(usize, usize)>,
    },
    /// `parallelize(axis, P)`.
    Parallelize {
        /// Loop axis.
        axis: usize,
        /// The parallel type.
        parallel: ParallelType,
    },
    /// `swizzle1d(axis, DIDx)`: the stream loop over `axis` visits its chunks rotated by the
    /// device index (nvFuser's `Swizzle1D`).
    Swizzle1d {
        /// Loop axis.
        axis: usize,
        /// The device parallel type whose index rotates the chunks.
        parallel: ParallelType,
    },
    /// `allocation = loop`: the allocation domain becomes the current loop domain.
    AllocationAsLoop,
    /// `mesh = m`.
    SetMesh(MeshId),
    /// `memory = symmetric`.
    SetMemory(MemoryType),
}

impl ScheduleOp {
    /// The parts of an `outer_split` or `inner_split` step: its kind, loop axis, factor and
    /// parallel type for the outer output. `None` for every other step.
    pub fn as_split(&self) -> Option<(SplitKind, usize, &Scalar, Option<ParallelType>)> {
        match self {
            ScheduleOp::OuterSplit {
                axis,
                factor,
                parallel,
            } => Some((SplitKind::Outer, *axis, factor, *parallel)),
            ScheduleOp::InnerSplit {
                axis,
                factor,
                parallel,
            } => Some((SplitKind::Inner, *axis, factor, *parallel)),
            _ => None,
        }
    }

    /// The step as written in `.weave` (`outer_split(0, s) -> Stream`), spelling split
    /// factors with `factor` and the mesh of `mesh = m` with `mesh`.
    pub fn source_with(
        &self,
        factor: impl Fn(&Scalar) -> String,
        mesh: impl Fn(MeshId) -> String,
    ) -> String {
        let arrow = |p: &Option<ParallelType>| p.map(|p| format!(" -> {p}")).unwrap_or_default();
        match self {
            ScheduleOp::OuterSplit {
                axis,
                factor: fa,
                parallel,
            } => format!("outer_split({axis}, {}){}", factor(fa), arrow(parallel)),
            ScheduleOp::InnerSplit {
                axis,
                factor: fa,
                parallel,
            } => format!("inner_split({axis}, {}){}", factor(fa), arrow(parallel)),
            ScheduleOp::Merge { outer, inner } => format!("merge({outer}, {inner})"),
            ScheduleOp::Reorder { moves } => {
                let m: Vec<String> = moves.iter().map(|(a, b)| format!("{a} -> {b}")).collect();
                format!("reorder({})", m.join(", "))
            }
            ScheduleOp::Parallelize { axis, parallel } => {
                format!("parallelize({axis}, {parallel})")
            }
            ScheduleOp::Swizzle1d { axis, parallel } => format!("swizzle1d({axis}, {parallel})"),
            ScheduleOp::AllocationAsLoop => "allocation = loop".to_string(),
            ScheduleOp::SetMesh(m) => format!("mesh = {}", mesh(*m)),
            ScheduleOp::SetMemory(m) => format!("memory = {}", m.name()),
        }
    }
}

/// A schedule step and where it was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduleStep {
    /// The step.
    pub op: ScheduleOp,
    /// Its position in the source, for errors.
    pub span: Option<Span>,
}

/// A tensor of the fusion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorView {
    /// The user's name (`inp`, `out`), unique in the fusion; used by the `.weave` printer and
    /// in error messages. The seed-style printer numbers tensors `T0, T1, ...` instead.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// The global shape, including reduction axes produced by this tensor's definition.
    pub logical: Vec<IterDomainId>,
    /// The domain before root→logical transforms (reshape, rfactor), when there are any.
    pub root: Option<Vec<IterDomainId>>,
    /// The schedule: where DID and Stream axes live.
    pub loop_domain: Vec<IterDomainId>,
    /// The memory layout, outer to inner; `None` means "the logical domain".
    pub allocation: Option<Vec<IterDomainId>>,
    /// The device mesh, once known.
    pub mesh: Option<MeshId>,
    /// Memory type.
    pub memory: MemoryType,
    /// The expr that defines this tensor; `None` for fusion inputs.
    pub definition: Option<ExprId>,
    /// The schedule recipe as written (printed back by the `.weave` printer).
    pub schedule: Vec<ScheduleStep>,
    /// Where the tensor was declared or defined.
    pub span: Option<Span>,
}

impl TensorView {
    /// The allocation domain, defaulting to the logical domain.
    pub fn allocation_domain(&self) -> &[IterDomainId] {
        self.allocation.as_deref().unwrap_or(&self.logical)
    }

    /// The root domain, defaulting to the logical domain.
    pub fn root_domain(&self) -> &[IterDomainId] {
        self.root.as_deref().unwrap_or(&self.logical)
    }
}

/// Why a `reorder` cannot apply to a domain of `n` axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReorderError {
    /// A source axis (`what` = "axis") or a destination ("position") is `index >= n`.
    OutOfRange {
        /// "axis" or "position".
        what: &'static str,
        /// The index.
        index: usize,
    },
    /// Axis `0` is the source of two moves.
    MovedTwice(usize),
    /// Two moves have destination `0`.
    SamePosition(usize),
}

/// `items` reordered by `moves` (nvFuser's `reorder`): axis `from` goes to position `to` for
/// every `(from, to)`, the items not named keep their relative order in the remaining
/// positions. The sources and the destinations must each be distinct and in range.
pub fn reordered<T: Clone>(items: &[T], moves: &[(usize, usize)]) -> Result<Vec<T>, ReorderError> {
    let n = items.len();
    let mut placed: Vec<Option<T>> = vec![None; n];
    let mut moved = vec![false; n];
    for &(from, to) in moves {
        for (what, index) in [("axis", from), ("position", to)] {
            if index >= n {
                return Err(ReorderError::OutOfRange { what, index });
            }
        }
        if moved[from] {
            return Err(ReorderError::MovedTwice(from));
        }
        if placed[to].is_some() {
            return Err(ReorderError::SamePosition(to));
        }
        moved[from] = true;
        placed[to] = Some(items[from].clone());
    }
    let mut rest = items
        .iter()
        .enumerate()
        .filter(|(k, _)| !moved[*k])
        .map(|(_, x)| x.clone());
    // As many free positions as unmoved items: every `None` takes one.
    Ok(placed
        .into_iter()
        .filter_map(|p| p.or_else(|| rest.next()))
        .collect())
}
