//! The CUDA C of each kind of generated kernel: pointwise (vectors per thread, a grid-stride
//! loop), row (a block per row, passes of block reductions), column (the rows of a column
//! reduction split over blocks, lanes combined in shared memory) and serial reductions; with
//! the block size, unrolling and vector width they share, and the compute type.

use std::fmt::Write as _;

use weave_ir::{DType, ReduceOp};

use crate::emit::{self, decompose, Emitter, Width, PRELUDE};
use crate::expr::{Lazy, Rows};
use crate::view::numel;
use crate::{Buf, Grid, Launch, Node, View};

/// Threads per block of pointwise kernels.
pub(crate) const BLOCK: u32 = 256;

/// Vectors a pointwise kernel's thread handles per iteration of its grid-stride loop (their
/// loads issued together: more bytes in flight per thread).
pub(crate) const UNROLL: usize = 4;

/// The widest vector width (elements) that `views` and `dsts` allow along an innermost axis
/// of `inner` elements: 16 bytes of the widest type, halved until it divides the axis and
/// every destination can be stored as vectors.
pub(crate) fn vector_width(
    inner: usize,
    dtypes: &[DType],
    dsts: &[&View],
    base_len: usize,
) -> usize {
    let widest = dtypes.iter().map(|d| emit::size_of(*d)).max().unwrap_or(1);
    let mut v = (16 / widest).max(1);
    while v > 1 {
        let probe = Emitter::new(
            "float",
            false,
            Width::Wide,
            v,
            vec![String::new(); base_len],
        );
        if inner.is_multiple_of(v) && dsts.iter().all(|d| probe.vectorizable(d)) {
            return v;
        }
        v /= 2;
    }
    1
}

/// A pointwise kernel writing `x` into `dst`, `vec` elements per thread.
pub(crate) fn pointwise(name: &str, x: &Lazy, dst: &View, vec: usize) -> Launch {
    let mut views = Vec::new();
    x.node.loads(&mut views);
    views.push(dst);
    let n = numel(&x.sizes);
    let width = Width::for_views(n, views.iter().copied());
    let ct = compute_type(&x.node, Some(dst.dtype));
    let fast = matches!(dst.dtype, DType::BF16 | DType::F16);
    let (index, base) = decompose(width, "q", "i", &x.sizes, vec);
    let mut e = Emitter::new(ct, fast, width, vec, base);
    let v = e.expr(&x.node);
    let after = e.store(dst, &v);
    let ty = width.ty();
    let nq = n / vec.max(1);
    let mut s = String::from(PRELUDE);
    let _ = writeln!(s, "{} {{", e.signature(name));
    let _ = writeln!(
        s,
        "  const {ty} stride = ({ty})gridDim.x * blockDim.x;\n  \
         for ({ty} q0 = ({ty})blockIdx.x * blockDim.x + threadIdx.x; q0 < {nq}; \
         q0 += stride * {u}) {{\n    #pragma unroll\n    for (int u = 0; u < {UNROLL}; ++u) {{\n      \
         const {ty} q = q0 + u * stride;\n      if (q >= {nq}) break;",
        nq = width.lit(nq as i64),
        u = width.lit(UNROLL as i64),
    );
    for l in &index {
        let _ = writeln!(s, "      {l}");
    }
    s.push_str(&e.element_loop("      "));
    for l in &after {
        let _ = writeln!(s, "      {l}");
    }
    s.push_str("    }\n  }\n}\n");
    Launch {
        name: name.to_string(),
        source: s,
        grid: Grid::Items {
            n: nq.div_ceil(UNROLL),
            block: BLOCK,
        },
        args: e.bufs,
        align: e.align,
        fallback: None,
    }
}

