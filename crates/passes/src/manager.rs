//! The pass manager: runs a pipeline, verifies the IR after every pass, dumps it on request,
//! and leaves a reproducer file when a pass fails.
//!
//! # What a run does
//!
//! [`PassManager::run`] first checks every pass named in the dump options against the
//! registry, then verifies its input, so that a failure is always the fault of one pass, and
//! checks that it is the form the pipeline's first stage runs on
//! ([`PipelineError::WrongInput`]; the pipeline itself keeps every later stage in order). For
//! each pass in order it keeps a copy of the pass's input, runs the pass, and verifies the IR
//! the pass leaves with the verifier of that IR's form ([`verify`]). Right after the stage
//! that lowers a fusion pipeline's IR to a host program, inside that stage, it runs the named
//! step [`AttachDefinition`] (`attach-definition`: the given fusion becomes the program's
//! definition, with its parameter roles), so that every host program verified or dumped
//! carries it; the step is no stage, so dumps and pipelines do not list it. A pass error or a
//! verifier failure stops the run with a [`PipelineError::Pass`] that names the pass and its
//! position, carries the verifier's message, and gives the path of a reproducer file. The
//! manager never panics on a bad pass.
//!
//! # Dumps
//!
//! [`DumpOptions`] says which IR to print:
//!
//! * `before` / `after`: before or after the passes selected by name, or all of them;
//! * `after_change`: print after a pass only when it reported [`Changed::Yes`]; on its own it
//!   applies to every pass, together with `after` to the selected ones;
//! * `dir`: write each dump to `DIR/NNN-<pass>.before.txt` or `DIR/NNN-<pass>.after.txt`
//!   (`NNN` is the pass's 0-based position in the pipeline, three digits) instead of the
//!   output; with no selection at all, `dir` alone dumps after every pass.
//!
//! On the output (stderr for [`PassManager::run`], any [`Write`] for
//! [`PassManager::run_with_output`]) each dump is a header line followed by the IR:
//!
//! ```text
//! // -----// IR Dump After propagate-shardings (fusion) //----- //
//! Fusion f(...)
//! ...
//! ```
//!
//! # `WEAVE_DUMP`
//!
//! [`DumpOptions::parse`] reads the same options from the text of the `WEAVE_DUMP`
//! environment variable: comma-separated items, each one of
//!
//! * `before:PASS` or `before:all`, `after:PASS` or `after:all` (repeat the item for several
//!   passes: `before:propagate-shardings,after:lower-to-host`);
//! * `after-change`;
//! * `dir:PATH` (a path without commas).
//!
//! For example `WEAVE_DUMP=after:all`, `WEAVE_DUMP=after-change,dir:/tmp/weave`. Unset or
//! empty means no dumps; an item of another shape is an error that shows this syntax.
//!
//! The library reads no environment variable: the binaries (`weave`, `cargo xtask dump`) read
//! `WEAVE_DUMP` and hand its value in, through [`DumpFlags::weave_dump`] or as
//! [`DumpOptions`] given to [`PassManager::with_options`].
//!
//! # Tracing
//!
//! A run opens a `tracing` span `pipeline` (field `pipeline`, its text), inside it one span
//! `pass` per pass (`pass`: the name, `index`, `before` and `after`: the IR form, `changed`),
//! and a span `verify` (`form`, `valid`) around every verification. The library installs no
//! subscriber; without one the spans cost next to nothing.
//!
//! # Reproducers
//!
//! When a pass fails and a dump directory is set (`--dump-dir DIR`, `WEAVE_DUMP=dir:DIR`),
//! the manager writes `weave-repro-<pass>.txt` into it (`weave-repro-<pass>.2.txt`, ... when
//! that name is taken: a reproducer never overwrites another); without one it writes nothing,
//! and the error says how to ask for one. It holds, as `//` comment lines, the error,
//! the pipeline and the failing pass, then the IR input to that pass in its text form. For a
//! fusion that is the `.weave` text, so the file loads as is:
//! `cargo xtask dump weave-repro-<pass>.txt --passes=<pass>`; the seed-style print follows in
//! comments, since passes may change domains that the `.weave` schedule blocks do not show.

use std::fmt::Write as _;
use std::io::Write;
use std::path::{Path, PathBuf};

use weave_ir::Diagnostic;

use crate::attach_definition::AttachDefinition;
use crate::pass::{Changed, Form, Ir, PassError};
use crate::pipeline::{Pipeline, PipelineParseError};
use crate::registry::{Registry, UnknownPass};

