"""A small builder of fusions from Python: it writes ``.weave`` text (docs/fusion-format.md)
and loads it, so a built fusion is checked, reported and compiled exactly like a file.

    import numpy as np, streamweave as sw
    b = sw.Builder("row_parallel", t=8, h=4, d=2, s=2)
    m = b.mesh("m", "d")
    x = b.tensor("inp", np.float32, ["t", "4 * h"], on=m)
    w = b.tensor("w", "f32", ["h", "4 * h"], on=m)
    y = b.linear(x, w, name="out")
    b.output(y)
    b.schedule(x, "outer_split(0, s) -> Stream", "outer_split(2, d) -> DIDx")
    b.schedule(w, "outer_split(1, d) -> DIDx")
    exe = b.build().compile()

Every op of the format is a method of the same name, with its signature and a docstring
(``b.add(a, c)``, ``b.sum(x, [1])``, ``b.broadcast(v, [0])``, ``b.cast(x, "f32")``,
``b.reshape(q, ["t", "nh", "hd"])``; ``and``, ``or`` and ``not`` are ``and_``, ``or_`` and
``not_``): the methods are made from the op table of the Rust parser (:func:`ops`), so an
op added there is a method here. Tensors are the values the builder returned, axis lists
and shapes are Python lists of ints or size expressions, a dtype is a NumPy or PyTorch dtype
or a name (``np.float32``, ``torch.bfloat16``, ``"float32"``, ``"f32"``). ``name=`` names
the result (default ``t0``, ``t1``, ...).

A misspelt op fails at the attribute (``AttributeError`` naming the nearest op), a wrong
argument at the call (:class:`~streamweave.DTypeError`, :class:`~streamweave.ArgumentTypeError`
or :class:`~streamweave.FusionError`, each naming your file and line); a mistake the format's
checks find (shapes, dtypes of an op) is reported by :meth:`Builder.build` at the line of
your code that added the statement, with its place in :meth:`Builder.text`.
"""

from __future__ import annotations

import difflib
import keyword
import re
import sys
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    List,
    Optional,
    Protocol,
    Sequence,
    Set,
    Tuple,
    Union,
)

from . import _native
from ._errors import ArgumentTypeError, ArgumentValueError, DTypeError, FusionError

if TYPE_CHECKING:
    from . import Fusion

__all__ = ["Builder", "Value", "Mesh", "ops", "dtype_name", "python_name", "Size", "Operand", "DTypeLike"]

Size = Union[int, str]
"""A size or an axis: an int, or a size expression of the parameters (``"4 * h"``)."""

Operand = Union["Value", float]
"""An operand of a binary op or ``where``: a tensor of the builder, or a number (a literal of
the format, which takes the dtype of the op's tensor operand: ``b.mul(x, 0.5)``)."""

DTypeLike = Any
"""A dtype: a name of the format (``"f32"``), a NumPy name (``"float32"``), a NumPy dtype or
scalar type (``np.float32``, ``np.dtype("float32")``, ``ml_dtypes.bfloat16``) or a PyTorch
dtype (``torch.bfloat16``)."""

#: The dtype names of the format, from the Rust IR.
DTYPES: Tuple[str, ...] = tuple(_native.dtype_names())

# Other spellings of the format's dtypes (NumPy's and PyTorch's names).
_DTYPE_ALIASES = {
    "bfloat16": "bf16",
    "float16": "f16",
    "half": "f16",
    "float32": "f32",
    "float64": "f64",
    "double": "f64",
    "int64": "i64",
    "long": "i64",
    "bool_": "bool",
}


def dtype_name(dtype: DTypeLike) -> str:
    """The format's name of ``dtype`` (``np.float32``, ``"float32"``, ``"f32"`` and
    ``torch.float32`` are all ``"f32"``); :class:`~streamweave.DTypeError` (a ``TypeError``)
    for one the format does not have."""
    text: Optional[str] = None
    if isinstance(dtype, str):
        text = dtype
    elif type(dtype).__module__.startswith("torch"):
        text = str(dtype).rsplit(".", 1)[-1]  # torch.bfloat16 -> bfloat16
    else:
        try:
            import numpy as np

            text = np.dtype(dtype).name
        except (TypeError, ValueError):
            text = None
    if text is not None:
        text = _DTYPE_ALIASES.get(text, text)
        if text in DTYPES:
            return text
    shown = getattr(dtype, "__name__", None) or repr(dtype)
    raise DTypeError(
        "dtype %s: the format has %s (or their NumPy and PyTorch names: float32, "
        "np.float32, torch.bfloat16, ...)" % (shown, ", ".join(DTYPES))
    )


