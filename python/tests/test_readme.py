"""The README's Python snippets run as written, from a directory that is not the
repository (a fresh temporary one), as they would after `pip install .`: each ```python
block is executed there. A block that uses PyTorch runs only where PyTorch sees a GPU (the
GPU path); the others always run."""

import os
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def gpu_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def test_the_readme_has_python_snippets() -> None:
    assert len(BLOCKS) >= 2, BLOCKS


@pytest.mark.parametrize("block", BLOCKS, ids=["block%d" % i for i in range(len(BLOCKS))])
def test_a_readme_snippet_runs_from_any_directory(
    block: str, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if "torch" in block and not gpu_available():
        pytest.skip("the snippet needs PyTorch and a GPU")
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        exec(compile(block, "README.md", "exec"), {"__name__": "readme"})
    finally:
        os.chdir(here)
    # Nothing it needs lies in the repository: it wrote nothing here and read no path of it.
    assert "tests/scenarios" not in block
    out = capsys.readouterr().out
    if "print(r.passed" in block:
        # The CPU quick start prints whether the run passed (against the f64 reference) and
        # its largest difference from NumPy's float32 product of unrounded inputs: the
        # program takes bf16, so within bf16 rounding of sums of 16 products below 1.
        passed, diff = out.split()
        assert passed == "True" and float(diff) < 0.1, out
