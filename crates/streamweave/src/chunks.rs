//! Choosing the chunk count S: a cost model of one rank's program — its GEMM work and its
//! communication, counted by running the unchunked program on the meter backend — against
//! a machine calibration (GEMM throughput, collective bus bandwidth, per-chunk overheads),
//! predicting the time of S = 1 (no overlap) and of S chunks pipelined over the stream pool,
//! and picking the fastest, or no overlap when chunking cannot pay.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use weave_executor::meter::{Meter, MeteredComm};

use weave_host_ir::HostProgram;

use crate::setup::RunError;

/// What a machine does: measured once per machine (`calibrate`) and cached, or the H200
/// figures of reference/anchors.md when nothing was measured.
///
/// The cache is a TOML table of these fields ([`Calibration::render`]); a missing field takes
/// its default.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Calibration {
    /// Dense bf16/f16 GEMM throughput at large sizes, TFLOP/s.
    pub gemm_tflops: f64,
    /// f32 GEMM throughput (FP32 compute), TFLOP/s.
    pub gemm_tflops_f32: f64,
    /// Collective bus bandwidth (NCCL's busbw), GB/s.
    pub busbw_gbs: f64,
    /// Point-to-point bandwidth between two GPUs, GB/s.
    pub p2p_gbs: f64,
    /// Fixed cost of one GEMM launch (small-problem inefficiency), µs.
    pub gemm_overhead_us: f64,
    /// Fixed cost of one collective (latency), µs.
    pub comm_latency_us: f64,
    /// How much overlapped GEMM and communication slow each other (0.1 = 10%).
    pub contention: f64,
    /// Where the figures come from.
    #[serde(default = "measured")]
    pub source: String,
}

/// The source of a calibration file that does not name one.
fn measured() -> String {
    "measured".into()
}

impl Default for Calibration {
    /// H200 figures measured by `weave calibrate` / `gpu_overlap` (docs/benchmarks.md,
    /// 2026-11-21, NCCL 2.28.3, NVLS off; 2 and 4 ranks): bf16 GEMM 847–857 TFLOP/s,
    /// allreduce bus bandwidth 216–222 GB/s, P2P 119–130 GB/s, 14–16 µs per extra GEMM, a
    /// small allreduce 185–265 µs from the host post to its end (≈ 100 µs of it the non-
    /// blocking NCCL post on the host), and a GEMM and an allreduce at once 32–44% slower
    /// than the longer of the two alone.
    fn default() -> Calibration {
        Calibration {
            gemm_tflops: 850.0,
            gemm_tflops_f32: 55.0,
            busbw_gbs: 220.0,
            p2p_gbs: 125.0,
            gemm_overhead_us: 15.0,
            comm_latency_us: 200.0,
            contention: 0.35,
            source: "H200 defaults (docs/benchmarks.md)".into(),
        }
    }
}

impl Calibration {
    /// The calibration cached at `path`, or the defaults when there is no such file (or no
    /// path). A cache that cannot be read is an error naming the file and where in it.
    /// Where the cache lives is the caller's choice: `weave` reads `$WEAVE_CALIBRATION`, else
    /// `$HOME/.cache/streamweave/calibration.txt`.
    pub fn load(path: Option<&Path>) -> Result<Calibration, CalibrationError> {
        match path {
            Some(p) if p.exists() => read_toml_file(p, "calibration", Calibration::parse),
            _ => Ok(Calibration::default()),
        }
    }

    /// Reads the TOML that [`Calibration::render`] writes (`key = value` lines, `#` comments).
    /// The files written before the cache was TOML, whose `source` line is not quoted, read
    /// the same.
    pub fn parse(text: &str) -> Result<Calibration, CalibrationParseError> {
        let c: Calibration = match toml::from_str(text) {
            Ok(c) => c,
            Err(e) => match quote_source(text) {
                Some(quoted) => toml::from_str(&quoted)
                    .map_err(|_| CalibrationParseError::Toml(toml_error(&e)))?,
                None => return Err(CalibrationParseError::Toml(toml_error(&e))),
            },
        };
        let figures = [
            c.gemm_tflops,
            c.gemm_tflops_f32,
            c.busbw_gbs,
            c.p2p_gbs,
            c.gemm_overhead_us,
            c.comm_latency_us,
            c.contention,
        ];
        if figures.iter().any(|x| !x.is_finite() || *x < 0.0) {
            return Err(CalibrationParseError::Negative);
        }
        if c.gemm_tflops <= 0.0
            || c.busbw_gbs <= 0.0
            || c.p2p_gbs <= 0.0
            || c.gemm_tflops_f32 <= 0.0
        {
            return Err(CalibrationParseError::NotPositive);
        }
        Ok(c)
    }

