"""A seeded fuzz of the Python boundary: arrays of every dtype, shape and memory layout
(C and Fortran order, strided, reversed, transposed, broadcast with zero strides,
read-only, the same array passed twice) go into a program of two f32[6, 4] inputs. Each
either runs and matches NumPy on the exact values given, or is refused with an error that
is a `StreamweaveError` and the built-in kind of the mistake (`TypeError` for a dtype,
`ValueError` for a shape) — never another exception, never a silent conversion."""

from typing import Any, Callable, List, Tuple

import numpy as np
import numpy.typing as npt
import pytest

import streamweave as sw

SOURCE = """fusion f(n = 6, k = 4) {
  tensor a: f32[n, k]
  tensor b: f32[n, k]
  y = a * b + a
  output y
}
"""

DTYPES: List[Any] = [
    np.float32,
    np.float32,
    np.float16,
    np.float64,
    np.int32,
    np.int64,
    np.uint8,
    np.bool_,
    np.complex64,
]
SHAPES: List[Tuple[int, ...]] = [(6, 4), (6, 4), (6, 4), (4, 6), (6,), (6, 4, 1), (0, 4), ()]

Array = npt.NDArray[Any]


def layouts(rng: np.random.Generator) -> List[Tuple[str, Callable[[Array], Array]]]:
    """Ways to hand over the same values in another memory layout."""

    def strided(x: Array) -> Array:
        big = np.zeros((x.shape[0] * 2,) + x.shape[1:], dtype=x.dtype) if x.ndim else x
        if x.ndim:
            big[::2] = x
            return big[::2]
        return x

    def reversed_(x: Array) -> Array:
        return np.ascontiguousarray(x[::-1])[::-1] if x.ndim else x

    def transposed(x: Array) -> Array:
        return np.ascontiguousarray(x.T).T if x.ndim >= 2 else x

    def read_only(x: Array) -> Array:
        y = x.copy()
        y.setflags(write=False)
        return y

    def broadcast(x: Array) -> Array:
        if x.ndim >= 1 and x.shape[0] > 0:
            return np.broadcast_to(x[:1], x.shape)
        return x

    return [
        ("C", lambda x: np.ascontiguousarray(x)),
        ("Fortran", lambda x: np.asfortranarray(x)),
        ("strided", strided),
        ("reversed", reversed_),
        ("transposed", transposed),
        ("read-only", read_only),
        ("broadcast", broadcast),
    ]


def value(rng: np.random.Generator, dtype: Any, shape: Tuple[int, ...]) -> Array:
    if np.dtype(dtype).kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    if np.dtype(dtype).kind == "b":
        return rng.integers(0, 2, shape).astype(dtype)
    if np.dtype(dtype).kind in "iu":
        return rng.integers(0, 9, shape).astype(dtype)
    return rng.uniform(-2, 2, shape).astype(dtype)


@pytest.mark.parametrize("seed", range(8))
def test_arrays_of_every_kind_run_right_or_are_refused_as_their_kind(seed: int) -> None:
    rng = np.random.default_rng(seed)
    exe = sw.loads(SOURCE).compile()
    ways = layouts(rng)
    for _ in range(12):
        dtype = DTYPES[rng.integers(len(DTYPES))]
        shape = SHAPES[rng.integers(len(SHAPES))]
        name, layout = ways[rng.integers(len(ways))]
        a = layout(value(rng, dtype, shape))
        aliased = bool(rng.integers(2))
        b = a if aliased else layout(value(rng, np.float32, (6, 4)))
        what = "a: %s%s %s, b %s" % (np.dtype(dtype).name, shape, name, "= a" if aliased else "f32")
        good = np.dtype(dtype) == np.float32 and shape == (6, 4)
        try:
            r = exe.run({"a": a, "b": b}, check=True)
        except sw.StreamweaveError as e:
            assert not good, "%s: refused a right input: %s" % (what, e)
            # The kind of the mistake: a dtype is a TypeError, a shape a ValueError (either,
            # where both are wrong).
            kinds: Tuple[type, ...] = ()
            if np.dtype(dtype) != np.float32:
                kinds += (TypeError,)
            if shape != (6, 4):
                kinds += (ValueError,)
            assert isinstance(e, kinds), "%s: %r is not one of %s" % (what, e, kinds)
            continue
        assert good, "%s: ran although the program takes f32[6, 4]" % what
        assert r.passed, what
        y = r.outputs["y"]
        assert y.dtype == np.float32 and y.shape == (6, 4), what
        a64 = np.asarray(a, dtype=np.float64)
        b64 = np.asarray(b, dtype=np.float64)
        np.testing.assert_allclose(y, (a64 * b64 + a64).astype(np.float32), rtol=1e-6, err_msg=what)
        # The inputs are as they were.
        np.testing.assert_array_equal(np.asarray(a, dtype=np.float64), a64, err_msg=what)
