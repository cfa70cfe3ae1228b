"""model.output_kinds: what a CDEIT outputs as one value. Each kind's channels and sampler passes
against the published model's and the segmenter's definitions, and a third kind registered in
one place is what the network, the train step, the sampler and the Reconstructor call."""

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
  assert (image.diffusion_steps(5), image.samples_per_frame(8)) == (5, 8)
  # the segmenter reads the condition alone and writes water/resistive/conductive logits
  assert (classes.noisy_channels(1), classes.out_channels(1), classes.sampler_steps(5)) == (0, 3, 1)
  assert classes.one_pass and classes.gives_classes
  assert (classes.diffusion_steps(5), classes.samples_per_frame(8)) == (0, 1)
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


class _MeanAndLogStd(output_kinds.Output):
  """A third kind unlike both: one deterministic pass from the condition alone whose two
  channels are a per-pixel mean and the log of its std (a regressor of its own uncertainty),
  answered with both: neither samples nor classes."""

  name = "mean_and_log_std"
  one_pass = True

  def noisy_channels(self, in_channels):
    return 0

  def out_channels(self, in_channels):
    return 2

  def sample(self, model, cond, draw):
    return model.segment(cond)

  def reconstruction(self, outputs, frames, std_scale, keep_samples):
    return {"images": outputs[..., 0], "std": np.exp(outputs[..., 1]) * np.float32(std_scale)}


def test_a_third_kind_is_one_class_the_reconstructor_answers_with(monkeypatch):
  """Registered in KINDS alone, a kind that neither samples nor segments goes through the
  Reconstructor's guards, conditioning and bucketed, sharded sampler (8 devices): one pass per
  frame however many samples are asked for, its images and std its two channels."""
  from cdeit_jax.data import npz_files, stats
  from cdeit_jax.infer.reconstructor import Reconstructor
  from cdeit_jax.model.network import CDEIT

  monkeypatch.setitem(output_kinds.KINDS, "mean_and_log_std", _MeanAndLogStd())
  cfg = config_lib.load(str(REPO / "configs" / "test.py"))
  cfg.model.output = "mean_and_log_std"
  model = CDEIT(**config_lib.model_kwargs(cfg, loading.resolve(cfg)), rngs=nnx.Rngs(0))
  rng = np.random.default_rng(1)  # a fresh network outputs 0 (adaLN-zero): weights moved off it
  params = nnx.state(model, nnx.Param)
  nnx.update(
    model, jax.tree.map(lambda a: a + 0.1 * rng.standard_normal(a.shape).astype(np.float32), params)
  )
  assert model.out_channels == 2
  uef = REPO / "data" / "uef2017"
  dv = np.stack([np.load(uef / n)["ys"].reshape(-1) for n in npz_files.list_files(str(uef))[:5]])
  mean, std = stats.authors_stats()
  rec = Reconstructor(model, cfg, mean, std, units="uef2017", uncertainty_scale=2.0)
  assert (rec.steps, rec.num_samples) == (0, 1)
  want = np.asarray(model.segment(jax.numpy.asarray(rec.condition(dv))))
  r = rec.reconstruct(dv, num_samples=4, keep_samples=True)
  assert r.images.shape == r.std.shape == (5, 128, 128)
  assert r.samples is None and r.probabilities is None and len(r.nonfinite) == 0
  np.testing.assert_allclose(r.images, want[..., 0], atol=2e-5)
  np.testing.assert_allclose(r.std, 2 * np.exp(want[..., 1]), rtol=1e-4)
  assert r.images.std() > 1e-3 and r.std.std() > 1e-3  # not trivially constant
  with pytest.raises(InputError, match="absolute voltages"):  # the same guards as every kind's
    rec.reconstruct(dv + 100 * rec.voltage_ratio * rec.guards.vh)
