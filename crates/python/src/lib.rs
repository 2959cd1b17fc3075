//! The Python extension module `streamweave._native`: loading fusions, compiling them into
//! executables, dumping the pass pipeline, and running executables on the CPU backend with
//! simulated ranks on tensors handed over as little-endian `f64` bytes (the Python package
//! `streamweave`, in python/, wraps it with NumPy). Every error becomes a
//! `streamweave.StreamweaveError` carrying the same message as the command line prints
//! (file:line:col, tensor, rank).

use std::time::Duration;

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use streamweave::executor::dense::Dense;
use streamweave::executor::timeline::chrome_trace;
use streamweave::ir::{DType, Fusion};
use streamweave::passes::{manager::render, DumpFlags, Ir, PassManager};
use streamweave::{Compiler, Executable, RunOptions, Target, Tensor};

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
        Ok(NativeExecutable { exe })
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
    exe: Executable,
}

/// One entry of a signature: name, dtype name and global shape.
type Sig = (String, String, Vec<usize>);

/// A tensor handed over: name, dtype name, shape and its values as little-endian `f64`.
type Handed = (String, String, Vec<usize>, Vec<u8>);

/// What a run hands back: the outputs (as [`Handed`], the bytes a Python `bytes`), whether
/// every check passed, the largest error against the reference, the races found and the
/// Chrome trace JSON when asked for.
type RunOutcome<'py> = (
    Vec<(String, String, Vec<usize>, Bound<'py, PyBytes>)>,
    bool,
    f64,
    usize,
    Option<String>,
);

fn dtype_of(name: &str) -> PyResult<DType> {
    match name {
        "bf16" => Ok(DType::BF16),
        "f16" => Ok(DType::F16),
        "f32" => Ok(DType::F32),
        "f64" => Ok(DType::F64),
        "i64" => Ok(DType::I64),
        "bool" => Ok(DType::Bool),
        other => Err(error(format!("unknown dtype `{other}`"))),
    }
}

fn f64s(bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(8)
        .map(|c| {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            f64::from_le_bytes(b)
        })
        .collect()
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

    /// Runs on the CPU backend with `ranks` simulated ranks (threads) on the named global
    /// inputs, each rounded to its dtype; returns the global outputs (same encoding), whether
    /// every check passed, the largest error against the reference (0 without `check`), the
    /// races found (with `races`), and the Chrome trace JSON (with `trace`). The GIL is
    /// released while the ranks run.
    #[pyo3(signature = (inputs, ranks=1, check=true, races=false, trace=false, streams=2, timeout_secs=60.0))]
    #[allow(clippy::too_many_arguments)]
    fn run<'py>(
        &self,
        py: Python<'py>,
        inputs: Vec<Handed>,
        ranks: usize,
        check: bool,
        races: bool,
        trace: bool,
        streams: usize,
        timeout_secs: f64,
    ) -> PyResult<RunOutcome<'py>> {
        let mut tensors = Vec::with_capacity(inputs.len());
        for (name, dtype, shape, bytes) in &inputs {
            let dtype = dtype_of(dtype)?;
            let dense = Dense::new(dtype, shape.clone(), f64s(bytes))
                .map_err(|m| error(format!("input `{name}`: {m}")))?;
            tensors.push((name.clone(), Tensor::from_dense(&dense)));
        }
        if !(timeout_secs.is_finite() && timeout_secs > 0.0) {
            return Err(error(format!(
                "timeout_secs must be a positive number of seconds, not {timeout_secs}"
            )));
        }
        let options = RunOptions {
            target: Target::Cpu { ranks },
            streams,
            check,
            check_races: races,
            trace,
            timeout: Duration::try_from_secs_f64(timeout_secs).unwrap_or(Duration::MAX),
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
            let d = t.to_dense();
            let mut bytes = Vec::with_capacity(d.data.len() * 8);
            for v in &d.data {
                bytes.extend_from_slice(&v.to_le_bytes());
            }
            out.push((
                name.to_string(),
                d.dtype.name().to_string(),
                d.sizes.clone(),
                PyBytes::new(py, &bytes),
            ));
        }
        Ok((out, passed, max_error, race_count, trace_json))
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
    m.add_class::<NativeFusion>()?;
    m.add_class::<NativeExecutable>()?;
    m.add_function(wrap_pyfunction!(load_source, m)?)?;
    m.add_function(wrap_pyfunction!(load_file, m)?)?;
    Ok(())
}
