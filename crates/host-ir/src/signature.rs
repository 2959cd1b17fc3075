//! A host program's signature: the parameter values its scalars read, and for every input
//! and output its name, dtype, global shape and sharding (mesh, DID and Stream splits), so a
//! printed program runs by itself; and the sharding arithmetic that cuts a global tensor into
//! the buffer each rank takes and puts the ranks' buffers back together.
//!
//! A rank's buffer of a tensor has one axis per logical axis. Along each axis the splits form
//! a tree ([`AxisSplit`]); its leaves, outer before inner, enumerate the axis' global indices.
//! A device-parallel leaf is fixed to the rank's coordinate in the mesh, every other leaf is
//! enumerated, so the local axis holds, in tree order, exactly the elements whose device leaf
//! equals the rank's coordinate. This covers a DID split inside a Stream split (each chunk cut
//! again across devices), which is how reduce-scattered chunks land.
//!
//! Splits cut the elements an axis really has, as the runtime does (`ShardByStream` chunks of
//! `ceilDiv(n, s)`, the last ones shorter or empty): a split that does not divide adds no
//! padding, and a Stream or Serial split leaves the buffer the whole axis.

use std::collections::HashMap;
use std::fmt::{self, Write as _};

use weave_ir::{
    DType, DeviceMesh, Fusion, IdExpr, IterDomainId, ParallelType, ParamRole, SplitKind, TensorId,
};

/// What a caller binds and gets back, in global terms.
#[derive(Clone, Debug, Default)]
pub struct Signature {
    /// The value of every parameter the program's scalars may read, in declaration order.
    pub params: Vec<(String, i64)>,
    /// Which parameter plays which role (mesh size, chunk count), where one does.
    pub roles: Vec<(ParamRole, String)>,
    /// Every device any tensor of the program lives on (intermediates included), sorted;
    /// empty for a program on no mesh.
    pub devices: Vec<i64>,
    /// One entry per program input, in the order of [`crate::HostProgram::inputs`].
    pub inputs: Vec<TensorSig>,
    /// One entry per program output, in the order of [`crate::HostProgram::outputs`].
    pub outputs: Vec<TensorSig>,
    /// The global (unsharded) fusion the program was compiled from: what a reference
    /// evaluation runs. `None` for a program written by hand.
    pub definition: Option<Fusion>,
}

impl Signature {
    /// Checks the definition (when there is one) against the signature: the same inputs and
    /// outputs, in order, each with the signature's name, element type and global shape (the
    /// definition's sizes evaluated with its own parameter values, which must be the
    /// signature's). A reference run of a definition that disagrees would check the program
    /// against another program. The message names the tensor and what differs.
    pub fn check_definition(&self) -> Result<(), DefinitionMismatch> {
        let Some(def) = &self.definition else {
            return Ok(());
        };
        for (name, value) in &self.params {
            match def.param_value(name) {
                Some(v) if v == *value => {}
                Some(v) => {
                    return Err(DefinitionMismatch::Param {
                        name: name.clone(),
                        definition: v,
                        signature: *value,
                    })
                }
                None => {}
            }
        }
        for (what, ids, entries) in [
            ("input", def.inputs(), &self.inputs),
            ("output", def.outputs(), &self.outputs),
        ] {
            if ids.len() != entries.len() {
                return Err(DefinitionMismatch::Count {
                    what,
                    definition: ids.len(),
                    signature: entries.len(),
                });
            }
            for (index, (&t, e)) in ids.iter().zip(entries).enumerate() {
                let tensor = def.tensor(t);
                let name = || tensor.name.clone();
                if tensor.name != e.name {
                    return Err(DefinitionMismatch::Name {
                        what,
                        index,
                        name: name(),
                        signature: e.name.clone(),
                    });
                }
                if tensor.dtype != e.dtype {
                    return Err(DefinitionMismatch::DType {
                        what,
                        index,
                        name: name(),
                        definition: tensor.dtype,
                        signature: e.dtype,
                    });
                }
                let sizes: Vec<Option<i64>> = def
                    .visible_axes(t)
                    .iter()
                    .map(|id| def.eval(&def.id(*id).extent))
                    .collect();
                let matches = sizes.len() == e.shape.len()
                    && sizes
                        .iter()
                        .zip(&e.shape)
                        .all(|(s, g)| s.and_then(|s| usize::try_from(s).ok()) == Some(*g));
                if !matches {
                    return Err(DefinitionMismatch::Shape {
                        what,
                        index,
                        name: name(),
                        definition: sizes,
                        signature: e.shape.clone(),
                    });
                }
            }
        }
        Ok(())
    }

