//! The one timer of repeated GPU runs: CUDA events on the main stream around runs issued back
//! to back (no host wait between two runs), so a figure is the GPU time of one run in steady
//! state, whoever issues it: `weave run --iters`, `Executable::run`, the tuner and the
//! benchmarks all time through [`time_back_to_back`].
//!
//! Why back to back: a host wait between runs puts the host's wake-up (a poll that sleeps)
//! and, on several ranks, the skew between the ranks' hosts into every figure: the rank whose
//! host starts first waits inside its first collective for the last one. Issued back to back,
//! ranks that exchange data run in lockstep after the first run (the untimed lead-in, which
//! absorbs the skew), and the event before run `i + 1` is the event after run `i`.
//!
//! The host stays at most [`IN_FLIGHT`] runs ahead: before issuing run `i` it waits (with the
//! backend's timeout and its communicator check) for run `i - IN_FLIGHT` to finish, so no
//! wait is unbounded and a failed peer ends the timing with its error.

use std::collections::VecDeque;
use std::time::Duration;

use weave_cuda::cudarc::driver::CudaEvent;
use weave_cuda::CudaError;

use super::CudaBackend;
use crate::backend::{Backend, StreamKey};
use crate::error::ExecError;

/// How many runs the host issues ahead of the GPU at most.
pub const IN_FLIGHT: usize = 4;

/// Times `iters` runs that `launch(i)` issues (on the backend's main stream, or on streams
/// joined back to it): run `i = 0` is the untimed lead-in, runs `1..=iters` the timed ones,
/// back to back, each between two CUDA events on the main stream. Returns every timed run's
/// duration; `iters = 0` returns nothing and issues nothing.
pub fn time_back_to_back(
    backend: &CudaBackend,
    iters: usize,
    mut launch: impl FnMut(usize) -> Result<(), ExecError>,
) -> Result<Vec<Duration>, ExecError> {
    if iters == 0 {
        return Ok(Vec::new());
    }
    let main = backend.stream(StreamKey::Main)?;
    let gpu = backend.gpu();
    // The lead-in: the ranks meet in its collectives, so the timed runs start together.
    launch(0)?;
    let first = gpu.new_event(true)?;
    main.record(&first)?;
    // `pending` holds the events recorded but not yet read, oldest first; `previous` is the
    // event that opens the oldest pending run.
    let mut previous = first;
    let mut pending: VecDeque<CudaEvent> = VecDeque::with_capacity(IN_FLIGHT + 1);
    let mut out = Vec::with_capacity(iters.min(1 << 16));
    let read = |previous: &mut CudaEvent,
                done: CudaEvent,
                out: &mut Vec<Duration>|
     -> Result<(), ExecError> {
        let at = out.len();
        backend.wait_recorded(&done, &format!("timed run {at}"))?;
        let ms = previous.elapsed_ms(&done).map_err(|e| {
            ExecError::Cuda(CudaError::Driver {
                call: "cuEventElapsedTime",
                message: e.to_string(),
            })
        })?;
        out.push(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3));
        *previous = done;
        Ok(())
    };
    for i in 0..iters {
        if pending.len() >= IN_FLIGHT {
            if let Some(done) = pending.pop_front() {
                read(&mut previous, done, &mut out)?;
            }
        }
        launch(i + 1)?;
        let end = gpu.new_event(true)?;
        main.record(&end)?;
        pending.push_back(end);
    }
    while let Some(done) = pending.pop_front() {
        read(&mut previous, done, &mut out)?;
    }
    Ok(out)
}
