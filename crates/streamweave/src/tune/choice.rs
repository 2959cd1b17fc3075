//! Choosing the tuning's winner: the final round that measures the finalists again, and the
//! choice among measured candidates (ties go to the simplest).

use std::time::Duration;

use super::{Candidate, Outcome, Row, FINALISTS, TIE_MARGIN};
use crate::executable::Executable;
use crate::tune::Measure;

/// Measures the finalists ([`finalists`]) up to `rounds` times each, in turn, while `go_on`
/// (the rows, the round about to start, from 0) allows each round after the first, and records each as [`Outcome::Confirmed`] with its fresh figures,
/// or as failed when a fresh run fails. `exe_of` gives a candidate's compiled program.
pub(super) fn final_round<'a>(
    rows: &mut [Row],
    rounds: usize,
    measure: &mut dyn Measure,
    exe_of: &dyn Fn(&Candidate) -> Option<&'a Executable>,
    go_on: &dyn Fn(&[Row], usize) -> bool,
) {
    let finalists = finalists(rows);
    if finalists.len() < 2 {
        return;
    }
    let mut fresh: Vec<Vec<Duration>> = vec![Vec::new(); finalists.len()];
    let mut failed: Vec<Option<String>> = vec![None; finalists.len()];
    for round in 0..rounds {
        if round > 0 && !go_on(rows, round) {
            break;
        }
        for (j, &i) in finalists.iter().enumerate() {
            let candidate = rows[i].candidate;
            if failed[j].is_some() {
                continue;
            }
            let Some(exe) = exe_of(&candidate) else {
                continue;
            };
            match measure.measure(exe, &candidate) {
                Ok(t) => fresh[j].push(t),
                // A candidate that fails when it runs again is no safe winner.
                Err(m) => failed[j] = Some(m.0),
            }
        }
    }
    for (j, &i) in finalists.iter().enumerate() {
        let Outcome::Measured(first) = rows[i].outcome else {
            continue;
        };
        if let Some(m) = failed[j].take() {
            rows[i].outcome = Outcome::Failed(format!(
                "measured at {:.3} ms, then failed when measured again: {m}",
                first.as_secs_f64() * 1e3
            ));
        } else if !fresh[j].is_empty() {
            rows[i].outcome = Outcome::Confirmed {
                first,
                again: std::mem::take(&mut fresh[j]),
            };
        }
    }
}

/// The median of `figures` (of an even count, the mean of the middle two); `None` when empty.
pub(super) fn median(figures: &[Duration]) -> Option<Duration> {
    let mut v = figures.to_vec();
    v.sort_unstable();
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2),
    }
}

/// The final round's candidates, in this order: the [`FINALISTS`] fastest measured rows, the
/// one the search's figures would choose (the simplest of those that tie with the fastest)
/// and the simplest measured one ([`simplicity`]).
fn finalists(rows: &[Row]) -> Vec<usize> {
    let mut measured: Vec<(usize, Duration)> = rows
        .iter()
        .enumerate()
        .filter_map(|(i, r)| match r.outcome {
            Outcome::Measured(t) => Some((i, t)),
            _ => None,
        })
        .collect();
    measured.sort_by_key(|&(i, t)| (t, i));
    let mut out: Vec<usize> = measured.iter().take(FINALISTS).map(|&(i, _)| i).collect();
    let simplest = measured
        .iter()
        .map(|&(i, _)| i)
        .min_by_key(|&i| simplicity(&rows[i].candidate, i));
    for i in [choose(rows), simplest].into_iter().flatten() {
        if !out.contains(&i) {
            out.push(i);
        }
    }
    out
}

/// What ties are broken by: fewer chunks (a program's chunks as written first), then fewer
/// streams, then fewer knobs, then replay on, then the earlier row.
fn simplicity(c: &Candidate, row: usize) -> (usize, usize, usize, bool, usize) {
    (c.chunks.unwrap_or(0), c.streams, c.knobs(), !c.replay, row)
}

/// The winner among measured rows (among the final round's, when it ran): of those within
/// [`TIE_MARGIN`] of the fastest, the simplest ([`simplicity`]).
pub(super) fn choose(rows: &[Row]) -> Option<usize> {
    let finalists = rows
        .iter()
        .any(|r| matches!(r.outcome, Outcome::Confirmed { .. }));
    let eligible = |r: &Row| !finalists || matches!(r.outcome, Outcome::Confirmed { .. });
    let fastest = rows
        .iter()
        .filter(|r| eligible(r))
        .filter_map(|r| r.outcome.time())
        .min()?;
    let limit = fastest.as_secs_f64() * (1.0 + TIE_MARGIN);
    rows.iter()
        .enumerate()
        .filter(|(_, r)| eligible(r))
        .filter(|(_, r)| r.outcome.time().is_some_and(|t| t.as_secs_f64() <= limit))
        .min_by_key(|(i, r)| simplicity(&r.candidate, *i))
        .map(|(i, _)| i)
}