    /// The value of parameter `name`.
    pub fn param(&self, name: &str) -> Option<i64> {
        self.params.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
    }

    /// The parameter that plays `role`, if one does.
    pub fn role(&self, role: ParamRole) -> Option<&str> {
        self.roles
            .iter()
            .find(|(r, _)| *r == role)
            .map(|(_, n)| n.as_str())
    }

    /// Every device the program runs on: [`Signature::devices`], else those its inputs and
    /// outputs name.
    pub fn all_devices(&self) -> Vec<i64> {
        let mut d: Vec<i64> = self
            .inputs
            .iter()
            .chain(&self.outputs)
            .filter_map(|t| t.sharding.mesh.as_ref())
            .flat_map(|m| m.devices().iter().copied())
            .chain(self.devices.iter().copied())
            .collect();
        d.sort_unstable();
        d.dedup();
        d
    }
}

/// One input or output of a host program, in global terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSig {
    /// The tensor's name in the fusion.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// The global (logical) shape, outermost first: the one name for a shape across the
    /// Rust API (`Tensor::shape`), Python (`TensorSpec.shape`) and here.
    pub shape: Vec<usize>,
    /// How the global tensor is cut across ranks.
    pub sharding: Sharding,
}

/// Where each element of a global tensor lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sharding {
    /// The devices holding the tensor; `None` for a tensor every rank holds whole.
    pub mesh: Option<DeviceMesh>,
    /// One split tree per logical axis.
    pub axes: Vec<AxisSplit>,
}

/// The split tree of one logical axis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AxisSplit {
    /// A leaf and its parallel type (its extent is what its parent's chunk has).
    Leaf(ParallelType),
    /// A split: an outer split by `factor` makes `factor` chunks, an inner split chunks of
    /// `factor` elements.
    Split {
        /// Outer or inner.
        kind: SplitKind,
        /// The chunk count (outer) or chunk length (inner).
        factor: usize,
        /// The tree below the outer output.
        outer: Box<AxisSplit>,
        /// The tree below the inner output.
        inner: Box<AxisSplit>,
    },
}

impl AxisSplit {
    /// A split's cut of an axis of `len` elements with its outer and inner trees, or a
    /// leaf's parallel type.
    fn cut(&self, len: usize) -> Result<(Cut, &AxisSplit, &AxisSplit), ParallelType> {
        match self {
            AxisSplit::Leaf(parallel) => Err(*parallel),
            AxisSplit::Split {
                kind,
                factor,
                outer,
                inner,
            } => Ok((Cut::of(*kind, *factor, len), outer, inner)),
        }
    }

    /// Global indices of this axis held by the rank at `coords`, in local order, when the
    /// axis has `len` elements: each chunk's subtree sees the chunk's own length.
    fn indices(&self, len: usize, coords: &dyn Fn(ParallelType) -> usize) -> Vec<usize> {
        match self.cut(len) {
            Err(parallel) => {
                if parallel.is_device() {
                    let c = coords(parallel);
                    if c < len {
                        vec![c]
                    } else {
                        Vec::new()
                    }
                } else {
                    (0..len).collect()
                }
            }
            Ok((cut, outer, inner)) => {
                let mut out = Vec::new();
                for a in cut.chunks(outer, coords) {
                    for b in inner.indices(cut.chunk(a), coords) {
                        out.push(a * cut.stride + b);
                    }
                }
                out
            }
        }
    }

    /// How many of this axis' `len` elements the rank at `coords` holds: what
    /// [`AxisSplit::indices`] would list, counted without listing them (an axis may be far
    /// longer than memory holds).
    fn count(&self, len: usize, coords: &dyn Fn(ParallelType) -> usize) -> usize {
        match self.cut(len) {
            Err(parallel) => {
                if parallel.is_device() {
                    usize::from(coords(parallel) < len)
                } else {
                    len
                }
            }
            Ok((cut, outer, inner)) => {
                match outer {
                    // Every chunk: the full ones, then the short last one (and empty ones).
                    AxisSplit::Leaf(p) if !p.is_device() => {
                        let full = len.checked_div(cut.stride).unwrap_or(0).min(cut.outer_len);
                        let mut n = full.saturating_mul(inner.count(cut.stride, coords));
                        if full < cut.outer_len {
                            n = n.saturating_add(inner.count(cut.chunk(full), coords));
                        }
                        n
                    }
                    _ => cut
                        .chunks(outer, coords)
                        .into_iter()
                        .map(|a| inner.count(cut.chunk(a), coords))
                        .fold(0usize, usize::saturating_add),
                }
            }
        }
    }

