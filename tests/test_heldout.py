"""Held-out shape families (`cdeit_jax.data.heldout`): areas by hand, the groups' object counts and
classes, objects apart (touching pairs in contact), the element conductivity against the phantom
module's for the same disc (a second implementation), and the command's files."""

import json
import math
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import scipy.ndimage

from cdeit_jax import config_lib
from cdeit_jax.data import heldout, synthetic
from cdeit_jax.eit import phantom
from cdeit_jax.eit.spec import ROW

REPO = pathlib.Path(__file__).parent.parent
SPEC = synthetic.phantom_spec(config_lib.load(str(REPO / "configs" / "ktc2023_model.py")).simulator)


def _area(shape, n: int = 1024) -> float:
  """The shape's area (radius units) on an n x n grid of [-1, 1]^2."""
  pts = phantom.pixel_centres(n).reshape(-1, 2)
  return float(shape(pts).mean() * 4)


def test_shapes_have_their_areas_by_hand():
  """An annular sector (span/2 (R^2 - r^2)), a 0.6 x 0.06 bar, and a letter inside its
  bounding circle."""
  sector = heldout._sector((0.1, -0.2), 0.4, 0.06, 1.0, math.pi)
  assert _area(sector) == pytest.approx(math.pi / 2 * (0.4**2 - 0.34**2), rel=0.02)
  rng = np.random.default_rng(3)
  for _ in range(20):
    bar = heldout._thin(rng, (0.0, 0.0), 0.3)
    area = _area(bar)
    assert 0.6 * 0.04 * 0.97 < area < max(0.6 * 0.08, math.pi * 4 / 3 * 0.3 * 0.08) * 1.03
  letter = heldout._letter(rng, (0.2, 0.1), 0.3)
  pts = phantom.pixel_centres(256).reshape(-1, 2)
  inside = pts[letter(pts)]
  assert len(inside) > 100 and np.hypot(*(inside - [0.2, 0.1]).T).max() <= 0.3 + 1e-9


@pytest.mark.parametrize("group", list(heldout.GROUPS))
def test_targets_of_every_family_apart_inside_and_of_their_classes(group):
  """Objects lie inside the config's max radius; the objects of a target are apart (no pixel of
  one beside a pixel of another) but for touching pairs (in contact); `many` targets hold 3-4
  objects of both classes; contrasts lie in the config's ranges."""
  lo, hi, both = heldout.GROUPS[group]
  rng = np.random.default_rng(0)
  pts = phantom.pixel_centres(128)[..., 0, :]
  for i in range(30):
    family = heldout.FAMILIES[i % len(heldout.FAMILIES)]
    t = heldout.draw_target(rng, family, group, SPEC)
    n = len(t.shapes)
    assert lo <= n <= hi and len(t.v) == n
    v = np.asarray(t.v)
    if both:
      assert (v > 0).any() and (v < 0).any()
    assert np.all((v[v > 0] >= SPEC.v_min) & (v[v > 0] <= SPEC.v_max))
    res = SPEC.resistive_range()
    assert np.all((-v[v < 0] >= res[0]) & (-v[v < 0] <= res[1]))
    label = t.label(pts)
    assert np.hypot(*pts[label != 0].T).max() <= SPEC.max_radius + 0.02
    masks = [shape(pts.reshape(-1, 2)).reshape(128, 128) for shape in t.shapes]
    assert all(m.sum() > 0 for m in masks)
    for a in range(n):
      near = scipy.ndimage.binary_dilation(masks[a], iterations=1)
      for b in range(a + 1, n):
        pair = family == "touching" and b == a + 1 and a % 2 == 0
        assert (near & masks[b]).any() == pair, (family, a, b)


def test_conductivity_of_a_disc_is_the_phantom_modules():
  """A disc target's element conductivities equal `eit.phantom.element_conductivity` of the
  same disc as the generator's parameters, on a simulator's own sample points."""
  from cdeit_jax.eit import layout, simulator

  sim = simulator.Simulator(layout.preset("cdeit16"))
  disc = heldout._ellipse(np.array([0.3, -0.2]), 0.25, 0.25, 0.0)
  target = heldout.Target("blobs", (disc,), (0.8,))
  got = heldout.conductivity(target, np.asarray(sim.sample_points), 1.0)
  row = np.zeros((1, ROW), np.float32)
  row[0, :8] = [1, 0, 0.3, -0.2, 0.25, 1.0, 0.0, 0.8]  # active, disc, centre, a, b, angle, v
  want = np.asarray(sim.phantom_conductivity(row[None]))[0]
  assert (want > 1).sum() > 20
  np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.e2e
def test_the_command_writes_each_groups_files(tmp_path):
  """`python -m cdeit_jax.heldout_families` writes few/ and many/ files that the
  simulator's readers take (ys (208, 1), xs (128, 128)), the record of each target, and the
  same bytes again from the same seed."""
  out = tmp_path / "held"
  cmd = [sys.executable, "-m", "cdeit_jax.heldout_families", "--config=configs/test.py"]
  for where in (out, tmp_path / "again"):
    p = subprocess.run(
      [*cmd, f"--out={where}", "--num=3"], capture_output=True, text=True, cwd=REPO
    )
    assert p.returncode == 0, p.stderr[-3000:]
  record = json.loads((out / "heldout.json").read_text())
  from cdeit_jax.data.npz_files import read_npz

  for group in heldout.GROUPS:
    g = record["groups"][group]
    assert g["families"] == list(heldout.FAMILIES[:3]) and len(g["objects"]) == 3
    for i in range(3):
      name = f"{i:07d}.npz"
      z = read_npz(str(out / group / name), ("ys", "xs"))
      assert z["ys"].shape == (208, 1) and z["xs"].shape == (128, 128)
      assert np.abs(z["ys"]).max() > 0 and np.isfinite(z["ys"]).all()
      assert sum(g["classes"][i]) == g["objects"][i]
      again = read_npz(str(tmp_path / "again" / group / name), ("ys", "xs"))
      assert np.array_equal(again["ys"], z["ys"]) and np.array_equal(again["xs"], z["xs"])
  # a second set into the same folder (fewer, another seed) replaces the first whole
  p = subprocess.run(
    [*cmd, f"--out={out}", "--num=2", "--seed=5"], capture_output=True, text=True, cwd=REPO
  )
  assert p.returncode == 0, p.stderr[-3000:]
  record = json.loads((out / "heldout.json").read_text())
  assert record["num"] == 2 and record["seed"] == 5 and not (tmp_path / "held.partial").exists()
  for group in heldout.GROUPS:
    assert sorted(f.name for f in (out / group).iterdir()) == ["0000000.npz", "0000001.npz"]
  # a file, or a folder of other files, as --out: refused in one line before any simulating
  (tmp_path / "file").write_text("x")
  (tmp_path / "other").mkdir()
  (tmp_path / "other" / "mine.txt").write_text("x")
  for where, message in (
    (tmp_path / "file", "exists and is not a folder"),
    (tmp_path / "other", "holds files and no heldout.json"),
  ):
    p = subprocess.run([*cmd, f"--out={where}"], capture_output=True, text=True, cwd=REPO)
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert p.returncode == 1 and len(errors) == 1 and message in errors[0], p.stderr[-2000:]
  assert (tmp_path / "other" / "mine.txt").read_text() == "x"
