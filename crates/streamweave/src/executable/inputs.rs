//! An executable's inputs: seeded random ones (with the definition's draws and domains),
//! the check that they fit in host memory, named tensors bound to the signature, and each
//! rank's shards of them.

use std::collections::HashMap;

use weave_executor::reference::keep_in_domain;
use weave_executor::Dense;
use weave_host_ir::TensorSig;
use weave_ir::Fusion;

use super::{Error, Executable};
use crate::tensor::Tensor;

impl Executable {
    /// Seeded random global inputs, one per signature input. Their sizes are checked first
    /// ([`Executable::check_memory`]): a shape whose element count overflows, or inputs that
    /// do not fit in the host memory available, are an error naming the tensor and the bytes.
    ///
    /// Where the program carries its definition, values stay inside the domains of the ops
    /// that read them ([`keep_in_domain`]): the divisor of an integer `div` has no zeros, the
    /// exponent of an integer `pow` and the operand of `log` or `sqrt` no negative values, the
    /// ids of an `index_select` lie in its table's rows. Declared draws are applied first.
    pub fn random_inputs(&self, seed: u64) -> Result<Vec<Dense>, Error> {
        self.check_memory(0)?;
        let mut inputs: Vec<Dense> = self
            .inputs()
            .iter()
            .enumerate()
            .map(|(k, t)| {
                let seed = seed.wrapping_add(k as u64 * 0x9e37_79b9);
                weave_executor::memory::allocate_host(
                    &format!("input `{}` {}{:?}", t.name, t.dtype, t.shape),
                    &t.shape,
                    size_of::<f64>(),
                    || Dense::try_random(t.dtype, t.shape.clone(), seed),
                )
                .map_err(|e| Error::Input {
                    tensor: t.name.clone(),
                    message: e.to_string(),
                })
            })
            .collect::<Result<_, _>>()?;
        if let Some(def) = &self.signature().definition {
            // Draws map the seeded values as they were generated; the domains then move
            // what an op cannot take (an id outside its table) and keep the rest.
            apply_draws(def, self.inputs(), &mut inputs);
            keep_in_domain(def, &mut inputs);
        }
        Ok(inputs)
    }

    /// Checks, before anything is allocated, that the global inputs and `ranks` ranks' shards
    /// of them fit in this machine's memory as a run holds them on the host (`f64` values):
    /// every element count must be finite, and their bytes, added up input by input, must
    /// stay within the host memory available. The error names the input that goes over and
    /// the bytes asked for against those available.
    pub fn check_memory(&self, ranks: usize) -> Result<(), Error> {
        use weave_executor::memory;
        let value = size_of::<f64>();
        let available = memory::available_host_bytes();
        let mut total: u64 = 0;
        for t in self.inputs() {
            let what = match ranks {
                0 => format!("input `{}` {}{:?}", t.name, t.dtype, t.shape),
                n => format!(
                    "input `{}` {}{:?} (the global tensor and the shards of {n} rank(s))",
                    t.name, t.dtype, t.shape
                ),
            };
            let input_error = |message: String| Error::Input {
                tensor: t.name.clone(),
                message,
            };
            let global = memory::bytes_of(&t.shape, value)
                .ok_or_else(|| input_error(memory::overflow("its global tensor", &t.shape)))?;
            let mut shards: u64 = 0;
            for rank in 0..ranks {
                if t.holds(rank) {
                    let local = t.local_sizes_of(rank);
                    let b = memory::bytes_of(&local, value)
                        .ok_or_else(|| input_error(memory::overflow("its shard", &local)))?;
                    shards = shards.saturating_add(b);
                }
            }
            total = total.saturating_add(global).saturating_add(shards);
            if total >= memory::CHECK_ABOVE_BYTES {
                memory::check_fits(&what, total, available)
                    .map_err(|e| Error::Program(e.to_string()))?;
            }
            if usize::try_from(global).map_or(true, |b| b > isize::MAX as usize) {
                return Err(Error::Program(format!(
                    "{what} needs {global} bytes, more than one buffer can hold"
                )));
            }
        }
        Ok(())
    }

