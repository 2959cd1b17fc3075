//! The Python extension module `streamweave._native`: loading fusions, compiling them into
//! executables, dumping the pass pipeline, running executables on the CPU backend with
//! simulated ranks on arrays handed over in place (the address of a C-contiguous array of
//! their own element type, read once into the tensor: no `f64` round trip, no bytes object
//! in between; a dtype the signature does not take raises `TypeError`), outputs handed back
//! as `bytearray`s of their own element type (bf16 as its bits) that NumPy views without a
//! copy, and on GPUs in a [`CudaSession`] on device buffers handed over by address (PyTorch
//! CUDA tensors, or any DLPack tensor made one, no copy, on PyTorch's current stream). The
//! Python package `streamweave`, in python/, wraps it with NumPy and PyTorch.
//!
//! Every error is raised as one of the classes of `streamweave._errors` (each a
//! `StreamweaveError` and the built-in kind it is: `TypeError`, `ValueError`, `KeyError`,
//! `FileNotFoundError`, `RuntimeError`) carrying the message the command line prints
//! (file:line:col, tensor, rank). The run defaults (`run_defaults`), the op table
//! (`op_table`) and the version come from the Rust crates, so that Python follows them.

use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyDict};
use streamweave::cuda::{ForeignStream, Gpu};
use streamweave::executor::dense::Dense;
use streamweave::executor::timeline::trace_and_picture;
use streamweave::half::{bf16, f16};
use streamweave::ir::{BinaryOp, DType, Fusion, ReduceOp, UnaryOp};
use streamweave::passes::{manager::render, DumpFlags, Ir, PassManager};
use streamweave::{
    Buffer, Compiler, CudaSession, Data, Executable, RankCall, RunOptions, Target, Tensor, Timeouts,
};

/// The Python class (of `streamweave._errors`) an error is raised as.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// `DTypeError` (a `TypeError`): a dtype the program does not take.
    DType,
    /// `ArgumentValueError` (a `ValueError`): an option or a value out of range.
    ArgumentValue,
    /// `ShapeError` (a `ValueError`): a tensor of another shape or size.
    Shape,
    /// `InputNameError` (a `KeyError`): an input or output the program does not have.
    Name,
    /// `FusionError` (a `ValueError`): a fusion that does not load or compile.
    Fusion,
    /// `FusionFileNotFoundError` (a `FileNotFoundError`): no such `.weave` file.
    NotFound,
    /// `RunError` (a `RuntimeError`): a run that fails.
    Run,
}

impl Kind {
    fn class_name(self) -> &'static str {
        match self {
            Kind::DType => "DTypeError",
            Kind::ArgumentValue => "ArgumentValueError",
            Kind::Shape => "ShapeError",
            Kind::Name => "InputNameError",
            Kind::Fusion => "FusionError",
            Kind::NotFound => "FusionFileNotFoundError",
            Kind::Run => "RunError",
        }
    }
}

/// A `streamweave._errors` exception of `kind` carrying `message` (the class takes the
/// message as its one argument).
fn raise(kind: Kind, message: impl std::fmt::Display) -> PyErr {
    let message = message.to_string();
    Python::attach(|py| {
        let class = py
            .import("streamweave._errors")
            .and_then(|m| m.getattr(kind.class_name()));
        match class.and_then(|c| c.call1((message.clone(),))) {
            Ok(instance) => PyErr::from_value(instance),
            Err(_) => PyRuntimeError::new_err(message),
        }
    })
}

/// The class of a facade error: a fusion that does not load or compile is a `FusionError`, a
/// tensor that does not fit a `ShapeError`, a run the options do not fit (too few ranks) an
/// `ArgumentValueError`, any other failed run a `RunError`.
fn error(e: streamweave::Error) -> PyErr {
    use streamweave::run::RunError;
    use streamweave::Error as E;
    #[allow(unreachable_patterns)]
    let kind = match &e {
        E::Load(_) | E::Compile(_) | E::Program(_) => Kind::Fusion,
        E::Input { .. } => Kind::Shape,
        E::Run(RunError::Setup(_)) => Kind::ArgumentValue,
        E::Run(_) => Kind::Run,
        _ => Kind::Run,
    };
    raise(kind, e)
}

