//! Pipelines: an ordered list of typed stages, printed as their items `a,b,c`.
//!
//! The standard pipeline is built from the passes themselves ([`Pipeline::standard`]), so it
//! cannot fail to build. Text is for the pipelines a user writes (`--passes` on the command
//! line), read against a [`Registry`]:
//!
//! * a pipeline is pass items separated by commas, `propagate-shardings,segment`; an item is
//!   a name, or a name with options in braces (`assign-streams{sync=separate-loop}`); spaces
//!   around an item are ignored, an empty item (`a,,b`, a trailing comma) is an error, and
//!   the empty string is the empty pipeline. [`Pipeline`]'s `Display` prints the canonical
//!   form (options only where they differ from the defaults), so `parse(p.to_string()) == p`.
//! * edits are `+x` and `-y` items separated by commas, applied left to right to a base
//!   pipeline: `+x` appends `x` unless the pipeline already holds it, `-y` removes every `y`
//!   (and does nothing when there is none); `x` and `y` are compared as canonical items, name
//!   and options. There is no positional insertion: to put a pass elsewhere, write the whole
//!   pipeline.
//!
//! Every item is checked against the registry, and every stage against the one before it:
//! a stage takes the form of IR the stage before it leaves (fusion passes, then `segment`,
//! then `lower-to-host`, then host passes). An unknown name, bad options or a stage out of
//! order fail at parse time, never halfway through a run.

use std::fmt;

use crate::pass::{Form, IntoStage, Stage};
use crate::registry::{default_passes, ItemError, Registry, UnknownPass};

/// An ordered list of stages; the pass manager runs them in order. Each stage takes the form
/// the stage before it leaves: every way of building a pipeline keeps that so.
///
/// Passes hold configuration only, so cloning a pipeline shares them. Two pipelines are equal
/// when they print the same: the same passes, with the same options, in the same order.
#[derive(Clone, Default)]
pub struct Pipeline {
    stages: Vec<Stage>,
}

/// Why a pipeline or an edit list does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PipelineParseError {
    /// A name that no registered pass has.
    #[error(transparent)]
    UnknownPass(#[from] UnknownPass),
    /// Options the pass does not take.
    #[error(transparent)]
    BadOptions(#[from] crate::registry::BadOptions),
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
    /// A stage that does not take the form the stage before it leaves: a host pass before
    /// `lower-to-host`, say.
    #[error(
        "`{pass}` runs on a {takes}, but `{before}` before it leaves a {leaves} (in `{text}`): \
         a pipeline runs the fusion passes, then segment, then lower-to-host, then the host \
         passes"
    )]
    Order {
        /// The whole text given (the resulting pipeline, for edits).
        text: String,
        /// The stage out of place.
        pass: String,
        /// The form it runs on.
        takes: &'static str,
        /// The stage before it.
        before: String,
        /// The form that one leaves.
        leaves: &'static str,
    },
}

impl From<ItemError> for PipelineParseError {
    fn from(e: ItemError) -> PipelineParseError {
        match e {
            ItemError::Unknown(e) => e.into(),
            ItemError::Options(e) => e.into(),
        }
    }
}

impl Pipeline {
    /// The standard pipeline, from a scheduled fusion to the host program every rank runs
    /// (DESIGN.md §1, §5): the default passes of the one table (`STANDARD_PASSES` in
    /// registry.rs) that also fills [`Registry::standard`]; docs/passes.md lists them.
    pub fn standard() -> Pipeline {
        Pipeline::from_stages(default_passes().collect()).expect("the standard passes are in order")
    }

    /// A pipeline of `stages`, or the error naming the first stage out of order.
    pub fn from_stages(stages: Vec<Stage>) -> Result<Pipeline, PipelineParseError> {
        let pipeline = Pipeline { stages };
        pipeline.check_order()?;
        Ok(pipeline)
    }

    /// The same pipeline with `pass` appended.
    ///
    /// # Panics
    ///
    /// If `pass` does not take the form the last stage leaves (see [`Pipeline::try_push`]).
    pub fn then<M>(mut self, pass: impl IntoStage<M>) -> Pipeline {
        self.push(pass);
        self
    }

