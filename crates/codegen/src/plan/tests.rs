//! Tests of the generator: which kernels a fusion becomes and the CUDA C they hold.

use super::*;
use crate::source::{BLOCK, UNROLL};
use crate::view::contiguous_strides;
use crate::Grid;

fn view(sizes: &[usize], strides: &[isize]) -> View {
    View {
        buf: Buf::Input(0),
        dtype: DType::F32,
        offset: 0,
        sizes: sizes.to_vec(),
        strides: strides.to_vec(),
    }
}

fn contiguous(dtype: DType, sizes: &[usize]) -> TensorArg {
    TensorArg {
        dtype,
        sizes: sizes.to_vec(),
        strides: contiguous_strides(sizes)
            .iter()
            .map(|s| *s as usize)
            .collect(),
    }
}

/// Plans `body` (a fusion body over `t`, `h`) for contiguous buffers on 132 SMs.
fn plan_of(body: &str, t: usize, h: usize) -> KernelPlan {
    let source = format!("fusion k(t = {t}, h = {h}) {{\n{body}\n}}\n");
    let fusion = weave_ir::text::parse(&source, &[]).expect("parses");
    let args = |ts: &[weave_ir::TensorId]| -> Vec<TensorArg> {
        ts.iter()
            .map(|t| {
                let sizes: Vec<usize> = fusion
                    .visible_axes(*t)
                    .iter()
                    .map(|id| fusion.eval(&fusion.id(*id).extent).expect("a size") as usize)
                    .collect();
                contiguous(fusion.tensor(*t).dtype, &sizes)
            })
            .collect()
    };
    let (ins, outs) = (args(fusion.inputs()), args(fusion.outputs()));
    plan(&fusion, "k", &ins, &outs, 132).expect("plans")
}

#[test]
fn literals_erf_and_gelu_fuse_into_one_pointwise_kernel() {
    let p = plan_of(
        "tensor a: f32[t, h]\n tensor m: bool[t, h]\n y = a * 0.5 + 2\n g = gelu(y) - gelu_tanh(y)\n \
         e = erf(-g)\n z = where(m, e, -inf)\n output z",
        8,
        64,
    );
    assert_eq!(p.launches.len(), 1, "one fused kernel");
    let src = &p.launches[0].source;
    for want in [
        "(0.5f)",
        "(2.0f)",
        "erff(",
        "0.70710678118654752440",
        "0.044715",
        "(-__int_as_float(0x7f800000))",
    ] {
        assert!(src.contains(want), "`{want}` missing from:\n{src}");
    }
    // A double kernel (f64 values) writes double literals.
    let p = plan_of("tensor a: f64[t, h]\n y = 0.1 - a\n output y", 4, 4);
    assert!(
        p.launches[0].source.contains("double v1 = (0.1);"),
        "{}",
        p.launches[0].source
    );
}

#[test]
fn min_and_two_pass_var_are_row_kernels_with_their_combiners() {
    let p = plan_of(
        "tensor x: f32[t, h]\n lo = min(x, [1])\n v = var(x, [1])\n output lo, v",
        64,
        512,
    );
    let src: String = p.launches.iter().map(|l| l.source.as_str()).collect();
    assert!(src.contains("WeaveMin()"), "{src}");
    // min starts from +inf; the two passes of var are two sums.
    assert!(src.contains("acc = __int_as_float(0x7f800000);"), "{src}");
    assert!(src.matches("WeaveSum()").count() >= 2, "{src}");
    assert!(src.contains("(512.0f)"), "{src}");
}

