"""streamweave from Python: load a fusion, compile it, run it on NumPy arrays.

A fusion is one global tensor program (``.weave`` text) whose axes are split across devices
(``DIDx``) and stream chunks (``Stream``). :func:`load` reads one, :meth:`Fusion.compile`
lowers it to a host program (:class:`Executable`), and :meth:`Executable.run` runs that on
the CPU backend with simulated ranks (one thread per rank), on global NumPy arrays, returning
the global outputs as NumPy arrays::

    import numpy as np, streamweave as sw
    exe = sw.examples.load("row_parallel_linear", t=8, h=4, d=2, s=2).compile()
    x, w = (np.random.rand(*t.shape).astype(np.float32) for t in exe.inputs)
    y = exe.run({"inp": x, "w": w}, ranks=2).outputs["out"]

Arrays cross in place, in their own dtype: an input's bytes are read once, from the array's
own memory, into the tensor the ranks share (a C-contiguous little-endian array is not
copied on the Python side; another is made one first), and each output comes back as a
NumPy array over the bytes Rust wrote, in the output's dtype. Anything that exports DLPack
(``__dlpack__``: a PyTorch CPU tensor, a JAX array, a NumPy array) is taken through
``np.from_dlpack``, without a copy.

Dtypes: ``f32``, ``f64``, ``f16``, ``i64`` and ``bool`` tensors map to the NumPy dtype of
the same name (``float16`` for ``f16``), and an input must have exactly its dtype: its values
cross into Rust as they are, and another dtype, or a different kind (an ``int64`` array for
an ``f32`` input, a ``float64`` array for an ``f32`` input, any complex array), raises
:class:`DTypeError` (a ``TypeError`` and a :class:`StreamweaveError`) naming the input and
both dtypes, as the Rust API refuses it (so does a CUDA tensor of another dtype on GPUs).
``bf16`` is ``ml_dtypes.bfloat16`` (:data:`BFLOAT16`) where ``ml_dtypes`` is installed: a
bf16 input given as a ``bfloat16`` array is taken as it is, and a bf16 output comes back as a
``bfloat16`` array (bf16 in, bf16 out); a bf16 input may also be any float array, rounded to
bf16 (round to nearest even) on the way in, and without ``ml_dtypes`` a bf16 output comes
back as a ``float32`` array holding the bf16 values exactly. Plain Python values (numbers,
nested lists) have no dtype: they take the input's dtype when their kind fits (floats for a
float input, ints for ``i64``, bools for ``bool``). ``i64`` values cross exactly; the CPU
backend computes in ``f64``, so an ``i64`` input or output of magnitude 2^53 or more raises
:class:`ArgumentValueError` rather than being rounded (2^53 + 1 would come back as 2^53).

On GPUs, :meth:`Executable.cuda` opens a session (one GPU per rank in this process, or this
process as one rank under ``torchrun``) that runs the program on PyTorch CUDA tensors (or any
CUDA tensor that exports DLPack, taken through ``torch.from_dlpack``): each rank's local
shards go in and its output shards come back as PyTorch tensors, without a copy, ordered on
PyTorch's current stream like any PyTorch operation::

    import torch, streamweave as sw
    exe = sw.examples.load("softmax", t=4096, h=4096, s=4).compile()
    gpu = exe.cuda()                       # rank 0 on cuda:0
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    y = gpu({"x": x}).outputs["out"]       # a torch.Tensor on cuda:0, queued after x

Errors: every failure raises a :class:`StreamweaveError` that is also the built-in kind it
is (:mod:`streamweave._errors` lists them): :class:`DTypeError` and :class:`ArgumentTypeError`
are ``TypeError`` subclasses, :class:`ShapeError`, :class:`FusionError` and
:class:`ArgumentValueError` ``ValueError`` ones, :class:`InputNameError` a ``KeyError``,
:class:`FusionFileNotFoundError` a ``FileNotFoundError`` and :class:`RunError` a
``RuntimeError``; the message is the one the command line prints: ``file:line:col`` for the
text, the tensor for shapes, the rank for a run.

Defaults: :data:`DEFAULTS` holds the run options a call leaves out, read from the Rust
crate's ``RunOptions::default()`` so that both APIs share them: no reference check
(``check=False``: it costs a global f64 evaluation on the host; pass ``check=True`` to
compare), the stream race checker on (``races=True``, on the CPU backend), no trace, 2
streams and a 30 s timeout.

Examples: :mod:`streamweave.examples` ships ``.weave`` programs with the package
(``sw.examples.load("row_parallel_linear", t=8)``), so the snippets run from any directory.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _native
from ._errors import (
    ArgumentTypeError,
    ArgumentValueError,
    DTypeError,
    FusionError,
    FusionFileNotFoundError,
    InputNameError,
    RunError,
    ShapeError,
    StreamweaveError,
)
from .builder import Builder, Mesh, Value
from . import examples

__version__: str = _native.__version__
"""The package's version: the Rust crates' (``CARGO_PKG_VERSION``), which the wheel's
metadata carries too."""

__all__ = [
    "__version__",
    "StreamweaveError",
    "DTypeError",
    "ArgumentTypeError",
    "ArgumentValueError",
    "ShapeError",
    "InputNameError",
    "FusionError",
    "FusionFileNotFoundError",
    "RunError",
    "Builder",
    "Mesh",
    "Value",
    "Fusion",
    "Executable",
    "CudaRunner",
    "CudaResult",
    "TensorSpec",
    "RunResult",
    "RunDefaults",
    "DEFAULTS",
    "BFLOAT16",
    "examples",
    "load",
    "loads",
]


@dataclass(frozen=True)
class RunDefaults:
    """The options a run leaves out: ``RunOptions::default()`` of the Rust crate, read when
    the package loads (:data:`DEFAULTS`)."""

    check: bool
    """Compare every rank's outputs with the f64 reference evaluation (Rust: ``check``)."""
    races: bool
    """Run the stream race checker (Rust: ``check_races``)."""
    trace: bool
    """Record a timeline (Rust: ``trace``)."""
    streams: int
    """The size of each rank's stream pool (Rust: ``streams``)."""
    timeout_secs: float
    """How long a stream or collective waits, and the whole run may take (Rust:
    ``timeout``)."""
    tune_secs: float
    """The budget of a GPU session's tuning on its first repeated call; 0: never (Rust:
    ``gpu.tune``)."""


