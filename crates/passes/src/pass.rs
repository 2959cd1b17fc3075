//! The interface of a pass, typed by the IR it runs on, and the IR a pipeline hands from one
//! stage to the next.
//!
//! A pass runs on one form of IR and says so in its type: a [`FusionPass`] runs on a
//! [`Fusion`], a [`HostPass`] on a [`HostProgram`], and a [`Lowering`] turns one form into the
//! next (`segment`: fusion → segmented fusion; `lower-to-host`: segmented fusion → host
//! program). A pipeline holds them as [`Stage`]s, which it keeps in form order when it is
//! built or parsed, so no pass ever checks the form of its input at run time.

use std::sync::Arc;

use weave_host_ir::HostProgram;
use weave_ir::{Diagnostic, Fusion};
use weave_segmenter::SegmentedFusion;

/// The IR between two stages of a pipeline: what a pipeline takes and gives back.
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
        self.kind().name()
    }

    /// The form.
    pub fn kind(&self) -> Form {
        match self {
            Ir::Fusion(_) => Form::Fusion,
            Ir::Segmented(_) => Form::Segmented,
            Ir::Host(_) => Form::Host,
        }
    }
}

/// A form of IR, in pipeline order: a stage takes one and leaves one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Form {
    /// A [`Fusion`].
    Fusion,
    /// A [`SegmentedFusion`].
    Segmented,
    /// A [`HostProgram`].
    Host,
}

impl Form {
    /// The name used in messages and dump headers.
    pub fn name(self) -> &'static str {
        match self {
            Form::Fusion => "fusion",
            Form::Segmented => "segmented fusion",
            Form::Host => "host program",
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

/// What every pass says about itself: its name, its summary and its options.
///
/// A pass holds configuration only (its options), never state of a run: a
/// [`crate::Pipeline`] shares its passes between clones and threads.
pub trait Pass: Send + Sync {
    /// The name used in pipelines and on the command line (`propagate-shardings`).
    fn name(&self) -> &'static str;

    /// One line saying what the pass does, shown when listing passes.
    fn summary(&self) -> &'static str;

    /// The options that differ from the pass's defaults, as written between the braces of a
    /// pipeline item (`allgather=broadcast` in `lower-to-host{allgather=broadcast}`); empty
    /// for the defaults and for a pass without options.
    fn options(&self) -> String {
        String::new()
    }
}

/// Why a pipeline item's options do not fit its pass: [`PassOptions::parse`],
/// [`PassOptions::finish`] and the passes' `with_options`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PassOptionError {
    /// An item is not of the form `key=value`.
    #[error("`{item}` is not an option: write `key=value`")]
    NotKeyValue {
        /// The item as written.
        item: String,
    },
    /// A key is given twice.
    #[error("option `{key}` is given twice")]
    Duplicate {
        /// The key.
        key: String,
    },
    /// A key that the pass does not read.
    #[error("unknown option `{key}`")]
    Unknown {
        /// The key.
        key: String,
    },
    /// A value the option does not take.
    #[error("`{key}={value}`: write {}", choices(.key, .allowed))]
    BadValue {
        /// The option.
        key: &'static str,
        /// The value given.
        value: String,
        /// The values it takes.
        allowed: &'static [&'static str],
    },
    /// A count that is not a whole number in its range.
    #[error("`{key}={value}`: write a whole number from 1 to {max}")]
    BadCount {
        /// The option.
        key: &'static str,
        /// The value given.
        value: String,
        /// The largest count it takes.
        max: i64,
    },
}

/// `` `k=a` or `k=b` ``: the values an option takes, as an error lists them.
fn choices(key: &str, allowed: &[&str]) -> String {
    let items: Vec<String> = allowed.iter().map(|v| format!("`{key}={v}`")).collect();
    match items.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => items.concat(),
    }
}

/// The options of one pipeline item, `name{key=value key=value}`: a pass reads the keys it
/// knows with [`PassOptions::take`], then [`PassOptions::finish`] refuses any other.
#[derive(Debug, Default)]
pub struct PassOptions {
    items: Vec<(String, String)>,
    taken: std::cell::RefCell<Vec<bool>>,
}

impl PassOptions {
    /// No options: every pass's defaults.
    pub fn none() -> PassOptions {
        PassOptions::default()
    }

