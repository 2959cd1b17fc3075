//! One thread per rank: the spawn-and-join loop that the CPU ranks ([`crate::run`]) and the
//! GPU ranks ([`crate::gpu`]) both run on, and how rank threads meet: a [`Barrier`] with a
//! timeout and an [`Exchange`] of bytes (how copy-engine windows connect).

#[cfg(feature = "cuda")]
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::atomic::{AtomicUsize, Ordering};
#[cfg(feature = "cuda")]
use std::sync::Arc;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use weave_executor::{ExecError, RankRun};

use crate::setup::RunError;

/// Runs `rank(r, input)` for every rank `r` of `inputs` on its own scoped thread and waits for
/// them all: every rank's run in rank order with the wall time of the whole, or every failed
/// rank's error (a panicking rank's thread fails that rank, not the caller).
///
/// Every thread is started before any rank runs: when the system refuses a thread (too many
/// ranks for its memory or thread limit), no rank starts, and the error names the rank whose
/// thread could not be started, instead of the others waiting for it until they time out.
pub(crate) fn run_rank_threads<I, F>(
    inputs: Vec<I>,
    rank: F,
) -> Result<(Vec<RankRun>, Duration), RunError>
where
    I: Send,
    F: Fn(usize, I) -> Result<RankRun, ExecError> + Sync,
{
    let start = Instant::now();
    let rank = &rank;
    let gate = &Gate::default();
    let results: Result<Vec<Result<RankRun, ExecError>>, RunError> = std::thread::scope(|scope| {
        let mut handles = Vec::with_capacity(inputs.len());
        for (r, input) in inputs.into_iter().enumerate() {
            let spawned = std::thread::Builder::new()
                .name(format!("weave-rank-{r}"))
                .spawn_scoped(scope, move || {
                    if gate.wait() {
                        rank(r, input)
                    } else {
                        Err(ExecError::Program("not started".into()))
                    }
                });
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    gate.open(false);
                    return Err(RunError::Setup(format!(
                        "cannot start the thread of rank {r}: {e} (fewer ranks, or a higher thread or memory limit)"
                    )));
                }
            }
        }
        gate.open(true);
        Ok(handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(ExecError::Program("the rank's thread panicked".into()))
                })
            })
            .collect())
    });
    let results = results?;
    let elapsed = start.elapsed();
    let mut runs = Vec::new();
    let mut errors = Vec::new();
    for (r, result) in results.into_iter().enumerate() {
        match result {
            Ok(run) => runs.push(run),
            Err(e) => errors.push((r, e)),
        }
    }
    if errors.is_empty() {
        Ok((runs, elapsed))
    } else {
        Err(RunError::Ranks(errors))
    }
}

/// Rank threads of this process left running on a stalled GPU so far: see [`stuck_ranks`].
static STUCK_RANKS: AtomicUsize = AtomicUsize::new(0);

/// How many rank threads of this process were left behind, still waiting on GPU work that
/// no timeout bounds (a run's "the rank did not stop" error): while any is, the process's
/// CUDA contexts cannot be torn down, so a program that gets a non-zero count should end
/// without the usual clean-up at exit (the `weave` command line does), else its exit waits
/// on the stalled GPU.
pub fn stuck_ranks() -> usize {
    STUCK_RANKS.load(Ordering::SeqCst)
}

/// Counts `n` rank threads left behind ([`stuck_ranks`]).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn left_behind(n: usize) {
    STUCK_RANKS.fetch_add(n, Ordering::SeqCst);
}

/// How long the ranks of a GPU run whose timeout is `timeout` get to stop after it: half the
/// timeout, between 5 and 30 s (an aborted rank releases its flag waits and NCCL's within
/// seconds; past this, something waits that no timeout of the rank's bounds). A stuck run
/// so ends within 1.5 times its timeout, 5 s more at most.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn stop_grace(timeout: Duration) -> Duration {
    (timeout / 2).clamp(Duration::from_secs(5), Duration::from_secs(30))
}

