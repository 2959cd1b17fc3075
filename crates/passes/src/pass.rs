//! The interface of a pass and the IR a pipeline hands from one pass to the next.

use weave_host_ir::HostProgram;
use weave_ir::{Diagnostic, Fusion};
use weave_segmenter::SegmentedFusion;

/// The IR between two passes of a pipeline. A pass accepts one form and leaves one form;
/// lowering passes are the ones that change the form.
// An `Ir` moves once per pass and is never stored in bulk, so the size of its largest variant
// costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Ir {
    /// A fusion, before segmentation.
    Fusion(Fusion),
    /// A fusion partitioned into segments.
    Segmented(SegmentedFusion),
    /// A host program.
    Host(HostProgram),
}

impl Ir {
    /// The name of the form, for error messages (`fusion`, `segmented fusion`, `host program`).
    pub fn form(&self) -> &'static str {
        match self {
            Ir::Fusion(_) => "fusion",
            Ir::Segmented(_) => "segmented fusion",
            Ir::Host(_) => "host program",
        }
    }
}

/// Whether a pass changed its input. Pipelines use it to print only changed IR
/// (`--print-after-change`) and tests use it to check that a pass is idempotent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Changed {
    /// The IR was modified.
    Yes,
    /// The IR is exactly as it was.
    No,
}

/// One named transformation of the IR.
///
/// A pass holds configuration only (its variant), never state of a run: a [`crate::Pipeline`]
/// shares its passes between clones and threads.
pub trait Pass: Send + Sync {
    /// The name used in pipelines and on the command line (`propagate-shardings`).
    fn name(&self) -> &'static str;

    /// One line saying what the pass does, shown when listing passes.
    fn summary(&self) -> &'static str;

    /// Runs the pass on `ir`, in place. A pass given a form it does not accept returns
    /// [`PassError::WrongForm`] and leaves `ir` as it was.
    fn run(&self, ir: &mut Ir) -> Result<Changed, PassError>;
}

/// Why a pass, or the verifier after it, rejected the IR.
#[derive(Clone, Debug, thiserror::Error)]
pub enum PassError {
    /// The pass was given a form of IR it does not accept.
    #[error("pass `{pass}` expects a {expected}, got a {found}")]
    WrongForm {
        /// The pass.
        pass: &'static str,
        /// The form it accepts.
        expected: &'static str,
        /// The form it was given.
        found: &'static str,
    },
    /// The pass cannot handle this input; the diagnostic names the tensor, axis or statement.
    #[error("pass `{pass}`: {}", diagnostic.message)]
    Unsupported {
        /// The pass.
        pass: &'static str,
        /// What it could not handle.
        diagnostic: Diagnostic,
    },
    /// The verifier rejected the output of the pass: a bug in the pass.
    #[error("IR invalid after pass `{pass}`: {}", diagnostic.message)]
    Verify {
        /// The pass that produced the invalid IR.
        pass: &'static str,
        /// What the verifier found.
        diagnostic: Diagnostic,
    },
}
