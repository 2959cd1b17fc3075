//! The pass registry: every pass a pipeline may name, by name, with its one-line summary and
//! its options.
//!
//! A pipeline written as text (`--passes=propagate-shardings,segment,…`) names passes by
//! string; the registry turns each item into a fresh [`Stage`] and is the single place that
//! knows which names exist. An unknown name is an [`UnknownPass`] error that lists the valid
//! ones, so a typo on the command line answers with the menu.
//!
//! A pass with options takes them in braces, MLIR style, separated by spaces:
//! `lower-to-host{allgather=broadcast}`, `assign-streams{sync=separate-loop}`. The older
//! names of those variants (`lower-to-host-broadcast`, `assign-streams-separate-sync`) are
//! aliases: the same pass with those options.
//!
//! `STANDARD_PASSES` declares the standard passes once, in pipeline order: the standard
//! registry ([`Registry::standard`]) holds every line of it with its aliases, and the default
//! pipeline (`Pipeline::standard`) runs the lines marked `default: true`, so the two cannot
//! disagree. Adding a pass to the standard set is one line there:
//!
//! ```text
//! StandardPass::in_default(|o| plain(o, PropagateShardings)),
//! ```
//!
//! The name and the summary come from the pass itself ([`crate::Pass::name`],
//! [`crate::Pass::summary`]), so the registry never disagrees with the pass about either.

use std::fmt;

use crate::allocate_and_deallocate::AllocateAndDeallocate;
use crate::assign_streams::AssignStreams;
use crate::decompose_reshardings::DecomposeReshardings;
use crate::finalize_multidevice_domains::FinalizeMultideviceDomains;
use crate::lower_to_host::LowerToHost;
use crate::merge_kernel_chunks::MergeKernelChunks;
use crate::pass::{IntoStage, PassOptionError, PassOptions, Stage};
use crate::prefetch_communications::PrefetchCommunications;
use crate::propagate_shardings::PropagateShardings;
use crate::reorder_sharded_axis::ReorderShardedAxis;
use crate::segment::Segment;

/// Makes a pass from the options of a pipeline item; the error says why the options do not
/// fit.
pub type StageFactory = fn(&PassOptions) -> Result<Stage, PassOptionError>;

/// One line of `STANDARD_PASSES`.
struct StandardPass {
    /// Makes the pass from a pipeline item's options.
    make: StageFactory,
    /// Whether the default pipeline runs it.
    default: bool,
    /// Other names of this pass with options, still accepted: `(name, options)`.
    aliases: &'static [(&'static str, &'static str)],
}

impl StandardPass {
    /// A line the default pipeline runs, without aliases.
    const fn in_default(make: StageFactory) -> StandardPass {
        StandardPass {
            make,
            default: true,
            aliases: &[],
        }
    }
}

/// The standard passes, one per line, in pipeline order: [`Registry::standard`] registers
/// every line (and its aliases), and the default pipeline runs the `default: true` ones with
/// their default options. A pass joins the standard set by adding its line here.
const STANDARD_PASSES: &[StandardPass] = &[
    StandardPass::in_default(|o| plain(o, PropagateShardings)),
    StandardPass::in_default(|o| plain(o, DecomposeReshardings)),
    StandardPass::in_default(|o| plain(o, ReorderShardedAxis)),
    StandardPass::in_default(|o| plain(o, FinalizeMultideviceDomains)),
    StandardPass::in_default(|o| plain(o, Segment)),
    StandardPass {
        make: |o| Ok(LowerToHost::with_options(o)?.into_stage()),
        default: true,
        aliases: &[("lower-to-host-broadcast", "allgather=broadcast")],
    },
    StandardPass::in_default(|o| plain(o, MergeKernelChunks::default())),
    StandardPass {
        make: |o| Ok(AssignStreams::with_options(o)?.into_stage()),
        default: true,
        aliases: &[("assign-streams-separate-sync", "sync=separate-loop")],
    },
    StandardPass::in_default(|o| plain(o, AllocateAndDeallocate)),
    StandardPass::in_default(|o| plain(o, PrefetchCommunications)),
];

/// The stage of a pass without options, refusing any option given.
fn plain<M>(options: &PassOptions, pass: impl IntoStage<M>) -> Result<Stage, PassOptionError> {
    options.finish()?;
    Ok(pass.into_stage())
}

