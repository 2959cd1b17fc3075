//! Compile once, run on your own tensors: [`Compiler`] turns a fusion into an [`Executable`]
//! (a host program with its signature), and [`Executable::run`] takes named global inputs,
//! runs every rank on a [`Target`] and returns named global outputs, checked against the f64
//! reference only when asked.
//!
//! ```
//! use streamweave::{Compiler, Target, Tensor, RunOptions};
//!
//! let source = "fusion scale(n = 4, d: mesh = 2) {
//!   mesh m = devices(d)
//!   tensor x: f32[n] on m
//!   y = mul(x, x)
//!   output y
//!   schedule x { outer_split(0, d) -> DIDx }
//! }";
//! let exe = Compiler::new().devices(2).compile_source("scale.weave", source)?;
//! let x = Tensor::new(vec![4], vec![1.0f32, 2.0, 3.0, 4.0])?;
//! let run = exe.run(&[("x", &x)], &RunOptions::on(Target::Cpu { ranks: 2 }))?;
//! let y = run.into_outputs()?;
//! assert_eq!(y.get("y").unwrap().as_f32().unwrap(), &[1.0, 4.0, 9.0, 16.0]);
//! # Ok::<(), streamweave::Error>(())
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use weave_comm::Communicator;
use weave_executor::reference::{
    compare_with, keep_in_domain, output_tolerances, run_reference, Tolerance,
};
use weave_executor::{Backend, BufferRun, Dense, RankRun, RunConfig};
use weave_host_ir::{HostProgram, Signature, TensorSig};
use weave_ir::{Fusion, ParamRole};
use weave_passes::{DumpOptions, PassManager, Pipeline, Registry};

use crate::chunks::{Calibration, Choice};
use crate::run::{OutputCheck, RunError, RunOptions, RunReport, Target};
use crate::tensor::{Outputs, Tensor};
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

/// How a [`Compiler`] picks the chunk count of the fusion's chunk-count parameter.
#[derive(Clone, Debug, Default)]
pub enum Chunks {
    /// The value the fusion gives it.
    #[default]
    AsWritten,
    /// This many.
    Fixed(usize),
    /// The cost model's choice for this calibration (GEMM throughput, link bandwidths).
    Auto(Calibration),
}

/// Turns fusions into executables: the registry and pipeline of passes, parameter values,
/// the device count and the chunk count.
#[derive(Clone, Debug)]
pub struct Compiler {
    registry_pipeline: Option<Pipeline>,
    dump: DumpOptions,
    params: Vec<(String, i64)>,
    devices: Option<usize>,
    chunks: Chunks,
}

impl Default for Compiler {
    fn default() -> Compiler {
        Compiler::new()
    }
}

impl Compiler {
    /// The standard pipeline, the fusion's own parameter values.
    pub fn new() -> Compiler {
        Compiler {
            registry_pipeline: None,
            dump: DumpOptions::default(),
            params: Vec::new(),
            devices: None,
            chunks: Chunks::AsWritten,
        }
    }

    /// Sets parameter `name` (as `--set name=value` does); it wins over the roles.
    pub fn set(mut self, name: &str, value: i64) -> Compiler {
        self.params.retain(|(n, _)| n != name);
        self.params.push((name.to_string(), value));
        self
    }

    /// Sets the fusion's mesh-size parameter (declared `d: mesh`, or the one parameter that
    /// sizes a 1-D mesh) to `n`, unless [`Compiler::set`] gave it a value.
    pub fn devices(mut self, n: usize) -> Compiler {
        self.devices = Some(n);
        self
    }

    /// How the fusion's chunk-count parameter is chosen, unless [`Compiler::set`] gave it a
    /// value.
    pub fn chunks(mut self, chunks: Chunks) -> Compiler {
        self.chunks = chunks;
        self
    }

    /// Runs `pipeline` instead of the standard one (it must end in a host program).
    pub fn pipeline(mut self, pipeline: Pipeline) -> Compiler {
        self.registry_pipeline = Some(pipeline);
        self
    }

    /// Prints or writes the IR between passes as `dump` says.
    pub fn dump(mut self, dump: DumpOptions) -> Compiler {
        self.dump = dump;
        self
    }