#[cfg(feature = "cuda")]
/// [`run_rank_threads`] on detached threads, waited for at most `limit` (none: as long as
/// they take): a rank still running then is reported as stuck, and its thread is left behind
/// (its GPU work waits on something no wait of the rank bounds; only the end of the process
/// frees that GPU), so that the caller gets an error instead of waiting forever.
pub(crate) fn run_rank_threads_bounded<I, F>(
    inputs: Vec<I>,
    limit: Option<Duration>,
    rank: F,
) -> Result<(Vec<RankRun>, Duration), RunError>
where
    I: Send + 'static,
    F: Fn(usize, I) -> Result<RankRun, ExecError> + Send + Sync + 'static,
{
    let start = Instant::now();
    let n = inputs.len();
    let rank = Arc::new(rank);
    let gate = Arc::new(Gate::default());
    let (tx, rx) = std::sync::mpsc::channel::<(usize, Result<RankRun, ExecError>)>();
    for (r, input) in inputs.into_iter().enumerate() {
        let (f, g, tx) = (rank.clone(), gate.clone(), tx.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("weave-rank-{r}"))
            .spawn(move || {
                let result = if g.wait() {
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(r, input)))
                        .unwrap_or_else(|_| {
                            Err(ExecError::Program("the rank's thread panicked".into()))
                        })
                } else {
                    Err(ExecError::Program("not started".into()))
                };
                let _ = tx.send((r, result));
            });
        if let Err(e) = spawned {
            gate.open(false);
            return Err(RunError::Setup(format!(
                "cannot start the thread of rank {r}: {e} (fewer ranks, or a higher thread or memory limit)"
            )));
        }
    }
    drop(tx);
    gate.open(true);
    let until = limit.and_then(|l| start.checked_add(l));
    let mut results: Vec<Option<Result<RankRun, ExecError>>> = (0..n).map(|_| None).collect();
    let mut done = 0;
    while done < n {
        let got = match until {
            Some(until) => rx.recv_timeout(until.saturating_duration_since(Instant::now())),
            None => rx
                .recv()
                .map_err(|_| std::sync::mpsc::RecvTimeoutError::Disconnected),
        };
        match got {
            Ok((r, result)) => {
                if results[r].replace(result).is_none() {
                    done += 1;
                }
            }
            Err(_) => break,
        }
    }
    let elapsed = start.elapsed();
    let mut runs = Vec::new();
    let mut errors = Vec::new();
    for (r, result) in results.into_iter().enumerate() {
        match result {
            Some(Ok(run)) => runs.push(run),
            Some(Err(e)) => errors.push((r, e)),
            None => errors.push((r, {
                left_behind(1);
                ExecError::Timeout {
                    what: format!(
                        "the rank did not stop (its run's timeout and a grace to stop, \
                         {:.0?} in all): its GPU work waits on something no timeout of the \
                         rank bounds, such as a peer that never posts; the GPU is free again \
                         only when this process ends",
                        limit.unwrap_or_default()
                    ),
                    millis: limit.unwrap_or_default().as_millis() as u64,
                }
            })),
        }
    }
    if errors.is_empty() {
        Ok((runs, elapsed))
    } else {
        Err(RunError::Ranks(errors))
    }
}

/// Holds the rank threads until every one has started: `open(true)` lets them run,
/// `open(false)` sends them home.
#[derive(Default)]
struct Gate {
    go: Mutex<Option<bool>>,
    opened: Condvar,
}

impl Gate {
    fn open(&self, go: bool) {
        *self.go.lock().unwrap_or_else(|e| e.into_inner()) = Some(go);
        self.opened.notify_all();
    }

