//! The flags of the commands beyond the library's options: those of `weave run`
//! ([`RunFlags`], with the overlap knobs it pins, [`Pinned`]) and of `weave tune`
//! ([`TuneFlags`]).

use std::path::PathBuf;
use std::time::Duration;

use streamweave::RunOptions;

#[cfg(doc)]
use super::tune_cache_path;

/// `--chunks` other than `auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunksFlag {
    /// `--chunks S`: this chunk count.
    Count(usize),
    /// `--chunks ring:K` (`ring` is `ring:1`): the fusion's ring form, its reduce rings' steps
    /// in `K` pieces ([`streamweave::Chunks::Ring`]).
    Ring(usize),
}

impl ChunksFlag {
    /// How the compiler picks the chunk count for this flag.
    pub fn compiler_chunks(self) -> streamweave::Chunks {
        match self {
            ChunksFlag::Count(n) => streamweave::Chunks::Fixed(n),
            ChunksFlag::Ring(k) => streamweave::Chunks::Ring(k),
        }
    }
}

impl std::fmt::Display for ChunksFlag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChunksFlag::Count(n) => write!(f, "{n}"),
            ChunksFlag::Ring(k) => write!(f, "ring:{k}"),
        }
    }
}

/// The flags of `weave run` beyond [`RunOptions`]: the rank count and backend (which make
/// the target), the seed of the generated inputs, whether to check against the reference,
/// where the one-line JSON summary goes, the chunk count, and the dumps `WEAVE_DUMP` asks for.
#[derive(Clone, Debug, Default)]
pub struct RunFlags {
    /// `--ranks`: `None` for the default (2 for a fusion, its devices for a host program).
    pub ranks: Option<usize>,
    /// `--backend cuda`.
    pub cuda: bool,
    /// The seed of the generated inputs.
    pub seed: u64,
    /// `--no-check`: run without the reference.
    pub no_check: bool,
    /// The JSON summary's file, if any.
    pub path: Option<PathBuf>,
    /// `--chunks`: a fixed S or the ring form, or `None` for the tuned configuration or the
    /// cost model's choice.
    pub chunks: Option<ChunksFlag>,
    /// Whether `--streams` was given (the tuned pool size is used only when it was not).
    pub streams_given: bool,
    /// The value of `WEAVE_DUMP` (`weave_passes::DumpOptions::parse` syntax), which the binary
    /// reads: the IR to dump to stderr while compiling. `None` when unset.
    pub weave_dump: Option<String>,
    /// The overlap knobs and transport the command line set (they win over the tuned ones).
    pub pinned: Pinned,
    /// How long the first repeated run of an untuned program may tune (`None`: `--no-tune`).
    pub tune_budget: Option<Duration>,
    /// `--tune-copy-engines`: whether that tuning also tries the copy-engine transport (on
    /// unless told `off`).
    pub tune_copy_engines: bool,
}

/// The overlap knobs and the transport set on the command line; `None`: left to the tuned
/// configuration, else the default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pinned {
    /// `--transport`.
    pub transport: Option<streamweave::Transport>,
    /// `--ordered-compute on|off`.
    pub ordered_compute: Option<bool>,
    /// `--pool-priority high|normal`.
    pub pool_priority_high: Option<bool>,
    /// `--comm-priority high|normal`.
    pub comm_priority_high: Option<bool>,
    /// `--gemm-sm-margin N`.
    pub gemm_sm_margin: Option<u32>,
    /// `--nccl-max-ctas N` (`Some(None)`: `--nccl-max-ctas auto`, NCCL's choice).
    pub nccl_max_ctas: Option<Option<u32>>,
    /// `--nccl-cta-policy P` (`Some(None)`: `--nccl-cta-policy auto`, NCCL's choice).
    pub nccl_cta_policy: Option<Option<streamweave::NcclCtaPolicy>>,
    /// `--nccl-window-mib N`.
    pub nccl_window_mib: Option<u32>,
    /// `--ce-slot-mib N`.
    pub ce_slot_mib: Option<u32>,
    /// `--gemm-into-windows on|off`.
    pub gemm_into_windows: Option<bool>,
}

impl Pinned {
    /// Whether any knob was set.
    pub fn any(&self) -> bool {
        *self != Pinned::default()
    }

    /// Sets the knobs given on `options`.
    pub fn apply(&self, options: &mut RunOptions) {
        pin(&mut options.gpu.transport, self.transport);
        let o = &mut options.gpu.overlap;
        pin(&mut o.ordered_compute, self.ordered_compute);
        pin(&mut o.pool_priority_high, self.pool_priority_high);
        pin(&mut o.comm_priority_high, self.comm_priority_high);
        pin(&mut o.gemm_sm_margin, self.gemm_sm_margin);
        pin(&mut o.nccl_max_ctas, self.nccl_max_ctas);
        pin(&mut o.nccl_cta_policy, self.nccl_cta_policy);
        pin(&mut o.nccl_window_mib, self.nccl_window_mib);
        pin(&mut o.ce_slot_mib, self.ce_slot_mib);
        pin(&mut o.gemm_into_windows, self.gemm_into_windows);
    }
}

/// Sets `slot` to `pinned`, if given.
fn pin<T>(slot: &mut T, pinned: Option<T>) {
    if let Some(v) = pinned {
        *slot = v;
    }
}

/// The flags of `weave tune`.
#[derive(Clone, Debug)]
pub struct TuneFlags {
    /// `--ranks`.
    pub ranks: usize,
    /// `--backend cuda`.
    pub cuda: bool,
    /// Timed runs per candidate.
    pub iters: usize,
    /// Untimed runs per candidate first.
    pub warmup: usize,
    /// `--cache`: the cache file, else [`tune_cache_path`].
    pub cache: Option<PathBuf>,
    /// How long waits and each candidate's runs may take.
    pub timeout: Duration,
    /// `--copy-engines on|off`: also try the copy-engine transport (default on).
    pub copy_engines: bool,
}