/// The environment variable the binaries read dump options from, in the syntax of
/// [`DumpOptions::parse`]. The library itself never reads it.
pub const DUMP_ENV: &str = "WEAVE_DUMP";

/// Which passes a `before` or `after` dump applies to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum PassSelection {
    /// No pass.
    #[default]
    None,
    /// Every pass.
    All,
    /// The passes of these names.
    Only(Vec<String>),
}

impl PassSelection {
    /// Whether the selection includes the pass `name`.
    pub fn selects(&self, name: &str) -> bool {
        match self {
            PassSelection::None => false,
            PassSelection::All => true,
            PassSelection::Only(names) => names.iter().any(|n| n == name),
        }
    }

    /// Adds `spec`: `all`, a pass name, or several of them separated by commas (the value of
    /// `--print-before` / `--print-after`). `all` absorbs every name.
    pub fn add(&mut self, spec: &str) {
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match (item, &mut *self) {
                (_, PassSelection::All) => {}
                ("all", sel) => *sel = PassSelection::All,
                (name, PassSelection::Only(names)) => {
                    if !names.iter().any(|n| n == name) {
                        names.push(name.to_string());
                    }
                }
                (name, sel @ PassSelection::None) => {
                    *sel = PassSelection::Only(vec![name.to_string()]);
                }
            }
        }
    }

    /// The names selected explicitly (none for `None` and `All`).
    pub fn names(&self) -> &[String] {
        match self {
            PassSelection::Only(names) => names,
            PassSelection::None | PassSelection::All => &[],
        }
    }
}

/// What to print while a pipeline runs, and where (module docs, "Dumps").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DumpOptions {
    /// Print the IR before these passes.
    pub before: PassSelection,
    /// Print the IR after these passes.
    pub after: PassSelection,
    /// Print after a pass only when it changed the IR.
    pub after_change: bool,
    /// Write dumps as files into this directory (and the reproducer on failure).
    pub dir: Option<PathBuf>,
}

/// A `WEAVE_DUMP` value that does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "WEAVE_DUMP: `{item}` is not a dump item; write comma-separated items of \
     before:PASS|all, after:PASS|all, after-change, dir:PATH"
)]
pub struct DumpSpecError {
    /// The item that does not parse.
    pub item: String,
}

impl DumpOptions {
    /// Parses the `WEAVE_DUMP` syntax (module docs); the empty string is no dumps.
    pub fn parse(spec: &str) -> Result<DumpOptions, DumpSpecError> {
        let mut options = DumpOptions::default();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let bad = || DumpSpecError {
                item: item.to_string(),
            };
            match item.split_once(':') {
                None if item == "after-change" => options.after_change = true,
                Some(("before", pass)) if !pass.trim().is_empty() => options.before.add(pass),
                Some(("after", pass)) if !pass.trim().is_empty() => options.after.add(pass),
                Some(("dir", path)) if !path.trim().is_empty() => {
                    options.dir = Some(PathBuf::from(path.trim()));
                }
                _ => return Err(bad()),
            }
        }
        Ok(options)
    }

    /// Adds these options to `self` (command-line flags on top of `WEAVE_DUMP`): selections
    /// are united, `after_change` is or-ed, and `other`'s directory wins when it has one.
    pub fn merge(&mut self, other: DumpOptions) {
        for (mine, theirs) in [
            (&mut self.before, other.before),
            (&mut self.after, other.after),
        ] {
            match theirs {
                PassSelection::None => {}
                PassSelection::All => *mine = PassSelection::All,
                PassSelection::Only(names) => mine.add(&names.join(",")),
            }
        }
        self.after_change |= other.after_change;
        if other.dir.is_some() {
            self.dir = other.dir;
        }
    }

    /// Checks that every pass named in a selection is registered.
    pub fn check(&self, registry: &Registry) -> Result<(), UnknownPass> {
        self.before
            .names()
            .iter()
            .chain(self.after.names())
            .try_for_each(|name| registry.check(name))
    }

    /// Whether nothing is selected for printing (a dump directory alone then means "after
    /// every pass").
    fn nothing_selected(&self) -> bool {
        self.before == PassSelection::None
            && self.after == PassSelection::None
            && !self.after_change
    }

    fn prints_before(&self, pass: &str) -> bool {
        self.before.selects(pass)
    }

    fn prints_after(&self, pass: &str, changed: Changed) -> bool {
        let selected = if self.after == PassSelection::None {
            self.after_change || (self.dir.is_some() && self.nothing_selected())
        } else {
            self.after.selects(pass)
        };
        selected && (!self.after_change || changed == Changed::Yes)
    }
}

