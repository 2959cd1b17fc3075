//! What a run is given and how it fails, shared by the CPU ranks ([`crate::run`]) and the GPU
//! ranks ([`crate::gpu`]): how and where to run ([`RunOptions`], [`Target`], [`Timeouts`],
//! [`Transport`], [`Overlap`])
//! and [`RunError`].

use std::fmt;
use std::time::Duration;

use weave_comm::bootstrap::LaunchEnv;
#[cfg(feature = "cuda")]
use weave_comm::nccl::NcclOptions;
#[cfg(feature = "cuda")]
use weave_executor::CudaOptions;
use weave_executor::{ExecError, StreamKey};

/// Where the ranks of a run go. The GPU targets need the `cuda` feature (on by default):
/// without it they are refused with [`RunError::Setup`] saying so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// `ranks` ranks, each on its own host thread with the CPU backend; always available.
    Cpu {
        /// How many.
        ranks: usize,
    },
    /// `ranks` ranks, each on its own host thread driving its own GPU (GPU `r` for rank `r`),
    /// NCCL between them.
    Cuda {
        /// How many.
        ranks: usize,
    },
    /// This process is one rank of a world of processes started by a launcher (`weave
    /// launch`, torchrun, mpirun): it runs its rank on GPU `local_rank`, and rank 0 gathers
    /// every rank's outputs.
    Launched(LaunchEnv),
}

/// The most ranks one process runs on its own threads ([`Target::Cpu`], [`Target::Cuda`]):
/// each rank is a thread with a thread per stream, and more than this is a mistaken rank
/// count, not a machine (a launched world is not limited: each process runs one rank).
pub const MAX_THREAD_RANKS: usize = 1024;

impl Target {
    /// Checks the rank count: at least one, and at most [`MAX_THREAD_RANKS`] on threads.
    pub fn check(&self) -> Result<(), RunError> {
        let ranks = self.ranks();
        if ranks == 0 {
            return Err(RunError::Setup("at least one rank is needed".into()));
        }
        if !matches!(self, Target::Launched(_)) && ranks > MAX_THREAD_RANKS {
            return Err(RunError::Setup(format!(
                "{ranks} ranks were asked for; one process runs at most {MAX_THREAD_RANKS} ranks on its threads (start one process per rank with `weave launch` for more)"
            )));
        }
        Ok(())
    }

    /// The number of ranks of the whole run.
    pub fn ranks(&self) -> usize {
        match self {
            Target::Cpu { ranks } | Target::Cuda { ranks } => *ranks,
            Target::Launched(env) => env.world,
        }
    }

    /// Whether the ranks run on GPUs.
    pub fn is_cuda(&self) -> bool {
        !matches!(self, Target::Cpu { .. })
    }

    /// `cpu` or `cuda`.
    pub fn backend_name(&self) -> &'static str {
        if self.is_cuda() {
            "cuda"
        } else {
            "cpu"
        }
    }
}

/// How to run.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Where the ranks run.
    pub target: Target,
    /// `numberOfStreams`: the size of each rank's stream pool.
    pub streams: usize,
    /// Compare every rank's outputs with the f64 reference evaluation of the program's
    /// definition (opt-in: it costs a global evaluation on the host).
    pub check: bool,
    /// Run the race checker.
    pub check_races: bool,
    /// Record spans for the timeline.
    pub trace: bool,
    /// How long the run may take, how long ranks wait to meet, and how long any wait may
    /// take ([`Timeouts`]; `weave run --timeout-secs` sets all three).
    pub timeouts: Timeouts,
    /// Runs of the program before the one that is checked and traced (GPU: warms up
    /// kernels, GEMM plans, NCCL connections and the memory pool).
    pub warmup: usize,
    /// Timed runs after the warm-up ones, on inputs already on the device (outputs left
    /// there): their wall times land in [`RankRun::timed`](weave_executor::RankRun).
    pub iters: usize,
    /// What only the CPU backend reads ([`Target::Cpu`]).
    pub cpu: CpuRunOptions,
    /// What only GPU runs read ([`Target::Cuda`], [`Target::Launched`]): replay, transport,
    /// overlap knobs and tuning.
    pub gpu: GpuRunOptions,
}