_RUST_DEFAULTS = _native.run_defaults()
DEFAULTS = RunDefaults(
    check=bool(_RUST_DEFAULTS["check"]),
    races=bool(_RUST_DEFAULTS["races"]),
    trace=bool(_RUST_DEFAULTS["trace"]),
    streams=int(_RUST_DEFAULTS["streams"]),
    timeout_secs=float(_RUST_DEFAULTS["timeout_secs"]),
    tune_secs=float(_RUST_DEFAULTS["tune_secs"]),
)
"""The defaults of :meth:`Executable.run` and :meth:`Executable.cuda`, shared with Rust."""


def _bfloat16() -> "Optional[np.dtype[Any]]":
    try:
        import ml_dtypes
    except ImportError:
        return None
    dtype: "np.dtype[Any]" = np.dtype(ml_dtypes.bfloat16)
    return dtype


BFLOAT16: Optional["np.dtype[Any]"] = _bfloat16()
"""NumPy's dtype for bf16 (``ml_dtypes.bfloat16``) when ``ml_dtypes`` is installed, else
``None``: bf16 outputs come back in it, or as ``float32`` arrays holding bf16 values without
it."""

_NUMPY_OF: Dict[str, Any] = {
    "f32": np.float32,
    "f64": np.float64,
    "i64": np.int64,
    "bool": np.bool_,
    "f16": np.float16,
    "bf16": np.float32,
}


# The NumPy kind (``dtype.kind``) of the values each dtype takes from plain Python values.
_KIND_OF = {"f32": "f", "f64": "f", "f16": "f", "bf16": "f", "i64": "i", "bool": "b"}


def _from_dlpack(name: str, value: Any) -> "np.ndarray[Any, Any]":
    """A NumPy view of a tensor that exports DLPack (no copy); a device tensor is refused
    (it runs through :meth:`Executable.cuda`)."""
    device = getattr(value, "__dlpack_device__", None)
    if device is not None and device()[0] not in (1, 3):  # kDLCPU, kDLCUDAHost
        raise ArgumentTypeError(
            "input `%s`: a device tensor (DLPack device %r) runs on GPUs through "
            "Executable.cuda(); run() takes host arrays" % (name, tuple(device()))
        )
    try:
        return np.from_dlpack(value)
    except (BufferError, TypeError, RuntimeError) as e:
        raise ArgumentTypeError(
            "input `%s`: %s exports DLPack that NumPy cannot view (%s)"
            % (name, type(value).__name__, e)
        ) from e


