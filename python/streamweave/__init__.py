"""streamweave from Python: load a fusion, compile it, run it on NumPy arrays.

A fusion is one global tensor program (``.weave`` text) whose axes are split across devices
(``DIDx``) and stream chunks (``Stream``). :func:`load` reads one, :meth:`Fusion.compile`
lowers it to a host program (:class:`Executable`), and :meth:`Executable.run` runs that on
the CPU backend with simulated ranks (one thread per rank), on global NumPy arrays, returning
the global outputs as NumPy arrays::

    import numpy as np, streamweave as sw
    exe = sw.load("tests/scenarios/row_parallel_linear.weave", t=8, h=4, d=2, s=2).compile()
    x, w = (np.random.rand(*t.shape).astype(np.float32) for t in exe.inputs)
    y = exe.run({"inp": x, "w": w}, ranks=2).outputs["out"]

Dtypes: ``f32``, ``f64``, ``i64`` and ``bool`` tensors map to the NumPy dtype of the same
name. ``bf16`` has no NumPy dtype: a bf16 input is given as any float array and rounded to
bf16 (round to nearest even) on the way in, and a bf16 output comes back as a ``float32``
array holding bf16 values exactly (an explicit float32 round trip). ``f16`` maps to
``float16``.

Every failure raises :class:`StreamweaveError` with the message the command line prints:
``file:line:col`` for the text, the tensor for shapes, the rank for a run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _native
from ._native import StreamweaveError

__all__ = [
    "StreamweaveError",
    "Fusion",
    "Executable",
    "TensorSpec",
    "RunResult",
    "load",
    "loads",
]

_NUMPY_OF = {
    "f32": np.float32,
    "f64": np.float64,
    "i64": np.int64,
    "bool": np.bool_,
    "f16": np.float16,
    "bf16": np.float32,
}


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a compiled program: its name, dtype and global shape."""

    name: str
    dtype: str
    shape: Tuple[int, ...]


@dataclass(frozen=True)
class RunResult:
    """What :meth:`Executable.run` returns.

    ``outputs`` maps each output's name to its global value; ``passed`` says whether every
    rank matched the f64 reference (``True`` when the check was off), ``max_abs_error`` is
    the largest difference from it, ``races`` the stream races the checker found, and
    ``trace`` the Chrome trace JSON of the run when asked for.
    """

    outputs: Dict[str, np.ndarray]
    passed: bool
    max_abs_error: float
    races: int
    trace: Optional[str]


class Executable:
    """A compiled program: its host program (``str()`` prints it) and signature."""

    def __init__(self, native: "_native.NativeExecutable") -> None:
        self._native = native

    def __str__(self) -> str:
        return self._native.program_text()

    def __repr__(self) -> str:
        names = ", ".join(t.name for t in self.inputs)
        return f"<streamweave.Executable ({names}) -> ({', '.join(t.name for t in self.outputs)})>"

    @property
    def inputs(self) -> List[TensorSpec]:
        """The inputs, in signature order."""
        return [TensorSpec(n, d, tuple(s)) for n, d, s in self._native.inputs()]

    @property
    def outputs(self) -> List[TensorSpec]:
        """The outputs, in signature order."""
        return [TensorSpec(n, d, tuple(s)) for n, d, s in self._native.outputs()]

    @property
    def min_ranks(self) -> int:
        """The smallest number of ranks the program runs on."""
        return self._native.min_ranks()

    def run(
        self,
        inputs: Mapping[str, np.ndarray],
        *,
        ranks: Optional[int] = None,
        check: bool = True,
        races: bool = False,
        trace: Union[bool, str, "os.PathLike[str]"] = False,
        streams: int = 2,
        timeout_secs: float = 60.0,
    ) -> RunResult:
        """Runs the program on the CPU backend with ``ranks`` simulated ranks (default: the
        fewest it needs) on the named global inputs.

        ``check`` compares every rank's outputs with the f64 reference, ``races`` runs the
        stream race checker, and ``trace`` records a timeline: ``True`` returns the Chrome
        trace JSON in the result, a path also writes it there. Each input must have the
        global shape of its signature entry.
        """
        given = []
        for name, value in inputs.items():
            spec = next((t for t in self.inputs if t.name == name), None)
            if spec is None:
                raise StreamweaveError(
                    f"input `{name}`: the program has no such input "
                    f"(it takes {', '.join(t.name for t in self.inputs)})"
                )
            array = np.ascontiguousarray(np.asarray(value), dtype=np.float64)
            given.append((name, spec.dtype, list(array.shape), array.tobytes()))
        outputs, passed, max_error, race_count, trace_json = self._native.run(
            given,
            ranks=self.min_ranks if ranks is None else ranks,
            check=check,
            races=races,
            trace=bool(trace),
            streams=streams,
            timeout_secs=timeout_secs,
        )
        if trace and not isinstance(trace, bool) and trace_json is not None:
            with open(trace, "w", encoding="utf-8") as f:
                f.write(trace_json)
        values = {
            name: np.frombuffer(data, dtype=np.float64).reshape(shape).astype(_NUMPY_OF[dtype])
            for name, dtype, shape, data in outputs
        }
        return RunResult(values, passed, max_error, race_count, trace_json)


class Fusion:
    """A loaded fusion; ``str()`` prints it as ``.weave`` text."""

    def __init__(self, native: "_native.NativeFusion") -> None:
        self._native = native

    def __str__(self) -> str:
        return self._native.text()

    def __repr__(self) -> str:
        return f"<streamweave.Fusion {self._native.name()}>"

    @property
    def name(self) -> str:
        """The fusion's name."""
        return self._native.name()

    def compile(self, *, devices: Optional[int] = None) -> Executable:
        """Lowers the fusion with the standard pipeline; ``devices`` sets the mesh size of a
        program that leaves it to the runner (a ``d: mesh`` parameter)."""
        return Executable(self._native.compile(devices))

    def dump(
        self,
        passes: Optional[str] = "default",
        *,
        print_before: Sequence[str] = (),
        print_after: Sequence[str] = (),
    ) -> str:
        """Runs the pass pipeline ``passes`` (``"default"``, ``"a,b,c"`` or edits
        ``"+x,-y"``) and returns the IR printed before/after the passes named (or
        ``"all"``), then the IR it leaves: what ``weave dump`` prints."""
        return self._native.dump(passes, list(print_before), list(print_after))


def load(path: Union[str, "os.PathLike[str]"], **params: int) -> Fusion:
    """Loads the fusion in the ``.weave`` file ``path``, overriding parameters by keyword
    (``load("f.weave", t=8, s=2)``)."""
    return Fusion(_native.load_file(os.fspath(path), list(params.items())))


def loads(source: str, *, file: str = "<string>", **params: int) -> Fusion:
    """Loads a fusion from ``.weave`` text; ``file`` names it in error messages."""
    return Fusion(_native.load_source(file, source, list(params.items())))
