"""Host overhead of a streamweave call from Python on the GPU path, against the Rust run.

    python3 scripts/gpu/python_overhead.py [--calls 2000] [--out FILE]

For small programs (so the host, not the GPU, is what a call costs), times N back-to-back
calls of a CudaRunner with no synchronization in between (a warm-up first) and takes the
mean host wall time per call; the Rust side reports the time it spent issuing the program's
statements (`issue_us`). The overhead of the Python layer is their difference: argument
checks, output allocation (torch.empty) or the `out=` tensors, the stream handle, the
borrowed buffers and the two events that order the run on PyTorch's stream. PyTorch's own
call of the same operation (eager, `out=`) is timed the same way beside it.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch

import streamweave as sw

HERE = os.path.dirname(os.path.abspath(__file__))


def fixture(name):
    for root in (os.path.join(HERE, "..", "scenarios"), os.path.join(HERE, "..", "..", "tests", "scenarios")):
        path = os.path.join(root, "kernels", name + ".weave")
        if os.path.exists(path):
            return path
    sys.exit("no fixture %s" % name)


def per_call_us(fn, calls):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls // 5):
            fn()
        rounds.append((time.perf_counter() - t0) * 1e6 / (calls // 5))
        torch.cuda.synchronize()
    return statistics.median(rounds)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--out", default="python_overhead.json")
    a = p.parse_args()
    rows = []
    for case, s in (("add", 1), ("add", 4), ("softmax", 1)):
        exe = sw.load(fixture(case), t=256, h=256, s=s).compile()
        gpu = exe.cuda()
        x = {
            spec.name: torch.randn(spec.shape, device="cuda").to(getattr(torch, sw._TORCH_DTYPES[spec.dtype]))
            for spec in exe.inputs
        }
        out = {exe.outputs[0].name: torch.empty(exe.outputs[0].shape, device="cuda", dtype=torch.bfloat16)}
        issue, native = [], []

        def call_out():
            r = gpu(x, out=out)
            issue.append(r.issue_us[0])
            native.append(r.native_us)

        def call_alloc():
            gpu(x)

        with_out = per_call_us(call_out, a.calls)
        issue_us = statistics.median(issue)
        native_us = statistics.median(native)
        alloc = per_call_us(call_alloc, a.calls)
        if case == "add":
            o = out["out"]
            torch_us = per_call_us(lambda: torch.add(x["a"], x["b"], out=o), a.calls)
        else:
            o = out["out"]
            torch_us = per_call_us(lambda: torch.softmax(x["x"], -1, out=o), a.calls)
        row = {
            "case": case,
            "s": s,
            "call_us_out": with_out,
            "call_us_alloc": alloc,
            "rust_issue_us": issue_us,
            "native_call_us": native_us,
            "python_layer_us": with_out - native_us,
            "python_overhead_us": with_out - issue_us,
            "python_overhead_alloc_us": alloc - issue_us,
            "torch_eager_call_us": torch_us,
        }
        rows.append(row)
        print(
            "%-8s s=%d: call %.1f µs (out=), %.1f µs (allocating); native call %.1f µs, of it "
            "issuing %.1f µs; overhead over the Rust issue %.1f µs (out=) / %.1f µs "
            "(allocating), of it the Python layer %.1f µs; torch eager call %.1f µs"
            % (case, s, with_out, alloc, native_us, issue_us, with_out - issue_us,
               alloc - issue_us, with_out - native_us, torch_us),
            flush=True,
        )
    doc = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "calls": a.calls, "rows": rows}
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
