//! Sharding helpers: where each element of a global tensor lives on each rank, read off the
//! tensor's split trees, so a global tensor can be cut into the per-rank buffers a host
//! program takes and the per-rank results put back together.
//!
//! A rank's buffer of tensor `t` has one axis per visible logical axis of `t`, as the
//! lowering sizes it. Along logical axis `L`, the splits below `L` (from the allocation
//! domain, or the loop domain where no allocation domain is set) form a tree; its leaves,
//! outer before inner, enumerate the axis' global indices. A device-parallel leaf is fixed to
//! the rank's coordinate in the mesh, every other leaf is enumerated, so the local axis holds,
//! in tree order, exactly the elements whose device leaf equals the rank's coordinate. This
//! covers a DID split inside a Stream split (each chunk cut again across devices), which is
//! how reduce-scattered chunks land.
//!
//! Splits cut the elements an axis really has, as the runtime does (`ShardByStream` chunks
//! of `ceilDiv(n, s)`, the last ones shorter or empty): a split that does not divide adds no
//! padding, and a Stream or Serial split of an input or output leaves its buffer the whole
//! axis (`weave_comm::host::chunk_ranges`).

use std::collections::HashMap;

use weave_executor::Dense;
use weave_ir::{DeviceMesh, Fusion, IdExpr, IterDomainId, ParallelType, SplitKind, TensorId};

/// The per-rank layout of one fusion tensor.
#[derive(Clone, Debug)]
pub struct Layout {
    name: String,
    global: Vec<usize>,
    axes: Vec<AxisTree>,
    mesh: Option<DeviceMesh>,
}

/// The split tree of one logical axis, with evaluated extents.
#[derive(Clone, Debug)]
enum AxisTree {
    /// A leaf: its parallel type (its extent is what its parent's chunk has).
    Leaf { parallel: ParallelType },
    /// A split: `[outer, inner]`, with the factor that sizes one of them.
    Split {
        outer: Box<AxisTree>,
        inner: Box<AxisTree>,
        kind: SplitKind,
        factor: usize,
    },
}

impl AxisTree {
    /// Global indices of this axis held by the rank at `coords`, in local order, when the
    /// axis has `len` elements.
    ///
    /// A split cuts the elements it really has, the way the runtime cuts them: an outer split
    /// by `f` into `f` chunks of `ceilDiv(len, f)`, an inner split by `f` into chunks of `f`,
    /// the last chunks shorter or empty; each chunk's subtree then sees the chunk's own
    /// length. So a Stream or Serial split adds no padding (the buffer is the whole axis, cut
    /// at run time), and a device split inside a shorter last chunk cuts that chunk (which
    /// `load` requires to divide evenly).
    fn indices(&self, len: usize, coords: &dyn Fn(ParallelType) -> usize) -> Vec<usize> {
        match self {
            AxisTree::Leaf { parallel, .. } => {
                if parallel.is_device() {
                    let c = coords(*parallel);
                    if c < len {
                        vec![c]
                    } else {
                        Vec::new()
                    }
                } else {
                    (0..len).collect()
                }
            }
            AxisTree::Split {
                outer,
                inner,
                kind,
                factor,
            } => {
                let f = (*factor).max(1);
                let (outer_len, stride) = match kind {
                    SplitKind::Outer => (f, len.div_ceil(f)),
                    SplitKind::Inner => (len.div_ceil(f), f),
                };
                let mut out = Vec::new();
                for a in outer.indices(outer_len, coords) {
                    let chunk = len.saturating_sub(a * stride).min(stride);
                    for b in inner.indices(chunk, coords) {
                        out.push(a * stride + b);
                    }
                }
                out
            }
        }
    }
}

fn eval(fusion: &Fusion, id: IterDomainId, what: &str) -> Result<usize, String> {
    let e = &fusion.id(id).extent;
    fusion
        .eval(e)
        .and_then(|v| usize::try_from(v).ok())
        .ok_or_else(|| format!("{what}: extent `{}` has no value", e.to_source()))
}

