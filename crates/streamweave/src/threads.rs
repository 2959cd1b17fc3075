//! One thread per rank: the spawn-and-join loop that the CPU ranks ([`crate::run`]) and the
//! GPU ranks ([`crate::gpu`]) both run on.

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
