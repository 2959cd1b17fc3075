"""Type stubs of the extension module `streamweave._native` (crates/python)."""

from typing import List, Optional, Tuple

class StreamweaveError(Exception):
    """A fusion that does not load or compile, inputs that do not fit, or a run that fails."""

class DTypeError(StreamweaveError, TypeError):
    """An input of a dtype (or kind) the program does not take."""

class NativeFusion:
    def text(self) -> str: ...
    def name(self) -> str: ...
    def compile(self, devices: Optional[int] = None) -> NativeExecutable: ...
    def dump(
        self,
        passes: Optional[str] = None,
        print_before: List[str] = ...,
        print_after: List[str] = ...,
    ) -> str: ...

class NativeExecutable:
    def program_text(self) -> str: ...
    def inputs(self) -> List[Tuple[str, str, List[int]]]: ...
    def outputs(self) -> List[Tuple[str, str, List[int]]]: ...
    def min_ranks(self) -> int: ...
    def local_shapes(self, rank: int) -> Tuple[List[List[int]], List[List[int]]]: ...
    def cuda_session(
        self,
        devices: Optional[List[int]] = None,
        launched: bool = False,
        streams: int = 2,
        races: bool = False,
        trace: bool = False,
        timeout_secs: float = 60.0,
    ) -> NativeSession: ...
    def run(
        self,
        # (name, NumPy dtype name, shape, little-endian bytes of that dtype)
        inputs: List[Tuple[str, str, List[int], bytes]],
        ranks: int = 1,
        check: bool = True,
        races: bool = False,
        trace: bool = False,
        streams: int = 2,
        timeout_secs: float = 60.0,
    ) -> Tuple[List[Tuple[str, str, List[int], bytes]], bool, float, int, Optional[str]]: ...

class NativeSession:
    """Private: `run` takes raw device addresses; use `streamweave.CudaRunner`."""

    def ranks(self) -> List[Tuple[int, int]]: ...
    def world(self) -> int: ...
    def run(
        self,
        calls: List[Tuple[List[int], List[int], int]],
        check: bool = False,
    ) -> Tuple[List[float], int, Optional[bool], float, Optional[str], float]: ...
    def synchronize(self) -> None: ...

def load_source(
    file: str, source: str, overrides: List[Tuple[str, int]] = ...
) -> NativeFusion: ...
def load_file(path: str, overrides: List[Tuple[str, int]] = ...) -> NativeFusion: ...