/// The options of a run that only the CPU backend reads ([`RunOptions::cpu`]).
#[derive(Clone, Debug, Default)]
pub struct CpuRunOptions {
    /// Streams slowed down before each job (tests of stream ordering and races).
    pub delays: Vec<(StreamKey, Duration)>,
}

/// The options of a run that only GPU runs read ([`RunOptions::gpu`]).
#[derive(Clone, Debug)]
pub struct GpuRunOptions {
    /// Time the repetitions as replays of one run captured as a CUDA graph (the default;
    /// [`weave_executor::Replay`]): one launch per run instead of one host call per
    /// statement. Off, each repetition is issued statement by statement.
    pub replay: bool,
    /// How the CUDA backend moves allgathers and send/recv transfers.
    pub transport: Transport,
    /// How the CUDA backend shares the GPU between compute and communication.
    pub overlap: Overlap,
    /// The second [`Executable::run`](crate::Executable::run) of a program on GPUs of this
    /// process (`Target::Cuda`), with the default pool, transport and overlap knobs, tunes it
    /// first within this budget unless [`GpuRunOptions::tune_cache`] has its configuration, and
    /// runs (and later runs) the winner ([`crate::RunReport::config`] says which). `None`:
    /// never.
    pub tune: Option<Duration>,
    /// The tuning cache that file reads and writes (`weave` passes `$WEAVE_TUNE_CACHE`, else
    /// `~/.cache/streamweave/tune.toml`); `None`: the tuned configuration lives in the
    /// executable only.
    pub tune_cache: Option<std::path::PathBuf>,
}

impl Default for GpuRunOptions {
    fn default() -> GpuRunOptions {
        GpuRunOptions {
            replay: true,
            transport: Transport::Nccl,
            overlap: Overlap::default(),
            tune: Some(Duration::from_secs(60)),
            tune_cache: None,
        }
    }
}

/// The three bounds of a run ([`RunOptions::timeouts`]). [`Timeouts::all`] gives one value to
/// each, as `weave run --timeout-secs` and the Python binding's `timeout_secs` do; the default
/// is 30 s for each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Timeouts {
    /// How long the whole run may take: its deadline, counted from the start of the run, which
    /// each rank checks before every statement it issues (a rank still issuing then stops and
    /// names the statement). On GPU threads ([`Target::Cuda`]) the rank threads are waited for
    /// until this and a grace to stop.
    pub run: Duration,
    /// How long ranks wait to meet: a launched rank ([`Target::Launched`]) opening the
    /// launcher's TCP store and every exchange through it (the NCCL id, the copy-engine
    /// windows, rank 0 gathering the ranks' runs or shards), and the rank threads of one
    /// process exchanging their copy-engine windows.
    pub store: Duration,
    /// How long any wait may take before failing: a stream waiting for another stream's
    /// event, a collective waiting for its peers (the in-process communicator's waits, every
    /// NCCL call of the rank, creation and splits included: NCCL has one timeout), and the
    /// host waiting for the device or the streams.
    pub wait: Duration,
}

impl Timeouts {
    /// `d` for each of the three.
    pub const fn all(d: Duration) -> Timeouts {
        Timeouts {
            run: d,
            store: d,
            wait: d,
        }
    }
}

impl Default for Timeouts {
    /// 30 s for each.
    fn default() -> Timeouts {
        Timeouts::all(Duration::from_secs(30))
    }
}

