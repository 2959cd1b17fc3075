//! Where a tensor's elements lie on the GPU: a [`DeviceTensor`] is a box of a row-major
//! allocation, seen as a matrix of uniformly strided rows (for GEMMs) or as rows of 2-D
//! copies (for copies into and out of strided views).

use std::ops::Range;
use std::sync::Arc;

use weave_comm::nccl::DeviceBuffer;
use weave_comm::DataType;
use weave_cuda::DeviceMemory;
use weave_ir::DType;

use super::codegen::TensorArg;
use crate::cpu::data_type;
use crate::dense::elem_bytes;

/// A tensor on the GPU: a box (one range per axis) of a row-major allocation.
#[derive(Clone)]
pub struct DeviceTensor {
    pub(super) mem: Arc<DeviceMemory>,
    pub(super) dtype: DType,
    pub(super) shape: Arc<Vec<usize>>,
    pub(super) ranges: Vec<Range<usize>>,
}

impl std::fmt::Debug for DeviceTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceTensor({:?}, {:?} of {:?})",
            self.mem, self.ranges, self.shape
        )
    }
}

fn row_major(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for a in (0..shape.len().saturating_sub(1)).rev() {
        s[a] = s[a + 1] * shape[a + 1];
    }
    s
}

impl DeviceTensor {
    /// The sizes of the box.
    pub fn sizes(&self) -> Vec<usize> {
        self.ranges.iter().map(|r| r.len()).collect()
    }

    /// The box `ranges` of the same allocation (one range per axis, within its shape), or
    /// `None` when they do not fit it.
    pub fn boxed(&self, ranges: &[Range<usize>]) -> Option<DeviceTensor> {
        let fits = ranges.len() == self.shape.len()
            && ranges
                .iter()
                .zip(self.shape.iter())
                .all(|(r, &n)| r.start <= r.end && r.end <= n);
        fits.then(|| DeviceTensor {
            ranges: ranges.to_vec(),
            ..self.clone()
        })
    }

    /// Element strides of the box's axes.
    pub fn strides(&self) -> Vec<usize> {
        row_major(&self.shape)
    }

    /// Elements in the box.
    pub fn numel(&self) -> usize {
        self.ranges.iter().map(|r| r.len()).product()
    }

    /// Offset of the box's first element, in elements.
    fn offset(&self) -> usize {
        self.ranges
            .iter()
            .zip(row_major(&self.shape))
            .map(|(r, s)| r.start * s)
            .sum()
    }

    /// The device address of the box's first element.
    pub fn ptr(&self) -> u64 {
        self.mem.ptr() + (self.offset() * elem_bytes(self.dtype)) as u64
    }

    /// Whether the box is one contiguous run of the allocation (an empty box is).
    pub fn contiguous(&self) -> bool {
        if self.numel() == 0 {
            return true;
        }
        // From the innermost axis out: full axes, then one partial axis, then axes of one
        // element.
        let mut partial = false;
        for (r, &n) in self.ranges.iter().zip(self.shape.iter()).rev() {
            if partial {
                if r.len() > 1 {
                    return false;
                }
            } else if r.len() != n {
                partial = true;
            }
        }
        true
    }

    /// The box as a row-major matrix of `cols` columns: its row count and the element
    /// distance between rows, when its leading axes merge into uniformly strided rows.
    pub(super) fn as_matrix(&self, cols: usize) -> Option<(usize, usize)> {
        matrix_of(&self.sizes(), &self.strides(), cols)
    }

    pub(super) fn arg(&self) -> TensorArg {
        TensorArg {
            dtype: self.dtype,
            sizes: self.sizes(),
            strides: self.strides(),
        }
    }
}

impl DeviceBuffer for DeviceTensor {
    fn device_ptr(&self) -> u64 {
        self.ptr()
    }

    fn len(&self) -> usize {
        self.numel()
    }

    fn data_type(&self) -> DataType {
        data_type(self.dtype)
    }

    fn is_contiguous(&self) -> bool {
        self.contiguous()
    }
}

/// A box of `sizes` with element `strides` as a row-major matrix of `cols` columns: (rows,
/// leading dimension), when its axes merge into uniformly strided rows. Axes of one element
/// do not matter (a GEMM result may carry a trailing `1`).
pub(super) fn matrix_of(sizes: &[usize], strides: &[usize], cols: usize) -> Option<(usize, usize)> {
    let (sizes, strides): (Vec<usize>, Vec<usize>) = sizes
        .iter()
        .zip(strides)
        .filter(|(n, _)| **n != 1)
        .map(|(n, s)| (*n, *s))
        .unzip();
    let merges = |axes: usize| {
        (0..axes.saturating_sub(1)).all(|a| strides[a] == strides[a + 1] * sizes[a + 1])
    };
    let r = sizes.len();
    if cols == 1 {
        // One column: the rows are every remaining axis.
        if !merges(r) {
            return None;
        }
        return Some((
            sizes.iter().product(),
            strides.last().copied().unwrap_or(1).max(1),
        ));
    }
    if r == 0 || sizes[r - 1] != cols || strides[r - 1] != 1 || !merges(r - 1) {
        return None;
    }
    let rows: usize = sizes[..r - 1].iter().product();
    let ld = if r >= 2 { strides[r - 2] } else { cols };
    Some((rows, ld.max(cols)))
}

