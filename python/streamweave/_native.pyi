"""Type stubs of the extension module `streamweave._native` (crates/python). Its errors are
the classes of `streamweave._errors`."""

from typing import Any, Dict, List, Optional, Tuple, Union

__version__: str

def op_table() -> List[Tuple[str, str]]:
    """The ops of the `.weave` format as (name, kind), from the Rust parser's tables."""

def dtype_names() -> List[str]:
    """The dtype names of the format (`bf16`, `f16`, `f32`, `f64`, `i64`, `bool`)."""

def run_defaults() -> Dict[str, Union[bool, int, float]]:
    """`RunOptions::default()`: check, races, trace, streams, timeout_secs, tune_secs."""

class NativeFusion:
    def text(self) -> str: ...
    def name(self) -> str: ...
    def compile(
        self, devices: Optional[int] = None, chunks: Union[int, str, None] = None
    ) -> NativeExecutable: ...
    def dump(
        self,
        passes: Optional[str] = None,
        print_before: List[str] = ...,
        print_after: List[str] = ...,
    ) -> str: ...

# An input handed over in place: (name, NumPy dtype name, shape, address of the first
# element, size in bytes, the array itself, held for the call).
_Handed = Tuple[str, str, List[int], int, int, Any]
# An output: (name, NumPy dtype name (`bfloat16`: its bits), shape, little-endian bytes).
_Output = Tuple[str, str, List[int], bytearray]

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
        streams: Optional[int] = None,
        races: Optional[bool] = None,
        trace: Optional[bool] = None,
        timeout_secs: Optional[float] = None,
        tune_secs: Optional[float] = None,
        tune_cache: Optional[str] = None,
    ) -> NativeSession: ...
    def run(
        self,
        inputs: List[_Handed],
        ranks: int = 1,
        check: Optional[bool] = None,
        races: Optional[bool] = None,
        trace: Optional[bool] = None,
        streams: Optional[int] = None,
        timeout_secs: Optional[float] = None,
    ) -> Tuple[List[_Output], bool, float, int, Optional[Tuple[str, str]]]: ...

class NativeSession:
    """Private: `run` takes raw device addresses; use `streamweave.CudaRunner`."""

    def ranks(self) -> List[Tuple[int, int]]: ...
    def world(self) -> int: ...
    def config(self) -> Optional[str]: ...
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
