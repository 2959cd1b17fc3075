"""Inputs cross into Rust in their own dtype and outputs come back in theirs: no f64 round
trip, no silent conversion. A dtype or kind the signature does not take raises
`DTypeError` (a `TypeError`) naming the input and both dtypes, worded as the Rust API's
refusal (`input `x`: is i64 but the program takes f32`)."""

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import streamweave as sw

# What a bf16 output comes back as: ml_dtypes.bfloat16 where installed, else float32.
BF16_OUT = sw.BFLOAT16 if sw.BFLOAT16 is not None else np.dtype(np.float32)

BIG = 2**53 + 1


def identity(dtype: str, n: int = 3) -> sw.Executable:
    return sw.loads(
        "fusion f(n = %d) {\n  tensor x: %s[n]\n  y = set(x)\n  output y\n}\n" % (n, dtype)
    ).compile()


def add_zeros_i64() -> sw.Executable:
    return sw.loads(
        "fusion f(n = 3) {\n  tensor x: i64[n]\n  tensor z: i64[n]\n  y = add(x, z)\n"
        "  output y\n}\n"
    ).compile()


def test_dtype_error_is_a_type_error_and_a_streamweave_error() -> None:
    assert issubclass(sw.DTypeError, TypeError)
    assert issubclass(sw.DTypeError, sw.StreamweaveError)


@pytest.mark.parametrize(
    "dtype, values",
    [
        ("f32", np.array([1.5, -2**-30, 3.4e38], dtype=np.float32)),
        ("f64", np.array([0.1, 1 + 2**-52, -1e300], dtype=np.float64)),
        ("f16", np.array([1.5, 65504, -(2**-24)], dtype=np.float16)),
        ("i64", np.array([2**53 - 1, -(2**53 - 1), 7], dtype=np.int64)),
        ("bool", np.array([True, False, True])),
    ],
)
def test_every_dtype_round_trips_exactly(dtype: str, values: npt.NDArray[Any]) -> None:
    r = identity(dtype).run({"x": values}, check=True)
    assert r.passed
    y = r.outputs["y"]
    assert y.dtype == values.dtype
    np.testing.assert_array_equal(y, values)
    assert y.tobytes() == values.tobytes()


def test_i64_values_below_2_pow_53_round_trip_through_add_exactly() -> None:
    x = np.array([2**53 - 1, -(2**53 - 1), 2**53 - 3], dtype=np.int64)
    r = add_zeros_i64().run({"x": x, "z": np.zeros(3, dtype=np.int64)}, check=True)
    assert r.passed and r.outputs["y"].dtype == np.int64
    assert r.outputs["y"].tolist() == x.tolist()


def test_i64_from_2_pow_53_is_refused_not_rounded() -> None:
    # The CPU backend computes in f64: 2^53 + 1 would come back as 2^53 with passed=True.
    for exe in (identity("i64"), add_zeros_i64()):
        inputs = {t.name: np.zeros(3, dtype=np.int64) for t in exe.inputs}
        inputs["x"] = np.array([2**53, 0, 1], dtype=np.int64)
        with pytest.raises(sw.StreamweaveError, match=r"input `x`: element 0 is 9007199254740992"):
            exe.run(inputs)
        inputs = {t.name: np.zeros(3, dtype=np.int64) for t in exe.inputs}
        inputs["x"] = np.array([0, BIG, 1], dtype=np.int64)
        with pytest.raises(sw.StreamweaveError, match=r"input `x`: element 1 is 9007199254740993"):
            exe.run(inputs)
        inputs["x"] = np.array([0, 1, -BIG], dtype=np.int64)
        with pytest.raises(sw.StreamweaveError, match="element 2 is -9007199254740993"):
            exe.run(inputs)


def test_an_i64_output_from_2_pow_53_is_refused_not_rounded() -> None:
    # (2^53 - 1) + 2 = 2^53 + 1 is 2^53 in f64: the output is refused, not handed back.
    exe = add_zeros_i64()
    x = np.array([0, 2**53 - 1, 0], dtype=np.int64)
    with pytest.raises(sw.StreamweaveError, match="output `y`: element 1 is 9007199254740992"):
        exe.run({"x": x, "z": np.array([0, 2, 0], dtype=np.int64)})