    /// Matches named inputs to the signature: each exactly once, with its dtype and global
    /// sizes.
    pub fn bind(&self, inputs: &[(&str, &Tensor)]) -> Result<Vec<Dense>, Error> {
        let mut by_name: HashMap<&str, &Tensor> = HashMap::new();
        for (name, t) in inputs {
            if !self.inputs().iter().any(|s| s.name == *name) {
                let known: Vec<&str> = self.inputs().iter().map(|s| s.name.as_str()).collect();
                return Err(Error::Input {
                    tensor: name.to_string(),
                    message: format!(
                        "the program has no such input (it has: {})",
                        known.join(", ")
                    ),
                });
            }
            if by_name.insert(name, t).is_some() {
                return Err(Error::Input {
                    tensor: name.to_string(),
                    message: "given twice".into(),
                });
            }
        }
        self.inputs()
            .iter()
            .map(|s| {
                let t = by_name.get(s.name.as_str()).ok_or_else(|| Error::Input {
                    tensor: s.name.clone(),
                    message: "not given".into(),
                })?;
                if t.dtype() != s.dtype {
                    return Err(Error::Input {
                        tensor: s.name.clone(),
                        message: format!("is {} but the program takes {}", t.dtype(), s.dtype),
                    });
                }
                if t.shape() != s.shape.as_slice() {
                    return Err(Error::Input {
                        tensor: s.name.clone(),
                        message: format!(
                            "has shape {:?} but the program takes {:?}",
                            t.shape(),
                            s.shape
                        ),
                    });
                }
                Ok(t.to_dense())
            })
            .collect()
    }

    /// Rank `rank`'s buffers of the global inputs.
    pub fn shard_inputs(&self, globals: &[Dense], rank: usize) -> Result<Vec<Dense>, Error> {
        self.inputs()
            .iter()
            .zip(globals)
            .map(|(s, g)| {
                let data = s.shard(&g.data, rank).map_err(|e| Error::Input {
                    tensor: s.name.clone(),
                    message: e.to_string(),
                })?;
                Ok(Dense {
                    dtype: g.dtype,
                    sizes: s.local_sizes_of(rank),
                    data,
                })
            })
            .collect()
    }
}

/// Redraws the generated values of every input whose declaration in `def` says how
/// ([`weave_ir::Draw`]): `uniform(lo, hi)` maps each seeded value (uniform in its own range)
/// onto `[lo, hi)` — floored for integers — and `const(v)` fills; each value rounded to the
/// input's dtype.
fn apply_draws(def: &Fusion, sigs: &[TensorSig], inputs: &mut [Dense]) {
    for (sig, input) in sigs.iter().zip(inputs.iter_mut()) {
        let Some(t) = def
            .inputs()
            .iter()
            .copied()
            .find(|t| def.tensor(*t).name == sig.name)
        else {
            continue;
        };
        let Some(draw) = def.draw(t) else {
            continue;
        };
        let dtype = input.dtype;
        let integer = matches!(dtype, weave_ir::DType::I64);
        for v in &mut input.data {
            let x = match draw {
                weave_ir::Draw::Const(c) => c,
                weave_ir::Draw::Uniform(lo, hi) => {
                    // The seeded value's place in its own range: [-1, 1) for floats, the
                    // integers -8..=8 for i64.
                    let u = if integer {
                        (*v + 8.0) / 17.0
                    } else {
                        (*v + 1.0) / 2.0
                    };
                    let x = lo + (hi - lo) * u.clamp(0.0, 1.0);
                    if integer {
                        x.floor().min(hi.ceil() - 1.0).max(lo.ceil())
                    } else {
                        x
                    }
                }
            };
            *v = weave_executor::dense::round_to(dtype, x);
        }
    }
}
