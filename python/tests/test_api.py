"""The Python API as a user meets it: the builder's ops are methods with signatures and
docstrings made from the Rust op table, dtypes are taken as NumPy/PyTorch dtypes or names,
mistakes are reported at the user's line, the exceptions are the built-in kinds too, the
defaults are Rust's, the version is the package's, results print briefly, a trace file gets
its SVG timeline beside it, and the example programs ship with the package."""

import ast
import importlib.metadata
import inspect
import json
import re
from pathlib import Path
from typing import Any, Dict, List, Union

import numpy as np
import pytest

import streamweave as sw
from streamweave import _native
from streamweave import builder as builder_module

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve()


def parser_op_names() -> List[str]:
    """Every op the Rust parser knows, read from its "unknown op" message (which lists them
    all), so that an op added to the parser in any way shows up here."""
    with pytest.raises(sw.FusionError) as e:
        sw.loads("fusion f(n = 1) {\n  tensor x: f32[n]\n  y = zzz_no_such_op(x)\n}\n")
    m = re.search(r"expected one of: ([^)]*)\)", str(e.value))
    assert m, str(e.value)
    return [op.strip() for op in m.group(1).split(",")]


def test_every_op_of_the_parser_is_a_documented_builder_method() -> None:
    names = parser_op_names()
    assert {"add", "linear", "sum", "cast", "where", "and"} <= set(names)
    assert [op for op, _ in sw.builder.ops()] == names
    b = sw.Builder("f")
    for op in names:
        method = builder_module.python_name(op)
        assert method in dir(b), method
        fn = getattr(sw.Builder, method)
        assert inspect.isfunction(fn), method
        assert fn.__doc__ and ("%s(" % op) in fn.__doc__, method
        assert "name" in inspect.signature(fn).parameters