/// The row kernel of `rows` (see [`Gen::row_kernel`]), `vec` elements per thread. With
/// `splits > 1` (one pass, no whole-row outputs), each row is cut into `splits` parts reduced
/// by different blocks: a per-row output then has one more axis, the part (partials).
#[allow(clippy::too_many_arguments)]
pub(crate) fn row_source(
    name: &str,
    rows: &Rows,
    outer: &[usize],
    full: &[(Node, View)],
    per_row: &[(Node, View)],
    vec: usize,
    dtypes: &[DType],
    splits: usize,
) -> Launch {
    let k = outer.len();
    let splits = splits.max(1);
    let nrows = numel(outer);
    let inner_numel = numel(&rows.inner);
    let mut views: Vec<&View> = Vec::new();
    for (_, n) in &rows.passes {
        n.loads(&mut views);
    }
    for (n, d) in full.iter().chain(per_row) {
        n.loads(&mut views);
        views.push(d);
    }
    let width = Width::for_views(nrows.saturating_mul(inner_numel), views.iter().copied());
    let ct = if dtypes.iter().any(|d| matches!(d, DType::F64 | DType::I64)) {
        "double"
    } else {
        "float"
    };
    let fast = ct == "float"
        && !full.is_empty()
        && full
            .iter()
            .chain(per_row)
            .all(|(_, d)| matches!(d.dtype, DType::BF16 | DType::F16));
    let ty = width.ty();
    let nv = inner_numel / vec.max(1);
    // Rows whose vectors split evenly over a block, a few per thread: each thread keeps its
    // vectors in registers from the first pass to the last (one read of the row in all).
    let persist = if splits == 1 && rows.passes.len() + usize::from(!full.is_empty()) > 1 {
        [256usize, 512, 128, 64]
            .into_iter()
            .find(|b| nv.is_multiple_of(*b) && nv / b <= 8)
            .map(|b| (b, nv / b))
    } else {
        None
    };
    let block = match persist {
        Some((b, _)) => b as u32,
        None => (nv.next_power_of_two()).clamp(32, 256) as u32,
    };
    let (row_index, outer_names) = if splits > 1 {
        let (mut lines, names) = decompose(width, "rrow", "o", outer, 1);
        let s = width.lit(splits as i64);
        lines.insert(
            0,
            format!("const {ty} part = row % {s}; const {ty} rrow = row / {s};"),
        );
        (lines, names)
    } else {
        decompose(width, "row", "o", outer, 1)
    };
    let (inner_index, inner_names) = decompose(width, "cv", "i", &rows.inner, vec);
    let base: Vec<String> = outer_names.iter().chain(&inner_names).cloned().collect();
    // Persisted loads need constant indices: the vectors of a thread are unrolled fully.
    let unroll = if persist.is_some() {
        "#pragma unroll"
    } else {
        "#pragma unroll 4"
    };
    let mut e = Emitter::new(ct, fast, width, vec, base.clone());
    if let Some((_, its)) = persist {
        e.persist(its);
    }
    let mut body = String::new();
    let w = |body: &mut String, indent: &str, l: &str| {
        let _ = writeln!(body, "{indent}{l}");
    };
    let row_loop = if let Some((b, its)) = persist {
        format!(
            "for (int it = 0; it < {its}; ++it) {{ const {ty} cv = threadIdx.x + ({ty})it * {};",
            width.lit(b as i64)
        )
    } else if splits > 1 {
        let per = nv.div_ceil(splits);
        format!(
            "for ({ty} cv = part * {per} + threadIdx.x; cv < part * {per} + {per} && cv < {nv}; \
             cv += blockDim.x) {{",
            per = width.lit(per as i64),
            nv = width.lit(nv as i64)
        )
    } else {
        format!(
            "for ({ty} cv = threadIdx.x; cv < {}; cv += blockDim.x) {{",
            width.lit(nv as i64)
        )
    };
    for (p, (op, node)) in rows.passes.iter().enumerate() {
        e.reset(base.clone());
        let v = e.expr(node);
        e.accumulate("acc", *op, &v);
        w(&mut body, "    ", &format!("{ct} r{p};"));
        w(&mut body, "    ", "{");
        w(&mut body, "      ", &format!("{ct} acc = {};", e.init(*op)));
        w(&mut body, "      ", unroll);
        w(&mut body, "      ", &row_loop);
        for l in &inner_index {
            w(&mut body, "        ", l);
        }
        body.push_str(&e.element_loop("        "));
        w(&mut body, "      ", "}");
        let f = match op {
            ReduceOp::Sum => "WeaveSum()",
            ReduceOp::Max => "WeaveMax()",
            ReduceOp::Min => "WeaveMin()",
        };
        w(
            &mut body,
            "      ",
            &format!("r{p} = weave_block_reduce(acc, weave_smem, {f});"),
        );
        w(&mut body, "    ", "}");
    }
    if !full.is_empty() {
        w(&mut body, "    ", unroll);
        e.reset(base.clone());
        let mut after = Vec::new();
        for (node, dst) in full {
            let v = e.expr(node);
            after.extend(e.store(dst, &v));
        }
        w(&mut body, "    ", &row_loop);
        for l in &inner_index {
            w(&mut body, "      ", l);
        }
        body.push_str(&e.element_loop("      "));
        for l in &after {
            w(&mut body, "      ", l);
        }
        w(&mut body, "    ", "}");
    }
    if !per_row.is_empty() {
        let vec_saved = e.vec;
        e.vec = 1;
        let last = if splits > 1 { "part" } else { "0" };
        let names: Vec<String> = outer_names
            .iter()
            .cloned()
            .chain(std::iter::once(last.to_string()))
            .chain(std::iter::repeat("0".to_string()))
            .take(
                per_row
                    .iter()
                    .map(|(_, d)| d.sizes.len())
                    .max()
                    .unwrap_or(k),
            )
            .collect();
        e.reset(names);
        for (node, dst) in per_row {
            let v = e.expr(node);
            e.store(dst, &v);
        }
        w(&mut body, "    ", "if (threadIdx.x == 0) {");
        body.push_str(&e.element_loop("      "));
        w(&mut body, "    ", "}");
        e.vec = vec_saved;
    }
    let mut s = String::from(PRELUDE);
    let _ = writeln!(s, "{} {{", e.signature(name));
    let _ = writeln!(s, "  __shared__ {ct} weave_smem[32];");
    for d in &e.decls {
        let _ = writeln!(s, "  {d}");
    }
    let _ = writeln!(
        s,
        "  for ({ty} row = blockIdx.x; row < {}; row += gridDim.x) {{",
        width.lit((nrows * splits) as i64)
    );
    for l in &row_index {
        let _ = writeln!(s, "    {l}");
    }
    s.push_str(&body);
    s.push_str("  }\n}\n");
    Launch {
        name: name.to_string(),
        source: s,
        grid: Grid::Rows {
            rows: nrows * splits,
            block,
        },
        args: e.bufs,
        align: e.align,
        fallback: None,
    }
}

