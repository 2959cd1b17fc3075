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

mod compiler;
mod error;
mod inputs;
mod outputs;
mod running;

pub use compiler::{Chunks, ChunksParseError, Compiler, MAX_RING_PIECES};
pub use error::Error;
#[cfg(feature = "cuda")]
pub(crate) use running::{tune_definition, TuneFor};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use weave_executor::RunConfig;
use weave_host_ir::{HostProgram, Signature, TensorSig};
use weave_ir::ParamRole;

use crate::chunks::Choice;
#[cfg(doc)]
use crate::run::Target;
use crate::run::{RunError, RunOptions};

/// A compiled program: the host program every rank runs, with its signature.
#[derive(Clone, Debug)]
pub struct Executable {
    program: HostProgram,
    /// The program's signature (`from_program` refuses a program without one), kept apart
    /// so that no accessor has to assert it is there.
    signature: Signature,
    compile_time: Duration,
    chunk_choice: Option<Choice>,
    /// The chunk count and the pieces per ring step, when a chunk count that multiplies a
    /// ring's chunks cut its steps into pieces (`lower-to-host{ring-pieces=K}`).
    ring_pieces: Option<(usize, i64)>,
    ring_form: Option<weave_passes::ring_form::RingForm>,
    /// Runs on GPUs so far and the tuned configuration they use (shared by clones).
    repeated: Arc<Mutex<running::Repeated>>,
    /// The kernel tables made so far, by rank count, pool size and SM count (shared by
    /// clones): [`Executable::kernel_table`].
    pub(crate) kernel_tables: KernelTables,
}

/// The kernel tables of an executable, by rank count, pool size and SM count.
type KernelTables = Arc<Mutex<HashMap<(usize, usize, usize), Arc<weave_executor::KernelTable>>>>;

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
            ring_pieces: None,
            ring_form: None,
            repeated: Arc::default(),
            kernel_tables: Arc::default(),
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

    /// `(S, K)` when the chunk count `S` cut a reduce ring's steps into `K` pieces each, summed
    /// in the ring's GEMMs ([`Chunks::Fixed`] a multiple of the chunks its loops run, or
    /// [`Chunks::Ring`] of `K` ≥ 2).
    pub fn ring_pieces(&self) -> Option<(usize, i64)> {
        self.ring_pieces
    }

    /// What [`Chunks::Ring`] rewrote into rings, when it compiled this executable.
    pub fn ring_form(&self) -> Option<&weave_passes::ring_form::RingForm> {
        self.ring_form.as_ref()
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
}