def _input_array(name: str, spec: "TensorSpec", value: Any) -> "np.ndarray[Any, Any]":
    """``value`` as a C-contiguous little-endian array of its own dtype (no conversion but a
    plain Python value's, to the input's dtype when its kind fits; no copy of an array that
    already is one), of the input's shape (:class:`ShapeError` otherwise); the Rust side
    checks the dtype against the signature and raises :class:`DTypeError` on a mismatch."""
    if isinstance(value, (bool, int, float, complex, list, tuple)):
        # Plain Python values have no dtype: NumPy's guess says their kind.
        guess = np.asarray(value)
        if guess.dtype.kind == _KIND_OF[spec.dtype]:
            target = np.float64 if spec.dtype == "bf16" else _NUMPY_OF[spec.dtype]
            try:
                value = np.asarray(value, dtype=target)
            except OverflowError as e:
                raise DTypeError(
                    "input `%s`: the values do not fit %s (%s)" % (name, spec.dtype, e)
                ) from e
        else:
            value = guess
    elif not isinstance(value, np.ndarray) and hasattr(value, "__dlpack__"):
        value = _from_dlpack(name, value)
    # `np.asarray(.., order="C")` keeps a 0-d input 0-d (`ascontiguousarray` would make it
    # 1-d) and copies only an array that is not C-contiguous; a big-endian array is turned
    # little-endian (the same values).
    array = np.asarray(value, order="C")
    if array.dtype.byteorder == ">" or (array.dtype.byteorder == "=" and not np.little_endian):
        array = array.astype(array.dtype.newbyteorder("<"))
    if array.shape != spec.shape:
        raise ShapeError(
            "input `%s`: has shape %s but the program takes %s"
            % (name, list(array.shape), list(spec.shape))
        )
    return array


def _output_array(dtype: str, shape: Sequence[int], data: bytearray) -> "np.ndarray[Any, Any]":
    """The NumPy array over the bytes of an output (no copy): bf16 bits as ``bfloat16``
    (:data:`BFLOAT16`), or widened exactly to ``float32`` without ``ml_dtypes``."""
    if dtype == "bfloat16":
        bits = np.frombuffer(data, dtype="<u2")
        if BFLOAT16 is not None:
            return bits.view(BFLOAT16).reshape(shape)
        return (bits.astype(np.uint32) << 16).view(np.float32).reshape(shape)
    return np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder("<")).reshape(shape)


def _short(value: Any) -> str:
    """An array as ``float32[8, 4]`` (a repr that does not print the values)."""
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None or dtype is None:
        return type(value).__name__
    name = str(dtype).replace("torch.", "")
    return "%s[%s]" % (name, ", ".join(str(n) for n in shape))


def _write_trace(path: "Union[str, os.PathLike[str]]", trace: str, svg: str) -> Optional[str]:
    """Writes the Chrome trace at ``path`` and, when ``path`` is a regular file (or nothing
    yet), its SVG timeline beside it with the extension ``.svg``, as ``weave run --trace``
    does; returns the SVG's path (``None`` for a trace into a device or FIFO)."""
    path = os.fspath(path)
    is_file = not os.path.exists(path) or os.path.isfile(path)
    with open(path, "w", encoding="utf-8") as f:
        f.write(trace)
    if not is_file:
        return None
    beside = os.path.splitext(path)[0] + ".svg"
    tmp = beside + ".tmp%d" % os.getpid()
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(svg)
    os.replace(tmp, beside)
    return beside


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a compiled program: its name, dtype and global shape."""

    name: str
    dtype: str
    shape: Tuple[int, ...]


@dataclass(frozen=True, repr=False)
class RunResult:
    """What :meth:`Executable.run` returns.

    ``outputs`` maps each output's name to its global value; ``passed`` says whether every
    rank matched the f64 reference (``True`` when the check was off, as it is by default:
    ``checked`` says whether it ran), ``max_abs_error`` is the largest difference from it,
    ``races`` the stream races the checker found, ``trace`` the Chrome trace JSON of the run
    and ``svg`` its SVG timeline when asked for (``trace=``). Its repr shows the outputs'
    dtypes and shapes, not their values.
    """

    outputs: Dict[str, "np.ndarray[Any, Any]"]
    passed: bool
    max_abs_error: float
    races: int
    trace: Optional[str]
    svg: Optional[str] = None
    checked: bool = False

    def __repr__(self) -> str:
        outs = ", ".join("%r: %s" % (k, _short(v)) for k, v in self.outputs.items())
        extra = ""
        if self.trace is not None:
            extra = ", trace=<%d bytes of JSON>" % len(self.trace)
        return "RunResult(outputs={%s}, passed=%r%s, max_abs_error=%g, races=%d%s)" % (
            outs,
            self.passed,
            "" if self.checked else " (unchecked)",
            self.max_abs_error,
            self.races,
            extra,
        )


_TORCH_DTYPES = {
    "bf16": "bfloat16",
    "f16": "float16",
    "f32": "float32",
    "f64": "float64",
    "i64": "int64",
    "bool": "bool",
}


def _current_stream(torch: Any, device: int) -> int:
    """The handle of PyTorch's current stream on ``device`` (0: the default stream)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return int(raw(device))
    return int(torch.cuda.current_stream(device).cuda_stream)


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise RunError("the GPU path needs PyTorch (import torch failed: %s)" % e) from e
    return torch


