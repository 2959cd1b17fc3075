"""PyTorch + NCCL reference timings of the benchmarked overlap patterns, run beside our benchmark.

    python3 scripts/gpu/torch_reference.py [--ranks 2,4] [--h 4096,8192] [--t 8192]
        [--iters 20] [--warmup 5] [--out FILE] [--timeout 300] [--port 29640]

For every world size d in --ranks (sizes above torch.cuda.device_count() are skipped) and
every (t, h), one process per rank (spawn) times, in bf16 on fresh random inputs:

  row-parallel     x [t, 4h/d] @ w[h, 4h/d]^T -> [t, h], all_reduce
  column-parallel  x [t/d, h] all_gather -> [t, h] @ w[4h/d, h]^T -> [t, 4h/d]
  matmul+rs        x [t, 4h/d] @ w[h, 4h/d]^T -> [t, h], reduce_scatter on rows -> [t/d, h]
  p2p-ring         column-parallel with the gather done by d-1 point-to-point ring steps
  sp-mlp           the sequence-parallel MLP block, f = 4h: x [t/d, h] all_gather -> [t, h]
                   @ w1[f/d, h]^T -> [t, f/d], SiLU, @ w2[h, f/d]^T -> [t, h],
                   reduce_scatter on rows -> [t/d, h]

each as the matmul alone (mm; sp-mlp: both matmuls), the communication alone (comm; sp-mlp:
the all_gather and the reduce_scatter), one after the other (seq), chunked into S pieces on
4 worker streams (S in 2, 4, 8; p2p-ring: S = d only; sp-mlp: S in 2, 4, each chunk of t
gathered, multiplied, activated, multiplied and reduce-scattered on its stream) and PyTorch
async-TP (torch.ops.symm_mem fused ops; none for row-parallel; sp-mlp:
fused_all_gather_matmul, SiLU, fused_matmul_reduce_scatter). A figure is the median
over --iters timed iterations (after --warmup and one lead-in), issued back to back, each
between two CUDA events (streamweave's method), then the maximum over ranks.

Rank 0 sends each row to the parent, which appends it to --out as one JSON object per line
({"source": "pytorch", "pattern", "d", "t", "h", "mm_ms", "comm_ms", "seq_ms", "chunked",
"async_tp_ms", "async_tp_error", "torch", "nccl", "gpu", ...}) and prints a short line.
A world size whose workers fail or outlast --timeout seconds is killed and reported; the
script goes on with the next and exits 1 at the end when any world size did not finish.
NCCL_NVLS_ENABLE is left as the caller set it.
"""

import argparse
import json
import os
import queue
import statistics
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

PATTERNS = ("row-parallel", "column-parallel", "matmul+rs", "p2p-ring", "sp-mlp")
CHUNKS = (2, 4, 8)
MLP_CHUNKS = (2, 4)
MLP_EXPANSION = 4  # sp-mlp: f = 4h
WORKER_STREAMS = 4


