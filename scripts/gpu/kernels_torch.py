"""PyTorch's side of the kernel benchmark (bin/gpu_kernels): the same cases, shapes and dtypes
in eager mode and under torch.compile, and a device-to-device copy of the same bytes.

    python3 scripts/gpu/kernels_torch.py [--shapes 16384x8192,4096x4096] [--cases add,...]
        [--warmup 5] [--iters 50] [--out FILE]

Cases (bf16 unless noted, f32 math inside where the fixture casts):

  add            a + b
  silu           x * sigmoid(x)
  gelu_tanh      gelu(x, approximate="tanh")  (0.5 x (1 + tanh(0.79788456 (x + 0.044715 x^3))))
  bias_residual  x + bias[h] + residual
  row_sum        f32 x.sum(-1)  [t, h] -> [t]
  col_sum        f32 x.sum(0)   [t, h] -> [h]
  softmax        softmax(x, -1)
  layernorm      layer_norm(x, [h], weight, bias, eps=1e-5)
  rmsnorm        rms_norm(x, [h], weight, eps=1e-6)

Each is timed unchunked (PyTorch has no stream split; the table compares streamweave's s = 1
and s = 4 with the same figures). A figure is the median over --iters runs after --warmup
untimed ones, each between two CUDA events after a synchronize. torch.compile uses the
default mode, compiles on the first (untimed) call, and starts from a reset dynamo cache
per case and shape (no dynamic-shape recompile). Both are also timed as CUDA graph replays,
the twin of streamweave's replayed runs: the eager call captured once in a
torch.cuda.CUDAGraph ("graph_ms"), and torch.compile(mode="reduce-overhead") ("compile_graph_ms",
which captures its own graphs). The memcpy is dst.copy_(src) of uint8
tensors of half the case's bytes (it reads and writes each byte). Numerics: the largest
error of each output against the same math in float64 on the GPU, relative to the largest
|reference|.

Writes one JSON document to --out: {"source": "pytorch", "torch", "gpu", "warmup", "iters",
"rows": [{"case", "t", "h", "bytes", "eager_ms", "compile_ms", "graph_ms", "compile_graph_ms",
"memcpy_ms", "eager_gbs", "compile_gbs", "memcpy_gbs", "eager_err", "compile_err",
"compile_error", "graph_error", "compile_graph_error"}]}, rewritten after every row.
"""

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

CASES = (
    "add",
    "silu",
    "gelu_tanh",
    "bias_residual",
    "row_sum",
    "col_sum",
    "softmax",
    "layernorm",
    "rmsnorm",
)


def shape(text):
    t, h = text.lower().split("x")
    return int(t), int(h)


def rms_norm(x, w, eps):
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), w, eps=eps)
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()
    return y.to(x.dtype)


def case_fn(case):
    """(the function, its inputs' dtypes and shapes as 'th' / 'h')."""
    bf, f32 = torch.bfloat16, torch.float32
    if case == "add":
        return (lambda a, b: a + b), [(bf, "th"), (bf, "th")]
    if case == "silu":
        return (lambda x: x * torch.sigmoid(x)), [(bf, "th")]
    if case == "gelu_tanh":
        return (lambda x: F.gelu(x, approximate="tanh")), [(bf, "th")]
    if case == "bias_residual":
        return (lambda x, b, r: x + b + r), [(bf, "th"), (bf, "h"), (bf, "th")]
    if case == "row_sum":
        return (lambda x: x.sum(-1)), [(f32, "th")]
    if case == "col_sum":
        return (lambda x: x.sum(0)), [(f32, "th")]
    if case == "softmax":
        return (lambda x: torch.softmax(x, -1)), [(bf, "th")]
    if case == "layernorm":
        return (
            lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)
        ), [(bf, "th"), (bf, "h"), (bf, "h")]
    if case == "rmsnorm":
        return (lambda x, w: rms_norm(x, w, 1e-6)), [(bf, "th"), (bf, "h")]
    raise ValueError("unknown case " + case)


def reference(case, inputs):
    """The case's math in float64 (the tanh form of GELU written out)."""
    d = [i.double() for i in inputs]
    if case == "add":
        return d[0] + d[1]
    if case == "silu":
        return d[0] * torch.sigmoid(d[0])
    if case == "gelu_tanh":
        x = d[0]
        return 0.5 * x * (1 + torch.tanh(0.79788456 * (x + 0.044715 * x**3)))
    if case == "bias_residual":
        return d[0] + d[1] + d[2]
    if case == "row_sum":
        return d[0].sum(-1)
    if case == "col_sum":
        return d[0].sum(0)
    if case == "softmax":
        return torch.softmax(d[0], -1)
    if case == "layernorm":
        return F.layer_norm(d[0], (d[0].shape[-1],), d[1], d[2], eps=1e-5)
    if case == "rmsnorm":
        x = d[0]
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * d[1]
    raise ValueError(case)


def rel_err(got, want):
    scale = want.abs().max().item()
    return (got.double() - want).abs().max().item() / max(scale, 1e-300)


