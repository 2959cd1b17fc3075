//! The one error type of the facade ([`Error`]): loading, compiling, binding inputs and
//! running all convert into it.

#[cfg(doc)]
use weave_ir::Fusion;

use crate::run::RunError;
use crate::LoadError;

/// Everything that can go wrong between a fusion and its outputs: the one error type of the
/// facade. Every error of the crate's API converts into it with `?` ([`LoadError`],
/// [`weave_passes::PipelineError`], [`RunError`], a [`weave_ir::Diagnostic`] of a fusion
/// built in Rust), so a program's `main` can return it.
///
/// Its `Debug` form is its `Display` form, the message a user reads, because that is what
/// `main` prints when it returns `Err` (`Error: input `x`: …`); the alternate form (`{:#?}`)
/// shows the variant and its fields.
///
/// ```
/// fn main() -> Result<(), streamweave::Error> {
///     let err = streamweave::Compiler::new()
///         .compile_source("bad.weave", "fusion f() {\n  tensor x: f99[4]\n}")
///         .unwrap_err();
///     let shown = format!("{err:?}");
///     assert_eq!(shown, err.to_string());
///     assert!(shown.contains("bad.weave:2:"), "{shown}");
///     Ok(())
/// }
/// ```
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The fusion text does not load (with file:line:col).
    #[error("{0}")]
    Load(#[from] LoadError),
    /// A fusion built or changed in Rust ([`weave_ir::Fusion`]'s builder,
    /// [`Fusion::set_param`]) is refused.
    #[error("{}", .0.message)]
    Fusion(#[from] weave_ir::Diagnostic),
    /// The pass pipeline failed.
    #[error("{0}")]
    Compile(#[from] weave_passes::PipelineError),
    /// A host program has no signature, or one that does not fit it.
    #[error("{0}")]
    Program(String),
    /// A tensor handed in does not fit the signature.
    #[error("input `{tensor}`: {message}")]
    Input {
        /// The input's name.
        tensor: String,
        /// What is wrong.
        message: String,
    },
    /// Setting up or running the ranks failed.
    #[error("{0}")]
    Run(#[from] RunError),
}

/// The message, as `Display` writes it (see [`Error`]); `{:#?}` gives the variant and its
/// fields.
impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !f.alternate() {
            return std::fmt::Display::fmt(self, f);
        }
        match self {
            Error::Load(e) => f.debug_tuple("Load").field(e).finish(),
            Error::Fusion(e) => f.debug_tuple("Fusion").field(e).finish(),
            Error::Compile(e) => f.debug_tuple("Compile").field(e).finish(),
            Error::Program(e) => f.debug_tuple("Program").field(e).finish(),
            Error::Input { tensor, message } => f
                .debug_struct("Input")
                .field("tensor", tensor)
                .field("message", message)
                .finish(),
            Error::Run(e) => f.debug_tuple("Run").field(e).finish(),
        }
    }
}