def timeit(fn, iters, warm):
    """Median ms of `fn` over `iters` timed runs after `warm` untimed ones, max over ranks.

    The runs are issued back to back after one untimed lead-in (which absorbs the ranks'
    skew), each between two CUDA events on the current stream: the method of streamweave's
    timer (weave_executor::time_back_to_back), so both sides measure the same thing.
    """
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    torch.cuda.synchronize()
    fn()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    events[0].record()
    for i in range(iters):
        fn()
        events[i + 1].record()
    torch.cuda.synchronize()
    ts = [events[i].elapsed_time(events[i + 1]) for i in range(iters)]
    t = torch.tensor([statistics.median(ts)], device="cuda", dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return round(t.item(), 4)


def short_error(e):
    return "%s: %s" % (type(e).__name__, " ".join(str(e).split())[:200])


def nccl_version():
    v = torch.cuda.nccl.version()
    if isinstance(v, int):  # older releases: 2.28.3 as 22803
        return "%d.%d.%d" % (v // 10000, v // 100 % 100, v % 100)
    return ".".join(map(str, v))


def worker(rank, world, port, cfg, q):
    try:
        work(rank, world, port, cfg, q)
    except BaseException:
        sys.stderr.write("# rank %d of %d failed:\n" % (rank, world))
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


def work(rank, world, port, cfg, q):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank)
    )
    g = dist.group.WORLD
    symm_note = None
    try:
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group

        enable_symm_mem_for_group(g.group_name)
    except Exception as e:
        symm_note = "enable_symm_mem_for_group: " + short_error(e)

    iters, warm = cfg["iters"], cfg["warmup"]
    d = world
    bf = torch.bfloat16
    streams = [torch.cuda.Stream() for _ in range(WORKER_STREAMS)]
    meta = {
        "torch": torch.__version__,
        "nccl": nccl_version(),
        "gpu": torch.cuda.get_device_name(0),
    }

    def tm(fn):
        return timeit(fn, iters, warm)

    def chunked(s, body):
        """body(i) for i < s, chunk i on worker stream i % 4, joined back to the main stream."""
        main = torch.cuda.current_stream()
        for i in range(s):
            st = streams[i % len(streams)]
            st.wait_stream(main)
            with torch.cuda.stream(st):
                body(i)
        for st in streams[: min(s, len(streams))]:
            main.wait_stream(st)

    def async_tp(fn):
        """(ms, None) or (None, error) of a symm_mem fused op."""
        try:
            return tm(fn), None
        except Exception as e:
            err = short_error(e)
            if symm_note:
                err += " (" + symm_note + ")"
            return None, err

    def emit(pattern, t, h, mm, comm, seq, chunks, atp_ms, atp_err):
        row = {
            "source": "pytorch",
            "pattern": pattern,
            "d": d,
            "t": t,
            "h": h,
            "mm_ms": mm,
            "comm_ms": comm,
            "seq_ms": seq,
            "chunked": {str(s): ms for s, ms in chunks.items()},
            "async_tp_ms": atp_ms,
            "async_tp_error": atp_err,
            "iters": iters,
            "warmup": warm,
        }
        row.update(meta)
        if rank == 0:
            q.put(("row", row))

    def skip(pattern, t, h, why):
        if rank == 0:
            q.put(("skip", "%s d=%d t=%d h=%d: %s" % (pattern, d, t, h, why)))

    for h in cfg["h"]:
        for t in cfg["t"]:
            torch.manual_seed(1000 * rank + 7)
            if (4 * h) % d:
                for p in PATTERNS:
                    skip(p, t, h, "4h not divisible by d")
                continue

            # row-parallel: x [t, 4h/d] @ w[h, 4h/d]^T -> [t, h], all_reduce
            x = torch.randn(t, 4 * h // d, device="cuda", dtype=bf)
            w = torch.randn(h, 4 * h // d, device="cuda", dtype=bf) / 64
            out = torch.empty(t, h, device="cuda", dtype=bf)
            mm = tm(lambda: torch.matmul(x, w.t(), out=out))
            comm = tm(lambda: dist.all_reduce(out))
            seq = tm(lambda: (torch.matmul(x, w.t(), out=out), dist.all_reduce(out)))
            chunks = {}
            for s in CHUNKS:
                if t % s:
                    continue
                xc, oc = x.chunk(s), out.chunk(s)

                def body(i, xc=xc, oc=oc):
                    torch.matmul(xc[i], w.t(), out=oc[i])
                    dist.all_reduce(oc[i])

                chunks[s] = tm(lambda s=s, body=body: chunked(s, body))
            emit("row-parallel", t, h, mm, comm, seq, chunks, None, None)

            # matmul+rs: x [t, 4h/d] @ w[h, 4h/d]^T -> [t, h], reduce_scatter rows -> [t/d, h]
            if t % d:
                skip("matmul+rs", t, h, "t not divisible by d")
            else:
                part = torch.empty(t, h, device="cuda", dtype=bf)
                rs = torch.empty(t // d, h, device="cuda", dtype=bf)
                mm = tm(lambda: torch.matmul(x, w.t(), out=part))
                comm = tm(lambda: dist.reduce_scatter_tensor(rs, part))
                seq = tm(
                    lambda: (
                        torch.matmul(x, w.t(), out=part),
                        dist.reduce_scatter_tensor(rs, part),
                    )
                )
                chunks = {}
                for s in CHUNKS:
                    if t % (s * d):
                        continue
                    # chunk i: rows i of x -> part chunk i [t/S, h] -> rs chunk i [t/(S d), h]
                    xc, pc, rc = x.chunk(s), part.chunk(s), rs.chunk(s)

                    def body(i, xc=xc, pc=pc, rc=rc):
                        torch.matmul(xc[i], w.t(), out=pc[i])
                        dist.reduce_scatter_tensor(rc[i], pc[i])

                    chunks[s] = tm(lambda s=s, body=body: chunked(s, body))
                atp_ms, atp_err = async_tp(
                    lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(
                        x, w.t(), "sum", scatter_dim=0, group_name=g.group_name
                    )
                )
                emit("matmul+rs", t, h, mm, comm, seq, chunks, atp_ms, atp_err)
                del part, rs
            del x, w, out

            if t % d:
                skip("column-parallel", t, h, "t not divisible by d")
                skip("p2p-ring", t, h, "t not divisible by d")
                skip("sp-mlp", t, h, "t not divisible by d")
                torch.cuda.empty_cache()
                continue

            # column-parallel: x [t/d, h] all_gather -> [t, h] @ w[4h/d, h]^T -> [t, 4h/d]
            tb = t // d
            xs = torch.randn(tb, h, device="cuda", dtype=bf)
            w2 = torch.randn(4 * h // d, h, device="cuda", dtype=bf) / 64
            full = torch.empty(t, h, device="cuda", dtype=bf)
            out2 = torch.empty(t, 4 * h // d, device="cuda", dtype=bf)
            mm_col = tm(lambda: torch.matmul(full, w2.t(), out=out2))
            comm = tm(lambda: dist.all_gather_into_tensor(full, xs))
            seq = tm(
                lambda: (
                    dist.all_gather_into_tensor(full, xs),
                    torch.matmul(full, w2.t(), out=out2),
                )
            )
            chunks = {}
            for s in CHUNKS:
                if tb % s:
                    continue
                xsc = [c.contiguous() for c in xs.chunk(s)]
                bufs = [
                    torch.empty(d * (tb // s), h, device="cuda", dtype=bf) for _ in range(s)
                ]
                oc = out2.view(s, d * (tb // s), -1)  # chunk-major output layout

                def body(i, xsc=xsc, bufs=bufs, oc=oc):
                    dist.all_gather_into_tensor(bufs[i], xsc[i])
                    torch.matmul(bufs[i], w2.t(), out=oc[i])

                chunks[s] = tm(lambda s=s, body=body: chunked(s, body))
                del xsc, bufs
            atp_ms, atp_err = async_tp(
                lambda: torch.ops.symm_mem.fused_all_gather_matmul(
                    xs, [w2.t()], gather_dim=0, group_name=g.group_name
                )
            )
            emit("column-parallel", t, h, mm_col, comm, seq, chunks, atp_ms, atp_err)

            # p2p-ring: step i receives the block of rank (rank + i) % d from that rank while
            # sending this rank's block to (rank - i) % d; step 0 copies the local block.
            blocks = full.view(d, tb, h)
            oblocks = out2.view(d, tb, -1)

            def ring_step(i):
                """Step i's communication (or local copy); returns the block index it filled."""
                src = (rank + i) % d
                if i == 0:
                    blocks[src].copy_(xs)
                    return src
                dst = (rank - i) % d
                ops = [
                    dist.P2POp(dist.isend, xs, dst),
                    dist.P2POp(dist.irecv, blocks[src], src),
                ]
                for req in dist.batch_isend_irecv(ops):
                    req.wait()
                return src

            def ring_comm():
                for i in range(1, d):
                    ring_step(i)

            def ring_seq():
                for i in range(d):
                    ring_step(i)
                torch.matmul(full, w2.t(), out=out2)

            def ring_body(i):
                src = ring_step(i)
                torch.matmul(blocks[src], w2.t(), out=oblocks[src])

            comm = tm(ring_comm)
            seq = tm(ring_seq)
            chunks = {d: tm(lambda: chunked(d, ring_body))}
            atp_ms, atp_err = async_tp(
                lambda: torch.ops.symm_mem.fused_all_gather_matmul(
                    xs, [w2.t()], gather_dim=0, group_name=g.group_name
                )
            )
            emit("p2p-ring", t, h, mm_col, comm, seq, chunks, atp_ms, atp_err)
            del w2, out2, blocks, oblocks
            torch.cuda.empty_cache()

            # sp-mlp: x [t/d, h] all_gather -> [t, h] @ w1[f/d, h]^T -> h1 [t, f/d], SiLU (in
            # place), @ w2[h, f/d]^T -> [t, h] partial sums, reduce_scatter rows -> [t/d, h]
            fd = MLP_EXPANSION * h // d
            w1 = torch.randn(fd, h, device="cuda", dtype=bf) / 64
            w3 = torch.randn(h, fd, device="cuda", dtype=bf) / 64
            h1 = torch.empty(t, fd, device="cuda", dtype=bf)
            part = torch.empty(t, h, device="cuda", dtype=bf)
            rs = torch.empty(tb, h, device="cuda", dtype=bf)

            def mlp_mm():
                torch.matmul(full, w1.t(), out=h1)
                torch.matmul(h1, w3.t(), out=part)

            def mlp_comm():
                dist.all_gather_into_tensor(full, xs)
                dist.reduce_scatter_tensor(rs, part)

            def mlp_seq():
                dist.all_gather_into_tensor(full, xs)
                torch.matmul(full, w1.t(), out=h1)
                F.silu(h1, inplace=True)
                torch.matmul(h1, w3.t(), out=part)
                dist.reduce_scatter_tensor(rs, part)

            mm = tm(mlp_mm)
            comm = tm(mlp_comm)
            seq = tm(mlp_seq)
            chunks = {}
            for s in MLP_CHUNKS:
                if tb % s:
                    continue
                # chunk i: every rank's rows i of x gathered into [d t/(S d), h] (chunk-major, as
                # column-parallel), its h1 and partial-sum rows, reduce-scattered back into this
                # rank's rows i of the output.
                xsc = [c.contiguous() for c in xs.chunk(s)]
                fc, hc, pc, rc = full.chunk(s), h1.chunk(s), part.chunk(s), rs.chunk(s)

                def body(i, xsc=xsc, fc=fc, hc=hc, pc=pc, rc=rc):
                    dist.all_gather_into_tensor(fc[i], xsc[i])
                    torch.matmul(fc[i], w1.t(), out=hc[i])
                    F.silu(hc[i], inplace=True)
                    torch.matmul(hc[i], w3.t(), out=pc[i])
                    dist.reduce_scatter_tensor(rc[i], pc[i])

                chunks[s] = tm(lambda s=s, body=body: chunked(s, body))
                del xsc, fc, hc, pc, rc

            def mlp_async_tp():
                _, outs = torch.ops.symm_mem.fused_all_gather_matmul(
                    xs, [w1.t()], gather_dim=0, group_name=g.group_name
                )
                a = F.silu(outs[0], inplace=True)
                return torch.ops.symm_mem.fused_matmul_reduce_scatter(
                    a, w3.t(), "sum", scatter_dim=0, group_name=g.group_name
                )

            atp_ms, atp_err = async_tp(mlp_async_tp)
            emit("sp-mlp", t, h, mm, comm, seq, chunks, atp_ms, atp_err)
            del xs, w1, w3, full, h1, part, rs
            torch.cuda.empty_cache()

    torch.cuda.synchronize()
    dist.barrier()
    if rank == 0:
        q.put(("done", symm_note))
    dist.destroy_process_group()


def fmt(v):
    return "-" if v is None else "%.3f" % v


def describe(r):
    """One human-readable line of a result row."""
    ch = " ".join("S%s=%s" % (s, fmt(ms)) for s, ms in r["chunked"].items())
    line = "%-15s d=%d t=%d h=%d mm=%s comm=%s seq=%s %s asyncTP=%s" % (
        r["pattern"], r["d"], r["t"], r["h"], fmt(r["mm_ms"]), fmt(r["comm_ms"]),
        fmt(r["seq_ms"]), ch, fmt(r["async_tp_ms"]),
    )
    figs = list(r["chunked"].values()) + (
        [r["async_tp_ms"]] if r["async_tp_ms"] is not None else []
    )
    if figs and r["seq_ms"] and r["mm_ms"] and r["comm_ms"]:
        best = min(figs)
        line += " | best/seq=%.2f best/ideal=%.2f" % (
            best / r["seq_ms"], best / max(r["mm_ms"], r["comm_ms"])
        )
    if r["async_tp_error"]:
        line += " | asyncTP error: " + r["async_tp_error"]
    return line


def run_world(world, port, cfg, timeout, out_path):
    """Runs one world size; True when every worker finished."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=worker, args=(r, world, port, cfg, q)) for r in range(world)]
    for p in ps:
        p.start()
    deadline = time.monotonic() + timeout
    done = False
    why = None
    rows = 0

    def handle(msg):
        nonlocal done, rows
        kind, payload = msg
        if kind == "row":
            rows += 1
            if out_path:
                with open(out_path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(payload) + "\n")
            print(describe(payload), flush=True)
        elif kind == "skip":
            print("# skipped: " + payload, flush=True)
        elif kind == "done":
            done = True
            if payload:
                print("# d=%d: %s" % (world, payload), flush=True)

    while not done:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            why = "timed out after %d s" % timeout
            break
        try:
            handle(q.get(timeout=min(1.0, remaining)))
            continue
        except queue.Empty:
            pass
        failed = [(r, p.exitcode) for r, p in enumerate(ps) if p.exitcode not in (None, 0)]
        if failed:
            why = "worker(s) failed: " + ", ".join("rank %d exit %s" % f for f in failed)
            break
        if all(p.exitcode == 0 for p in ps):
            why = "workers exited without reporting completion"
            break
    # Rows sent just before a failure are still written.
    while not done:
        try:
            handle(q.get(timeout=0.2))
        except (queue.Empty, OSError, EOFError, ValueError):
            break
    if done:
        for p in ps:
            p.join(timeout=30)
    for p in ps:
        if p.is_alive():
            p.kill()
            p.join(timeout=10)
    if not done:
        print("# d=%d: %s; workers killed, %d row(s) recorded, going on" % (world, why, rows),
              flush=True)
    return done


def int_list(text):
    try:
        vals = [int(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError("expected comma-separated integers: %r" % text)
    if not vals or any(v <= 0 for v in vals):
        raise argparse.ArgumentTypeError("expected positive integers: %r" % text)
    return vals


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int_list, default=[2, 4], help="world sizes (default 2,4)")
    ap.add_argument("--h", type=int_list, default=[4096, 8192], help="hidden sizes (default 4096,8192)")
    ap.add_argument("--t", type=int_list, default=[8192], help="token counts (default 8192)")
    ap.add_argument("--iters", type=int, default=20, help="timed iterations (default 20)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed iterations (default 5)")
    ap.add_argument("--out", default=None, help="JSON lines file, appended to")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per world size (default 300)")
    ap.add_argument("--port", type=int, default=29640, help="MASTER_PORT base; port = base + d")
    args = ap.parse_args()
    if args.iters < 1 or args.warmup < 0:
        ap.error("--iters must be >= 1 and --warmup >= 0")

    n_gpu = torch.cuda.device_count()
    cfg = {"h": args.h, "t": args.t, "iters": args.iters, "warmup": args.warmup}
    print("# torch %s, %d GPU(s), NCCL_NVLS_ENABLE=%s, iters %d, warmup %d" % (
        torch.__version__, n_gpu, os.environ.get("NCCL_NVLS_ENABLE", "(unset)"),
        args.iters, args.warmup), flush=True)
    if args.out:
        d = os.path.dirname(os.path.abspath(args.out))
        os.makedirs(d, exist_ok=True)
        open(args.out, "a").close()
    ok = True
    for world in args.ranks:
        if world > n_gpu:
            print("# d=%d: skipped, only %d GPU(s)" % (world, n_gpu), flush=True)
            continue
        print("# d=%d" % world, flush=True)
        ok = run_world(world, args.port + world, cfg, args.timeout, args.out) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