    /// Appends `pass`.
    ///
    /// # Panics
    ///
    /// If `pass` does not take the form the last stage leaves (see [`Pipeline::try_push`]).
    pub fn push<M>(&mut self, pass: impl IntoStage<M>) {
        if let Err(e) = self.try_push(pass) {
            panic!("{e}");
        }
    }

    /// Appends `pass`, or says why it cannot follow the last stage.
    pub fn try_push<M>(&mut self, pass: impl IntoStage<M>) -> Result<(), PipelineParseError> {
        self.stages.push(pass.into_stage());
        let checked = self.check_order();
        if checked.is_err() {
            self.stages.pop();
        }
        checked
    }

    /// Replaces every pass called `name` by `pass` (the same pass with other options, say
    /// `AssignStreams::new(SyncVariant::SeparateLoop)` for `assign-streams`); returns whether
    /// there was one.
    ///
    /// # Panics
    ///
    /// If `pass` takes or leaves another form than the pass it replaces.
    pub fn replace<M>(&mut self, name: &str, pass: impl IntoStage<M>) -> bool {
        let pass = pass.into_stage();
        let mut found = false;
        for slot in self.stages.iter_mut().filter(|p| p.name() == name) {
            assert!(
                (slot.input(), slot.output()) == (pass.input(), pass.output()),
                "`{}` cannot replace `{name}`: it runs on another form of IR",
                pass.name()
            );
            *slot = pass.clone();
            found = true;
        }
        found
    }

    /// The same pipeline without the passes called `name`:
    /// `Pipeline::standard().without("merge-kernel-chunks")` keeps every stream loop as
    /// `lower-to-host` builds it.
    ///
    /// # Panics
    ///
    /// If removing them leaves a stage that does not take the form the one before it leaves
    /// (`without("segment")`).
    pub fn without(mut self, name: &str) -> Pipeline {
        self.stages.retain(|p| p.name() != name);
        if let Err(e) = self.check_order() {
            panic!("without `{name}`: {e}");
        }
        self
    }

    /// The stages, in run order.
    pub fn passes(&self) -> &[Stage] {
        &self.stages
    }

    /// The pass names, in run order.
    pub fn names(&self) -> Vec<&'static str> {
        self.stages.iter().map(|p| p.name()).collect()
    }

    /// How many passes the pipeline runs.
    pub fn len(&self) -> usize {
        self.stages.len()
    }

    /// Whether the pipeline runs no pass.
    pub fn is_empty(&self) -> bool {
        self.stages.is_empty()
    }

    /// The form the first stage takes (`None` for the empty pipeline, which takes any).
    pub fn input(&self) -> Option<Form> {
        self.stages.first().map(Stage::input)
    }

    /// Parses `a,b,c`, making every pass from `registry`.
    pub fn parse(text: &str, registry: &Registry) -> Result<Pipeline, PipelineParseError> {
        let mut stages = Vec::new();
        for item in items(text)? {
            if item.starts_with(['+', '-']) {
                return Err(PipelineParseError::Mixed {
                    text: text.to_string(),
                    item: item.to_string(),
                });
            }
            stages.push(registry.make(item)?);
        }
        Pipeline { stages }.checked(text)
    }

    /// Applies edits `+x,-y` (module docs) left to right, making added passes from
    /// `registry`. On error the pipeline is left as it was.
    pub fn apply_edits(
        &mut self,
        edits: &str,
        registry: &Registry,
    ) -> Result<(), PipelineParseError> {
        let mut stages = self.stages.clone();
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
            let pass = registry.make(name)?;
            let spec = pass.spec();
            if add {
                if !stages.iter().any(|p| p.spec() == spec) {
                    stages.push(pass);
                }
            } else {
                stages.retain(|p| p.spec() != spec);
            }
        }
        let edited = Pipeline { stages };
        let text = edited.to_string();
        *self = edited.checked(&text)?;
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

    /// `self`, if every stage takes the form the one before it leaves; `text` is what the
    /// error quotes.
    fn checked(self, text: &str) -> Result<Pipeline, PipelineParseError> {
        match self.check_order() {
            Ok(()) => Ok(self),
            Err(PipelineParseError::Order {
                pass,
                takes,
                before,
                leaves,
                ..
            }) => Err(PipelineParseError::Order {
                text: text.to_string(),
                pass,
                takes,
                before,
                leaves,
            }),
            Err(e) => Err(e),
        }
    }

    fn check_order(&self) -> Result<(), PipelineParseError> {
        for pair in self.stages.windows(2) {
            let (before, stage) = (&pair[0], &pair[1]);
            if before.output() != stage.input() {
                return Err(PipelineParseError::Order {
                    text: self.to_string(),
                    pass: stage.spec(),
                    takes: stage.input().name(),
                    before: before.spec(),
                    leaves: before.output().name(),
                });
            }
        }
        Ok(())
    }
}