/// The CUDA backend's overlap knobs: how compute and communication share one GPU. The
/// default is what the backend does without being asked; `weave tune` (and the first
/// repeated run of an untuned program) measures the alternatives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Overlap {
    /// Give the stream pool (which posts the chunks' collectives) the highest stream
    /// priority, so collective kernels are scheduled ahead of queued GEMM blocks.
    pub pool_priority_high: bool,
    /// Post the collectives from high-priority streams of their own, one beside each pool
    /// stream (each entered after its stream's work so far, and waited for by it): a
    /// chunk's collective is then scheduled ahead of the GEMM blocks the other chunks'
    /// streams queue at normal priority, which the pool priority cannot do (the pool carries
    /// both).
    pub comm_priority_high: bool,
    /// SMs every GEMM leaves to concurrent communication (cuBLASLt's SM-count target is the
    /// GPU's SM count minus this; 0: the whole GPU).
    pub gemm_sm_margin: u32,
    /// The most CTAs one NCCL kernel may use (`maxCTAs`); `None` lets NCCL choose.
    pub nccl_max_ctas: Option<u32>,
    /// NCCL's CTA policy (`ncclConfig_t::CTAPolicy`, NCCL ≥ 2.27); `None` lets NCCL choose.
    pub nccl_cta_policy: Option<NcclCtaPolicy>,
    /// MiB of a symmetric NCCL window in each direction (0: none). Whole-world
    /// allgathers, allreduces and reduce-scatters whose buffers fit are staged through it,
    /// at the same offsets on every rank, so NCCL may run its symmetric kernels (and, with
    /// [`NcclCtaPolicy::Zero`], copy-engine collectives) on them; larger ones run as
    /// before. Costs two device-to-device copies per staged collective and `2 × MiB` of
    /// device memory per rank.
    pub nccl_window_mib: u32,
    /// MiB of each slot of the copy-engine transport's receive windows (0: the default, 8
    /// MiB, or `WEAVE_CE_WINDOWS`'s). A reduce-scatter's or allgather's block to one peer
    /// that fits one slot moves as one piece, with one handshake; each rank holds
    /// `8 lanes × 2 slots × (ranks − 1)` of them. At most [`MAX_CE_SLOT_MIB`].
    pub ce_slot_mib: u32,
    /// With the copy-engine transport: a linear whose output only feeds a sum
    /// reduce-scatter or allreduce is computed by that collective, block by block, each
    /// peer's block written by the GEMM straight into the peer's receive window (the
    /// transfer is the GEMM's own stores: no copy, no SM of a collective kernel), the
    /// rank's own block in place, each summed where it landed.
    pub gemm_into_windows: bool,
    /// Run compute in issue order across streams (each GEMM or kernel waits, on the GPU,
    /// for the one issued before it): chunk `i + 1` computes while chunk `i` communicates,
    /// instead of every chunk's GEMM starting at once.
    pub ordered_compute: bool,
}

