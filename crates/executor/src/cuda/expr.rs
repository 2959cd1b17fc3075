//! The expression tree of generated kernels: the buffers a kernel reads and writes, strided
//! views of them, and expressions over an index space whose leaves are views. [`codegen`]
//! builds the trees and plans the kernels; [`emit`] writes a tree as CUDA C.
//!
//! [`codegen`]: super::codegen
//! [`emit`]: super::emit

use weave_ir::{BinaryOp, DType, UnaryOp};

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