#[test]
fn index_select_gathers_rows_and_reads_zero_outside_its_block() {
    // The whole table: ids in 0..t read their row; any other id reads zero (never out
    // of bounds): the load is guarded by the row's range.
    let p = plan_of(
        "tensor table: bf16[t, h]\n tensor ids: i64[h]\n e = index_select(table, ids, 0)\n \
         y = cast(e, f32)\n output y",
        16,
        8,
    );
    assert_eq!(p.launches.len(), 1, "{:#?}", p.launches);
    let src = &p.launches[0].source;
    assert!(src.contains("- 0LL;"), "{src}");
    assert!(
        src.contains(">= 0LL &&") && src.contains("< 16LL)"),
        "{src}"
    );
    assert!(src.contains("* 8LL] : (unsigned short)0)"), "{src}");
    // A device's block of a vocabulary-split table (rows 8..16 of 16 here): the row is
    // the id less the block's first row; a lookup along axis 1 strides by one element.
    let p = plan_of(
        "tensor table: f32[t, h]\n tensor ids: i64[t]\n e = index_select(table, ids, 0, 8)\n \
         c = index_select(table, ids, 1)\n output e, c",
        8,
        8,
    );
    let all: String = p.launches.iter().map(|l| l.source.as_str()).collect();
    assert!(all.contains("- 8LL;"), "{all}");
    assert!(all.contains("* 1LL] : (float)0)"), "{all}");
}

#[test]
fn iota_fuses_as_an_index_and_slice_and_concat_move_views() {
    // A causal mask: two indices compared, no load of them, one fused kernel.
    let p = plan_of(
        "tensor s: f32[t, h]\n keep = ge(iota(s, 0), iota(s, 1))\n \
         out = where(keep, s, -inf)\n output out",
        16,
        16,
    );
    assert_eq!(p.launches.len(), 1, "{:#?}", p.launches);
    let src = &p.launches[0].source;
    assert!(src.contains("double v1 = (double)(0u + i0 * 1u);"), "{src}");
    assert!(src.contains("(double)(0u + (i1 + j) * 1u);"), "{src}");
    assert!(src.contains("(v1 >= v2 ?"), "{src}");
    // A slice is an offset into its operand; a concat two stores into one temporary.
    let p = plan_of(
        "tensor w: f32[t, h]\n q = slice(w, 0, 4, 12)\n output q",
        16,
        8,
    );
    assert_eq!(p.launches.len(), 1);
    assert!(
        p.launches[0].source.contains("(32u + "),
        "{}",
        p.launches[0].source
    );
    let p = plan_of(
        "tensor a: f32[t, h]\n tensor b: f32[t, h]\n c = concat(a, b, 1)\n output c",
        4,
        8,
    );
    // Both stores go straight into the output (its temporary retargeted), `b` after `a`.
    assert_eq!(p.launches.len(), 2, "{:#?}", p.launches);
    assert!(
        p.launches[0]
            .source
            .contains("(((float*)p1) + (0u + i0 * 16u"),
        "{:#?}",
        p.launches
    );
    assert!(
        p.launches[1]
            .source
            .contains("(((float*)p1) + (8u + i0 * 16u"),
        "{:#?}",
        p.launches
    );
}

const SOFTMAX: &str = "tensor x: bf16[t, h]\n xf = cast(x, f32)\n m = max(xf, [1])\n \
    mb = broadcast(m, [1])\n d = sub(xf, mb)\n e = exp(d)\n z = sum(e, [1])\n \
    zb = broadcast(z, [1])\n yf = div(e, zb)\n y = cast(yf, bf16)\n output y";