    /// Compiles a fusion built in Rust (or loaded). When the compiler's values change its
    /// parameters, it is reloaded from its canonical text with them, so schedules, meshes and
    /// load checks all see them; otherwise it is lowered as it is.
    pub fn compile(&self, fusion: &Fusion) -> Result<Executable, Error> {
        let file = format!("{}.weave", fusion.name);
        let text = std::cell::OnceCell::new();
        let source = || text.get_or_init(|| weave_ir::text::print(fusion)).clone();
        let first = if self
            .params
            .iter()
            .all(|(k, v)| fusion.param_value(k) == Some(*v))
        {
            fusion.clone()
        } else {
            crate::load(&file, &source(), &self.params)?
        };
        self.build(first, &|set| Ok(crate::load(&file, &source(), set)?))
    }

    /// Loads `source` (named `file` in errors) and compiles it.
    pub fn compile_source(&self, file: &str, source: &str) -> Result<Executable, Error> {
        let first = crate::load(file, source, &self.params)?;
        self.build(first, &|set| Ok(crate::load(file, source, set)?))
    }

    /// Sets the role parameters `first` leaves free (reloading it with `reload` when a value
    /// changes), picks the chunk count, and lowers.
    fn build(&self, first: Fusion, reload: &Reload<'_>) -> Result<Executable, Error> {
        let start = Instant::now();
        let mut set = self.params.clone();
        // The parameter playing `role`, with its value, unless the caller set it.
        let free = |role: ParamRole, set: &[(String, i64)]| {
            first
                .role_param(role)
                .filter(|p| !set.iter().any(|(k, _)| *k == p.name))
                .map(|p| (p.name.clone(), p.value))
        };
        let mut changed = false;
        let mut bind = |set: &mut Vec<(String, i64)>, name: String, current, value: usize| {
            let value = i64::try_from(value).unwrap_or(i64::MAX);
            if current != Some(value) {
                changed = true;
            }
            set.push((name, value));
        };
        if let (Some(n), Some((name, current))) = (self.devices, free(ParamRole::MeshSize, &set)) {
            bind(&mut set, name, current, n);
        }
        let mut choice = None;
        if let Some((name, current)) = free(ParamRole::ChunkCount, &set) {
            let value = match &self.chunks {
                Chunks::AsWritten => None,
                Chunks::Fixed(n) => Some(*n),
                Chunks::Auto(cal) => {
                    // Meter the program built with one chunk, then let the model choose.
                    let mut one = set.clone();
                    one.push((name.clone(), 1));
                    let program = self.lower(reload(&one)?)?;
                    let ranks = self.devices.unwrap_or(1).max(1);
                    // A program whose meshes need more devices than the ranks cannot be
                    // metered on them: it keeps its own chunk count, and running it on too
                    // few ranks is refused by `check_ranks` with its message.
                    let fits = program.signature.as_ref().is_none_or(|sig| {
                        sig.all_devices()
                            .iter()
                            .all(|&d| usize::try_from(d).is_ok_and(|d| d < ranks))
                    });
                    if fits {
                        let w = crate::chunks::workload(&program, ranks)?;
                        let c = crate::chunks::choose(&w, cal, &crate::chunks::CANDIDATES);
                        let n = c.chunks;
                        choice = Some(c);
                        Some(n)
                    } else {
                        None
                    }
                }
            };
            if let Some(v) = value {
                bind(&mut set, name, current, v);
            }
        } else if let (Chunks::Fixed(n), None) =
            (&self.chunks, first.role_param(ParamRole::ChunkCount))
        {
            // A fixed chunk count with nothing to set is refused, never ignored.
            return Err(Error::Program(format!(
                "--chunks {n}: `{}` has no chunk-count parameter (declared `s: chunks` or the extent of its Stream axes) to set",
                first.name
            )));
        }
        let fusion = if changed { reload(&set)? } else { first };
        let program = self.lower(fusion)?;
        let mut exe = Executable::from_program(program)?;
        exe.compile_time = start.elapsed();
        exe.chunk_choice = choice;
        Ok(exe)
    }

