"""Whether cuBLASLt's atomic-sync counters work for a bf16 GEMM on this GPU (a probe).

A GEMM with `CUBLASLT_MATMUL_DESC_ATOMIC_SYNC_*` set signals each chunk of its output as it
is written (output counters) or waits for each chunk of its input (input counters), which a
copy engine could wait on (`cuStreamWaitValue32`, no SM) to overlap a transfer with the GEMM.
This script calls the cuBLASLt that PyTorch loaded through ctypes: a plain GEMM (time, against
`torch.nn.functional.linear`), then each counter attribute by rows and by columns of D, and
where cuBLASLt accepts them, when each output chunk's counter drops and whether a GEMM waiting
on input counters finishes once a copy-engine stream releases them. Run on a GPU machine:
`M=8192 N=8192 K=8192 CH=4 python3 scripts/cublaslt_atomic_sync.py` (docs/benchmarks.md,
2026-11-28 fifteenth: cuBLAS 13.1 refuses every attribute).
"""
import ctypes, os, re, sys, time
import torch

torch.cuda.set_device(0)
a = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
(a @ a).sum().item()
path = None
for line in open("/proc/self/maps"):
    m = re.search(r"(/\S*libcublasLt\.so[.\d]*)", line)
    if m:
        path = m.group(1)
        break
print("cublasLt:", path)
lt = ctypes.CDLL(path)
cu = ctypes.CDLL("libcuda.so.1")
print("cublasLt version", lt.cublasLtGetVersion())

vp = ctypes.c_void_p
lt.cublasLtMatmul.argtypes = [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, ctypes.c_size_t, vp]


def chk(r, what):
    if r != 0:
        raise RuntimeError(f"{what}: status {r}")


h = vp()
chk(lt.cublasLtCreate(ctypes.byref(h)), "create")

CUDA_R_16BF, CUDA_R_32F, COMPUTE_32F = 14, 0, 68
TRANSA, TRANSB, SMT = 3, 4, 15
ROWS, COLS, INC, OUTC = 27, 28, 29, 30
PREF_WS = 1
WS = 32 << 20
ws = torch.empty(WS, dtype=torch.uint8, device="cuda")


class Heur(ctypes.Structure):
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("ws", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def layout(rows, cols, ld):
    l = vp()
    chk(lt.cublasLtMatrixLayoutCreate(ctypes.byref(l), CUDA_R_16BF, ctypes.c_uint64(rows), ctypes.c_uint64(cols), ctypes.c_int64(ld)), "layout")
    return l


def setd(desc, attr, val):
    chk(lt.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(val), ctypes.sizeof(val)), f"setattr {attr}")


class Gemm:
    """D[M,N] = X[M,K] @ W[N,K]^T (row-major), as cuBLAS col-major D^T = W^T' X^T."""

    def __init__(self, M, N, K, rows_chunks=0, cols_chunks=0, inc=None, outc=None, sm=0):
        self.desc = vp()
        chk(lt.cublasLtMatmulDescCreate(ctypes.byref(self.desc), COMPUTE_32F, CUDA_R_32F), "desc")
        setd(self.desc, TRANSA, ctypes.c_int32(1))
        setd(self.desc, TRANSB, ctypes.c_int32(0))
        if sm:
            setd(self.desc, SMT, ctypes.c_int32(sm))
        if rows_chunks:
            setd(self.desc, ROWS, ctypes.c_int32(rows_chunks))
        if cols_chunks:
            setd(self.desc, COLS, ctypes.c_int32(cols_chunks))
        if inc is not None:
            setd(self.desc, INC, ctypes.c_void_p(inc.data_ptr()))
        if outc is not None:
            setd(self.desc, OUTC, ctypes.c_void_p(outc.data_ptr()))
        self.A = layout(K, N, K)
        self.B = layout(K, M, K)
        self.D = layout(N, M, N)
        pref = vp()
        chk(lt.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "pref")
        w = ctypes.c_uint64(WS)
        chk(lt.cublasLtMatmulPreferenceSetAttribute(pref, PREF_WS, ctypes.byref(w), 8), "prefattr")
        res = (Heur * 8)()
        n = ctypes.c_int(0)
        r = lt.cublasLtMatmulAlgoGetHeuristic(h, self.desc, self.A, self.B, self.D, self.D, pref, 8, res, ctypes.byref(n))
        self.status = r
        self.count = n.value
        self.res = res
        if r != 0 or n.value == 0:
            raise RuntimeError(f"heuristic status {r} count {n.value}")
        self.alpha = ctypes.c_float(1.0)
        self.beta = ctypes.c_float(0.0)

    def caps(self):
        out = []
        for i in range(self.count):
            v = ctypes.c_int32(0)
            sz = ctypes.c_size_t(0)
            r = lt.cublasLtMatmulAlgoCapGetAttribute(ctypes.byref(self.res[i].algo), 20, ctypes.byref(v), 4, ctypes.byref(sz))
            out.append((r, v.value))
        return out

    def run(self, x, w, d, stream):
        chk(lt.cublasLtMatmul(h, self.desc, ctypes.byref(self.alpha), w.data_ptr(), self.A, x.data_ptr(), self.B,
                              ctypes.byref(self.beta), d.data_ptr(), self.D, d.data_ptr(), self.D,
                              ctypes.byref(self.res[0].algo), ws.data_ptr(), WS, stream), "matmul")


def timeit(fn, iters=10):
    s = torch.cuda.current_stream()
    for _ in range(3):
        fn()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(iters):
        fn()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) / iters