    fn wait(&self) -> bool {
        let mut go = self.go.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(go) = *go {
                return go;
            }
            go = self.opened.wait(go).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// A barrier with a timeout that any rank can break: a rank whose job failed breaks it, so
/// the others fail at their next wait instead of waiting forever.
///
/// Waiters *spin* on a generation counter (yielding only after 20 ms): timed iterations start
/// right after it, and a waiter woken through the kernel (a futex, 50–200 µs later) would
/// start its rank's collectives that much after its peers', which every rank's timing would
/// then include as waiting.
#[cfg(feature = "cuda")]
pub struct Barrier {
    parties: usize,
    arrived: AtomicUsize,
    generation: AtomicU64,
    broken: AtomicBool,
    why: Mutex<Option<String>>,
}

#[cfg(feature = "cuda")]
impl Barrier {
    /// A barrier for `parties` threads.
    pub fn new(parties: usize) -> Barrier {
        Barrier {
            parties,
            arrived: AtomicUsize::new(0),
            generation: AtomicU64::new(0),
            broken: AtomicBool::new(false),
            why: Mutex::new(None),
        }
    }

    fn broken_error(&self) -> BarrierError {
        let why = self.why.lock().unwrap_or_else(|p| p.into_inner()).clone();
        BarrierError::Broken {
            why: why.unwrap_or_default(),
        }
    }

    /// Waits until every party arrived, the barrier is broken, or `timeout` passed.
    pub fn wait(&self, timeout: Duration) -> Result<(), BarrierError> {
        if self.broken.load(Ordering::Acquire) {
            return Err(self.broken_error());
        }
        // Read before arriving: the generation cannot move until this thread has arrived.
        let generation = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.parties {
            self.arrived.store(0, Ordering::Release);
            self.generation.fetch_add(1, Ordering::Release);
            return Ok(());
        }
        let start = Instant::now();
        let mut spins = 0u64;
        while self.generation.load(Ordering::Acquire) == generation {
            if self.broken.load(Ordering::Acquire) {
                return Err(self.broken_error());
            }
            spins += 1;
            if spins.is_multiple_of(1024) {
                let waited = start.elapsed();
                if waited >= timeout {
                    let why = BarrierError::TimedOut {
                        parties: self.parties,
                        millis: timeout.as_millis(),
                        arrived: self.arrived.load(Ordering::Acquire),
                    };
                    // A barrier that timed out cannot count again: break it for everyone.
                    self.break_with(&why.to_string());
                    return Err(why);
                }
                if waited > Duration::from_millis(20) {
                    std::thread::yield_now();
                }
            }
            std::hint::spin_loop();
        }
        Ok(())
    }

    /// Breaks the barrier: every present and later wait fails with `why`.
    pub fn break_with(&self, why: &str) {
        let mut slot = self.why.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(why.to_string());
        }
        self.broken.store(true, Ordering::Release);
    }
}

/// Why a [`Barrier::wait`] let its thread go before every party arrived.
#[cfg(feature = "cuda")]
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BarrierError {
    /// A rank broke the barrier ([`Barrier::break_with`]), or an earlier wait timed out.
    #[error("the barrier was broken: {why}")]
    Broken {
        /// Why it was broken.
        why: String,
    },
    /// This wait timed out (and broke the barrier for every other party).
    #[error("a barrier of {parties} ranks timed out after {millis} ms ({arrived} arrived)")]
    TimedOut {
        /// The parties it waits for.
        parties: usize,
        /// The timeout, in milliseconds.
        millis: u128,
        /// The parties that had arrived.
        arrived: usize,
    },
}

/// A one-time all-gather of bytes between ranks that are threads of this process (those of a
/// [`World`](crate::calibrate::World), or of a `weave run` on GPUs): how their copy-engine
/// windows meet.
#[cfg(feature = "cuda")]
pub struct Exchange {
    values: Mutex<Vec<Option<Vec<u8>>>>,
    barrier: Barrier,
}

#[cfg(feature = "cuda")]
impl Exchange {
    /// An exchange for `ranks` ranks.
    pub fn new(ranks: usize) -> Arc<Exchange> {
        Arc::new(Exchange {
            values: Mutex::new(vec![None; ranks]),
            barrier: Barrier::new(ranks),
        })
    }

    /// Hands `value` to every rank as rank `rank` and returns every rank's, in rank order,
    /// waiting at most `timeout` for the others.
    pub fn all_gather_as(
        &self,
        rank: usize,
        timeout: Duration,
        value: Vec<u8>,
    ) -> Result<Vec<Vec<u8>>, ExchangeError> {
        let put = |v: &mut Vec<Option<Vec<u8>>>| match v.get_mut(rank) {
            Some(slot) => {
                *slot = Some(value);
                Ok(())
            }
            None => Err(ExchangeError::NoSuchRank {
                rank,
                ranks: v.len(),
            }),
        };
        put(&mut self.values.lock().unwrap_or_else(|p| p.into_inner()))?;
        self.barrier.wait(timeout)?;
        let values = self.values.lock().unwrap_or_else(|p| p.into_inner());
        values
            .iter()
            .enumerate()
            .map(|(r, v)| v.clone().ok_or(ExchangeError::NoValue { rank: r }))
            .collect()
    }

