"""Merge our overlap benchmark's JSON lines with the PyTorch reference's and the default runs' into one markdown table.

    python3 scripts/gpu/bench_table.py OURS.jsonl TORCH.jsonl [--default DEFAULT.jsonl]
        [--md FILE] [--short] [--short-md FILE] [--header TEXT]

OURS holds lines written by the Rust benchmark ("source": "streamweave": one row per
pattern, d, t, h; "streamweave-error": a row that failed; "streamweave-experiment": one extra
configuration against a baseline; other sources are ignored). TORCH holds lines of
scripts/gpu/torch_reference.py ("source": "pytorch"). DEFAULT holds the lines scripts/gpu/bench.sh
writes for its default runs ("source": "streamweave-default": `weave run` as a user runs it,
every option default; "ms" its timed median, "config" the `config:` line it printed, "s" the
chunk count, "rc" its exit status). TORCH and DEFAULT may be missing or empty. Lines of the
three are matched by (pattern, d, t, h); when a key appears twice in one file, the last line
wins. A row is printed for every key found in any of them; what is missing shows "-" and the
targets that need it are "n/a".

Prints --header (when given), the main table (every figure, both sets of targets), the
definitions and, when experiment lines exist, a second table of them; the same text goes to
--md FILE when given. With --short only a short table goes to stdout (the default column
against PyTorch and our own figures, the default targets); --short-md FILE also writes it.
Either way the last line printed is the summary of the default targets met. Exits 0 even
when targets are missed, 2 when no input has a usable line. Standard library only.
"""

import argparse
import json
import math
import re
import sys

PATTERN_ORDER = {
    "row-parallel": 0,
    "row-parallel-ring": 1,
    "column-parallel": 2,
    "matmul+rs": 3,
    "matmul+rs-ring": 4,
    "p2p-ring": 5,
    "sp-mlp": 6,
    "sp-mlp-ring": 7,
}
MLP = "sp-mlp"
# Default rows of a pattern written with one stream chunk per device (the program a user
# writes for async-TP's decomposition): the same layer as the base pattern, whose mm, comm,
# S=1 and PyTorch figures they are compared with.
BASE = {
    "sp-mlp-ring": "sp-mlp",
    "matmul+rs-ring": "matmul+rs",
    "row-parallel-ring": "row-parallel",
}


def base_key(key):
    """The key whose gpu_overlap and PyTorch rows a default row of `key` is compared with."""
    return (BASE.get(key[0], key[0]),) + tuple(key[1:])
COMM_SHARE = 0.2  # the ideal and PyTorch targets only where comm >= 20% of mm

# Targets of the best configuration (the sweep and the experiments).
IDEAL_SLACK = 1.15  # best <= 1.15 * max(mm, comm)
TORCH_GAIN = 0.85  # best <= 0.85 * torch seq
AUTO_NOISE = 1.02  # auto <= 1.02 * S=1

# Targets of the default run (issue 26).
D_SEQ = 0.80  # default <= 0.80 * torch seq (where comm >= 20% of mm; not sp-mlp)
D_BEST_TORCH = 0.90  # default <= 0.90 * the best PyTorch form (where comm >= 20% of mm)
D_IDEAL = 1.15  # default <= 1.15 * max(mm, comm) (where comm >= 20% of mm)
D_MLP_SEQ = 0.85  # sp-mlp: default <= 0.85 * torch seq (every sp-mlp row)
D_NOISE = 1.02  # default <= 1.02 * S=1 (every row: never slower than no overlap)
DEFAULT_TARGETS = ("seq", "best torch", "ideal", "mlp seq", "async-TP", "S=1")