#[test]
fn a_contiguous_bf16_add_moves_16_bytes_per_access_in_32_bit_indices() {
    let p = plan_of(
        "tensor a: bf16[t, h]\n tensor b: bf16[t, h]\n y = add(a, b)\n output y",
        16384,
        8192,
    );
    assert_eq!(p.launches.len(), 1);
    let l = &p.launches[0];
    assert_eq!(
        l.grid,
        Grid::Items {
            n: 16384 * 8192 / 8 / UNROLL,
            block: BLOCK
        }
    );
    assert!(
        l.source.contains("const unsigned short* __restrict__ p0")
            && l.source.contains("unsigned short* __restrict__ p2"),
        "{}",
        l.source
    );
    assert_eq!(l.source.matches("uint4").count(), 6, "{}", l.source);
    assert!(l.source.contains("unsigned int q"), "{}", l.source);
    assert_eq!(l.align, vec![(0, 16), (1, 16), (2, 16)]);
    // Unaligned buffers take the scalar kernel.
    let fallback = l.fallback.as_deref().expect("a scalar fallback");
    assert!(!fallback.source.contains("uint4"));
    assert!(std::ptr::eq(l.for_addresses(&[256, 512, 1024]), l));
    assert!(std::ptr::eq(l.for_addresses(&[256, 514, 1024]), fallback));
    // 128 SMs of 2048 threads hold 1024 blocks of 256: 16 waves, 16384 blocks at most.
    assert_eq!(l.grid.dims(128), Some((16384, 256)));
    // Work for fewer blocks gets one block per 256 items.
    let few = Grid::Items {
        n: 1000 * 256 + 1,
        block: 256,
    };
    assert_eq!(few.dims(128), Some((1001, 256)));
    let rows = Grid::Rows {
        rows: 1 << 20,
        block: 32,
    };
    // 64 blocks of 32 threads an SM, 16 waves.
    assert_eq!(rows.dims(2), Some((2 * 64 * 16, 32)));
}

#[test]
fn softmax_is_one_row_kernel_of_two_passes_and_a_vector_store() {
    let p = plan_of(SOFTMAX, 4096, 4096);
    assert_eq!(p.launches.len(), 1, "{:#?}", p.launches);
    assert!(p.temps.is_empty());
    let l = &p.launches[0];
    assert_eq!(
        l.grid,
        Grid::Rows {
            rows: 4096,
            block: 256
        }
    );
    assert_eq!(l.source.matches("weave_block_reduce(acc").count(), 2);
    assert!(l.source.contains("WeaveMax()") && l.source.contains("WeaveSum()"));
    assert!(l.source.contains("__expf"), "bf16 results use fast exp");
    // bf16 in and out: 8 elements, 16 bytes per access (the f32 math does not narrow it).
    assert!(
        l.source.contains("for (int j = 0; j < 8; ++j)"),
        "{}",
        l.source
    );
    // The row is read once: the first pass keeps each thread's vectors in registers
    // (4096 elements: 512 vectors, 2 per thread of 256) for the later passes.
    assert_eq!(l.align, vec![(0, 16), (1, 16)]);
    assert_eq!(l.source.matches("((const unsigned short*)p0) +").count(), 1);
    assert!(
        l.source.contains("alignas(16) unsigned short a1[2][8];"),
        "{}",
        l.source
    );
    assert!(l.fallback.is_some());
}

#[test]
fn a_column_sum_splits_its_rows_over_blocks_then_adds_the_partials() {
    let p = plan_of(
        "tensor x: f32[t, h]\n y = sum(x, [0])\n output y",
        16384,
        8192,
    );
    assert_eq!(p.launches.len(), 2);
    let splits = p.temps[1].1 / 8192;
    assert!(
        splits > 1 && p.temps[1].1.is_multiple_of(8192),
        "{:?}",
        p.temps
    );
    // A block per 32 columns and part, 8 warps (lanes) of it per column.
    assert_eq!(
        p.launches[0].grid,
        Grid::Blocks {
            blocks: 8192 / 32 * splits,
            block: BLOCK
        }
    );
    assert!(p.launches[0].source.contains("lanes_acc[8][32]"));
    // 132 SMs: 4 parts of 256 blocks of 256 threads fill one wave (8 blocks an SM).
    assert_eq!(splits, 4);
    // A stream chunk of 1024 columns: a wave would hold 33 parts, but each lane adds at
    // least 32 rows, so 16 parts of 256 rows; the second pass over them has its 8 lanes
    // per column too.
    let p = plan_of(
        "tensor x: f32[t, h]\n y = sum(x, [0])\n output y",
        4096,
        1024,
    );
    assert_eq!(p.temps[1], (DType::F32, 16 * 1024));
    assert_eq!(
        p.launches[1].grid,
        Grid::Blocks {
            blocks: 32,
            block: BLOCK
        }
    );
    assert!(p.launches[1].source.contains("r += 8u"));
    // A row sum is a row kernel of one pass.
    let p = plan_of(
        "tensor x: f32[t, h]\n y = sum(x, [1])\n output y",
        16384,
        8192,
    );
    assert_eq!(p.launches.len(), 1);
    assert!(matches!(p.launches[0].grid, Grid::Rows { rows: 16384, .. }));
    assert!(p.launches[0].source.contains("uint4"));
}

