//! Pipelines: an ordered list of passes, printed as their names `a,b,c`.
//!
//! The standard pipeline is built from the passes themselves ([`Pipeline::standard`]), so it
//! cannot fail to build. Text is for the pipelines a user writes (`--passes` on the command
//! line), read against a [`Registry`]:
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
//! Every name is checked against the registry, so an unknown name fails at parse time with
//! the list of valid ones, never halfway through a run.

use std::fmt;
use std::sync::Arc;

use crate::pass::Pass;
use crate::registry::{default_passes, Registry, UnknownPass};

/// An ordered list of passes; the pass manager runs them in order.
///
/// Passes hold configuration only, so cloning a pipeline shares them. Two pipelines are equal
/// when they name the same passes in the same order.
#[derive(Clone, Default)]
pub struct Pipeline {
    passes: Vec<Arc<dyn Pass>>,
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
    /// The standard pipeline, from a scheduled fusion to the host program every rank runs
    /// (DESIGN.md §1, §5): `propagate-shardings, decompose-reshardings, reorder-sharded-axis,
    /// finalize-multidevice-domains, segment, lower-to-host, merge-kernel-chunks,
    /// assign-streams, allocate-and-deallocate`, the default passes of the one table that
    /// also fills [`Registry::standard`].
    pub fn standard() -> Pipeline {
        default_passes().map(Arc::from).collect()
    }

    /// The same pipeline with `pass` appended.
    pub fn then(mut self, pass: impl Pass + 'static) -> Pipeline {
        self.push(pass);
        self
    }

    /// Appends `pass`.
    pub fn push(&mut self, pass: impl Pass + 'static) {
        self.passes.push(Arc::new(pass));
    }

    /// Replaces every pass called `name` by `pass` (a variant of it, say
    /// `AssignStreams::new(SyncVariant::SeparateLoop)` for `assign-streams`); returns whether
    /// there was one.
    pub fn replace(&mut self, name: &str, pass: impl Pass + 'static) -> bool {
        let pass: Arc<dyn Pass> = Arc::new(pass);
        let mut found = false;
        for slot in self.passes.iter_mut().filter(|p| p.name() == name) {
            *slot = Arc::clone(&pass);
            found = true;
        }
        found
    }

    /// The same pipeline without the passes called `name`:
    /// `Pipeline::standard().without("merge-kernel-chunks")` keeps every stream loop as
    /// `lower-to-host` builds it.
    pub fn without(mut self, name: &str) -> Pipeline {
        self.passes.retain(|p| p.name() != name);
        self
    }

    /// The passes, in run order.
    pub fn passes(&self) -> &[Arc<dyn Pass>] {
        &self.passes
    }

    /// The pass names, in run order.
    pub fn names(&self) -> Vec<&'static str> {
        self.passes.iter().map(|p| p.name()).collect()
    }

    /// How many passes the pipeline runs.
    pub fn len(&self) -> usize {
        self.passes.len()
    }

    /// Whether the pipeline runs no pass.
    pub fn is_empty(&self) -> bool {
        self.passes.is_empty()
    }

    /// Parses `a,b,c`, making every pass from `registry`.
    pub fn parse(text: &str, registry: &Registry) -> Result<Pipeline, PipelineParseError> {
        let mut passes = Vec::new();
        for item in items(text)? {
            if item.starts_with(['+', '-']) {
                return Err(PipelineParseError::Mixed {
                    text: text.to_string(),
                    item: item.to_string(),
                });
            }
            passes.push(Arc::from(registry.get(item)?));
        }
        Ok(Pipeline { passes })
    }

    /// Applies edits `+x,-y` (module docs) left to right, making added passes from
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
            let pass = registry.get(name)?;
            if add {
                if !passes.iter().any(|p| p.name() == name) {
                    passes.push(Arc::from(pass));
                }
            } else {
                passes.retain(|p| p.name() != name);
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
}

impl FromIterator<Arc<dyn Pass>> for Pipeline {
    fn from_iter<I: IntoIterator<Item = Arc<dyn Pass>>>(passes: I) -> Pipeline {
        Pipeline {
            passes: passes.into_iter().collect(),
        }
    }
}

impl PartialEq for Pipeline {
    fn eq(&self, other: &Pipeline) -> bool {
        self.names() == other.names()
    }
}

impl Eq for Pipeline {}

impl fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

impl fmt::Display for Pipeline {
    /// The canonical text, `a,b,c`, which [`Pipeline::parse`] reads back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.names().join(","))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_passes_have_distinct_names_and_follow_the_default_pipeline() {
        // Building the registry panics on a duplicate name.
        let registry = Registry::standard();
        let default = Pipeline::standard().names();
        let all = registry.names();
        // Variants that replace a default pass when named in a pipeline.
        let alternatives = ["lower-to-host-broadcast", "assign-streams-separate-sync"];
        let registered: Vec<&str> = all
            .iter()
            .copied()
            .filter(|n| !alternatives.contains(n))
            .collect();
        assert_eq!(
            registered, default,
            "the standard registry holds the default pipeline's passes in its order, and \
             its variants"
        );
        assert!(alternatives.iter().all(|a| all.contains(a)));
        for info in registry.list() {
            assert!(!info.summary.is_empty(), "`{}` has no summary", info.name);
            assert!(
                !info.summary.contains('\n'),
                "`{}`: multi-line summary",
                info.name
            );
        }
        let text = Pipeline::standard().to_string();
        assert_eq!(
            text,
            "propagate-shardings,decompose-reshardings,reorder-sharded-axis,\
             finalize-multidevice-domains,segment,lower-to-host,merge-kernel-chunks,\
             assign-streams,allocate-and-deallocate"
        );
        assert_eq!(
            Pipeline::parse(&text, &registry).unwrap(),
            Pipeline::standard()
        );
        assert!(!registry.listing().contains("not registered"));
    }

    #[test]
    fn default_pipeline_has_no_duplicates() {
        let names = Pipeline::standard().names();
        assert_eq!(names.len(), 9);
        for (i, n) in names.iter().enumerate() {
            assert!(!names[..i].contains(n), "`{n}` twice");
        }
    }
}