def num(v):
    """v as a float when it is a finite number, else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def ms(v):
    v = num(v)
    return "-" if v is None else "%.3f" % v


def ratio(a, b):
    a, b = num(a), num(b)
    if a is None or b is None or b <= 0:
        return "-"
    return "%.2f" % (a / b)


def cell(text):
    """Text made safe for one markdown table cell."""
    text = " ".join(str(text).split())
    return text.replace("|", "\\|") if text else "-"


def as_dict(v):
    return v if isinstance(v, dict) else {}


def read_lines(path, required, what):
    """JSON objects of a JSON lines file; [] for a missing optional file (or no path)."""
    objs = []
    if not path:
        return objs
    try:
        f = open(path, encoding="utf-8", errors="replace")
    except OSError as e:
        if required:
            raise
        sys.stderr.write("bench_table.py: %s: %s (%s left empty)\n" % (path, e.strerror, what))
        return objs
    with f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            try:
                obj = json.loads(line)
            except ValueError as e:
                sys.stderr.write("bench_table.py: %s:%d: not JSON (%s), skipped\n" % (path, n, e))
                continue
            if isinstance(obj, dict):
                objs.append(obj)
    return objs


def key_of(obj):
    """(pattern, d, t, h) of a line, or None when one of them is missing."""
    pattern = obj.get("pattern")
    dims = [obj.get(k) for k in ("d", "t", "h")]
    if not isinstance(pattern, str) or any(
        isinstance(v, bool) or not isinstance(v, int) for v in dims
    ):
        return None
    return (pattern,) + tuple(dims)


def sort_key(key):
    pattern, d, t, h = key
    return (PATTERN_ORDER.get(pattern, len(PATTERN_ORDER)), pattern, d, t, h)


def chunk_ms(chunks, s):
    if not isinstance(chunks, dict):
        return None
    return num(chunks.get(str(s)))


def torch_chunked(row):
    """(ms, S) of the fastest chunked PyTorch figure, or (None, None)."""
    best = (None, None)
    chunked = row.get("chunked") if row else None
    if isinstance(chunked, dict):
        for s, v in chunked.items():
            v = num(v)
            if v is not None and (best[0] is None or v < best[0]):
                best = (v, s)
    return best


def torch_best(row):
    """(ms, form) of the fastest PyTorch form (seq, chunked at some S, async-TP), or (None, None)."""
    if not row:
        return (None, None)
    forms = [(num(row.get("seq_ms")), "seq")]
    tch, tch_s = torch_chunked(row)
    forms.append((tch, "chunked S=%s" % tch_s))
    forms.append((num(row.get("async_tp_ms")), "async-TP"))
    forms = [f for f in forms if f[0] is not None]
    return min(forms, key=lambda f: f[0]) if forms else (None, None)


def default_ms(row):
    return num(row.get("ms")) if row else None


def default_text(row):
    """The default column: "ms (config)", or why there is no figure."""
    if not row:
        return "-"
    v = default_ms(row)
    config = row.get("config")
    if not isinstance(config, str) or not config.strip():
        s = row.get("s")
        config = "S=%s" % s if s is not None else ""
    # "S=2 K=2 replay, NCCL (from the tuning cache)" -> "S=2 K=2 replay, NCCL; from the tuning cache"
    config = re.sub(r"\s*\((from [^()]*)\)\s*$", r"; \1", config)
    if v is None:
        why = row.get("error") or ("rc=%s" % row.get("rc"))
        return "FAIL (%s)" % " ".join(str(why).split())[:80]
    return "%.3f (%s)" % (v, config) if config else "%.3f" % v


def comm_heavy(ours):
    """True / False whether comm >= 20% of mm, None without both figures."""
    mm, comm = num(ours.get("mm_ms")), num(ours.get("comm_ms"))
    if mm is None or comm is None:
        return None
    return comm >= COMM_SHARE * mm - 1e-9


class Checker:
    """Collects "name ok|MISS|n/a" texts of one row and counts met/checked per name."""

    def __init__(self, counts):
        self.counts = counts
        self.out = []

    def check(self, name, value, limit, strict=False, failed=False):
        if failed:
            self.counts[name][1] += 1
            self.out.append("%s MISS" % name)
            return
        if value is None or limit is None:
            self.out.append("%s n/a" % name)
            return
        ok = value < limit if strict else value <= limit
        self.counts[name][0] += ok
        self.counts[name][1] += 1
        self.out.append("%s %s" % (name, "ok" if ok else "MISS"))

    def note(self, text):
        self.out.append(text)

    def text(self):
        return ", ".join(self.out) if self.out else "-"


def best_targets(ours, torch_row, counts):
    """Targets of the best configuration; updates counts[name] = [met, checked]."""
    c = Checker(counts)
    if not ours:
        c.note("(no row of ours)")
        return c.text()
    mm, comm = num(ours.get("mm_ms")), num(ours.get("comm_ms"))
    best = num(as_dict(ours.get("best")).get("ms"))
    auto = num(as_dict(ours.get("auto")).get("ms"))
    s1 = num(ours.get("s1_ms"))
    heavy = comm_heavy(ours)
    if heavy:
        c.check("ideal", best, IDEAL_SLACK * max(mm, comm))
        tseq = num(torch_row.get("seq_ms")) if torch_row else None
        if tseq is not None:
            c.check("torch", best, TORCH_GAIN * tseq)
    elif heavy is False:
        c.note("(comm < 20% mm)")
    else:
        c.note("(no mm/comm)")
    c.check("auto", auto, None if s1 is None else AUTO_NOISE * s1)
    numerics = ours.get("numerics")
    if isinstance(numerics, dict) and numerics.get("ok") is False:
        c.note("numerics FAIL")
    return c.text()


def default_targets(pattern, ours, torch_row, drow, counts):
    """Targets of the default run; updates counts[name] = [met, checked]."""
    c = Checker(counts)
    if not drow:
        c.note("(no default run)")
        return c.text()
    dv = default_ms(drow)
    failed = dv is None  # the run was attempted and gave no figure: every target missed
    ours = ours or {}
    mm, comm = num(ours.get("mm_ms")), num(ours.get("comm_ms"))
    tseq = num(torch_row.get("seq_ms")) if torch_row else None
    tbest, _ = torch_best(torch_row)
    heavy = comm_heavy(ours)
    if heavy:
        if BASE.get(pattern, pattern) != MLP:
            c.check("seq", dv, None if tseq is None else D_SEQ * tseq, failed=failed and tseq is not None)
        c.check("best torch", dv, None if tbest is None else D_BEST_TORCH * tbest,
                failed=failed and tbest is not None)
        c.check("ideal", dv, D_IDEAL * max(mm, comm), failed=failed)
    elif heavy is False:
        c.note("(comm < 20% mm)")
    else:
        c.note("(no mm/comm)")
    if BASE.get(pattern, pattern) == MLP:
        atp = num(torch_row.get("async_tp_ms")) if torch_row else None
        c.check("mlp seq", dv, None if tseq is None else D_MLP_SEQ * tseq,
                failed=failed and tseq is not None)
        c.check("async-TP", dv, atp, strict=True, failed=failed and atp is not None)
    s1 = num(ours.get("s1_ms"))
    c.check("S=1", dv, None if s1 is None else D_NOISE * s1, failed=failed and s1 is not None)
    return c.text()


def summary_line(title, counts, names):
    parts = []
    for name in names:
        met, checked = counts[name]
        if checked:
            parts.append("%s %d/%d" % (name, met, checked))
    return "%s: %s" % (title, "; ".join(parts) if parts else "none checked")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ours", help="JSON lines of our benchmark (may be missing when another input has rows)")
    ap.add_argument("torch", nargs="?", help="JSON lines of torch_reference.py (may be missing or empty)")
    ap.add_argument("--default", dest="default", help="JSON lines of bench.sh's default runs (may be missing)")
    ap.add_argument("--md", help="also write the full text to this file")
    ap.add_argument("--short", action="store_true", help="print only the short table")
    ap.add_argument("--short-md", help="also write the short table to this file")
    ap.add_argument("--header", help="line printed above the tables")
    args = ap.parse_args(argv)

    ours_lines = read_lines(args.ours, required=False, what="our columns")
    torch_lines = read_lines(args.torch, required=False, what="PyTorch columns")
    default_lines = read_lines(args.default, required=False, what="default column")

    ours, errors, experiments = {}, {}, []
    for obj in ours_lines:
        key = key_of(obj)
        if key is None:
            continue
        source = obj.get("source")
        if source == "streamweave":
            ours[key] = obj
            errors.pop(key, None)
        elif source == "streamweave-error":
            errors[key] = obj
        elif source == "streamweave-experiment":
            experiments.append(obj)
    torch_rows, default_rows = {}, {}
    for obj in torch_lines:
        key = key_of(obj)
        if key is not None and obj.get("source") == "pytorch":
            torch_rows[key] = obj
    for obj in default_lines:
        key = key_of(obj)
        if key is not None and obj.get("source") == "streamweave-default":
            default_rows[key] = obj
    keys = sorted(set(ours) | set(errors) | set(torch_rows) | set(default_rows), key=sort_key)
    if not keys:
        sys.stderr.write(
            "bench_table.py: no usable line (\"source\": \"streamweave\", \"pytorch\" or "
            "\"streamweave-default\" with pattern, d, t, h) in %s\n"
            % ", ".join(p for p in (args.ours, args.torch, args.default) if p)
        )
        return 2

    multi_t = len({k[2] for k in keys} | {k[2] for k in map(key_of, experiments)}) > 1
    t_head = " t |" if multi_t else ""
    t_rule = "---:|" if multi_t else ""

    best_counts = {n: [0, 0] for n in ("ideal", "torch", "auto")}
    default_counts = {n: [0, 0] for n in DEFAULT_TARGETS}
    full, short = [], []
    if args.header:
        full += [args.header, ""]
        short += [args.header, ""]
    full.append(
        "| pattern | d |%s h | mm | comm | comm/mm | S=1 | S=2 | S=4 | S=8 | auto (S) | best (config) "
        "| best / max(mm,comm) | torch seq | torch chunked (best S) | torch async-TP "
        "| best / torch seq | targets (best) | default (config) | default / torch seq "
        "| default / best torch | default / max(mm,comm) | default / S=1 | targets (default) |"
        % t_head
    )
    full.append(
        "|---|---:|%s---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---|---:|---:|---|---|---:|---:|---:|---:|---|"
        % t_rule
    )
    short.append(
        "| pattern | d |%s h | mm | comm | S=1 | best (config) | default (config) | torch seq "
        "| best torch (form) | default / torch seq | default / best torch | default / max(mm,comm) "
        "| default / S=1 | targets (default) |" % t_head
    )
    short.append("|---|---:|%s---:|---:|---:|---:|---|---|---:|---|---:|---:|---:|---:|---|" % t_rule)

    for key in keys:
        pattern, d, t, h = key
        r = ours.get(base_key(key)) or {}
        err = errors.get(base_key(key))
        tr = torch_rows.get(base_key(key))
        dr = default_rows.get(key)
        mm, comm = num(r.get("mm_ms")), num(r.get("comm_ms"))
        chunks = r.get("chunks")
        auto = as_dict(r.get("auto"))
        best = as_dict(r.get("best"))
        auto_txt = ms(auto.get("ms"))
        if auto_txt != "-" and auto.get("s") is not None:
            auto_txt += " (%s)" % auto.get("s")
        best_txt = ms(best.get("ms"))
        if best_txt != "-" and best.get("config"):
            best_txt += " (%s)" % best.get("config")
        if not r and err:
            best_txt = "ERROR: %s" % " ".join(str(err.get("error")).split())[:80]
        ideal = max(mm, comm) if mm is not None and comm is not None else None
        tseq = num(tr.get("seq_ms")) if tr else None
        tch, tch_s = torch_chunked(tr)
        tch_txt = "-" if tch is None else "%.3f (%s)" % (tch, tch_s)
        tatp = ms(tr.get("async_tp_ms")) if tr else "-"
        tbest, tbest_form = torch_best(tr)
        tbest_txt = "-" if tbest is None else "%.3f (%s)" % (tbest, tbest_form)
        dv = default_ms(dr)
        d_txt = default_text(dr)
        s1 = r.get("s1_ms")
        bt = best_targets(r, tr, best_counts)
        dt = default_targets(pattern, r, tr, dr, default_counts)
        lead = [pattern, d] + ([t] if multi_t else []) + [h]
        cells = lead + [
            ms(mm),
            ms(comm),
            ratio(comm, mm),
            ms(s1),
            ms(chunk_ms(chunks, 2)),
            ms(chunk_ms(chunks, 4)),
            ms(chunk_ms(chunks, 8)),
            auto_txt,
            best_txt,
            ratio(best.get("ms"), ideal),
            ms(tseq),
            tch_txt,
            tatp,
            ratio(best.get("ms"), tseq),
            bt,
            d_txt,
            ratio(dv, tseq),
            ratio(dv, tbest),
            ratio(dv, ideal),
            ratio(dv, s1),
            dt,
        ]
        full.append("| " + " | ".join(cell(c) for c in cells) + " |")
        cells = lead + [
            ms(mm),
            ms(comm),
            ms(s1),
            best_txt,
            d_txt,
            ms(tseq),
            tbest_txt,
            ratio(dv, tseq),
            ratio(dv, tbest),
            ratio(dv, ideal),
            ratio(dv, s1),
            dt,
        ]
        short.append("| " + " | ".join(cell(c) for c in cells) + " |")

    rows_note = "%d rows: %d of ours, %d with a PyTorch row, %d with a default run" % (
        len(keys), sum(1 for k in keys if k in ours), sum(1 for k in keys if k in torch_rows),
        sum(1 for k in keys if k in default_rows),
    )
    best_summary = summary_line("Best-configuration targets met", best_counts, ("ideal", "torch", "auto"))
    default_summary = summary_line("Default targets met", default_counts, DEFAULT_TARGETS)
    definitions = (
        "Times in ms (median over iterations, max over ranks). ideal = max(mm, comm); sp-mlp: mm = "
        "both GEMMs, comm = the allgather + the reduce-scatter (f = 4h). default = `weave run` as "
        "a user runs it (every option default, a fresh tuning cache; its timed median), with the "
        "configuration it printed. best torch = the fastest of PyTorch's seq, chunked and async-TP. "
        "Best-configuration targets, where comm >= 20%% of mm: ideal ok when best <= %.2f x "
        "max(mm, comm); torch ok when best <= %.2f x torch seq; every row: auto ok when auto <= "
        "%.2f x S=1. Default targets, where comm >= 20%% of mm: seq ok when default <= %.2f x torch "
        "seq (not sp-mlp); best torch ok when default <= %.2f x best torch; ideal ok when default "
        "<= %.2f x max(mm, comm); every sp-mlp row: mlp seq ok when default <= %.2f x torch seq, "
        "async-TP ok when default < torch async-TP; every row: S=1 ok when default <= %.2f x S=1 "
        "(a 2%% allowance for run-to-run noise). n/a: a figure is missing; a default run that "
        "failed misses every target it has figures for. torch chunked = fastest of PyTorch's "
        "chunked runs on 4 worker streams, S in parentheses; torch async-TP = torch.ops.symm_mem "
        "fused ops (none for row-parallel). p2p-ring rows chunk only with S = d. numerics FAIL: "
        "our outputs differed from the reference."
        % (IDEAL_SLACK, TORCH_GAIN, AUTO_NOISE, D_SEQ, D_BEST_TORCH, D_IDEAL, D_MLP_SEQ, D_NOISE)
    )
    full += ["", definitions]
    atp_errors = sorted(
        {(k[0], k[1], tr.get("async_tp_error")) for k, tr in torch_rows.items() if tr.get("async_tp_error")}
    )
    for pattern, d, err in atp_errors:
        full.append("PyTorch async-TP %s d=%s: %s" % (pattern, d, " ".join(str(err).split())))
    for k in keys:
        if k in errors and k not in ours:
            full.append("Ours %s d=%s t=%s h=%s: ERROR %s" % (k + (" ".join(str(errors[k].get("error")).split()),)))

    if experiments:
        last = {}
        for e in experiments:
            k = key_of(e)
            if k is not None:
                last[k + (str(e.get("experiment")), str(e.get("config")))] = e
        full.append("")
        full.append("| pattern | d |%s h | experiment | config | ms | baseline ms | ratio |" % t_head)
        full.append("|---|---:|%s---:|---|---|---:|---:|---:|" % t_rule)
        # k = (pattern, d, t, h, experiment, config): sorted by pattern, d, h, experiment
        order = lambda k: (PATTERN_ORDER.get(k[0], len(PATTERN_ORDER)), k[0], k[1], k[3], k[4], k[2], k[5])
        for k in sorted(last, key=order):
            e = last[k]
            pattern, d, t, h = k[:4]
            cells = [pattern, d] + ([t] if multi_t else []) + [
                h,
                e.get("experiment"),
                e.get("config"),
                ms(e.get("ms")),
                ms(e.get("baseline_ms")),
                ratio(e.get("ms"), e.get("baseline_ms")),
            ]
            full.append("| " + " | ".join(cell(c) for c in cells) + " |")

    # Both texts end with the summaries, the default targets last.
    full += ["", rows_note + ".", best_summary + ".", default_summary + "."]
    short += ["", rows_note + ". Definitions and every experiment: the full table.",
              best_summary + ".", default_summary + "."]
    full_text = "\n".join(full) + "\n"
    short_text = "\n".join(short) + "\n"
    sys.stdout.write(short_text if args.short else full_text)
    for path, text in ((args.md, full_text), (args.short_md, short_text)):
        if path:
            try:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
            except OSError as e:
                sys.stderr.write("bench_table.py: cannot write %s: %s\n" % (path, e.strerror))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
