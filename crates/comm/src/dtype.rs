//! Element types and reduction operators as the communication layer sees them (NCCL's
//! `ncclDataType_t` and `ncclRedOp_t`), independent of any IR.

use std::fmt;

/// The element type of a communicated buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    /// One byte per element, 0 or 1.
    Bool,
    /// 64-bit signed integer.
    I64,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
}

impl DataType {
    /// Every type, in a fixed order.
    pub const ALL: [DataType; 6] = [
        DataType::Bool,
        DataType::I64,
        DataType::F16,
        DataType::Bf16,
        DataType::F32,
        DataType::F64,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DataType::Bool => 1,
            DataType::F16 | DataType::Bf16 => 2,
            DataType::F32 => 4,
            DataType::I64 | DataType::F64 => 8,
        }
    }

    /// The short name used in messages (`bf16`, `f32`, …).
    pub fn name(self) -> &'static str {
        match self {
            DataType::Bool => "bool",
            DataType::I64 => "i64",
            DataType::F16 => "f16",
            DataType::Bf16 => "bf16",
            DataType::F32 => "f32",
            DataType::F64 => "f64",
        }
    }

    /// Whether the type is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F16 | DataType::Bf16 | DataType::F32 | DataType::F64
        )
    }

    /// `x` rounded to the nearest value this type can hold (round-to-nearest-even for the
    /// floating types, truncation toward zero with saturation for `i64`, `x != 0` for bool),
    /// returned as `f64`.
    pub fn round(self, x: f64) -> f64 {
        match self {
            DataType::Bool => f64::from(u8::from(x != 0.0)),
            DataType::I64 => {
                if x.is_nan() {
                    0.0
                } else {
                    (x.trunc() as i64) as f64
                }
            }
            DataType::F16 => half::f16::from_f64(x).to_f64(),
            DataType::Bf16 => half::bf16::from_f64(x).to_f64(),
            DataType::F32 => f64::from(x as f32),
            DataType::F64 => x,
        }
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a reducing collective combines the members' buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RedOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
}

impl RedOp {
    /// The printed name (`sum`, …).
    pub fn name(self) -> &'static str {
        match self {
            RedOp::Sum => "sum",
            RedOp::Prod => "prod",
            RedOp::Max => "max",
            RedOp::Min => "min",
        }
    }

    /// The identity of the operator.
    pub fn identity(self) -> f64 {
        match self {
            RedOp::Sum => 0.0,
            RedOp::Prod => 1.0,
            RedOp::Max => f64::NEG_INFINITY,
            RedOp::Min => f64::INFINITY,
        }
    }

    /// `a op b`.
    pub fn combine(self, a: f64, b: f64) -> f64 {
        match self {
            RedOp::Sum => a + b,
            RedOp::Prod => a * b,
            RedOp::Max => a.max(b),
            RedOp::Min => a.min(b),
        }
    }
}