    /// Reads the text between the braces: `key=value` items separated by spaces.
    pub fn parse(text: &str) -> Result<PassOptions, PassOptionError> {
        let mut items: Vec<(String, String)> = Vec::new();
        for item in text.split_whitespace() {
            let not_key_value = || PassOptionError::NotKeyValue {
                item: item.to_string(),
            };
            let Some((key, value)) = item.split_once('=') else {
                return Err(not_key_value());
            };
            if key.is_empty() || value.is_empty() {
                return Err(not_key_value());
            }
            if items.iter().any(|(k, _)| k == key) {
                return Err(PassOptionError::Duplicate {
                    key: key.to_string(),
                });
            }
            items.push((key.to_string(), value.to_string()));
        }
        let taken = std::cell::RefCell::new(vec![false; items.len()]);
        Ok(PassOptions { items, taken })
    }

    /// The value of option `key`, if given.
    pub fn take(&self, key: &str) -> Option<&str> {
        let i = self.items.iter().position(|(k, _)| k == key)?;
        self.taken.borrow_mut()[i] = true;
        Some(&self.items[i].1)
    }

    /// Takes option `key`, which names one of `allowed` (absent: the first), and gives the
    /// entry of `values` at the same place; any other value is [`PassOptionError::BadValue`].
    pub(crate) fn take_choice<T: Copy>(
        &self,
        key: &'static str,
        allowed: &'static [&'static str],
        values: &[T],
    ) -> Result<T, PassOptionError> {
        let value = self.take(key).unwrap_or(allowed[0]);
        match allowed.iter().position(|a| *a == value) {
            Some(i) => Ok(values[i]),
            None => Err(PassOptionError::BadValue {
                key,
                value: value.to_string(),
                allowed,
            }),
        }
    }

    /// Takes option `key`, a whole number from 1 to `max` (absent: `None`); anything else is
    /// [`PassOptionError::BadCount`].
    pub(crate) fn take_count(
        &self,
        key: &'static str,
        max: i64,
    ) -> Result<Option<i64>, PassOptionError> {
        let Some(value) = self.take(key) else {
            return Ok(None);
        };
        match value.parse::<i64>() {
            Ok(n) if (1..=max).contains(&n) => Ok(Some(n)),
            _ => Err(PassOptionError::BadCount {
                key,
                value: value.to_string(),
                max,
            }),
        }
    }

    /// `Ok(())` when every option given was taken, else the first one no pass reads.
    pub fn finish(&self) -> Result<(), PassOptionError> {
        let taken = self.taken.borrow();
        match self.items.iter().zip(taken.iter()).find(|(_, t)| !**t) {
            None => Ok(()),
            Some(((key, _), _)) => Err(PassOptionError::Unknown { key: key.clone() }),
        }
    }
}

/// A pass over a fusion, before segmentation.
pub trait FusionPass: Pass {
    /// Runs the pass on `fusion`, in place. On an error the fusion is left as it was.
    fn run(&self, fusion: &mut Fusion) -> Result<Changed, PassError>;
}

/// A pass over a host program.
pub trait HostPass: Pass {
    /// Runs the pass on `program`, in place. On an error the program is left as it was.
    fn run(&self, program: &mut HostProgram) -> Result<Changed, PassError>;
}

/// A step from one form of IR to the next: `segment` (`Lowering<Fusion, SegmentedFusion>`)
/// and `lower-to-host` (`Lowering<SegmentedFusion, HostProgram>`). It always changes the IR.
pub trait Lowering<From, To>: Pass {
    /// Lowers `input`.
    fn run(&self, input: From) -> Result<To, PassError>;
}

/// One step of a pipeline: a pass, typed by the form it takes and leaves.
#[derive(Clone)]
pub enum Stage {
    /// A [`FusionPass`]: fusion → fusion.
    Fusion(Arc<dyn FusionPass>),
    /// Segmentation: fusion → segmented fusion.
    Segment(Arc<dyn Lowering<Fusion, SegmentedFusion>>),
    /// Lowering: segmented fusion → host program.
    Lower(Arc<dyn Lowering<SegmentedFusion, HostProgram>>),
    /// A [`HostPass`]: host program → host program.
    Host(Arc<dyn HostPass>),
}

impl Stage {
    /// The pass, as named and listed.
    pub fn pass(&self) -> &dyn Pass {
        match self {
            Stage::Fusion(p) => p.as_ref(),
            Stage::Segment(p) => p.as_ref(),
            Stage::Lower(p) => p.as_ref(),
            Stage::Host(p) => p.as_ref(),
        }
    }