/// The op names of the `.weave` format with how each takes its arguments (`unary`: one
/// tensor; `binary`: two operands, each a tensor or a number; `where`: a tensor and two
/// operands; `cast`: a tensor and a dtype; `reduce`: a tensor and
/// axes; `broadcast`, `squeeze`: a tensor and axes; `permute`: a tensor and a permutation;
/// `reshape`: a tensor and a shape; `matmul`: two tensors; `linear`: two or three), derived
/// from the IR's op tables, so an op added there appears in Python's builder. An op that
/// takes its arguments in a new way needs one line here.
#[pyfunction]
fn op_table() -> Vec<(&'static str, &'static str)> {
    let mut v = vec![("set", "unary"), ("segment_set", "unary"), ("cast", "cast")];
    v.extend(UnaryOp::ALL.iter().map(|u| (u.name(), "unary")));
    v.extend(BinaryOp::ALL.iter().map(|b| (b.name(), "binary")));
    v.push(("where", "where"));
    v.extend(ReduceOp::ALL.iter().map(|r| (r.name(), "reduce")));
    // The parser's one op that is no IR op: a sum divided by the count of what it adds.
    v.push(("mean", "reduce"));
    // The same: the mean, then the mean of the squared deviations from it.
    v.push(("var", "reduce"));
    v.extend([
        ("broadcast", "broadcast"),
        ("squeeze", "squeeze"),
        ("permute", "permute"),
        ("reshape", "reshape"),
        ("matmul", "matmul"),
        ("linear", "linear"),
        ("iota", "iota"),
        ("slice", "slice"),
        ("concat", "concat"),
        ("index_select", "index_select"),
    ]);
    v
}

/// The dtype names of the `.weave` format (`bf16`, `f16`, `f32`, `f64`, `i64`, `bool`).
#[pyfunction]
fn dtype_names() -> Vec<&'static str> {
    DType::ALL.iter().map(|d| d.name()).collect()
}

/// The defaults of a run, as [`RunOptions::default`] has them: the Python API takes the same
/// (`check`, `races`, `trace`, `streams`, `timeout_secs`).
#[pyfunction]
fn run_defaults(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let o = RunOptions::default();
    let d = PyDict::new(py);
    d.set_item("check", o.check)?;
    d.set_item("races", o.check_races)?;
    d.set_item("trace", o.trace)?;
    d.set_item("streams", o.streams)?;
    // `timeout_secs` sets the three timeouts at once; their defaults are the same.
    d.set_item("timeout_secs", o.timeouts.run.as_secs_f64())?;
    // A GPU session's tuning budget on its first repeated call; 0: never.
    d.set_item("tune_secs", o.gpu.tune.map_or(0.0, |b| b.as_secs_f64()))?;
    Ok(d)
}

/// A loaded fusion (the user's global program).
#[pyclass(module = "streamweave._native", frozen)]
struct NativeFusion {
    fusion: Fusion,
}

/// `chunks=` of `Fusion.compile`: a count or its text form.
#[derive(FromPyObject)]
enum ChunksArg {
    Count(i64),
    Text(String),
}

#[pymethods]
impl NativeFusion {
    /// The fusion as `.weave` text.
    fn text(&self) -> String {
        streamweave::ir::text::print(&self.fusion)
    }

    /// The fusion's name.
    fn name(&self) -> String {
        self.fusion.name.clone()
    }

    /// Compiles with the standard pipeline; `devices` fixes the mesh size for programs that
    /// leave it to the runner; `chunks` (a positive count, `ring` or `ring:K`,
    /// `streamweave::Chunks::parse`) fixes the chunk count or asks for the ring form.
    #[pyo3(signature = (devices=None, chunks=None))]
    fn compile(
        &self,
        devices: Option<usize>,
        chunks: Option<ChunksArg>,
    ) -> PyResult<NativeExecutable> {
        let mut compiler = Compiler::new();
        if let Some(n) = devices {
            compiler = compiler.devices(n);
        }
        if let Some(c) = chunks {
            let text = match c {
                ChunksArg::Count(n) => n.to_string(),
                ChunksArg::Text(t) => t,
            };
            let chunks = streamweave::Chunks::parse(&text)
                .map_err(|m| raise(Kind::ArgumentValue, format!("chunks: {m}")))?;
            compiler = compiler.chunks(chunks);
        }
        let exe = compiler.compile(&self.fusion).map_err(error)?;
        Ok(NativeExecutable { exe: Arc::new(exe) })
    }