/// Why a pipeline run stopped.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The pipeline text does not parse, or it or a dump selection names a pass that is not
    /// registered.
    #[error(transparent)]
    Pipeline(#[from] PipelineParseError),
    /// `WEAVE_DUMP` does not parse.
    #[error(transparent)]
    DumpSpec(#[from] DumpSpecError),
    /// The IR given to the pipeline fails the verifier, before any pass ran.
    #[error("input to pipeline `{pipeline}` is invalid: {}", .diagnostic.message)]
    InvalidInput {
        /// The pipeline.
        pipeline: String,
        /// What the verifier found.
        diagnostic: Diagnostic,
    },
    /// The IR given to the pipeline is not the form its first stage runs on.
    #[error("pass `{pass}` expects a {expected}, got a {found} (the first pass of pipeline `{pipeline}`)")]
    WrongInput {
        /// The pipeline.
        pipeline: String,
        /// Its first pass.
        pass: &'static str,
        /// The form that pass runs on.
        expected: &'static str,
        /// The form given.
        found: &'static str,
    },
    /// A pass returned an error, or the verifier rejected what it produced.
    #[error(transparent)]
    Pass(Box<PassFailure>),
    /// The pipeline ran but did not end in the IR form the caller asked for.
    #[error("the pipeline ended with a {0}, not a host program (does it end with lower-to-host?)")]
    WrongResult(&'static str),
    /// A dump could not be written.
    #[error("cannot write the dump to {target}: {message}")]
    Dump {
        /// The file, or `the output`.
        target: String,
        /// The I/O error.
        message: String,
    },
}

/// A pass that failed during a pipeline run: which one, where, why, and the reproducer.
#[derive(Debug, thiserror::Error)]
#[error(
    "{error} (pass {} of {} in pipeline `{pipeline}`; {})",
    .index + 1,
    .pipeline.len(),
    reproducer_note(.reproducer)
)]
pub struct PassFailure {
    /// The failing pass.
    pub pass: String,
    /// Its 0-based position in the pipeline.
    pub index: usize,
    /// The pipeline that was running.
    pub pipeline: Pipeline,
    /// What went wrong; [`PassError::Verify`] holds the verifier's message.
    pub error: PassError,
    /// The reproducer file written, or why there is none (not asked for, or not written).
    pub reproducer: Result<PathBuf, String>,
}

fn reproducer_note(reproducer: &Result<PathBuf, String>) -> String {
    match reproducer {
        Ok(path) => format!("reproducer: {}", path.display()),
        Err(why) => why.clone(),
    }
}

impl PipelineError {
    /// The pass that failed, for [`PipelineError::Pass`].
    pub fn pass(&self) -> Option<&str> {
        match self {
            PipelineError::Pass(failure) => Some(&failure.pass),
            _ => None,
        }
    }

    /// The reproducer file written for a failing pass.
    pub fn reproducer(&self) -> Option<&Path> {
        match self {
            PipelineError::Pass(failure) => failure.reproducer.as_deref().ok(),
            _ => None,
        }
    }
}

/// The pass-manager flags of the `dump` commands (`cargo xtask dump`, `weave dump`) and the
/// value of `WEAVE_DUMP`, as given, so that both read them the same way through
/// [`PassManager::from_flags`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DumpFlags {
    /// `--passes`: a pipeline `a,b,c`, or edits `+x,-y` of the default pipeline.
    pub passes: Option<String>,
    /// `--print-before` values: pass names (comma-separated or repeated) or `all`.
    pub print_before: Vec<String>,
    /// `--print-after` values: pass names (comma-separated or repeated) or `all`.
    pub print_after: Vec<String>,
    /// `--print-after-change`.
    pub print_after_change: bool,
    /// `--dump-dir`.
    pub dump_dir: Option<PathBuf>,
    /// The value of `WEAVE_DUMP` ([`DUMP_ENV`]), which the binary reads; `None` when unset.
    pub weave_dump: Option<String>,
}

impl DumpFlags {
    /// True when any flag asks to see the IR between passes.
    pub fn asks_for_dumps(&self) -> bool {
        !self.print_before.is_empty()
            || !self.print_after.is_empty()
            || self.print_after_change
            || self.dump_dir.is_some()
    }

