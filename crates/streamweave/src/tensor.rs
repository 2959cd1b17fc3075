//! Global tensors on the host in their own element type ([`Tensor`], [`Data`]) and the named
//! outputs of a run ([`Outputs`]): what a user hands to and gets back from
//! [`crate::Executable::run`].

use half::{bf16, f16};
use weave_executor::Dense;
use weave_ir::DType;

use crate::setup::RunError;

/// The element values of a host tensor, in its own element type.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    /// `f32`.
    F32(Vec<f32>),
    /// `f64`.
    F64(Vec<f64>),
    /// `bf16`.
    BF16(Vec<bf16>),
    /// `f16`.
    F16(Vec<f16>),
    /// `i64`.
    I64(Vec<i64>),
    /// `bool`.
    Bool(Vec<bool>),
}

macro_rules! data_from {
    ($($t:ty => $v:ident),*) => {$(
        impl From<Vec<$t>> for Data {
            fn from(v: Vec<$t>) -> Data {
                Data::$v(v)
            }
        }
    )*};
}
data_from!(f32 => F32, f64 => F64, bf16 => BF16, f16 => F16, i64 => I64, bool => Bool);

impl Data {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Data::F32(_) => DType::F32,
            Data::F64(_) => DType::F64,
            Data::BF16(_) => DType::BF16,
            Data::F16(_) => DType::F16,
            Data::I64(_) => DType::I64,
            Data::Bool(_) => DType::Bool,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            Data::F32(v) => v.len(),
            Data::F64(v) => v.len(),
            Data::BF16(v) => v.len(),
            Data::F16(v) => v.len(),
            Data::I64(v) => v.len(),
            Data::Bool(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every value widened to `f64` (exact for every element type but `i64` beyond 2^53).
    pub fn to_f64(&self) -> Vec<f64> {
        match self {
            Data::F32(v) => v.iter().map(|x| f64::from(*x)).collect(),
            Data::F64(v) => v.clone(),
            Data::BF16(v) => v.iter().map(|x| x.to_f64()).collect(),
            Data::F16(v) => v.iter().map(|x| x.to_f64()).collect(),
            Data::I64(v) => v.iter().map(|x| *x as f64).collect(),
            Data::Bool(v) => v.iter().map(|x| f64::from(u8::from(*x))).collect(),
        }
    }

    /// `values` (already of `dtype`'s precision) in `dtype`.
    fn from_f64(dtype: DType, values: &[f64]) -> Data {
        match dtype {
            DType::F32 => Data::F32(values.iter().map(|x| *x as f32).collect()),
            DType::F64 => Data::F64(values.to_vec()),
            DType::BF16 => Data::BF16(values.iter().map(|x| bf16::from_f64(*x)).collect()),
            DType::F16 => Data::F16(values.iter().map(|x| f16::from_f64(*x)).collect()),
            DType::I64 => Data::I64(values.iter().map(|x| *x as i64).collect()),
            DType::Bool => Data::Bool(values.iter().map(|x| *x != 0.0).collect()),
        }
    }
}

/// A global tensor on the host: row-major values with their shape.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    shape: Vec<usize>,
    data: Data,
}

impl Tensor {
    /// A tensor of `shape` holding `data` (row-major); fails when the element count differs.
    pub fn new(shape: Vec<usize>, data: impl Into<Data>) -> Result<Tensor, RunError> {
        let data = data.into();
        let numel = shape.iter().try_fold(1usize, |a, &b| a.checked_mul(b));
        if numel != Some(data.len()) {
            return Err(RunError::Setup(format!(
                "a tensor of shape {shape:?} holds {} elements, not {}",
                numel.map_or_else(|| "too many".to_string(), |n| n.to_string()),
                data.len()
            )));
        }
        Ok(Tensor { shape, data })
    }

    /// The shape: the size of every axis, outermost first (the name NumPy, PyTorch and the
    /// Python package use).
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The shape, under its earlier name.
    #[deprecated(
        since = "0.1.0",
        note = "use `Tensor::shape`, the one name for a shape"
    )]
    pub fn sizes(&self) -> &[usize] {
        &self.shape
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    /// The values.
    pub fn data(&self) -> &Data {
        &self.data
    }

    /// The values when the tensor is `f32`; `None` for another element type.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.data {
            Data::F32(v) => Some(v),
            _ => None,
        }
    }

    /// The values when the tensor is `f64`; `None` for another element type.
    pub fn as_f64(&self) -> Option<&[f64]> {
        match &self.data {
            Data::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The values when the tensor is `bf16`; `None` for another element type.
    pub fn as_bf16(&self) -> Option<&[bf16]> {
        match &self.data {
            Data::BF16(v) => Some(v),
            _ => None,
        }
    }

    /// The values when the tensor is `f16`; `None` for another element type.
    pub fn as_f16(&self) -> Option<&[f16]> {
        match &self.data {
            Data::F16(v) => Some(v),
            _ => None,
        }
    }

    /// The values when the tensor is `i64`; `None` for another element type.
    pub fn as_i64(&self) -> Option<&[i64]> {
        match &self.data {
            Data::I64(v) => Some(v),
            _ => None,
        }
    }

    /// The values when the tensor is `bool`; `None` for another element type.
    pub fn as_bool(&self) -> Option<&[bool]> {
        match &self.data {
            Data::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The tensor as the executor's dense form.
    pub fn to_dense(&self) -> Dense {
        Dense {
            dtype: self.dtype(),
            sizes: self.shape.clone(),
            data: self.data.to_f64(),
        }
    }

    /// A dense tensor in its own element type.
    pub fn from_dense(d: &Dense) -> Tensor {
        Tensor {
            shape: d.sizes.clone(),
            data: Data::from_f64(d.dtype, &d.data),
        }
    }
}

/// Named global outputs, in signature order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outputs {
    pub(crate) entries: Vec<(String, Tensor)>,
}

impl Outputs {
    /// The output named `name`.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.entries.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }

    /// Every output with its name, in signature order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.entries.iter().map(|(n, t)| (n.as_str(), t))
    }

    /// The number of outputs.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}
