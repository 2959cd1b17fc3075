"""The exceptions of streamweave: every one is a :class:`StreamweaveError` and the built-in
kind it is, so ``except ValueError`` (or ``TypeError``, ``KeyError``, ``FileNotFoundError``,
``RuntimeError``) catches it as it would NumPy's. The extension module raises these classes
(it imports this module), so the Rust and Python sides raise the same ones.

* :class:`StreamweaveError` (an ``Exception``): the base of all of them;
* :class:`DTypeError` (``TypeError``): a dtype the program (or the builder) does not take;
* :class:`ArgumentTypeError` (``TypeError``): an argument of the wrong Python type;
* :class:`ArgumentValueError` (``ValueError``): an option or a value out of range;
* :class:`ShapeError` (``ValueError``): a tensor of another shape;
* :class:`InputNameError` (``KeyError``): an input or output the program does not have, or
  one not given;
* :class:`FusionError` (``ValueError``): a fusion that does not load or compile;
* :class:`FusionFileNotFoundError` (``FileNotFoundError``): a ``.weave`` path that names
  nothing;
* :class:`RunError` (``RuntimeError``): a run that fails (a rank, a timeout).
"""

from __future__ import annotations

import errno
from typing import Optional

__all__ = [
    "StreamweaveError",
    "DTypeError",
    "ArgumentTypeError",
    "ArgumentValueError",
    "ShapeError",
    "InputNameError",
    "FusionError",
    "FusionFileNotFoundError",
    "RunError",
]


class StreamweaveError(Exception):
    """A fusion that does not load or compile, inputs that do not fit, or a run that fails;
    the message names the place (file:line:col, tensor, rank). Every streamweave exception
    is one, and also the built-in kind it is (see the subclasses)."""

    __module__ = "streamweave"


class DTypeError(StreamweaveError, TypeError):
    """A dtype the program does not take (an input of another dtype or kind: the message
    names the input and both dtypes), or a dtype the builder does not know."""

    __module__ = "streamweave"


class ArgumentTypeError(StreamweaveError, TypeError):
    """An argument of the wrong Python type (inputs given as a list rather than a mapping,
    an op argument that is neither a tensor nor a list)."""

    __module__ = "streamweave"


class ArgumentValueError(StreamweaveError, ValueError):
    """An option or a value out of its range (a negative timeout, too few ranks, an ``i64``
    beyond ±(2^53 - 1), an op name the format does not have)."""

    __module__ = "streamweave"


class ShapeError(StreamweaveError, ValueError):
    """A tensor whose shape is not the one the program takes; the message names it and both
    shapes."""

    __module__ = "streamweave"


class InputNameError(StreamweaveError, KeyError):
    """An input (or output) the program does not have, or one it needs that was not given;
    the message names it and the ones the program has."""

    __module__ = "streamweave"

    def __str__(self) -> str:
        # KeyError's str() is the repr of its key; this one is a sentence.
        return str(self.args[0]) if self.args else ""


class FusionError(StreamweaveError, ValueError):
    """A fusion that does not load (text, schedule, verifier: ``file:line:col``), a pipeline
    that fails, or a builder mistake (a name used twice)."""

    __module__ = "streamweave"


class FusionFileNotFoundError(StreamweaveError, FileNotFoundError):
    """A ``.weave`` path that names nothing (``errno`` is ``ENOENT``)."""

    __module__ = "streamweave"

    def __init__(self, message: str, filename: Optional[str] = None) -> None:
        super().__init__(message)
        self.errno = errno.ENOENT
        self.strerror = message
        self.filename = filename

    def __str__(self) -> str:
        return self.strerror or ""


class RunError(StreamweaveError, RuntimeError):
    """A run that fails: a rank's error, a timeout, a failed collective (the message names
    the rank)."""

    __module__ = "streamweave"