    /// The pass pipeline `passes` (`default`, `a,b,c` or edits `+x,-y`) run on the fusion,
    /// with the IR printed before/after the passes named (or `all`); returns the dumps and
    /// the final IR as text.
    #[pyo3(signature = (passes=None, print_before=Vec::new(), print_after=Vec::new()))]
    fn dump(
        &self,
        passes: Option<String>,
        print_before: Vec<String>,
        print_after: Vec<String>,
    ) -> PyResult<String> {
        let flags = DumpFlags {
            passes,
            print_before,
            print_after,
            print_after_change: false,
            dump_dir: None,
            weave_dump: None,
        };
        let manager = PassManager::from_flags(&flags).map_err(|e| raise(Kind::ArgumentValue, e))?;
        let mut out: Vec<u8> = Vec::new();
        let ir = manager
            .run_with_output(Ir::Fusion(self.fusion.clone()), &mut out)
            .map_err(|e| raise(Kind::Fusion, e))?;
        let mut text = String::from_utf8_lossy(&out).into_owned();
        text.push_str(&render(&ir));
        Ok(text)
    }
}

/// A compiled program: its host program and signature.
#[pyclass(module = "streamweave._native", frozen)]
struct NativeExecutable {
    exe: Arc<Executable>,
}

/// One entry of a signature: name, dtype name and global shape.
type Sig = (String, String, Vec<usize>);

/// Refuses (an argument-value error, `message(given, wanted)`) a count `given` that is not
/// `wanted`.
fn expect_count(
    given: usize,
    wanted: usize,
    message: impl FnOnce(usize, usize) -> String,
) -> PyResult<()> {
    if given == wanted {
        Ok(())
    } else {
        Err(raise(Kind::ArgumentValue, message(given, wanted)))
    }
}

/// The entries of `tensors`, in order.
fn sigs(tensors: &[streamweave::host_ir::TensorSig]) -> Vec<Sig> {
    tensors
        .iter()
        .map(|t| (t.name.clone(), t.dtype.name().to_string(), t.shape.clone()))
        .collect()
}

/// A tensor handed over in place: name, the NumPy name of its element type (`float32`,
/// `int64`, `bfloat16`, `complex128`, ...), shape, the address of its first element and its
/// size in bytes, and the array itself (held for the call, so that the address stays valid).
/// The Python wrapper hands only C-contiguous little-endian arrays.
type Handed<'py> = (String, String, Vec<usize>, usize, usize, Bound<'py, PyAny>);

/// An output handed back: name, the NumPy name of its element type (`bfloat16` for bf16,
/// whose bits the bytes are), shape and its values as little-endian bytes of that type, in a
/// `bytearray` that NumPy views without a copy.
type Output<'py> = (String, String, Vec<usize>, Bound<'py, PyByteArray>);

/// What a run hands back: the outputs, whether every check passed, the largest error
/// against the reference, the races found, and when asked for the Chrome trace JSON and its
/// SVG timeline.
type RunOutcome<'py> = (Vec<Output<'py>>, bool, f64, usize, Option<(String, String)>);

/// The dtype of a NumPy element type name, when the programs have one.
fn dtype_of_numpy(name: &str) -> Option<DType> {
    match name {
        "bfloat16" => Some(DType::BF16),
        "float16" => Some(DType::F16),
        "float32" => Some(DType::F32),
        "float64" => Some(DType::F64),
        "int64" => Some(DType::I64),
        "bool" => Some(DType::Bool),
        _ => None,
    }
}

/// The largest magnitude of an `i64` the CPU backend holds and computes exactly (it computes
/// in `f64`): within ±(2^53 - 1) a result cannot have been rounded (2^53 + 1 rounds to 2^53).
const I64_EXACT: i64 = (1 << 53) - 1;

/// The first element of an `i64` tensor beyond ±(2^53 - 1) (index and value), if any.
fn beyond_exact(data: &Data) -> Option<(usize, i64)> {
    match data {
        Data::I64(v) => v
            .iter()
            .copied()
            .enumerate()
            .find(|(_, x)| x.unsigned_abs() > I64_EXACT.unsigned_abs()),
        _ => None,
    }
}

/// `bytes` as little-endian `N`-byte elements.
fn elems<const N: usize>(bytes: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
    bytes.chunks_exact(N).map(|c| {
        let mut b = [0u8; N];
        b.copy_from_slice(c);
        b
    })
}

