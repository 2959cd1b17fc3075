//! Before a run: the inputs against the program's signature and the teams against the world;
//! and the scalar evaluation and lazily built names that checks and statements share.

use std::collections::HashMap;

use weave_host_ir::ids::SecondaryMap;
use weave_host_ir::{HostProgram, HostScalar, HostTensorId, Names, ScalarId, Stmt, StmtId};
use weave_ir::{DType, Scalar};

use super::RunConfig;
use crate::dense::Dense;
use crate::error::ExecError;

/// Checks `inputs` against the signature of `program` for a world of `world` ranks without
/// running anything.
pub fn check_inputs(
    program: &HostProgram,
    inputs: &[Dense],
    config: &RunConfig,
    rank: usize,
    world: usize,
) -> Result<(), ExecError> {
    let given: Vec<(DType, &[usize])> = inputs
        .iter()
        .map(|d| (d.dtype, d.sizes.as_slice()))
        .collect();
    check_signature(program, &given, config, rank, world)
}

/// Checks inputs given as (dtype, sizes) against the signature of `program`.
pub(super) fn check_signature(
    program: &HostProgram,
    inputs: &[(DType, &[usize])],
    config: &RunConfig,
    rank: usize,
    world: usize,
) -> Result<(), ExecError> {
    let mut names = LazyNames::new(program);
    let scalars = Scalars {
        program,
        params: &config.params,
        rank: rank as i64,
        number_of_streams: config.number_of_streams as i64,
        bound: SecondaryMap::new(),
    };
    if inputs.len() != program.inputs.len() {
        return Err(ExecError::Input(format!(
            "the program takes {} inputs but {} were given",
            program.inputs.len(),
            inputs.len()
        )));
    }
    for (k, (&t, &(given_dtype, given_sizes))) in program.inputs.iter().zip(inputs).enumerate() {
        // Named only in a message: building the names costs more than the check.
        let name = &mut |names: &mut LazyNames| names.tensor(t);
        let decl = program.tensors.get(t).ok_or_else(|| {
            ExecError::Program(format!("input {k} is not a tensor of the program"))
        })?;
        if decl.dtype != given_dtype {
            return Err(ExecError::Input(format!(
                "input {k} ({}) must be {} but a {} tensor was given",
                name(&mut names),
                decl.dtype.name(),
                given_dtype.name()
            )));
        }
        if decl.sizes.len() != given_sizes.len() {
            return Err(ExecError::Input(format!(
                "input {k} ({}) has {} axes but the given tensor has {} (sizes {:?})",
                name(&mut names),
                decl.sizes.len(),
                given_sizes.len(),
                given_sizes
            )));
        }
        for (axis, (&s, &n)) in decl.sizes.iter().zip(given_sizes).enumerate() {
            let want = scalars.eval(s, &mut names)?;
            if want != n as i64 {
                let expr = names.scalar(program, s);
                let expr = if expr == want.to_string() {
                    String::new()
                } else {
                    format!(" = {expr}")
                };
                return Err(ExecError::Input(format!(
                    "input {k} ({}) axis {axis} must have size {want}{expr} but has {n}",
                    name(&mut names)
                )));
            }
        }
    }
    for w in program.walk() {
        if let Some(Stmt::Communication(c)) = program.stmts.get(w.stmt) {
            let devices = c.teams.iter().flatten();
            if let Some(&bad) = devices.clone().find(|&&d| d < 0 || d as usize >= world) {
                return Err(ExecError::Input(format!(
                    "`{}` needs device {bad} but only {world} rank(s) run the program",
                    names.stmt(program, w.stmt)
                )));
            }
        }
    }
    Ok(())
}

/// The program's names, built on first use: only messages need them.
pub(super) struct LazyNames<'p> {
    program: &'p HostProgram,
    names: Option<Names>,
}

impl<'p> LazyNames<'p> {
    pub(super) fn new(program: &'p HostProgram) -> LazyNames<'p> {
        LazyNames {
            program,
            names: None,
        }
    }

    pub(super) fn get(&mut self) -> &mut Names {
        let program = self.program;
        self.names.get_or_insert_with(|| Names::of(program))
    }

    pub(super) fn tensor(&mut self, t: HostTensorId) -> String {
        self.get().tensor(t)
    }

    pub(super) fn scalar(&mut self, program: &HostProgram, s: ScalarId) -> String {
        self.get().scalar(program, s)
    }

    pub(super) fn stmt(&mut self, program: &HostProgram, s: StmtId) -> String {
        self.get().stmt(program, s)
    }
}

/// Scalar evaluation with the bindings current at a point of the walk.
pub(super) struct Scalars<'p> {
    pub(super) program: &'p HostProgram,
    pub(super) params: &'p HashMap<String, i64>,
    pub(super) rank: i64,
    pub(super) number_of_streams: i64,
    pub(super) bound: SecondaryMap<ScalarId, i64>,
}

impl Scalars<'_> {
    pub(super) fn eval(&self, s: ScalarId, names: &mut LazyNames) -> Result<i64, ExecError> {
        self.eval_depth(s, names, 0)
    }

    pub(super) fn eval_depth(
        &self,
        s: ScalarId,
        names: &mut LazyNames,
        depth: usize,
    ) -> Result<i64, ExecError> {
        let fail = |names: &mut LazyNames, why: &str| {
            ExecError::Program(format!(
                "cannot evaluate `{}`: {why}",
                names.scalar(self.program, s)
            ))
        };
        if depth > 256 {
            return Err(fail(names, "the expression is cyclic"));
        }
        match self.program.scalars.get(s) {
            None => Err(fail(names, "not a scalar of the program")),
            Some(HostScalar::LoopIndex) => match self.bound.get(s) {
                Some(&v) => Ok(v),
                None => Err(fail(names, "the loop index is read outside its loop")),
            },
            Some(HostScalar::Value(v)) => {
                // A built-in's name is never a parameter's (both text formats refuse it), and
                // the built-ins are looked up first.
                let lookup = |n: &str| match weave_ir::Builtin::from_name(n) {
                    Some(weave_ir::Builtin::Rank) => Some(self.rank),
                    Some(weave_ir::Builtin::NumberOfStreams) => Some(self.number_of_streams),
                    None => self.params.get(n).copied(),
                };
                match v.eval(&lookup) {
                    Some(x) => Ok(x),
                    None => {
                        let missing: Vec<String> = v
                            .symbols()
                            .iter()
                            .filter(|n| lookup(n).is_none())
                            .map(|n| n.to_string())
                            .collect();
                        if missing.is_empty() {
                            Err(fail(names, "division by zero or overflow"))
                        } else {
                            Err(fail(names, &format!("no value for {}", missing.join(", "))))
                        }
                    }
                }
            }
            Some(HostScalar::Binary(op, a, b)) => {
                let a = self.eval_depth(*a, names, depth + 1)?;
                let b = self.eval_depth(*b, names, depth + 1)?;
                Scalar::binary(*op, Scalar::c(a), Scalar::c(b))
                    .eval(&|_| None)
                    .ok_or_else(|| fail(names, "division by zero or overflow"))
            }
        }
    }
}