class Value:
    """A tensor of a :class:`Builder`: an input it declared or the result of an op."""

    __slots__ = ("builder", "name")

    def __init__(self, builder: "Builder", name: str) -> None:
        self.builder = builder
        self.name = name

    def __repr__(self) -> str:
        return "<streamweave.Value %s>" % self.name


class Mesh:
    """A device mesh of a :class:`Builder`."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return "<streamweave.Mesh %s>" % self.name


# ----- the op table ---------------------------------------------------------------------

# How each kind of op takes its arguments (the kinds of `_native.op_table()`): the Python
# parameters, how each becomes text, and what the method's docstring says about them. A
# new kind of op is one entry here (and a Protocol below, for the type checker).
_KINDS: Dict[str, Tuple[Tuple[Tuple[str, str], ...], str]] = {
    # kind: ((parameter, converter), ...), what the arguments are
    "unary": ((("a", "tensor"),), "``a`` a tensor"),
    "binary": (
        (("a", "operand"), ("b", "operand")),
        "``a`` and ``b`` tensors or numbers (literals taking the tensor's dtype)",
    ),
    "where": (
        (("cond", "tensor"), ("a", "operand"), ("b", "operand")),
        "``cond`` a bool tensor, ``a`` and ``b`` tensors or numbers",
    ),
    "cast": ((("a", "tensor"), ("dtype", "dtype")), "``a`` a tensor, ``dtype`` the new dtype"),
    "reduce": ((("a", "tensor"), ("axes", "ints")), "``a`` a tensor, ``axes`` the axes reduced"),
    "broadcast": (
        (("a", "tensor"), ("axes", "ints")),
        "``a`` a tensor, ``axes`` the output positions of the new axes",
    ),
    "squeeze": (
        (("a", "tensor"), ("axes", "ints")),
        "``a`` a tensor, ``axes`` the broadcast axes removed",
    ),
    "permute": (
        (("a", "tensor"), ("perm", "ints")),
        "``a`` a tensor, ``perm`` the permutation (output axis ``i`` is input axis "
        "``perm[i]``)",
    ),
    "reshape": (
        (("a", "tensor"), ("shape", "sizes")),
        "``a`` a tensor, ``shape`` the new shape (ints or size expressions)",
    ),
    "matmul": ((("a", "tensor"), ("b", "tensor")), "``a`` ``[.., m, k]``, ``b`` ``[.., k, n]``"),
    "linear": (
        (("x", "tensor"), ("w", "tensor"), ("bias", "tensor?")),
        "``x`` ``[.., k]``, ``w`` ``[n, k]`` and an optional ``bias`` ``[n]``",
    ),
    "iota": ((("a", "tensor"), ("axis", "int")), "``a`` a tensor (its shape), ``axis`` an axis"),
    "slice": (
        (("a", "tensor"), ("axis", "int"), ("start", "size"), ("stop", "size")),
        "``a`` a tensor, ``axis`` an axis, ``start`` and ``stop`` sizes (ints or size "
        "expressions such as ``\"2 * h\"``)",
    ),
    "concat": (
        (("a", "tensor"), ("b", "tensor"), ("axis", "int")),
        "``a`` and ``b`` tensors equal but along ``axis``",
    ),
    "index_select": (
        (("table", "tensor"), ("ids", "tensor"), ("axis", "int")),
        "``table`` a tensor, ``ids`` an ``i64`` tensor ``[n]`` of indices into its ``axis``",
    ),
}

# What each op computes, for its docstring (an op not listed gets its kind's wording).
_DOCS = {
    "set": "a copy of ``a`` (a communication where the shardings of ``a`` and the result differ)",
    "segment_set": "a copy of ``a`` that the segmenter never fuses with the op producing ``a``",
    "cast": "``a`` converted to ``dtype``",
    "neg": "``-a``",
    "abs": "``|a|``",
    "exp": "``e ** a``",
    "log": "the natural logarithm of ``a``",
    "sin": "``sin(a)``",
    "cos": "``cos(a)``",
    "tanh": "``tanh(a)``",
    "sqrt": "the square root of ``a``",
    "rsqrt": "``1 / sqrt(a)``",
    "reciprocal": "``1 / a``",
    "relu": "``max(a, 0)``",
    "sigmoid": "``1 / (1 + e ** -a)``",
    "not": "the logical not of the bool tensor ``a``",
    "add": "``a + b``",
    "sub": "``a - b``",
    "mul": "``a * b``",
    "div": "``a / b``",
    "maximum": "the elementwise maximum of ``a`` and ``b``",
    "minimum": "the elementwise minimum of ``a`` and ``b``",
    "pow": "``a ** b``",
    "eq": "``a == b`` (bool)",
    "ne": "``a != b`` (bool)",
    "lt": "``a < b`` (bool)",
    "le": "``a <= b`` (bool)",
    "gt": "``a > b`` (bool)",
    "ge": "``a >= b`` (bool)",
    "and": "the logical and of the bool tensors ``a`` and ``b``",
    "or": "the logical or of the bool tensors ``a`` and ``b``",
    "where": "``a`` where ``cond`` holds, else ``b``",
    "sum": "the sum of ``a`` over ``axes`` (kept as reduction axes)",
    "mean": "the mean of ``a`` over ``axes``: their sum divided by the count of its terms",
    "erf": "the error function of ``a``",
    "gelu": "the exact GELU, ``a * (1 + erf(a / sqrt(2))) / 2``",
    "gelu_tanh": "GELU's tanh approximation, "
    "``a * (1 + tanh(sqrt(2 / pi) * (a + 0.044715 * a ** 3))) / 2``",
    "max": "the maximum of ``a`` over ``axes`` (kept as reduction axes)",
    "min": "the minimum of ``a`` over ``axes`` (kept as reduction axes)",
    "var": "the population variance of ``a`` over ``axes``, in two passes (the mean, then "
    "the mean of the squared deviations from it)",
    "broadcast": "``a`` with broadcast axes inserted at ``axes``",
    "squeeze": "``a`` without its broadcast axes ``axes``",
    "permute": "``a`` with its axes permuted",
    "reshape": "``a`` with one axis split in two or two adjacent axes merged",
    "matmul": "the matrix product ``a @ b``",
    "linear": "``x @ w.T (+ bias)``",
    "iota": "an ``i64`` tensor of ``a``'s shape whose every element is its index along ``axis`` "
    "(a causal mask is ``b.ge(b.iota(s, 0), b.iota(s, 1))``)",
    "slice": "the elements ``start:stop`` of ``a`` along ``axis``",
    "concat": "``a`` then ``b`` along ``axis``",
    "index_select": "the rows of ``table`` along ``axis`` that ``ids`` name, in their order (an "
    "embedding lookup; an id outside the axis is an error)",
}

_KIND_DOCS = {
    "unary": "the elementwise ``{op}`` of ``a``",
    "binary": "the elementwise ``{op}`` of ``a`` and ``b``",
    "reduce": "the ``{op}`` reduction of ``a`` over ``axes`` (kept as reduction axes)",
}


def python_name(op: str) -> str:
    """The method name of the format's op ``op``: the op's own, with ``_`` after a Python
    keyword (``and_``, ``or_``, ``not_``)."""
    return op + "_" if keyword.iskeyword(op) else op


def ops() -> List[Tuple[str, str]]:
    """The format's ops as ``(op name, kind)``, from the Rust parser's tables: every one is a
    :class:`Builder` method (named by :func:`python_name`)."""
    return [(op, kind) for op, kind in _native.op_table()]


_THIS_FILE = __file__


def _caller() -> Tuple[str, int]:
    """The file and line of the user's code that called into this module."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename == _THIS_FILE:
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return ("<unknown>", 0)
    return (frame.f_code.co_filename, frame.f_lineno)