def test_an_int64_array_for_an_f32_input_raises_naming_the_input() -> None:
    with pytest.raises(TypeError, match=r"^input `x`: is i64 but the program takes f32$"):
        identity("f32").run({"x": np.arange(3, dtype=np.int64)})
    with pytest.raises(TypeError, match=r"^input `x`: is int32 but the program takes f32$"):
        identity("f32").run({"x": np.arange(3, dtype=np.int32)})
    with pytest.raises(TypeError, match=r"^input `x`: is f32 but the program takes i64$"):
        identity("i64").run({"x": np.zeros(3, dtype=np.float32)})
    with pytest.raises(TypeError, match=r"^input `x`: is i64 but the program takes bool$"):
        identity("bool").run({"x": np.zeros(3, dtype=np.int64)})


@pytest.mark.parametrize("dtype", ["f32", "f64", "bf16", "i64"])
@pytest.mark.parametrize("complex_dtype", [np.complex64, np.complex128])
def test_complex_inputs_raise(dtype: str, complex_dtype: Any) -> None:
    x = np.array([1 + 2j, 3, 4], dtype=complex_dtype)
    name = np.dtype(complex_dtype).name
    with pytest.raises(TypeError, match=r"input `x`: is %s but the program takes %s" % (name, dtype)):
        identity(dtype).run({"x": x})
    with pytest.raises(TypeError, match="complex"):
        identity(dtype).run({"x": [1 + 2j, 3, 4]})


def test_float64_for_an_f32_input_raises_as_in_rust() -> None:
    with pytest.raises(TypeError, match=r"^input `x`: is f64 but the program takes f32$"):
        identity("f32").run({"x": np.zeros(3)})
    with pytest.raises(TypeError, match=r"^input `x`: is f32 but the program takes f64$"):
        identity("f64").run({"x": np.zeros(3, dtype=np.float32)})
    with pytest.raises(TypeError, match=r"^input `x`: is f16 but the program takes f32$"):
        identity("f32").run({"x": np.zeros(3, dtype=np.float16)})


def test_a_bf16_input_takes_any_float_array_rounded_as_documented() -> None:
    exe = identity("bf16", n=4)
    tie = 1 + 2**-8  # halfway between two bf16 values: rounds to the even one, 1.0
    for dtype in (np.float64, np.float32, np.float16):
        x = np.array([tie, 1 + 3 * 2**-8, -2.5, 0.0], dtype=dtype)
        y = exe.run({"x": x}).outputs["y"]
        assert y.dtype == BF16_OUT
        np.testing.assert_array_equal(y.astype(np.float64), [1.0, 1 + 2**-6, -2.5, 0.0])
    with pytest.raises(TypeError, match=r"^input `x`: is i64 but the program takes bf16$"):
        exe.run({"x": np.arange(4, dtype=np.int64)})


def test_plain_python_values_take_the_dtype_when_their_kind_fits() -> None:
    assert identity("i64").run({"x": [BIG - 2, 0, -5]}).outputs["y"].tolist() == [BIG - 2, 0, -5]
    np.testing.assert_array_equal(identity("f32").run({"x": [0.5, 2.0, 3.0]}).outputs["y"], [0.5, 2, 3])
    with pytest.raises(TypeError, match="input `x`: is i64 but the program takes f32"):
        identity("f32").run({"x": [1, 2, 3]})
    with pytest.raises(TypeError, match="input `x`: is f64 but the program takes i64"):
        identity("i64").run({"x": [1.0, 2.0, 3.0]})
    with pytest.raises(TypeError, match="input `x`: is object but the program takes i64"):
        identity("i64").run({"x": [2**70, 0, 1]})


def test_non_contiguous_and_big_endian_arrays_keep_their_values() -> None:
    exe = identity("f32")
    x = np.arange(6, dtype=np.float32)[::2]
    np.testing.assert_array_equal(exe.run({"x": x}).outputs["y"], [0, 2, 4])
    b = np.array([1.5, -2.25, 3e38], dtype=">f4")
    np.testing.assert_array_equal(exe.run({"x": b}).outputs["y"], b.astype(np.float32))
    i = np.array([2**53 - 1, -3, 1], dtype=">i8")
    assert identity("i64").run({"x": i}).outputs["y"].tolist() == [2**53 - 1, -3, 1]


def test_the_errors_are_the_built_in_kinds_too() -> None:
    exe = identity("f32")
    with pytest.raises(sw.ShapeError) as shape:
        exe.run({"x": np.zeros(4, dtype=np.float32)})
    assert isinstance(shape.value, ValueError) and isinstance(shape.value, sw.StreamweaveError)
    assert str(shape.value) == "input `x`: has shape [4] but the program takes [3]"
    with pytest.raises(KeyError) as missing:
        exe.run({})
    assert isinstance(missing.value, sw.InputNameError)
    # A sentence, not the repr KeyError gives its key.
    assert str(missing.value) == "input `x`: not given (the program takes x)"
    with pytest.raises(KeyError, match="input `y`: the program has no such input"):
        exe.run({"x": np.zeros(3, dtype=np.float32), "y": np.zeros(3, dtype=np.float32)})
    with pytest.raises(ValueError, match="timeout_secs"):
        exe.run({"x": np.zeros(3, dtype=np.float32)}, timeout_secs=-1)