#[test]
fn few_long_rows_split_over_blocks_and_many_rows_take_a_block_each() {
    let p = plan_of(
        "tensor x: f32[t, h]\n y = sum(x, [0, 1])\n output y",
        4096,
        4096,
    );
    assert_eq!(p.launches.len(), 2, "partials, then their sum");
    // 132 SMs, one row: 528 parts of at least 1024 vectors (4096 here).
    assert_eq!(p.temps[1], (DType::F32, 528));
    assert!(matches!(p.launches[0].grid, Grid::Rows { rows: 528, .. }));
    assert!(p.launches[0].source.contains("part * "));
    let p = plan_of(SOFTMAX, 8, 1 << 17);
    assert!(
        p.launches.len() > 1,
        "8 long rows: softmax kernel by kernel"
    );
    let p = plan_of(SOFTMAX, 512, 1 << 17);
    assert_eq!(p.launches.len(), 1);
}

#[test]
fn transposed_reads_stay_scalar_and_huge_buffers_index_in_64_bits() {
    let p = plan_of(
        "tensor x: f32[h, t]\n xt = permute(x, [1, 0])\n y = add(xt, xt)\n output y",
        64,
        64,
    );
    let l = &p.launches[0];
    assert_eq!(
        l.align,
        vec![(1, 16)],
        "only the store is a vector: {}",
        l.source
    );
    let p = plan_of("tensor a: bf16[t, h]\n y = neg(a)\n output y", 65536, 65536);
    assert!(p.launches[0].source.contains("long long q"));
}

#[test]
fn reshape_splits_and_merges_contiguous_views() {
    let v = view(&[4, 6], &[6, 1]);
    assert_eq!(reshape_view(&v, &[4, 2, 3]).unwrap().strides, vec![6, 3, 1]);
    assert_eq!(reshape_view(&v, &[24]).unwrap().strides, vec![1]);
    assert_eq!(
        reshape_view(&v, &[1, 4, 6, 1]).unwrap().strides,
        vec![0, 6, 1, 0]
    );
    // A chunk of a wider buffer: rows are 10 apart, so rows cannot merge.
    let chunk = view(&[4, 6], &[10, 1]);
    assert!(reshape_view(&chunk, &[24]).is_none());
    assert_eq!(
        reshape_view(&chunk, &[2, 2, 6]).unwrap().strides,
        vec![20, 10, 1]
    );
    // A transposed view cannot split its inner axis into a row-major pair.
    let t = view(&[6, 4], &[1, 6]);
    assert!(reshape_view(&t, &[24]).is_none());
}

#[test]
fn expand_broadcasts_size_one_and_missing_axes() {
    let v = view(&[1, 5], &[5, 1]);
    let e = expand(&v, &[3, 4, 5]).unwrap();
    assert_eq!(e.strides, vec![0, 0, 1]);
    assert!(expand(&view(&[2, 5], &[5, 1]), &[3, 5]).is_none());
}

#[test]
fn output_views_ignore_size_one_axes() {
    let a = TensorArg {
        dtype: DType::BF16,
        sizes: vec![8, 16, 1],
        strides: vec![16, 1, 1],
    };
    let v = output_view(Buf::Output(0), &a, &[8, 16]).unwrap();
    assert_eq!(v.strides, vec![16, 1]);
    assert!(output_view(Buf::Output(0), &a, &[16, 8]).is_none());
}