    /// The TOML text [`Calibration::parse`] reads.
    pub fn render(&self) -> String {
        // A struct of strings and floats always serializes.
        toml::to_string(self).unwrap_or_default()
    }
}

/// Why a calibration file was not read ([`Calibration::load`]): every message names the file.
pub type CalibrationError = TomlFileError<CalibrationParseError>;

/// Why a TOML file of the crate's (the calibration, the tuning cache) was not read, `E` being
/// what is wrong in its text: every message names the file.
#[derive(Debug, thiserror::Error)]
pub enum TomlFileError<E> {
    /// The file does not read (or is over the source cap).
    #[error(transparent)]
    Read(#[from] crate::ReadSourceError),
    /// The file is not UTF-8 text.
    #[error("{}: the {what} is not UTF-8 text", path.display())]
    NotUtf8 {
        /// The file.
        path: PathBuf,
        /// What the file holds (`calibration`, `tuning cache`).
        what: &'static str,
    },
    /// The text does not parse.
    #[error("{}: {error}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong in it.
        #[source]
        error: E,
    },
}

/// The `what` (`calibration`, `tuning cache`) at `path`, read like a source file (capped,
/// whatever the path is) and parsed with `parse`.
pub(crate) fn read_toml_file<T, E>(
    path: &Path,
    what: &'static str,
    parse: impl FnOnce(&str) -> Result<T, E>,
) -> Result<T, TomlFileError<E>> {
    let bytes = crate::read_source(path)?;
    let text = String::from_utf8(bytes).map_err(|_| TomlFileError::NotUtf8 {
        path: path.to_path_buf(),
        what,
    })?;
    parse(&text).map_err(|error| TomlFileError::Invalid {
        path: path.to_path_buf(),
        error,
    })
}

/// What is wrong in a calibration's text ([`Calibration::parse`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CalibrationParseError {
    /// Not TOML, or an unknown or mistyped field: where, then what (`TOML parse error at
    /// line 2, column 13: invalid ...`).
    #[error("{0}")]
    Toml(String),
    /// A figure is negative, infinite or NaN.
    #[error("every figure must be a non-negative number")]
    Negative,
    /// A throughput or bandwidth is zero.
    #[error("throughputs and bandwidths must be positive")]
    NotPositive,
}

/// A TOML error on one line: where, then what.
pub(crate) fn toml_error(e: &toml::de::Error) -> String {
    let text = e.to_string();
    let at = text.lines().next().unwrap_or("");
    let what = e.message().lines().next().unwrap_or("");
    format!("{at}: {what}")
}

/// The message of the error `parsed` (a TOML text that does not parse), checked to name
/// `line` (`line 2`).
#[cfg(test)]
pub(crate) fn toml_error_at<T: std::fmt::Debug, E: std::fmt::Display>(
    parsed: Result<T, E>,
    line: &str,
) -> String {
    let err = parsed.unwrap_err().to_string();
    assert!(err.contains(line), "{err}");
    err
}

/// `text` with an unquoted `source = ...` line (the format before TOML) quoted, or `None`
/// when it has none.
fn quote_source(text: &str) -> Option<String> {
    let mut changed = false;
    let lines: Vec<String> = text
        .lines()
        .map(|line| match line.split_once('=') {
            Some((k, v)) if k.trim() == "source" && !v.trim().starts_with('"') => {
                changed = true;
                format!("source = {}", toml::Value::String(v.trim().to_string()))
            }
            _ => line.to_string(),
        })
        .collect();
    changed.then(|| lines.join("\n"))
}