/// The values of `bytes` (little-endian elements of `dtype`) in `dtype`, exactly.
fn data_of(dtype: DType, bytes: &[u8]) -> Data {
    match dtype {
        DType::F32 => Data::F32(elems::<4>(bytes).map(f32::from_le_bytes).collect()),
        DType::F64 => Data::F64(elems::<8>(bytes).map(f64::from_le_bytes).collect()),
        DType::BF16 => Data::BF16(
            elems::<2>(bytes)
                .map(|b| bf16::from_bits(u16::from_le_bytes(b)))
                .collect(),
        ),
        DType::F16 => Data::F16(
            elems::<2>(bytes)
                .map(|b| f16::from_bits(u16::from_le_bytes(b)))
                .collect(),
        ),
        DType::I64 => Data::I64(elems::<8>(bytes).map(i64::from_le_bytes).collect()),
        DType::Bool => Data::Bool(bytes.iter().map(|b| *b != 0).collect()),
    }
}

/// The `len` bytes at `address`, which the caller holds for the call.
#[allow(unsafe_code)]
fn borrowed_bytes<'a>(_owner: &'a Bound<'_, PyAny>, address: usize, len: usize) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: the Python wrapper passes `array.ctypes.data` and `array.nbytes` of the
    // C-contiguous NumPy array `owner`, which this call holds (so it is neither freed nor
    // resized), and the GIL is held while the bytes are read (no Python code writes them
    // meanwhile); `u8` has no alignment requirement.
    unsafe { std::slice::from_raw_parts(address as *const u8, len) }
}

/// The input `name` of `spec` dtype from the array handed over (`numpy` names its element
/// type): the exact values when the dtypes agree; a float array for a bf16 input rounded to
/// bf16 (nearest even, the documented conversion for arrays without `ml_dtypes`); a
/// `DTypeError` naming the input and both dtypes otherwise, worded as
/// [`Executable::bind`]'s refusal.
fn input_tensor(
    name: &str,
    spec: DType,
    numpy: &str,
    shape: &[usize],
    bytes: &[u8],
) -> PyResult<Tensor> {
    let mismatch = |given: &str| {
        let why = if numpy.starts_with("complex") {
            " (complex values are not taken)"
        } else {
            ""
        };
        raise(
            Kind::DType,
            format!("input `{name}`: is {given} but the program takes {spec}{why}"),
        )
    };
    let given = dtype_of_numpy(numpy).ok_or_else(|| mismatch(numpy))?;
    let numel = shape.iter().try_fold(1usize, |a, &b| a.checked_mul(b));
    let width = streamweave::executor::dense::elem_bytes(given);
    if numel.and_then(|n| n.checked_mul(width)) != Some(bytes.len()) {
        return Err(raise(
            Kind::Shape,
            format!(
                "input `{name}`: {} bytes do not hold a {numpy} array of shape {shape:?}",
                bytes.len()
            ),
        ));
    }
    let data = data_of(given, bytes);
    let data = if given == spec {
        data
    } else if spec == DType::BF16 && matches!(given, DType::F16 | DType::F32 | DType::F64) {
        let dense = Dense::new(DType::BF16, shape.to_vec(), data.to_f64())
            .map_err(|m| raise(Kind::Shape, format!("input `{name}`: {m}")))?
            .rounded();
        return Ok(Tensor::from_dense(&dense));
    } else {
        return Err(mismatch(given.name()));
    };
    if let Some((i, x)) = beyond_exact(&data) {
        return Err(raise(
            Kind::ArgumentValue,
            format!(
                "input `{name}`: element {i} is {x}, beyond ±(2^53 - 1): the CPU backend \
                 computes in f64, which holds i64 values exactly only below 2^53 in magnitude"
            ),
        ));
    }
    Tensor::new(shape.to_vec(), data)
        .map_err(|e| raise(Kind::Shape, format!("input `{name}`: {e}")))
}

/// The NumPy name of the element type an output of `dtype` is handed back in.
fn numpy_name(dtype: DType) -> &'static str {
    match dtype {
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        DType::F32 => "float32",
        DType::F64 => "float64",
        DType::I64 => "int64",
        DType::Bool => "bool",
    }
}

/// The size in bytes of `data` as little-endian elements of its dtype.
fn byte_len(data: &Data) -> usize {
    match data {
        Data::F32(v) => v.len() * 4,
        Data::F64(v) => v.len() * 8,
        Data::I64(v) => v.len() * 8,
        Data::BF16(v) => v.len() * 2,
        Data::F16(v) => v.len() * 2,
        Data::Bool(v) => v.len(),
    }
}