class CudaResult:
    """What a :class:`CudaRunner` call returns.

    ``outputs`` maps each output's name to this process's shard of it: a ``torch.Tensor``
    when the process runs one rank, else a list with one tensor per local rank (in
    :attr:`CudaRunner.ranks` order). The tensors are queued on PyTorch's current stream, like
    the result of any PyTorch operation. ``issue_us`` is each local rank's host time issuing
    the program (µs); ``races`` counts the stream races found (with ``races=True``);
    ``passed`` and ``max_abs_error`` are the reference check's (``None``/0 without
    ``check=True``, and on launched ranks other than 0); ``trace`` is the Chrome trace JSON
    of the call when the runner traces; ``native_us`` is the host time of the whole native
    call (binding the buffers, ordering against PyTorch's stream, issuing, checking).
    """

    # A plain class with slots: made at every call, it must cost next to nothing.
    __slots__ = ("outputs", "issue_us", "races", "passed", "max_abs_error", "trace", "native_us")

    def __init__(
        self,
        outputs: Dict[str, Any],
        issue_us: List[float],
        races: int,
        passed: Optional[bool],
        max_abs_error: float,
        trace: Optional[str],
        native_us: float,
    ) -> None:
        self.outputs: Dict[str, Any] = outputs
        self.issue_us: List[float] = issue_us
        self.races: int = races
        self.passed: Optional[bool] = passed
        self.max_abs_error: float = max_abs_error
        self.trace: Optional[str] = trace
        self.native_us: float = native_us

    def __repr__(self) -> str:
        return "CudaResult(outputs=%r, issue_us=%r, races=%d, passed=%r, max_abs_error=%g)" % (
            sorted(self.outputs),
            self.issue_us,
            self.races,
            self.passed,
            self.max_abs_error,
        )


