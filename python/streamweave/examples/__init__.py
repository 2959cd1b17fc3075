"""Example programs shipped with the package, so that the snippets of the README and the
docstrings run from any directory::

    import streamweave as sw
    sw.examples.names()                       # ['add_per_stream', 'column_parallel_linear', ...]
    exe = sw.examples.load("row_parallel_linear", t=8, h=4, d=2, s=2).compile()
    print(sw.examples.text("softmax"))        # the .weave text
    sw.examples.path("softmax")               # its file, to pass to `weave run`

Each is the program of the same name in the repository's ``tests/scenarios`` (the tests
check that they load to the same fusion).
"""

from __future__ import annotations

import pathlib
from typing import TYPE_CHECKING, List

if TYPE_CHECKING:
    from .. import Fusion

__all__ = ["names", "path", "text", "load"]

_HERE = pathlib.Path(__file__).resolve().parent


def names() -> List[str]:
    """The names of the example programs, sorted."""
    return sorted(p.stem for p in _HERE.glob("*.weave"))


def path(name: str) -> pathlib.Path:
    """The ``.weave`` file of the example ``name`` (``KeyError``, a
    :class:`streamweave.InputNameError`, naming the examples when there is none)."""
    file = _HERE / (name + ".weave")
    if name not in names():
        from .._errors import InputNameError

        raise InputNameError(
            "example `%s`: there is no such example (there are: %s)" % (name, ", ".join(names()))
        )
    return file


def text(name: str) -> str:
    """The ``.weave`` text of the example ``name``."""
    return path(name).read_text(encoding="utf-8")


def load(name: str, **params: int) -> "Fusion":
    """Loads the example ``name`` as :func:`streamweave.load` loads a file, overriding
    parameters by keyword (``load("softmax", t=4, h=8)``)."""
    from .. import load as load_file

    return load_file(path(name), **params)
