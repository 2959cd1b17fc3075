//! Host memory buffers: typed storage shared between threads and the rectangular views
//! that the CPU backend computes on and the `Local` communicator moves between ranks.
//!
//! A [`HostView`] is a box of a [`Storage`]: one half-open range per axis of the storage's
//! shape. Chunking a view (`ShardByStream`) narrows one range and never copies, so two views
//! of one storage alias exactly where their boxes intersect; that is also how the race
//! checker compares the regions two statements touch.
//!
//! Values cross this interface as `f64`, rounded to the storage's element type on write, so a
//! bf16 buffer holds exactly the values a bf16 buffer on a GPU would.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use half::{bf16, f16};

use crate::dtype::DataType;

/// Why a host buffer or view could not be had, read or written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// The element count of a shape does not fit a `usize`.
    #[error("the element count of sizes {shape:?} overflows")]
    SizeOverflow {
        /// The shape asked for.
        shape: Vec<usize>,
    },
    /// The memory for a new buffer could not be had.
    #[error("{bytes} bytes of host memory for {len} {dtype:?} element(s) could not be allocated")]
    Allocate {
        /// The bytes asked for.
        bytes: usize,
        /// The element count asked for.
        len: usize,
        /// The element type.
        dtype: DataType,
    },
    /// The memory for the values a read returns could not be had.
    #[error("{bytes} bytes of host memory to read {len} element(s) could not be allocated")]
    Read {
        /// The bytes asked for.
        bytes: usize,
        /// The element count of the view.
        len: usize,
    },
    /// A write's value count differs from the view's element count.
    #[error("cannot write {values} values into a view of {elements} elements (sizes {sizes:?})")]
    WriteCount {
        /// The values given.
        values: usize,
        /// The view's element count.
        elements: usize,
        /// The view's sizes.
        sizes: Vec<usize>,
    },
    /// An axis past the view's rank.
    #[error("axis {axis} is out of range for a view of rank {rank}")]
    AxisOutOfRange {
        /// The axis asked for.
        axis: usize,
        /// The view's rank.
        rank: usize,
    },
    /// A chunk index past the chunk count, or no chunks at all.
    #[error("chunk {index} of {chunks} does not exist along axis {axis}")]
    NoSuchChunk {
        /// The chunk asked for.
        index: usize,
        /// The chunk count.
        chunks: usize,
        /// The axis cut.
        axis: usize,
    },
    /// A narrowing longer than the axis.
    #[error("cannot narrow axis {axis} of {len} elements to {to}")]
    Narrow {
        /// The axis narrowed.
        axis: usize,
        /// The axis's length.
        len: usize,
        /// The length asked for.
        to: usize,
    },
}

/// The element vector of a storage, in its own type.
#[derive(Debug)]
enum Data {
    Bool(Vec<u8>),
    I64(Vec<i64>),
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
    F32(Vec<f32>),
    F64(Vec<f64>),
}

/// `len` copies of `value`, or `None` when the memory cannot be had (never an abort). Every
/// page is written, so the memory counts against the process at once.
fn filled<T: Clone>(len: usize, value: T) -> Option<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).ok()?;
    v.resize(len, value);
    Some(v)
}

impl Data {
    /// `len` elements: zeros, or, uninitialised, poisoned (NaN, or a large sentinel for
    /// integers) so that a read of never-written memory shows up in results instead of passing
    /// as zeros; `None` when the memory cannot be had.
    fn try_new(dtype: DataType, len: usize, zero: bool) -> Option<Data> {
        Some(match dtype {
            DataType::Bool => Data::Bool(filled(len, 0)?),
            DataType::I64 => Data::I64(filled(len, if zero { 0 } else { POISON_I64 })?),
            DataType::F16 => Data::F16(filled(len, if zero { f16::ZERO } else { f16::NAN })?),
            DataType::Bf16 => Data::Bf16(filled(len, if zero { bf16::ZERO } else { bf16::NAN })?),
            DataType::F32 => Data::F32(filled(len, if zero { 0.0 } else { f32::NAN })?),
            DataType::F64 => Data::F64(filled(len, if zero { 0.0 } else { f64::NAN })?),
        })
    }

    /// [`Data::try_new`]; memory that cannot be had is fatal, as for any `Vec`.
    fn new(dtype: DataType, len: usize, zero: bool) -> Data {
        Data::try_new(dtype, len, zero).expect("host memory for a buffer")
    }

    fn get(&self, i: usize) -> f64 {
        match self {
            Data::Bool(v) => f64::from(v[i]),
            Data::I64(v) => v[i] as f64,
            Data::F16(v) => v[i].to_f64(),
            Data::Bf16(v) => v[i].to_f64(),
            Data::F32(v) => f64::from(v[i]),
            Data::F64(v) => v[i],
        }
    }