/// A box of a row-major allocation as 2-D copies: `height` rows of `width` contiguous
/// elements, `pitch` elements apart, starting at each of `offsets` (elements from the box's
/// first element), in the row-major order of the box.
#[derive(Debug, PartialEq)]
pub(super) struct BoxRows {
    pub(super) width: usize,
    pub(super) height: usize,
    pub(super) pitch: usize,
    pub(super) offsets: Vec<usize>,
}

/// The `(size, stride)` pairs of the axes that step: axes of one element do not.
pub(super) fn stepping_axes(sizes: &[usize], strides: &[usize]) -> Vec<(usize, usize)> {
    sizes
        .iter()
        .zip(strides)
        .map(|(n, s)| (*n, *s))
        .filter(|(n, _)| *n != 1)
        .collect()
}

impl BoxRows {
    pub(super) fn of(sizes: &[usize], strides: &[usize]) -> BoxRows {
        let axes = stepping_axes(sizes, strides);
        let r = axes.len();
        if r == 0 || axes.iter().any(|a| a.0 == 0) {
            let n = usize::from(r == 0);
            return BoxRows {
                width: n,
                height: n,
                pitch: n,
                offsets: vec![0],
            };
        }
        // The innermost run of axes that is one contiguous run of elements.
        let mut a = r;
        if axes[r - 1].1 == 1 {
            a = r - 1;
            while a > 0 && axes[a - 1].1 == axes[a].1 * axes[a].0 {
                a -= 1;
            }
        }
        let width: usize = axes[a..].iter().map(|x| x.0).product();
        // The axis outside it gives the rows of one 2-D copy; the rest are enumerated.
        let (height, pitch, outer) = if a == 0 {
            (1, width, 0)
        } else {
            (axes[a - 1].0, axes[a - 1].1, a - 1)
        };
        let mut offsets = vec![0usize];
        for &(n, st) in &axes[..outer] {
            offsets = offsets
                .iter()
                .flat_map(|&o| (0..n).map(move |i| o + i * st))
                .collect();
        }
        BoxRows {
            width,
            height,
            pitch,
            offsets,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{matrix_of, BoxRows};

    #[test]
    fn strided_boxes_copy_as_rows() {
        // [b = 6, chunk 4 of t = 12, h = 3, 1]: 6 rows of 12 contiguous elements, 36 apart.
        let rows = BoxRows::of(&[6, 4, 3, 1], &[36, 3, 1, 1]);
        assert_eq!((rows.width, rows.height, rows.pitch), (12, 6, 36));
        assert_eq!(rows.offsets, vec![0]);
        // A chunk of the last axis of [2, 3, 8]: rows of 2, 8 apart, one copy per outer index.
        let rows = BoxRows::of(&[2, 3, 2], &[24, 8, 1]);
        assert_eq!((rows.width, rows.height, rows.pitch), (2, 3, 8));
        assert_eq!(rows.offsets, vec![0, 24]);
        // Every element of the box is covered exactly once, in row-major order.
        let covered: Vec<usize> = rows
            .offsets
            .iter()
            .flat_map(|&o| {
                (0..rows.height)
                    .flat_map(move |h| (0..rows.width).map(move |w| o + h * rows.pitch + w))
            })
            .collect();
        let expected: Vec<usize> = (0..2)
            .flat_map(|i| (0..3).flat_map(move |j| (0..2).map(move |k| i * 24 + j * 8 + k)))
            .collect();
        assert_eq!(covered, expected);
        // A contiguous box is one row; an empty one copies nothing.
        let rows = BoxRows::of(&[4, 5], &[5, 1]);
        assert_eq!((rows.width, rows.height, rows.offsets.len()), (20, 1, 1));
        assert_eq!(BoxRows::of(&[0, 5], &[5, 1]).width, 0);
    }

    #[test]
    fn matrices_of_chunks_ignore_size_one_axes() {
        // A chunk of rows of a [512, 512, 1] buffer (a linear's partial result).
        assert_eq!(
            matrix_of(&[256, 512, 1], &[512, 1, 1], 512),
            Some((256, 512))
        );
        // A chunk of columns: rows keep the allocation's stride.
        assert_eq!(matrix_of(&[8, 4], &[12, 1], 4), Some((8, 12)));
        // Leading axes merge when they are contiguous, not otherwise.
        assert_eq!(matrix_of(&[2, 3, 4], &[12, 4, 1], 4), Some((6, 4)));
        assert_eq!(matrix_of(&[2, 3, 4], &[24, 4, 1], 4), None);
        // One column.
        assert_eq!(matrix_of(&[6, 1], &[1, 1], 1), Some((6, 1)));
        // The last axis is not the columns.
        assert_eq!(matrix_of(&[4, 3], &[3, 1], 4), None);
    }
}
