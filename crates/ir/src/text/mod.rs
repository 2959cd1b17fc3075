//! The `.weave` text format: lexer, parser and printer (grammar in docs/fusion-format.md).
//!
//! Error spans: syntax errors point at the token where something else was expected; errors
//! about a name (undefined tensor, mesh or parameter; duplicate name; unknown op, dtype, step
//! or parallel type) point at that name; errors the builder reports for an op statement
//! (arity, dtype, shape, axes) point at the **op name**, which is also the span recorded on
//! the expr; an unterminated block points at the `{` that opened it; an unknown `--set`
//! parameter points at the header's `fusion` keyword.

mod lexer;
mod parser;
mod printer;

#[cfg(test)]
mod tests;

use crate::diag::Diagnostic;
use crate::fusion::Fusion;

/// Parses a `.weave` source. `overrides` (`--set k=v`) replace parameter defaults before any
/// parameter is used. Schedules are recorded on the tensors, not applied
/// (`weave_transform::schedule::apply_schedules` does that).
///
/// Never panics: every malformed input gives a [`Diagnostic`] with the line:col of the
/// offending token (see the module docs for which token that is).
pub fn parse(source: &str, overrides: &[(String, i64)]) -> Result<Fusion, Diagnostic> {
    parser::parse(source, overrides)
}

/// Prints a fusion in canonical `.weave` form (docs/fusion-format.md §Printing).
/// `print(&parse(&print(f))?)` equals `print(f)` for every parsed fusion `f`.
pub fn print(fusion: &Fusion) -> String {
    printer::print(fusion)
}