    fn set(&mut self, i: usize, x: f64) {
        match self {
            Data::Bool(v) => v[i] = u8::from(x != 0.0),
            Data::I64(v) => v[i] = if x.is_nan() { 0 } else { x as i64 },
            Data::F16(v) => v[i] = f16::from_f64(x),
            Data::Bf16(v) => v[i] = bf16::from_f64(x),
            Data::F32(v) => v[i] = x as f32,
            Data::F64(v) => v[i] = x,
        }
    }
}

/// The value an uninitialised `i64` buffer holds.
pub const POISON_I64: i64 = 0x5a5a_5a5a_5a5a;

static NEXT_STORAGE: AtomicU64 = AtomicU64::new(1);

/// A contiguous, row-major, typed buffer in host memory.
#[derive(Debug)]
pub struct Storage {
    id: u64,
    dtype: DataType,
    shape: Vec<usize>,
    data: RwLock<Data>,
}

impl Storage {
    /// A process-unique id, stable for the storage's lifetime.
    pub fn id(&self) -> u64 {
        self.id
    }
}

/// A rectangular view of a [`Storage`]: one range per axis of the storage's shape.
#[derive(Clone)]
pub struct HostView {
    storage: Arc<Storage>,
    ranges: Vec<Range<usize>>,
}

impl fmt::Debug for HostView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "HostView(#{} {}{:?} of {:?})",
            self.storage.id, self.storage.dtype, self.ranges, self.storage.shape
        )
    }
}

impl HostView {
    /// A fresh storage of `shape`, zero-filled when `zero`, poisoned otherwise, viewed whole.
    pub fn allocate(dtype: DataType, shape: &[usize], zero: bool) -> HostView {
        let len = shape.iter().product();
        HostView::whole(dtype, shape, Data::new(dtype, len, zero))
    }

    /// A fresh storage of `shape` holding `data`, viewed whole.
    fn whole(dtype: DataType, shape: &[usize], data: Data) -> HostView {
        let storage = Storage {
            id: NEXT_STORAGE.fetch_add(1, Ordering::Relaxed),
            dtype,
            shape: shape.to_vec(),
            data: RwLock::new(data),
        };
        HostView {
            storage: Arc::new(storage),
            ranges: shape.iter().map(|&n| 0..n).collect(),
        }
    }

    /// [`HostView::allocate`], or an error saying how many bytes could not be had (an
    /// allocation that fails is an error, never an abort).
    pub fn try_allocate(
        dtype: DataType,
        shape: &[usize],
        zero: bool,
    ) -> Result<HostView, HostError> {
        let len = shape
            .iter()
            .try_fold(1usize, |a, &n| a.checked_mul(n))
            .ok_or_else(|| HostError::SizeOverflow {
                shape: shape.to_vec(),
            })?;
        let data = Data::try_new(dtype, len, zero).ok_or_else(|| HostError::Allocate {
            bytes: len.saturating_mul(dtype.size()),
            len,
            dtype,
        })?;
        Ok(HostView::whole(dtype, shape, data))
    }

    /// A fresh storage of `shape` holding `values` (row-major, rounded to `dtype`).
    pub fn from_values(
        dtype: DataType,
        shape: &[usize],
        values: &[f64],
    ) -> Result<HostView, HostError> {
        let view = HostView::try_allocate(dtype, shape, true)?;
        view.write(values)?;
        Ok(view)
    }

    /// The element type.
    pub fn dtype(&self) -> DataType {
        self.storage.dtype
    }

    /// The view's sizes, one per axis.
    pub fn sizes(&self) -> Vec<usize> {
        self.ranges.iter().map(|r| r.len()).collect()
    }

    /// The number of elements in the view.
    pub fn numel(&self) -> usize {
        self.ranges.iter().map(|r| r.len()).product()
    }

    /// The storage viewed.
    pub fn storage(&self) -> &Arc<Storage> {
        &self.storage
    }

    /// The shape of the whole storage.
    pub fn storage_shape(&self) -> &[usize] {
        &self.storage.shape
    }

    /// The box this view covers, one range per storage axis.
    pub fn ranges(&self) -> &[Range<usize>] {
        &self.ranges
    }

