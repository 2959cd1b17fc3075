"""The Python package on the CPU backend: every scenario runs from Python against the f64
reference, a handful against NumPy computations written here, and bad input raises
`StreamweaveError` with the place in its message."""

import json
import re
from pathlib import Path
from typing import Any, Dict

import numpy as np
import numpy.typing as npt
import pytest

import streamweave as sw

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((ROOT / "tests" / "scenarios").glob("*.weave"))
KERNELS = ROOT / "tests" / "scenarios" / "kernels"


def bf16(x: Any) -> npt.NDArray[np.float64]:
    """`x` rounded to bf16 (nearest even), as float64: what a bf16 input holds."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32).astype(np.float64)


def small(path: Path) -> Dict[str, int]:
    """Parameter overrides that keep a benchmark-sized scenario small (as the Rust sweep
    does): the patterns declared at t = h = 8192 run at t = 16, h = 4 (chunks of 4 rows,
    which split over 2 devices)."""
    header = next(l for l in path.read_text().splitlines() if l.startswith("fusion"))
    return {"t": 16, "h": 4} if "8192" in header else {}


def random_inputs(exe: sw.Executable, seed: int = 0) -> Dict[str, Any]:
    rng = np.random.default_rng(seed)
    out: Dict[str, Any] = {}
    for t in exe.inputs:
        if t.dtype == "bool":
            out[t.name] = rng.random(t.shape) < 0.5
        elif t.dtype == "i64":
            # The scenarios' i64 inputs are ids into tables of at least 5 rows
            # (vocab_parallel_embedding's `ids`, 24 rows): drawn inside them.
            out[t.name] = rng.integers(0, 5, size=t.shape)
        else:
            # Each input in its own dtype (bf16: a float32 array, rounded on the way in).
            dtype = {"f64": np.float64, "f16": np.float16}.get(t.dtype, np.float32)
            out[t.name] = rng.uniform(-1, 1, size=t.shape).astype(dtype)
    return out


def test_an_id_outside_its_table_is_a_run_error_naming_it() -> None:
    path = next(p for p in SCENARIOS if p.stem == "vocab_parallel_embedding")
    exe = sw.load(path).compile()
    inputs = random_inputs(exe)
    inputs["ids"] = inputs["ids"].copy()
    inputs["ids"][3] = -2
    with pytest.raises(sw.RunError, match=r"id -2 at position 3 of `ids` is outside the 24 rows"):
        exe.run(inputs, check=True)


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_every_scenario_runs_from_python_against_the_reference(path: Path) -> None:
    exe = sw.load(path, **small(path)).compile()
    result = exe.run(random_inputs(exe), check=True, races=True)
    assert result.passed, f"{path.name}: max error {result.max_abs_error}"
    assert result.races == 0
    for spec in exe.outputs:
        value = result.outputs[spec.name]
        assert value.shape == spec.shape


def test_add_per_stream_doubles_its_input() -> None:
    exe = sw.load(ROOT / "tests/scenarios/add_per_stream.weave", x=7, y=9, s=3).compile()
    x = np.random.default_rng(1).random((7, 9)).astype(np.float32)
    out = exe.run({"inp": x}).outputs["out"]
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, 2 * x)


def test_reduction_sums_the_innermost_axis() -> None:
    exe = sw.load(ROOT / "tests/scenarios/reduction.weave", x=10, s=3).compile()
    x = np.random.default_rng(2).random((10, 8, 2)).astype(np.float32)
    out = exe.run({"tv0": x}).outputs["tv1"]
    np.testing.assert_allclose(out, x.astype(np.float64).sum(axis=2), rtol=1e-6)


@pytest.mark.parametrize("ranks,chunks", [(1, 1), (2, 2), (2, 3), (4, 4)])
def test_the_row_parallel_layer_is_a_matmul_on_any_ranks_and_chunks(ranks: int, chunks: int) -> None:
    t, h = 12, 4
    exe = sw.load(
        ROOT / "tests/scenarios/row_parallel_linear.weave", t=t, h=h, d=ranks, s=chunks
    ).compile()
    assert exe.min_ranks == ranks
    rng = np.random.default_rng(3)
    inp = rng.uniform(-1, 1, (t, 4 * h)).astype(np.float32)
    w = rng.uniform(-1, 1, (h, 4 * h)).astype(np.float32)
    out = exe.run({"inp": inp, "w": w}, ranks=ranks).outputs["out"]
    want = bf16(bf16(inp) @ bf16(w).T)
    # bf16 partial sums per rank, then an allreduce: within a few bf16 ulps of |want|.
    np.testing.assert_allclose(out, want, atol=0.05, rtol=0.02)


def test_column_parallel_linear_gathers_then_multiplies() -> None:
    exe = sw.load(ROOT / "tests/scenarios/column_parallel_linear.weave", t=6, h=3).compile()
    rng = np.random.default_rng(4)
    inp = rng.uniform(-1, 1, (6, 3)).astype(np.float32)
    w = rng.uniform(-1, 1, (12, 3)).astype(np.float32)
    out = exe.run({"inp": inp, "w": w}, ranks=2).outputs["out"]
    np.testing.assert_allclose(out, bf16(bf16(inp) @ bf16(w).T), atol=0.02, rtol=0.02)


def test_softmax_matches_numpy_whole_and_in_uneven_chunks() -> None:
    for s in (1, 3):
        exe = sw.load(KERNELS / "softmax.weave", t=10, h=24, s=s).compile()
        x = np.random.default_rng(5).normal(size=(10, 24)).astype(np.float32)
        out = exe.run({"x": x}).outputs["out"]
        xb = bf16(x)
        e = np.exp(xb - xb.max(axis=1, keepdims=True))
        np.testing.assert_allclose(out, bf16(e / e.sum(axis=1, keepdims=True)), atol=4e-3)


def test_bf16_inputs_round_to_nearest_even_and_outputs_are_bf16() -> None:
    exe = sw.loads(
        "fusion f(n = 4) {\n  tensor x: bf16[n]\n  y = set(x)\n  output y\n}\n"
    ).compile()
    x = np.array([1.0, 1 + 2**-9, 1 + 3 * 2**-9, -2.5], dtype=np.float64)
    y = exe.run({"x": x}).outputs["y"]
    assert y.dtype == (sw.BFLOAT16 if sw.BFLOAT16 is not None else np.float32)
    np.testing.assert_array_equal(y.astype(np.float64), [1.0, 1.0, 1 + 2**-7, -2.5])


def test_the_fusion_and_the_host_program_print_and_the_pipeline_dumps() -> None:
    fusion = sw.load(ROOT / "tests/scenarios/row_parallel_linear.weave", t=8, h=4)
    assert str(fusion).startswith("fusion row_parallel_linear(")
    exe = fusion.compile()
    text = str(exe)
    assert "HostIrContainer" in text and "Signature:" in text and "Definition:" in text
    assert [t.name for t in exe.inputs] == ["inp", "w"]
    dump = fusion.dump("default", print_after=["segment"])
    assert "IR Dump After segment" in dump and "%HostIrContainer" in dump
    assert "propagate-shardings" not in fusion.dump(None)


def test_the_trace_is_chrome_json_and_races_are_counted(tmp_path: Path) -> None:
    exe = sw.load(ROOT / "tests/scenarios/row_parallel_linear.weave", t=8, h=4).compile()
    path = tmp_path / "run.json"
    result = exe.run(random_inputs(exe), ranks=2, races=True, trace=path)
    assert result.races == 0
    events = json.loads(path.read_text())
    assert any(e.get("ph") == "X" for e in events)
    assert result.trace == path.read_text()


def test_a_fusion_that_does_not_parse_raises_with_its_position() -> None:
    with pytest.raises(sw.StreamweaveError) as err:
        sw.loads("fusion f(n = 4) {\n  tensor x: f32[n]\n  y = frobnicate(x)\n}\n", file="bad.weave")
    assert re.search(r"bad\.weave:3:\d+", str(err.value)), str(err.value)


def test_inputs_that_do_not_fit_raise_naming_the_tensor() -> None:
    exe = sw.load(ROOT / "tests/scenarios/add_per_stream.weave", x=5, y=6, s=3).compile()
    with pytest.raises(sw.StreamweaveError, match="`inp`"):
        exe.run({"inp": np.zeros((5, 7), dtype=np.float32)})
    with pytest.raises(sw.StreamweaveError, match="no such input"):
        exe.run({"x": np.zeros((5, 6), dtype=np.float32)})
    with pytest.raises(sw.StreamweaveError, match="`inp`"):
        exe.run({})
    with pytest.raises(sw.StreamweaveError, match="timeout_secs"):
        exe.run({"inp": np.zeros((5, 6), dtype=np.float32)}, timeout_secs=-1)


def test_too_few_ranks_raise_naming_the_devices() -> None:
    exe = sw.load(ROOT / "tests/scenarios/row_parallel_linear.weave", t=8, h=4).compile()
    with pytest.raises(sw.StreamweaveError, match="rank"):
        exe.run(random_inputs(exe), ranks=1)


def test_a_0_d_input_is_given_as_a_scalar_or_a_0_d_array() -> None:
    exe = sw.loads(
        "fusion scale(t = 3) {\n tensor x: f32[t]\n tensor a: f32[]\n"
        " a_b = broadcast(a, [0])\n y = mul(x, a_b)\n output y\n}\n"
    ).compile()
    assert [t.shape for t in exe.inputs] == [(3,), ()]
    x = np.array([1.0, -2.0, 0.5], dtype=np.float32)
    for a in (2.5, np.float32(2.5), np.array(2.5, dtype=np.float32)):
        r = exe.run({"x": x, "a": a}, check=True)
        assert r.passed
        np.testing.assert_array_equal(r.outputs["y"], x * 2.5)
    with pytest.raises(sw.StreamweaveError, match="input `a`: has shape \\[1\\] but the program takes \\[\\]"):
        exe.run({"x": x, "a": np.array([2.5], dtype=np.float32)})


def test_the_builder_writes_the_row_parallel_layer_that_runs_against_numpy() -> None:
    b = sw.Builder("row_parallel", roles={"d": "mesh", "s": "chunks"}, t=8, h=4, d=2, s=2)
    m = b.mesh("m", "d")
    x = b.tensor("inp", "f32", ["t", "4 * h"], on=m)
    w = b.tensor("w", "f32", ["h", "4 * h"], on=m)
    y = b.linear(x, w, name="out")
    z = b.relu(y)
    b.output(y, z)
    b.schedule(x, "outer_split(0, s) -> Stream", "outer_split(2, d) -> DIDx")
    b.schedule(w, "outer_split(1, d) -> DIDx")
    text = b.text()
    assert "out = linear(inp, w)" in text and "t0 = relu(out)" in text
    assert text.startswith("fusion row_parallel(t = 8, h = 4, d: mesh = 2, s: chunks = 2) {")
    exe = b.build().compile()
    rng = np.random.default_rng(3)
    xv = rng.uniform(-1, 1, (8, 16)).astype(np.float32)
    wv = rng.uniform(-1, 1, (4, 16)).astype(np.float32)
    r = exe.run({"inp": xv, "w": wv}, ranks=2, check=True, races=True)
    assert r.passed and r.races == 0
    np.testing.assert_allclose(r.outputs["out"], xv @ wv.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(r.outputs["t0"], np.maximum(xv @ wv.T, 0), rtol=1e-5, atol=1e-5)
    # Overrides at build time, as for a file.
    assert b.build(t=12).compile().inputs[0].shape == (12, 16)


def test_builder_mistakes_are_reported_with_their_place_or_at_once() -> None:
    b = sw.Builder("bad", t=4)
    x = b.tensor("x", "f32", ["t"])
    with pytest.raises(AttributeError, match="no op or method `frobnicate`"):
        b.frobnicate(x, name="y")  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="`x` is already a name of this fusion"):
        b.tensor("x", "f32", ["t"])
    other = sw.Builder("other")
    with pytest.raises(ValueError, match="belongs to another builder"):
        other.exp(x)
    with pytest.raises(TypeError, match="a size or axis is an int or an expression string"):
        b.tensor("z", "f32", [1.5])  # type: ignore[list-item]