    /// The dump options: `WEAVE_DUMP`, with these flags added on top.
    pub fn dump_options(&self) -> Result<DumpOptions, DumpSpecError> {
        let mut options = DumpOptions::parse(self.weave_dump.as_deref().unwrap_or_default())?;
        let mut flags = DumpOptions {
            after_change: self.print_after_change,
            dir: self.dump_dir.clone(),
            ..DumpOptions::default()
        };
        for spec in &self.print_before {
            flags.before.add(spec);
        }
        for spec in &self.print_after {
            flags.after.add(spec);
        }
        options.merge(flags);
        Ok(options)
    }
}

/// Runs a pipeline of registered passes, verifying after each and dumping on request.
#[derive(Debug)]
pub struct PassManager {
    /// Where the pass names of the dump options are checked (the pipeline holds its passes).
    pub registry: Registry,
    /// The passes to run, in order.
    pub pipeline: Pipeline,
    /// What to print while running.
    pub options: DumpOptions,
}

impl PassManager {
    /// A manager for `pipeline` over `registry`, without dumps.
    pub fn new(registry: Registry, pipeline: Pipeline) -> PassManager {
        PassManager {
            registry,
            pipeline,
            options: DumpOptions::default(),
        }
    }

    /// The same manager with `options`.
    pub fn with_options(mut self, options: DumpOptions) -> PassManager {
        self.options = options;
        self
    }

    /// The standard registry and [`Pipeline::standard`], without dumps: what the library
    /// uses to compile a fusion. [`PassManager::with_options`] adds dumps.
    pub fn standard() -> PassManager {
        PassManager::new(Registry::standard(), Pipeline::standard())
    }

    /// The manager a `dump` command line asks for: the standard registry; the pipeline
    /// `--passes` gives, or edits of the default one; `WEAVE_DUMP` plus the dump flags.
    ///
    /// `--passes=default` is [`Pipeline::standard`]; edits apply to it. Without `--passes`, the
    /// pipeline is empty (so `dump` prints the loaded fusion) unless a dump flag asks to see
    /// the IR between passes, in which case it is the default pipeline.
    pub fn from_flags(flags: &DumpFlags) -> Result<PassManager, PipelineError> {
        let registry = Registry::standard();
        let base = Pipeline::standard();
        let pipeline = match &flags.passes {
            Some(spec) if spec.trim() == "default" => base,
            Some(spec) => Pipeline::resolve(spec, &base, &registry)?,
            None if flags.asks_for_dumps() => base,
            None => Pipeline::default(),
        };
        let options = flags.dump_options()?;
        options.check(&registry).map_err(PipelineParseError::from)?;
        Ok(PassManager::new(registry, pipeline).with_options(options))
    }

    /// Runs the pipeline on `ir`, printing dumps to stderr; returns the IR the last pass
    /// leaves.
    pub fn run(&self, ir: Ir) -> Result<Ir, PipelineError> {
        self.run_with_output(ir, &mut std::io::stderr().lock())
    }

    /// Runs the pipeline on `ir`, printing dumps to `out` (or into the dump directory).
    pub fn run_with_output(&self, mut ir: Ir, out: &mut dyn Write) -> Result<Ir, PipelineError> {
        let pipeline_span = tracing::info_span!("pipeline", pipeline = %self.pipeline);
        let _in_pipeline = pipeline_span.enter();
        self.options
            .check(&self.registry)
            .map_err(PipelineParseError::from)?;
        verify(&ir).map_err(|diagnostic| PipelineError::InvalidInput {
            pipeline: self.pipeline.to_string(),
            diagnostic,
        })?;

        // The pipeline's stages are chained when it is built; only its input is checked here.
        if let Some(first) = self.pipeline.passes().first() {
            if first.input() != ir.kind() {
                return Err(PipelineError::WrongInput {
                    pipeline: self.pipeline.to_string(),
                    pass: first.name(),
                    expected: first.input().name(),
                    found: ir.form(),
                });
            }
        }

        // The fusion as given is the definition of the host program the pipeline lowers it
        // to: the `attach-definition` step stamps it right after the lowering stage.
        let definition = match &ir {
            Ir::Fusion(f) => Some(f.clone()),
            _ => None,
        };
        for (index, stage) in self.pipeline.passes().iter().enumerate() {
            let name = stage.name();
            let span = tracing::info_span!(
                "pass",
                pass = name,
                index,
                before = ir.form(),
                after = tracing::field::Empty,
                changed = tracing::field::Empty,
            );
            let _in_pass = span.enter();
            if self.options.prints_before(name) {
                self.dump(out, index, name, Stage::Before, &ir)?;
            }
            let input = ir.clone();
            let changed = match stage.run(&mut ir) {
                Ok(changed) => changed,
                Err(error) => return Err(self.failure(name, index, error, &input)),
            };
            span.record("after", ir.form());
            span.record("changed", changed == Changed::Yes);
            let lowered_to_host = stage.input() != Form::Host && stage.output() == Form::Host;
            if let (true, Ir::Host(p), Some(definition)) = (lowered_to_host, &mut ir, &definition) {
                AttachDefinition { definition }.run(p);
            }
            let verified = verify(&ir);
            // The IR a pass leaves is printed even when the verifier rejects it: that is what
            // the pass's author needs to see.
            if self.options.prints_after(name, changed) {
                let stage = match verified {
                    Ok(()) => Stage::After,
                    Err(_) => Stage::AfterInvalid,
                };
                self.dump(out, index, name, stage, &ir)?;
            }
            if let Err(diagnostic) = verified {
                let error = PassError::Verify {
                    pass: name,
                    diagnostic,
                };
                return Err(self.failure(name, index, error, &input));
            }
        }
        Ok(ir)
    }

