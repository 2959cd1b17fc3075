//! The kinds of segment (communication, library call, generated kernel): what a segment is
//! run as, shared by the segments, their verifier and their errors.

use std::fmt;

/// How a segment is executed, which decides what `lower-to-host` emits for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SegmentKind {
    /// Exactly one resharding expr, lowered to one `Communication` (or a decomposition into
    /// point-to-point communications) followed by a `Wait`.
    Communication,
    /// Exactly one matmul or linear, run by the GEMM library into a preallocated output.
    Library,
    /// One or more compute exprs fused into one generated kernel.
    Kernel,
}

impl SegmentKind {
    /// The printer's spelling: `communication`, `library`, `kernel`.
    pub fn name(self) -> &'static str {
        match self {
            SegmentKind::Communication => "communication",
            SegmentKind::Library => "library",
            SegmentKind::Kernel => "kernel",
        }
    }

    /// True for the kinds that hold exactly one expr (communication, library).
    pub fn is_single_expr(self) -> bool {
        self != SegmentKind::Kernel
    }
}

impl fmt::Display for SegmentKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