    /// Whether this view and `other` share at least one element.
    pub fn overlaps(&self, other: &HostView) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
            && self
                .ranges
                .iter()
                .zip(&other.ranges)
                .all(|(a, b)| a.start < b.end && b.start < a.end)
    }

    /// The `index`-th of `chunks` chunks along `axis` (chunk size `ceil(n / chunks)`, the last
    /// ones possibly shorter or empty): the view `ShardByStream` makes. No copy.
    pub fn chunk(&self, axis: usize, chunks: usize, index: usize) -> Result<HostView, HostError> {
        Ok(HostView {
            storage: self.storage.clone(),
            ranges: chunk_ranges(&self.ranges, axis, chunks, index)?,
        })
    }

    /// The first `len` elements of the view along `axis`. No copy.
    pub fn narrow(&self, axis: usize, len: usize) -> Result<HostView, HostError> {
        Ok(HostView {
            storage: self.storage.clone(),
            ranges: narrow_ranges(&self.ranges, axis, len)?,
        })
    }

    /// Calls `f(start, len)` for every contiguous run of storage elements in the view, in
    /// row-major order of the view.
    fn for_each_run(&self, mut f: impl FnMut(usize, usize)) {
        let rank = self.ranges.len();
        if self.ranges.iter().any(|r| r.is_empty()) {
            return;
        }
        if rank == 0 {
            f(0, 1);
            return;
        }
        let shape = &self.storage.shape;
        let mut strides = vec![1usize; rank];
        for a in (0..rank - 1).rev() {
            strides[a] = strides[a + 1] * shape[a + 1];
        }
        let inner = &self.ranges[rank - 1];
        let mut idx: Vec<usize> = self.ranges.iter().map(|r| r.start).collect();
        loop {
            let base: usize = (0..rank - 1).map(|a| idx[a] * strides[a]).sum();
            f(base + inner.start, inner.len());
            // Advance the outer index (all axes but the last).
            let mut a = rank - 1;
            loop {
                if a == 0 {
                    return;
                }
                a -= 1;
                idx[a] += 1;
                if idx[a] < self.ranges[a].end {
                    break;
                }
                idx[a] = self.ranges[a].start;
            }
        }
    }

    /// [`HostView::read`], or an error when the memory for the values cannot be had (never
    /// an abort).
    pub fn try_read(&self) -> Result<Vec<f64>, HostError> {
        let n = self.numel();
        let mut out = Vec::new();
        out.try_reserve_exact(n).map_err(|_| HostError::Read {
            bytes: n.saturating_mul(8),
            len: n,
        })?;
        let data = self.storage.data.read().unwrap_or_else(|e| e.into_inner());
        self.for_each_run(|start, len| out.extend((start..start + len).map(|i| data.get(i))));
        Ok(out)
    }

    /// The view's elements in row-major order (see [`HostView::try_read`]; memory that cannot
    /// be had is fatal, as for any `Vec`).
    pub fn read(&self) -> Vec<f64> {
        self.try_read().expect("host memory to read a view")
    }

    /// Overwrites the view's elements, in row-major order, with `values` rounded to the
    /// element type. Fails when the counts differ.
    pub fn write(&self, values: &[f64]) -> Result<(), HostError> {
        if values.len() != self.numel() {
            return Err(HostError::WriteCount {
                values: values.len(),
                elements: self.numel(),
                sizes: self.sizes(),
            });
        }
        let mut data = self.storage.data.write().unwrap_or_else(|e| e.into_inner());
        let mut k = 0;
        self.for_each_run(|start, len| {
            for i in start..start + len {
                data.set(i, values[k]);
                k += 1;
            }
        });
        Ok(())
    }

    /// Overwrites the view's elements with what an uninitialised buffer holds (NaN, or
    /// [`POISON_I64`] for integers).
    pub fn poison(&self) {
        self.fill(match self.dtype() {
            DataType::I64 => POISON_I64 as f64,
            DataType::Bool => 0.0,
            _ => f64::NAN,
        });
    }

    /// Fills the view with `x`.
    pub fn fill(&self, x: f64) {
        let mut data = self.storage.data.write().unwrap_or_else(|e| e.into_inner());
        self.for_each_run(|start, len| {
            for i in start..start + len {
                data.set(i, x);
            }
        });
    }
}

/// The box `ranges` narrowed to the `index`-th of `chunks` chunks along `axis`: chunks of
/// `ceil(len / chunks)` elements, the last ones shorter or empty. Every backend's chunk views
/// follow this rule, so the same program cuts the same elements everywhere.
pub fn chunk_ranges(
    ranges: &[Range<usize>],
    axis: usize,
    chunks: usize,
    index: usize,
) -> Result<Vec<Range<usize>>, HostError> {
    let range = axis_range(ranges, axis)?;
    if chunks == 0 || index >= chunks {
        return Err(HostError::NoSuchChunk {
            index,
            chunks,
            axis,
        });
    }
    let size = range.len().div_ceil(chunks);
    let lo = (range.start + index * size).min(range.end);
    let hi = (lo + size).min(range.end);
    let mut out = ranges.to_vec();
    out[axis] = lo..hi;
    Ok(out)
}

