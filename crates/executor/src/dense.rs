//! Dense host tensors for the CPU interpreter: row-major `f64` values tagged with the dtype
//! they stand for, rounding to that dtype, and a deterministic random generator for test
//! inputs.

use rand_xoshiro::rand_core::{Rng, SeedableRng};
use rand_xoshiro::SplitMix64;
use weave_ir::DType;

/// Why values do not make a [`Dense`] tensor: [`Dense::new`] and [`Dense::from_le_bytes`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DenseError {
    /// The element count of the sizes overflows `usize` ([`Dense::new`]).
    #[error("tensor sizes {sizes:?} overflow the element count")]
    Overflow {
        /// The sizes.
        sizes: Vec<usize>,
    },
    /// Not one value per element ([`Dense::new`]).
    #[error("tensor sizes {sizes:?} hold {numel} elements but {values} values were given")]
    ValueCount {
        /// The sizes.
        sizes: Vec<usize>,
        /// Their element count.
        numel: usize,
        /// The values given.
        values: usize,
    },
    /// The element count of the sizes overflows `usize` ([`Dense::from_le_bytes`]).
    #[error("sizes {sizes:?} overflow")]
    BytesOverflow {
        /// The sizes.
        sizes: Vec<usize>,
    },
    /// The bytes are not one element of the dtype per element of the sizes
    /// ([`Dense::from_le_bytes`]).
    #[error("{bytes} bytes do not hold {numel} {dtype} elements of sizes {sizes:?}")]
    ByteCount {
        /// The bytes given.
        bytes: usize,
        /// The element count of the sizes.
        numel: usize,
        /// The dtype.
        dtype: DType,
        /// The sizes.
        sizes: Vec<usize>,
    },
}

/// A dense row-major tensor on the host.
///
/// Values are stored as `f64` whatever the dtype; a tensor of dtype `d` holds values that
/// are representable in `d` once rounded with [`round_to`] (integers for `i64`, `0`/`1` for
/// `bool`). The interpreter computes on these values in `f64`, so `i64` values are exact
/// only within ±2^53.
#[derive(Clone, Debug, PartialEq)]
pub struct Dense {
    /// The element type the values stand for.
    pub dtype: DType,
    /// Extent of each axis, outermost first.
    pub sizes: Vec<usize>,
    /// `sizes.iter().product()` values in row-major order.
    pub data: Vec<f64>,
}

impl Dense {
    /// A tensor from its parts. Fails when `data` does not hold exactly one value per
    /// element of `sizes` (or when the element count overflows `usize`).
    pub fn new(dtype: DType, sizes: Vec<usize>, data: Vec<f64>) -> Result<Dense, DenseError> {
        let Some(numel) = checked_numel(&sizes) else {
            return Err(DenseError::Overflow { sizes });
        };
        if numel != data.len() {
            return Err(DenseError::ValueCount {
                sizes,
                numel,
                values: data.len(),
            });
        }
        Ok(Dense { dtype, sizes, data })
    }

    /// A tensor of zeros.
    pub fn zeros(dtype: DType, sizes: Vec<usize>) -> Dense {
        let numel = sizes.iter().product();
        Dense {
            dtype,
            sizes,
            data: vec![0.0; numel],
        }
    }

    /// The number of elements (the product of the sizes; 1 for a rank-0 tensor).
    pub fn numel(&self) -> usize {
        self.sizes.iter().product()
    }

    /// The tensor with every value rounded to its dtype (see [`round_to`]).
    pub fn rounded(mut self) -> Dense {
        let dtype = self.dtype;
        if dtype != DType::F64 {
            for v in &mut self.data {
                *v = round_to(dtype, *v);
            }
        }
        self
    }