/// Fresh instances of the default pipeline's passes, in run order: the `default: true`
/// lines of `STANDARD_PASSES`, with their default options.
pub(crate) fn default_passes() -> impl Iterator<Item = Stage> {
    STANDARD_PASSES
        .iter()
        .filter(|line| line.default)
        .map(|line| (line.make)(&PassOptions::none()).expect("every pass takes its defaults"))
}

/// A registered pass as listed: its name and one-line summary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PassInfo {
    /// The name pipelines use (`propagate-shardings`).
    pub name: &'static str,
    /// What the pass does, in one line.
    pub summary: &'static str,
}

/// How a registry entry makes its pass from a pipeline item's options.
type MakeStage = Box<dyn Fn(&PassOptions) -> Result<Stage, PassOptionError>>;

/// One registry entry: what is listed, and how to make the pass.
struct Entry {
    info: PassInfo,
    make: MakeStage,
}

/// Another name for a registered pass with options (`lower-to-host-broadcast`).
struct Alias {
    name: &'static str,
    pass: &'static str,
    options: &'static str,
}

/// Name → pass factory and summary, in registration order.
///
/// Registration order is also listing order; the standard registry registers in pipeline
/// order, so `--list-passes` reads as the compilation flow.
#[derive(Default)]
pub struct Registry {
    entries: Vec<Entry>,
    aliases: Vec<Alias>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

/// A pipeline item that names a registered pass but gives it options it does not take.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("pass `{pass}`: {message} (in `{item}`)")]
pub struct BadOptions {
    /// The pass.
    pub pass: &'static str,
    /// The whole item, `name{…}`.
    pub item: String,
    /// What is wrong with the options.
    pub message: String,
}

/// Why a pipeline item does not make a pass.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ItemError {
    /// No registered pass has the name.
    #[error(transparent)]
    Unknown(#[from] UnknownPass),
    /// The pass does not take the options.
    #[error(transparent)]
    Options(#[from] BadOptions),
}

impl Registry {
    /// An empty registry (tests register their own passes into one).
    pub fn new() -> Registry {
        Registry::default()
    }

    /// The registry of every standard pass, with the aliases of its variants (adding one is
    /// a line in `STANDARD_PASSES`).
    pub fn standard() -> Registry {
        let mut registry = Registry::new();
        for line in STANDARD_PASSES {
            let name = registry.add(Box::new(line.make));
            for (alias, options) in line.aliases {
                registry.alias(alias, name, options);
            }
        }
        registry
    }

    /// Registers the pass that `make` creates, under the name the pass gives itself; it takes
    /// no options. `make` is called once now, to read the name and summary, and once per
    /// pipeline item later.
    ///
    /// # Panics
    ///
    /// If a pass of the same name is already registered: two passes under one name is a bug
    /// in the registration code, which the standard registry's tests catch.
    pub fn register<M, P: IntoStage<M>>(
        &mut self,
        make: impl Fn() -> P + 'static,
    ) -> &mut Registry {
        self.add(Box::new(move |options: &PassOptions| {
            options.finish()?;
            Ok(make().into_stage())
        }));
        self
    }

    /// Registers a pass made from a pipeline item's options; returns its name.
    fn add(&mut self, make: MakeStage) -> &'static str {
        let stage = make(&PassOptions::none()).expect("a pass takes its default options");
        let info = PassInfo {
            name: stage.name(),
            summary: stage.summary(),
        };
        assert!(
            !self.contains(info.name),
            "pass `{}` is registered twice",
            info.name
        );
        self.entries.push(Entry { info, make });
        info.name
    }

    /// Makes `name` another name for `pass` with `options`.
    fn alias(&mut self, name: &'static str, pass: &'static str, options: &'static str) {
        assert!(!self.contains(name), "pass `{name}` is registered twice");
        self.aliases.push(Alias {
            name,
            pass,
            options,
        });
    }

    /// A fresh instance of the pass called `name` (or an alias), with its default options.
    pub fn get(&self, name: &str) -> Result<Stage, UnknownPass> {
        match self.make(name) {
            Ok(stage) => Ok(stage),
            Err(ItemError::Unknown(e)) => Err(e),
            Err(ItemError::Options(_)) => Err(self.unknown(name)),
        }
    }

    /// A fresh instance of the pass a pipeline item names: `name`, `name{key=value …}`, or
    /// an alias.
    pub fn make(&self, item: &str) -> Result<Stage, ItemError> {
        let (name, options) = match item.split_once('{') {
            Some((name, rest)) => match rest.strip_suffix('}') {
                Some(options) => (name.trim(), options),
                None => {
                    let entry = self.entry(name.trim())?;
                    return Err(BadOptions {
                        pass: entry.info.name,
                        item: item.to_string(),
                        message: "options end with `}`".to_string(),
                    }
                    .into());
                }
            },
            None => (item, ""),
        };
        let (name, options) = match self.aliases.iter().find(|a| a.name == name) {
            Some(alias) if options.trim().is_empty() => (alias.pass, alias.options),
            _ => (name, options),
        };
        let entry = self.entry(name)?;
        let bad = |error: PassOptionError| BadOptions {
            pass: entry.info.name,
            item: item.to_string(),
            message: error.to_string(),
        };
        let options = PassOptions::parse(options).map_err(bad)?;
        Ok((entry.make)(&options).map_err(bad)?)
    }

    /// The name and summary of the pass called `name`.
    pub fn info(&self, name: &str) -> Result<PassInfo, UnknownPass> {
        self.entry(name).map(|e| e.info)
    }

    /// Whether a pass (or an alias) called `name` is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.iter().any(|e| e.info.name == name)
            || self.aliases.iter().any(|a| a.name == name)
    }

