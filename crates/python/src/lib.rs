//! The Python extension module `streamweave._native`: loading fusions, compiling them into
//! executables, dumping the pass pipeline, running executables on the CPU backend with
//! simulated ranks on tensors handed over as little-endian bytes of their own element type
//! (no `f64` round trip: a dtype the signature does not take raises `TypeError`), and on
//! GPUs in a [`CudaSession`] on device buffers handed over by address (PyTorch CUDA
//! tensors, no copy, on PyTorch's current stream). The Python package `streamweave`, in python/, wraps it with
//! NumPy and PyTorch. Every error becomes a `streamweave.StreamweaveError` carrying the same
//! message as the command line prints (file:line:col, tensor, rank).

use std::sync::Arc;
use std::time::Duration;

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyTypeError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyTuple, PyType};
use streamweave::cuda::{ForeignStream, Gpu};
use streamweave::executor::dense::Dense;
use streamweave::executor::timeline::chrome_trace;
use streamweave::half::{bf16, f16};
use streamweave::ir::{DType, Fusion};
use streamweave::passes::{manager::render, DumpFlags, Ir, PassManager};
use streamweave::{
    Buffer, Compiler, CudaSession, Data, Executable, RankCall, RunOptions, Target, Tensor,
};

create_exception!(
    streamweave,
    StreamweaveError,
    PyException,
    "A fusion that does not load or compile, inputs that do not fit, or a run that fails; \
     the message names the place (file:line:col, tensor, rank)."
);

fn error(e: impl std::fmt::Display) -> PyErr {
    StreamweaveError::new_err(e.to_string())
}

/// `streamweave.DTypeError`: both a `TypeError` and a [`StreamweaveError`] (one class with
/// two bases, made when the module loads).
static DTYPE_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// The class of [`DTYPE_ERROR`].
fn dtype_error_type(py: Python<'_>) -> PyResult<&Py<PyType>> {
    DTYPE_ERROR.get_or_try_init(py, || {
        let namespace = PyDict::new(py);
        namespace.set_item("__module__", "streamweave")?;
        namespace.set_item(
            "__doc__",
            "An input of a dtype (or kind) the program does not take: a TypeError naming the \
             input and both dtypes, and a StreamweaveError.",
        )?;
        let bases = PyTuple::new(
            py,
            [
                py.get_type::<StreamweaveError>(),
                py.get_type::<PyTypeError>(),
            ],
        )?;
        let class = py
            .get_type::<PyType>()
            .call1(("DTypeError", bases, namespace))?
            .cast_into::<PyType>()?;
        Ok(class.unbind())
    })
}

/// A `streamweave.DTypeError` (a `TypeError`) carrying `message`.
fn dtype_error(py: Python<'_>, message: String) -> PyErr {
    match dtype_error_type(py) {
        Ok(class) => PyErr::from_type(class.bind(py).clone(), message),
        Err(_) => PyTypeError::new_err(message),
    }
}

