//! The pass registry: every pass a pipeline may name, by name, with its one-line summary.
//!
//! A pipeline written as text (`--passes=propagate-shardings,segment,…`) names passes by
//! string; the registry turns each name into a fresh [`Pass`] and is the single place that
//! knows which names exist. An unknown name is an [`UnknownPass`] error that lists the valid
//! ones, so a typo on the command line answers with the menu.
//!
//! `STANDARD_PASSES` declares the standard passes once, in pipeline order: the standard
//! registry ([`Registry::standard`]) holds every line of it, and the default pipeline
//! (`Pipeline::standard`) runs the lines marked `Role::Default`, so the two cannot
//! disagree. Adding a pass to the standard set is one line there:
//!
//! ```text
//! (Role::Default, || Box::new(PropagateShardings)),
//! ```
//!
//! The name and the summary come from the pass itself ([`Pass::name`], [`Pass::summary`]), so
//! the registry never disagrees with the pass about either.

use std::fmt;

use crate::allocate_and_deallocate::AllocateAndDeallocate;
use crate::assign_streams::{AssignStreams, SyncVariant};
use crate::decompose_reshardings::DecomposeReshardings;
use crate::finalize_multidevice_domains::FinalizeMultideviceDomains;
use crate::lower_to_host::{LowerToHost, StreamAllgather};
use crate::merge_kernel_chunks::MergeKernelChunks;
use crate::pass::Pass;
use crate::propagate_shardings::PropagateShardings;
use crate::reorder_sharded_axis::ReorderShardedAxis;
use crate::segment::Segment;

/// Makes a fresh instance of one pass.
pub type PassFactory = fn() -> Box<dyn Pass>;

/// Where a standard pass runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// In the default pipeline, and wherever a pipeline names it.
    Default,
    /// Only where a pipeline names it: a variant of the default pass listed before it.
    Variant,
}

/// The standard passes, one per line, in pipeline order, each variant after the pass it
/// replaces: [`Registry::standard`] registers every line, and the default pipeline runs the
/// `Role::Default` ones. A pass joins the standard set by adding its line here.
const STANDARD_PASSES: &[(Role, PassFactory)] = &[
    (Role::Default, || Box::new(PropagateShardings)),
    (Role::Default, || Box::new(DecomposeReshardings)),
    (Role::Default, || Box::new(ReorderShardedAxis)),
    (Role::Default, || Box::new(FinalizeMultideviceDomains)),
    (Role::Default, || Box::new(Segment)),
    (Role::Default, || Box::new(LowerToHost::default())),
    (Role::Variant, || {
        Box::new(LowerToHost::new(StreamAllgather::Broadcast))
    }),
    (Role::Default, || Box::new(MergeKernelChunks::default())),
    (Role::Default, || Box::new(AssignStreams::default())),
    (Role::Variant, || {
        Box::new(AssignStreams::new(SyncVariant::SeparateLoop))
    }),
    (Role::Default, || Box::new(AllocateAndDeallocate)),
];

/// Fresh instances of the default pipeline's passes, in run order: the `Role::Default`
/// lines of `STANDARD_PASSES`.
pub(crate) fn default_passes() -> impl Iterator<Item = Box<dyn Pass>> {
    STANDARD_PASSES
        .iter()
        .filter(|(role, _)| *role == Role::Default)
        .map(|(_, make)| make())
}

/// A registered pass as listed: its name and one-line summary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PassInfo {
    /// The name pipelines use (`propagate-shardings`).
    pub name: &'static str,
    /// What the pass does, in one line.
    pub summary: &'static str,
}

/// One registry entry: what is listed, and how to make the pass.
struct Entry {
    info: PassInfo,
    make: Box<dyn Fn() -> Box<dyn Pass>>,
}

/// Name → pass factory and summary, in registration order.
///
/// Registration order is also listing order; the standard registry registers in pipeline
/// order, so `--list-passes` reads as the compilation flow.
#[derive(Default)]
pub struct Registry {
    entries: Vec<Entry>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.entries.iter().map(|e| e.info.name))
            .finish()
    }
}

impl Registry {
    /// An empty registry (tests register their own passes into one).
    pub fn new() -> Registry {
        Registry::default()
    }

    /// The registry of every standard pass and its variants (adding one is a line in
    /// `STANDARD_PASSES`).
    pub fn standard() -> Registry {
        let mut registry = Registry::new();
        for (_, make) in STANDARD_PASSES {
            registry.register(*make);
        }
        registry
    }

    /// Registers the pass that `make` creates, under the name the pass gives itself. `make`
    /// is called once now, to read the name and summary, and once per pipeline run later.
    ///
    /// # Panics
    ///
    /// If a pass of the same name is already registered: two passes under one name is a bug
    /// in the registration code, which the standard registry's tests catch.
    pub fn register(&mut self, make: impl Fn() -> Box<dyn Pass> + 'static) -> &mut Registry {
        let pass = make();
        let info = PassInfo {
            name: pass.name(),
            summary: pass.summary(),
        };
        assert!(
            !self.contains(info.name),
            "pass `{}` is registered twice",
            info.name
        );
        self.entries.push(Entry {
            info,
            make: Box::new(make),
        });
        self
    }

    /// A fresh instance of the pass called `name`.
    pub fn get(&self, name: &str) -> Result<Box<dyn Pass>, UnknownPass> {
        self.entry(name).map(|e| (e.make)())
    }

    /// The name and summary of the pass called `name`.
    pub fn info(&self, name: &str) -> Result<PassInfo, UnknownPass> {
        self.entry(name).map(|e| e.info)
    }

    /// Whether a pass called `name` is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.iter().any(|e| e.info.name == name)
    }

    /// Every registered pass, in registration order (for `--list-passes`).
    pub fn list(&self) -> Vec<PassInfo> {
        self.entries.iter().map(|e| e.info).collect()
    }

    /// Every registered name, in registration order.
    pub fn names(&self) -> Vec<&'static str> {
        self.entries.iter().map(|e| e.info.name).collect()
    }

    /// Whether no pass is registered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// `Ok(())` if `name` is registered, else the error that lists the valid names.
    pub fn check(&self, name: &str) -> Result<(), UnknownPass> {
        self.entry(name).map(|_| ())
    }

    /// The text of `--list-passes`: one `name  summary` line per pass, then the default
    /// pipeline and which of its passes are not registered.
    pub fn listing(&self) -> String {
        let width = self.entries.iter().map(|e| e.info.name.len()).max();
        let mut s = String::new();
        match width {
            None => s.push_str("no passes are registered\n"),
            Some(width) => {
                for PassInfo { name, summary } in self.list() {
                    s.push_str(&format!("{name:width$}  {summary}\n"));
                }
            }
        }
        let standard: Vec<&str> = default_passes().map(|pass| pass.name()).collect();
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
            .ok_or_else(|| UnknownPass {
                name: name.to_string(),
                known: self.names(),
            })
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