impl Overlap {
    /// The knobs as `weave run` flags would set them, the default ones left out
    /// (`ordered compute, pool priority high, GEMM SMs - 16, NCCL maxCTAs = 16`), or
    /// `defaults`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.ordered_compute {
            parts.push("ordered compute".to_string());
        }
        if self.pool_priority_high {
            parts.push("pool priority high".to_string());
        }
        if self.comm_priority_high {
            parts.push("collectives at high priority".to_string());
        }
        if self.gemm_sm_margin > 0 {
            parts.push(format!("GEMM SMs - {}", self.gemm_sm_margin));
        }
        if let Some(n) = self.nccl_max_ctas {
            parts.push(format!("NCCL maxCTAs = {n}"));
        }
        if let Some(p) = self.nccl_cta_policy {
            parts.push(format!("NCCL CTA policy {p}"));
        }
        if self.nccl_window_mib > 0 {
            parts.push(format!("NCCL window {} MiB", self.nccl_window_mib));
        }
        if self.ce_slot_mib > 0 {
            parts.push(format!("copy-engine slots of {} MiB", self.ce_slot_mib));
        }
        if self.gemm_into_windows {
            parts.push("GEMMs into windows".to_string());
        }
        if parts.is_empty() {
            "defaults".to_string()
        } else {
            parts.join(", ")
        }
    }

    /// Whether these knobs can run with `transport`: collectives at high priority need NCCL
    /// ([`OverlapError::CommPriorityOnCopyEngines`]).
    pub fn check(&self, transport: Transport) -> Result<(), OverlapError> {
        if self.comm_priority_high && transport == Transport::CopyEngine {
            return Err(OverlapError::CommPriorityOnCopyEngines);
        }
        Ok(())
    }

    #[cfg(feature = "cuda")]
    /// The backend options these knobs give with `transport` on a GPU of `sm_count` SMs (a
    /// margin that would leave a GEMM no SM, and knobs the transport cannot run
    /// ([`Overlap::check`]), are refused).
    pub fn cuda_options(
        &self,
        base: CudaOptions,
        sm_count: i32,
        transport: Transport,
    ) -> Result<CudaOptions, OverlapError> {
        self.check(transport)?;
        let gemm_sm_count = match self.gemm_sm_margin {
            0 => 0,
            m => {
                let left = i64::from(sm_count) - i64::from(m);
                if left < 1 {
                    return Err(OverlapError::NoGemmSms {
                        margin: m,
                        sm_count,
                    });
                }
                left as i32
            }
        };
        Ok(CudaOptions {
            gemm_sm_count,
            pool_priority_high: self.pool_priority_high,
            comm_priority_high: self.comm_priority_high,
            ordered_compute: self.ordered_compute,
            produce_into_windows: self.gemm_into_windows,
            produce_slot_bytes: match self.gemm_into_windows {
                true => self.ce_windows().map_or(0, |w| w.slot_bytes),
                false => 0,
            },
            ..base
        })
    }

    #[cfg(feature = "cuda")]
    /// The NCCL options these knobs give (`base` with their CTA limit).
    pub fn nccl_options(&self, base: NcclOptions) -> Result<NcclOptions, OverlapError> {
        let max_ctas = match self.nccl_max_ctas {
            None => None,
            Some(0) => return Err(OverlapError::NoCta),
            Some(n) => Some(i32::try_from(n).map_err(|_| OverlapError::TooManyCtas { ctas: n })?),
        };
        let symmetric_window = match self.nccl_window_mib {
            0 => None,
            mib if mib > MAX_NCCL_WINDOW_MIB => {
                return Err(OverlapError::WindowTooLarge {
                    mib,
                    limit: MAX_NCCL_WINDOW_MIB,
                })
            }
            mib => Some(mib as usize * 1024 * 1024),
        };
        Ok(NcclOptions {
            max_ctas,
            cta_policy: self.nccl_cta_policy.map(NcclCtaPolicy::to_comm),
            symmetric_window,
            ..base
        })
    }

    #[cfg(feature = "cuda")]
    /// The copy-engine windows' shape: `WEAVE_CE_WINDOWS`'s (else the default), with
    /// [`Overlap::ce_slot_mib`]'s slot size where it is set.
    pub fn ce_windows(&self) -> Result<weave_comm::IpcOptions, OverlapError> {
        let windows = weave_comm::IpcOptions::from_env()?;
        match self.ce_slot_mib {
            0 => Ok(windows),
            mib if mib > MAX_CE_SLOT_MIB => Err(OverlapError::SlotTooLarge {
                mib,
                limit: MAX_CE_SLOT_MIB,
            }),
            mib => Ok(weave_comm::IpcOptions {
                slot_bytes: mib as usize * 1024 * 1024,
                ..windows
            }),
        }
    }

    /// Whether the knobs make NCCL communicators differ from the default ones (a run with
    /// them needs communicators of its own).
    pub fn needs_own_communicators(&self) -> bool {
        self.nccl_max_ctas.is_some() || self.nccl_cta_policy.is_some() || self.nccl_window_mib > 0
    }
}