/// A loaded fusion (the user's global program).
#[pyclass(module = "streamweave._native", frozen)]
struct NativeFusion {
    fusion: Fusion,
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
    /// leave it to the runner.
    #[pyo3(signature = (devices=None))]
    fn compile(&self, devices: Option<usize>) -> PyResult<NativeExecutable> {
        let mut compiler = Compiler::new();
        if let Some(n) = devices {
            compiler = compiler.devices(n);
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
        let manager = PassManager::from_flags(&flags).map_err(error)?;
        let mut out: Vec<u8> = Vec::new();
        let ir = manager
            .run_with_output(Ir::Fusion(self.fusion.clone()), &mut out)
            .map_err(error)?;
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

/// A tensor handed over: name, the NumPy name of its element type (`float32`, `int64`,
/// `bfloat16`, `complex128`, ...), shape and its values as little-endian bytes of that type.
type Handed<'py> = (String, String, Vec<usize>, Bound<'py, PyBytes>);

/// What a run hands back: the outputs (name, dtype name, shape and little-endian bytes of
/// the dtype, a bf16 output widened to `f32`), whether every check passed, the largest error
/// against the reference, the races found and the Chrome trace JSON when asked for.
type RunOutcome<'py> = (
    Vec<(String, String, Vec<usize>, Bound<'py, PyBytes>)>,
    bool,
    f64,
    usize,
    Option<String>,
);

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

/// The input `name` of `spec` dtype from the value handed over (`numpy` names its element
/// type): the exact values when the dtypes agree; a float array for a bf16 input rounded to
/// bf16 (nearest even, the documented conversion: NumPy has no bf16); a `TypeError` naming
/// the input and both dtypes otherwise, worded as [`Executable::bind`]'s refusal.
fn input_tensor(
    py: Python<'_>,
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
        dtype_error(
            py,
            format!("input `{name}`: is {given} but the program takes {spec}{why}"),
        )
    };
    let given = dtype_of_numpy(numpy).ok_or_else(|| mismatch(numpy))?;
    let numel = shape.iter().try_fold(1usize, |a, &b| a.checked_mul(b));
    let width = streamweave::executor::dense::elem_bytes(given);
    if numel.and_then(|n| n.checked_mul(width)) != Some(bytes.len()) {
        return Err(error(format!(
            "input `{name}`: {} bytes do not hold a {numpy} array of shape {shape:?}",
            bytes.len()
        )));
    }
    let data = data_of(given, bytes);
    let data = if given == spec {
        data
    } else if spec == DType::BF16 && matches!(given, DType::F16 | DType::F32 | DType::F64) {
        let dense = Dense::new(DType::BF16, shape.to_vec(), data.to_f64())
            .map_err(|m| error(format!("input `{name}`: {m}")))?
            .rounded();
        return Ok(Tensor::from_dense(&dense));
    } else {
        return Err(mismatch(given.name()));
    };
    if let Some((i, x)) = beyond_exact(&data) {
        return Err(error(format!(
            "input `{name}`: element {i} is {x}, beyond ±(2^53 - 1): the CPU backend computes \
             in f64, which holds i64 values exactly only below 2^53 in magnitude"
        )));
    }
    Tensor::new(shape.to_vec(), data).map_err(|e| error(format!("input `{name}`: {e}")))
}

/// A tensor's values as little-endian bytes of its dtype (bf16 widened to `f32`, exactly).
fn bytes_of(data: &Data) -> Vec<u8> {
    fn flat<const N: usize, T: Copy>(v: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
        v.iter().flat_map(|x| f(*x)).collect()
    }
    match data {
        Data::F32(v) => flat(v, f32::to_le_bytes),
        Data::F64(v) => flat(v, f64::to_le_bytes),
        Data::BF16(v) => flat(v, |x| x.to_f32().to_le_bytes()),
        Data::F16(v) => flat(v, |x| x.to_bits().to_le_bytes()),
        Data::I64(v) => flat(v, i64::to_le_bytes),
        Data::Bool(v) => v.iter().map(|b| u8::from(*b)).collect(),
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
        self.exe
            .inputs()
            .iter()
            .map(|t| (t.name.clone(), t.dtype.name().to_string(), t.global.clone()))
            .collect()
    }

    /// The outputs: `(name, dtype, global shape)` in signature order.
    fn outputs(&self) -> Vec<Sig> {
        self.exe
            .outputs()
            .iter()
            .map(|t| (t.name.clone(), t.dtype.name().to_string(), t.global.clone()))
            .collect()
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
    #[pyo3(signature = (devices=None, launched=false, streams=2, races=false, trace=false, timeout_secs=60.0))]
    #[allow(clippy::too_many_arguments)]
    fn cuda_session(
        &self,
        py: Python<'_>,
        devices: Option<Vec<usize>>,
        launched: bool,
        streams: usize,
        races: bool,
        trace: bool,
        timeout_secs: f64,
    ) -> PyResult<NativeSession> {
        let timeout = timeout(timeout_secs)?;
        let options = RunOptions {
            target: Target::Cuda { ranks: 1 },
            streams,
            check_races: races,
            trace,
            timeout,
            ..RunOptions::default()
        };
        let exe = self.exe.clone();
        let session = if launched {
            let env = streamweave::comm::bootstrap::LaunchEnv::from_lookup(|name| {
                std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
            })
            .map_err(error)?
            .ok_or_else(|| {
                error(
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
    /// rounded to bf16; any other dtype raises `TypeError`); returns the global outputs in
    /// their dtype (a bf16 one widened to `f32`), whether
    /// every check passed, the largest error against the reference (0 without `check`), the
    /// races found (with `races`), and the Chrome trace JSON (with `trace`). The GIL is
    /// released while the ranks run.
    #[pyo3(signature = (inputs, ranks=1, check=true, races=false, trace=false, streams=2, timeout_secs=60.0))]
    #[allow(clippy::too_many_arguments)]
    fn run<'py>(
        &self,
        py: Python<'py>,
        inputs: Vec<Handed<'py>>,
        ranks: usize,
        check: bool,
        races: bool,
        trace: bool,
        streams: usize,
        timeout_secs: f64,
    ) -> PyResult<RunOutcome<'py>> {
        let mut tensors = Vec::with_capacity(inputs.len());
        for (name, numpy, shape, bytes) in &inputs {
            let spec = self
                .exe
                .inputs()
                .iter()
                .find(|s| s.name == *name)
                .ok_or_else(|| {
                    let known: Vec<&str> =
                        self.exe.inputs().iter().map(|s| s.name.as_str()).collect();
                    error(format!(
                        "input `{name}`: the program has no such input (it has: {})",
                        known.join(", ")
                    ))
                })?;
            let tensor = input_tensor(py, name, spec.dtype, numpy, shape, bytes.as_bytes())?;
            tensors.push((name.clone(), tensor));
        }
        let options = RunOptions {
            target: Target::Cpu { ranks },
            streams,
            check,
            check_races: races,
            trace,
            timeout: timeout(timeout_secs)?,
            ..RunOptions::default()
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
        let trace_json = trace.then(|| chrome_trace(&report.rank_spans()));
        let outputs = report.into_outputs().map_err(error)?;
        let mut out = Vec::with_capacity(outputs.len());
        for (name, t) in outputs.iter() {
            if let Some((i, x)) = beyond_exact(t.data()) {
                return Err(error(format!(
                    "output `{name}`: element {i} is {x}, beyond ±(2^53 - 1): the CPU \
                     backend computes in f64, which holds i64 values exactly only below 2^53 \
                     in magnitude, so it may have been rounded"
                )));
            }
            out.push((
                name.to_string(),
                t.dtype().name().to_string(),
                t.sizes().to_vec(),
                PyBytes::new(py, &bytes_of(t.data())),
            ));
        }
        Ok((out, passed, max_error, race_count, trace_json))
    }
}

/// A timeout given in seconds: positive and finite (a huge one is capped).
fn timeout(secs: f64) -> PyResult<Duration> {
    if !(secs.is_finite() && secs > 0.0) {
        return Err(error(format!(
            "timeout_secs must be a positive number of seconds, not {secs}"
        )));
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
        if calls.len() != ranks.len() {
            return Err(error(format!(
                "{} rank call(s) were given for the {} rank(s) of this process",
                calls.len(),
                ranks.len()
            )));
        }
        let mut out = Vec::with_capacity(calls.len());
        for (((inputs, outputs, stream), (rank, gpu)), (lin, lout)) in
            calls.iter().zip(ranks).zip(&self.layouts)
        {
            let buffers = |what: &str, ptrs: &[u64], layouts: &[Layout]| {
                if ptrs.len() != layouts.len() {
                    return Err(error(format!(
                        "rank {rank}: {} {what} address(es) for {} {what}s",
                        ptrs.len(),
                        layouts.len()
                    )));
                }
                Ok(ptrs
                    .iter()
                    .zip(layouts)
                    .map(|(&p, (dtype, sizes))| borrow(gpu, p, *dtype, sizes))
                    .collect::<Vec<_>>())
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
                Some(chrome_trace(&ranks))
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
    let fusion = streamweave::load(file, source, &overrides).map_err(error)?;
    Ok(NativeFusion { fusion })
}

/// Loads a fusion from a `.weave` file with parameter overrides.
#[pyfunction]
#[pyo3(signature = (path, overrides=Vec::new()))]
fn load_file(path: std::path::PathBuf, overrides: Vec<(String, i64)>) -> PyResult<NativeFusion> {
    let fusion = streamweave::load_file(&path, &overrides).map_err(error)?;
    Ok(NativeFusion { fusion })
}

/// The module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("StreamweaveError", m.py().get_type::<StreamweaveError>())?;
    m.add("DTypeError", dtype_error_type(m.py())?.clone_ref(m.py()))?;
    m.add_class::<NativeFusion>()?;
    m.add_class::<NativeExecutable>()?;
    m.add_class::<NativeSession>()?;
    m.add_function(wrap_pyfunction!(load_source, m)?)?;
    m.add_function(wrap_pyfunction!(load_file, m)?)?;
    Ok(())
}