    /// The most chunks any Stream split of this tree cuts its part of an axis of `len`
    /// elements into (0 without one).
    fn stream_chunks(&self, len: usize) -> usize {
        match self.cut(len) {
            Err(_) => 0,
            Ok((cut, outer, inner)) => {
                let here = match *outer {
                    AxisSplit::Leaf(ParallelType::Stream) => cut.outer_len,
                    _ => 0,
                };
                here.max(outer.stream_chunks(cut.outer_len))
                    .max(inner.stream_chunks(cut.stride.min(len)))
            }
        }
    }

    fn print(&self, out: &mut String) {
        match self {
            AxisSplit::Leaf(p) => out.push_str(p.name()),
            AxisSplit::Split {
                kind,
                factor,
                outer,
                inner,
            } => {
                out.push_str(match kind {
                    SplitKind::Outer => "outer(",
                    SplitKind::Inner => "inner(",
                });
                let _ = write!(out, "{factor}, ");
                outer.print(out);
                out.push_str(", ");
                inner.print(out);
                out.push(')');
            }
        }
    }
}

/// How a split of an axis of `len` elements cuts it: `outer_len` chunks of `stride`, the
/// last ones shorter or empty.
struct Cut {
    len: usize,
    outer_len: usize,
    stride: usize,
}

impl Cut {
    fn of(kind: SplitKind, factor: usize, len: usize) -> Cut {
        let f = factor.max(1);
        let (outer_len, stride) = match kind {
            SplitKind::Outer => (f, len.div_ceil(f)),
            SplitKind::Inner => (len.div_ceil(f), f),
        };
        Cut {
            len,
            outer_len,
            stride,
        }
    }

    /// The length of chunk `a`.
    fn chunk(&self, a: usize) -> usize {
        self.len
            .saturating_sub(a.saturating_mul(self.stride))
            .min(self.stride)
    }

    /// The chunks the rank at `coords` takes under the outer tree `outer`. Chunks at or
    /// past the end are empty, so a plain outer axis lists only those that hold elements (a
    /// factor may be far larger than the axis).
    fn chunks(&self, outer: &AxisSplit, coords: &dyn Fn(ParallelType) -> usize) -> Vec<usize> {
        match outer {
            AxisSplit::Leaf(p) if !p.is_device() => {
                (0..self.outer_len.min(self.len.div_ceil(self.stride.max(1)))).collect()
            }
            _ => outer.indices(self.outer_len, coords),
        }
    }
}

/// How a signature's definition disagrees with the signature
/// ([`Signature::check_definition`]). `what` is "input" or "output", `index` its position
/// and `name` the definition's name of it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DefinitionMismatch {
    /// A parameter has another value in the definition.
    #[error(
        "the definition's parameter `{name}` is {definition} but the signature's is {signature}"
    )]
    Param {
        /// The parameter.
        name: String,
        /// Its value in the definition.
        definition: i64,
        /// Its value in the signature.
        signature: i64,
    },
    /// The definition has another number of inputs (or outputs).
    #[error("the definition has {definition} {what}(s) but the signature {signature}")]
    Count {
        /// "input" or "output".
        what: &'static str,
        /// How many the definition has.
        definition: usize,
        /// How many the signature has.
        signature: usize,
    },
    /// An input or output has another name in the signature.
    #[error("the definition's {what} {index} `{name}` is `{signature}` in the signature")]
    Name {
        /// "input" or "output".
        what: &'static str,
        /// Its position.
        index: usize,
        /// Its name in the definition.
        name: String,
        /// Its name in the signature.
        signature: String,
    },
    /// An input or output has another element type in the signature.
    #[error("the definition's {what} {index} `{name}` is {definition} but the signature says {signature}")]
    DType {
        /// "input" or "output".
        what: &'static str,
        /// Its position.
        index: usize,
        /// Its name in the definition.
        name: String,
        /// Its element type in the definition.
        definition: DType,
        /// Its element type in the signature.
        signature: DType,
    },
    /// An input or output has another global shape in the signature.
    #[error(
        "the definition's {what} {index} `{name}` has shape [{}] but the signature says {signature:?}",
        shown_sizes(.definition)
    )]
    Shape {
        /// "input" or "output".
        what: &'static str,
        /// Its position.
        index: usize,
        /// Its name in the definition.
        name: String,
        /// Its sizes in the definition, `None` where an extent has no value.
        definition: Vec<Option<i64>>,
        /// Its shape in the signature.
        signature: Vec<usize>,
    },
}