    /// A deterministic pseudo-random tensor: the same `(dtype, sizes, seed)` always gives the
    /// same values, on every platform.
    ///
    /// Floating-point values are uniform in `[-1, 1)` and then rounded to `dtype`; `i64`
    /// values are uniform integers in `[-8, 8]`; `bool` values are `0` or `1`. A tensor with
    /// at least one element is never all zeros (if the draw gives only zeros, the first
    /// element is set to 1).
    ///
    /// The values are allocated as asked: a caller holding sizes from user input checks them
    /// first ([`crate::memory::check_host`]); sizes whose element count overflows give no
    /// values rather than a wrapped count.
    pub fn random(dtype: DType, sizes: Vec<usize>, seed: u64) -> Dense {
        let numel = checked_numel(&sizes).unwrap_or(0);
        Dense::random_into(dtype, sizes, seed, Vec::with_capacity(numel))
    }

    /// [`Dense::random`], `None` when the memory for its values cannot be had (never an
    /// abort) or the element count overflows.
    pub fn try_random(dtype: DType, sizes: Vec<usize>, seed: u64) -> Option<Dense> {
        let numel = checked_numel(&sizes)?;
        let mut data = Vec::new();
        data.try_reserve_exact(numel).ok()?;
        Some(Dense::random_into(dtype, sizes, seed, data))
    }