def _at(where: Tuple[str, int], message: str) -> str:
    return "%s:%d: %s" % (where[0], where[1], message)


def _literal(v: float) -> str:
    """A number as a literal of the format (``0.5``, ``1e-05``, ``-3``, ``inf``, ``nan``)."""
    if isinstance(v, int):
        return str(v)
    if v != v:
        return "nan"
    if v in (float("inf"), float("-inf")):
        return "inf" if v > 0 else "-inf"
    return repr(float(v))


def _expr(e: object, what: str) -> str:
    if isinstance(e, bool) or not isinstance(e, (int, str)):
        raise ArgumentTypeError(
            _at(_caller(), "%s: a size or axis is an int or an expression string, not %r" % (what, e))
        )
    return str(e)


# ----- the static types of the op methods (one Protocol per kind) -----------------------


class UnaryOp(Protocol):
    """An op of one tensor: ``b.exp(a, name=None)``."""

    def __call__(self, a: Value, *, name: Optional[str] = None) -> Value: ...


class BinaryOp(Protocol):
    """An op of two operands, each a tensor or a number: ``b.add(a, b, name=None)``."""

    def __call__(self, a: Operand, b: Operand, *, name: Optional[str] = None) -> Value: ...


class MatmulOp(Protocol):
    """``b.matmul(a, b, name=None)``."""

    def __call__(self, a: Value, b: Value, *, name: Optional[str] = None) -> Value: ...


