//! Named pipelines: an ordered list of pass names, printed and parsed as `a,b,c`.
//!
//! Text forms:
//!
//! * a pipeline is pass names separated by commas, `propagate-shardings,segment`; spaces
//!   around a name are ignored, an empty name (`a,,b`, a trailing comma) is an error, and the
//!   empty string is the empty pipeline. [`Pipeline`]'s `Display` prints the canonical form,
//!   so `parse(p.to_string()) == p`.
//! * edits are `+x` and `-y` items separated by commas, applied left to right to a base
//!   pipeline: `+x` appends `x` unless the pipeline already holds it, `-y` removes every `y`
//!   (and does nothing when there is none). There is no positional insertion: to put a pass
//!   elsewhere, write the whole pipeline.
//!
//! Every name is checked against a [`Registry`], so an unknown name fails at parse time with
//! the list of valid ones, never halfway through a run.

use std::fmt;

use crate::registry::{Registry, UnknownPass};

/// An ordered list of pass names; the pass manager runs them in order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Pipeline {
    /// The pass names, in run order.
    pub passes: Vec<String>,
}

/// Why a pipeline or an edit list does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PipelineParseError {
    /// A name that no registered pass has.
    #[error(transparent)]
    UnknownPass(#[from] UnknownPass),
    /// An empty item: `a,,b` or a trailing comma.
    #[error("empty pass name in `{text}` (passes are separated by single commas)")]
    EmptyName {
        /// The whole text given.
        text: String,
    },
    /// An edit list item without `+` or `-`, or a pipeline item with one.
    #[error(
        "`{item}` in `{text}`: write either a pipeline (`a,b,c`) or edits (`+x,-y`), not both"
    )]
    Mixed {
        /// The whole text given.
        text: String,
        /// The item that does not fit.
        item: String,
    },
}

impl Pipeline {
    /// A pipeline of `passes`, in order, unchecked (see [`Pipeline::parse`] for the checked
    /// form).
    pub fn new<S: Into<String>>(passes: impl IntoIterator<Item = S>) -> Pipeline {
        Pipeline {
            passes: passes.into_iter().map(Into::into).collect(),
        }
    }

    /// Parses `a,b,c`, checking every name against `registry`.
    pub fn parse(text: &str, registry: &Registry) -> Result<Pipeline, PipelineParseError> {
        let mut passes = Vec::new();
        for item in items(text)? {
            if item.starts_with(['+', '-']) {
                return Err(PipelineParseError::Mixed {
                    text: text.to_string(),
                    item: item.to_string(),
                });
            }
            registry.check(item)?;
            passes.push(item.to_string());
        }
        Ok(Pipeline { passes })
    }

    /// Applies edits `+x,-y` (module docs) left to right, checking every name against
    /// `registry`. On error the pipeline is left as it was.
    pub fn apply_edits(
        &mut self,
        edits: &str,
        registry: &Registry,
    ) -> Result<(), PipelineParseError> {
        let mut passes = self.passes.clone();
        for item in items(edits)? {
            let (add, name) = if let Some(name) = item.strip_prefix('+') {
                (true, name.trim())
            } else if let Some(name) = item.strip_prefix('-') {
                (false, name.trim())
            } else {
                return Err(PipelineParseError::Mixed {
                    text: edits.to_string(),
                    item: item.to_string(),
                });
            };
            if name.is_empty() {
                return Err(PipelineParseError::EmptyName {
                    text: edits.to_string(),
                });
            }
            registry.check(name)?;
            if add {
                if !passes.iter().any(|p| p == name) {
                    passes.push(name.to_string());
                }
            } else {
                passes.retain(|p| p != name);
            }
        }
        self.passes = passes;
        Ok(())
    }

    /// Reads a `--passes` value: a whole pipeline (`a,b,c`), which replaces `base`, or edits
    /// (`+x,-y`, every item signed), which apply to `base`.
    pub fn resolve(
        spec: &str,
        base: &Pipeline,
        registry: &Registry,
    ) -> Result<Pipeline, PipelineParseError> {
        let is_edit = |item: &str| item.starts_with(['+', '-']);
        let all = items(spec)?;
        if !all.is_empty() && all.iter().all(|i| is_edit(i)) {
            let mut pipeline = base.clone();
            pipeline.apply_edits(spec, registry)?;
            Ok(pipeline)
        } else {
            Pipeline::parse(spec, registry)
        }
    }

    /// Whether the pipeline runs no pass.
    pub fn is_empty(&self) -> bool {
        self.passes.is_empty()
    }
}

impl fmt::Display for Pipeline {
    /// The canonical text, `a,b,c`, which [`Pipeline::parse`] reads back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.passes.join(","))
    }
}

/// The comma-separated, trimmed items of `text`; the empty (or all-space) text has none.
fn items(text: &str) -> Result<Vec<&str>, PipelineParseError> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    text.split(',')
        .map(|item| match item.trim() {
            "" => Err(PipelineParseError::EmptyName {
                text: text.to_string(),
            }),
            item => Ok(item),
        })
        .collect()
}