    /// Prints `ir` at one point: into the dump directory when there is one, else to `out`.
    fn dump(
        &self,
        out: &mut dyn Write,
        index: usize,
        pass: &str,
        stage: Stage,
        ir: &Ir,
    ) -> Result<(), PipelineError> {
        let text = render(ir);
        match &self.options.dir {
            Some(dir) => {
                let path = dir.join(format!(
                    "{index:03}-{}.{}.txt",
                    file_safe(pass),
                    stage.file_suffix()
                ));
                write_file(&path, &text)
            }
            None => {
                let header = format!(
                    "// -----// IR Dump {} {pass} ({}{}) //----- //\n",
                    stage.title(),
                    ir.form(),
                    stage.note()
                );
                out.write_all(header.as_bytes())
                    .and_then(|()| out.write_all(text.as_bytes()))
                    .and_then(|()| out.flush())
                    .map_err(|e| PipelineError::Dump {
                        target: "the output".to_string(),
                        message: e.to_string(),
                    })
            }
        }
    }

    /// The error for pass `pass` (at `index`) failing on `input`, after writing
    /// `weave-repro-<pass>.txt` (module docs, "Reproducers").
    fn failure(&self, pass: &str, index: usize, error: PassError, input: &Ir) -> PipelineError {
        let reproducer = match &self.options.dir {
            None => Err("no reproducer: set a dump directory (--dump-dir DIR) to write one".into()),
            Some(dir) => {
                let text = reproducer_text(&self.pipeline, pass, index, &error, input);
                write_new(dir, &format!("weave-repro-{}", file_safe(pass)), &text)
                    .map_err(|e| format!("no reproducer: {e}"))
            }
        };
        PipelineError::Pass(Box::new(PassFailure {
            pass: pass.to_string(),
            index,
            pipeline: self.pipeline.clone(),
            error,
            reproducer,
        }))
    }
}

/// A point at which the manager prints the IR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Before,
    After,
    /// After the pass, when the verifier rejected its output.
    AfterInvalid,
}

impl Stage {
    fn title(self) -> &'static str {
        match self {
            Stage::Before => "Before",
            Stage::After | Stage::AfterInvalid => "After",
        }
    }

    /// Said after the form in the header.
    fn note(self) -> &'static str {
        match self {
            Stage::Before | Stage::After => "",
            Stage::AfterInvalid => ", verifier failed",
        }
    }

    fn file_suffix(self) -> &'static str {
        match self {
            Stage::Before => "before",
            Stage::After | Stage::AfterInvalid => "after",
        }
    }
}

