//! One thread per rank: the spawn-and-join loop that the CPU ranks ([`crate::run`]) and the
//! GPU ranks ([`crate::gpu`]) both run on.

use std::time::{Duration, Instant};

use weave_executor::{ExecError, RankRun};

use crate::setup::RunError;

/// Runs `rank(r, input)` for every rank `r` of `inputs` on its own scoped thread and waits for
/// them all: every rank's run in rank order with the wall time of the whole, or every failed
/// rank's error (a panicking rank's thread fails that rank, not the caller).
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
    let results: Vec<Result<RankRun, ExecError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = inputs
            .into_iter()
            .enumerate()
            .map(|(r, input)| scope.spawn(move || rank(r, input)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(ExecError::Program("the rank's thread panicked".into()))
                })
            })
            .collect()
    });
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