class WhereOp(Protocol):
    """``b.where(cond, a, b, name=None)``."""

    def __call__(
        self, cond: Value, a: Operand, b: Operand, *, name: Optional[str] = None
    ) -> Value: ...


class CastOp(Protocol):
    """``b.cast(a, dtype, name=None)``."""

    def __call__(self, a: Value, dtype: DTypeLike, *, name: Optional[str] = None) -> Value: ...


class AxesOp(Protocol):
    """An op of a tensor and axes: ``b.sum(a, axes, name=None)``."""

    def __call__(
        self, a: Value, axes: Union[int, Sequence[int]], *, name: Optional[str] = None
    ) -> Value: ...


class PermuteOp(Protocol):
    """``b.permute(a, perm, name=None)``."""

    def __call__(self, a: Value, perm: Sequence[int], *, name: Optional[str] = None) -> Value: ...


class ReshapeOp(Protocol):
    """``b.reshape(a, shape, name=None)``."""

    def __call__(self, a: Value, shape: Sequence[Size], *, name: Optional[str] = None) -> Value: ...


class IotaOp(Protocol):
    """``b.iota(a, axis, name=None)``."""

    def __call__(self, a: Value, axis: int, *, name: Optional[str] = None) -> Value: ...


class SliceOp(Protocol):
    """``b.slice(a, axis, start, stop, name=None)``."""

    def __call__(
        self, a: Value, axis: int, start: Size, stop: Size, *, name: Optional[str] = None
    ) -> Value: ...


class ConcatOp(Protocol):
    """``b.concat(a, b, axis, name=None)``."""

    def __call__(self, a: Value, b: Value, axis: int, *, name: Optional[str] = None) -> Value: ...


class IndexSelectOp(Protocol):
    """``b.index_select(table, ids, axis, name=None)``."""

    def __call__(
        self, table: Value, ids: Value, axis: int, *, name: Optional[str] = None
    ) -> Value: ...


class LinearOp(Protocol):
    """``b.linear(x, w, bias=None, name=None)``."""

    def __call__(
        self, x: Value, w: Value, bias: Optional[Value] = None, *, name: Optional[str] = None
    ) -> Value: ...


