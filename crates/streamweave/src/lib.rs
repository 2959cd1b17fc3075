//! streamweave: compile one global multi-GPU tensor program once, run it on your own tensors.
//!
//! [`load`] reads a `.weave` fusion (or build one with [`ir`]); a [`Compiler`] lowers it to an
//! [`Executable`], a host program that carries its signature (every input's and output's
//! global shape and sharding, the parameter values, the global definition); and
//! [`Executable::run`] takes named global [`Tensor`]s, runs every rank on a [`Target`] (CPU
//! ranks as threads, one GPU per thread, or this process as one rank of a launched world) and
//! returns named global [`Outputs`], checked against the f64 reference when
//! [`RunOptions::check`] asks. Around it: the CPU ranks in [`run`], the GPU ranks in [`gpu`],
//! the chunk-count model in [`chunks`] and its measurement in [`calibrate`], and the tuner in
//! [`tune`], which measures candidate configurations and caches the winner. A [`CudaSession`]
//! runs an executable again and again on GPU buffers the caller owns (PyTorch tensors), on
//! the caller's stream, without copies.
//!
//!
//! # Example: compile once, run twice
//!
//! A row-parallel linear layer `y = x · wᵀ`: the contraction axis of `x` and `w` split across
//! two ranks, the rows of `x` cut into two stream chunks, the partial products summed by an
//! allreduce per chunk. It is compiled once, then run on two sets of your own tensors on the
//! CPU backend (one thread per rank):
//!
//! ```
//! use streamweave::{Compiler, RunOptions, Target, Tensor};
//!
//! const SOURCE: &str = "
//! fusion row_parallel(t = 4, k = 4, n = 2, d: mesh = 2, s: chunks = 2) {
//!   mesh m = devices(d)
//!   tensor x: f32[t, k] on m
//!   tensor w: f32[n, k] on m
//!   y = linear(x, w)
//!   output y
//!   schedule x { outer_split(0, s) -> Stream; outer_split(2, d) -> DIDx }
//!   schedule w { outer_split(1, d) -> DIDx }
//! }";
//!
//! fn main() -> Result<(), streamweave::Error> {
//!     // Compile once: for two ranks, the chunk count as written (s = 2).
//!     let exe = Compiler::new().devices(2).compile_source("row_parallel.weave", SOURCE)?;
//!     let cpu = RunOptions::on(Target::Cpu { ranks: 2 });
//!     // w's rows: the row sum, and the alternating sum.
//!     let w = Tensor::new(vec![2, 4], vec![1.0f32, 1., 1., 1., 1., -1., 1., -1.])?;
//!
//!     // Run 1.
//!     let x = Tensor::new(vec![4, 4], (1..=16).map(|v| v as f32).collect::<Vec<_>>())?;
//!     let y = exe.run(&[("x", &x), ("w", &w)], &cpu)?.into_outputs()?;
//!     let y = y.get("y").expect("the fusion's output");
//!     assert_eq!(y.shape(), &[4, 2]);
//!     assert_eq!(y.as_f32(), Some(&[10.0, -2., 26., -2., 42., -2., 58., -2.][..]));
//!
//!     // Run 2: the same executable on other tensors, checked against the f64 reference.
//!     let x = Tensor::new(vec![4, 4], vec![0.5f32; 16])?;
//!     let checked = RunOptions { check: true, ..cpu };
//!     let report = exe.run(&[("x", &x), ("w", &w)], &checked)?;
//!     assert!(report.passed());
//!     let y = report.into_outputs()?;
//!     assert_eq!(y.get("y").and_then(|y| y.as_f32()), Some(&[2.0, 0.].repeat(4)[..]));
//!     Ok(())
//! }
//! ```
//!
//! [`Executable::program`] is the host program every rank runs (printed by
//! [`host_ir::print`](weave_host_ir::print())), [`Executable::signature`] its inputs' and
//! outputs' global shapes and shardings. Every error converts into [`Error`], whose `Debug`
//! form is its message, so `main` can return it.
//!
//! # Features
//!
//! * `cuda` (on by default): the GPU targets ([`Target::Cuda`], [`Target::Launched`]),
//!   `CudaSession`, and the `gpu`, `session`, `calibrate` and `measure` modules, through
//!   `weave-cuda` and cudarc (whose libraries load at run time, so building needs no CUDA
//!   toolkit). Without it (`default-features = false`) nothing of cudarc is compiled, the CPU
//!   target works as before, and a GPU target is refused with an error that says so.
//! * `cuda-12000` … `cuda-13040`, `nccl-02024` … `nccl-02030`: the CUDA toolkit and NCCL
//!   versions the bindings follow (`cuda-13000` and `nccl-02028` by default); each turns on
//!   `cuda`.
//!
//! The command line (`weave`) is the `weave-cli` package; this library depends on no CLI,
//! progress-bar, error-reporting or log-subscriber crate, and its own code reads no
//! environment variable: paths and a launched process's place are the caller's to give.