/// Writes `data` into `out` as little-endian elements of its dtype (bf16 as its bits).
fn write_bytes(data: &Data, out: &mut [u8]) {
    fn put<const N: usize, T: Copy>(v: &[T], out: &mut [u8], f: impl Fn(T) -> [u8; N]) {
        for (chunk, x) in out.chunks_exact_mut(N).zip(v) {
            chunk.copy_from_slice(&f(*x));
        }
    }
    match data {
        Data::F32(v) => put(v, out, f32::to_le_bytes),
        Data::F64(v) => put(v, out, f64::to_le_bytes),
        Data::BF16(v) => put(v, out, |x| x.to_bits().to_le_bytes()),
        Data::F16(v) => put(v, out, |x| x.to_bits().to_le_bytes()),
        Data::I64(v) => put(v, out, i64::to_le_bytes),
        Data::Bool(v) => put(v, out, |b| [u8::from(b)]),
    }
}

#[pymethods]
impl NativeExecutable {
    /// The host program as printed (its signature and definition included).
    fn program_text(&self) -> String {
        self.exe.program().to_string()
    }

    /// The inputs: `(name, dtype, global shape)` in signature order.
    fn inputs(&self) -> Vec<Sig> {
        sigs(self.exe.inputs())
    }

    /// The outputs: `(name, dtype, global shape)` in signature order.
    fn outputs(&self) -> Vec<Sig> {
        sigs(self.exe.outputs())
    }

    /// The smallest rank count the program runs on.
    fn min_ranks(&self) -> usize {
        self.exe.min_ranks()
    }

    /// Rank `rank`'s local sizes of every input, then of every output, in signature order.
    fn local_shapes(&self, rank: usize) -> (Vec<Vec<usize>>, Vec<Vec<usize>>) {
        let of = |sigs: &[streamweave::host_ir::TensorSig]| {
            sigs.iter().map(|t| t.local_sizes_of(rank)).collect()
        };
        (of(self.exe.inputs()), of(self.exe.outputs()))
    }

    /// Opens a GPU session: every rank in this process on `devices` (rank r on GPU
    /// `devices[r]`), or, with `launched`, this process as one rank of the world that
    /// torchrun (or another launcher) describes in the environment. Opening joins NCCL.
    /// An option left out takes [`RunOptions::default`]'s value.
    /// `tune_secs` bounds the tuning of the first repeated call (0: never tunes);
    /// `tune_cache` is the tuning cache file it reads and writes (none: the winner lives in
    /// the session).
    #[pyo3(signature = (devices=None, launched=false, streams=None, races=None, trace=None, timeout_secs=None, tune_secs=None, tune_cache=None))]
    #[allow(clippy::too_many_arguments)]
    fn cuda_session(
        &self,
        py: Python<'_>,
        devices: Option<Vec<usize>>,
        launched: bool,
        streams: Option<usize>,
        races: Option<bool>,
        trace: Option<bool>,
        timeout_secs: Option<f64>,
        tune_secs: Option<f64>,
        tune_cache: Option<std::path::PathBuf>,
    ) -> PyResult<NativeSession> {
        let defaults = RunOptions::default();
        let trace = trace.unwrap_or(defaults.trace);
        let tune = match tune_secs {
            None => defaults.gpu.tune,
            Some(0.0) => None,
            Some(secs) => Some(timeout(secs).map_err(|_| {
                raise(
                    Kind::ArgumentValue,
                    format!(
                        "tune_secs must be 0 (never) or a positive number of seconds, not {secs}"
                    ),
                )
            })?),
        };
        let gpu = streamweave::GpuRunOptions {
            tune,
            tune_cache,
            ..defaults.gpu.clone()
        };
        let options = RunOptions {
            gpu,
            target: Target::Cuda { ranks: 1 },
            streams: streams.unwrap_or(defaults.streams),
            check_races: races.unwrap_or(defaults.check_races),
            trace,
            timeouts: match timeout_secs {
                Some(secs) => Timeouts::all(timeout(secs)?),
                None => defaults.timeouts,
            },
            ..defaults
        };
        let exe = self.exe.clone();
        let session = if launched {
            let env = streamweave::comm::bootstrap::LaunchEnv::from_lookup(|name| {
                std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
            })
            .map_err(|e| raise(Kind::ArgumentValue, e))?
            .ok_or_else(|| {
                raise(
                    Kind::ArgumentValue,
                    "launched=True, but no launcher variable (RANK and WORLD_SIZE of torchrun, \
                     or Open MPI's, PMI's or Slurm's) is set",
                )
            })?;
            py.detach(|| CudaSession::launched(exe, &env, &options))
        } else {
            let devices = devices.unwrap_or_else(|| (0..self.exe.min_ranks()).collect());
            py.detach(|| CudaSession::local(exe, &devices, &options))
        }
        .map_err(error)?;
        Ok(NativeSession::new(session, trace))
    }