impl FromIterator<Stage> for Pipeline {
    /// # Panics
    ///
    /// If a stage does not take the form the one before it leaves
    /// ([`Pipeline::from_stages`] says so instead).
    fn from_iter<I: IntoIterator<Item = Stage>>(stages: I) -> Pipeline {
        Pipeline::from_stages(stages.into_iter().collect()).unwrap_or_else(|e| panic!("{e}"))
    }
}

impl PartialEq for Pipeline {
    fn eq(&self, other: &Pipeline) -> bool {
        self.to_string() == other.to_string()
    }
}

impl Eq for Pipeline {}

impl fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.stages.iter().map(Stage::spec))
            .finish()
    }
}

impl fmt::Display for Pipeline {
    /// The canonical text, `a,b{k=v},c`, which [`Pipeline::parse`] reads back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let items: Vec<String> = self.stages.iter().map(Stage::spec).collect();
        f.write_str(&items.join(","))
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
        let listed: Vec<&str> = registry.list().iter().map(|info| info.name).collect();
        assert_eq!(
            listed, default,
            "the standard registry holds the default pipeline's passes in its order"
        );
        for info in registry.list() {
            assert!(!info.summary.is_empty(), "`{}` has no summary", info.name);
            assert!(
                !info.summary.contains('\n'),
                "`{}`: multi-line summary",
                info.name
            );
        }
        for (i, n) in default.iter().enumerate() {
            assert!(!default[..i].contains(n), "`{n}` twice");
        }
        let text = Pipeline::standard().to_string();
        assert_eq!(
            text,
            default.join(","),
            "the defaults print without options"
        );
        assert_eq!(
            Pipeline::parse(&text, &registry).unwrap(),
            Pipeline::standard()
        );
        assert!(!registry.listing().contains("not registered"));
    }

    /// docs/passes.md lists every standard pass in its table, in pipeline order, and shows
    /// the default pipeline as `Pipeline::standard()` prints it.
    #[test]
    fn docs_list_every_standard_pass() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/passes.md");
        let docs = std::fs::read_to_string(path).unwrap();
        // The rows of the table that opens with `| pass |`.
        let documented: Vec<&str> = docs
            .lines()
            .skip_while(|l| !l.starts_with("| pass |"))
            .take_while(|l| l.starts_with('|'))
            .filter_map(|l| l.strip_prefix("| `"))
            .filter_map(|l| l.split(['`', '{']).next())
            .filter(|name| !name.is_empty())
            .collect();
        let mut distinct: Vec<&str> = Vec::new();
        for name in documented {
            if !distinct.contains(&name) {
                distinct.push(name);
            }
        }
        let registered: Vec<&str> = Registry::standard()
            .list()
            .iter()
            .map(|info| info.name)
            .collect();
        assert_eq!(
            distinct, registered,
            "docs/passes.md's table of passes lists the standard passes in pipeline order"
        );
        let standard = Pipeline::standard().to_string();
        assert!(
            docs.contains(&format!("```\n{standard}\n```")),
            "docs/passes.md shows the default pipeline `{standard}`"
        );
    }

    /// A host pass before lowering, or a lowering out of place, is refused when the pipeline
    /// is parsed, naming both stages and their forms.
    #[test]
    fn stages_out_of_order_are_refused_at_parse_time() {
        let registry = Registry::standard();
        let err = Pipeline::parse("propagate-shardings,assign-streams", &registry).unwrap_err();
        assert_eq!(
            err.to_string(),
            "`assign-streams` runs on a host program, but `propagate-shardings` before it \
             leaves a fusion (in `propagate-shardings,assign-streams`): a pipeline runs the \
             fusion passes, then segment, then lower-to-host, then the host passes"
        );
        assert!(matches!(err, PipelineParseError::Order { .. }));
        for bad in [
            "segment,assign-streams,lower-to-host",
            "assign-streams,lower-to-host",
            "segment,propagate-shardings",
            "lower-to-host,segment",
            "propagate-shardings,lower-to-host",
        ] {
            assert!(
                matches!(
                    Pipeline::parse(bad, &registry),
                    Err(PipelineParseError::Order { .. })
                ),
                "{bad}"
            );
        }
        // Partial pipelines that start or stop at any form are fine.
        for good in [
            "assign-streams,allocate-and-deallocate",
            "lower-to-host,merge-kernel-chunks",
            "propagate-shardings,segment",
            "",
        ] {
            Pipeline::parse(good, &registry).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
        // Edits are checked too: removing `segment` leaves lower-to-host after a fusion pass.
        let mut p = Pipeline::standard();
        let err = p.apply_edits("-segment", &registry).unwrap_err();
        assert!(matches!(err, PipelineParseError::Order { .. }), "{err}");
        assert_eq!(
            p,
            Pipeline::standard(),
            "a bad edit leaves the pipeline as it was"
        );
        assert!(p
            .try_push(crate::propagate_shardings::PropagateShardings)
            .is_err());
        assert_eq!(p, Pipeline::standard());
    }

    /// Variants are options of one pass; their older names are aliases of those options.
    #[test]
    fn variants_are_options_and_old_names_are_aliases() {
        let registry = Registry::standard();
        for (alias, item) in [
            (
                "lower-to-host-broadcast",
                "lower-to-host{allgather=broadcast}",
            ),
            (
                "assign-streams-separate-sync",
                "assign-streams{sync=separate-loop}",
            ),
        ] {
            let a = Pipeline::parse(alias, &registry).unwrap();
            let b = Pipeline::parse(item, &registry).unwrap();
            assert_eq!(a, b);
            assert_eq!(a.to_string(), item);
            assert_eq!(Pipeline::parse(&a.to_string(), &registry).unwrap(), a);
            assert!(registry.contains(alias));
        }
        // The defaults print as the bare name.
        assert_eq!(
            Pipeline::parse("assign-streams{sync=inline}", &registry)
                .unwrap()
                .to_string(),
            "assign-streams"
        );
        let err = Pipeline::parse("assign-streams{sync=never}", &registry).unwrap_err();
        assert_eq!(
            err.to_string(),
            "pass `assign-streams`: `sync=never`: write `sync=inline` or `sync=separate-loop` \
             (in `assign-streams{sync=never}`)"
        );
        // A count: printed back as given, refused out of range or not a number.
        let pieces = Pipeline::parse(
            "lower-to-host{allgather=broadcast ring-pieces=4}",
            &registry,
        )
        .unwrap();
        assert_eq!(
            pieces.to_string(),
            "lower-to-host{allgather=broadcast ring-pieces=4}"
        );
        for bad in ["0", "65", "two", "-1"] {
            let item = format!("lower-to-host{{ring-pieces={bad}}}");
            let err = Pipeline::parse(&item, &registry).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!(
                    "pass `lower-to-host`: `ring-pieces={bad}`: write a whole number from 1 to 64 (in `{item}`)"
                )
            );
        }
        let err = Pipeline::parse("segment{fast=yes}", &registry).unwrap_err();
        assert_eq!(
            err.to_string(),
            "pass `segment`: unknown option `fast` (in `segment{fast=yes}`)"
        );
        let listing = registry.listing();
        assert!(
            listing.contains("lower-to-host-broadcast       lower-to-host{allgather=broadcast}\n"),
            "{listing}"
        );
    }
}
