"""Copy-engine transfers between two GPUs, alone and beside a GEMM (a probe, PyTorch).

Prints, for 8, 16, 32 and 64 MiB: a push from GPU 0 to GPU 1 as one copy and cut over 2 and 4
streams (more copy engines), and a copy within GPU 0; then the 4096 x 4096 x 8192 bf16 GEMM
alone and with a 64 MiB push out of its GPU and one into it running beside it. Medians of 20
CUDA-event timings on GPU 0's current stream. Run on a machine of two or more GPUs:
`python3 scripts/ce_beside_gemm.py` (docs/benchmarks.md, 2026-11-28 twentieth).
"""
import torch

MIB = 2**20


def median_us(fn, d0, d1, iters=20):
    """The median time of `fn` in µs, by events on GPU 0's current stream, after 3 warm-ups."""
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        fn()
    torch.cuda.synchronize(d0)
    torch.cuda.synchronize(d1)
    times = []
    for _ in range(iters):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    times.sort()
    return times[len(times) // 2]


def bf16(n, device):
    return torch.randn(n, device=device).to(torch.bfloat16)


def main():
    if torch.cuda.device_count() < 2:
        raise SystemExit("ce_beside_gemm.py: needs two GPUs")
    d0, d1 = torch.device("cuda:0"), torch.device("cuda:1")
    torch.cuda.set_device(0)
    streams = [torch.cuda.Stream(device=d0) for _ in range(4)]
    for mib in (8, 16, 32, 64):
        n = mib * MIB // 2
        src = bf16(n, d0)
        dst = torch.empty(n, device=d1, dtype=torch.bfloat16)
        local = torch.empty(n, device=d0, dtype=torch.bfloat16)
        row = [f"{mib} MiB:"]
        for parts in (1, 2, 4):

            def push(parts=parts, n=n, src=src, dst=dst):
                current = torch.cuda.current_stream(d0)
                step = n // parts
                for p in range(parts):
                    streams[p].wait_stream(current)
                    with torch.cuda.stream(streams[p]):
                        part = slice(p * step, (p + 1) * step)
                        dst[part].copy_(src[part], non_blocking=True)
                for p in range(parts):
                    current.wait_stream(streams[p])

            us = median_us(push, d0, d1)
            row.append(f"peer x{parts} {us:.1f} us ({mib * MIB / us / 1e3:.0f} GB/s)")
        us = median_us(lambda: local.copy_(src), d0, d1)
        row.append(f"local {us:.1f} us")
        print(" | ".join(row), flush=True)
    a = bf16(4096 * 4096, d0).view(4096, 4096)
    b = bf16(8192 * 4096, d0).view(8192, 4096)
    alone = median_us(lambda: torch.nn.functional.linear(a, b), d0, d1)
    n = 64 * MIB // 2
    out_src, out_dst = bf16(n, d0), torch.empty(n, device=d1, dtype=torch.bfloat16)
    in_src, in_dst = bf16(n, d1), torch.empty(n, device=d0, dtype=torch.bfloat16)
    push_out, push_in = torch.cuda.Stream(device=d0), torch.cuda.Stream(device=d1)

    def beside():
        current = torch.cuda.current_stream(d0)
        push_out.wait_stream(current)
        with torch.cuda.stream(push_out):
            out_dst.copy_(out_src, non_blocking=True)
        with torch.cuda.stream(push_in):
            in_dst.copy_(in_src, non_blocking=True)
        torch.nn.functional.linear(a, b)
        current.wait_stream(push_out)

    both = median_us(beside, d0, d1)
    print(
        f"GEMM 4096x4096x8192 alone {alone:.1f} us; with 64 MiB pushed out and 64 MiB "
        f"pushed in beside it {both:.1f} us"
    )


if __name__ == "__main__":
    main()