    /// Runs the pipeline on a loaded fusion.
    pub fn lower(&self, fusion: Fusion) -> Result<HostProgram, Error> {
        let manager = match &self.registry_pipeline {
            Some(p) => PassManager::new(Registry::standard(), p.clone()),
            None => PassManager::standard(),
        }
        .with_options(self.dump.clone());
        match manager.run(weave_passes::Ir::Fusion(fusion))? {
            weave_passes::Ir::Host(p) => Ok(p),
            other => Err(weave_passes::PipelineError::WrongResult(other.form()).into()),
        }
    }
}

/// Loads the fusion again with other parameter values.
type Reload<'a> = dyn Fn(&[(String, i64)]) -> Result<Fusion, Error> + 'a;

/// A compiled program: the host program every rank runs, with its signature.
#[derive(Clone, Debug)]
pub struct Executable {
    program: HostProgram,
    /// The program's signature (`from_program` refuses a program without one), kept apart
    /// so that no accessor has to assert it is there.
    signature: Signature,
    compile_time: Duration,
    chunk_choice: Option<Choice>,
    /// Runs on GPUs so far and the tuned configuration they use (shared by clones).
    repeated: Arc<Mutex<Repeated>>,
}

/// What [`Executable::run`] remembers between calls on GPUs: how many ran, and once tuned,
/// the program of the winning chunk count with the winner.
#[derive(Debug, Default)]
struct Repeated {
    runs: usize,
    tuned: Option<Arc<Tuned>>,
    tried: bool,
}