class Builder:
    """Builds one fusion: parameters (keyword arguments, each with its default value; a
    value of ``None`` declares one without a default), meshes, input tensors, ops, outputs
    and schedules, in the order the format wants them. Every op of the format is a method
    (see the module's notes); ``roles`` gives parameters a role (``{"d": "mesh", "s":
    "chunks"}``)."""

    # The op methods, for the type checker: one line per op, in the Rust parser's order.
    # The methods themselves are made from `_native.op_table()` below; a test checks that
    # every op of the table has its line here.
    set: UnaryOp
    segment_set: UnaryOp
    cast: CastOp
    neg: UnaryOp
    abs: UnaryOp
    exp: UnaryOp
    log: UnaryOp
    sin: UnaryOp
    cos: UnaryOp
    tanh: UnaryOp
    sqrt: UnaryOp
    rsqrt: UnaryOp
    reciprocal: UnaryOp
    relu: UnaryOp
    sigmoid: UnaryOp
    not_: UnaryOp
    erf: UnaryOp
    gelu: UnaryOp
    gelu_tanh: UnaryOp
    add: BinaryOp
    sub: BinaryOp
    mul: BinaryOp
    div: BinaryOp
    maximum: BinaryOp
    minimum: BinaryOp
    pow: BinaryOp
    eq: BinaryOp
    ne: BinaryOp
    lt: BinaryOp
    le: BinaryOp
    gt: BinaryOp
    ge: BinaryOp
    and_: BinaryOp
    or_: BinaryOp
    where: WhereOp
    sum: AxesOp
    max: AxesOp
    min: AxesOp
    mean: AxesOp
    var: AxesOp
    broadcast: AxesOp
    squeeze: AxesOp
    permute: PermuteOp
    reshape: ReshapeOp
    matmul: MatmulOp
    linear: LinearOp
    iota: IotaOp
    slice: SliceOp
    concat: ConcatOp
    index_select: IndexSelectOp

    def __init__(
        self, name: str, roles: Optional[Dict[str, str]] = None, **params: Optional[int]
    ) -> None:
        self._name = name
        self._params = params
        self._roles = dict(roles or {})
        # Each statement with the place in the user's code that added it.
        self._lines: List[Tuple[str, Tuple[str, int]]] = []
        self._schedules: List[Tuple[str, Tuple[str, int]]] = []
        self._outputs: List[str] = []
        self._output_at: Optional[Tuple[str, int]] = None
        self._names: Set[str] = set()
        self._next = 0

    def __repr__(self) -> str:
        return "<streamweave.Builder %s: %d statement(s)>" % (self._name, len(self._lines))

    if not TYPE_CHECKING:

        def __getattr__(self, attr: str) -> Any:
            # Only reached for a name the class does not have: a misspelt op.
            if attr.startswith("_"):
                raise AttributeError(attr)
            near = difflib.get_close_matches(attr, _METHODS, n=3)
            hint = " (did you mean %s?)" % ", ".join(near) if near else ""
            raise AttributeError(
                "'Builder' has no op or method `%s`%s; the ops are: %s"
                % (attr, hint, ", ".join(_METHODS))
            )

    # ----- arguments -------------------------------------------------------------------

    def _fresh(self, name: Optional[str], where: Tuple[str, int]) -> str:
        if name is None:
            while "t%d" % self._next in self._names:
                self._next += 1
            name = "t%d" % self._next
            self._next += 1
        if not isinstance(name, str):
            raise ArgumentTypeError(_at(where, "a name is a str, not %r" % (name,)))
        if name in self._names:
            raise FusionError(_at(where, "`%s` is already a name of this fusion" % name))
        self._names.add(name)
        return name

    def _tensor(self, v: object, op: str, param: str, where: Tuple[str, int]) -> str:
        if isinstance(v, Value):
            if v.builder is not self:
                raise FusionError(
                    _at(where, "%s(%s=%r): the tensor belongs to another builder" % (op, param, v))
                )
            return v.name
        raise ArgumentTypeError(
            _at(
                where,
                "%s(%s=...): a tensor of this builder (a Value) is needed, not %s"
                % (op, param, type(v).__name__),
            )
        )

    def _operand(self, v: object, op: str, param: str, where: Tuple[str, int]) -> str:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return _literal(v)
        return self._tensor(v, op, param, where)

    def _ints(self, v: object, op: str, param: str, where: Tuple[str, int]) -> str:
        items = [v] if isinstance(v, int) and not isinstance(v, bool) else v
        if not isinstance(items, (list, tuple)) or not all(
            isinstance(x, int) and not isinstance(x, bool) for x in items
        ):
            raise ArgumentTypeError(
                _at(where, "%s(%s=%r): a list of ints is needed" % (op, param, v))
            )
        return "[" + ", ".join(str(x) for x in items) + "]"

    def _sizes(self, v: object, op: str, param: str, where: Tuple[str, int]) -> str:
        if not isinstance(v, (list, tuple)):
            raise ArgumentTypeError(
                _at(where, "%s(%s=%r): a list of sizes (ints or expressions) is needed" % (op, param, v))
            )
        return "[" + ", ".join(_expr(x, "%s(%s=...)" % (op, param)) for x in v) + "]"

    def _int(self, v: object, op: str, param: str, where: Tuple[str, int]) -> str:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ArgumentTypeError(_at(where, "%s(%s=%r): an int is needed" % (op, param, v)))
        return str(v)

    def _size(self, v: object, op: str, param: str, where: Tuple[str, int]) -> str:
        return _expr(v, "%s(%s=...)" % (op, param))

    def _dtype(self, v: object, op: str, param: str, where: Tuple[str, int]) -> str:
        try:
            return dtype_name(v)
        except DTypeError as e:
            raise DTypeError(_at(where, "%s(%s=...): %s" % (op, param, e))) from None

    def _emit(self, op: str, name: Optional[str], where: Tuple[str, int], args: List[str]) -> Value:
        result = self._fresh(name, where)
        self._lines.append(("%s = %s(%s)" % (result, op, ", ".join(args)), where))
        return Value(self, result)

    # ----- statements ------------------------------------------------------------------

    def mesh(
        self, name: str, *extents: Size, devices: Optional[Sequence[Any]] = None
    ) -> Mesh:
        """``mesh NAME = devices(e)`` (1-D) or ``devices(r, c)`` (2-D); or, with
        ``devices=[0, 1]`` / ``[[0, 1], [2, 3]]``, an explicit list."""
        where = _caller()
        name = self._fresh(name, where)
        if devices is not None:
            rows = len(devices) > 0 and isinstance(devices[0], (list, tuple))
            spec = repr([list(r) for r in devices] if rows else list(devices))
        else:
            spec = "devices(%s)" % ", ".join(_expr(e, "mesh") for e in extents)
        self._lines.append(("mesh %s = %s" % (name, spec), where))
        return Mesh(name)

    def tensor(
        self,
        name: str,
        dtype: DTypeLike,
        shape: Sequence[Size],
        *,
        on: Optional[Mesh] = None,
    ) -> Value:
        """An input tensor: ``tensor NAME: DTYPE[shape] on MESH``. ``dtype`` is a NumPy or
        PyTorch dtype or a name (``np.float32``, ``"float32"``, ``"f32"``; a
        :class:`~streamweave.DTypeError` for another); ``shape`` a list of ints or size
        expressions (``["t", "4 * h"]``)."""
        where = _caller()
        dtype = self._dtype(dtype, "tensor", "dtype", where)
        name = self._fresh(name, where)
        if not isinstance(shape, (list, tuple)):
            raise ArgumentTypeError(
                _at(where, "tensor(shape=%r): a list of sizes (ints or expressions) is needed" % (shape,))
            )
        text = "tensor %s: %s[%s]" % (name, dtype, ", ".join(_expr(e, "tensor(shape=...)") for e in shape))
        if on is not None:
            text += " on %s" % on.name
        self._lines.append((text, where))
        return Value(self, name)

    def op(self, op: str, *args: Any, name: Optional[str] = None) -> Value:
        """``NAME = OP(args)``: an op of the format by its name (``b.op("and", p, q)``);
        the methods of the same name check their arguments better. An op the format does
        not have raises :class:`~streamweave.ArgumentValueError`."""
        where = _caller()
        if op not in _ALL_OPS:
            near = difflib.get_close_matches(op, sorted(_ALL_OPS), n=3)
            hint = " (did you mean %s?)" % ", ".join(near) if near else ""
            raise ArgumentValueError(_at(where, "unknown op `%s`%s" % (op, hint)))
        text: List[str] = []
        for i, a in enumerate(args):
            if isinstance(a, Value):
                text.append(self._tensor(a, op, "#%d" % i, where))
            elif isinstance(a, (int, float)) and not isinstance(a, bool):
                text.append(_literal(a))
            elif isinstance(a, (list, tuple)):
                text.append(self._sizes(a, op, "#%d" % i, where))
            else:
                text.append(self._dtype(a, op, "#%d" % i, where))
        return self._emit(op, name, where, text)

    def output(self, *values: Value) -> None:
        """Marks ``values`` as the fusion's outputs."""
        where = _caller()
        if self._output_at is None:
            self._output_at = where
        self._outputs.extend(self._tensor(v, "output", "values", where) for v in values)

    def schedule(self, value: Value, *steps: str) -> None:
        """``schedule NAME { step; step }``: the steps as the format writes them
        (``"outer_split(0, s) -> Stream"``, ``"mesh = m"``, ...)."""
        where = _caller()
        tensor = self._tensor(value, "schedule", "value", where)
        for s in steps:
            if not isinstance(s, str):
                raise ArgumentTypeError(_at(where, "schedule: a step is a str, not %r" % (s,)))
        self._schedules.append(("schedule %s { %s }" % (tensor, "; ".join(steps)), where))

    def _body(self) -> List[Tuple[str, Optional[Tuple[str, int]]]]:
        body: List[Tuple[str, Optional[Tuple[str, int]]]] = list(self._lines)
        if self._outputs:
            body.append(("output " + ", ".join(self._outputs), self._output_at))
        body += self._schedules
        return body

    def text(self) -> str:
        """The fusion as ``.weave`` text."""
        params = []
        for k, v in self._params.items():
            p = k + (": " + self._roles[k] if k in self._roles else "")
            params.append(p if v is None else "%s = %d" % (p, v))
        return "fusion %s(%s) {\n%s\n}\n" % (
            self._name,
            ", ".join(params),
            "\n".join("  " + line for line, _ in self._body()),
        )

    def build(self, **overrides: int) -> "Fusion":
        """Loads the text (:func:`streamweave.loads`, with parameter overrides): a
        :class:`streamweave.Fusion`, or :class:`~streamweave.FusionError` (a
        ``ValueError``) naming the line of your code that added the statement at fault and
        its place in :meth:`text`."""
        from . import loads

        file = "<builder %s>" % self._name
        try:
            return loads(self.text(), file=file, **overrides)
        except FusionError as e:
            message = str(e)
            m = re.search(re.escape(file) + r":(\d+):(\d+)", message)
            body = self._body()
            # Line 1 of the text is the header; body line i is line i + 2.
            index = int(m.group(1)) - 2 if m else -1
            if not 0 <= index < len(body):
                raise
            statement, where = body[index]
            if where is None:
                raise
            raise FusionError(
                "%s:%d: %s\n  in the statement `%s` this line added (line %s of the builder's "
                "text)" % (where[0], where[1], message, statement, m.group(1) if m else "?")
            ) from None


