//! What a run is given and how it fails, shared by the CPU ranks ([`crate::run`]) and the GPU
//! ranks ([`crate::gpu`]): the compiled program ([`Compiled`]), how to run it
//! ([`RunOptions`], [`BackendKind`], [`Transport`]) and [`RunError`].

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use weave_executor::{ExecError, StreamKey};
use weave_host_ir::HostProgram;
use weave_ir::Fusion;

/// A fusion compiled for running: the program every rank runs, and the fusions the inputs
/// and the reference are made from.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// The fusion as loaded: what the reference evaluates.
    pub fusion: Fusion,
    /// The fusion after the pre-segmentation passes: the shardings of every input and
    /// output, which the per-rank buffers follow.
    pub sharded: Fusion,
    /// The host program.
    pub program: HostProgram,
    /// Time spent in the pass pipeline.
    pub compile_time: Duration,
}

/// How to run.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// In-process ranks.
    pub ranks: usize,
    /// `numberOfStreams`: the size of each rank's stream pool.
    pub streams: usize,
    /// Run the race checker.
    pub check_races: bool,
    /// Record spans for the timeline.
    pub trace: bool,
    /// Seed of the generated inputs.
    pub seed: u64,
    /// How long any stream or collective waits before failing.
    pub timeout: Duration,
    /// Streams slowed down before each job (tests, CPU backend).
    pub delays: Vec<(StreamKey, Duration)>,
    /// Where the ranks run.
    pub backend: BackendKind,
    /// Runs of the program before the one that is checked and traced (GPU: warms up
    /// kernels, GEMM plans, NCCL connections and the memory pool).
    pub warmup: usize,
    /// Timed runs after the warm-up ones, on inputs already on the device (outputs left
    /// there): their wall times land in [`RankRun::timed`](weave_executor::RankRun).
    pub iters: usize,
    /// How the CUDA backend moves allgathers and send/recv transfers.
    pub transport: Transport,
}

/// How ranks on GPUs move the data of allgathers and point-to-point transfers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transport {
    /// NCCL kernels for everything.
    #[default]
    Nccl,
    /// The GPUs' copy engines (no SMs): peer copies between the threads of one process
    /// (`weave_comm::PeerCopy`), shared receive windows between processes
    /// (`weave_comm::IpcCopy`); other collectives still use NCCL.
    CopyEngine,
}

/// Where ranks run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// Host threads and memory; always available.
    Cpu,
    /// One GPU per rank, NCCL between them.
    Cuda,
}

impl Default for RunOptions {
    fn default() -> RunOptions {
        RunOptions {
            ranks: 2,
            streams: 2,
            check_races: true,
            trace: false,
            seed: 0x5eed,
            timeout: Duration::from_secs(30),
            delays: Vec::new(),
            backend: BackendKind::Cpu,
            warmup: 0,
            iters: 0,
            transport: Transport::Nccl,
        }
    }
}

/// Why a run could not produce a report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunError {
    /// The fusion and the run options do not fit together (rank count against meshes).
    Setup(String),
    /// The reference evaluation failed.
    Reference(String),
    /// Ranks failed; each with its error, by rank.
    Ranks(Vec<(usize, ExecError)>),
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::Setup(m) => f.write_str(m),
            RunError::Reference(m) => write!(f, "reference evaluation failed: {m}"),
            RunError::Ranks(errors) => {
                for (k, (rank, e)) in errors.iter().enumerate() {
                    if k > 0 {
                        writeln!(f)?;
                    }
                    write!(f, "rank {rank}: {e}")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for RunError {}

/// The fusion's parameter values.
pub fn params_of(fusion: &Fusion) -> HashMap<String, i64> {
    fusion
        .params()
        .iter()
        .filter_map(|p| p.value.or(p.default).map(|v| (p.name.clone(), v)))
        .collect()
}
