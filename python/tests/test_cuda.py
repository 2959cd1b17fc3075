"""The GPU path of the Python package: programs run on PyTorch CUDA tensors through
Executable.cuda(), compared with PyTorch computing the same thing. Skipped without PyTorch or
a GPU it can see (CI has neither); run on a GPU machine with the extension built there or
carried in (scripts/gpu/python_gpu.sh)."""

import json
import os
from typing import Any, Callable, Dict

import pytest

import streamweave as sw

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - depends on the machine
    pytest.skip("no GPU visible to PyTorch", allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
SCENARIOS = os.path.join(HERE, "..", "..", "tests", "scenarios")

KERNELS = os.path.join(SCENARIOS, "kernels")

# (fixture of tests/scenarios/kernels, PyTorch's computation in f32); every output checked
# against PyTorch within its dtype's tolerance.
CASES = [
    ("add", lambda x: x["a"] + x["b"]),
    ("silu", lambda x: x["x"] * torch.sigmoid(x["x"])),
    ("softmax", lambda x: torch.softmax(x["x"], -1)),
    ("row_sum", lambda x: x["x"].sum(-1)),
    (
        "layernorm",
        lambda x: torch.nn.functional.layer_norm(
            x["x"], x["x"].shape[-1:], x["weight"], x["bias"], eps=1e-5
        ),
    ),
]


def compile_case(name: str, t: int, h: int, s: int) -> sw.Executable:
    return sw.load(os.path.join(KERNELS, name + ".weave"), t=t, h=h, s=s).compile()


def inputs_for(exe: sw.Executable, seed: int) -> Dict[str, Any]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    out: Dict[str, Any] = {}
    for spec in exe.inputs:
        dtype = getattr(torch, sw._TORCH_DTYPES[spec.dtype])
        if spec.name == "n":  # the layer norm's element count and epsilon
            v = torch.tensor(float(exe.inputs[0].shape[-1]), device="cuda")
        elif spec.name == "eps":
            v = torch.tensor(1e-5, device="cuda")
        else:
            v = torch.rand(spec.shape, device="cuda", generator=gen, dtype=torch.float32) * 2 - 1
        out[spec.name] = v.to(dtype)
    return out


def close(got: Any, want: Any, dtype: Any) -> bool:
    tol = 2e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-4
    scale = max(want.abs().max().item(), 1.0)
    return bool((got.float() - want.float()).abs().max().item() <= tol * scale)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("t,h,s", [(64, 256, 1), (300, 1000, 4), (37, 136, 3)])
def test_kernels_match_pytorch_on_its_stream_without_copies(
    case: "tuple[str, Callable[[Dict[str, Any]], Any]]", t: int, h: int, s: int
) -> None:
    name, fn = case
    exe = compile_case(name, t, h, s)
    gpu = exe.cuda()
    assert gpu.ranks == [(0, 0)] and gpu.world == 1
    x = inputs_for(exe, 5)
    before = {k: v.clone() for k, v in x.items()}
    spec = exe.outputs[0]
    out = torch.empty(spec.shape, dtype=getattr(torch, sw._TORCH_DTYPES[spec.dtype]), device="cuda")
    torch_bytes = torch.cuda.memory_allocated()
    r = gpu(x, out={"out": out}, check=True)
    # No copy on the way in (PyTorch allocated nothing for the call) or out (the result is
    # the tensor given, written in place).
    assert torch.cuda.memory_allocated() == torch_bytes
    assert r.outputs["out"].data_ptr() == out.data_ptr()
    want = fn({k: v.float() for k, v in x.items()})
    assert close(r.outputs["out"], want, out.dtype), (r.outputs["out"], want)
    assert r.passed is True, r.max_abs_error
    assert all(torch.equal(before[k], x[k]) for k in x)
    assert len(r.issue_us) == 1 and r.issue_us[0] > 0
    # Allocated by the runner: a fresh tensor each call, the same numbers.
    again = gpu(x).outputs["out"]
    assert again.data_ptr() != out.data_ptr()
    assert torch.equal(again, r.outputs["out"])


def test_a_run_is_ordered_on_pytorchs_current_stream() -> None:
    # Inputs produced, the program run, and its output consumed on a side stream, with no
    # synchronization in between: correct only if the run waits for the producer and the
    # consumer waits for the run.
    t, h = 2048, 2048
    exe = compile_case("add", t, h, 4)
    gpu = exe.cuda()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        a = torch.ones(t, h, device="cuda", dtype=torch.bfloat16)
        for _ in range(20):  # long enough that an unordered run would read stale zeros
            a = a * 1.0 + 0.0
        b = torch.full((t, h), 2.0, device="cuda", dtype=torch.bfloat16)
        y = gpu({"a": a, "b": b}).outputs["out"]
        z = y * 2
    side.synchronize()
    assert torch.all(z == 6.0)


def test_a_matmul_program_matches_pytorch() -> None:
    path = os.path.join(SCENARIOS, "row_parallel_linear.weave")
    exe = sw.load(path, t=256, h=64, d=1, s=4).compile()
    gpu = exe.cuda()
    x = inputs_for(exe, 9)
    r = gpu(x, check=True)
    assert r.passed is True, r.max_abs_error
    got = r.outputs["out"]
    want = torch.nn.functional.linear(x["inp"].float(), x["w"].float())
    assert got.shape == want.shape
    assert close(got, want, got.dtype)


def test_the_second_call_tunes_once_and_says_which_configuration_runs(
    tmp_path: Any, capfd: Any
) -> None:
    path = os.path.join(SCENARIOS, "row_parallel_linear.weave")
    exe = sw.load(path, t=256, h=64, d=1, s=4).compile()
    cache = str(tmp_path / "tune.toml")
    gpu = exe.cuda(tune_secs=20, tune_cache=cache)
    x = inputs_for(exe, 3)
    want = torch.nn.functional.linear(x["inp"].float(), x["w"].float())
    r = gpu(x, check=True)
    assert r.passed is True and gpu.config is None
    for _ in range(2):
        r = gpu(x, check=True)
        assert r.passed is True, r.max_abs_error
        assert close(r.outputs["out"], want, r.outputs["out"].dtype)
    config = gpu.config
    assert config is not None and config.endswith("(tuned now)"), config
    assert "eager" in config and "replay" not in config and "copy-engine" not in config, config
    err = capfd.readouterr().err
    assert err.count("streamweave: the calls run " + config) == 1, err
    # The winner is cached under the session's key: a new runner takes it.
    again = exe.cuda(tune_secs=20, tune_cache=cache)
    again(x)
    assert again(x, check=True).passed is True
    assert again.config == config.replace("(tuned now)", "(the tuning cache)")
    # tune_secs=0 never tunes.
    off = exe.cuda(tune_secs=0)
    off(x)
    assert off(x, check=True).passed is True and off.config is None


def test_trace_and_races_are_reported() -> None:
    exe = compile_case("softmax", 64, 256, 4)
    gpu = exe.cuda(races=True, trace=True)
    r = gpu(inputs_for(exe, 1))
    assert r.races == 0 and r.trace is not None
    events = json.loads(r.trace)
    events = events["traceEvents"] if isinstance(events, dict) else events
    assert any(e.get("ph") == "X" for e in events), events[:5]


def test_bad_tensors_raise_with_the_input_and_rank() -> None:
    exe = compile_case("add", 8, 16, 1)
    gpu = exe.cuda()
    good = inputs_for(exe, 3)
    bad = "input `a` on rank 0: "
    cases = [
        ({**good, "a": good["a"].float()}, bad + "the tensor is torch.float32, the program takes bf16"),
        ({**good, "a": good["a"].cpu()}, bad + "the tensor is on cpu, the rank runs on cuda:0"),
        ({**good, "a": good["a"][:4]}, bad + "the tensor has shape (4, 16), the rank's shard is (8, 16)"),
        ({**good, "a": good["a"].t().contiguous().t()}, bad + "the tensor is not contiguous"),
        ({"a": good["a"]}, "input `b`: not given"),
        ({**good, "c": good["a"]}, "input `c`: the program has no such input (it takes a, b)"),
    ]
    for given, message in cases:
        with pytest.raises(sw.StreamweaveError) as e:
            gpu(given)
        assert message in str(e.value), str(e.value)
    with pytest.raises(sw.StreamweaveError, match="each rank needs its own GPU"):
        compile_case("add", 8, 16, 1).cuda([0, 0])


class DLPackOnly:
    """A CUDA tensor of another library: it only exports DLPack."""

    def __init__(self, tensor: Any) -> None:
        self._t = tensor

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._t.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> Any:
        return self._t.__dlpack_device__()


def test_dlpack_tensors_are_taken_without_a_copy() -> None:
    exe = compile_case("add", 64, 256, 2)
    gpu = exe.cuda()
    x = inputs_for(exe, 4)
    out = torch.empty_like(x["a"])
    r = gpu({k: DLPackOnly(v) for k, v in x.items()}, out={"out": DLPackOnly(out)}, check=True)
    assert r.passed is True, r.max_abs_error
    assert close(out, x["a"].float() + x["b"].float(), out.dtype)