class CudaRunner:
    """An executable open on GPUs (see :meth:`Executable.cuda`); call it on PyTorch CUDA
    tensors."""

    def __init__(self, exe: "Executable", native: "_native.NativeSession") -> None:
        torch = _torch()
        self._t = torch
        self._exe = exe
        self._native = native
        # Everything a call needs that does not change between calls, read once.
        self._ranks: List[Tuple[int, int]] = [(r, g) for r, g in native.ranks()]
        self._world = native.world()
        self._config_said = False
        self._specs_in = exe.inputs
        self._specs_out = exe.outputs
        self._names_in = {s.name for s in self._specs_in}
        self._names_out = {s.name for s in self._specs_out}
        self._dtypes = {
            s.name: getattr(torch, _TORCH_DTYPES[s.dtype]) for s in self._specs_in + self._specs_out
        }
        self._local = []
        for rank, device in self._ranks:
            shapes_in, shapes_out = exe._native.local_shapes(rank)
            self._local.append(
                (
                    rank,
                    device,
                    torch.device("cuda", device),
                    [tuple(x) for x in shapes_in],
                    [tuple(x) for x in shapes_out],
                )
            )

    def __repr__(self) -> str:
        return "<streamweave.CudaRunner world %d, (rank, GPU) here %r>" % (
            self.world,
            self.ranks,
        )

    @property
    def ranks(self) -> List[Tuple[int, int]]:
        """``(rank, GPU ordinal)`` of every rank this process runs, in rank order."""
        return list(self._ranks)

    @property
    def world(self) -> int:
        """The number of ranks in the world."""
        return self._world

    @property
    def config(self) -> Optional[str]:
        """The configuration the calls run once the second call tuned (the winner and where
        it came from: ``S=2 K=2 eager, ordered compute (tuned now)``), or why they run the
        program as opened; ``None`` before the second call and in a launched world."""
        return self._native.config()

    def synchronize(self) -> None:
        """Waits until every local GPU has done everything issued so far."""
        self._native.synchronize()

    def _per_rank(self, what: str, name: str, value: Any) -> List[Any]:
        torch = self._t
        count = len(self._ranks)
        if isinstance(value, torch.Tensor) or hasattr(value, "__dlpack__"):
            if count != 1:
                raise ArgumentTypeError(
                    "%s `%s`: this process runs %d ranks, so give a list of %d tensors "
                    "(one shard per rank)" % (what, name, count, count)
                )
            return [value]
        values = list(value)
        if len(values) != count:
            raise ArgumentValueError(
                "%s `%s`: %d tensors were given for the %d rank(s) of this process"
                % (what, name, len(values), count)
            )
        return values

    def _arg(self, what: str, spec: TensorSpec, t: Any, local: Any, shape: Any) -> int:
        """The native argument of tensor ``t`` (its device address), after checking that
        it is what the rank's shard must be; raises naming the tensor and the rank."""
        torch = self._t
        rank, device, dev = local[0], local[1], local[2]
        dtype = self._dtypes[spec.name]
        if (
            type(t) is torch.Tensor
            and t.device == dev
            and t.dtype == dtype
            and t.shape == shape
            and t.is_contiguous()
        ):
            return int(t.data_ptr())
        where = "%s `%s` on rank %d" % (what, spec.name, rank)
        if not isinstance(t, torch.Tensor) and hasattr(t, "__dlpack__"):
            # A CUDA tensor of another library (CuPy, JAX, ...): PyTorch's view of it, no
            # copy, ordered after the producer's stream by the DLPack exchange.
            t = torch.from_dlpack(t)
        if not isinstance(t, torch.Tensor):
            raise ArgumentTypeError(
                "%s: a torch.Tensor (or a tensor exporting DLPack) is needed, not %s"
                % (where, type(t).__name__)
            )
        if t.device != dev:
            raise ArgumentValueError(
                "%s: the tensor is on %s, the rank runs on cuda:%d" % (where, t.device, device)
            )
        if t.dtype != dtype:
            raise DTypeError(
                "%s: the tensor is %s, the program takes %s (%s)" % (where, t.dtype, spec.dtype, dtype)
            )
        if tuple(t.shape) != tuple(shape):
            raise ShapeError(
                "%s: the tensor has shape %s, the rank's shard is %s"
                % (where, tuple(t.shape), tuple(shape))
            )
        if not t.is_contiguous():
            raise ShapeError(
                "%s: the tensor is not contiguous (no copy is made: pass t.contiguous())" % where
            )
        return int(t.data_ptr())

    def __call__(
        self,
        inputs: Mapping[str, object],
        *,
        out: Optional[Mapping[str, object]] = None,
        check: bool = DEFAULTS.check,
    ) -> CudaResult:
        """Runs the program once on this process's ranks: ``inputs`` maps every input's name
        to its local shard (a ``torch.Tensor`` when the process runs one rank, else a list of
        one per rank), contiguous, of the program's dtype, on the rank's GPU. ``out`` may give
        the output tensors to write into (same form); the others are allocated with
        ``torch.empty``. Returns as soon as the work is queued on PyTorch's current stream of
        each GPU; ``check=True`` waits and compares the outputs with the f64 reference."""
        torch = self._t
        if not isinstance(inputs, Mapping):
            raise ArgumentTypeError(
                "inputs: a mapping of input name to tensor is needed, not %s"
                % type(inputs).__name__
            )
        if len(inputs) != len(self._names_in) or not self._names_in.issuperset(inputs):
            for name in inputs:
                if name not in self._names_in:
                    raise InputNameError(
                        "input `%s`: the program has no such input (it takes %s)"
                        % (name, ", ".join(s.name for s in self._specs_in))
                    )
            for s in self._specs_in:
                if s.name not in inputs:
                    raise InputNameError("input `%s`: not given" % s.name)
        out = out or {}
        for name in out:
            if name not in self._names_out:
                raise InputNameError(
                    "output `%s`: the program has no such output (it has %s)"
                    % (name, ", ".join(s.name for s in self._specs_out))
                )
        given_in = [self._per_rank("input", s.name, inputs[s.name]) for s in self._specs_in]
        given_out = [
            self._per_rank("output", s.name, out[s.name]) if s.name in out else None
            for s in self._specs_out
        ]
        calls: List[Tuple[List[int], List[int], int]] = []
        results: List[List[Any]] = [[] for _ in self._specs_out]
        for k, local in enumerate(self._local):
            _, device, dev, shapes_in, shapes_out = local
            ins = [
                self._arg("input", s, given[k], local, shape)
                for s, given, shape in zip(self._specs_in, given_in, shapes_in)
            ]
            outs = []
            for j, (s, shape) in enumerate(zip(self._specs_out, shapes_out)):
                given = given_out[j]
                t = (
                    given[k]
                    if given is not None
                    else torch.empty(shape, dtype=self._dtypes[s.name], device=dev)
                )
                outs.append(self._arg("output", s, t, local, shape))
                results[j].append(t)
            calls.append((ins, outs, _current_stream(torch, device)))
        issue_us, races, passed, max_error, trace, native_us = self._native.run(calls, check=check)
        if not self._config_said:
            config = self._native.config()
            if config is not None:
                self._config_said = True
                sys.stderr.write("streamweave: the calls run %s\n" % config)
        single = len(self._local) == 1
        outputs = {
            s.name: (v[0] if single else v) for s, v in zip(self._specs_out, results)
        }
        return CudaResult(outputs, issue_us, races, passed, max_error, trace, native_us)


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
        inputs: Mapping[str, Any],
        *,
        ranks: Optional[int] = None,
        check: bool = DEFAULTS.check,
        races: bool = DEFAULTS.races,
        trace: Union[bool, str, "os.PathLike[str]"] = DEFAULTS.trace,
        streams: int = DEFAULTS.streams,
        timeout_secs: float = DEFAULTS.timeout_secs,
    ) -> RunResult:
        """Runs the program on the CPU backend with ``ranks`` simulated ranks (default: the
        fewest it needs) on the named global inputs (a mapping of input name to array).

        ``check`` compares every rank's outputs with the f64 reference, ``races`` runs the
        stream race checker, and ``trace`` records a timeline: ``True`` returns the Chrome
        trace JSON (and its SVG timeline) in the result, a path also writes the trace there
        and, as ``weave run --trace`` does, the SVG beside it (``run.json`` ->
        ``run.svg``). The defaults are Rust's (:data:`DEFAULTS`): no reference check, the
        race checker on, 2 streams, a 30 s timeout.

        Each input must have the global shape (:class:`ShapeError` otherwise) and the dtype
        of its signature entry (a :class:`DTypeError`, a ``TypeError``, names the input and
        both dtypes otherwise; see the module's notes on dtypes, bf16 included); an input
        not given, or one the program does not have, raises :class:`InputNameError` (a
        ``KeyError``). Each output comes back in its own dtype.
        """
        if not isinstance(inputs, Mapping):
            raise ArgumentTypeError(
                "inputs: a mapping of input name to array is needed (%s), not %s"
                % (
                    "{" + ", ".join("%r: ..." % t.name for t in self.inputs) + "}",
                    type(inputs).__name__,
                )
            )
        specs = self.inputs
        by_name = {t.name: t for t in specs}
        for name in inputs:
            if name not in by_name:
                raise InputNameError(
                    "input `%s`: the program has no such input (it takes %s)"
                    % (name, ", ".join(t.name for t in specs))
                )
        for t in specs:
            if t.name not in inputs:
                raise InputNameError(
                    "input `%s`: not given (the program takes %s)"
                    % (t.name, ", ".join(t.name for t in specs))
                )
        if isinstance(trace, (str, os.PathLike)) and os.fspath(trace).endswith(".svg"):
            raise ArgumentValueError(
                "trace=%r: the trace is a Chrome trace (JSON) and its SVG timeline is written "
                "beside it with the extension .svg; give the trace another extension "
                "(e.g. .json)" % os.fspath(trace)
            )
        given = []
        for name, value in inputs.items():
            array = _input_array(name, by_name[name], value)
            # The array's own memory, held in `given` for the call (no copy here).
            given.append(
                (name, array.dtype.name, list(array.shape), array.ctypes.data, array.nbytes, array)
            )
        outputs, passed, max_error, race_count, traced = self._native.run(
            given,
            ranks=self.min_ranks if ranks is None else ranks,
            check=check,
            races=races,
            trace=bool(trace),
            streams=streams,
            timeout_secs=timeout_secs,
        )
        trace_json, svg = traced if traced is not None else (None, None)
        if trace_json is not None and svg is not None and not isinstance(trace, bool):
            _write_trace(trace, trace_json, svg)
        values = {
            name: _output_array(dtype, shape, data) for name, dtype, shape, data in outputs
        }
        return RunResult(values, passed, max_error, race_count, trace_json, svg, check)

    def cuda(
        self,
        devices: Optional[Sequence[int]] = None,
        *,
        launched: bool = False,
        streams: int = DEFAULTS.streams,
        races: bool = DEFAULTS.races,
        trace: bool = DEFAULTS.trace,
        timeout_secs: float = DEFAULTS.timeout_secs,
        tune_secs: float = DEFAULTS.tune_secs,
        tune_cache: Optional[str] = None,
    ) -> CudaRunner:
        """Opens the program on GPUs and returns a :class:`CudaRunner` to call on PyTorch
        CUDA tensors (or any CUDA tensor that exports DLPack).

        By default every rank runs in this process, rank ``r`` on GPU ``devices[r]``
        (default: GPUs ``0 .. min_ranks - 1``). With ``launched=True`` this process is one
        rank of the world that ``torchrun`` (or Open MPI, PMI, Slurm) describes in the
        environment, on GPU ``LOCAL_RANK``, and passes its own shards, as nvFuser's
        multi-device API does; every process of the world must open it. Opening joins NCCL
        (seconds, once); each call then costs microseconds on the host. ``races`` asks for
        the stream race checker, ``trace`` records a timeline of every call (and waits for
        it); the defaults are Rust's (:data:`DEFAULTS`).

        The second call tunes the program first, within ``tune_secs`` seconds (0: never), when
        every rank runs in this process and ``streams`` is left at its default: it measures
        chunk counts, pool sizes and the backend's overlap knobs on these GPUs (eager runs on
        NCCL, what a session runs), or takes the winner from ``tune_cache`` (default:
        ``$WEAVE_TUNE_CACHE``; none: the winner lives in this runner), and runs the winner
        from then on; it says on stderr which configuration runs (:attr:`CudaRunner.config`).
        """
        if tune_cache is None:
            tune_cache = os.environ.get("WEAVE_TUNE_CACHE")
        native = self._native.cuda_session(
            None if devices is None else list(devices),
            launched=launched,
            streams=streams,
            races=races,
            trace=trace,
            timeout_secs=timeout_secs,
            tune_secs=tune_secs,
            tune_cache=tune_cache,
        )
        return CudaRunner(self, native)


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

    def compile(
        self, *, devices: Optional[int] = None, chunks: Union[int, str, None] = None
    ) -> Executable:
        """Lowers the fusion with the standard pipeline; ``devices`` sets the mesh size of a
        program that leaves it to the runner (a ``d: mesh`` parameter). ``chunks`` is
        ``weave run --chunks``: a positive count sets the chunk-count parameter, ``"ring"``
        or ``"ring:K"`` compiles the fusion's ring form (its device-reduced GEMMs as reduce
        rings, their steps in ``K`` pieces, and its allgathers as rings); ``None`` keeps the
        fusion's own. A value it does not take raises :class:`ArgumentValueError`, a fusion
        without a ring form :class:`FusionError`."""
        return Executable(self._native.compile(devices, chunks))

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
    (``load("f.weave", t=8, s=2)``). A path that names nothing raises
    :class:`FusionFileNotFoundError` (a ``FileNotFoundError``), text that does not load
    :class:`FusionError` (a ``ValueError``) with its ``file:line:col``; the programs shipped
    with the package load by name with :func:`streamweave.examples.load`."""
    return Fusion(_native.load_file(os.fspath(path), list(params.items())))


def loads(source: str, *, file: str = "<string>", **params: int) -> Fusion:
    """Loads a fusion from ``.weave`` text; ``file`` names it in error messages."""
    return Fusion(_native.load_source(file, source, list(params.items())))