/// Threads that reduce one column (kept element) of a column reduction together, each a warp
/// of a block, combined in shared memory: a block is [`COLUMNS_PER_BLOCK`] columns by
/// `COLUMN_LANES` lanes. Eight lanes keep eight times as many loads in flight as a thread
/// per column, so that few columns (a stream chunk of them, the partials' second pass) still
/// stream at bandwidth.
pub(crate) const COLUMN_LANES: usize = BLOCK as usize / COLUMNS_PER_BLOCK;

/// Columns of a column-reduction block: a warp, so that each lane's loads of a row are one
/// contiguous access.
pub(crate) const COLUMNS_PER_BLOCK: usize = 32;

/// The reduction of `node` (over `red ++ kept` sizes) over its outermost `red` axes: a block
/// per [`COLUMNS_PER_BLOCK`] kept elements (columns) and part of the reduced elements, each
/// warp of it (a lane) taking every `COLUMN_LANES`-th reduced element of the part, the lanes
/// combined in shared memory in lane order (a fixed order: the same sums every run). The
/// reduced elements are split into `splits` parts; part `p` goes to `dst` offset by `p` times
/// the kept elements (partials) when `splits > 1`.
pub(crate) fn column_source(
    name: &str,
    node: &Node,
    red: &[usize],
    kept: &[usize],
    op: ReduceOp,
    dst: &View,
    splits: usize,
) -> Launch {
    let m = numel(kept);
    let nr = numel(red);
    let chunk = nr.div_ceil(splits.max(1));
    let xb = m.div_ceil(COLUMNS_PER_BLOCK);
    let mut views = Vec::new();
    node.loads(&mut views);
    let partials = View {
        sizes: [vec![splits], kept.to_vec()].concat(),
        strides: [vec![m as isize], dst.strides.clone()].concat(),
        ..dst.clone()
    };
    views.push(&partials);
    let width = Width::for_views(nr.saturating_mul(m), views.iter().copied());
    let ct = compute_type(node, Some(dst.dtype));
    let ty = width.ty();
    let (red_index, red_names) = decompose(width, "r", "x", red, 1);
    let (kept_index, kept_names) = decompose(width, "m", "k", kept, 1);
    let base: Vec<String> = red_names.iter().chain(&kept_names).cloned().collect();
    let mut e = Emitter::new(ct, false, width, 1, base);
    let v = e.expr(node);
    e.accumulate("acc", op, &v);
    // The result (or this part's partial) for column m.
    let mut st = Emitter::new(
        ct,
        false,
        width,
        1,
        std::iter::once("part".to_string())
            .chain(kept_names)
            .collect(),
    );
    st.adopt(&e);
    st.store(&partials, "acc");
    let mut s = String::from(PRELUDE);
    let _ = writeln!(s, "{} {{", st.signature(name));
    let lit = |n: usize| width.lit(n as i64);
    let (cols, lanes) = (COLUMNS_PER_BLOCK, COLUMN_LANES);
    let _ = writeln!(
        s,
        "  const {ty} m = ({ty})(blockIdx.x % {}) * {} + (threadIdx.x % {cols}u);",
        lit(xb),
        lit(cols)
    );
    let _ = writeln!(s, "  const {ty} lane = ({ty})(threadIdx.x / {cols}u);");
    let _ = writeln!(s, "  const {ty} part = ({ty})(blockIdx.x / {});", lit(xb));
    // Index math of a column past the end is harmless: nothing is loaded or stored there.
    for l in &kept_index {
        let _ = writeln!(s, "  {l}");
    }
    let _ = writeln!(s, "  {ct} acc = {};", e.init(op));
    let _ = writeln!(s, "  const {ty} r0 = part * {};", lit(chunk));
    let _ = writeln!(
        s,
        "  const {ty} r1 = r0 + {c} < {nr} ? r0 + {c} : {nr};",
        c = lit(chunk),
        nr = lit(nr)
    );
    let _ = writeln!(s, "  if (m < {}) {{", lit(m));
    let _ = writeln!(s, "  #pragma unroll 4");
    let _ = writeln!(
        s,
        "  for ({ty} r = r0 + lane; r < r1; r += {}) {{",
        lit(lanes)
    );
    for l in &red_index {
        let _ = writeln!(s, "    {l}");
    }
    s.push_str(&e.element_loop("    "));
    let _ = writeln!(s, "  }}");
    let _ = writeln!(s, "  }}");
    let _ = writeln!(s, "  __shared__ {ct} lanes_acc[{lanes}][{cols}];");
    let _ = writeln!(s, "  lanes_acc[lane][threadIdx.x % {cols}u] = acc;");
    let _ = writeln!(s, "  __syncthreads();");
    let _ = writeln!(s, "  if (lane != 0 || m >= {}) return;", lit(m));
    let combine = match op {
        ReduceOp::Sum => "WeaveSum()",
        ReduceOp::Max => "WeaveMax()",
        ReduceOp::Min => "WeaveMin()",
    };
    let _ = writeln!(
        s,
        "  for (int l = 1; l < {lanes}; ++l) acc = {combine}(acc, lanes_acc[l][threadIdx.x % {cols}u]);"
    );
    for l in &st.lines {
        let _ = writeln!(s, "  {l}");
    }
    s.push_str("}\n");
    let blocks = xb * splits.max(1);
    unaligned(
        name,
        s,
        Grid::Blocks {
            blocks,
            block: BLOCK,
        },
        st.bufs,
    )
}