use std::fmt;
use std::path::{Path, PathBuf};

#[cfg(feature = "cuda")]
pub mod calibrate;
pub mod chunks;
mod executable;
#[cfg(feature = "cuda")]
pub mod gpu;
pub mod kernels;
#[cfg(feature = "cuda")]
pub mod measure;
pub mod output;
pub mod run;
#[cfg(feature = "cuda")]
pub mod session;
mod setup;
mod tensor;
mod threads;
pub mod tune;
#[cfg(feature = "cuda")]
mod world;

pub use executable::{Chunks, ChunksParseError, Compiler, Error, Executable, MAX_RING_PIECES};
pub use half;
pub use run::OverlapError;
pub use run::{
    CpuRunOptions, GpuRunOptions, NcclCtaPolicy, Overlap, RunOptions, RunReport, Target, Timeouts,
    Transport, MAX_CE_SLOT_MIB, MAX_NCCL_WINDOW_MIB, MAX_THREAD_RANKS,
};
#[cfg(feature = "cuda")]
pub use session::{Buffer, CudaSession, RankCall};
pub use tensor::{Data, Outputs, Tensor};
pub use threads::stuck_ranks;

pub use weave_comm as comm;
#[cfg(feature = "cuda")]
pub use weave_cuda as cuda;
pub use weave_executor as executor;
pub use weave_host_ir as host_ir;
pub use weave_ir as ir;
pub use weave_passes as passes;
pub use weave_segmenter as segmenter;
pub use weave_transform as transform;

use weave_ir::{Diagnostic, Fusion};

/// A failure to load a fusion, with the source kept so it renders with file:line:col and
/// the offending line.
#[derive(Debug, Clone)]
pub struct LoadError {
    /// The file name as given.
    pub file: String,
    /// The source text (empty when the file could not be read).
    pub source: String,
    /// What went wrong and where.
    pub diagnostic: Diagnostic,
}

/// The rendered diagnostic (message, `file:line:col`, the source line and a caret) without
/// the `error: ` label, which the program that reports it adds once.
impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rendered = self.diagnostic.render(&self.file, &self.source);
        let rendered = rendered.strip_prefix("error: ").unwrap_or(&rendered);
        f.write_str(rendered.trim_end())
    }
}

impl std::error::Error for LoadError {}

/// Parses `source` (named `file` in errors), applies `overrides` (`--set k=v`), applies
/// every schedule block, verifies the result, and refuses shardings the pipeline cannot lower
/// ([`weave_passes::load_checks`]): a stream split of a reduced axis, a copy between two tensors
/// the user placed on meshes that no communication expresses.
pub fn load(file: &str, source: &str, overrides: &[(String, i64)]) -> Result<Fusion, LoadError> {
    let err = |diagnostic| LoadError {
        file: file.to_string(),
        source: source.to_string(),
        diagnostic,
    };
    let mut fusion = weave_ir::text::parse(source, overrides).map_err(err)?;
    weave_transform::schedule::apply_schedules(&mut fusion).map_err(err)?;
    weave_ir::verify::verify(&fusion).map_err(err)?;
    weave_ir::verify::check_indexed_axes(&fusion).map_err(err)?;
    weave_passes::load_checks::check_user_shardings(&fusion).map_err(err)?;
    check_propagated_indexed_axes(&fusion).map_err(err)?;
    Ok(fusion)
}