    /// The pass's name.
    pub fn name(&self) -> &'static str {
        self.pass().name()
    }

    /// The pass's one-line summary.
    pub fn summary(&self) -> &'static str {
        self.pass().summary()
    }

    /// The pipeline item that makes this stage: the name, then the options that differ from
    /// the defaults in braces (`lower-to-host{allgather=broadcast}`).
    pub fn spec(&self) -> String {
        match self.pass().options() {
            options if options.is_empty() => self.name().to_string(),
            options => format!("{}{{{options}}}", self.name()),
        }
    }

    /// The form the stage takes.
    pub fn input(&self) -> Form {
        match self {
            Stage::Fusion(_) | Stage::Segment(_) => Form::Fusion,
            Stage::Lower(_) => Form::Segmented,
            Stage::Host(_) => Form::Host,
        }
    }

    /// The form the stage leaves.
    pub fn output(&self) -> Form {
        match self {
            Stage::Fusion(_) => Form::Fusion,
            Stage::Segment(_) => Form::Segmented,
            Stage::Lower(_) | Stage::Host(_) => Form::Host,
        }
    }

    /// Runs the stage on `ir`, replacing it by the stage's output.
    ///
    /// The caller gives the form the stage takes: a [`crate::Pipeline`] keeps its stages
    /// chained and the pass manager checks the pipeline's input once, before any stage runs.
    /// On an error `ir` is unspecified (the manager keeps a copy of each stage's input).
    pub(crate) fn run(&self, ir: &mut Ir) -> Result<Changed, PassError> {
        assert_eq!(
            ir.kind(),
            self.input(),
            "stage `{}` given a {}: the pipeline's forms are checked before it runs",
            self.name(),
            ir.form()
        );
        let taken = std::mem::replace(ir, Ir::Fusion(Fusion::default()));
        let (out, changed) = match (self, taken) {
            (Stage::Fusion(pass), Ir::Fusion(mut f)) => {
                let changed = pass.run(&mut f);
                (Ir::Fusion(f), changed)
            }
            (Stage::Host(pass), Ir::Host(mut p)) => {
                let changed = pass.run(&mut p);
                (Ir::Host(p), changed)
            }
            (Stage::Segment(pass), Ir::Fusion(f)) => {
                (Ir::Segmented(pass.run(f)?), Ok(Changed::Yes))
            }
            (Stage::Lower(pass), Ir::Segmented(sf)) => (Ir::Host(pass.run(sf)?), Ok(Changed::Yes)),
            _ => unreachable!("the form was checked above"),
        };
        *ir = out;
        changed
    }
}

/// Turns a typed pass into a [`Stage`]: implemented for every [`FusionPass`], [`HostPass`]
/// and [`Lowering`], so `Pipeline::then(PropagateShardings)` needs no wrapper. `M` only tells
/// the implementations apart.
pub trait IntoStage<M> {
    /// The stage that runs this pass.
    fn into_stage(self) -> Stage;
}

/// Marks the [`IntoStage`] implementation of a [`FusionPass`].
pub enum OnFusion {}
/// Marks the [`IntoStage`] implementation of a [`HostPass`].
pub enum OnHost {}
/// Marks the [`IntoStage`] implementation of segmentation.
pub enum Segmenting {}
/// Marks the [`IntoStage`] implementation of lowering to a host program.
pub enum LoweringToHost {}
/// Marks the [`IntoStage`] implementation of a stage itself.
pub enum AsStage {}

impl<P: FusionPass + 'static> IntoStage<OnFusion> for P {
    fn into_stage(self) -> Stage {
        Stage::Fusion(Arc::new(self))
    }
}

impl<P: HostPass + 'static> IntoStage<OnHost> for P {
    fn into_stage(self) -> Stage {
        Stage::Host(Arc::new(self))
    }
}

impl<P: Lowering<Fusion, SegmentedFusion> + 'static> IntoStage<Segmenting> for P {
    fn into_stage(self) -> Stage {
        Stage::Segment(Arc::new(self))
    }
}

impl<P: Lowering<SegmentedFusion, HostProgram> + 'static> IntoStage<LoweringToHost> for P {
    fn into_stage(self) -> Stage {
        Stage::Lower(Arc::new(self))
    }
}

impl IntoStage<AsStage> for Stage {
    fn into_stage(self) -> Stage {
        self
    }
}

/// Why a pass, or the verifier after it, rejected the IR.
#[derive(Clone, Debug, thiserror::Error)]
pub enum PassError {
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