/// One rank's work in the unchunked program.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    /// GEMM flops.
    pub gemm_flops: f64,
    /// Whether the GEMMs are f32 (FP32 compute) rather than 16-bit.
    pub f32_gemm: bool,
    /// The communications, in order.
    pub comms: Vec<MeteredComm>,
}

impl Workload {
    /// From the meter of a run.
    pub fn of(meter: &Meter, f32_gemm: bool) -> Workload {
        Workload {
            gemm_flops: meter.gemm_flops,
            f32_gemm,
            comms: meter.comms.clone(),
        }
    }
}

/// Seconds one communication takes alone.
pub fn comm_seconds(c: &MeteredComm, cal: &Calibration) -> f64 {
    let n = c.team.max(1) as f64;
    let bytes = c.bytes as f64;
    let bus = cal.busbw_gbs * 1e9;
    let moved = match c.kind {
        // NCCL's bus-bandwidth factors: what each rank sends over its links.
        "allreduce" => 2.0 * (n - 1.0) / n * bytes / bus,
        "allgather" | "reduce-scatter" | "all-to-all" => (n - 1.0) / n * bytes / bus,
        "send/recv" | "send-recv" | "collective-permute" => bytes / (cal.p2p_gbs * 1e9),
        _ => bytes / bus,
    };
    moved + cal.comm_latency_us * 1e-6
}

/// Seconds the GEMMs take alone.
pub fn gemm_seconds(w: &Workload, cal: &Calibration) -> f64 {
    let tflops = if w.f32_gemm {
        cal.gemm_tflops_f32
    } else {
        cal.gemm_tflops
    };
    w.gemm_flops / (tflops * 1e12)
}

/// The predicted time of the program cut into `s` chunks: `s = 1` runs GEMM then
/// communication; more chunks pipeline chunk i's communication under chunk i+1's GEMM, each
/// chunk paying the fixed GEMM and collective costs, and overlapped stages slowed by the
/// contention factor.
pub fn predict(w: &Workload, cal: &Calibration, s: usize) -> f64 {
    let s = s.max(1) as f64;
    let compute = gemm_seconds(w, cal);
    let comm_fixed = cal.comm_latency_us * 1e-6 * w.comms.len() as f64;
    let comm: f64 = w.comms.iter().map(|c| comm_seconds(c, cal)).sum::<f64>() - comm_fixed;
    let g0 = cal.gemm_overhead_us * 1e-6;
    let per_gemm = compute / s + g0;
    let per_comm = comm / s + comm_fixed;
    if s <= 1.0 {
        return per_gemm + per_comm;
    }
    let stage = per_gemm.max(per_comm) * (1.0 + cal.contention);
    per_gemm + (s - 1.0) * stage + per_comm
}

/// The contention factor that makes [`predict`] fit measured times best: `measured` holds
/// (S, seconds) of one program's runs at several chunk counts, S = 1 among them. The model's
/// absolute scale is taken from S = 1 (the measured time over the predicted one: what the
/// calibration's throughputs miss), and the contention is the least-squares fit of the
/// chunked runs — [`predict`] is linear in it — clamped to `0..=MAX_CONTENTION`. `None`
/// without S = 1 and a chunked run, or when the chunked stages cannot tell (no
/// communication).
pub fn fit_contention(w: &Workload, cal: &Calibration, measured: &[(usize, f64)]) -> Option<f64> {
    if w.comms.is_empty() {
        return None;
    }
    let one = measured.iter().find(|(s, _)| *s == 1)?.1;
    let base = Calibration {
        contention: 0.0,
        ..cal.clone()
    };
    let scale = one / predict(w, &base, 1);
    if !scale.is_finite() || scale <= 0.0 {
        return None;
    }
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for &(s, t) in measured.iter().filter(|(s, _)| *s > 1) {
        // predict(s, c) = a + b·c: `a` at no contention, `b` its slope.
        let a = predict(w, &base, s);
        let with_one = Calibration {
            contention: 1.0,
            ..base.clone()
        };
        let b = predict(w, &with_one, s) - a;
        num += scale * b * (t - scale * a);
        den += (scale * b).powi(2);
    }
    (den > 0.0).then(|| (num / den).clamp(0.0, MAX_CONTENTION))
}

