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

Dtypes: ``f32``, ``f64``, ``f16``, ``i64`` and ``bool`` tensors map to the NumPy dtype of
the same name (``float16`` for ``f16``), and an input must have exactly its dtype: its values
cross into Rust as they are, and another dtype, or a different kind (an ``int64`` array for
an ``f32`` input, a ``float64`` array for an ``f32`` input, any complex array), raises
:class:`DTypeError` (a ``TypeError`` and a :class:`StreamweaveError`) naming the input and
both dtypes, as the Rust API refuses it (so does a CUDA tensor of another dtype on GPUs). ``bf16`` has no
NumPy dtype: a bf16 input is given as a ``bfloat16`` array (``ml_dtypes``), taken as it is,
or as any float array, rounded to bf16 (round to nearest even) on the way in; a bf16 output
comes back as a ``float32`` array holding bf16 values exactly. Plain Python values (numbers,
nested lists) have no dtype: they take the input's dtype when their kind fits (floats for a
float input, ints for ``i64``, bools for ``bool``). The CPU backend computes in ``f64``, so
an ``i64`` input or output of magnitude 2^53 or more raises :class:`StreamweaveError` rather
than being rounded (2^53 + 1 would come back as 2^53).

On GPUs, :meth:`Executable.cuda` opens a session (one GPU per rank in this process, or this
process as one rank under ``torchrun``) that runs the program on PyTorch CUDA tensors: each
rank's local shards go in and its output shards come back as PyTorch tensors, without a
copy, ordered on PyTorch's current stream like any PyTorch operation::

    import torch, streamweave as sw
    exe = sw.load("tests/scenarios/kernels/softmax.weave", t=4096, h=4096, s=4).compile()
    gpu = exe.cuda()                       # rank 0 on cuda:0
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    y = gpu({"x": x}).outputs["out"]       # a torch.Tensor on cuda:0, queued after x

Every failure raises :class:`StreamweaveError` (for a dtype, its subclass
:class:`DTypeError`, also a ``TypeError``) with the message the command line prints:
``file:line:col`` for the text, the tensor for shapes, the rank for a run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _native
from ._native import DTypeError, StreamweaveError
from .builder import Builder, Mesh, Value

