"""analyses/quickstart.ipynb runs headless, top to bottom, on the shipped checkpoints.

The kernel is this interpreter (a kernel spec written for the test, found through JUPYTER_PATH),
so the test does not depend on which `python` is first on PATH or on an installed kernel spec.
The checkpoint folder is $NOPEINTERP_CHECKPOINTS (default: the repository's checkpoints/).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "analyses" / "quickstart.ipynb"
KERNEL = "nopeinterp-test"


def test_notebook_is_saved_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


def test_notebook_runs(tmp_path, monkeypatch):
    checkpoints = Path(os.environ.get("NOPEINTERP_CHECKPOINTS", ROOT / "checkpoints")).resolve()
    assert (checkpoints / "scan-nope.pt").exists(), (
        f"{checkpoints}/scan-nope.pt is missing: the reference checkpoints are committed "
        "(or set NOPEINTERP_CHECKPOINTS)"
    )
    spec = tmp_path / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "nopeinterp test", "language": "python",
    }))  # fmt: skip
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("NOPEINTERP_CHECKPOINTS", str(checkpoints))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        nb, timeout=300, kernel_name=KERNEL, resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    text = "\n".join(
        str(o.get("text", "")) + json.dumps(o.get("data", {}))
        for c in nb.cells if c.cell_type == "code" for o in c.outputs
    )  # fmt: skip
    assert "UNTRAINED" not in text  # the real checkpoint was used, not the fallback
    assert "hook_pattern" in text and "t5" in text
    figures = [
        o
        for c in nb.cells
        for o in c.get("outputs", [])
        if "application/vnd.plotly.v1+json" in o.get("data", {})
    ]
    assert len(figures) >= 3  # attention pattern, probe figure, similarity figure
