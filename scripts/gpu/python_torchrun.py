"""One rank of a launched world (torchrun): opens the program with launched=True on GPU
LOCAL_RANK, passes this rank's shards, checks against the reference on rank 0, and prints
one line. Run as `torchrun --nproc-per-node N scripts/gpu/python_torchrun.py FIXTURE [k=v ...]`.
"""

import os
import sys

import torch

import streamweave as sw


def main():
    path, params = sys.argv[1], dict(kv.split("=") for kv in sys.argv[2:])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    exe = sw.load(path, **{k: int(v) for k, v in params.items()}).compile()
    gpu = exe.cuda(launched=True)
    assert gpu.ranks == [(rank, local)] and gpu.world == world, (gpu.ranks, gpu.world)
    shapes_in, _ = exe._native.local_shapes(rank)
    gen = torch.Generator(device="cuda").manual_seed(17 + rank)
    x = {
        spec.name: (torch.rand(shape, device="cuda", generator=gen) * 2 - 1).to(
            getattr(torch, sw._TORCH_DTYPES[spec.dtype])
        )
        for spec, shape in zip(exe.inputs, shapes_in)
    }
    r = gpu(x, check=True)
    torch.cuda.synchronize()
    print(
        "rank %d of %d on cuda:%d: passed %s, max error %s, outputs %s"
        % (rank, world, local, r.passed, r.max_abs_error, {k: tuple(v.shape) for k, v in r.outputs.items()}),
        flush=True,
    )
    return 0 if (rank != 0 or r.passed) else 1


if __name__ == "__main__":
    sys.exit(main())