# ----- the op methods, made from the Rust op table ---------------------------------------

_CONVERT = {
    "tensor": "_tensor",
    "operand": "_operand",
    "ints": "_ints",
    "sizes": "_sizes",
    "dtype": "_dtype",
    "int": "_int",
    "size": "_size",
}


def _make_op(op: str, kind: str) -> Callable[..., Value]:
    """The method of op ``op`` of ``kind``: a real function with the kind's parameters
    (checked by Python), converting each argument at the call, with a docstring."""
    params, what = _KINDS[kind]
    py = python_name(op)
    sig: List[str] = []
    conv: List[str] = []
    for param, how in params:
        if how == "tensor?":
            sig.append("%s=None" % param)
            conv.append(
                "*(() if %s is None else (self._tensor(%s, %r, %r, where),))" % (param, param, op, param)
            )
        else:
            sig.append(param)
            conv.append("self.%s(%s, %r, %r, where)" % (_CONVERT[how], param, op, param))
    source = (
        "def {py}(self, {sig}, *, name=None):\n"
        "    where = _caller()\n"
        "    return self._emit({op!r}, name, where, [{conv}])\n"
    ).format(py=py, sig=", ".join(sig), op=op, conv=", ".join(conv))
    namespace: Dict[str, Any] = {"_caller": _caller}
    exec(compile(source, _THIS_FILE, "exec"), namespace)
    fn: Callable[..., Value] = namespace[py]
    doc = _DOCS.get(op) or _KIND_DOCS.get(kind, "the op ``{op}``").format(op=op)
    fn.__qualname__ = "Builder." + py
    fn.__module__ = __name__
    fn.__doc__ = (
        "``NAME = %s(%s)`` in the ``.weave`` format: %s.\n\n"
        "%s; ``name=`` names the result (default ``t0``, "
        "``t1``, ...). Returns the result's :class:`Value`."
        % (op, ", ".join(p for p, _ in params), doc, what[0].upper() + what[1:])
    )
    return fn


_ALL_OPS: Set[str] = set()
_OP_KINDS: Dict[str, str] = {}
for _op, _kind in ops():
    _ALL_OPS.add(_op)
    if _kind not in _KINDS:  # a kind this module does not know yet: only `b.op(...)`
        continue
    _OP_KINDS[_op] = _kind
    setattr(Builder, python_name(_op), _make_op(_op, _kind))

_METHODS = sorted(python_name(op) for op in _OP_KINDS)
