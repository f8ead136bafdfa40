"""The notebooks beside this file, run top to bottom on a real Jupyter kernel (the `notebooks`
nox session): a cell that raises, an assertion in one included, fails its notebook's test with
that cell and its traceback. The kernel is this environment's Python, started in a temporary
folder; the notebooks move into folders of their own for what they write.

The notebooks are committed without outputs, which the last test checks: outputs saved with a
notebook go stale as soon as the code changes, and bloat every diff of it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

NOTEBOOKS = sorted(Path(__file__).parent.glob("*.ipynb"))
CELL_TIMEOUT_S = 300  # a cell that hangs fails instead of holding CI
COLOURS = re.compile(r"\x1b\[[0-9;]*m")  # IPython's traceback colours, unreadable in a log


def _kernel() -> KernelManager:
    """A kernel of this interpreter: ipykernel's own ``python3`` spec alone, so that no kernel
    installed elsewhere under that name (the user's, the system's) answers instead."""
    specs = KernelSpecManager(kernel_dirs=[], ensure_native_kernel=True)
    kernel = KernelManager(kernel_name="python3", kernel_spec_manager=specs)
    assert kernel.kernel_spec.argv[0] == sys.executable, kernel.kernel_spec.argv
    return kernel


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_notebook_runs_top_to_bottom(path: Path, tmp_path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, km=_kernel(), timeout=CELL_TIMEOUT_S,
                            resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()
    except CellExecutionError as e:
        pytest.fail(f"{path.name}: {COLOURS.sub('', str(e))}", pytrace=False)


def test_the_notebooks_are_committed_without_outputs() -> None:
    assert NOTEBOOKS, "no notebook found beside this file"
    for path in NOTEBOOKS:
        notebook = nbformat.read(path, as_version=4)
        nbformat.validate(notebook)
        stale = [number for number, cell in enumerate(notebook.cells, 1)
                 if cell.cell_type == "code"
                 and (cell.outputs or cell.execution_count is not None)]
        assert not stale, (f"{path.name}: cells {stale} (every cell counted from 1) hold outputs; "
                           f"clear them before committing (Jupyter: Edit > Clear Outputs of "
                           f"All Cells, or `nbstripout {path.name}`)")