/// [`load`] for a run on `devices` devices: the fusion's mesh-size parameter (`d: mesh`, or
/// the one parameter that sizes its 1-D mesh), where `overrides` leaves it, is loaded as
/// `devices`, the value such a run binds, so that the load's checks (a split that must divide
/// an extent) judge the sizes that run, not the source's default mesh size.
pub fn load_on(
    file: &str,
    source: &str,
    overrides: &[(String, i64)],
    devices: usize,
) -> Result<Fusion, LoadError> {
    let mut set = overrides.to_vec();
    let mesh = weave_ir::text::parse(source, overrides)
        .ok()
        .and_then(|f| {
            f.role_param(weave_ir::ParamRole::MeshSize)
                .map(|p| p.name.clone())
        })
        .filter(|name| !overrides.iter().any(|(k, _)| k == name));
    if let Some(name) = mesh {
        set.push((name, i64::try_from(devices).unwrap_or(i64::MAX)));
    }
    load(file, source, &set)
}

/// Where the fusion has an op that indexes an axis globally (`iota`, `slice`, `concat`, and
/// the rows of an `index_select`, which a device split alone may cut):
/// propagates the shardings on a copy and refuses, at the op, a split that the neighbours'
/// schedules carry onto that axis — which the op's kernel would otherwise refuse when it
/// runs. (Propagation errors themselves are left to the pipeline, which reports them.)
fn check_propagated_indexed_axes(fusion: &Fusion) -> Result<(), Diagnostic> {
    let indexes = fusion.exprs().iter().any(|e| {
        matches!(
            fusion.expr(*e).kind,
            weave_ir::ExprKind::Iota { .. }
                | weave_ir::ExprKind::Slice { .. }
                | weave_ir::ExprKind::Concat { .. }
                | weave_ir::ExprKind::IndexSelect { .. }
        )
    });
    if !indexes {
        return Ok(());
    }
    let mut propagated = fusion.clone();
    if weave_passes::propagate_shardings::propagate_shardings(&mut propagated).is_err() {
        return Ok(());
    }
    weave_ir::verify::check_indexed_axes_propagated(&propagated).map_err(|mut d| {
        // Name the schedules that split something: propagation carries their splits.
        let splits = scheduled_splits(fusion);
        if !splits.is_empty() {
            d.message = d.message.replacen(
                "from the schedules around it",
                &format!("from the schedules around it ({})", splits.join(", ")),
                1,
            );
        }
        d
    })
}

/// The device and stream splits the user's schedules make, by tensor in declaration order:
/// `` `y`'s Stream split``, `` `w`'s DIDx split``.
fn scheduled_splits(fusion: &Fusion) -> Vec<String> {
    let mut out = Vec::new();
    for t in fusion.tensors_in_order() {
        let tv = fusion.tensor(t);
        let mut kinds: Vec<String> = Vec::new();
        for id in &tv.loop_domain {
            let pt = fusion.id(*id).parallel;
            if pt != weave_ir::ParallelType::Serial && !kinds.contains(&pt.to_string()) {
                kinds.push(pt.to_string());
            }
        }
        if !kinds.is_empty() {
            out.push(format!("`{}`'s {} split", tv.name, kinds.join(" and ")));
        }
    }
    out
}

/// Reads and loads a `.weave` file.
pub fn load_file(path: &Path, overrides: &[(String, i64)]) -> Result<Fusion, LoadError> {
    let file = path.display().to_string();
    let bytes = read_source(path).map_err(|e| LoadError {
        file: file.clone(),
        source: String::new(),
        diagnostic: Diagnostic::new(e.to_string()),
    })?;
    let source = utf8_source(bytes).map_err(|diagnostic| LoadError {
        file: file.clone(),
        source: String::new(),
        diagnostic,
    })?;
    load(&file, &source, overrides)
}

/// The largest source file [`read_source`] reads: 256 MiB, far above any program (the
/// fixtures are a few KiB) and far below what would exhaust memory.
pub const MAX_SOURCE_BYTES: u64 = 256 << 20;

