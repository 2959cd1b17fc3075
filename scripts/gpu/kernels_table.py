"""The kernel benchmark's table: streamweave's rows (bin/gpu_kernels JSON) beside PyTorch's
(scripts/gpu/kernels_torch.py JSON), one markdown row per case, shape and s.

    python3 scripts/gpu/kernels_table.py OURS.json TORCH.json [--md FILE] [--header TEXT]

Columns: streamweave's median ms replayed (one run captured as a CUDA graph: how repeated runs
are timed by default) and eager (issued statement by statement); PyTorch eager's and
torch.compile's, and the better of their CUDA-graph forms (the eager call captured in a
torch.cuda.CUDAGraph, torch.compile(mode="reduce-overhead")); the ratio of our replay to the
best of all four PyTorch figures and of our eager run to the better of PyTorch's eager and
compiled runs (below 1: faster); our replay as a share of the memcpy bandwidth measured in
the same run; for s > 1, our replay of the same program with every stream loop kept (the
default runs a loop that only launches kernels on chunks under 64 MiB once:
`merge-kernel-chunks`), which is what a kernel chunk costs where chunks stay; and whether
ours matched the reference. Then the
targets: how many rows are within 1.10x, at 85% of memcpy, and with s = 4 within 5% of
s = 1; and, not a target, the same for the kept chunks. A missing or unreadable file leaves
its columns empty ("–").
"""

import argparse
import json
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print("note: %s: %s" % (path, e), file=sys.stderr)
        return {}


def fmt(v, spec):
    return spec % v if isinstance(v, (int, float)) else "–"


def best_of(values):
    return min([v for v in values if isinstance(v, (int, float))], default=None)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("ours")
    p.add_argument("torch")
    p.add_argument("--md")
    p.add_argument("--header")
    a = p.parse_args()
    ours, theirs = load(a.ours), load(a.torch)
    torch_rows = {(r["case"], r["t"], r["h"]): r for r in theirs.get("rows", [])}
    lines = []
    if a.header:
        lines += [a.header, ""]
    lines.append(
        "| case | shape | s | ours replayed ms | ours eager ms | torch eager ms | compile ms "
        "| torch graph ms | replayed vs best torch | eager vs best unreplayed torch "
        "| % of memcpy | every loop kept ms | numerics |"
    )
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    passed = total = 0
    within = at_bw = 0
    by_s = {}
    kept_ms = {}
    kept_bad = []
    for r in ours.get("rows", []):
        total += 1
        tr = torch_rows.get((r["case"], r["t"], r["h"]), {})
        eager, comp = tr.get("eager_ms"), tr.get("compile_ms")
        graphs = [tr.get("graph_ms"), tr.get("compile_graph_ms")]
        graph = best_of(graphs)
        best = best_of([eager, comp] + graphs)
        unreplayed = best_of([eager, comp])
        ms = r.get("ms")
        ours_eager = r.get("eager_ms")
        ratio = ms / best if isinstance(ms, (int, float)) and best else None
        eager_ratio = (
            ours_eager / unreplayed if isinstance(ours_eager, (int, float)) and unreplayed else None
        )
        if ratio is not None and ratio <= 1.10:
            within += 1
        if isinstance(r.get("pct_of_memcpy"), (int, float)) and r["pct_of_memcpy"] >= 85:
            at_bw += 1
        if isinstance(ms, (int, float)):
            by_s[(r["case"], r["t"], r["h"], r["s"])] = ms
        kept = r.get("kept") or {}
        if isinstance(kept.get("ms"), (int, float)):
            kept_ms[(r["case"], r["t"], r["h"], r["s"])] = kept["ms"]
        if kept and not kept.get("numerics_ok"):
            kept_bad.append("%s [%d, %d] s=%d" % (r["case"], r["t"], r["h"], r["s"]))
        num = r.get("numerics", {})
        if r.get("error"):
            verdict = "ERROR"
        elif num.get("ok"):
            passed += 1
            verdict = "ok (%.1e)" % num.get("max_rel", 0.0)
        else:
            verdict = "FAIL (%s)" % fmt(num.get("max_rel"), "%.1e")
        lines.append(
            "| %s | [%d, %d] | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |"
            % (
                r["case"],
                r["t"],
                r["h"],
                r["s"],
                fmt(ms, "%.4f"),
                fmt(ours_eager, "%.4f"),
                fmt(eager, "%.4f"),
                fmt(comp, "%.4f"),
                fmt(graph, "%.4f"),
                fmt(ratio, "%.2f×"),
                fmt(eager_ratio, "%.2f×"),
                fmt(r.get("pct_of_memcpy"), "%.0f%%"),
                fmt(kept.get("ms"), "%.4f"),
                verdict,
            )
        )
    lines.append("")
    lines.append(
        "numerics: %d of %d configurations match the reference" % (passed, total)
        if total
        else "no streamweave rows"
    )
    chunked = [
        (k, v / by_s[k[:3] + (1,)]) for k, v in by_s.items() if k[3] > 1 and k[:3] + (1,) in by_s
    ]
    close = sum(1 for _, q in chunked if q <= 1.05)
    lines.append(
        "targets (replayed): %d of %d rows within 1.10× of the best PyTorch; %d of %d at ≥ 85%% "
        "of memcpy; %d of %d chunked rows within 5%% of s = 1%s"
        % (
            within,
            total,
            at_bw,
            total,
            close,
            len(chunked),
            "".join(
                " (%s [%d, %d] s=%d: %+.0f%%)" % (k[0], k[1], k[2], k[3], 100 * (q - 1))
                for k, q in chunked
                if q > 1.05
            ),
        )
    )
    if kept_ms:
        # Not a target: what a kernel chunk costs where chunks stay (a kernel between GEMMs or
        # communications); the default runs these kernel-only loops once.
        kept_q = [
            (k, v / by_s[k[:3] + (1,)]) for k, v in kept_ms.items() if k[:3] + (1,) in by_s
        ]
        lines.append(
            "every loop kept (`-merge-kernel-chunks`): %d of %d chunked rows within 5%% of "
            "s = 1%s; numerics %s"
            % (
                sum(1 for _, q in kept_q if q <= 1.05),
                len(kept_q),
                "".join(
                    " (%s [%d, %d] s=%d: %+.0f%%)" % (k[0], k[1], k[2], k[3], 100 * (q - 1))
                    for k, q in kept_q
                    if q > 1.05
                ),
                "ok" if not kept_bad else "FAIL: " + ", ".join(kept_bad),
            )
        )
    text = "\n".join(lines) + "\n"
    if a.md:
        with open(a.md, "w") as f:
            f.write(text)
    sys.stdout.write(text)
    return 0 if total and passed == total and not kept_bad else 1


if __name__ == "__main__":
    sys.exit(main())