    /// The values of [`Dense::random`] pushed into `data` (which holds their capacity).
    fn random_into(dtype: DType, sizes: Vec<usize>, seed: u64, mut data: Vec<f64>) -> Dense {
        let numel = checked_numel(&sizes).unwrap_or(0);
        let mut rng = generator(seed);
        data.extend((0..numel).map(|_| {
            let r = rng.next_u64();
            match dtype {
                DType::I64 => (r % 17) as f64 - 8.0,
                DType::Bool => (r >> 63) as f64,
                _ => {
                    // 53 random bits -> [0, 1) -> [-1, 1).
                    let u = (r >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
                    round_to(dtype, 2.0 * u - 1.0)
                }
            }
        }));
        let mut out = Dense { dtype, sizes, data };
        if out.data.iter().all(|v| *v == 0.0) {
            if let Some(first) = out.data.first_mut() {
                *first = 1.0;
            }
        }
        out
    }
}

/// The element count of `sizes`, `None` on overflow.
pub(crate) fn checked_numel(sizes: &[usize]) -> Option<usize> {
    sizes.iter().try_fold(1usize, |acc, s| acc.checked_mul(*s))
}

/// Rounds `x` to the nearest value of `dtype`, returned as `f64`.
///
/// * `bf16`, `f16`: IEEE round-to-nearest-even, directly from `f64` (no double rounding),
///   overflowing to ±∞; NaN stays NaN;
/// * `f32`: `x as f32` (round-to-nearest-even);
/// * `f64`: `x` unchanged;
/// * `i64`: truncation toward zero, `-0` becoming `0` (NaN and ±∞ are kept as they are);
/// * `bool`: `1` when `x != 0` (NaN counts as true), else `0`.
pub fn round_to(dtype: DType, x: f64) -> f64 {
    match dtype {
        DType::BF16 => half::bf16::from_f32(to_f32_round_to_odd(x)).to_f64(),
        DType::F16 => half::f16::from_f32(to_f32_round_to_odd(x)).to_f64(),
        DType::F32 => x as f32 as f64,
        DType::F64 => x,
        // `+ 0.0` turns -0 into 0.
        DType::I64 => x.trunc() + 0.0,
        DType::Bool => {
            if x != 0.0 {
                1.0
            } else {
                0.0
            }
        }
    }
}

/// `x` rounded to `f32` with round-to-odd: an inexact result gets an odd last mantissa bit.
/// Rounding that to a format with at least two fewer significand bits (bf16: 8, f16: 11,
/// against f32's 24; subnormals included) to nearest-even gives the correctly rounded result
/// of `x` itself, which `half`'s own `f64` conversions do not (they drop the low 32 bits of
/// the mantissa before rounding).
fn to_f32_round_to_odd(x: f64) -> f32 {
    let y = x as f32;
    if !y.is_finite() || y as f64 == x {
        return y;
    }
    let bits = y.to_bits();
    if bits & 1 == 1 {
        return y;
    }
    // Sign-magnitude: +1 on the bits moves away from zero, -1 toward zero. `y` is inexact,
    // so `|x|` differs from `|y|`; move to the neighbour on `x`'s side, which has an odd bit.
    if (y as f64).abs() < x.abs() {
        f32::from_bits(bits + 1)
    } else {
        f32::from_bits(bits - 1)
    }
}

/// The generator of [`Dense::random`]: splitmix64 (Steele, Lea and Flood) as the rand
/// project's `rand_xoshiro` implements it, seeded with the seed itself. A named algorithm,
/// unlike `rand`'s `StdRng`, whose stream may change between versions: a seed gives the same
/// tensor on every platform and every version.
fn generator(seed: u64) -> SplitMix64 {
    SplitMix64::seed_from_u64(seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Correct round-to-nearest-even to `p` significand bits with minimum normal exponent
    /// `emin` and largest finite value `max`, by scaling (exact for powers of two).
    fn reference_round(x: f64, p: i32, emin: i32, max: f64) -> f64 {
        if !x.is_finite() || x == 0.0 {
            return x;
        }
        let e = ((x.to_bits() >> 52) & 0x7ff) as i32 - 1023;
        let q = 2f64.powi(e.max(emin) - (p - 1));
        let r = (x / q).round_ties_even() * q;
        if r.abs() > max {
            f64::INFINITY.copysign(x)
        } else {
            r
        }
    }

    /// The generator is splitmix64 itself: its first outputs for seed 0 are the published
    /// ones, so tensors drawn before it came from `rand_xoshiro` keep their values.
    #[test]
    fn random_tensors_follow_the_published_splitmix64_stream() {
        let published: [u64; 3] = [
            0xe220_a839_7b1d_cdaf,
            0x6e78_9e6a_a1b9_65f4,
            0x06c4_5d18_8009_454f,
        ];
        let mut rng = generator(0);
        assert_eq!(published.map(|_| rng.next_u64()), published);
        let ints = Dense::random(DType::I64, vec![3], 0);
        let want: Vec<f64> = published.iter().map(|r| (r % 17) as f64 - 8.0).collect();
        assert_eq!(ints.data, want);
        let unit = |r: u64| (r >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
        let floats = Dense::random(DType::F64, vec![3], 0);
        let want: Vec<f64> = published.iter().map(|r| 2.0 * unit(*r) - 1.0).collect();
        assert_eq!(floats.data, want);
    }

    #[test]
    fn bf16_and_f16_round_to_nearest_even_from_f64() {
        let bf16_max = half::bf16::MAX.to_f64();
        let f16_max = half::f16::MAX.to_f64();
        let mut rng = generator(7);
        let mut cases = vec![
            1.0 + 2f64.powi(-8),                  // tie: to even (1.0)
            1.0 + 3.0 * 2f64.powi(-8),            // tie: to even (1 + 2^-6)
            1.0 + 2f64.powi(-8) + 2f64.powi(-40), // just above a tie: up (half gets this wrong)
            1.0 + 2f64.powi(-11) + 2f64.powi(-45),
            -(1.0 + 2f64.powi(-8) + 2f64.powi(-40)),
            65519.0,
            65520.0,
            1e-8,
            2f64.powi(-24) * 1.5,
            3.0e38,
            3.5e38,
            1e-300,
        ];
        for _ in 0..20_000 {
            let r = rng.next_u64();
            let m = (r >> 11) as f64 / (1u64 << 53) as f64;
            let e = ((r & 0x3f) as i32) - 32;
            cases.push((2.0 * m - 1.0) * 2f64.powi(e));
        }
        for x in cases {
            let want = reference_round(x, 8, -126, bf16_max);
            assert_eq!(round_to(DType::BF16, x), want, "bf16 of {x:e}");
            let want = reference_round(x, 11, -14, f16_max);
            assert_eq!(round_to(DType::F16, x), want, "f16 of {x:e}");
        }
        assert!(round_to(DType::BF16, f64::NAN).is_nan());
        assert_eq!(round_to(DType::F16, f64::NEG_INFINITY), f64::NEG_INFINITY);
    }

    #[test]
    fn integer_and_bool_rounding() {
        assert_eq!(round_to(DType::I64, -2.7), -2.0);
        assert_eq!(round_to(DType::I64, 2.7), 2.0);
        assert_eq!(round_to(DType::Bool, -0.5), 1.0);
        assert_eq!(round_to(DType::Bool, 0.0), 0.0);
        assert_eq!(round_to(DType::F32, 0.1), 0.1f32 as f64);
        assert_eq!(round_to(DType::F64, 0.1), 0.1);
    }

    #[test]
    fn new_checks_the_value_count() {
        assert!(Dense::new(DType::F32, vec![2, 3], vec![0.0; 6]).is_ok());
        assert_eq!(
            Dense::new(DType::F32, vec![2, 3], vec![0.0; 5])
                .unwrap_err()
                .to_string(),
            "tensor sizes [2, 3] hold 6 elements but 5 values were given"
        );
        assert_eq!(Dense::zeros(DType::I64, vec![]).numel(), 1);
        assert_eq!(
            Dense::new(DType::F32, vec![3, 1], vec![0.25, 1.0 / 3.0, 7.0])
                .unwrap()
                .rounded()
                .data,
            vec![0.25, (1.0f32 / 3.0) as f64, 7.0]
        );
    }
}

/// Bytes per element of `d` on a device.
pub fn elem_bytes(d: DType) -> usize {
    match d {
        DType::Bool => 1,
        DType::BF16 | DType::F16 => 2,
        DType::F32 => 4,
        DType::F64 | DType::I64 => 8,
    }
}

impl Dense {
    /// The values as a device holds them: little-endian elements of the dtype.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.data.len() * elem_bytes(self.dtype));
        for &v in &self.data {
            match self.dtype {
                DType::BF16 => out.extend(half::bf16::from_f64(v).to_bits().to_le_bytes()),
                DType::F16 => out.extend(half::f16::from_f64(v).to_bits().to_le_bytes()),
                DType::F32 => out.extend((v as f32).to_le_bytes()),
                DType::F64 => out.extend(v.to_le_bytes()),
                DType::I64 => out.extend((v as i64).to_le_bytes()),
                DType::Bool => out.push(u8::from(v != 0.0)),
            }
        }
        out
    }

    /// A tensor of `sizes` from little-endian elements of `dtype`; errors when the byte count
    /// does not match.
    pub fn from_le_bytes(
        dtype: DType,
        sizes: Vec<usize>,
        bytes: &[u8],
    ) -> Result<Dense, DenseError> {
        let w = elem_bytes(dtype);
        let Some(n) = checked_numel(&sizes) else {
            return Err(DenseError::BytesOverflow { sizes });
        };
        if bytes.len() != n * w {
            return Err(DenseError::ByteCount {
                bytes: bytes.len(),
                numel: n,
                dtype,
                sizes,
            });
        }
        let data = bytes
            .chunks_exact(w)
            .map(|c| match dtype {
                DType::BF16 => half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f64(),
                DType::F16 => half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f64(),
                DType::F32 => f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
                DType::F64 => f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]),
                DType::I64 => {
                    i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f64
                }
                DType::Bool => f64::from(c[0] != 0),
            })
            .collect();
        Ok(Dense { dtype, sizes, data })
    }
}

#[cfg(test)]
mod byte_tests {
    use super::*;

    #[test]
    fn le_bytes_round_trip_every_dtype() {
        for dtype in DType::ALL {
            let data: Vec<f64> = match dtype {
                DType::Bool => vec![0.0, 1.0, 1.0],
                _ => vec![-2.0, 1.0, 3.0],
            };
            let d = Dense {
                dtype,
                sizes: vec![3],
                data,
            };
            let back = Dense::from_le_bytes(dtype, vec![3], &d.to_le_bytes()).unwrap();
            assert_eq!(back, d, "{dtype}");
        }
        assert_eq!(
            Dense::from_le_bytes(DType::F32, vec![2], &[0u8; 7])
                .unwrap_err()
                .to_string(),
            "7 bytes do not hold 2 f32 elements of sizes [2]"
        );
    }
}