/// A reduction over any axes: a thread per output element, looping over the reduced ones.
pub(crate) fn serial_reduce(
    name: &str,
    x: &Lazy,
    op: ReduceOp,
    kept: &[usize],
    reduced: &[usize],
    out_sizes: &[usize],
    dst: &View,
) -> Launch {
    let rank = x.sizes.len();
    let red_sizes: Vec<usize> = reduced.iter().map(|a| x.sizes[*a]).collect();
    let n = numel(out_sizes);
    let red_n = numel(&red_sizes);
    let mut views = Vec::new();
    x.node.loads(&mut views);
    views.push(dst);
    let width = Width::for_views(n.saturating_mul(red_n.max(1)), views.iter().copied());
    let ct = compute_type(&x.node, Some(dst.dtype));
    let ty = width.ty();
    let (out_index, out_names) = decompose(width, "q", "o", out_sizes, 1);
    let (red_index, red_names) = decompose(width, "r", "x", &red_sizes, 1);
    let mut base = vec![String::new(); rank];
    for (k, a) in kept.iter().enumerate() {
        base[*a] = out_names[k].clone();
    }
    for (k, a) in reduced.iter().enumerate() {
        base[*a] = red_names[k].clone();
    }
    let mut e = Emitter::new(ct, false, width, 1, base);
    let v = e.expr(&x.node);
    e.accumulate("acc", op, &v);
    let mut st = Emitter::new(ct, false, width, 1, out_names);
    st.adopt(&e);
    st.store(dst, "acc");
    let lit = |n: usize| width.lit(n as i64);
    let mut s = String::from(PRELUDE);
    let _ = writeln!(s, "{} {{", st.signature(name));
    let _ = writeln!(
        s,
        "  for ({ty} q = ({ty})blockIdx.x * blockDim.x + threadIdx.x; q < {}; \
         q += ({ty})gridDim.x * blockDim.x) {{",
        lit(n)
    );
    for l in &out_index {
        let _ = writeln!(s, "    {l}");
    }
    let _ = writeln!(s, "    {ct} acc = {};", e.init(op));
    let _ = writeln!(s, "    for ({ty} r = 0; r < {}; ++r) {{", lit(red_n));
    for l in &red_index {
        let _ = writeln!(s, "      {l}");
    }
    // `st` took over `e`'s parameters in order, so the element loop's `p{k}` stay right.
    s.push_str(&e.element_loop("      "));
    let _ = writeln!(s, "    }}");
    for l in &st.lines {
        let _ = writeln!(s, "    {l}");
    }
    s.push_str("  }\n}\n");
    unaligned(name, s, Grid::Items { n, block: BLOCK }, st.bufs)
}

/// The launch of kernel `name` in `source`, with no vector access to align (so no fallback).
fn unaligned(name: &str, source: String, grid: Grid, args: Vec<Buf>) -> Launch {
    Launch {
        name: name.to_string(),
        source,
        grid,
        args,
        align: Vec::new(),
        fallback: None,
    }
}

/// The element types `node` loads from memory.
pub(crate) fn memory_dtypes(node: &Node) -> Vec<DType> {
    let mut views = Vec::new();
    node.loads(&mut views);
    views.iter().map(|v| v.dtype).collect()
}

/// `double` when an f64 or i64 value is involved, else `float`.
pub(crate) fn compute_type(node: &Node, out: Option<DType>) -> &'static str {
    let mut ds = Vec::new();
    node.dtypes(&mut ds);
    ds.extend(out);
    if ds.iter().any(|d| matches!(d, DType::F64 | DType::I64)) {
        "double"
    } else {
        "float"
    }
}