/// The largest contention [`fit_contention`] answers: overlapped stages three times slower
/// than alone.
pub const MAX_CONTENTION: f64 = 3.0;

/// The chunk count a model picks, with what it predicted for every candidate.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    /// The chosen S.
    pub chunks: usize,
    /// (S, predicted seconds) for every candidate, in order.
    pub predicted: Vec<(usize, f64)>,
}

/// How much faster than one chunk a chunked schedule must be predicted to be before it is
/// chosen. The model's error exceeds smaller gains: on 2 and 4 H200s (2026-11-22) eager
/// S = 2 measured from 0.96x to 1.06x of S = 1 on rows the model rated a few percent faster.
pub const CHUNKING_MARGIN: f64 = 0.05;

/// The fastest of `candidates` (1 is always a candidate: no overlap when chunking cannot
/// pay), where more than one chunk must be predicted at least [`CHUNKING_MARGIN`] faster
/// than one; ties go to the fewer chunks.
pub fn choose(w: &Workload, cal: &Calibration, candidates: &[usize]) -> Choice {
    let mut cands: Vec<usize> = candidates.iter().copied().filter(|&s| s >= 1).collect();
    if !cands.contains(&1) {
        cands.insert(0, 1);
    }
    cands.sort_unstable();
    cands.dedup();
    let predicted: Vec<(usize, f64)> = cands.iter().map(|&s| (s, predict(w, cal, s))).collect();
    let one = predicted[0].1;
    let mut best = (1usize, one);
    for &(s, t) in &predicted[1..] {
        if t <= one * (1.0 - CHUNKING_MARGIN) && t < best.1 * (1.0 - 1e-9) {
            best = (s, t);
        }
    }
    Choice {
        chunks: best.0,
        predicted,
    }
}

/// The chunk counts `--chunks auto` considers.
pub const CANDIDATES: [usize; 4] = [1, 2, 4, 8];

/// Measures the workload of `program` (built with one chunk; its signature gives the inputs
/// and parameters) for rank 0 of `ranks` on the meter backend: nothing is computed and no
/// tensor memory is allocated.
pub fn workload(program: &HostProgram, ranks: usize) -> Result<Workload, RunError> {
    let meter = meter(program, ranks)?;
    let f32_gemm = program
        .signature
        .as_ref()
        .is_some_and(|sig| sig.inputs.iter().any(|t| t.dtype == weave_ir::DType::F32));
    Ok(Workload::of(&meter, f32_gemm))
}