    /// Fails every rank waiting in (or arriving at) the exchange with `why`.
    pub fn break_with(&self, why: &str) {
        self.barrier.break_with(why);
    }
}

/// Why an [`Exchange::all_gather_as`] gathered nothing.
#[cfg(feature = "cuda")]
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExchangeError {
    /// The rank is not one of the exchange's.
    #[error("rank {rank}: an exchange of {ranks} ranks")]
    NoSuchRank {
        /// The rank given.
        rank: usize,
        /// The exchange's rank count.
        ranks: usize,
    },
    /// The ranks did not all arrive: the barrier timed out or was broken.
    #[error(transparent)]
    Barrier(#[from] BarrierError),
    /// A rank passed the barrier without a value.
    #[error("rank {rank} gave no value")]
    NoValue {
        /// The rank.
        rank: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_of(statements: usize) -> RankRun {
        RankRun {
            statements,
            ..RankRun::default()
        }
    }

    #[test]
    fn runs_come_back_in_rank_order_and_every_failure_is_named() {
        let (runs, _) = run_rank_threads(vec![10, 20, 30], |r, x| Ok(run_of(r * 100 + x))).unwrap();
        let statements: Vec<usize> = runs.iter().map(|r| r.statements).collect();
        assert_eq!(statements, [10, 120, 230]);
        let err = run_rank_threads(vec![0, 1, 2], |r, _| {
            if r == 1 {
                panic!("rank 1 panics");
            }
            if r == 2 {
                return Err(ExecError::Program("rank 2 fails".into()));
            }
            Ok(run_of(r))
        })
        .unwrap_err();
        let RunError::Ranks(errors) = err else {
            panic!("expected rank errors, got {err:?}");
        };
        let ranks: Vec<usize> = errors.iter().map(|(r, _)| *r).collect();
        assert_eq!(ranks, [1, 2]);
        assert!(
            errors[0].1.to_string().contains("panicked"),
            "{:?}",
            errors[0]
        );
    }
}

#[cfg(all(test, feature = "cuda"))]
mod bounded_tests {
    use super::*;

    fn run(rank: usize) -> RankRun {
        RankRun {
            statements: rank,
            ..RankRun::default()
        }
    }

    /// The grace after a run's timeout is half of it, between 5 and 30 s.
    #[test]
    fn the_grace_to_stop_is_half_the_timeout_within_5_and_30_s() {
        for (timeout, grace) in [(1, 5), (10, 5), (12, 6), (20, 10), (60, 30), (600, 30)] {
            assert_eq!(
                stop_grace(Duration::from_secs(timeout)),
                Duration::from_secs(grace),
                "timeout {timeout} s"
            );
        }
        assert_eq!(stop_grace(Duration::MAX), Duration::from_secs(30));
    }

    /// Ranks that finish come back in rank order; a rank that does not stop within the limit
    /// is reported stuck (by rank) while the caller returns within the limit; a panicking
    /// rank fails that rank.
    #[test]
    fn bounded_rank_threads_return_in_time_and_name_the_stuck_rank() {
        let (runs, _) =
            run_rank_threads_bounded(vec![0, 1, 2], None, |r, _: i32| Ok(run(r))).unwrap();
        assert_eq!(
            runs.iter().map(|r| r.statements).collect::<Vec<_>>(),
            [0, 1, 2]
        );

        // No rank was left behind by the run that finished; the stuck one is counted (other
        // tests of this process may count theirs: the count only grows).
        let before = stuck_ranks();
        let t0 = Instant::now();
        let err =
            run_rank_threads_bounded(vec![0, 1, 2], Some(Duration::from_secs(2)), |r, _: i32| {
                if r == 1 {
                    std::thread::sleep(Duration::from_secs(20));
                }
                if r == 2 {
                    panic!("boom");
                }
                Ok(run(r))
            })
            .unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
        let RunError::Ranks(errors) = err else {
            panic!("{err}")
        };
        assert_eq!(errors.iter().map(|e| e.0).collect::<Vec<_>>(), [1, 2]);
        assert!(
            errors[0].1.to_string().starts_with("the rank did not stop")
                && errors[0].1.to_string().ends_with("timed out after 2000 ms"),
            "{}",
            errors[0].1
        );
        assert!(errors[1]
            .1
            .to_string()
            .ends_with("the rank's thread panicked"));
        assert!(stuck_ranks() > before, "the stuck rank is counted");
    }
}
