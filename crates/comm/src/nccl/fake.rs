//! A device buffer at a made-up address, for the tests of plans and transports: nothing
//! ever dereferences it.

use super::DeviceBuffer;
use crate::dtype::DataType;

/// A buffer by address, length, element type and layout only.
#[derive(Clone, Debug)]
pub(crate) struct Fake {
    pub ptr: u64,
    pub len: usize,
    pub dtype: DataType,
    pub contiguous: bool,
}

impl Fake {
    /// A contiguous buffer of `len` elements of `dtype` at `ptr`.
    pub fn contiguous(ptr: u64, len: usize, dtype: DataType) -> Fake {
        Fake {
            ptr,
            len,
            dtype,
            contiguous: true,
        }
    }
}

impl DeviceBuffer for Fake {
    fn device_ptr(&self) -> u64 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn data_type(&self) -> DataType {
        self.dtype
    }
    fn is_contiguous(&self) -> bool {
        self.contiguous
    }
}
