//! The ops of a fusion on lazy values: views rewrite strides, pointwise ops build the
//! expression, and what a stride rewrite cannot express goes through a temporary.

use weave_ir::shape::{broadcast_shapes, reshape_sizes};
use weave_ir::{DType, ExprKind};

use super::{Gen, NOT_ROWS};
use crate::expr::Lazy;
use crate::{Buf, Node, View};

impl Gen<'_> {
    /// The value of one expr of kind `kind` (its output `out_t` of `dtype`) from its
    /// operands' values.
    pub(super) fn op(
        &mut self,
        kind: &ExprKind,
        in_ids: &[weave_ir::TensorId],
        out_t: weave_ir::TensorId,
        dtype: DType,
        ins: Vec<Lazy>,
    ) -> Result<Lazy, String> {
        let x = ins.first().cloned().ok_or("no operand")?;
        Ok(match kind {
            ExprKind::Set | ExprKind::SegmentSet => x,
            ExprKind::Cast(d) => Lazy {
                dtype,
                sizes: x.sizes,
                node: Node::Cast(*d, Box::new(x.node)),
            },
            ExprKind::Unary(u) => Lazy {
                dtype,
                sizes: x.sizes,
                node: Node::Unary(*u, Box::new(x.node)),
            },
            ExprKind::BinaryLit { op, lit, lit_first } => {
                let (l, v) = (Box::new(Node::Lit(lit.0)), Box::new(x.node));
                let node = if *lit_first {
                    Node::Binary(*op, l, v)
                } else {
                    Node::Binary(*op, v, l)
                };
                Lazy {
                    dtype,
                    sizes: x.sizes,
                    node,
                }
            }
            ExprKind::WhereLit { a, b } => {
                let shapes: Vec<&[usize]> = ins.iter().map(|l| l.sizes.as_slice()).collect();
                let sizes = broadcast_shapes(&shapes).map_err(|e| e.to_string())?;
                let mut nodes = Vec::new();
                for l in ins {
                    nodes.push(self.broadcast(l, &sizes)?);
                }
                let [c, v] = <[Node; 2]>::try_from(nodes)
                    .map_err(|n| format!("expected a condition and a tensor, got {}", n.len()))?;
                let pick = |lit: &Option<weave_ir::Literal>| match lit {
                    Some(l) => Box::new(Node::Lit(l.0)),
                    None => Box::new(v.clone()),
                };
                let node = Node::Where(Box::new(c.clone()), pick(a), pick(b));
                Lazy { dtype, sizes, node }
            }
            ExprKind::Binary(_) | ExprKind::Where => {
                let shapes: Vec<&[usize]> = ins.iter().map(|l| l.sizes.as_slice()).collect();
                let sizes = broadcast_shapes(&shapes).map_err(|e| e.to_string())?;
                let mut nodes = Vec::new();
                for l in ins {
                    nodes.push(self.broadcast(l, &sizes)?);
                }
                let node = match (kind, nodes.as_slice()) {
                    (ExprKind::Binary(b), [a, c]) => {
                        Node::Binary(*b, Box::new(a.clone()), Box::new(c.clone()))
                    }
                    (ExprKind::Where, [c, a, b]) => Node::Where(
                        Box::new(c.clone()),
                        Box::new(a.clone()),
                        Box::new(b.clone()),
                    ),
                    _ => return Err(format!("expected its operands, got {}", nodes.len())),
                };
                Lazy { dtype, sizes, node }
            }
            ExprKind::Reduction { op, axes } => {
                if self.rows.is_some() {
                    self.row_pass(&x, *op, axes, dtype)?
                } else {
                    self.reduce(&x, *op, axes, dtype)?
                }
            }
            ExprKind::Broadcast { axes } => {
                let rank = x.sizes.len() + axes.len();
                let mut sizes = Vec::with_capacity(rank);
                let mut src = x.sizes.iter();
                for k in 0..rank {
                    sizes.push(if axes.contains(&k) {
                        1
                    } else {
                        *src.next().unwrap_or(&1)
                    });
                }
                self.reshape(x, sizes)?
            }
            ExprKind::Squeeze { axes } => {
                let sizes = (0..x.sizes.len())
                    .filter(|k| !axes.contains(k))
                    .map(|k| x.sizes[k])
                    .collect();
                self.reshape(x, sizes)?
            }
            ExprKind::Permute { perm } => {
                if perm.len() != x.sizes.len() || perm.iter().any(|p| *p >= perm.len()) {
                    return Err(format!("permutation {perm:?} of sizes {:?}", x.sizes));
                }
                if x.node.has_row() {
                    let k = self.outer_rank();
                    if perm.iter().take(k).enumerate().any(|(a, p)| a != *p) {
                        return Err(NOT_ROWS.into());
                    }
                }
                let f = |v: &View| {
                    Some(View {
                        sizes: perm.iter().map(|p| v.sizes[*p]).collect(),
                        strides: perm.iter().map(|p| v.strides[*p]).collect(),
                        ..v.clone()
                    })
                };
                let sizes = perm.iter().map(|p| x.sizes[*p]).collect();
                x.view_as(sizes, &f, "cannot permute")?
            }
            ExprKind::Reshape { shape } => {
                let sizes = reshape_sizes(self.fusion, in_ids[0], out_t, shape, &x.sizes)
                    .map_err(|e| e.to_string())?;
                self.reshape(x, sizes)?
            }
            ExprKind::Iota { axis } => {
                self.whole_axis(kind, in_ids[0], *axis, &x.sizes)?;
                let mut strides = vec![0; x.sizes.len()];
                strides[*axis] = 1;
                let v = View {
                    buf: Buf::Input(0),
                    dtype: DType::I64,
                    offset: 0,
                    sizes: x.sizes.clone(),
                    strides,
                };
                Lazy {
                    dtype,
                    sizes: x.sizes,
                    node: Node::Index(v),
                }
            }
            ExprKind::Slice { axis, start, stop } => {
                self.whole_axis(kind, in_ids[0], *axis, &x.sizes)?;
                if x.node.has_row() {
                    return Err(NOT_ROWS.into());
                }
                let bound = |s: &weave_ir::Scalar| {
                    self.fusion
                        .eval(s)
                        .and_then(|v| usize::try_from(v).ok())
                        .ok_or_else(|| format!("slice bound `{}` has no value", s.to_source()))
                };
                let (b, e) = (bound(start)?, bound(stop)?);
                if b > e || e > x.sizes[*axis] {
                    return Err(format!(
                        "slice {b}..{e} of axis {axis} of sizes {:?}",
                        x.sizes
                    ));
                }
                let (a, len) = (*axis, e - b);
                let f = |v: &View| {
                    let mut sizes = v.sizes.clone();
                    sizes[a] = len;
                    Some(View {
                        offset: v.offset + b as isize * v.strides[a],
                        sizes,
                        ..v.clone()
                    })
                };
                let mut sizes = x.sizes.clone();
                sizes[a] = len;
                x.view_as(sizes, &f, "cannot slice")?
            }
            ExprKind::Concat { axis } => {
                let y = ins.get(1).cloned().ok_or("concat takes two operands")?;
                self.whole_axis(kind, in_ids[0], *axis, &x.sizes)?;
                self.whole_axis(kind, in_ids[1], *axis, &y.sizes)?;
                let a = *axis;
                let mut sizes = x.sizes.clone();
                sizes[a] += y.sizes[a];
                // Two stores into one temporary: `x` into its first part, `y` after it.
                if self.rows.is_some() {
                    return Err(NOT_ROWS.into());
                }
                let t = self.new_temp(dtype, &sizes);
                let part = |n: usize, at: usize| {
                    let mut s = t.sizes.clone();
                    s[a] = n;
                    View {
                        offset: at as isize * t.strides[a],
                        sizes: s,
                        ..t.clone()
                    }
                };
                let (first, second) = (part(x.sizes[a], 0), part(y.sizes[a], x.sizes[a]));
                self.store(&x, &first);
                self.store(&y, &second);
                Lazy {
                    dtype,
                    sizes,
                    node: Node::Load(t),
                }
            }
            ExprKind::IndexSelect { axis, base } => {
                let ids = ins
                    .get(1)
                    .cloned()
                    .ok_or("index_select takes a table and ids")?;
                let a = *axis;
                if a >= x.sizes.len() || ids.sizes.len() != 1 {
                    return Err(format!(
                        "index_select along axis {a} of sizes {:?} by ids of sizes {:?}",
                        x.sizes, ids.sizes
                    ));
                }
                let first = match base {
                    None => {
                        self.whole_axis(kind, in_ids[0], a, &x.sizes)?;
                        0
                    }
                    Some(b) => self.fusion.eval(b).ok_or_else(|| {
                        format!(
                            "index_select: the first row `{}` of this device's block has no value (a vocabulary-parallel lookup's partial runs on a device, which gives `rank` its value)",
                            b.to_source()
                        )
                    })?,
                };
                if x.node.has_row() || ids.node.has_row() {
                    return Err(NOT_ROWS.into());
                }
                let mut sizes = x.sizes.clone();
                sizes[a] = ids.sizes[0];
                // The table as a view of a buffer (a temporary when it is computed).
                let table = match &x.node {
                    Node::Load(v) => v.clone(),
                    _ => match self.materialize(&x)?.node {
                        Node::Load(v) => v,
                        _ => return Err("a temporary is a load".into()),
                    },
                };
                let (rows, row_stride) = (table.sizes[a], table.strides[a]);
                let mut strides = table.strides.clone();
                strides[a] = 0;
                let table = View {
                    sizes: sizes.clone(),
                    strides,
                    ..table
                };
                // The ids along the result's axis `a`, constant along the others.
                let along = |v: &View| {
                    let mut strides = vec![0isize; sizes.len()];
                    strides[a] = *v.strides.first()?;
                    Some(View {
                        sizes: sizes.clone(),
                        strides,
                        ..v.clone()
                    })
                };
                let ids = match ids.node.map_loads(&along) {
                    Some(n) => n,
                    None => self
                        .materialize(&ids)?
                        .node
                        .map_loads(&along)
                        .ok_or("the ids do not index the result")?,
                };
                Lazy {
                    dtype: x.dtype,
                    sizes,
                    node: Node::Gather {
                        table,
                        row_stride,
                        rows,
                        base: first,
                        ids: Box::new(ids),
                    },
                }
            }
            ExprKind::Matmul | ExprKind::Linear => {
                return Err(
                    "a GEMM inside a kernel segment is not supported by the code generator \
                     (GEMMs run as their own host statements)"
                        .into(),
                )
            }
        })
    }
}