/// The reproducer's contents: comment lines saying what failed, then the pass's input.
fn reproducer_text(
    pipeline: &Pipeline,
    pass: &str,
    index: usize,
    error: &PassError,
    input: &Ir,
) -> String {
    let mut s = String::new();
    let n = pipeline.len();
    let _ = writeln!(
        s,
        "// weave reproducer: pass `{pass}` ({} of {n}) failed",
        index + 1
    );
    for (i, error_line) in error.to_string().lines().enumerate() {
        let label = if i == 0 { "error: " } else { "       " };
        let _ = writeln!(s, "// {label}{error_line}");
    }
    let _ = writeln!(s, "// pipeline: {pipeline}");
    let _ = writeln!(s, "// failing pass: {pass}");
    let source = match index {
        0 => "the pipeline's input".to_string(),
        _ => format!("the output of `{}`", pipeline.names()[index - 1]),
    };
    let form = input.form();
    let _ = writeln!(s, "// input to `{pass}` below: a {form}, {source}");
    match input {
        Ir::Fusion(fusion) => {
            let _ = writeln!(s, "// rerun: cargo xtask dump <this file> --passes={pass}");
            s.push('\n');
            s.push_str(&weave_ir::text::print(fusion));
            s.push_str(
                "\n// The same fusion in the seed style, with the domains as the pass saw them:\n",
            );
            for l in weave_ir::print::fusion_to_string(fusion).lines() {
                let _ = writeln!(s, "//{}{l}", if l.is_empty() { "" } else { " " });
            }
        }
        Ir::Host(program) => {
            let _ = writeln!(
                s,
                "// the host program text below parses back with weave_host_ir::parse"
            );
            s.push('\n');
            s.push_str(&weave_host_ir::print(program));
        }
        // A segmentation has no parser: the fusion it partitions and its segments, as dumped.
        Ir::Segmented(_) => {
            s.push('\n');
            s.push_str(&render(input));
        }
    }
    s
}

/// Prints `ir` in its text form: the seed-style fusion printer for a fusion; for a segmented
/// fusion, that print of its fusion followed by its segments (its `Display`, one line each);
/// the host IR printer for a host program. Dumps and reproducers go through
/// here, so a new printer is wired in one place.
pub fn render(ir: &Ir) -> String {
    match ir {
        Ir::Fusion(fusion) => weave_ir::print::fusion_to_string(fusion),
        // The fusion the segments partition, then one line per segment in run order.
        Ir::Segmented(segmented) => format!(
            "{}\n%segments {{\n{segmented:#}}} // %segments\n",
            weave_ir::print::fusion_to_string(segmented.fusion())
        ),
        Ir::Host(program) => weave_host_ir::print(program),
    }
}

/// Checks `ir` with the verifier of its form, in a `verify` span (module docs, "Tracing").
pub fn verify(ir: &Ir) -> Result<(), Diagnostic> {
    let span = tracing::debug_span!("verify", form = ir.form(), valid = tracing::field::Empty);
    let _in_verify = span.enter();
    let verified = verify_form(ir);
    span.record("valid", verified.is_ok());
    verified
}

fn verify_form(ir: &Ir) -> Result<(), Diagnostic> {
    match ir {
        Ir::Fusion(fusion) => weave_ir::verify::verify(fusion),
        // The fusion first, so that a broken tensor is reported as such and not as a
        // segmentation problem it causes.
        Ir::Segmented(segmented) => {
            weave_ir::verify::verify(segmented.fusion())?;
            weave_segmenter::verify(segmented).map_err(|e| Diagnostic::new(e.to_string()))
        }
        Ir::Host(program) => weave_host_ir::verify(program),
    }
}

/// `name` with every character outside `[A-Za-z0-9_-]` replaced by `_`, for file names.
fn file_safe(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Writes `text` to `path`, creating its directory first.
/// Writes `text` to a file of `dir` named `stem.txt`, or `stem.N.txt` with the first N from 2
/// whose name is free: never over an existing file.
fn write_new(dir: &Path, stem: &str, text: &str) -> Result<PathBuf, PipelineError> {
    let err = |path: &Path, e: std::io::Error| PipelineError::Dump {
        target: path.display().to_string(),
        message: e.to_string(),
    };
    std::fs::create_dir_all(dir).map_err(|e| err(dir, e))?;
    for n in 1..=10_000 {
        let name = match n {
            1 => format!("{stem}.txt"),
            n => format!("{stem}.{n}.txt"),
        };
        let path = dir.join(name);
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(mut f) => {
                f.write_all(text.as_bytes()).map_err(|e| err(&path, e))?;
                return Ok(path);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(err(&path, e)),
        }
    }
    Err(err(
        &dir.join(format!("{stem}.txt")),
        std::io::Error::other("10000 reproducers of this pass are already there"),
    ))
}

fn write_file(path: &Path, text: &str) -> Result<(), PipelineError> {
    let err = |e: std::io::Error| PipelineError::Dump {
        target: path.display().to_string(),
        message: e.to_string(),
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    std::fs::write(path, text).map_err(err)
}