/// Why overlap knobs ([`Overlap`]) do not fit a GPU, NCCL or the copy-engine windows
/// ([`Overlap::cuda_options`], [`Overlap::nccl_options`], [`Overlap::ce_windows`]).
#[derive(Debug, thiserror::Error)]
pub enum OverlapError {
    /// [`Overlap::gemm_sm_margin`] leaves a GEMM no SM.
    #[error("a GEMM SM margin of {margin} leaves no SM of the GPU's {sm_count} to GEMMs")]
    NoGemmSms {
        /// The margin asked for.
        margin: u32,
        /// The GPU's SM count.
        sm_count: i32,
    },
    /// [`Overlap::nccl_max_ctas`] is 0.
    #[error("an NCCL CTA limit must be at least 1")]
    NoCta,
    /// [`Overlap::nccl_max_ctas`] does not fit NCCL's `int`.
    #[error("an NCCL CTA limit of {ctas} is too large")]
    TooManyCtas {
        /// The limit asked for.
        ctas: u32,
    },
    /// [`Overlap::nccl_window_mib`] is over [`MAX_NCCL_WINDOW_MIB`].
    #[error("an NCCL window of {mib} MiB is more than the {limit} MiB allowed")]
    WindowTooLarge {
        /// The window asked for, MiB.
        mib: u32,
        /// The largest, MiB ([`MAX_NCCL_WINDOW_MIB`]).
        limit: u32,
    },
    /// [`Overlap::ce_slot_mib`] is over [`MAX_CE_SLOT_MIB`].
    #[error("copy-engine slots of {mib} MiB are more than the {limit} MiB allowed")]
    SlotTooLarge {
        /// The slot size asked for, MiB.
        mib: u32,
        /// The largest, MiB ([`MAX_CE_SLOT_MIB`]).
        limit: u32,
    },
    /// [`Overlap::comm_priority_high`] with the copy-engine transport, whose flag waits run
    /// on streams of the posting stream's lane: more streams would share the device's
    /// hardware queues with them (a run so configured stalled on 4 × H200).
    #[error(
        "collectives at high priority (--comm-priority high) need the NCCL transport: \
         the copy-engine transport's transfers wait on flags from streams of their own, \
         which more streams would share hardware queues with"
    )]
    CommPriorityOnCopyEngines,
    /// `WEAVE_CE_WINDOWS` does not parse.
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Windows(#[from] weave_comm::WindowsError),
}

/// The largest [`Overlap::ce_slot_mib`]: 1 GiB a slot.
pub const MAX_CE_SLOT_MIB: u32 = 1024;

/// The largest [`Overlap::nccl_window_mib`]: 64 GiB a direction.
pub const MAX_NCCL_WINDOW_MIB: u32 = 65536;

/// NCCL's CTA policies ([`Overlap::nccl_cta_policy`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NcclCtaPolicy {
    /// As many CTAs as the best bandwidth needs (NCCL's default).
    Default,
    /// As few CTAs as give decent bandwidth, for overlap with compute (NCCL ≥ 2.27).
    Efficiency,
    /// No CTA wherever NCCL can (copy engines over symmetric windows) (NCCL ≥ 2.28).
    Zero,
}

impl NcclCtaPolicy {
    /// Every policy, as flags spell them.
    pub const ALL: [NcclCtaPolicy; 3] = [
        NcclCtaPolicy::Default,
        NcclCtaPolicy::Efficiency,
        NcclCtaPolicy::Zero,
    ];