impl Layout {
    /// The layout of tensor `t` of `fusion` (schedules applied, parameters bound).
    pub fn of(fusion: &Fusion, t: TensorId) -> Result<Layout, String> {
        let tv = fusion.tensor(t);
        // The memory layout: the allocation domain once finalized (it may replay the loop
        // domain's splits with fresh ids), else the loop domain, whose device splits are where
        // the sharding lives. Every id it mentions, with the split that defines it.
        let domain = match &tv.allocation {
            Some(a) => a,
            None => &tv.loop_domain,
        };
        let mut children: HashMap<IterDomainId, (IterDomainId, IterDomainId, IdExpr)> =
            HashMap::new();
        let mut work: Vec<IterDomainId> = domain.clone();
        let logical = fusion.visible_axes(t);
        while let Some(id) = work.pop() {
            if tv.logical.contains(&id) {
                continue;
            }
            let Some(def) = fusion.id(id).definition else {
                continue;
            };
            match fusion.id_expr(def) {
                e @ IdExpr::Split {
                    input,
                    outer,
                    inner,
                    ..
                } => {
                    if let Some((o, i, _)) = children.get(input) {
                        if (o, i) != (outer, inner) {
                            return Err(format!(
                                "tensor `{}` splits one axis in two different ways",
                                tv.name
                            ));
                        }
                        continue;
                    }
                    children.insert(*input, (*outer, *inner, e.clone()));
                    work.push(*input);
                }
                IdExpr::Merge { outer, inner, .. } => {
                    // A merge below a device split would interleave axes; only merges that
                    // stay local (no device leaf under them) are harmless, and those do not
                    // change which elements a rank holds.
                    work.push(*outer);
                    work.push(*inner);
                }
            }
        }
        let mut axes = Vec::new();
        let mut global = Vec::new();
        for &l in &logical {
            global.push(eval(fusion, l, &tv.name)?);
            axes.push(Self::tree(fusion, l, &children, &tv.name)?);
        }
        Ok(Layout {
            name: tv.name.clone(),
            global,
            axes,
            mesh: fusion.mesh_of(t).cloned(),
        })
    }

    fn tree(
        fusion: &Fusion,
        id: IterDomainId,
        children: &HashMap<IterDomainId, (IterDomainId, IterDomainId, IdExpr)>,
        name: &str,
    ) -> Result<AxisTree, String> {
        match children.get(&id) {
            None => Ok(AxisTree::Leaf {
                parallel: fusion.id(id).parallel,
            }),
            Some((outer, inner, IdExpr::Split { kind, .. })) => Ok(AxisTree::Split {
                outer: Box::new(Self::tree(fusion, *outer, children, name)?),
                inner: Box::new(Self::tree(fusion, *inner, children, name)?),
                kind: *kind,
                factor: match kind {
                    SplitKind::Outer => eval(fusion, *outer, name)?,
                    SplitKind::Inner => eval(fusion, *inner, name)?,
                },
            }),
            Some(_) => Err(format!("tensor `{name}`: unexpected transform")),
        }
    }

    /// The tensor's global (logical) sizes.
    pub fn global_sizes(&self) -> &[usize] {
        &self.global
    }

    /// The sizes of one rank's buffer (of the first device of the mesh; `load` makes device
    /// splits divide, so every device holds as many).
    pub fn local_sizes(&self) -> Vec<usize> {
        let first = self
            .mesh
            .as_ref()
            .and_then(|m| m.devices().first().copied())
            .and_then(|d| usize::try_from(d).ok())
            .unwrap_or(0);
        self.axis_indices(first).iter().map(Vec::len).collect()
    }

    /// Whether `rank` holds a piece of the tensor (it is in the tensor's mesh, or the tensor
    /// has none).
    pub fn holds(&self, rank: usize) -> bool {
        self.mesh.as_ref().is_none_or(|m| m.has(rank as i64))
    }

