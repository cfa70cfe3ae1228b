"""eval.py --data greit (infer.greit_test): the GREIT test's outputs, their schema and that the
figures written are the figures of the images written."""

import json

import numpy as np
import pytest

from cdeit_jax.common.errors import InputError
from cdeit_jax.eit import phantom
from cdeit_jax.infer import data_kinds, greit_test, metrics


@pytest.mark.e2e  # the kind's whole path: 12 targets, 64 noisy frames, GREIT built (about 65 s)
def test_the_greit_test_writes_the_figures_of_the_images_it_writes(tiny_run, tmp_path):
  """12 targets on the tiny model's system: greit.json holds every target's position (units of
  the tank's radius, along +x) and the five figures of cdeit, tikhonov and greit, with a noise
  figure each; greit.npz holds the positions, the medium and the images, whose figures
  (metrics.greit_figures) are greit.json's; greit.png is there; the GREIT baseline's noise
  figure is the one its weight was chosen for."""
  out = tmp_path / "O"
  settings = {"eval.max_examples": 12, "sampling.num_samples": 2, "sampling.steps": 1}
  r = data_kinds.evaluate(tiny_run, "greit", None, str(out), settings)
  assert sorted(p.name for p in out.iterdir()) == [
    ".cdeit-outputs.json",
    *sorted(greit_test.OUTPUTS),
  ]
  written = json.loads((out / "greit.json").read_text())
  z = np.load(out / "greit.npz")
  methods = ["cdeit", "tikhonov", "greit"]
  assert sorted(z.files) == sorted(["positions", "medium", *methods])
  np.testing.assert_allclose(z["positions"], greit_test.positions(12))
  np.testing.assert_array_equal(z["medium"], phantom.disk_mask(128))
  assert [t["position"] for t in written["targets"]] == z["positions"].tolist()
  assert sorted(written["noise_figure"]) == sorted(methods)
  assert written["noise_figure"]["greit"] == pytest.approx(0.5, rel=1e-3)
  for m in methods:
    assert z[m].shape == (12, 128, 128)
    figures = metrics.greit_figures(z[m], z["positions"], z["medium"])
    for i, t in enumerate(written["targets"]):
      assert sorted(t["figures"][m]) == sorted(f.name for f in metrics.GREIT)
      for name, v in t["figures"][m].items():
        if v is None:  # NaN: no target in the image
          assert np.isnan(figures[name][i])
        else:
          assert v == pytest.approx(figures[name][i], rel=1e-12, abs=1e-12), (m, i, name)
  assert "| greit | 0.90 |" in r["table"] and r["written"] == "greit.npz, greit.png, greit.json"
  with pytest.raises(InputError, match="--data greit simulates its own targets"):
    data_kinds.evaluate(tiny_run, "greit", str(out), str(tmp_path / "P"), settings)
  with pytest.raises(InputError, match="--data greit reads no units"):
    data_kinds.evaluate(tiny_run, "greit", None, str(tmp_path / "P"), settings, units="uef2017")
  with pytest.raises(InputError, match="greit_figures='matlab': one of"):
    data_kinds.evaluate(
      tiny_run, "greit", None, str(tmp_path / "P"), {**settings, "eval.greit_figures": "matlab"}
    )
  assert not (tmp_path / "P").exists()
