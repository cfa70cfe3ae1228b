"""The phantom distribution against real truths (`cdeit_jax.data.phantom_stats`): objects measured
by hand-checkable figures, and configs/ktc2023_model.py's phantoms covering the challenge's
public truths, which configs/ktc2023.py's (the demo's) do not."""

import pathlib

import numpy as np
import pytest

from cdeit_jax import config_lib
from cdeit_jax.data import phantom_stats, synthetic

REPO = pathlib.Path(__file__).parent.parent
LEVEL_1 = REPO / "data" / "ktc2023" / "levels" / "level_1"


def test_objects_of_a_hand_made_map():
  """A disc of radius 0.3 centred at (0.5, 0) and a 10 x 10 square at the centre: areas 0.09 and
  100 / the disk's pixels of the tank, gaps to the wall 1 - 0.8 and about 1."""
  n = 256
  yy, xx = (np.mgrid[:n, :n] - (n - 1) / 2) / (n / 2)
  m = np.zeros((n, n), np.uint8)
  m[(xx - 0.5) ** 2 + yy**2 <= 0.09] = 1
  m[123:133, 123:133] = 2
  disk = (xx**2 + yy**2 <= 1).sum()
  (res,), (con,) = ([o for o in phantom_stats.objects(m) if o.cls == c] for c in (1, 2))
  assert res.area == pytest.approx(0.09, rel=0.01) and res.wall_gap == pytest.approx(0.2, abs=0.01)
  assert con.area == pytest.approx(100 / disk) and con.wall_gap > 0.95


@pytest.mark.slow  # make test-all: 18 s
def test_the_shipped_models_phantoms_cover_the_public_truths():
  """Every public truth's object (areas 4.6-10.7 % of the tank, gaps to the wall 0.21-0.61)
  lies between the 2nd and 99th percentile of configs/ktc2023_model.py's drawn objects, and
  about half its targets hold both classes (the truths: 2 of 4); the demo config's largest
  objects are smaller than some truths'."""
  truths = phantom_stats.summary(phantom_stats.truth_maps(str(LEVEL_1)))
  assert len(truths["area"]) == 6 and truths["both_classes"].mean() == 0.5
  for name, lowest in (("ktc2023_model.py", 0.02), ("ktc2023.py", None)):
    cfg = config_lib.load(str(REPO / "configs" / name))
    spec = synthetic.phantom_spec(cfg.simulator)
    drawn = phantom_stats.summary(phantom_stats.drawn_maps(spec, 300, seed=1))
    c = phantom_stats.compare(drawn, truths)
    if lowest is None:
      assert max(c["area"]["truth_percentiles"]) == 1.0, c["area"]
      continue
    for key in ("area", "wall_gap"):
      p = np.asarray(c[key]["truth_percentiles"])
      assert p.min() >= lowest and p.max() <= 0.99, (key, p)
    assert 0.4 < c["both_classes"]["drawn_fraction"] < 0.65, c["both_classes"]
    assert c["count"]["drawn_quantiles"]["0.99"] == 4.0


@pytest.mark.e2e
def test_the_command_compares_a_configs_phantoms_with_the_truths():
  """`python -m cdeit_jax.phantom_stats`: the JSON of the config's drawn phantoms against
  level 1's truths (6 objects, test_the_shipped_models_phantoms_cover_the_public_truths); its
  --config is a config file's path (a string flag, not the checkpoint commands' config)."""
  import json
  import subprocess
  import sys

  p = subprocess.run(
    [sys.executable, "-m", "cdeit_jax.phantom_stats", "--config=configs/ktc2023_model.py"]
    + [f"--truths={LEVEL_1}", "--num=20"],
    capture_output=True,
    text=True,
    cwd=REPO,
  )
  assert p.returncode == 0, p.stderr[-3000:]
  out = json.loads(p.stdout)
  assert out["num"] == 20 and len(out["area"]["truth_percentiles"]) == 6