/// The bytes of the source file at `path`, read with a cap of [`MAX_SOURCE_BYTES`]: a regular
/// file over the cap is refused before it is read (naming its size), anything else (a FIFO,
/// `/dev/stdin`, `/dev/zero`) is read up to the cap and refused once it goes beyond, and a
/// directory is refused. The error names `path`.
pub fn read_source(path: &Path) -> Result<Vec<u8>, ReadSourceError> {
    use std::io::Read;
    let named = |source: std::io::Error| ReadSourceError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(named)?;
    let meta = file.metadata().map_err(named)?;
    if meta.is_dir() {
        return Err(ReadSourceError::Directory {
            path: path.to_path_buf(),
        });
    }
    let cap = MAX_SOURCE_BYTES;
    if meta.is_file() && meta.len() > cap {
        return Err(ReadSourceError::TooLarge {
            path: path.to_path_buf(),
            size: meta.len(),
            limit: cap,
        });
    }
    let hint = if meta.is_file() { meta.len() } else { 0 };
    let mut bytes = Vec::with_capacity(usize::try_from(hint).unwrap_or(0));
    file.take(cap + 1).read_to_end(&mut bytes).map_err(named)?;
    if bytes.len() as u64 > cap {
        return Err(ReadSourceError::Unbounded {
            path: path.to_path_buf(),
            limit: cap,
        });
    }
    Ok(bytes)
}

/// Why [`read_source`] read no source: every message names the file.
#[derive(Debug, thiserror::Error)]
pub enum ReadSourceError {
    /// The file does not open or read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// The path is a directory.
    #[error("cannot read {}: it is a directory, not a file", path.display())]
    Directory {
        /// The directory.
        path: PathBuf,
    },
    /// A regular file larger than the cap, refused before it is read.
    #[error(
        "cannot read {}: the file is {size} bytes; the limit is {limit} bytes ({} MiB)",
        path.display(),
        limit >> 20
    )]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size in bytes.
        size: u64,
        /// The cap in bytes ([`MAX_SOURCE_BYTES`]).
        limit: u64,
    },
    /// A stream (a FIFO, a device) that went on beyond the cap.
    #[error(
        "cannot read {}: it holds more than {limit} bytes; the limit is {limit} bytes ({} MiB)",
        path.display(),
        limit >> 20
    )]
    Unbounded {
        /// The file.
        path: PathBuf,
        /// The cap in bytes ([`MAX_SOURCE_BYTES`]).
        limit: u64,
    },
}

/// The text of a source file, or a diagnostic at the line and column (in characters, as
/// every position is) of its first byte that is not UTF-8.
pub fn utf8_source(bytes: Vec<u8>) -> Result<String, Diagnostic> {
    String::from_utf8(bytes).map_err(|e| {
        let offset = e.utf8_error().valid_up_to();
        let bytes = e.as_bytes();
        let valid = std::str::from_utf8(&bytes[..offset]).unwrap_or_default();
        let line = valid.matches('\n').count() + 1;
        let col = valid.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        Diagnostic::at(
            weave_ir::Span::new(
                u32::try_from(line).unwrap_or(u32::MAX),
                u32::try_from(col).unwrap_or(u32::MAX),
            ),
            format!(
                "the file is not UTF-8 text: byte 0x{:02x} at byte offset {offset}",
                bytes.get(offset).copied().unwrap_or_default()
            ),
        )
    })
}

/// Parses `k=v` (as given to `--set`) into a parameter override.
pub fn parse_override(s: &str) -> Result<(String, i64), OverrideError> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| OverrideError::NotAssignment {
            given: s.to_string(),
        })?;
    let k = k.trim();
    if k.is_empty() || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(OverrideError::BadName {
            name: k.to_string(),
        });
    }
    let v: i64 = v.trim().parse().map_err(|_| OverrideError::NotInteger {
        name: k.to_string(),
        value: v.trim().to_string(),
    })?;
    Ok((k.to_string(), v))
}

/// Why a `--set` override ([`parse_override`]) is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OverrideError {
    /// No `=` in it.
    #[error("--set expects NAME=VALUE, got `{given}`")]
    NotAssignment {
        /// The text given.
        given: String,
    },
    /// The name is empty or has characters other than ASCII letters, digits and `_`.
    #[error("--set: `{name}` is not a parameter name")]
    BadName {
        /// The name given (trimmed).
        name: String,
    },
    /// The value is not an `i64`.
    #[error("--set {name}: `{value}` is not an integer")]
    NotInteger {
        /// The parameter's name.
        name: String,
        /// The value given (trimmed).
        value: String,
    },
}