def test_every_op_has_its_line_for_the_type_checker() -> None:
    # The class body declares each op method's type (one line each): an op the Rust table
    # gains without that line fails here, naming it.
    tree = ast.parse(Path(builder_module.__file__).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Builder")
    declared = {
        n.target.id
        for n in cls.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }
    missing = [builder_module.python_name(op) for op in parser_op_names()]
    missing = [m for m in missing if m not in declared]
    assert not missing, "add `%s: <Kind>Op` to Builder" % missing


def test_op_methods_have_real_signatures() -> None:
    sig = inspect.signature(sw.Builder.linear)
    assert list(sig.parameters) == ["self", "x", "w", "bias", "name"]
    assert sig.parameters["bias"].default is None
    assert sig.parameters["name"].kind is inspect.Parameter.KEYWORD_ONLY
    assert list(inspect.signature(sw.Builder.sum).parameters) == ["self", "a", "axes", "name"]
    assert list(inspect.signature(sw.Builder.cast).parameters) == ["self", "a", "dtype", "name"]
    b = sw.Builder("f", n=4)
    x = b.tensor("x", "f32", ["n"])
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'b'"):
        b.add(x)  # type: ignore[call-arg]


def test_keyword_ops_are_methods_with_a_trailing_underscore() -> None:
    b = sw.Builder("logic", n=3)
    p = b.tensor("p", "bool", ["n"])
    q = b.tensor("q", "bool", ["n"])
    b.output(b.and_(p, q, name="both"), b.or_(p, q, name="either"), b.not_(p, name="neither"))
    assert "both = and(p, q)" in b.text() and "neither = not(p)" in b.text()
    exe = b.build().compile()
    pv, qv = np.array([True, True, False]), np.array([True, False, False])
    r = exe.run({"p": pv, "q": qv}, check=True)
    assert r.passed
    assert r.outputs["both"].tolist() == [True, False, False]
    assert r.outputs["either"].tolist() == [True, True, False]
    assert r.outputs["neither"].tolist() == [False, False, True]


def test_a_misspelt_op_fails_at_the_attribute_naming_the_nearest() -> None:
    b = sw.Builder("f")
    with pytest.raises(AttributeError, match=r"no op or method `lienar` \(did you mean linear\?\)"):
        b.lienar  # type: ignore[attr-defined]
    assert not hasattr(b, "frobnicate")
    with pytest.raises(ValueError, match=r"unknown op `ad` \(did you mean .*add"):
        b.op("ad")


@pytest.mark.parametrize(
    "dtype, name",
    [
        ("f32", "f32"),
        ("float32", "f32"),
        (np.float32, "f32"),
        (np.dtype("float64"), "f64"),
        (np.int64, "i64"),
        (np.bool_, "bool"),
        (bool, "bool"),
        ("float16", "f16"),
        ("bfloat16", "bf16"),
        ("bf16", "bf16"),
    ],
)
def test_dtypes_are_taken_as_numpy_dtypes_or_names(dtype: Any, name: str) -> None:
    b = sw.Builder("f", n=2)
    x = b.tensor("x", dtype, ["n"])
    y = b.cast(x, dtype)
    assert "tensor x: %s[n]" % name in b.text() and "cast(x, %s)" % name in b.text()
    assert y.name == "t0"


def test_a_pytorch_dtype_is_taken_by_its_name() -> None:
    class FakeTorchDtype:  # what `torch.bfloat16` prints as, without importing torch
        __module__ = "torch"

        def __str__(self) -> str:
            return "torch.bfloat16"

    assert sw.builder.dtype_name(FakeTorchDtype()) == "bf16"


def test_ml_dtypes_bfloat16_is_bf16() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert sw.builder.dtype_name(ml_dtypes.bfloat16) == "bf16"


def test_a_bad_dtype_is_refused_at_the_call_with_the_users_line() -> None:
    b = sw.Builder("f", n=2)
    line = inspect.currentframe().f_lineno + 2  # type: ignore[union-attr]
    with pytest.raises(sw.DTypeError) as e:
        b.tensor("x", np.complex64, ["n"])
    assert isinstance(e.value, TypeError)
    assert str(e.value).startswith("%s:%d: tensor(dtype=...): dtype complex64" % (HERE, line))
    x = b.tensor("x", "f32", ["n"])
    with pytest.raises(TypeError, match=r"cast\(dtype=...\): dtype <class 'str'>|dtype str"):
        b.cast(x, str)
    with pytest.raises(sw.ArgumentTypeError, match=r"sum\(axes=\['n'\]\): a list of ints"):
        b.sum(x, ["n"])  # type: ignore[list-item]
    with pytest.raises(sw.ArgumentTypeError, match=r"exp\(a=...\): a tensor of this builder"):
        b.exp("x")  # type: ignore[arg-type]


def test_a_mistake_found_at_build_names_the_users_line() -> None:
    b = sw.Builder("shapes", n=4, k=3)
    x = b.tensor("x", "f32", ["n"])
    w = b.tensor("w", "f32", ["k"])
    line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
    b.output(b.linear(x, w, name="y"))
    with pytest.raises(sw.FusionError) as e:
        b.build()
    message = str(e.value)
    assert message.startswith("%s:%d: " % (HERE, line)), message
    assert "<builder shapes>:4:" in message and "y = linear(x, w)" in message
    assert isinstance(e.value, ValueError)


def test_the_exceptions_subclass_the_built_in_kinds() -> None:
    kinds = {
        sw.DTypeError: TypeError,
        sw.ArgumentTypeError: TypeError,
        sw.ArgumentValueError: ValueError,
        sw.ShapeError: ValueError,
        sw.InputNameError: KeyError,
        sw.FusionError: ValueError,
        sw.FusionFileNotFoundError: FileNotFoundError,
        sw.RunError: RuntimeError,
    }
    for cls, builtin in kinds.items():
        assert issubclass(cls, sw.StreamweaveError) and issubclass(cls, builtin), cls
        assert cls.__module__ == "streamweave"


def test_a_missing_file_is_a_file_not_found_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.weave"
    with pytest.raises(FileNotFoundError) as e:
        sw.load(missing)
    assert isinstance(e.value, sw.StreamweaveError)
    assert str(missing) in str(e.value)
    import errno

    assert e.value.errno == errno.ENOENT


def test_text_that_does_not_load_is_a_value_error_with_its_place() -> None:
    with pytest.raises(ValueError) as e:
        sw.loads("fusion f(n = 4) {\n  tensor x: f33[n]\n}\n", file="bad.weave")
    assert isinstance(e.value, sw.FusionError)
    assert re.search(r"bad\.weave:2:\d+", str(e.value))


def test_too_few_ranks_is_a_value_error() -> None:
    exe = sw.examples.load("row_parallel_linear", t=8, h=4).compile()
    x = np.zeros((8, 16), dtype=np.float32)
    w = np.zeros((4, 16), dtype=np.float32)
    with pytest.raises(ValueError, match="rank"):
        exe.run({"inp": x, "w": w}, ranks=1)


def test_the_version_is_the_packages() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", sw.__version__)
    assert sw.__version__ == _native.__version__
    assert sw.__version__ == importlib.metadata.version("streamweave")


def test_the_defaults_are_rusts_and_the_signatures_show_them() -> None:
    rust = _native.run_defaults()
    assert rust == {
        "check": sw.DEFAULTS.check,
        "races": sw.DEFAULTS.races,
        "trace": sw.DEFAULTS.trace,
        "streams": sw.DEFAULTS.streams,
        "timeout_secs": sw.DEFAULTS.timeout_secs,
        "tune_secs": sw.DEFAULTS.tune_secs,
    }
    # RunOptions::default() today: no reference check, the race checker on, 30 s, and a GPU
    # session tunes its first repeated call within 60 s.
    assert (sw.DEFAULTS.check, sw.DEFAULTS.races, sw.DEFAULTS.timeout_secs) == (False, True, 30.0)
    assert sw.DEFAULTS.tune_secs == 60.0
    assert inspect.signature(sw.Executable.cuda).parameters["tune_secs"].default == 60.0
    for fn in (sw.Executable.run, sw.Executable.cuda):
        params = inspect.signature(fn).parameters
        assert params["races"].default == sw.DEFAULTS.races
        assert params["timeout_secs"].default == sw.DEFAULTS.timeout_secs
        assert params["streams"].default == sw.DEFAULTS.streams
    assert inspect.signature(sw.Executable.run).parameters["check"].default == sw.DEFAULTS.check


@pytest.mark.parametrize("secs", [-1.0, float("nan"), float("inf")])
def test_a_tuning_budget_that_is_not_seconds_is_refused_before_any_gpu_opens(secs: float) -> None:
    exe = sw.examples.load("add_per_stream").compile()
    with pytest.raises(sw.ArgumentValueError) as e:
        exe.cuda(tune_secs=secs)
    assert str(e.value) == (
        "tune_secs must be 0 (never) or a positive number of seconds, not %s"
        % ("-1" if secs == -1.0 else ("NaN" if secs != secs else "inf"))
    )


def test_an_unchecked_run_says_so_and_a_checked_one_compares() -> None:
    exe = sw.examples.load("add_per_stream").compile()
    x = np.ones((5, 6), dtype=np.float32)
    r = exe.run({"inp": x})
    assert not r.checked and r.passed and r.max_abs_error == 0
    assert "(unchecked)" in repr(r)
    r = exe.run({"inp": x}, check=True)
    assert r.checked and r.passed


def test_the_result_repr_shows_shapes_and_dtypes_not_values() -> None:
    exe = sw.examples.load("add_per_stream", x=50, y=60, s=3).compile()
    r = exe.run({"inp": np.ones((50, 60), dtype=np.float32)}, check=True, trace=True)
    text = repr(r)
    assert text.startswith("RunResult(outputs={'out': float32[50, 60]}, passed=True"), text
    assert "races=0" in text and "bytes of JSON" in text
    assert len(text) < 200, text


def test_compile_takes_a_chunk_count_or_the_ring_form() -> None:
    f = sw.examples.load("row_parallel_linear", t=8, h=4)
    rng = np.random.default_rng(1)
    inputs: Dict[str, Any] = {
        "inp": rng.random((8, 16)).astype(np.float32),
        "w": rng.random((4, 16)).astype(np.float32),
    }
    plain = f.compile(devices=2).run(inputs, ranks=2, check=True)
    assert plain.passed and plain.checked
    # The ring form, its steps in 2 pieces: the allreduce is gone from the program, the
    # values are the same.
    ring = f.compile(devices=2, chunks="ring:2")
    assert "Allreduce" in str(f.compile(devices=2))
    assert "Allreduce" not in str(ring)
    r = ring.run(inputs, ranks=2, check=True)
    assert r.passed and r.checked and r.max_abs_error < 0.1
    np.testing.assert_allclose(r.outputs["out"], plain.outputs["out"], rtol=0.05, atol=0.05)
    # A count sets the chunk-count parameter, as `weave run --chunks` does.
    assert f.compile(devices=2, chunks=1).run(inputs, ranks=2, check=True).passed
    bad_values: List[Union[int, str]] = ["ring:0", "ring:65", "rings", "0", 0, -1]
    for bad in bad_values:
        with pytest.raises(sw.ArgumentValueError, match="is neither a positive number, `ring` nor `ring:K`"):
            f.compile(devices=2, chunks=bad)
    # A fusion with no collective to make a ring of says so.
    with pytest.raises(sw.FusionError, match="has no ring form"):
        sw.examples.load("add_per_stream").compile(chunks="ring")


def test_a_trace_file_gets_its_svg_timeline_beside_it(tmp_path: Path) -> None:
    exe = sw.examples.load("row_parallel_linear", t=8, h=4).compile()
    rng = np.random.default_rng(0)
    inputs: Dict[str, Any] = {
        "inp": rng.random((8, 16)).astype(np.float32),
        "w": rng.random((4, 16)).astype(np.float32),
    }
    path = tmp_path / "run.json"
    r = exe.run(inputs, ranks=2, trace=path)
    events = json.loads(path.read_text())
    assert any(e.get("ph") == "X" for e in events)
    svg = tmp_path / "run.svg"
    assert svg.read_text().startswith("<svg") and svg.read_text() == r.svg
    assert r.trace == path.read_text()
    with pytest.raises(ValueError, match="written beside it with the extension .svg"):
        exe.run(inputs, ranks=2, trace=tmp_path / "run.svg")
    # trace=True returns both without writing anything.
    r = exe.run(inputs, ranks=2, trace=True)
    assert r.trace is not None and r.svg is not None and "<svg" in r.svg


def test_the_examples_ship_with_the_package_and_match_the_scenarios() -> None:
    names = sw.examples.names()
    assert {"row_parallel_linear", "column_parallel_linear", "softmax", "add_per_stream"} <= set(names)
    for name in names:
        path = sw.examples.path(name)
        assert path.is_file() and Path(sw.__file__).parent in path.parents
        assert sw.examples.text(name) == path.read_text()
        scenario = ROOT / "tests" / "scenarios" / (name + ".weave")
        if not scenario.exists():
            scenario = ROOT / "tests" / "scenarios" / "kernels" / (name + ".weave")
        # The same program as the repository's scenario (comments aside).
        assert str(sw.examples.load(name)) == str(sw.load(scenario)), name
    with pytest.raises(KeyError, match="there is no such example"):
        sw.examples.path("nope")


def test_the_stubs_name_every_native_function() -> None:
    stub = (Path(_native.__file__).parent / "_native.pyi").read_text()
    for name in ("op_table", "dtype_names", "run_defaults", "load_file", "load_source", "__version__"):
        assert re.search(r"\b%s\b" % name, stub), name
        assert hasattr(_native, name), name


OPS = [op for op, _ in sw.builder.ops()]


@pytest.mark.skipif(
    not {"mean", "gelu"} <= set(OPS), reason="the parser has no mean or gelu yet"
)
def test_numbers_are_literals_and_new_ops_are_methods() -> None:
    import math

    b = sw.Builder("lit", n=4, k=3)
    x = b.tensor("x", np.float64, ["n", "k"])
    y = b.mul(x, 0.5, name="y")
    m = b.mean(x, [1], name="m")
    g = b.gelu(x, name="g")
    z = b.where(b.gt(x, 0), x, -1.5, name="z")
    b.output(y, m, g, z)
    text = b.text()
    assert "y = mul(x, 0.5)" in text and "z = where(t0, x, -1.5)" in text
    assert "t0 = gt(x, 0)" in text
    xv = np.random.default_rng(0).normal(size=(4, 3))
    r = b.build().compile().run({"x": xv}, check=True)
    assert r.passed
    np.testing.assert_allclose(r.outputs["y"], xv * 0.5)
    np.testing.assert_allclose(r.outputs["m"], xv.mean(axis=1))
    erf = np.vectorize(math.erf)
    np.testing.assert_allclose(r.outputs["g"], xv * (1 + erf(xv / np.sqrt(2))) / 2, rtol=1e-12)
    np.testing.assert_allclose(r.outputs["z"], np.where(xv > 0, xv, -1.5))


def test_literals_are_written_as_the_format_reads_them() -> None:
    from streamweave.builder import _literal

    assert [_literal(v) for v in (3, -2, 0.5, 1e-5, float("inf"), -float("inf"), float("nan"))] == [
        "3",
        "-2",
        "0.5",
        "1e-05",
        "inf",
        "-inf",
        "nan",
    ]
