"""notebooks/cdeit_jax_tpu.ipynb: committed clean, and run whole with TINY = True in a Jupyter
kernel of this Python (nbclient), its outcomes read from the files it wrote."""

import json
import math
import os
import pathlib
import sys

import nbformat
import numpy as np
import pytest

REPO = pathlib.Path(__file__).parent.parent
NOTEBOOK = REPO / "notebooks" / "cdeit_jax_tpu.ipynb"


def cell(nb, tag):
  """The one cell tagged `tag`."""
  found = [c for c in nb.cells if tag in c.metadata.get("tags", [])]
  assert len(found) == 1, (tag, len(found))
  return found[0]


def text(c) -> str:
  """A code cell's printed output (streams and plain-text results)."""
  parts = []
  for o in c.outputs:
    parts.append(o.get("text", "") if o.output_type == "stream" else "")
    parts.append(o.get("data", {}).get("text/plain", "") if "data" in o else "")
  return "".join(parts)


def test_the_committed_notebook_is_clean_and_tiny_is_off():
  """Valid nbformat 4, no outputs or execution counts kept, one parameters cell with the real
  run's defaults (TINY off)."""
  nb = nbformat.read(NOTEBOOK, as_version=4)
  nbformat.validate(nb)
  assert nb.nbformat == 4 and nb.metadata.kernelspec.name == "python3"
  for c in nb.cells:
    if c.cell_type == "code":
      assert c.outputs == [] and c.execution_count is None, c.source[:60]
  params = {}
  exec(cell(nb, "parameters").source, params)
  assert params["TINY"] is False and params["CONFIG"] == "configs/v5e8.py"
  assert params["EVAL"] == [("uef2017", "data/uef2017")]
  assert (REPO / params["CONFIG"]).is_file() and (REPO / "data" / "uef2017" / "1_1.npz").is_file()


@pytest.mark.e2e
def test_the_notebook_runs_tiny_end_to_end(tmp_path):
  """The whole notebook, TINY = True, in a kernel started without the suite's XLA_FLAGS and
  JAX_PLATFORMS (the notebook sets them itself): 8 fake devices, a checkpoint written, the
  evaluation's RMSE finite and equal to its saved arrays', a figure in each images cell, the
  Reconstructor's images eval.py's."""
  from nbclient import NotebookClient

  nb = nbformat.read(NOTEBOOK, as_version=4)
  work = tmp_path / "work"
  cell(nb, "parameters").source += f"\nTINY = True\nINSTALL = False\nWORKDIR = {str(work)!r}\n"
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  client = NotebookClient(
    nb,
    timeout=900,
    kernel_name="python3",
    resources={"metadata": {"path": str(REPO / "notebooks")}},  # as Jupyter starts it
  )
  client.execute(env=env)

  # the kernel is this Python (the venv's), and the data-parallel path ran on 8 devices
  assert f"python {sys.executable}\n" in text(cell(nb, "setup"))
  devices = text(cell(nb, "devices"))
  assert "mesh: {'data': 8}, global batch 8 = 8 devices x 1\n" in devices, devices
  assert "compute dtype: float32\n" in devices, devices  # TINY's, over the config's bfloat16
  # training: a committed checkpoint at the last step, TensorBoard events where the cell looks
  run = work / "run"
  assert (run / "checkpoints" / "10" / "commit_success.txt").is_file()
  assert list((run / "tensorboard").glob("events.out.tfevents.*"))
  assert "TINY: no TensorBoard widget" in text(cell(nb, "tensorboard"))
  # evaluation on the simulated test split: finite RMSE, the RMSE of the predictions it saved
  out = work / "eval_simulated"
  m = json.loads((out / "metrics.json").read_text())
  rmse = m["metrics"]["cdeit"]["rmse"]
  assert math.isfinite(rmse) and m["settings"]["examples"] == 8
  z = np.load(out / "predictions.npz")
  assert rmse == pytest.approx(np.sqrt(((z["pred"] - z["target"]) ** 2).mean()), rel=1e-6)
  # figures: the loss curve, truth beside reconstruction, the Reconstructor's
  for tag in ("curves", "images", "reconstructor"):
    assert any("image/png" in o.get("data", {}) for o in cell(nb, tag).outputs), tag
  line = next(
    s for s in text(cell(nb, "reconstructor")).splitlines() if s.startswith("largest difference")
  )
  assert float(line.split(":")[1]) < 1e-4, line
