"""Every notebook in notebooks/ runs top to bottom (nbclient), on a machine with a GPU."""

import glob
import os

import pytest

NOTEBOOKS = sorted(
    glob.glob(
        os.path.join(
            os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notebooks", "*.ipynb"
        )
    )
)


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 4


@pytest.mark.gpu
@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs_top_to_bottom(device, path, tmp_path):
    nbformat = pytest.importorskip("nbformat", reason="needs nbformat, nbclient and ipykernel")
    nbclient = pytest.importorskip("nbclient", reason="needs nbformat, nbclient and ipykernel")
    pytest.importorskip("ipykernel", reason="needs nbformat, nbclient and ipykernel")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError, with the cell and its traceback, on failure
    errors = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert not errors
    out = os.environ.get("TENFERRO_NOTEBOOK_OUT")
    if out:  # where the executed copies go to be saved with their outputs
        os.makedirs(out, exist_ok=True)
        nbformat.write(nb, os.path.join(out, os.path.basename(path)))
