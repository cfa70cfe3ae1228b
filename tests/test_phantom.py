"""Random phantoms and their images (`eit.phantom`): orientation and areas by hand, inclusions
inside and apart, numpy's and jax's draws alike, each kind's area."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import disc_params

from cdeit_jax import eit
from cdeit_jax.common.errors import InputError
from cdeit_jax.eit import phantom as ph


def test_render_orientation_and_area():
  img = np.asarray(ph.render_image(jnp.asarray(disc_params(0.5, 0.0, 0.3, 10.0), jnp.float32)))
  assert abs(img.sum() * (2 / 128) ** 2 - np.pi * 0.09) / (np.pi * 0.09) < 5e-3
  rows, cols = np.nonzero(img)
  assert cols.min() > 64 and abs(rows.mean() - 63.5) < 0.5  # +x is the column axis
  up = np.asarray(ph.render_image(jnp.asarray(disc_params(0.0, 0.5, 0.2, 10.0), jnp.float32)))
  assert np.nonzero(up)[0].min() > 64  # +y is increasing rows
  assert img.max() == pytest.approx(1.0) and img[0, 0] == 0


def test_random_phantoms_inside_and_disjoint():
  spec = eit.PhantomSpec()
  rng = np.random.default_rng(0)
  for _ in range(200):
    p = eit.random_params(rng, spec)
    act = p[p[:, 0] > 0]
    assert 1 <= len(act) <= spec.max_inclusions
    assert np.all(np.hypot(act[:, 2], act[:, 3]) + act[:, 4] <= spec.max_radius + 1e-12)
    assert np.all((np.abs(act[:, 7]) >= spec.v_min) & (np.abs(act[:, 7]) <= spec.v_max))
    for i in range(len(act)):
      for j in range(i):
        assert np.hypot(*(act[i, 2:4] - act[j, 2:4])) >= act[i, 4] + act[j, 4]


def test_jax_phantoms_inside_disjoint_and_distributed_as_numpys():
  """draw_params (the simulator's, on the devices) keeps the constraints and draws the
  distribution of the sequential numpy reference random_params."""
  spec = eit.PhantomSpec()
  keys = jax.random.split(jax.random.key(0), 3000)
  p = np.asarray(jax.jit(jax.vmap(lambda k: ph.draw_params(k, spec)))(keys))
  q = np.stack([eit.random_params(np.random.default_rng(i), spec) for i in range(3000)])
  for x in p:
    act = x[x[:, 0] > 0]
    assert 1 <= len(act) <= spec.max_inclusions and np.all(x[len(act) :] == 0)  # active first
    assert np.all(np.hypot(act[:, 2], act[:, 3]) + act[:, 4] <= spec.max_radius + 1e-6)
    assert np.all((np.abs(act[:, 7]) >= spec.v_min) & (np.abs(act[:, 7]) <= spec.v_max))
    for i in range(len(act)):
      for j in range(i):
        assert np.hypot(*(act[i, 2:4] - act[j, 2:4])) >= act[i, 4] + act[j, 4] + 0.03 - 1e-6
  act = lambda x: x[x[..., 0] > 0]
  summary = lambda x: (
    np.bincount((x[..., 0] > 0).sum(1), minlength=7)[1:] / len(x),
    np.bincount(act(x)[:, 1].astype(int), minlength=7) / len(act(x)),
    act(x)[:, 4].mean(),
    np.mean(act(x)[:, 5]),
    np.mean(act(x)[:, 8]),
    np.mean(np.hypot(act(x)[:, 2], act(x)[:, 3]) + act(x)[:, 4] > spec.max_radius - 1e-4),
  )
  for a, b in zip(summary(p), summary(q)):  # 3,000 draws: sampling error ~0.01
    np.testing.assert_allclose(a, b, atol=0.035, rtol=0.03)


def test_resistive_objects_draw_their_own_contrast_range():
  """`PhantomSpec.resistive_v_min/max`: resistive labels in their own range, conductive ones in
  [v_min, v_max], both signs about equally often, alike in draw_params and random_params; the
  defaults (0, 0) keep one range; a range that is not one is refused."""
  spec = eit.PhantomSpec(v_min=0.75, v_max=2.0, resistive_v_min=1.5, resistive_v_max=3.0)
  keys = jax.random.split(jax.random.key(2), 600)
  p = np.asarray(jax.jit(jax.vmap(lambda k: ph.draw_params(k, spec)))(keys))
  q = np.stack([eit.random_params(np.random.default_rng(i), spec) for i in range(600)])
  for x in (p, q):
    v = x[x[..., 0] > 0][:, 7]
    res, con = -v[v < 0], v[v > 0]
    assert 0.4 < len(res) / len(v) < 0.6
    assert res.min() >= 1.5 - 1e-6 and res.max() <= 3.0 + 1e-6 and res.std() > 0.35
    assert con.min() >= 0.75 - 1e-6 and con.max() <= 2.0 + 1e-6 and con.std() > 0.3
    assert res.mean() == pytest.approx(2.25, abs=0.08) and con.mean() == pytest.approx(
      1.375, abs=0.08
    )
  assert eit.PhantomSpec().resistive_range() == (0.5, 1.0)
  for bad in ((2.0, 1.0), (1.0, 0.0)):
    with pytest.raises(InputError, match="resistive_v_min"):
      eit.PhantomSpec(resistive_v_min=bad[0], resistive_v_max=bad[1]).validate()


@pytest.mark.parametrize(
  "kind, b, p", [("polygon", 0.0, 3), ("polygon", 0.0, 6), ("rectangle", 0.5, 0), ("star", 0.3, 5)]
)
def test_new_shapes_render_their_areas(kind, b, p):
  """Area of the rendered label image against the shape's area by hand (bounding radius a):
  regular n-gon n/2 a^2 sin(2 pi/n); rectangle with corners on the circle, sides in ratio b,
  corners rounded by r = hy/4: 4 hx hy - (4 - pi) r^2; star r(phi) = a (1 - b (1 - cos 5 phi)/2):
  1/2 integral r^2 dphi = pi a^2 ((1 - b/2)^2 + b^2/8)."""
  a = 0.4
  params = np.zeros((ph.MAX_INCLUSIONS, ph.ROW))
  params[0] = [1, eit.spec.KINDS.index(kind), 0.1, -0.2, a, b, 0.3, 1.0, p]
  img = np.asarray(ph.render_image(jnp.asarray(params, jnp.float32)))
  area = img.sum() * (2 / ph.IMAGE_SIZE) ** 2
  if kind == "polygon":
    want = p / 2 * a * a * np.sin(2 * np.pi / p)
  elif kind == "rectangle":
    hx = a / np.sqrt(1 + b * b)
    hy, r = b * hx, b * hx / 4
    want = 4 * hx * hy - (4 - np.pi) * r * r
  else:
    want = np.pi * a * a * ((1 - b / 2) ** 2 + b * b / 8)
  assert area == pytest.approx(want, rel=2e-3)
