//! weave-codegen: CUDA C code generation for kernel segments. A fusion becomes a short list
//! of generated kernels over strided views of the segment's buffers ([`plan`]). A program's
//! plans are made before it runs, into weave-executor's kernel table (every launch of every
//! rank); the CUDA backend compiles and launches what the table holds, and `weave dump`
//! prints the table (`--kernels`: its CUDA C), in a build with or without CUDA.
//!
//! The generator follows weave-executor's fusion interpreter (`interp`) op by op, with the
//! same result sizes (`weave_ir::shape`: broadcasts and reshapes), but on *lazy values*:
//! a value is an expression over an index space (its sizes) whose leaves load from strided
//! views. View ops (set, broadcast, squeeze, permute, reshape) rewrite the leaves' strides and
//! move no data; pointwise ops build the expression. Sizes and strides are constants in the
//! source, so a source is specific to one chunk shape; the CUDA backend caches sources by
//! their text (chunks of a loop share one).
//!
//! Two plans, tried in order:
//!
//! * **Row kernels** (the persistent normalization pattern: softmax, LayerNorm, RMSNorm, a
//!   row sum). When every reduction of the fusion reduces the innermost axes of values that
//!   share their outer axes (the *rows*), and every output is a row or one value per row,
//!   the whole fusion is one kernel: a block per row computes each reduction in turn (a
//!   strided pass over the row, then a warp-shuffle block reduction; later passes may use
//!   earlier results, [`Node::Row`]) and finally writes the outputs. The row is read once
//!   from DRAM; later passes find it in L1/L2.
//! * **Kernel by kernel** otherwise: a reduction, an operand that must be broadcast after
//!   computation, or a view a stride rewrite cannot express materializes its value into a
//!   temporary with its own kernel; each output is finally materialized into its buffer.
//!   Reductions over the innermost axes run as row kernels of one pass; reductions over the
//!   outermost axes give each thread a column and split the rows over blocks (partial sums,
//!   then one more pass); other reductions loop per output element.
//!
//! Pointwise kernels and the passes of row kernels move `V` elements per access (16 bytes when
//! the types allow; a pointwise thread takes 4 such vectors per iteration), with a scalar
//! fallback kernel for buffers that are not aligned to the vector (see [`Launch::align`]);
//! they index in 32 bits where every offset fits and size their grid from the SM count they
//! are planned for (the kernel table's). A row kernel whose row splits evenly over its block
//! keeps each thread's vectors in registers from the first pass to the last, so the row is
//! read once.
//!
//! Arithmetic runs in `float` (or `double` when an f64 or i64 tensor is involved); bf16 and
//! f16 are loaded and stored through PTX conversions (round to nearest even), so no header
//! is needed. Kernels whose results are all stored in 16 bits use `__expf`, `__fdividef` and
//! the hardware `tanh.approx`, whose errors are below a 16-bit rounding. A `cast` rounds to
//! its type in place, as the interpreter does.
//!
//! The crate is split by concern: `expr` (buffers, strided views and the expression tree of
//! a lazy value), `view` (stride arithmetic: broadcasting and reshaping a view without moving
//! data), `plan` (the generator that walks a fusion op by op and chooses the kernels), `source`
//! (the CUDA C of each kind of kernel) and `emit` (CUDA C text of one expression inside an
//! element loop).
//!
//! Architecture Invariant: weave-codegen knows fusions and dtypes, nothing of host programs,
//! communicators or CUDA libraries: its output is text (CUDA C sources, their grids and
//! parameters) that the executor compiles with NVRTC and launches. It depends on weave-ir
//! alone and never on cudarc.

mod emit;
mod expr;
mod plan;
mod source;
mod view;

pub use expr::{Buf, Node, View};
pub use plan::{plan, PlanError};

use weave_ir::DType;

/// How a segment's buffer is laid out: element type, sizes and element strides.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorArg {
    /// Element type.
    pub dtype: DType,
    /// Sizes.
    pub sizes: Vec<usize>,
    /// Element strides, one per axis.
    pub strides: Vec<usize>,
}

/// The most waves of blocks a grid-stride loop is launched with. The hardware starts a block
/// as another finishes, so many short-lived blocks leave a short tail, which one wave of
/// long-lived blocks, each looping over its share, did not: at 16384 × 8192 on an H100, one
/// wave ran softmax at 86% of memcpy, and LayerNorm, SiLU and add 4–9% slower than 16 waves
/// (docs/benchmarks.md). Beyond 16 waves every block still loops, which keeps very large
/// grids of tiny blocks from paying a block's start-up per element.
pub const GRID_WAVES: usize = 16;

/// How a kernel is launched: its grid, from the device's SM count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grid {
    /// A grid-stride loop over `n` work items, one per thread, blocks of `block` threads.
    Items {
        /// Work items.
        n: usize,
        /// Threads per block.
        block: u32,
    },
    /// A grid-stride loop over `rows` rows, one block of `block` threads per row.
    Rows {
        /// Rows.
        rows: usize,
        /// Threads per block.
        block: u32,
    },
    /// Exactly `blocks` blocks of `block` threads.
    Blocks {
        /// Blocks.
        blocks: usize,
        /// Threads per block.
        block: u32,
    },
}

impl Grid {
    /// `(blocks, threads per block)` on a device of `sms` SMs; `None` when there is no work.
    ///
    /// A grid-stride loop gets as many blocks as its work has, up to [`GRID_WAVES`] waves of
    /// them (a wave: every SM full at 2048 threads).
    pub fn dims(&self, sms: usize) -> Option<(u32, u32)> {
        let cap = |block: u32| GRID_WAVES * sms.max(1) * (2048 / block.max(32) as usize).max(1);
        let (blocks, block) = match *self {
            Grid::Items { n, block } => (n.div_ceil(block as usize).min(cap(block)), block),
            Grid::Rows { rows, block } => (rows.min(cap(block)), block),
            Grid::Blocks { blocks, block } => (blocks, block),
        };
        (blocks > 0).then(|| (blocks.min(u32::MAX as usize) as u32, block))
    }
}

/// One generated kernel.
#[derive(Clone, Debug)]
pub struct Launch {
    /// The kernel's name in `source`.
    pub name: String,
    /// CUDA C source.
    pub source: String,
    /// Its grid.
    pub grid: Grid,
    /// The kernel's parameters: the base address of each buffer, in order.
    pub args: Vec<Buf>,
    /// `(parameter, bytes)`: the alignment each vector access assumes of a parameter's
    /// address; when an address misses one, [`Launch::fallback`] runs instead.
    pub align: Vec<(usize, usize)>,
    /// The same kernel one element per iteration (no alignment needed).
    pub fallback: Option<Box<Launch>>,
}

impl Launch {
    /// The kernel to run for buffers at `addresses` (one per parameter): this one, or its
    /// fallback when an address is not aligned for the vector accesses.
    pub fn for_addresses(&self, addresses: &[u64]) -> &Launch {
        let aligned = self
            .align
            .iter()
            .all(|(k, bytes)| addresses.get(*k).is_some_and(|a| a % *bytes as u64 == 0));
        match (&self.fallback, aligned) {
            (Some(f), false) => f,
            _ => self,
        }
    }
}

/// What running a segment takes: temporaries to allocate, then kernels in order.
#[derive(Clone, Debug, Default)]
pub struct KernelPlan {
    /// Element type and element count of each temporary (contiguous).
    pub temps: Vec<(DType, usize)>,
    /// The kernels, in launch order.
    pub launches: Vec<Launch>,
}
