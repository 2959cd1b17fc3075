//! The `weave tune` command, which measures the candidate configurations and caches the
//! winner; and what `weave run` asks of the tuning: the configuration cached for a program
//! ([`tuned_entry`]), and the tuning of a first repeated run ([`tune_first_run`]).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use streamweave::Target;

#[cfg(any(doc, not(feature = "cuda")))]
use super::NO_CUDA_FEATURE;
use super::{gpu_calibration, is_host_program, read_source_text, tune_cache_path, TuneFlags};

/// The entry `weave tune` cached in `cache` for `fusion` (as [`tunable`] gives them) on
/// `ranks` ranks of this backend; `None` when there is no entry or the GPU cannot be opened
/// (the run reports why). A cache that cannot be read is an error.
pub(super) fn tuned_entry(
    fusion: &streamweave::ir::Fusion,
    cache: &Path,
    ranks: usize,
    cuda: bool,
    device: usize,
) -> Result<Option<streamweave::tune::Entry>, String> {
    use streamweave::tune;
    let gpu = if cuda {
        match tune::gpu_name(device) {
            Ok(g) => g,
            Err(_) => return Ok(None),
        }
    } else {
        "cpu".to_string()
    };
    let backend = if cuda { "cuda" } else { "cpu" };
    let key = tune::TuneKey::of(fusion, ranks, backend, &gpu);
    tune::lookup(cache, &key).map_err(|e| e.to_string())
}

/// The fusion `text` (named `name`, with the overrides `set`) and the tuning cache's path,
/// when there is a tuning to cache or look up: `None` when there is no cache path, the fusion
/// does not load, or `set` gives the chunk count.
pub(super) fn tunable(
    name: &str,
    text: &str,
    set: &[(String, i64)],
    ranks: usize,
) -> Option<(streamweave::ir::Fusion, PathBuf)> {
    let path = tune_cache_path()?;
    let fusion = streamweave::load_on(name, text, set, ranks).ok()?;
    let chunk = fusion.role_param(streamweave::ir::ParamRole::ChunkCount);
    if chunk.is_some_and(|p| set.iter().any(|(k, _)| *k == p.name)) {
        return None;
    }
    Some((fusion, path))
}

/// Tunes `fusion` on `ranks` GPUs of this process for a first repeated run (`fusion` and
/// `cache` as [`tunable`] gives them): the candidates of
/// [`streamweave::tune::TuneOptions::first_run`] measured on one world of GPUs (one NCCL
/// communicator for all) for at most `budget`, the winner stored in the tuning cache. Says on
/// stderr what it does and what it found. `None`: no candidate could be measured.
/// [`TuneStop::Held`] when a candidate's ranks did not stop in time (after caching what was
/// measured): its GPU work may hold the GPUs until this process ends.
pub(super) fn tune_first_run(
    fusion: &streamweave::ir::Fusion,
    cache: &Path,
    ranks: usize,
    budget: Duration,
    timeout: Duration,
    copy_engines: bool,
) -> Result<Option<streamweave::tune::Entry>, TuneStop> {
    use streamweave::tune;
    let failed = |e: String| TuneStop::Failed(e);
    // A cache that cannot be read is the run's error, not the tuning's.
    tune::TuneCache::load(cache).map_err(|e| failed(e.to_string()))?;
    let machine = tune::gpu_name(0).map_err(|e| failed(e.to_string()))?;
    let options = tune::TuneOptions {
        copy_engines,
        ..tune::TuneOptions::first_run(ranks, &machine, None, budget)
    };
    eprintln!(
        "tuning: no cached configuration of {} on {ranks} x {machine}: measuring candidates for at most {} s (--no-tune skips this; `weave tune` prints the whole table)",
        fusion.name,
        budget.as_secs()
    );
    let started = std::time::Instant::now();
    let (wait, limit) = tune::candidate_bounds(budget, timeout);
    let mut measure = world_measure(ranks, 3, 10, wait, limit).map_err(failed)?;
    let tuning =
        tune::tune(fusion, &options, measure.as_mut()).map_err(|e| failed(e.to_string()))?;
    let held = measure.held_by().map(str::to_string);
    drop(measure);
    let measured = tuning
        .rows
        .iter()
        .filter(|r| r.outcome.time().is_some())
        .count();
    let one = tuning
        .rows
        .iter()
        .find(|r| r.candidate == tune::Candidate::new(Some(1), 1, true))
        .and_then(|r| r.outcome.time());
    eprint!("{tuning}");
    // A signal during the cache's write removes its temporary file.
    crate::output::clean_up_on_signals();
    let stored = tune::store(cache, &tuning).map_err(|e| failed(e.to_string()))?;
    if let Some(candidate) = held {
        return Err(TuneStop::Held(candidate));
    }
    let Some(entry) = stored else {
        eprintln!("tuning: no candidate could be measured; running the untuned default");
        return Ok(None);
    };
    eprintln!(
        "tuning: {measured} candidate(s) measured in {:.1} s: {} at {:.3} ms{}, cached in {}",
        started.elapsed().as_secs_f64(),
        entry.candidate(),
        entry.median_ms,
        one.map(|t| format!(" (S=1: {:.3} ms)", t.as_secs_f64() * 1e3))
            .unwrap_or_default(),
        cache.display()
    );
    Ok(Some(entry))
}

/// Why a first run's tuning gave no configuration to run.
pub(super) enum TuneStop {
    /// It failed (its message); the run goes on untuned.
    Failed(String),
    /// The ranks of this candidate did not stop in time: the GPUs may be held until the
    /// process ends, so no run starts.
    Held(String),
}