/// A tuned program, its configuration and where that came from.
type Tuned = (Executable, crate::tune::Entry, &'static str);

impl Executable {
    /// An executable of a host program that carries a signature (what lower-to-host
    /// records); the program is verified.
    pub fn from_program(program: HostProgram) -> Result<Executable, Error> {
        let Some(signature) = program.signature.clone() else {
            return Err(Error::Program(
                "the host program has no `Signature:` block: it does not say the global shapes and shardings of its inputs and outputs".into(),
            ));
        };
        weave_host_ir::verify(&program).map_err(|d| Error::Program(d.message))?;
        for t in signature.inputs.iter().chain(&signature.outputs) {
            let chunks = t.stream_chunks();
            if i64::try_from(chunks).map_or(true, |c| c > weave_executor::MAX_TRIP_COUNT) {
                return Err(Error::Program(format!(
                    "tensor `{}` is split into {chunks} stream chunks; a stream loop runs at most {} (choose a smaller chunk count)",
                    t.name,
                    weave_executor::MAX_TRIP_COUNT
                )));
            }
        }
        Ok(Executable {
            program,
            signature,
            compile_time: Duration::ZERO,
            chunk_choice: None,
            repeated: Arc::default(),
        })
    }

    /// Parses printed host text (`file` names it in errors) into an executable.
    pub fn from_text(file: &str, text: &str) -> Result<Executable, Error> {
        let program = weave_host_ir::parse(text).map_err(|d| {
            let rendered = d.render(file, text);
            let rendered = rendered.strip_prefix("error: ").unwrap_or(&rendered);
            Error::Program(rendered.trim_end().to_string())
        })?;
        Executable::from_program(program)
    }

    /// The host program.
    pub fn program(&self) -> &HostProgram {
        &self.program
    }

    /// The signature.
    pub fn signature(&self) -> &Signature {
        &self.signature
    }

    /// The inputs a run takes, in order.
    pub fn inputs(&self) -> &[TensorSig] {
        &self.signature().inputs
    }

    /// The outputs a run returns, in order.
    pub fn outputs(&self) -> &[TensorSig] {
        &self.signature().outputs
    }

    /// Time spent compiling (zero for a parsed program).
    pub fn compile_time(&self) -> Duration {
        self.compile_time
    }

    /// The cost model's choice, when [`Chunks::Auto`] picked the chunk count.
    pub fn chunk_choice(&self) -> Option<&Choice> {
        self.chunk_choice.as_ref()
    }

    /// The per-rank configuration of a run starting now: the parameter values, the stream
    /// pool, the race checker, and the deadline of the whole run (`options.timeouts.run` from
    /// now: a rank still issuing statements then stops and names the statement).
    pub fn config(&self, options: &RunOptions) -> RunConfig {
        RunConfig {
            params: self.signature().params.iter().cloned().collect(),
            number_of_streams: options.streams,
            check_races: options.check_races,
            deadline: weave_executor::Deadline::after(options.timeouts.run),
        }
    }

    /// The number of ranks the program's meshes need at least (one past the highest device).
    pub fn min_ranks(&self) -> usize {
        self.signature()
            .all_devices()
            .last()
            .and_then(|d| usize::try_from(*d).ok())
            .map_or(1, |d| d + 1)
    }

    /// Checks that `ranks` fits the program: every device its tensors name exists, and
    /// every rank is a device of some tensor's mesh.
    pub fn check_ranks(&self, ranks: usize) -> Result<(), RunError> {
        if ranks == 0 {
            return Err(RunError::Setup("at least one rank is needed".into()));
        }
        let devices = self.signature().all_devices();
        if let Some(d) = devices
            .iter()
            .find(|&&d| usize::try_from(d).is_ok_and(|d| d >= ranks))
        {
            return Err(RunError::Setup(format!(
                "the program's meshes name device {d} but only {ranks} rank(s) were asked for"
            )));
        }
        if !devices.is_empty() && devices.len() < ranks {
            let how = match self.signature().role(ParamRole::MeshSize) {
                Some(d) => format!("compile it with {d}={ranks}"),
                None => "resize its meshes when compiling".to_string(),
            };
            return Err(RunError::Setup(format!(
                "{ranks} ranks were asked for but the program's meshes cover {} device(s): every rank must be a device of a mesh ({how})",
                devices.len()
            )));
        }
        Ok(())
    }

    /// Seeded random global inputs, one per signature input. Their sizes are checked first
    /// ([`Executable::check_memory`]): a shape whose element count overflows, or inputs that
    /// do not fit in the host memory available, are an error naming the tensor and the bytes.
    ///
    /// Where the program carries its definition, values stay inside the domains of the ops
    /// that read them ([`keep_in_domain`]): the divisor of an integer `div` has no zeros, the
    /// exponent of an integer `pow` and the operand of `log` or `sqrt` no negative values, the
    /// ids of an `index_select` lie in its table's rows. Declared draws are applied first.
    pub fn random_inputs(&self, seed: u64) -> Result<Vec<Dense>, Error> {
        self.check_memory(0)?;
        let mut inputs: Vec<Dense> = self
            .inputs()
            .iter()
            .enumerate()
            .map(|(k, t)| {
                let seed = seed.wrapping_add(k as u64 * 0x9e37_79b9);
                weave_executor::memory::allocate_host(
                    &format!("input `{}` {}{:?}", t.name, t.dtype, t.shape),
                    &t.shape,
                    size_of::<f64>(),
                    || Dense::try_random(t.dtype, t.shape.clone(), seed),
                )
                .map_err(|message| Error::Input {
                    tensor: t.name.clone(),
                    message,
                })
            })
            .collect::<Result<_, _>>()?;
        if let Some(def) = &self.signature().definition {
            // Draws map the seeded values as they were generated; the domains then move
            // what an op cannot take (an id outside its table) and keep the rest.
            apply_draws(def, self.inputs(), &mut inputs);
            keep_in_domain(def, &mut inputs);
        }
        Ok(inputs)
    }

    /// Checks, before anything is allocated, that the global inputs and `ranks` ranks' shards
    /// of them fit in this machine's memory as a run holds them on the host (`f64` values):
    /// every element count must be finite, and their bytes, added up input by input, must
    /// stay within the host memory available. The error names the input that goes over and
    /// the bytes asked for against those available.
    pub fn check_memory(&self, ranks: usize) -> Result<(), Error> {
        use weave_executor::memory;
        let value = size_of::<f64>();
        let available = memory::available_host_bytes();
        let mut total: u64 = 0;
        for t in self.inputs() {
            let what = match ranks {
                0 => format!("input `{}` {}{:?}", t.name, t.dtype, t.shape),
                n => format!(
                    "input `{}` {}{:?} (the global tensor and the shards of {n} rank(s))",
                    t.name, t.dtype, t.shape
                ),
            };
            let input_error = |message: String| Error::Input {
                tensor: t.name.clone(),
                message,
            };
            let global = memory::bytes_of(&t.shape, value)
                .ok_or_else(|| input_error(memory::overflow("its global tensor", &t.shape)))?;
            let mut shards: u64 = 0;
            for rank in 0..ranks {
                if t.holds(rank) {
                    let local = t.local_sizes_of(rank);
                    let b = memory::bytes_of(&local, value)
                        .ok_or_else(|| input_error(memory::overflow("its shard", &local)))?;
                    shards = shards.saturating_add(b);
                }
            }
            total = total.saturating_add(global).saturating_add(shards);
            if total >= memory::CHECK_ABOVE_BYTES {
                memory::check_fits(&what, total, available).map_err(Error::Program)?;
            }
            if usize::try_from(global).map_or(true, |b| b > isize::MAX as usize) {
                return Err(Error::Program(format!(
                    "{what} needs {global} bytes, more than one buffer can hold"
                )));
            }
        }
        Ok(())
    }

    /// Matches named inputs to the signature: each exactly once, with its dtype and global
    /// sizes.
    pub fn bind(&self, inputs: &[(&str, &Tensor)]) -> Result<Vec<Dense>, Error> {
        let mut by_name: HashMap<&str, &Tensor> = HashMap::new();
        for (name, t) in inputs {
            if !self.inputs().iter().any(|s| s.name == *name) {
                let known: Vec<&str> = self.inputs().iter().map(|s| s.name.as_str()).collect();
                return Err(Error::Input {
                    tensor: name.to_string(),
                    message: format!(
                        "the program has no such input (it has: {})",
                        known.join(", ")
                    ),
                });
            }
            if by_name.insert(name, t).is_some() {
                return Err(Error::Input {
                    tensor: name.to_string(),
                    message: "given twice".into(),
                });
            }
        }
        self.inputs()
            .iter()
            .map(|s| {
                let t = by_name.get(s.name.as_str()).ok_or_else(|| Error::Input {
                    tensor: s.name.clone(),
                    message: "not given".into(),
                })?;
                if t.dtype() != s.dtype {
                    return Err(Error::Input {
                        tensor: s.name.clone(),
                        message: format!("is {} but the program takes {}", t.dtype(), s.dtype),
                    });
                }
                if t.shape() != s.shape.as_slice() {
                    return Err(Error::Input {
                        tensor: s.name.clone(),
                        message: format!(
                            "has shape {:?} but the program takes {:?}",
                            t.shape(),
                            s.shape
                        ),
                    });
                }
                Ok(t.to_dense())
            })
            .collect()
    }

    /// Rank `rank`'s buffers of the global inputs.
    pub fn shard_inputs(&self, globals: &[Dense], rank: usize) -> Result<Vec<Dense>, Error> {
        self.inputs()
            .iter()
            .zip(globals)
            .map(|(s, g)| {
                let data = s.shard(&g.data, rank).map_err(|e| Error::Input {
                    tensor: s.name.clone(),
                    message: e.to_string(),
                })?;
                Ok(Dense {
                    dtype: g.dtype,
                    sizes: s.local_sizes_of(rank),
                    data,
                })
            })
            .collect()
    }

    /// The global outputs put back together from every rank's run.
    pub fn gather_outputs(&self, runs: &[RankRun]) -> Result<Outputs, Error> {
        let mut entries = Vec::new();
        for (k, s) in self.outputs().iter().enumerate() {
            let mut locals: Vec<&[f64]> = Vec::with_capacity(runs.len());
            for (rank, run) in runs.iter().enumerate() {
                match run.outputs.get(k) {
                    Some(d) => locals.push(&d.data),
                    None if !s.holds(rank) => locals.push(&[]),
                    None => {
                        return Err(Error::Program(format!(
                            "rank {rank} returned no output `{}`",
                            s.name
                        )))
                    }
                }
            }
            let data = s
                .unshard(&locals, f64::NAN)
                .map_err(|e| Error::Program(e.to_string()))?;
            let dense = Dense {
                dtype: s.dtype,
                sizes: s.shape.clone(),
                data,
            };
            entries.push((s.name.clone(), Tensor::from_dense(&dense)));
        }
        Ok(Outputs { entries })
    }

    /// The f64 reference outputs of the definition on the global inputs.
    pub fn reference(&self, globals: &[Dense]) -> Result<Vec<Dense>, Error> {
        let def = self.signature().definition.as_ref().ok_or_else(|| {
            Error::Program(
                "the program has no `Definition:` block, so there is no reference to check against (run it without checking: `--no-check`, `RunOptions::check = false`)".into(),
            )
        })?;
        // The definition's parameters are those the program was compiled with.
        let mut def = def.clone();
        for (k, v) in &self.signature().params {
            if def.param(k).is_some() {
                def.set_param(k, *v)
                    .map_err(|d| Error::Program(d.message))?;
            }
        }
        run_reference(&def, globals).map_err(|m| Error::Run(RunError::Reference(m)))
    }

    /// Compares every rank's outputs with the shards of the reference outputs it holds, each
    /// at the tolerance of its dtype loosened by the least precise rounding on its path
    /// ([`output_tolerances`] of the definition).
    pub fn check(&self, reference: &[Dense], runs: &[RankRun]) -> Result<Vec<OutputCheck>, Error> {
        let tolerances = self
            .signature()
            .definition
            .as_ref()
            .map(output_tolerances)
            .unwrap_or_default();
        let mut checks = Vec::new();
        for (k, s) in self.outputs().iter().enumerate() {
            let want = reference.get(k).ok_or_else(|| {
                Error::Run(RunError::Reference(format!(
                    "the reference produced no output {k}"
                )))
            })?;
            for (rank, run) in runs.iter().enumerate() {
                if !s.holds(rank) {
                    continue;
                }
                let expected = s
                    .shard(&want.data, rank)
                    .map_err(|e| Error::Program(e.to_string()))?;
                let got = run.outputs.get(k).ok_or_else(|| {
                    Error::Program(format!("rank {rank} returned no output `{}`", s.name))
                })?;
                let tol = tolerances
                    .get(k)
                    .copied()
                    .unwrap_or_else(|| Tolerance::for_dtype(want.dtype));
                let mut comparison = compare_with(&got.data, &expected, tol);
                if got.data.len() != expected.len() {
                    comparison.ok = false;
                }
                checks.push(OutputCheck {
                    output: s.name.clone(),
                    rank,
                    comparison,
                });
            }
        }
        Ok(checks)
    }

    /// Runs the rank of `comm` (`comm.rank()` of `comm.size()`) on inputs already on its
    /// device (`inputs[k]` is the rank's buffer of input `k`, of
    /// [`TensorSig::local_sizes_of`] sizes), on the caller's backend and communicator: for a
    /// caller that owns its GPU, its communicator and its buffers (one process per rank of its
    /// own framework). Returns once every statement is issued; the outputs stay on the device
    /// (the rank's shards, in signature order) and errors of enqueued work surface at the
    /// backend's next synchronization. Every rank of the world calls it with the same
    /// executable.
    pub fn run_rank_buffers<B, C>(
        &self,
        backend: &B,
        comm: &C,
        inputs: &[B::Buffer],
        options: &RunOptions,
    ) -> Result<BufferRun<B::Buffer>, Error>
    where
        B: Backend,
        C: Communicator<Buffer = B::Buffer, Stream = B::CommStream>,
    {
        let rank = comm.rank();
        self.check_ranks(comm.size())?;
        if inputs.len() != self.inputs().len() {
            return Err(Error::Program(format!(
                "rank {rank}: {} input buffers were given, the program takes {}",
                inputs.len(),
                self.inputs().len()
            )));
        }
        weave_executor::run_rank_buffers(
            &self.program,
            backend,
            comm,
            inputs,
            &self.config(options),
        )
        .map_err(|e| Error::Run(RunError::Ranks(vec![(rank, e)])))
    }

    /// Runs every rank of `options.target` on the named global inputs and returns the global
    /// outputs (and, when `options.check`, every rank's outputs against the reference).
    pub fn run(
        &self,
        inputs: &[(&str, &Tensor)],
        options: &RunOptions,
    ) -> Result<RunReport, Error> {
        let globals = self.bind(inputs)?;
        self.run_dense(&globals, options)
    }

    /// [`Executable::run`] on global inputs already in the executor's dense form, in
    /// signature order.
    pub fn run_dense(&self, globals: &[Dense], options: &RunOptions) -> Result<RunReport, Error> {
        match self.tuned_for(options) {
            Some(Ok(tuned)) => {
                let (exe, entry, source) = &*tuned;
                let mut options = options.clone();
                entry.apply(&mut options);
                let mut report = exe.run_untuned(globals, &options)?;
                report.config = Some(format!("{} ({source})", entry.candidate()));
                Ok(report)
            }
            Some(Err(why)) => {
                let mut report = self.run_untuned(globals, options)?;
                report.config = Some(format!("as compiled (tuning failed: {why})"));
                Ok(report)
            }
            None => self.run_untuned(globals, options),
        }
    }

    /// The tuned program and configuration a run with `options` uses: on GPUs of this process,
    /// from the second run on, when the options leave pool, transport and knobs at their
    /// defaults and the program carries its definition (to compile other chunk counts).
    /// Tunes once ([`RunOptions::tune`]) when the cache has nothing; `Some(Err)` on the run
    /// whose tuning failed (later runs run the program as compiled, `None`).
    fn tuned_for(&self, options: &RunOptions) -> Option<Result<Arc<Tuned>, String>> {
        let Target::Cuda { ranks } = options.target else {
            return None;
        };
        let budget = options.tune?;
        let defaults = RunOptions::default();
        if options.streams != defaults.streams
            || options.transport != defaults.transport
            || options.overlap != defaults.overlap
        {
            return None;
        }
        let mut repeated = self.repeated.lock().unwrap_or_else(|p| p.into_inner());
        repeated.runs += 1;
        if let Some(t) = &repeated.tuned {
            return Some(Ok(t.clone()));
        }
        if repeated.runs < 2 || repeated.tried {
            return None;
        }
        repeated.tried = true;
        let definition = self.signature().definition.as_ref()?;
        let tuned = self
            .tune_now(definition, ranks, budget, options)
            .map(Arc::new);
        if let Ok(t) = &tuned {
            repeated.tuned = Some(t.clone());
        }
        Some(tuned)
    }

    /// Tunes `definition` on `ranks` GPUs within `budget` unless `options.tune_cache` holds
    /// its configuration, and compiles the winner's chunk count.
    fn tune_now(
        &self,
        definition: &Fusion,
        ranks: usize,
        budget: Duration,
        options: &RunOptions,
    ) -> Result<Tuned, String> {
        let mut fusion = definition.clone();
        if let Some(name) = fusion
            .role_param(ParamRole::MeshSize)
            .map(|p| p.name.clone())
        {
            fusion
                .set_param(&name, i64::try_from(ranks).unwrap_or(i64::MAX))
                .map_err(|d| d.message)?;
        }
        let machine = crate::tune::gpu_name(0)?;
        let key = crate::tune::TuneKey::of(&fusion, ranks, "cuda", &machine);
        let cache = options.tune_cache.as_deref();
        let cached = match cache {
            Some(p) => crate::tune::lookup(p, &key)?,
            None => None,
        };
        let (entry, source) = match cached {
            Some(e) => (e, "the tuning cache"),
            None => {
                let tune_options =
                    crate::tune::TuneOptions::first_run(ranks, &machine, None, budget);
                #[cfg(feature = "cuda")]
                let mut measure =
                    crate::measure::WorldMeasure::open(ranks, 3, 10, options.timeouts.wait)?;
                #[cfg(not(feature = "cuda"))]
                let mut measure = crate::tune::RunMeasure::new(
                    Target::Cuda { ranks },
                    3,
                    10,
                    options.timeouts.run,
                );
                let tuning = crate::tune::tune(&fusion, &tune_options, &mut measure)
                    .map_err(|e| e.to_string())?;
                drop(measure);
                let entry = tuning.entry().ok_or("no candidate could be measured")?;
                if let Some(p) = cache {
                    // A cache that cannot be written keeps the result for this executable.
                    let _ = crate::tune::store(p, &tuning);
                }
                (entry, "tuned now")
            }
        };
        let exe = Compiler::new()
            .devices(ranks)
            .chunks(entry.compiler_chunks())
            .compile(&fusion)
            .map_err(|e| e.to_string())?;
        Ok((exe, entry, source))
    }

    /// [`Executable::run_dense`] of this program with `options` as given, never tuned.
    fn run_untuned(&self, globals: &[Dense], options: &RunOptions) -> Result<RunReport, Error> {
        if globals.len() != self.inputs().len() {
            return Err(Error::Program(format!(
                "{} inputs were given, the program takes {}",
                globals.len(),
                self.inputs().len()
            )));
        }
        let ranks = options.target.ranks();
        options.target.check()?;
        self.check_ranks(ranks)?;
        if let Target::Cpu { ranks } = options.target {
            // One budget for every rank of this process, reserved before the reference or
            // any rank allocates; the reference's global outputs are held beside them.
            let reference_outputs = if options.check {
                self.outputs().iter().fold(0u64, |sum, t| {
                    let bytes = weave_executor::memory::bytes_of(&t.shape, size_of::<f64>());
                    sum.saturating_add(bytes.unwrap_or(u64::MAX))
                })
            } else {
                0
            };
            let metered = self.config(options);
            crate::run::reserve_host_memory(&self.program, &metered, ranks, reference_outputs)?;
        }
        let (reference, reference_time) = if options.check {
            let t0 = Instant::now();
            (Some(self.reference(globals)?), t0.elapsed())
        } else {
            (None, Duration::ZERO)
        };
        let config = self.config(options);
        #[cfg(not(feature = "cuda"))]
        if options.target.is_cuda() {
            return Err(RunError::Setup(crate::run::NO_CUDA.to_string()).into());
        }
        let (runs, run_time, all) = match &options.target {
            #[cfg(feature = "cuda")]
            Target::Launched(env) => {
                let inputs = self.shard_inputs(globals, env.rank)?;
                let l = crate::gpu::run_launched(&self.program, &config, inputs, options, env)?;
                (l.runs, l.run_time, l.gathered)
            }
            target => {
                let per_rank = (0..ranks)
                    .map(|r| self.shard_inputs(globals, r))
                    .collect::<Result<Vec<_>, _>>()?;
                #[cfg(feature = "cuda")]
                let (runs, time) = if target.is_cuda() {
                    crate::gpu::run_threads(&self.program, &config, per_rank, options)?
                } else {
                    crate::run::run_local(&self.program, &config, per_rank, options)?
                };
                #[cfg(not(feature = "cuda"))]
                let (runs, time) = {
                    let _ = target;
                    crate::run::run_local(&self.program, &config, per_rank, options)?
                };
                (runs, time, true)
            }
        };
        let checks = match (&reference, all) {
            (Some(r), true) => self.check(r, &runs)?,
            _ => Vec::new(),
        };
        let outputs = if all {
            Some(self.gather_outputs(&runs)?)
        } else {
            None
        };
        Ok(RunReport {
            outputs,
            ranks: runs,
            checks,
            reference_time,
            run_time,
            config: None,
        })
    }
}

/// Redraws the generated values of every input whose declaration in `def` says how
/// ([`weave_ir::Draw`]): `uniform(lo, hi)` maps each seeded value (uniform in its own range)
/// onto `[lo, hi)` — floored for integers — and `const(v)` fills; each value rounded to the
/// input's dtype.
fn apply_draws(def: &Fusion, sigs: &[TensorSig], inputs: &mut [Dense]) {
    for (sig, input) in sigs.iter().zip(inputs.iter_mut()) {
        let Some(t) = def
            .inputs()
            .iter()
            .copied()
            .find(|t| def.tensor(*t).name == sig.name)
        else {
            continue;
        };
        let Some(draw) = def.draw(t) else {
            continue;
        };
        let dtype = input.dtype;
        let integer = matches!(dtype, weave_ir::DType::I64);
        for v in &mut input.data {
            let x = match draw {
                weave_ir::Draw::Const(c) => c,
                weave_ir::Draw::Uniform(lo, hi) => {
                    // The seeded value's place in its own range: [-1, 1) for floats, the
                    // integers -8..=8 for i64.
                    let u = if integer {
                        (*v + 8.0) / 17.0
                    } else {
                        (*v + 1.0) / 2.0
                    };
                    let x = lo + (hi - lo) * u.clamp(0.0, 1.0);
                    if integer {
                        x.floor().min(hi.ceil() - 1.0).max(lo.ceil())
                    } else {
                        x
                    }
                }
            };
            *v = weave_executor::dense::round_to(dtype, x);
        }
    }
}