/// `4, ?, 8`: sizes with `?` for those without a value.
fn shown_sizes(sizes: &[Option<i64>]) -> String {
    let shown: Vec<String> = sizes
        .iter()
        .map(|s| s.map_or_else(|| "?".to_string(), |v| v.to_string()))
        .collect();
    shown.join(", ")
}

/// Why a tensor cannot be sharded or put back together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardError(pub String);

impl fmt::Display for ShardError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ShardError {}

fn eval(fusion: &Fusion, id: IterDomainId, what: &str) -> Result<usize, ShardError> {
    let e = &fusion.id(id).extent;
    fusion
        .eval(e)
        .and_then(|v| usize::try_from(v).ok())
        .ok_or_else(|| ShardError(format!("{what}: extent `{}` has no value", e.to_source())))
}

impl TensorSig {
    /// The signature entry of tensor `t` of `fusion` (schedules applied, parameters bound):
    /// its memory layout is the allocation domain once finalized (it may replay the loop
    /// domain's splits with fresh ids), else the loop domain, whose device splits are where
    /// the sharding lives.
    pub fn of(fusion: &Fusion, t: TensorId) -> Result<TensorSig, ShardError> {
        let tv = fusion.tensor(t);
        let domain = match &tv.allocation {
            Some(a) => a,
            None => &tv.loop_domain,
        };
        let mut children: HashMap<IterDomainId, (IterDomainId, IterDomainId, SplitKind)> =
            HashMap::new();
        let mut work: Vec<IterDomainId> = domain.clone();
        while let Some(id) = work.pop() {
            if tv.logical.contains(&id) {
                continue;
            }
            let Some(def) = fusion.id(id).definition else {
                continue;
            };
            match fusion.id_expr(def) {
                IdExpr::Split {
                    input,
                    outer,
                    inner,
                    kind,
                    ..
                } => {
                    if let Some((o, i, _)) = children.get(input) {
                        if (o, i) != (outer, inner) {
                            return Err(ShardError(format!(
                                "tensor `{}` splits one axis in two different ways",
                                tv.name
                            )));
                        }
                        continue;
                    }
                    children.insert(*input, (*outer, *inner, *kind));
                    work.push(*input);
                }
                IdExpr::Merge { outer, inner, .. } => {
                    // A merge that stays local (no device leaf under it) does not change
                    // which elements a rank holds.
                    work.push(*outer);
                    work.push(*inner);
                }
            }
        }
        fn tree(
            fusion: &Fusion,
            id: IterDomainId,
            children: &HashMap<IterDomainId, (IterDomainId, IterDomainId, SplitKind)>,
            name: &str,
        ) -> Result<AxisSplit, ShardError> {
            match children.get(&id) {
                None => Ok(AxisSplit::Leaf(fusion.id(id).parallel)),
                Some((outer, inner, kind)) => Ok(AxisSplit::Split {
                    kind: *kind,
                    factor: match kind {
                        SplitKind::Outer => eval(fusion, *outer, name)?,
                        SplitKind::Inner => eval(fusion, *inner, name)?,
                    },
                    outer: Box::new(tree(fusion, *outer, children, name)?),
                    inner: Box::new(tree(fusion, *inner, children, name)?),
                }),
            }
        }
        let mut axes = Vec::new();
        let mut global = Vec::new();
        for l in fusion.visible_axes(t) {
            global.push(eval(fusion, l, &tv.name)?);
            axes.push(tree(fusion, l, &children, &tv.name)?);
        }
        Ok(TensorSig {
            name: tv.name.clone(),
            dtype: tv.dtype,
            shape: global,
            sharding: Sharding {
                mesh: fusion.mesh_of(t).cloned(),
                axes,
            },
        })
    }

    /// The most chunks a Stream split of the tensor cuts an axis into (0 without one): a
    /// run refuses more than a loop may run before it lists any chunk.
    pub fn stream_chunks(&self) -> usize {
        self.sharding
            .axes
            .iter()
            .zip(&self.shape)
            .map(|(a, &len)| a.stream_chunks(len))
            .max()
            .unwrap_or(0)
    }