def test_inputs_given_as_a_list_raise_a_type_error_saying_what_is_needed() -> None:
    exe = identity("f32")
    with pytest.raises(TypeError, match=r"inputs: a mapping of input name to array is needed \({'x': ...}\), not list"):
        exe.run([np.zeros(3, dtype=np.float32)])  # type: ignore[arg-type]
    with pytest.raises(sw.ArgumentTypeError):
        exe.run(np.zeros(3, dtype=np.float32))  # type: ignore[arg-type]


@pytest.mark.skipif(sw.BFLOAT16 is None, reason="ml_dtypes is not installed")
def test_bf16_in_is_bf16_out_bit_for_bit() -> None:
    assert sw.BFLOAT16 is not None
    bits = np.array([0x3F80, 0x3F81, 0xC020, 0x0001, 0x7F7F, 0x8000], dtype=np.uint16)
    x = bits.view(sw.BFLOAT16)
    y = identity("bf16", n=6).run({"x": x}, check=True).outputs["y"]
    assert y.dtype == sw.BFLOAT16
    assert y.view(np.uint16).tolist() == bits.tolist()
    # bf16 arithmetic comes back in bf16 too.
    exe = sw.loads(
        "fusion f(n = 4) {\n  tensor x: bf16[n]\n  y = add(x, x)\n  output y\n}\n"
    ).compile()
    v = np.array([1.5, -2.0, 0.25, 3.0]).astype(sw.BFLOAT16)
    out = exe.run({"x": v}).outputs["y"]
    assert out.dtype == sw.BFLOAT16
    assert out.astype(np.float64).tolist() == [3.0, -4.0, 0.5, 6.0]


def test_without_ml_dtypes_bf16_comes_back_as_float32_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sw, "BFLOAT16", None)
    x = np.array([1.0, 1 + 2**-7, -3.5], dtype=np.float32)
    y = identity("bf16").run({"x": x}).outputs["y"]
    assert y.dtype == np.float32
    assert y.tolist() == [1.0, 1 + 2**-7, -3.5]


def test_f16_and_i64_outputs_are_writable_arrays_of_their_own_dtype() -> None:
    for dtype, values in (
        ("f16", np.array([0.5, -65504, 2**-24], dtype=np.float16)),
        ("i64", np.array([-(2**53 - 1), 0, 2**53 - 1], dtype=np.int64)),
    ):
        y = identity(dtype).run({"x": values}).outputs["y"]
        assert y.dtype == values.dtype and y.flags.writeable and y.flags.c_contiguous
        assert y.tobytes() == values.tobytes()
        y[0] = 0  # the array owns (through its buffer) memory of its own


class DLPackOnly:
    """A tensor that only exports DLPack (as a PyTorch CPU tensor or a JAX array would)."""

    def __init__(self, array: npt.NDArray[Any]) -> None:
        self._array = array

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> Any:
        return self._array.__dlpack_device__()


def test_a_dlpack_tensor_is_taken_as_an_input() -> None:
    x = np.array([1.5, -2.0, 4.0], dtype=np.float32)
    y = identity("f32").run({"x": DLPackOnly(x)}, check=True)
    assert y.passed and y.outputs["y"].tolist() == [1.5, -2.0, 4.0]
    with pytest.raises(TypeError, match="input `x`: is f64 but the program takes f32"):
        identity("f32").run({"x": DLPackOnly(x.astype(np.float64))})


def test_a_device_dlpack_tensor_is_sent_to_the_gpu_path() -> None:
    class OnCuda(DLPackOnly):
        def __dlpack_device__(self) -> Any:
            return (2, 0)  # kDLCUDA, device 0

    with pytest.raises(TypeError, match=r"device tensor .* Executable.cuda\(\)"):
        identity("f32").run({"x": OnCuda(np.zeros(3, dtype=np.float32))})


def test_the_input_is_read_from_the_arrays_own_memory() -> None:
    # A C-contiguous little-endian array is handed over as it is: a view into a bigger
    # buffer reads exactly its own elements.
    base = np.arange(12, dtype=np.float32)
    view = base[3:6]
    assert not view.flags.owndata and view.flags.c_contiguous
    assert identity("f32").run({"x": view}).outputs["y"].tolist() == [3.0, 4.0, 5.0]