    /// Runs on the CPU backend with `ranks` simulated ranks (threads) on the named global
    /// inputs, each of its signature's dtype exactly (a float array for a bf16 input is
    /// rounded to bf16; any other dtype raises `DTypeError`); returns the global outputs in
    /// their dtype (bf16 as its bits, named `bfloat16`), whether every check passed, the
    /// largest error against the reference (0 without `check`), the races found (with
    /// `races`), and the Chrome trace JSON and SVG timeline (with `trace`). An option left
    /// out takes [`RunOptions::default`]'s value. The GIL is released while the ranks run.
    #[pyo3(signature = (inputs, ranks=1, check=None, races=None, trace=None, streams=None, timeout_secs=None))]
    #[allow(clippy::too_many_arguments)]
    fn run<'py>(
        &self,
        py: Python<'py>,
        inputs: Vec<Handed<'py>>,
        ranks: usize,
        check: Option<bool>,
        races: Option<bool>,
        trace: Option<bool>,
        streams: Option<usize>,
        timeout_secs: Option<f64>,
    ) -> PyResult<RunOutcome<'py>> {
        let mut tensors = Vec::with_capacity(inputs.len());
        for (name, numpy, shape, address, len, owner) in &inputs {
            let spec = self
                .exe
                .inputs()
                .iter()
                .find(|s| s.name == *name)
                .ok_or_else(|| {
                    let known: Vec<&str> =
                        self.exe.inputs().iter().map(|s| s.name.as_str()).collect();
                    raise(
                        Kind::Name,
                        format!(
                            "input `{name}`: the program has no such input (it has: {})",
                            known.join(", ")
                        ),
                    )
                })?;
            let bytes = borrowed_bytes(owner, *address, *len);
            let tensor = input_tensor(name, spec.dtype, numpy, shape, bytes)?;
            tensors.push((name.clone(), tensor));
        }
        let defaults = RunOptions::default();
        let options = RunOptions {
            target: Target::Cpu { ranks },
            streams: streams.unwrap_or(defaults.streams),
            check: check.unwrap_or(defaults.check),
            check_races: races.unwrap_or(defaults.check_races),
            trace: trace.unwrap_or(defaults.trace),
            timeouts: match timeout_secs {
                Some(secs) => Timeouts::all(timeout(secs)?),
                None => defaults.timeouts,
            },
            ..defaults
        };
        let exe = &self.exe;
        let report = py
            .detach(|| {
                let named: Vec<(&str, &Tensor)> =
                    tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
                exe.run(&named, &options)
            })
            .map_err(error)?;
        let passed = report.passed();
        let max_error = report.max_abs_error();
        let race_count = report.races();
        let traced = options
            .trace
            .then(|| trace_and_picture(report.rank_spans()));
        let outputs = report
            .into_outputs()
            .map_err(|e| error(streamweave::Error::Run(e)))?;
        let mut out = Vec::with_capacity(outputs.len());
        for (name, t) in outputs.iter() {
            if let Some((i, x)) = beyond_exact(t.data()) {
                return Err(raise(
                    Kind::ArgumentValue,
                    format!(
                        "output `{name}`: element {i} is {x}, beyond ±(2^53 - 1): the CPU \
                         backend computes in f64, which holds i64 values exactly only below \
                         2^53 in magnitude, so it may have been rounded"
                    ),
                ));
            }
            let data = t.data();
            let bytes = PyByteArray::new_with(py, byte_len(data), |buf| {
                write_bytes(data, buf);
                Ok(())
            })?;
            out.push((
                name.to_string(),
                numpy_name(t.dtype()).to_string(),
                t.shape().to_vec(),
                bytes,
            ));
        }
        Ok((out, passed, max_error, race_count, traced))
    }
}