__all__ = [
    "StreamweaveError",
    "DTypeError",
    "Builder",
    "Mesh",
    "Value",
    "Fusion",
    "Executable",
    "CudaRunner",
    "CudaResult",
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


# The NumPy kind (``dtype.kind``) of the values each dtype takes from plain Python values.
_KIND_OF = {"f32": "f", "f64": "f", "f16": "f", "bf16": "f", "i64": "i", "bool": "b"}


def _input_array(name: str, spec: "TensorSpec", value) -> np.ndarray:
    """``value`` as a C-contiguous little-endian array of its own dtype (no conversion but a
    plain Python value's, to the input's dtype when its kind fits); the Rust side checks the
    dtype against the signature and raises :class:`DTypeError` on a mismatch."""
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
    # `np.asarray(.., order="C")` keeps a 0-d input 0-d (`ascontiguousarray` would make it
    # 1-d); a big-endian array is turned little-endian (the same values).
    array = np.asarray(value, order="C")
    if array.dtype.byteorder == ">" or (array.dtype.byteorder == "=" and not np.little_endian):
        array = array.astype(array.dtype.newbyteorder("<"))
    return array



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


_TORCH_DTYPES = {
    "bf16": "bfloat16",
    "f16": "float16",
    "f32": "float32",
    "f64": "float64",
    "i64": "int64",
    "bool": "bool",
}


def _current_stream(torch, device: int) -> int:
    """The handle of PyTorch's current stream on ``device`` (0: the default stream)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(device)
    return torch.cuda.current_stream(device).cuda_stream


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise StreamweaveError("the GPU path needs PyTorch (import torch failed: %s)" % e) from e
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

    def __init__(self, outputs, issue_us, races, passed, max_abs_error, trace, native_us):
        self.outputs: Dict[str, object] = outputs
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
        self._ranks = [tuple(r) for r in native.ranks()]
        self._world = native.world()
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

    def synchronize(self) -> None:
        """Waits until every local GPU has done everything issued so far."""
        self._native.synchronize()

    def _per_rank(self, what: str, name: str, value) -> list:
        torch = self._t
        count = len(self._ranks)
        if isinstance(value, torch.Tensor):
            if count != 1:
                raise StreamweaveError(
                    "%s `%s`: this process runs %d ranks, so give a list of %d tensors "
                    "(one shard per rank)" % (what, name, count, count)
                )
            return [value]
        values = list(value)
        if len(values) != count:
            raise StreamweaveError(
                "%s `%s`: %d tensors were given for the %d rank(s) of this process"
                % (what, name, len(values), count)
            )
        return values

    def _arg(self, what: str, spec: TensorSpec, t, local, shape) -> tuple:
        """The native argument of tensor ``t`` (its address and bytes), after checking that
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
            return t.data_ptr()
        where = "%s `%s` on rank %d" % (what, spec.name, rank)
        if not isinstance(t, torch.Tensor):
            raise StreamweaveError("%s: a torch.Tensor is needed, not %s" % (where, type(t).__name__))
        if t.device != dev:
            raise StreamweaveError(
                "%s: the tensor is on %s, the rank runs on cuda:%d" % (where, t.device, device)
            )
        if t.dtype != dtype:
            raise DTypeError(
                "%s: the tensor is %s, the program takes %s (%s)" % (where, t.dtype, spec.dtype, dtype)
            )
        if tuple(t.shape) != tuple(shape):
            raise StreamweaveError(
                "%s: the tensor has shape %s, the rank's shard is %s"
                % (where, tuple(t.shape), tuple(shape))
            )
        if not t.is_contiguous():
            raise StreamweaveError(
                "%s: the tensor is not contiguous (no copy is made: pass t.contiguous())" % where
            )
        return t.data_ptr()

    def __call__(
        self,
        inputs: Mapping[str, object],
        *,
        out: Optional[Mapping[str, object]] = None,
        check: bool = False,
    ) -> CudaResult:
        """Runs the program once on this process's ranks: ``inputs`` maps every input's name
        to its local shard (a ``torch.Tensor`` when the process runs one rank, else a list of
        one per rank), contiguous, of the program's dtype, on the rank's GPU. ``out`` may give
        the output tensors to write into (same form); the others are allocated with
        ``torch.empty``. Returns as soon as the work is queued on PyTorch's current stream of
        each GPU; ``check=True`` waits and compares the outputs with the f64 reference."""
        torch = self._t
        if len(inputs) != len(self._names_in) or not self._names_in.issuperset(inputs):
            for name in inputs:
                if name not in self._names_in:
                    raise StreamweaveError(
                        "input `%s`: the program has no such input (it takes %s)"
                        % (name, ", ".join(s.name for s in self._specs_in))
                    )
            for s in self._specs_in:
                if s.name not in inputs:
                    raise StreamweaveError("input `%s`: not given" % s.name)
        out = out or {}
        for name in out:
            if name not in self._names_out:
                raise StreamweaveError(
                    "output `%s`: the program has no such output (it has %s)"
                    % (name, ", ".join(s.name for s in self._specs_out))
                )
        given_in = [self._per_rank("input", s.name, inputs[s.name]) for s in self._specs_in]
        given_out = [
            self._per_rank("output", s.name, out[s.name]) if s.name in out else None
            for s in self._specs_out
        ]
        calls, results = [], [[] for _ in self._specs_out]
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
        global shape and the dtype of its signature entry (a :class:`DTypeError`, a
        ``TypeError``, names the input
        and both dtypes otherwise; see the module's notes on dtypes, bf16 included); each
        output comes back in its own dtype.
        """
        given = []
        for name, value in inputs.items():
            spec = next((t for t in self.inputs if t.name == name), None)
            if spec is None:
                raise StreamweaveError(
                    f"input `{name}`: the program has no such input "
                    f"(it takes {', '.join(t.name for t in self.inputs)})"
                )
            array = _input_array(name, spec, value)
            given.append((name, array.dtype.name, list(array.shape), array.tobytes()))
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
            name: np.frombuffer(data, dtype=np.dtype(_NUMPY_OF[dtype]).newbyteorder("<"))
            .reshape(shape)
            .astype(_NUMPY_OF[dtype])
            for name, dtype, shape, data in outputs
        }
        return RunResult(values, passed, max_error, race_count, trace_json)

    def cuda(
        self,
        devices: Optional[Sequence[int]] = None,
        *,
        launched: bool = False,
        streams: int = 2,
        races: bool = False,
        trace: bool = False,
        timeout_secs: float = 60.0,
    ) -> CudaRunner:
        """Opens the program on GPUs and returns a :class:`CudaRunner` to call on PyTorch
        CUDA tensors.

        By default every rank runs in this process, rank ``r`` on GPU ``devices[r]``
        (default: GPUs ``0 .. min_ranks - 1``). With ``launched=True`` this process is one
        rank of the world that ``torchrun`` (or Open MPI, PMI, Slurm) describes in the
        environment, on GPU ``LOCAL_RANK``, and passes its own shards, as nvFuser's
        multi-device API does; every process of the world must open it. Opening joins NCCL
        (seconds, once); each call then costs microseconds on the host. ``races`` runs the
        stream race checker at every call, ``trace`` records a timeline of every call (and
        waits for it).
        """
        native = self._native.cuda_session(
            None if devices is None else list(devices),
            launched=launched,
            streams=streams,
            races=races,
            trace=trace,
            timeout_secs=timeout_secs,
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