def time_ms(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def gbs(nbytes, ms):
    return nbytes / (ms * 1e-3) / 1e9 if ms else None


def run_row(case, t, h, args):
    fn, specs = case_fn(case)
    gen = torch.Generator(device="cuda").manual_seed(1234)
    inputs = []
    for dtype, dims in specs:
        size = (t, h) if dims == "th" else (h,)
        v = torch.rand(size, device="cuda", generator=gen, dtype=torch.float32) * 2 - 1
        inputs.append(v.to(dtype))
    out = fn(*inputs)
    nbytes = sum(i.numel() * i.element_size() for i in inputs) + out.numel() * out.element_size()
    want = reference(case, inputs)
    row = {"case": case, "t": t, "h": h, "bytes": nbytes}
    row["eager_ms"] = time_ms(lambda: fn(*inputs), args.warmup, args.iters)
    row["eager_err"] = rel_err(fn(*inputs), want)
    row["compile_ms"] = None
    row["compile_err"] = None
    row["compile_error"] = None
    try:
        torch._dynamo.reset()
        compiled = torch.compile(fn)
        t0 = time.time()
        got = compiled(*inputs)
        torch.cuda.synchronize()
        row["compile_s"] = round(time.time() - t0, 2)
        row["compile_err"] = rel_err(got, want)
        row["compile_ms"] = time_ms(lambda: compiled(*inputs), args.warmup, args.iters)
    except Exception as e:  # a failed compile leaves its column empty
        row["compile_error"] = "%s: %s" % (type(e).__name__, " ".join(str(e).split())[:200])
    row["graph_ms"] = None
    row["graph_error"] = None
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn(*inputs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = fn(*inputs)
        graph.replay()
        torch.cuda.synchronize()
        row["graph_err"] = rel_err(static_out, want)
        row["graph_ms"] = time_ms(graph.replay, args.warmup, args.iters)
        del graph, static_out
    except Exception as e:
        row["graph_error"] = "%s: %s" % (type(e).__name__, " ".join(str(e).split())[:200])
    row["compile_graph_ms"] = None
    row["compile_graph_error"] = None
    if not args.no_compile_graphs:
        try:
            torch._dynamo.reset()
            compiled = torch.compile(fn, mode="reduce-overhead")
            for _ in range(3):
                got = compiled(*inputs)
            torch.cuda.synchronize()
            row["compile_graph_err"] = rel_err(got, want)
            row["compile_graph_ms"] = time_ms(lambda: compiled(*inputs), args.warmup, args.iters)
            del got
        except Exception as e:
            row["compile_graph_error"] = "%s: %s" % (
                type(e).__name__,
                " ".join(str(e).split())[:200],
            )
    half = (nbytes // 2 + 15) // 16 * 16
    src = torch.empty(half, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    row["memcpy_bytes"] = half
    row["memcpy_ms"] = time_ms(lambda: dst.copy_(src), args.warmup, args.iters)
    row["memcpy_gbs"] = gbs(2 * half, row["memcpy_ms"])
    row["eager_gbs"] = gbs(nbytes, row["eager_ms"])
    row["compile_gbs"] = gbs(nbytes, row["compile_ms"])
    del inputs, out, want, src, dst
    torch.cuda.empty_cache()
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="16384x8192,4096x4096")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--out", default="kernels_torch.json")
    p.add_argument(
        "--no-compile-graphs",
        action="store_true",
        help='skip torch.compile(mode="reduce-overhead")',
    )
    args = p.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    bad = [c for c in cases if c not in CASES]
    if bad:
        sys.exit("unknown case(s): %s (the cases: %s)" % (", ".join(bad), ", ".join(CASES)))
    if not torch.cuda.is_available():
        print("kernels_torch: skipped: no GPU visible to PyTorch")
        return 0
    doc = {
        "source": "pytorch",
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
        "timing": "CUDA events around each call after a synchronize, median",
        "warmup": args.warmup,
        "iters": args.iters,
        "rows": [],
    }
    failed = 0
    for t, h in (shape(s) for s in args.shapes.split(",") if s):
        for case in cases:
            try:
                row = run_row(case, t, h, args)
            except Exception as e:
                failed += 1
                row = {"case": case, "t": t, "h": h, "error": "%s: %s" % (type(e).__name__, e)}
            doc["rows"].append(row)
            with open(args.out, "w") as f:
                json.dump(doc, f, indent=1)
                f.write("\n")
            if "error" in row:
                print("%-14s [%d, %d]: ERROR %s" % (case, t, h, row["error"]), flush=True)
                continue
            print(
                "%-14s [%d, %d]: eager %.4f ms  compile %s  graph %s  compile-graph %s  "
                "memcpy %.4f ms (%.0f GB/s)"
                % (
                    case,
                    t,
                    h,
                    row["eager_ms"],
                    "%.4f ms" % row["compile_ms"] if row["compile_ms"] else row["compile_error"],
                    "%.4f ms" % row["graph_ms"] if row["graph_ms"] else row["graph_error"],
                    "%.4f ms" % row["compile_graph_ms"]
                    if row["compile_graph_ms"]
                    else row["compile_graph_error"],
                    row["memcpy_ms"],
                    row["memcpy_gbs"],
                ),
                flush=True,
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
