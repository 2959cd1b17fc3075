//! Stride arithmetic on views: contiguous strides, a view broadcast to more axes, a view
//! reshaped without moving data, and the view of an output buffer with a value's sizes.

use crate::{Buf, TensorArg, View};

pub(crate) fn contiguous_strides(sizes: &[usize]) -> Vec<isize> {
    let mut s = vec![1isize; sizes.len()];
    for a in (0..sizes.len().saturating_sub(1)).rev() {
        s[a] = s[a + 1] * sizes[a + 1] as isize;
    }
    s
}

pub(crate) fn numel(sizes: &[usize]) -> usize {
    sizes.iter().product()
}

/// The view `v` seen with `out` sizes: trailing axes aligned, size-1 and missing axes
/// broadcast (stride 0).
pub(crate) fn expand(v: &View, out: &[usize]) -> Option<View> {
    if v.sizes.len() > out.len() {
        return None;
    }
    let lead = out.len() - v.sizes.len();
    let mut strides = vec![0isize; out.len()];
    for (k, (&s, &st)) in v.sizes.iter().zip(&v.strides).enumerate() {
        let o = out[lead + k];
        if s == o {
            strides[lead + k] = st;
        } else if s != 1 {
            return None;
        }
    }
    Some(View {
        sizes: out.to_vec(),
        strides,
        ..v.clone()
    })
}

/// The `(size, stride)` of each axis whose size is not 1, in order.
fn non_unit_axes<'a, T: Copy>(
    sizes: &'a [usize],
    strides: &'a [T],
) -> impl Iterator<Item = (usize, T)> + 'a {
    sizes
        .iter()
        .zip(strides)
        .filter(|(s, _)| **s != 1)
        .map(|(s, t)| (*s, *t))
}

/// The view `v` reshaped to `to` (same element count) without moving data, when its strides
/// allow it.
pub(crate) fn reshape_view(v: &View, to: &[usize]) -> Option<View> {
    // Drop size-1 axes, then walk both shapes grouping axes with equal products.
    let (sizes, strides): (Vec<usize>, Vec<isize>) = non_unit_axes(&v.sizes, &v.strides).unzip();
    let mut out_strides = vec![0isize; to.len()];
    let (mut i, mut j) = (0usize, 0usize);
    while j < to.len() {
        if to[j] == 1 {
            j += 1;
            continue;
        }
        if i >= sizes.len() {
            return None;
        }
        // A group: input axes i..i2 and output axes j..j2 with equal products.
        let (mut pi, mut pj) = (sizes[i], to[j]);
        let (mut i2, mut j2) = (i + 1, j + 1);
        while pi != pj {
            if pi < pj {
                pi *= *sizes.get(i2)?;
                i2 += 1;
            } else {
                pj *= *to.get(j2)?;
                j2 += 1;
            }
        }
        // The input group must be contiguous in itself.
        for k in i..i2 - 1 {
            if strides[k] != strides[k + 1] * sizes[k + 1] as isize {
                return None;
            }
        }
        let mut st = strides[i2 - 1];
        for k in (j..j2).rev() {
            out_strides[k] = st;
            st *= to[k] as isize;
        }
        i = i2;
        j = j2;
    }
    if i != sizes.len() {
        return None;
    }
    Some(View {
        sizes: to.to_vec(),
        strides: out_strides,
        ..v.clone()
    })
}

/// A view of the buffer `a` with the value's `sizes`: equal except for size-1 axes.
pub(crate) fn output_view(buf: Buf, a: &TensorArg, sizes: &[usize]) -> Option<View> {
    let target: Vec<(usize, usize)> = non_unit_axes(&a.sizes, &a.strides).collect();
    let mut it = target.iter();
    let mut strides = Vec::with_capacity(sizes.len());
    for &s in sizes {
        if s == 1 {
            strides.push(0);
        } else {
            let (ts, tt) = it.next()?;
            if *ts != s {
                return None;
            }
            strides.push(*tt as isize);
        }
    }
    if it.next().is_some() {
        return None;
    }
    Some(View {
        buf,
        dtype: a.dtype,
        offset: 0,
        sizes: sizes.to_vec(),
        strides,
    })
}
