//! The expression tree of generated kernels: the buffers a kernel reads and writes, strided
//! views of them, and expressions over an index space whose leaves are views; a lazy value
//! (an expression with its sizes) and the rows of a row kernel. [`plan`] builds the trees and
//! plans the kernels; [`emit`] writes a tree as CUDA C.
//!
//! [`plan`]: crate::plan
//! [`emit`]: crate::emit

use weave_ir::{BinaryOp, DType, ReduceOp, UnaryOp};

/// A buffer a generated kernel reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Buf {
    /// The segment's `n`-th input.
    Input(usize),
    /// The segment's `n`-th output.
    Output(usize),
    /// The plan's `n`-th temporary.
    Temp(usize),
}

/// A strided view of a buffer: the leaf of an expression.
#[derive(Clone, Debug)]
pub struct View {
    /// The buffer.
    pub buf: Buf,
    /// Its element type.
    pub dtype: DType,
    /// The element offset of index 0.
    pub offset: isize,
    /// Sizes of the index space.
    pub sizes: Vec<usize>,
    /// Element strides, one per axis (0 where broadcast).
    pub strides: Vec<isize>,
}

/// An expression over an index space.
#[derive(Clone, Debug)]
pub enum Node {
    /// A load of the view at the index.
    Load(View),
    /// The `k`-th reduction of a row kernel, for the index's row.
    Row(usize),
    /// Rounds to a type.
    Cast(DType, Box<Node>),
    /// A unary op.
    Unary(UnaryOp, Box<Node>),
    /// A binary op.
    Binary(BinaryOp, Box<Node>, Box<Node>),
    /// `where(c, x, y)`.
    Where(Box<Node>, Box<Node>, Box<Node>),
    /// A literal operand, in the compute type.
    Lit(f64),
    /// The view's element offset at the index, as a value (`iota`): the view's strides pick
    /// the axis and its offset the first index, so views (permute, broadcast, slice) move it
    /// as they move loads; nothing is read.
    Index(View),
    /// `index_select`: the table's element at the index with the indexed axis's index
    /// replaced by the row the ids name. `table` is a view over the result's index space
    /// whose indexed axis has stride 0; the row `ids - base` is added as `row * row_stride`
    /// (in 64 bits), and a row outside `0..rows` reads zero, never out of bounds.
    Gather {
        /// The table, over the result's index space.
        table: View,
        /// The element stride of one row.
        row_stride: isize,
        /// The rows the kernel's operand holds.
        rows: usize,
        /// The global row of the operand's first row (a device's block of a split table).
        base: i64,
        /// The ids, over the result's index space.
        ids: Box<Node>,
    },
}

/// A value of the fusion being planned: an expression over an index space of `sizes`.
#[derive(Clone, Debug)]
pub(crate) struct Lazy {
    pub(crate) dtype: DType,
    pub(crate) sizes: Vec<usize>,
    pub(crate) node: Node,
}

impl Lazy {
    /// The value with index space `sizes` that a view op makes of this one, every load's
    /// view rewritten by `f`; `err` when some load cannot be.
    pub(crate) fn view_as(
        &self,
        sizes: Vec<usize>,
        f: &dyn Fn(&View) -> Option<View>,
        err: &str,
    ) -> Result<Lazy, String> {
        let node = self.node.map_loads(f).ok_or(err)?;
        Ok(Lazy {
            dtype: self.dtype,
            sizes,
            node,
        })
    }
}

impl Node {
    /// Rewrites every leaf with `f`; `None` when some leaf cannot be rewritten.
    pub(crate) fn map_loads(&self, f: &dyn Fn(&View) -> Option<View>) -> Option<Node> {
        Some(match self {
            Node::Load(v) => Node::Load(f(v)?),
            Node::Row(k) => Node::Row(*k),
            Node::Lit(v) => Node::Lit(*v),
            Node::Index(v) => Node::Index(f(v)?),
            Node::Cast(d, x) => Node::Cast(*d, Box::new(x.map_loads(f)?)),
            Node::Unary(u, x) => Node::Unary(*u, Box::new(x.map_loads(f)?)),
            Node::Binary(b, x, y) => {
                Node::Binary(*b, Box::new(x.map_loads(f)?), Box::new(y.map_loads(f)?))
            }
            Node::Where(c, x, y) => Node::Where(
                Box::new(c.map_loads(f)?),
                Box::new(x.map_loads(f)?),
                Box::new(y.map_loads(f)?),
            ),
            Node::Gather {
                table,
                row_stride,
                rows,
                base,
                ids,
            } => Node::Gather {
                table: f(table)?,
                row_stride: *row_stride,
                rows: *rows,
                base: *base,
                ids: Box::new(ids.map_loads(f)?),
            },
        })
    }

    pub(crate) fn is_load(&self) -> bool {
        matches!(self, Node::Load(_))
    }

    pub(crate) fn dtypes(&self, out: &mut Vec<DType>) {
        match self {
            Node::Load(v) => out.push(v.dtype),
            Node::Index(_) => out.push(DType::I64),
            Node::Cast(d, _) => out.push(*d),
            Node::Gather { table, .. } => out.push(table.dtype),
            Node::Row(_) | Node::Lit(_) | Node::Unary(..) | Node::Binary(..) | Node::Where(..) => {}
        }
        for x in self.operands() {
            x.dtypes(out);
        }
    }

    /// The operand expressions of this node, in order.
    fn operands(&self) -> impl Iterator<Item = &Node> {
        let operands: [Option<&Node>; 3] = match self {
            Node::Load(_) | Node::Row(_) | Node::Lit(_) | Node::Index(_) => [None, None, None],
            Node::Cast(_, x) | Node::Unary(_, x) | Node::Gather { ids: x, .. } => {
                [Some(x), None, None]
            }
            Node::Binary(_, x, y) => [Some(x), Some(y), None],
            Node::Where(c, x, y) => [Some(c), Some(x), Some(y)],
        };
        operands.into_iter().flatten()
    }
}

impl Node {
    /// Every view the expression loads.
    pub(crate) fn loads<'a>(&'a self, out: &mut Vec<&'a View>) {
        match self {
            Node::Load(v) => out.push(v),
            Node::Gather { table, .. } => out.push(table),
            Node::Row(_)
            | Node::Lit(_)
            | Node::Index(_)
            | Node::Cast(..)
            | Node::Unary(..)
            | Node::Binary(..)
            | Node::Where(..) => {}
        }
        for x in self.operands() {
            x.loads(out);
        }
    }

    /// Whether the expression uses a row kernel's reduction.
    pub(crate) fn has_row(&self) -> bool {
        matches!(self, Node::Row(_)) || self.operands().any(|x| x.has_row())
    }
}

impl Node {
    /// Whether the expression loads anything.
    pub(crate) fn loads_any(&self) -> bool {
        let mut v = Vec::new();
        self.loads(&mut v);
        !v.is_empty()
    }
}

/// The rows of a row kernel and its reduction passes.
#[derive(Clone, Debug, Default)]
pub(crate) struct Rows {
    /// The outer sizes (one row per index), set by the first reduction.
    pub(crate) outer: Option<Vec<usize>>,
    /// The sizes of a row.
    pub(crate) inner: Vec<usize>,
    /// Each pass: its reduction and the expression it reduces over `outer ++ inner`.
    pub(crate) passes: Vec<(ReduceOp, Node)>,
}