/// A timeout given in seconds: positive and finite (a huge one is capped). `timeout_secs`
/// gives it to each of [`Timeouts`]: the run's deadline, the ranks' meeting and every wait.
fn timeout(secs: f64) -> PyResult<Duration> {
    if !(secs.is_finite() && secs > 0.0) {
        return Err(raise(
            Kind::ArgumentValue,
            format!("timeout_secs must be a positive number of seconds, not {secs}"),
        ));
    }
    Ok(Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX))
}

/// One rank's part of a call: the device addresses of its input shards and of its output
/// buffers, in signature order (each a contiguous tensor of the shard's dtype and sizes,
/// which the Python wrapper checked), and the handle of the caller's stream on that rank's
/// GPU.
type CallArg = (Vec<u64>, Vec<u64>, u64);

/// A tensor's dtype and a rank's local sizes of it.
type Layout = (DType, Vec<usize>);

/// What a GPU call hands back: each local rank's host time issuing (µs), the races found,
/// whether the check passed (`None` unchecked, or on a launched rank other than 0), the
/// largest error, the Chrome trace JSON when the session traces, and the host time of the
/// whole native call from its arguments to its answer (µs).
type CallOutcome = (Vec<f64>, usize, Option<bool>, f64, Option<String>, f64);

/// A GPU session of an executable ([`CudaSession`]).
#[pyclass(module = "streamweave._native", frozen)]
struct NativeSession {
    session: CudaSession,
    trace: bool,
    /// Each local rank's input and output layouts, in signature order.
    layouts: Vec<(Vec<Layout>, Vec<Layout>)>,
}

impl NativeSession {
    fn new(session: CudaSession, trace: bool) -> NativeSession {
        let exe = session.executable().clone();
        let of = |sigs: &[streamweave::host_ir::TensorSig], rank: usize| {
            sigs.iter()
                .map(|t| (t.dtype, t.local_sizes_of(rank)))
                .collect::<Vec<_>>()
        };
        let layouts = session
            .ranks()
            .iter()
            .map(|(rank, _)| (of(exe.inputs(), *rank), of(exe.outputs(), *rank)))
            .collect();
        NativeSession {
            session,
            trace,
            layouts,
        }
    }

    /// The calls as the session takes them: every address borrowed on its rank's GPU.
    fn calls(&self, calls: &[CallArg]) -> PyResult<Vec<RankCall>> {
        let ranks = self.session.ranks();
        expect_count(calls.len(), ranks.len(), |n, m| {
            format!("{n} rank call(s) were given for the {m} rank(s) of this process")
        })?;
        let mut out = Vec::with_capacity(calls.len());
        for (((inputs, outputs, stream), (rank, gpu)), (lin, lout)) in
            calls.iter().zip(ranks).zip(&self.layouts)
        {
            let buffers = |what: &str, ptrs: &[u64], layouts: &[Layout]| -> PyResult<Vec<_>> {
                expect_count(ptrs.len(), layouts.len(), |n, m| {
                    format!("rank {rank}: {n} {what} address(es) for {m} {what}s")
                })?;
                Ok(ptrs
                    .iter()
                    .zip(layouts)
                    .map(|(&p, (dtype, sizes))| borrow(gpu, p, *dtype, sizes))
                    .collect())
            };
            out.push(RankCall {
                inputs: buffers("input", inputs, lin)?,
                outputs: buffers("output", outputs, lout)?,
                stream: foreign_stream(*stream),
            });
        }
        Ok(out)
    }
}

/// The caller's stream of handle `handle`.
#[allow(unsafe_code)]
fn foreign_stream(handle: u64) -> ForeignStream {
    // SAFETY: the Python wrapper passes PyTorch's current stream of the rank's device
    // (`torch.cuda.current_stream(device).cuda_stream`, 0 for the default stream), which
    // PyTorch keeps alive for the process.
    unsafe { ForeignStream::new(handle) }
}

/// The caller's `dtype` tensor of `sizes` at device address `ptr` on `gpu`.
#[allow(unsafe_code)]
fn borrow(gpu: &Gpu, ptr: u64, dtype: DType, sizes: &[usize]) -> Buffer {
    let bytes = sizes.iter().product::<usize>() * streamweave::executor::dense::elem_bytes(dtype);
    // SAFETY: the Python wrapper passes `data_ptr()` of a contiguous CUDA tensor on this
    // rank's device whose dtype and shape it checked against these (so it holds these
    // bytes), and keeps the tensor referenced for the whole call; the run is ordered before
    // the tensor's stream, so PyTorch reuses the memory only after the run.
    let mem = unsafe { gpu.borrow(ptr, bytes) };
    Buffer {
        mem,
        dtype,
        sizes: sizes.to_vec(),
    }
}

