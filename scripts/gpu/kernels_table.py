"""The kernel benchmark's table: streamweave's rows (bin/gpu_kernels JSON) beside PyTorch's
(scripts/gpu/kernels_torch.py JSON), one markdown row per case, shape and s.

    python3 scripts/gpu/kernels_table.py OURS.json TORCH.json [--md FILE] [--header TEXT]

Columns: streamweave's median ms, PyTorch eager's and torch.compile's (unchunked), the ratio
of ours to the better of the two (below 1: faster), ours as a share of the memcpy bandwidth
measured in the same run, and whether ours matched the reference. A missing or unreadable
file leaves its columns empty ("–").
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
        "| case | shape | s | streamweave ms | eager ms | compile ms | vs best torch "
        "| % of memcpy | numerics |"
    )
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|---|")
    passed = total = 0
    for r in ours.get("rows", []):
        total += 1
        tr = torch_rows.get((r["case"], r["t"], r["h"]), {})
        eager, comp = tr.get("eager_ms"), tr.get("compile_ms")
        best = min([v for v in (eager, comp) if isinstance(v, (int, float))], default=None)
        ms = r.get("ms")
        ratio = ms / best if isinstance(ms, (int, float)) and best else None
        num = r.get("numerics", {})
        if r.get("error"):
            verdict = "ERROR"
        elif num.get("ok"):
            passed += 1
            verdict = "ok (%.1e)" % num.get("max_rel", 0.0)
        else:
            verdict = "FAIL (%s)" % fmt(num.get("max_rel"), "%.1e")
        lines.append(
            "| %s | [%d, %d] | %d | %s | %s | %s | %s | %s | %s |"
            % (
                r["case"],
                r["t"],
                r["h"],
                r["s"],
                fmt(ms, "%.4f"),
                fmt(eager, "%.4f"),
                fmt(comp, "%.4f"),
                fmt(ratio, "%.2f×"),
                fmt(r.get("pct_of_memcpy"), "%.0f%%"),
                verdict,
            )
        )
    lines.append("")
    lines.append(
        "numerics: %d of %d configurations match the reference" % (passed, total)
        if total
        else "no streamweave rows"
    )
    text = "\n".join(lines) + "\n"
    if a.md:
        with open(a.md, "w") as f:
            f.write(text)
    sys.stdout.write(text)
    return 0 if total and passed == total else 1


if __name__ == "__main__":
    sys.exit(main())
