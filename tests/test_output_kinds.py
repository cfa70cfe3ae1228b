"""model.output_kinds: what a CDEIT outputs as one value. Each kind's channels and sampler passes
against the published model's and the segmenter's definitions, and a third kind registered in
one place is what the network, the train step and the sampler call."""

import pathlib

import jax
import numpy as np
import pytest
from flax import nnx

from cdeit_jax import config_lib
from cdeit_jax.checkpoints import loading
from cdeit_jax.common import sharding as shd
from cdeit_jax.common.errors import InputError
from cdeit_jax.data import sources
from cdeit_jax.model import condition_kinds, output_kinds
from cdeit_jax.train import training

REPO = pathlib.Path(__file__).parent.parent


def test_each_kind_says_its_channels_and_passes():
  image, classes = output_kinds.of("image"), output_kinds.of("classes")
  # the published denoiser reads and writes the noisy image's channels
  assert (image.noisy_channels(1), image.out_channels(1), image.sampler_steps(5)) == (1, 1, 5)
  assert not image.one_pass and not image.gives_classes
  # the segmenter reads the condition alone and writes water/resistive/conductive logits
  assert (classes.noisy_channels(1), classes.out_channels(1), classes.sampler_steps(5)) == (0, 3, 1)
  assert classes.one_pass and classes.gives_classes
  with pytest.raises(InputError, match=r"output 'mask' must be one of \('image', 'classes'\)"):
    output_kinds.of("mask")
  with pytest.raises(InputError, match='output "classes" reads the condition alone'):
    classes.check(condition_kinds.of("eim"))
  image.check(condition_kinds.of("eim"))
  classes.check(condition_kinds.of("linear"))


class _Doubled(output_kinds.ImageOutput):
  """A third kind for the test: the published model with its training loss doubled."""

  name = "doubled"

  def loss(self, model, diffusion, x0, t, cond, noise):
    return 2 * super().loss(model, diffusion, x0, t, cond, noise)


def test_a_third_kind_is_one_class_the_train_step_calls(monkeypatch):
  monkeypatch.setitem(output_kinds.KINDS, "doubled", _Doubled())
  uef = sources.NpzSource(str(REPO / "data" / "uef2017"), "uef2017", "authors")
  batch = {k: np.stack([uef[i][k] for i in range(8)]) for k in ("cond", "target")}
  mesh = shd.make_mesh(jax.devices()[:1])
  losses = {}
  for name in ("image", "doubled"):
    cfg = config_lib.load(str(REPO / "configs" / "test.py"))
    cfg.model.output = name
    ts = training.setup(cfg, loading.resolve(cfg), mesh)
    model = nnx.merge(ts.graphdef, ts.state.params, ts.constants)
    assert model.system.output is output_kinds.KINDS[name]
    c = training.compile_train_step(ts, 8, mesh, False)
    _, m = c.fn(ts.state, batch, jax.random.key(0), ts.constants)
    losses[name] = float(m["loss"])
  # same weights (same seed), same draws: the one difference is the kind's loss
  np.testing.assert_allclose(losses["doubled"], 2 * losses["image"], rtol=1e-6)