    /// Every registered pass, in registration order (for `--list-passes`); aliases are not
    /// passes and are not listed here.
    pub fn list(&self) -> Vec<PassInfo> {
        self.entries.iter().map(|e| e.info).collect()
    }

    /// Every registered name, each alias after its pass, in registration order.
    pub fn names(&self) -> Vec<&'static str> {
        let mut names = Vec::new();
        for e in &self.entries {
            names.push(e.info.name);
            names.extend(
                self.aliases
                    .iter()
                    .filter(|a| a.pass == e.info.name)
                    .map(|a| a.name),
            );
        }
        names
    }

    /// Whether no pass is registered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// `Ok(())` if `name` is registered, else the error that lists the valid names.
    pub fn check(&self, name: &str) -> Result<(), UnknownPass> {
        match self.contains(name) {
            true => Ok(()),
            false => Err(self.unknown(name)),
        }
    }

    /// The text of `--list-passes`: one `name  summary` line per pass (an alias on the line
    /// after its pass, with the options it stands for), then the default pipeline and which
    /// of its passes are not registered.
    pub fn listing(&self) -> String {
        let width = self.names().iter().map(|name| name.len()).max();
        let mut s = String::new();
        match width {
            None => s.push_str("no passes are registered\n"),
            Some(width) => {
                for PassInfo { name, summary } in self.list() {
                    s.push_str(&format!("{name:width$}  {summary}\n"));
                    for alias in self.aliases.iter().filter(|a| a.pass == name) {
                        let alias_name = alias.name;
                        s.push_str(&format!(
                            "{alias_name:width$}  {name}{{{}}}\n",
                            alias.options
                        ));
                    }
                }
            }
        }
        let standard: Vec<&str> = default_passes().map(|stage| stage.name()).collect();
        s.push_str(&format!("\ndefault pipeline: {}\n", standard.join(",")));
        let missing: Vec<&str> = standard
            .into_iter()
            .filter(|name| !self.contains(name))
            .collect();
        if !missing.is_empty() {
            s.push_str(&format!("not registered: {}\n", missing.join(", ")));
        }
        s
    }

    fn entry(&self, name: &str) -> Result<&Entry, UnknownPass> {
        self.entries
            .iter()
            .find(|e| e.info.name == name)
            .ok_or_else(|| self.unknown(name))
    }

    fn unknown(&self, name: &str) -> UnknownPass {
        UnknownPass {
            name: name.to_string(),
            known: self.names(),
        }
    }
}

/// A pass name that no registered pass has.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown pass `{name}` ({})", known_list(.known))]
pub struct UnknownPass {
    /// The name asked for.
    pub name: String,
    /// Every registered name, in registration order.
    pub known: Vec<&'static str>,
}

fn known_list(known: &[&str]) -> String {
    if known.is_empty() {
        "no passes are registered".to_string()
    } else {
        format!("known passes: {}", known.join(", "))
    }
}
