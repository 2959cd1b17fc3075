"""A small builder of fusions from Python: it writes ``.weave`` text (docs/fusion-format.md)
and loads it, so a built fusion is checked, reported and compiled exactly like a file.

    import streamweave as sw
    b = sw.Builder("row_parallel", t=8, h=4, d=2, s=2)
    m = b.mesh("m", "d")
    x = b.tensor("inp", "bf16", ["t", "4 * h"], on=m)
    w = b.tensor("w", "bf16", ["h", "4 * h"], on=m)
    y = b.linear(x, w, name="out")
    b.output(y)
    b.schedule(x, "outer_split(0, s) -> Stream", "outer_split(2, d) -> DIDx")
    b.schedule(w, "outer_split(1, d) -> DIDx")
    exe = b.build().compile()

Every op of the format is a method of the same name (``b.add(a, c)``, ``b.sum(x, [1])``,
``b.broadcast(v, [0])``, ``b.cast(x, "f32")``, ``b.reshape(q, ["t", "nh", "hd"])``): tensors
are the values the builder returned, axis lists and shapes are Python lists of ints or size
expressions, a dtype is its name. ``name=`` names the result (default ``t0``, ``t1``, ...).
A mistake is reported when the text loads, by :meth:`Builder.build`, with its place in the
text :meth:`Builder.text` shows.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Union

__all__ = ["Builder", "Value", "Mesh"]

_DTYPES = ("bf16", "f16", "f32", "f64", "i64", "bool")


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


def _expr(e: Union[int, str]) -> str:
    if isinstance(e, bool) or not isinstance(e, (int, str)):
        raise TypeError("a size or axis is an int or an expression string, not %r" % (e,))
    return str(e)


class Builder:
    """Builds one fusion: parameters (keyword arguments, each with its default value; a
    value of ``None`` declares one without a default), meshes, input tensors, ops, outputs
    and schedules, in the order the format wants them."""

    def __init__(
        self, name: str, roles: Optional[Dict[str, str]] = None, **params: Optional[int]
    ) -> None:
        self._name = name
        self._params = params
        self._roles = dict(roles or {})
        self._lines: List[str] = []
        self._schedules: List[str] = []
        self._outputs: List[str] = []
        self._names: set = set()
        self._next = 0

    def _fresh(self, name: Optional[str]) -> str:
        if name is None:
            while "t%d" % self._next in self._names:
                self._next += 1
            name = "t%d" % self._next
            self._next += 1
        if name in self._names:
            raise ValueError("`%s` is already a name of this fusion" % name)
        self._names.add(name)
        return name

    def _arg(self, a) -> str:
        if isinstance(a, Value):
            if a.builder is not self:
                raise ValueError("%r belongs to another builder" % (a,))
            return a.name
        if isinstance(a, (list, tuple)):
            return "[" + ", ".join(_expr(x) for x in a) + "]"
        if isinstance(a, str) and a in _DTYPES:
            return a
        raise TypeError("an op argument is a tensor, a list or a dtype name, not %r" % (a,))

    def mesh(
        self, name: str, *extents: Union[int, str], devices: Optional[Sequence] = None
    ) -> Mesh:
        """``mesh NAME = devices(e)`` (1-D) or ``devices(r, c)`` (2-D); or, with
        ``devices=[0, 1]`` / ``[[0, 1], [2, 3]]``, an explicit list."""
        name = self._fresh(name)
        if devices is not None:
            rows = devices and isinstance(devices[0], (list, tuple))
            spec = repr([list(r) for r in devices] if rows else list(devices))
        else:
            spec = "devices(%s)" % ", ".join(_expr(e) for e in extents)
        self._lines.append("mesh %s = %s" % (name, spec))
        return Mesh(name)

    def tensor(
        self,
        name: str,
        dtype: str,
        shape: Sequence[Union[int, str]],
        *,
        on: Optional[Mesh] = None,
    ) -> Value:
        """An input tensor: ``tensor NAME: DTYPE[shape] on MESH``."""
        name = self._fresh(name)
        text = "tensor %s: %s[%s]" % (name, dtype, ", ".join(_expr(e) for e in shape))
        if on is not None:
            text += " on %s" % on.name
        self._lines.append(text)
        return Value(self, name)

    def op(self, op: str, *args, name: Optional[str] = None) -> Value:
        """``NAME = OP(args)``: any op of the format by its name."""
        name = self._fresh(name)
        self._lines.append("%s = %s(%s)" % (name, op, ", ".join(self._arg(a) for a in args)))
        return Value(self, name)

    def __getattr__(self, op: str):
        if op.startswith("_"):
            raise AttributeError(op)

        def emit(*args, name: Optional[str] = None) -> Value:
            return self.op(op, *args, name=name)

        emit.__name__ = op
        return emit

    def output(self, *values: Value) -> None:
        """Marks ``values`` as the fusion's outputs."""
        self._outputs.extend(self._arg(v) for v in values)

    def schedule(self, value: Value, *steps: str) -> None:
        """``schedule NAME { step; step }``: the steps as the format writes them
        (``"outer_split(0, s) -> Stream"``, ``"mesh = m"``, ...)."""
        self._schedules.append("schedule %s { %s }" % (self._arg(value), "; ".join(steps)))

    def text(self) -> str:
        """The fusion as ``.weave`` text."""
        params = []
        for k, v in self._params.items():
            p = k + (": " + self._roles[k] if k in self._roles else "")
            params.append(p if v is None else "%s = %d" % (p, v))
        body = list(self._lines)
        if self._outputs:
            body.append("output " + ", ".join(self._outputs))
        body += self._schedules
        return "fusion %s(%s) {\n%s\n}\n" % (
            self._name,
            ", ".join(params),
            "\n".join("  " + line for line in body),
        )

    def build(self, **overrides: int):
        """Loads the text (:func:`streamweave.loads`, with parameter overrides): a
        :class:`streamweave.Fusion`, or :class:`streamweave.StreamweaveError` naming the place
        in :meth:`text`."""
        from . import loads

        return loads(self.text(), file="<builder %s>" % self._name, **overrides)