wait32 = getattr(cu, "cuStreamWaitValue32_v2", None) or cu.cuStreamWaitValue32
wait32.argtypes = [vp, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
write32 = getattr(cu, "cuStreamWriteValue32_v2", None) or cu.cuStreamWriteValue32
write32.argtypes = [vp, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]


def counted(kind, rc, cc, M, N, K, **counters):
    """The GEMM with `counters` over chunks of D's rows (`rc`) or columns (`cc`), or None
    (printed) where cuBLASLt refuses it."""
    try:
        return Gemm(M, N, K, rows_chunks=rc, cols_chunks=cc, **counters)
    except RuntimeError as e:
        print(f"{kind}: refused: {e}")
        return None


def main():
    M, N, K = int(os.environ.get("M", 8192)), int(os.environ.get("N", 8192)), int(os.environ.get("K", 8192))
    CH = int(os.environ.get("CH", 4))
    torch.manual_seed(0)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16) / 16
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / 16
    d0 = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    sid = torch.cuda.current_stream().cuda_stream
    g0 = Gemm(M, N, K)
    print("plain: heuristic count", g0.count, "atomic caps", g0.caps()[:8])
    t_plain = timeit(lambda: g0.run(x, w, d0, sid))
    t_torch = timeit(lambda: torch.nn.functional.linear(x, w))
    ref = torch.nn.functional.linear(x, w)
    print(f"plain {t_plain:.3f} ms torch {t_torch:.3f} ms maxdiff {(d0.float()-ref.float()).abs().max().item():.3g}")
    for kind, rc, cc in (("cols", 0, CH), ("rows", CH, 0)):
        outc = torch.ones(CH, dtype=torch.int32, device="cuda")
        g = counted(f"out-{kind}", rc, cc, M, N, K, outc=outc)
        if g is None:
            continue
        print(f"{kind}: heuristic count {g.count} caps {g.caps()[:8]}")
        d = torch.zeros(M, N, device="cuda", dtype=torch.bfloat16)
        def run_one():
            outc.fill_(1)
            g.run(x, w, d, torch.cuda.current_stream().cuda_stream)
        try:
            run_one(); torch.cuda.synchronize()
        except Exception as e:
            print(f"{kind}: run failed: {e}")
            continue
        print(f"{kind}: counters after {outc.tolist()} maxdiff {(d.float()-ref.float()).abs().max().item():.3g}")
        t = timeit(run_one)
        print(f"{kind}: time {t:.3f} ms (plain {t_plain:.3f})")
        # When does each chunk's counter drop? A stream per chunk waits for it (no SM).
        gs = torch.cuda.Stream()
        ws_ = [torch.cuda.Stream() for _ in range(CH)]
        for rep in range(3):
            outc.fill_(1)
            ready = torch.cuda.Event()
            ready.record()
            e0 = torch.cuda.Event(enable_timing=True); e1 = torch.cuda.Event(enable_timing=True)
            es = [torch.cuda.Event(enable_timing=True) for _ in range(CH)]
            for i, s in enumerate(ws_):
                s.wait_event(ready)
                r = wait32(ctypes.c_void_p(s.cuda_stream), outc.data_ptr() + 4 * i, 0, 1)
                assert r == 0, r
                es[i].record(s)
            gs.wait_event(ready)
            e0.record(gs)
            g.run(x, w, d, gs.cuda_stream)
            e1.record(gs)
            torch.cuda.synchronize()
            print(f"{kind} rep {rep}: gemm {e0.elapsed_time(e1):.3f} ms; chunk counters at", [round(e0.elapsed_time(e), 3) for e in es])
    # Input counters: chunk i of the output may start only when in[i] == 0.
    for kind, rc, cc in (("cols", 0, CH), ("rows", CH, 0)):
        inc = torch.zeros(CH, dtype=torch.int32, device="cuda")
        g = counted(f"in-{kind}", rc, cc, M, N, K, inc=inc)
        if g is None:
            continue
        d = torch.zeros(M, N, device="cuda", dtype=torch.bfloat16)
        try:
            g.run(x, w, d, sid); torch.cuda.synchronize()
        except Exception as e:
            print(f"in-{kind}: run failed {e}"); continue
        print(f"in-{kind}: zeros in: maxdiff {(d.float()-ref.float()).abs().max().item():.3g}, time {timeit(lambda: g.run(x, w, d, sid)):.3f}")
        # Released one chunk at a time by a copy-engine stream: a 256 MiB host->device copy before each release.
        host = torch.empty(256 << 20, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        rel = torch.cuda.Stream(); gs = torch.cuda.Stream()
        inc.fill_(1); d.zero_()
        ready = torch.cuda.Event(); ready.record()
        rel.wait_event(ready); gs.wait_event(ready)
        e0 = torch.cuda.Event(enable_timing=True); e1 = torch.cuda.Event(enable_timing=True)
        er = [torch.cuda.Event(enable_timing=True) for _ in range(CH)]
        e0.record(gs)
        g.run(x, w, d, gs.cuda_stream)
        e1.record(gs)
        for i in range(CH):
            with torch.cuda.stream(rel):
                dev.copy_(host, non_blocking=True)
            r = write32(ctypes.c_void_p(rel.cuda_stream), inc.data_ptr() + 4 * i, 0, 0)
            assert r == 0, r
            er[i].record(rel)
        t0 = time.time()
        while not e1.query():
            if time.time() - t0 > 20:
                print(f"in-{kind}: GEMM not done after 20 s"); os._exit(3)
            time.sleep(0.001)
        torch.cuda.synchronize()
        print(f"in-{kind}: gemm end {e0.elapsed_time(e1):.3f} ms, releases at", [round(e0.elapsed_time(e), 3) for e in er],
              f"maxdiff {(d.float()-ref.float()).abs().max().item():.3g}")


main()