/// The range of `axis` in the box `ranges`; fails when the box has no such axis.
fn axis_range(ranges: &[Range<usize>], axis: usize) -> Result<&Range<usize>, HostError> {
    ranges.get(axis).ok_or(HostError::AxisOutOfRange {
        axis,
        rank: ranges.len(),
    })
}

/// The length of the `index`-th of `chunks` chunks of an axis of `len` elements, cut as
/// [`chunk_ranges`] cuts: `ceil(len / chunks)`, less for the last ones, 0 past the end.
pub fn chunk_len(len: usize, chunks: usize, index: usize) -> usize {
    if chunks == 0 {
        return 0;
    }
    let size = len.div_ceil(chunks);
    len.saturating_sub(index.saturating_mul(size)).min(size)
}

/// The box `ranges` narrowed to its first `len` elements along `axis`; fails when the axis
/// is shorter than `len`.
pub fn narrow_ranges(
    ranges: &[Range<usize>],
    axis: usize,
    len: usize,
) -> Result<Vec<Range<usize>>, HostError> {
    let range = axis_range(ranges, axis)?;
    if len > range.len() {
        return Err(HostError::Narrow {
            axis,
            len: range.len(),
            to: len,
        });
    }
    let mut out = ranges.to_vec();
    out[axis] = range.start..range.start + len;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_alias_their_parent() {
        let v = HostView::from_values(
            DataType::F32,
            &[4, 3],
            &(0..12).map(f64::from).collect::<Vec<_>>(),
        )
        .unwrap();
        let c = v.chunk(1, 3, 1).unwrap();
        assert_eq!(c.sizes(), vec![4, 1]);
        assert_eq!(c.read(), vec![1.0, 4.0, 7.0, 10.0]);
        c.write(&[-1.0, -2.0, -3.0, -4.0]).unwrap();
        assert_eq!(v.read()[..6], [0.0, -1.0, 2.0, 3.0, -2.0, 5.0]);
        assert!(c.overlaps(&v));
        assert!(!c.overlaps(&v.chunk(1, 3, 2).unwrap()));
        let last = v.chunk(0, 3, 2).unwrap();
        assert_eq!(last.sizes(), vec![0, 3], "ceil(4/3) = 2: chunk 2 is empty");
        let short = v.chunk(0, 3, 1).unwrap().narrow(0, 1).unwrap();
        assert_eq!(
            short.read(),
            vec![6.0, -3.0, 8.0],
            "row 2 of the written view"
        );
        assert!(v.narrow(0, 5).is_err());
    }

    #[test]
    fn chunk_lengths_match_the_chunk_views() {
        for len in 0..12 {
            for chunks in 1..7 {
                let mut total = 0;
                for index in 0..chunks {
                    let r =
                        chunk_ranges(std::slice::from_ref(&(0..len)), 0, chunks, index).unwrap();
                    assert_eq!(r[0].len(), chunk_len(len, chunks, index));
                    total += chunk_len(len, chunks, index);
                }
                assert_eq!(total, len);
                assert_eq!(chunk_len(len, chunks, chunks + 3), 0);
            }
        }
        assert_eq!(
            (0..3).map(|i| chunk_len(10, 3, i)).collect::<Vec<_>>(),
            [4, 4, 2]
        );
        assert_eq!(
            (0..5).map(|i| chunk_len(12, 5, i)).collect::<Vec<_>>(),
            [3, 3, 3, 3, 0]
        );
    }

    #[test]
    fn errors_say_what_was_asked() {
        let v = HostView::allocate(DataType::F32, &[4, 3], true);
        let message = |e: HostError| e.to_string();
        assert_eq!(
            message(v.chunk(2, 3, 0).unwrap_err()),
            "axis 2 is out of range for a view of rank 2"
        );
        assert_eq!(
            message(v.chunk(0, 3, 3).unwrap_err()),
            "chunk 3 of 3 does not exist along axis 0"
        );
        assert_eq!(
            message(v.narrow(0, 5).unwrap_err()),
            "cannot narrow axis 0 of 4 elements to 5"
        );
        assert_eq!(
            message(v.write(&[1.0]).unwrap_err()),
            "cannot write 1 values into a view of 12 elements (sizes [4, 3])"
        );
        assert_eq!(
            message(HostView::try_allocate(DataType::F32, &[usize::MAX, 2], true).unwrap_err()),
            format!("the element count of sizes {:?} overflows", [usize::MAX, 2])
        );
    }

    #[test]
    fn writes_round_to_the_element_type() {
        let v = HostView::from_values(DataType::Bf16, &[2], &[1.0 + 1.0 / 512.0, 3.0]).unwrap();
        assert_eq!(v.read(), vec![1.0, 3.0]);
        let p = HostView::allocate(DataType::F32, &[2], false);
        assert!(
            p.read().iter().all(|x| x.is_nan()),
            "uninitialised memory is poisoned"
        );
    }
}