    /// The name flags and the tuning cache use.
    pub fn name(self) -> &'static str {
        match self {
            NcclCtaPolicy::Default => "default",
            NcclCtaPolicy::Efficiency => "efficiency",
            NcclCtaPolicy::Zero => "zero",
        }
    }

    #[cfg(feature = "cuda")]
    fn to_comm(self) -> weave_comm::CtaPolicy {
        match self {
            NcclCtaPolicy::Default => weave_comm::CtaPolicy::Default,
            NcclCtaPolicy::Efficiency => weave_comm::CtaPolicy::Efficiency,
            NcclCtaPolicy::Zero => weave_comm::CtaPolicy::Zero,
        }
    }
}

impl fmt::Display for NcclCtaPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for NcclCtaPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<NcclCtaPolicy, String> {
        NcclCtaPolicy::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                format!("unknown NCCL CTA policy `{s}`: expected default, efficiency or zero")
            })
    }
}

impl RunOptions {
    /// The default options on `target`.
    pub fn on(target: Target) -> RunOptions {
        RunOptions {
            target,
            ..RunOptions::default()
        }
    }
}

/// How ranks on GPUs move the data of allgathers and point-to-point transfers.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Transport {
    /// NCCL kernels for everything.
    #[default]
    Nccl,
    /// The GPUs' copy engines (no SMs): pushes into shared receive windows
    /// (`weave_comm::IpcCopy`, direct pointers between the threads of one process, CUDA IPC
    /// between processes) for allgathers and transfers, and for sum reduce-scatters and
    /// allreduces (each block pushed to its owner, then one generated reduction kernel per
    /// post, `weave_executor::BlockSums`); other collectives still use NCCL. Replayable.
    CopyEngine,
}

impl Default for RunOptions {
    fn default() -> RunOptions {
        RunOptions {
            target: Target::Cpu { ranks: 2 },
            streams: 2,
            check: false,
            check_races: true,
            trace: false,
            timeouts: Timeouts::default(),
            warmup: 0,
            iters: 0,
            cpu: CpuRunOptions::default(),
            gpu: GpuRunOptions::default(),
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
    /// The outputs were asked of a launched rank other than 0, which does not gather them.
    NotGathered,
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::Setup(m) => f.write_str(m),
            RunError::Reference(m) => write!(f, "reference evaluation failed: {m}"),
            RunError::NotGathered => {
                f.write_str("only rank 0 of a launched world gathers the outputs")
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cta_policies_parse_print_and_refuse_unknown_names() {
        for p in NcclCtaPolicy::ALL {
            assert_eq!(p.to_string().parse::<NcclCtaPolicy>(), Ok(p));
        }
        assert_eq!(
            "fast".parse::<NcclCtaPolicy>().unwrap_err(),
            "unknown NCCL CTA policy `fast`: expected default, efficiency or zero"
        );
        let o = Overlap {
            nccl_cta_policy: Some(NcclCtaPolicy::Efficiency),
            ..Overlap::default()
        };
        assert!(o.needs_own_communicators());
        assert!(!Overlap::default().needs_own_communicators());
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn the_nccl_knobs_become_nccl_options() {
        let o = Overlap {
            nccl_cta_policy: Some(NcclCtaPolicy::Zero),
            nccl_window_mib: 256,
            ..Overlap::default()
        };
        let options = o.nccl_options(NcclOptions::default()).unwrap();
        assert_eq!(options.cta_policy, Some(weave_comm::CtaPolicy::Zero));
        assert_eq!(options.symmetric_window, Some(256 << 20));
        assert_eq!(options.max_ctas, None);
        let huge = Overlap {
            nccl_window_mib: MAX_NCCL_WINDOW_MIB + 1,
            ..Overlap::default()
        };
        let e = huge.nccl_options(NcclOptions::default()).unwrap_err();
        assert!(
            matches!(
                e,
                OverlapError::WindowTooLarge {
                    mib: 65537,
                    limit: 65536
                }
            ),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "an NCCL window of 65537 MiB is more than the 65536 MiB allowed"
        );
        let none = Overlap::default()
            .nccl_options(NcclOptions::default())
            .unwrap();
        assert_eq!(none, NcclOptions::default());
    }
}