    /// The rank's coordinate along each device parallel type.
    fn coords(&self, rank: usize) -> impl Fn(ParallelType) -> usize + '_ {
        let pos = self
            .mesh
            .as_ref()
            .and_then(|m| m.devices().iter().position(|&d| d == rank as i64))
            .unwrap_or(0);
        move |pt: ParallelType| {
            let Some(m) = &self.mesh else { return 0 };
            let shape = m.shape();
            let Some(from_end) = pt.mesh_axis_from_end() else {
                return 0;
            };
            if from_end >= shape.len() {
                return 0;
            }
            let axis = shape.len() - 1 - from_end;
            let stride: usize = shape[axis + 1..].iter().product();
            (pos / stride) % shape[axis]
        }
    }

    /// For each axis, the global index of every position of `rank`'s buffer along it: the
    /// per-axis form of
    /// [`Layout::global_indices`], small enough for tensors of any size.
    pub fn axis_indices(&self, rank: usize) -> Vec<Vec<usize>> {
        let coords = self.coords(rank);
        self.axes
            .iter()
            .zip(&self.global)
            .map(|(a, &len)| a.indices(len, &coords))
            .collect()
    }

    /// For each element of `rank`'s buffer (row-major), its row-major index in the global
    /// tensor (`None` would be a position past the global extent, which no split makes).
    pub fn global_indices(&self, rank: usize) -> Vec<Option<usize>> {
        let per_axis = self.axis_indices(rank);
        let mut strides = vec![1usize; self.global.len()];
        for a in (0..self.global.len().saturating_sub(1)).rev() {
            strides[a] = strides[a + 1] * self.global[a + 1];
        }
        let mut out = vec![Some(0usize)];
        for (a, idx) in per_axis.iter().enumerate() {
            let mut next = Vec::with_capacity(out.len() * idx.len());
            for base in &out {
                for &i in idx {
                    next.push(match base {
                        Some(b) if i < self.global[a] => Some(b + i * strides[a]),
                        _ => None,
                    });
                }
            }
            out = next;
        }
        out
    }

    /// `rank`'s buffer of the global tensor `global`.
    pub fn shard(&self, global: &Dense, rank: usize) -> Result<Dense, String> {
        if global.sizes != self.global {
            return Err(format!(
                "tensor `{}` has global sizes {:?}, not {:?}",
                self.name, self.global, global.sizes
            ));
        }
        let data = self
            .global_indices(rank)
            .into_iter()
            .map(|g| g.map_or(0.0, |g| global.data[g]))
            .collect();
        Ok(Dense {
            dtype: global.dtype,
            sizes: self.local_sizes(),
            data,
        })
    }

    /// The global tensor put back together from every rank's buffer (`locals[r]` is rank
    /// `r`'s); where ranks hold the same element, the lowest rank's copy wins. Elements no
    /// rank holds are NaN.
    pub fn unshard(&self, locals: &[Dense]) -> Result<Dense, String> {
        let numel: usize = self.global.iter().product();
        let mut data = vec![f64::NAN; numel];
        let mut filled = vec![false; numel];
        let mut dtype = None;
        for (rank, local) in locals.iter().enumerate() {
            if !self.holds(rank) {
                continue;
            }
            let idx = self.global_indices(rank);
            if local.data.len() != idx.len() {
                return Err(format!(
                    "rank {rank}'s buffer of `{}` has {} elements, the layout {}",
                    self.name,
                    local.data.len(),
                    idx.len()
                ));
            }
            dtype.get_or_insert(local.dtype);
            for (v, g) in local.data.iter().zip(idx) {
                if let Some(g) = g {
                    if !filled[g] {
                        data[g] = *v;
                        filled[g] = true;
                    }
                }
            }
        }
        Ok(Dense {
            dtype: dtype.unwrap_or(weave_ir::DType::F32),
            sizes: self.global.clone(),
            data,
        })
    }
}