    /// The number of elements of the global tensor (saturating).
    pub fn global_len(&self) -> usize {
        self.shape
            .iter()
            .try_fold(1usize, |a, &b| a.checked_mul(b))
            .unwrap_or(usize::MAX)
    }

    /// Whether `rank` holds a piece of the tensor (it is in the tensor's mesh, or the tensor
    /// has none).
    pub fn holds(&self, rank: usize) -> bool {
        self.sharding
            .mesh
            .as_ref()
            .is_none_or(|m| i64::try_from(rank).is_ok_and(|r| m.has(r)))
    }

    /// The rank's coordinate along each device parallel type.
    fn coords(&self, rank: usize) -> impl Fn(ParallelType) -> usize + '_ {
        let mesh = self.sharding.mesh.as_ref();
        let pos = mesh
            .and_then(|m| {
                m.devices()
                    .iter()
                    .position(|&d| Ok(d) == i64::try_from(rank))
            })
            .unwrap_or(0);
        move |pt: ParallelType| {
            let Some(m) = mesh else { return 0 };
            let shape = m.shape();
            let Some(from_end) = pt.mesh_axis_from_end() else {
                return 0;
            };
            if from_end >= shape.len() {
                return 0;
            }
            let axis = shape.len() - 1 - from_end;
            let stride: usize = shape[axis + 1..].iter().product();
            (pos / stride.max(1)) % shape[axis].max(1)
        }
    }

    /// For each axis, the global index of every position of `rank`'s buffer along it.
    pub fn axis_indices(&self, rank: usize) -> Vec<Vec<usize>> {
        self.per_axis(rank, AxisSplit::indices)
    }

    /// `f(split, global size, rank's coordinates)` for each axis of `rank`'s buffer.
    fn per_axis<T>(
        &self,
        rank: usize,
        f: impl Fn(&AxisSplit, usize, &dyn Fn(ParallelType) -> usize) -> T,
    ) -> Vec<T> {
        let coords = self.coords(rank);
        self.sharding
            .axes
            .iter()
            .zip(&self.shape)
            .map(|(a, &len)| f(a, len, &coords))
            .collect()
    }

    /// The sizes of `rank`'s buffer (counted, never listed: an axis may be longer than
    /// memory holds).
    pub fn local_sizes_of(&self, rank: usize) -> Vec<usize> {
        self.per_axis(rank, AxisSplit::count)
    }

    /// The sizes of one rank's buffer (of the first device of the mesh; device splits
    /// divide, so every device holds as many).
    pub fn local_sizes(&self) -> Vec<usize> {
        let first = self
            .sharding
            .mesh
            .as_ref()
            .and_then(|m| m.devices().first().copied())
            .and_then(|d| usize::try_from(d).ok())
            .unwrap_or(0);
        self.local_sizes_of(first)
    }

    /// For each element of `rank`'s buffer (row-major), its row-major index in the global
    /// tensor.
    pub fn global_indices(&self, rank: usize) -> Vec<usize> {
        let per_axis = self.axis_indices(rank);
        let mut strides = vec![1usize; self.shape.len()];
        for a in (0..self.shape.len().saturating_sub(1)).rev() {
            strides[a] = strides[a + 1].saturating_mul(self.shape[a + 1]);
        }
        let mut out = vec![0usize];
        for (a, idx) in per_axis.iter().enumerate() {
            let mut next = Vec::with_capacity(out.len().saturating_mul(idx.len()));
            for base in &out {
                for &i in idx {
                    next.push(base + i * strides[a]);
                }
            }
            out = next;
        }
        out
    }

    /// `rank`'s buffer of the global tensor `global` (row-major, [`TensorSig::shape`]).
    pub fn shard<T: Copy>(&self, global: &[T], rank: usize) -> Result<Vec<T>, ShardError> {
        if global.len() != self.global_len() {
            return Err(ShardError(format!(
                "tensor `{}` has global sizes {:?} ({} elements), but {} were given",
                self.name,
                self.shape,
                self.global_len(),
                global.len()
            )));
        }
        // Row-major over the rank's indices of each axis (the order of
        // `global_indices`), without materializing them, into a buffer whose allocation
        // failing is an error rather than an abort.
        let per_axis = self.axis_indices(rank);
        let n = per_axis
            .iter()
            .try_fold(1usize, |acc, v| acc.checked_mul(v.len()))
            .ok_or_else(|| {
                ShardError(format!(
                    "tensor `{}`: rank {rank}'s shard has more elements than can be counted",
                    self.name
                ))
            })?;
        let mut out = Vec::new();
        out.try_reserve_exact(n).map_err(|_| {
            ShardError(format!(
                "tensor `{}`: rank {rank}'s shard of {n} elements ({} bytes) of host memory \
                 could not be allocated",
                self.name,
                n.saturating_mul(size_of::<T>())
            ))
        })?;
        if n == 0 {
            return Ok(out);
        }
        let axes = per_axis.len();
        let mut strides = vec![1usize; axes];
        for a in (0..axes.saturating_sub(1)).rev() {
            strides[a] = strides[a + 1].saturating_mul(self.shape[a + 1]);
        }
        let mut pos = vec![0usize; axes];
        loop {
            let offset: usize = (0..axes).map(|a| per_axis[a][pos[a]] * strides[a]).sum();
            out.push(global[offset]);
            let mut a = axes;
            loop {
                if a == 0 {
                    return Ok(out);
                }
                a -= 1;
                pos[a] += 1;
                if pos[a] < per_axis[a].len() {
                    break;
                }
                pos[a] = 0;
            }
        }
    }

    /// The global tensor put back together from every rank's buffer (`locals[r]` is rank
    /// `r`'s; ranks that do not hold the tensor are skipped). Where ranks hold the same
    /// element, the lowest rank's copy wins; elements no rank holds are `fill`.
    pub fn unshard<T: Copy, L: AsRef<[T]>>(
        &self,
        locals: &[L],
        fill: T,
    ) -> Result<Vec<T>, ShardError> {
        let numel = self.global_len();
        let mut data = vec![fill; numel];
        let mut filled = vec![false; numel];
        for (rank, local) in locals.iter().enumerate() {
            if !self.holds(rank) {
                continue;
            }
            let local = local.as_ref();
            let idx = self.global_indices(rank);
            if local.len() != idx.len() {
                return Err(ShardError(format!(
                    "rank {rank}'s buffer of `{}` has {} elements, its shard {}",
                    self.name,
                    local.len(),
                    idx.len()
                )));
            }
            for (v, g) in local.iter().zip(idx) {
                if !filled[g] {
                    data[g] = *v;
                    filled[g] = true;
                }
            }
        }
        Ok(data)
    }

    /// The signature line without its `input`/`output` keyword:
    /// `inp: bf16[8, 8] on [2](0 1) split(outer(4, Stream, Serial), outer(2, DIDx, Serial))`.
    pub fn to_text(&self) -> String {
        let sizes: Vec<String> = self.shape.iter().map(usize::to_string).collect();
        let mut out = format!("{}: {}[{}]", self.name, self.dtype, sizes.join(", "));
        if let Some(m) = &self.sharding.mesh {
            let shape: Vec<String> = m.shape().iter().map(usize::to_string).collect();
            let devices: Vec<String> = m.devices().iter().map(i64::to_string).collect();
            let _ = write!(out, " on [{}]({})", shape.join(", "), devices.join(" "));
        }
        out.push_str(" split(");
        for (k, a) in self.sharding.axes.iter().enumerate() {
            if k > 0 {
                out.push_str(", ");
            }
            a.print(&mut out);
        }
        out.push(')');
        out
    }
}

/// The printed `Signature:` block (without the definition), one line per entry, each
/// indented by two spaces.
pub fn print_signature(s: &Signature) -> String {
    let mut out = String::from("Signature:\n  params(");
    let params: Vec<String> = s.params.iter().map(|(n, v)| format!("{n}={v}")).collect();
    out.push_str(&params.join(", "));
    out.push(')');
    if !s.devices.is_empty() {
        let devices: Vec<String> = s.devices.iter().map(i64::to_string).collect();
        let _ = write!(out, " devices({})", devices.join(" "));
    }
    if !s.roles.is_empty() {
        let roles: Vec<String> = s
            .roles
            .iter()
            .map(|(r, n)| format!("{}={n}", r.keyword()))
            .collect();
        let _ = write!(out, " roles({})", roles.join(", "));
    }
    out.push('\n');
    for t in &s.inputs {
        let _ = writeln!(out, "  input {}", t.to_text());
    }
    for t in &s.outputs {
        let _ = writeln!(out, "  output {}", t.to_text());
    }
    out
}

#[cfg(test)]
mod tests;