/// What rank 0 of `ranks` issues when it runs `program` (with its signature's parameters) on
/// the meter backend: nothing is computed and no value is read.
pub fn meter(program: &HostProgram, ranks: usize) -> Result<Meter, RunError> {
    use weave_executor::KernelTableError;
    // Rank 0 with the default pool of 2.
    weave_executor::kernels::meter_rank(program, 0, ranks, 2).map_err(|e| match e {
        KernelTableError::NoSignature => {
            RunError::Setup("the host program has no signature to meter it by".into())
        }
        KernelTableError::Meter { rank, error } => RunError::Ranks(vec![(rank, error)]),
        other => RunError::Setup(other.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A machine whose collectives are cheap to start (no host latency to speak of) and
    /// whose GEMMs and collectives do not slow each other: the model's logic, apart from any
    /// measured machine.
    pub(super) fn fast_start() -> Calibration {
        Calibration {
            gemm_tflops: 740.0,
            busbw_gbs: 260.0,
            p2p_gbs: 300.0,
            gemm_overhead_us: 15.0,
            comm_latency_us: 20.0,
            contention: 0.0,
            source: "test".into(),
            ..Calibration::default()
        }
    }

    fn ar(bytes: usize, team: usize) -> MeteredComm {
        MeteredComm {
            kind: "allreduce",
            team,
            bytes,
        }
    }

    /// Times made by the model itself at a known contention (and a scale the calibration
    /// misses) give that contention back; the fit ignores what it cannot use.
    #[test]
    fn the_contention_of_measured_times_is_fitted_back() {
        let w = Workload {
            gemm_flops: 2.0 * 8192.0 * 8192.0 * 8192.0 / 4.0,
            f32_gemm: false,
            comms: vec![ar(8192 * 8192 * 2, 4)],
        };
        let cal = fast_start();
        for truth in [0.0, 0.35, 0.8, 1.5] {
            let at = Calibration {
                contention: truth,
                ..cal.clone()
            };
            // The machine is 1.3 times slower than the calibration says, everywhere.
            let measured: Vec<(usize, f64)> = [1, 2, 4, 8]
                .iter()
                .map(|&s| (s, 1.3 * predict(&w, &at, s)))
                .collect();
            let fitted = fit_contention(&w, &cal, &measured).unwrap();
            assert!((fitted - truth).abs() < 1e-9, "{truth}: {fitted}");
        }
        // Chunked runs slower than any contention explains are clamped.
        let slow = [(1, 1e-3), (2, 1.0)];
        assert_eq!(fit_contention(&w, &cal, &slow), Some(MAX_CONTENTION));
        // Faster than no contention: 0.
        let fast = [(1, 1e-3), (2, 1e-6)];
        assert_eq!(fit_contention(&w, &cal, &fast), Some(0.0));
        // Nothing to fit: no S = 1, no chunked run, no communication.
        assert_eq!(fit_contention(&w, &cal, &[(2, 1e-3)]), None);
        assert_eq!(fit_contention(&w, &cal, &[(1, 1e-3)]), None);
        let quiet = Workload {
            comms: Vec::new(),
            ..w.clone()
        };
        assert_eq!(fit_contention(&quiet, &cal, &[(1, 1e-3), (2, 1e-3)]), None);
    }

    #[test]
    fn balanced_work_chunks_and_tiny_work_does_not() {
        let cal = fast_start();
        // The anchor's matmul + allreduce on 2 H200s: 2.2 TFLOP and a 128 MiB allreduce.
        let big = Workload {
            gemm_flops: 2.0 * 8192.0 * 16384.0 * 8192.0,
            f32_gemm: false,
            comms: vec![ar(8192 * 8192 * 2, 2)],
        };
        let c = choose(&big, &cal, &CANDIDATES);
        assert!(c.chunks > 1, "{c:?}");
        assert!(predict(&big, &cal, c.chunks) < predict(&big, &cal, 1));
        // A tiny problem: fixed costs dominate, chunking cannot pay.
        let tiny = Workload {
            gemm_flops: 2.0 * 64.0 * 64.0 * 64.0,
            f32_gemm: false,
            comms: vec![ar(64 * 64 * 2, 2)],
        };
        assert_eq!(choose(&tiny, &cal, &CANDIDATES).chunks, 1);
        // No communication: nothing to hide.
        let alone = Workload {
            comms: vec![],
            ..big.clone()
        };
        assert_eq!(choose(&alone, &cal, &CANDIDATES).chunks, 1);
    }

    #[test]
    fn chunks_are_chosen_only_when_predicted_clearly_faster_than_one() {
        let cal = fast_start();
        // Grow the allreduce under a fixed GEMM: the best chunked prediction goes from
        // slower than one chunk, through slightly faster (within the margin: S = 1 stays),
        // to clearly faster (chunked).
        let (mut within, mut beyond) = (0, 0);
        for step in 1..400 {
            let w = Workload {
                gemm_flops: 2.0 * 4096.0 * 4096.0 * 4096.0,
                f32_gemm: false,
                comms: vec![ar(step * (1 << 18), 2)],
            };
            let one = predict(&w, &cal, 1);
            let (s, t) = [2, 4, 8]
                .iter()
                .map(|&s| (s, predict(&w, &cal, s)))
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .unwrap();
            let c = choose(&w, &cal, &CANDIDATES);
            if t < one && t > one * (1.0 - CHUNKING_MARGIN) {
                within += 1;
                assert_eq!(c.chunks, 1, "step {step}: S={s} only {:.3}x", t / one);
            } else if t <= one * (1.0 - CHUNKING_MARGIN) {
                beyond += 1;
                assert!(c.chunks > 1, "step {step}: S={s} at {:.3}x", t / one);
            }
        }
        assert!(within > 0 && beyond > 0, "{within} within, {beyond} beyond");
    }

    #[test]
    fn the_prediction_of_one_chunk_is_the_sum_and_of_many_at_least_the_max() {
        let cal = Calibration {
            gemm_overhead_us: 0.0,
            comm_latency_us: 0.0,
            contention: 0.0,
            ..fast_start()
        };
        let w = Workload {
            gemm_flops: 740e12 * 1e-3, // 1 ms
            f32_gemm: false,
            comms: vec![ar(260_000_000 / 2, 2)], // 2(n-1)/n · bytes / busbw = 0.5 ms
        };
        assert!((predict(&w, &cal, 1) - 1.5e-3).abs() < 1e-9);
        // Perfect pipeline of 4: c + 3·max(c, m) + m = 0.25 + 0.75 + 0.125 ms.
        assert!((predict(&w, &cal, 4) - 1.125e-3).abs() < 1e-9);
        for s in [2, 4, 8, 64] {
            assert!(predict(&w, &cal, s) >= 1e-3);
        }
    }

    #[test]
    fn calibration_files_round_trip_and_errors_name_the_line() {
        let c = Calibration {
            gemm_tflops: 700.5,
            source: "measured on test".into(),
            ..Calibration::default()
        };
        assert_eq!(Calibration::parse(&c.render()).unwrap(), c);
        assert!(
            c.render().contains("source = \"measured on test\""),
            "{}",
            c.render()
        );
        toml_error_at(
            Calibration::parse("gemm_tflops = 700\nbusbw_gbs = fast\n"),
            "line 2",
        );
        let err = toml_error_at(Calibration::parse("# comment\nspeed = 3\n"), "line 2");
        assert!(err.contains("speed"), "{err}");
        toml_error_at(Calibration::parse("gemm_tflops 3\n"), "line 1");
        let err = Calibration::parse("busbw_gbs = -3\n").unwrap_err();
        assert_eq!(err, CalibrationParseError::Negative);
        assert_eq!(
            err.to_string(),
            "every figure must be a non-negative number"
        );
        // Integers are figures too; a missing figure keeps its default.
        let partial = Calibration::parse("gemm_tflops = 700\n").unwrap();
        assert_eq!(partial.gemm_tflops, 700.0);
        assert_eq!(partial.busbw_gbs, Calibration::default().busbw_gbs);
        assert_eq!(partial.source, "measured");
    }

    #[test]
    fn calibration_files_written_before_toml_still_read() {
        let old = "source = measured on 2 x NVIDIA H200 (2 ranks)\ngemm_tflops = 851.2\n\
                   gemm_tflops_f32 = 55\nbusbw_gbs = 219.5\np2p_gbs = 125\n\
                   gemm_overhead_us = 15\ncomm_latency_us = 200\ncontention = 0.35\n";
        let c = Calibration::parse(old).unwrap();
        assert_eq!(c.source, "measured on 2 x NVIDIA H200 (2 ranks)");
        assert_eq!(c.gemm_tflops, 851.2);
        assert_eq!(c.p2p_gbs, 125.0);
    }

    #[test]
    fn no_cache_file_means_the_defaults() {
        let missing = Path::new("/no/such/dir/calibration.txt");
        assert_eq!(
            Calibration::load(Some(missing)).unwrap(),
            Calibration::default()
        );
        assert_eq!(Calibration::load(None).unwrap(), Calibration::default());
    }
}

#[cfg(test)]
mod workload_tests {
    use super::*;
    use crate::{Chunks, Compiler};

    fn source() -> String {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/scenarios/row_parallel_linear.weave");
        std::fs::read_to_string(path).unwrap()
    }

    fn program(s: usize) -> HostProgram {
        let exe = Compiler::new()
            .set("t", 1024)
            .set("h", 512)
            .devices(2)
            .chunks(Chunks::Fixed(s))
            .compile_source("row_parallel_linear.weave", &source())
            .unwrap();
        exe.program().clone()
    }

    #[test]
    fn the_meter_counts_one_ranks_gemm_flops_and_allreduce_bytes() {
        // inp [t, 4h/d] · w[h, 4h/d]ᵀ on each of 2 ranks, then an allreduce of [t, h] bf16.
        let one = workload(&program(1), 2).unwrap();
        assert_eq!(one.gemm_flops, 2.0 * 1024.0 * 512.0 * 1024.0);
        assert!(!one.f32_gemm);
        assert_eq!(
            one.comms,
            vec![MeteredComm {
                kind: "allreduce",
                team: 2,
                bytes: 1024 * 512 * 2
            }]
        );
        // Chunked, the same work in four pieces.
        let four = workload(&program(4), 2).unwrap();
        assert_eq!(four.gemm_flops, one.gemm_flops);
        assert_eq!(four.comms.len(), 4);
        assert_eq!(
            four.comms.iter().map(|c| c.bytes).sum::<usize>(),
            1024 * 512 * 2
        );
    }

    /// The cost model chooses only among chunk counts that keep the data: none for the
    /// weight gradients of `s` micro-batches (`x: f32[s, n, h]`), which keep their own `s`;
    /// for rows regrouped into chunks (`inp: bf16[s, d, t / (s * d), h]`, t = 8192 on 2
    /// ranks) every candidate, and for 40 rows those that divide them.
    #[test]
    fn auto_chooses_only_chunk_counts_that_keep_the_data() {
        let cal = tests::fast_start();
        let compile = |file: &str, source: &str, set: &[(&str, i64)]| {
            let mut c = Compiler::new().devices(2).chunks(Chunks::Auto(cal.clone()));
            for (k, v) in set {
                c = c.set(k, *v);
            }
            c.compile_source(file, source).unwrap()
        };
        let grads = compile(
            "mlp_backward_weight_grads.weave",
            include_str!("../../../tests/scenarios/mlp_backward_weight_grads.weave"),
            &[],
        );
        assert!(grads.chunk_choice().is_none());
        let s = grads.signature().params.iter().find(|(k, _)| k == "s");
        assert_eq!(s, Some(&("s".to_string(), 2)));
        let rows = |t: i64| {
            let exe = compile(
                "column_parallel_chunked.weave",
                include_str!("../../../tests/scenarios/column_parallel_chunked.weave"),
                &[("t", t)],
            );
            let choice = exe.chunk_choice().cloned().expect("the cost model chose");
            let predicted: Vec<usize> = choice.predicted.iter().map(|(s, _)| *s).collect();
            (predicted, choice.chunks)
        };
        assert_eq!(rows(8192).0, CANDIDATES);
        // 40 rows: 8 chunks of 2 devices' blocks would keep 32 of them.
        let (predicted, chunks) = rows(40);
        assert_eq!(predicted, [1, 2, 4]);
        assert!(predicted.contains(&chunks));
    }

    #[test]
    fn auto_picks_overlap_at_8192_and_none_for_a_small_layer() {
        let auto = |cal: &Calibration, set: &[(&str, i64)]| {
            let mut c = Compiler::new().devices(2).chunks(Chunks::Auto(cal.clone()));
            for (k, v) in set {
                c = c.set(k, *v);
            }
            c.compile_source("row_parallel_linear.weave", &source())
                .unwrap()
                .chunk_choice()
                .cloned()
                .unwrap()
        };
        let cal = tests::fast_start();
        let big = auto(&cal, &[]);
        assert!(big.chunks > 1, "{big:?}");
        assert_eq!(auto(&cal, &[("t", 64), ("h", 32)]).chunks, 1);
        // On the measured H200 figures (≈ 200 µs per collective from the host, GEMM and
        // allreduce 35% slower together) the row-parallel layer at t = h = 8192 on 2 ranks
        // is not worth chunking eagerly: the device agreed within 4% (docs/benchmarks.md).
        let h200 = auto(&Calibration::default(), &[]);
        let one = h200.predicted[0].1;
        assert!(
            h200.predicted.iter().all(|(_, t)| *t >= one * 0.96),
            "{h200:?}"
        );
    }
}
