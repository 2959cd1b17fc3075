//! An executable's outputs: the global outputs put back together from every rank's run, the
//! f64 reference outputs of the definition, and the check of every rank's outputs against
//! them.

use weave_executor::reference::{compare_with, output_tolerances, run_reference, Tolerance};
use weave_executor::{Dense, RankRun};

use super::{Error, Executable};
use crate::run::{OutputCheck, RunError};
use crate::tensor::{Outputs, Tensor};

impl Executable {
    /// The global outputs put back together from every rank's run.
    pub fn gather_outputs(&self, runs: &[RankRun]) -> Result<Outputs, Error> {
        let mut entries = Vec::new();
        for (k, s) in self.outputs().iter().enumerate() {
            let mut locals: Vec<&[f64]> = Vec::with_capacity(runs.len());
            for (rank, run) in runs.iter().enumerate() {
                match run.outputs.get(k) {
                    Some(d) => locals.push(&d.data),
                    None if !s.holds(rank) => locals.push(&[]),
                    None => {
                        return Err(Error::Program(format!(
                            "rank {rank} returned no output `{}`",
                            s.name
                        )))
                    }
                }
            }
            let data = s
                .unshard(&locals, f64::NAN)
                .map_err(|e| Error::Program(e.to_string()))?;
            let dense = Dense {
                dtype: s.dtype,
                sizes: s.shape.clone(),
                data,
            };
            entries.push((s.name.clone(), Tensor::from_dense(&dense)));
        }
        Ok(Outputs { entries })
    }

    /// The f64 reference outputs of the definition on the global inputs.
    pub fn reference(&self, globals: &[Dense]) -> Result<Vec<Dense>, Error> {
        let def = self.signature().definition.as_ref().ok_or_else(|| {
            Error::Program(
                "the program has no `Definition:` block, so there is no reference to check against (run it without checking: `--no-check`, `RunOptions::check = false`)".into(),
            )
        })?;
        // The definition's parameters are those the program was compiled with.
        let mut def = def.clone();
        for (k, v) in &self.signature().params {
            if def.param(k).is_some() {
                def.set_param(k, *v)
                    .map_err(|d| Error::Program(d.message))?;
            }
        }
        run_reference(&def, globals).map_err(|e| Error::Run(RunError::Reference(e.to_string())))
    }

    /// Compares every rank's outputs with the shards of the reference outputs it holds, each
    /// at the tolerance of its dtype loosened by the least precise rounding on its path
    /// ([`output_tolerances`] of the definition).
    pub fn check(&self, reference: &[Dense], runs: &[RankRun]) -> Result<Vec<OutputCheck>, Error> {
        let tolerances = self
            .signature()
            .definition
            .as_ref()
            .map(output_tolerances)
            .unwrap_or_default();
        let mut checks = Vec::new();
        for (k, s) in self.outputs().iter().enumerate() {
            let want = reference.get(k).ok_or_else(|| {
                Error::Run(RunError::Reference(format!(
                    "the reference produced no output {k}"
                )))
            })?;
            for (rank, run) in runs.iter().enumerate() {
                if !s.holds(rank) {
                    continue;
                }
                let expected = s
                    .shard(&want.data, rank)
                    .map_err(|e| Error::Program(e.to_string()))?;
                let got = run.outputs.get(k).ok_or_else(|| {
                    Error::Program(format!("rank {rank} returned no output `{}`", s.name))
                })?;
                let tol = tolerances
                    .get(k)
                    .copied()
                    .unwrap_or_else(|| Tolerance::for_dtype(want.dtype));
                let mut comparison = compare_with(&got.data, &expected, tol);
                if got.data.len() != expected.len() {
                    comparison.ok = false;
                }
                checks.push(OutputCheck {
                    output: s.name.clone(),
                    rank,
                    comparison,
                });
            }
        }
        Ok(checks)
    }
}