/// One world of `ranks` GPUs that measures tuning candidates (one NCCL communicator for all),
/// each wait at most `timeout` and each candidate's runs at most `limit`;
/// [`NO_CUDA_FEATURE`] in a build without the `cuda` feature.
fn world_measure(
    ranks: usize,
    warmup: usize,
    iters: usize,
    timeout: Duration,
    limit: Duration,
) -> Result<Box<dyn streamweave::tune::Measure>, String> {
    #[cfg(feature = "cuda")]
    {
        streamweave::measure::WorldMeasure::open(ranks, warmup, iters, timeout)
            .map(|m| m.with_candidate_limit(limit))
            .map(|m| Box::new(m) as Box<dyn streamweave::tune::Measure>)
            .map_err(|e| e.to_string())
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (ranks, warmup, iters, timeout, limit);
        Err(NO_CUDA_FEATURE.to_string())
    }
}

/// `weave tune`: measures the candidate configurations of the fusion in `file` (with the
/// overrides `set`) on `flags.ranks` ranks, prints every candidate's median or why it was
/// skipped, the winner marked, and stores the winner in the tuning cache.
pub fn tune(file: &Path, set: &[(String, i64)], flags: &TuneFlags) -> ExitCode {
    use streamweave::tune;
    let _tune = tracing::info_span!("weave_tune", file = %file.display()).entered();
    let fail = |message: String| -> ExitCode {
        eprintln!("error: {message}");
        ExitCode::FAILURE
    };
    let target = if flags.cuda {
        Target::Cuda { ranks: flags.ranks }
    } else {
        Target::Cpu { ranks: flags.ranks }
    };
    if let Err(e) = target.check() {
        return fail(e.to_string());
    }
    if flags.iters == 0 {
        return fail("--iters 0: at least one timed run per candidate is needed".into());
    }
    let Some(cache) = flags.cache.clone().or_else(tune_cache_path) else {
        return fail(
            "no tuning cache: pass --cache FILE (WEAVE_TUNE_CACHE is not set and there is no cache directory)".into(),
        );
    };
    // A cache that cannot be read fails before anything is measured.
    if let Err(e) = tune::TuneCache::load(&cache) {
        return fail(e.to_string());
    }
    let text = match read_source_text(file) {
        Ok(text) => text,
        Err(e) => return fail(e),
    };
    if is_host_program(file, &text) {
        return fail(format!(
            "{}: a host program's chunk count is fixed; tune the .weave fusion",
            file.display()
        ));
    }
    let name = file.display().to_string();
    let fusion = match streamweave::load_on(&name, &text, set, flags.ranks) {
        Ok(f) => f,
        Err(e) => return fail(e.to_string()),
    };
    if let Some(p) = fusion.role_param(streamweave::ir::ParamRole::ChunkCount) {
        if set.iter().any(|(k, _)| *k == p.name) {
            return fail(format!(
                "--set {}: the chunk count is what `weave tune` chooses; leave it out",
                p.name
            ));
        }
    }
    let machine = if flags.cuda {
        match tune::gpu_name(0) {
            Ok(g) => g,
            Err(e) => return fail(format!("cannot open GPU 0: {e}")),
        }
    } else {
        "cpu".to_string()
    };
    // The cost model's calibration describes GPUs: it prunes GPU tunings only.
    let calibration = if flags.cuda {
        match gpu_calibration(&machine, flags.ranks) {
            Ok(c) => Some(c),
            Err(e) => return fail(e.to_string()),
        }
    } else {
        None
    };
    let options = tune::TuneOptions {
        copy_engines: flags.copy_engines,
        ..tune::TuneOptions::new(flags.ranks, flags.cuda, &machine, calibration)
    };
    crate::outln!(
        "{}: tuning on {} rank(s) of the {} backend{}, {} warm-up and {} timed run(s) per candidate",
        file.display(),
        flags.ranks,
        options.backend(),
        if flags.cuda {
            format!(" ({machine})")
        } else {
            String::new()
        },
        flags.warmup,
        flags.iters
    );
    // On GPUs every candidate runs on one world of GPUs and one NCCL communicator.
    // The timeout bounds a candidate's runs together; each wait of them gets half of it.
    let mut measure: Box<dyn tune::Measure> = if flags.cuda {
        let (wait, limit) = tune::candidate_bounds(flags.timeout, flags.timeout);
        match world_measure(flags.ranks, flags.warmup, flags.iters, wait, limit) {
            Ok(m) => m,
            Err(e) => return fail(format!("cannot open {} GPU(s): {e}", flags.ranks)),
        }
    } else {
        Box::new(tune::RunMeasure::new(
            target,
            flags.warmup,
            flags.iters,
            flags.timeout,
        ))
    };
    let tuning = match tune::tune(&fusion, &options, measure.as_mut()) {
        Ok(t) => t,
        Err(e) => return fail(e.to_string()),
    };
    crate::outln!(
        "  {:40} median of the timed runs (slowest rank), or why not measured",
        "candidate"
    );
    crate::out!("{tuning}");
    // A signal during the cache's write removes its temporary file.
    crate::output::clean_up_on_signals();
    let entry = match tune::store(&cache, &tuning) {
        Ok(Some(e)) => e,
        Ok(None) => return fail("no candidate could be measured: nothing was cached".into()),
        Err(e) => return fail(e.to_string()),
    };
    crate::outln!(
        "tuned: {} at {:.3} ms, cached in {}",
        entry.candidate(),
        entry.median_ms,
        cache.display()
    );
    ExitCode::SUCCESS
}