#[pymethods]
impl NativeSession {
    /// `(rank, GPU ordinal)` of every rank of this process, in rank order.
    fn ranks(&self) -> Vec<(usize, usize)> {
        self.session
            .ranks()
            .into_iter()
            .map(|(r, g)| (r, g.ordinal()))
            .collect()
    }

    /// The world's size.
    fn world(&self) -> usize {
        self.session.world()
    }

    /// Issues one run on the buffers given (one call per rank of this process) and returns
    /// once every statement is issued; with `check`, waits and compares the outputs with
    /// the f64 reference. The GIL is released meanwhile.
    /// The configuration the calls run once the first repeated call tuned (the winner and
    /// where it came from), or why they run the program as opened; `None` before.
    fn config(&self) -> Option<String> {
        self.session.config()
    }

    #[pyo3(signature = (calls, check=false))]
    fn run(&self, py: Python<'_>, calls: Vec<CallArg>, check: bool) -> PyResult<CallOutcome> {
        let start = std::time::Instant::now();
        let calls = self.calls(&calls)?;
        let session = &self.session;
        let trace = self.trace;
        py.detach(|| -> Result<CallOutcome, streamweave::Error> {
            let runs = session.issue(&calls)?;
            let issue_us = runs
                .iter()
                .map(|r| r.issue_time.as_secs_f64() * 1e6)
                .collect();
            let races = runs.iter().map(|r| r.races.len()).sum();
            let (mut passed, mut max_error) = (None, 0.0f64);
            if check {
                let checks = session.check(&calls)?;
                if !checks.is_empty() {
                    passed = Some(checks.iter().all(|c| c.comparison.ok));
                    max_error = checks
                        .iter()
                        .map(|c| c.comparison.max_abs)
                        .fold(0.0, f64::max);
                }
            }
            let trace_json = if trace {
                let spans = session.spans()?;
                let ranks: Vec<streamweave::executor::timeline::RankSpans> = spans
                    .into_iter()
                    .map(|(rank, spans)| streamweave::executor::timeline::RankSpans { rank, spans })
                    .collect();
                Some(trace_and_picture(ranks).0)
            } else {
                None
            };
            let native_us = start.elapsed().as_secs_f64() * 1e6;
            Ok((issue_us, races, passed, max_error, trace_json, native_us))
        })
        .map_err(error)
    }

    /// Waits until every rank's GPU has done everything issued.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.session.synchronize()).map_err(error)
    }
}

/// Loads a fusion from `.weave` text (`file` names it in messages) with parameter
/// overrides.
#[pyfunction]
#[pyo3(signature = (file, source, overrides=Vec::new()))]
fn load_source(file: &str, source: &str, overrides: Vec<(String, i64)>) -> PyResult<NativeFusion> {
    let fusion = streamweave::load(file, source, &overrides).map_err(|e| raise(Kind::Fusion, e))?;
    Ok(NativeFusion { fusion })
}

/// Loads a fusion from a `.weave` file with parameter overrides; a path that names nothing
/// raises `FusionFileNotFoundError` (a `FileNotFoundError`).
#[pyfunction]
#[pyo3(signature = (path, overrides=Vec::new()))]
fn load_file(path: std::path::PathBuf, overrides: Vec<(String, i64)>) -> PyResult<NativeFusion> {
    if let Err(e) = std::fs::metadata(&path) {
        if e.kind() == std::io::ErrorKind::NotFound {
            return Err(raise(
                Kind::NotFound,
                format!("{}: no such file", path.display()),
            ));
        }
    }
    let fusion = streamweave::load_file(&path, &overrides).map_err(|e| raise(Kind::Fusion, e))?;
    Ok(NativeFusion { fusion })
}

/// The module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<NativeFusion>()?;
    m.add_class::<NativeExecutable>()?;
    m.add_class::<NativeSession>()?;
    m.add_function(wrap_pyfunction!(load_source, m)?)?;
    m.add_function(wrap_pyfunction!(load_file, m)?)?;
    m.add_function(wrap_pyfunction!(op_table, m)?)?;
    m.add_function(wrap_pyfunction!(dtype_names, m)?)?;
    m.add_function(wrap_pyfunction!(run_defaults, m)?)?;
    Ok(())
}
