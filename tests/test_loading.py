"""Building models from checkpoints (`cdeit_jax.checkpoints.loading`): a fine-tuning run starts
from another model's weights, also one of CDEIT's EIM and linear images for a model of any
device (`configs/device.py` starts from models/cdeit16)."""

import pathlib

import jax
import numpy as np
import pytest
from flax import nnx

from cdeit_jax import config_lib
from cdeit_jax.checkpoints import checkpoint, loading
from cdeit_jax.common.errors import InputError
from cdeit_jax.data import stats
from cdeit_jax.eit import layout as lay
from cdeit_jax.model.network import CDEIT

REPO = pathlib.Path(__file__).parent.parent


def _cfg(cond: str, **model):
  cfg = config_lib.load(str(REPO / "configs" / "test.py"))
  cfg.model.update(cond=cond, cond_alphas=(0.03, 0.3), cond_grid=16, **model)
  return cfg


@pytest.mark.parametrize("current_carrying", ["use", "drop"])
def test_a_device_model_starts_from_a_model_of_the_eim_and_linear_images(
  tmp_path, current_carrying
):
  """An "eim+linear" model (random weights, saved as a checkpoint) starts a "linear" model of a
  16-electrode skip-2 device, with or without its values on current-carrying electrodes (which
  changes no weight): every parameter is the start's, but the patch embedding, which
  keeps the start's noisy-image and linear-image channels (0, 2, 3 of its 4) and drops the EIM's
  (1); a start whose model differs in more than its condition is refused in one line."""
  start_cfg = _cfg("eim+linear")
  model = CDEIT(**config_lib.model_kwargs(start_cfg, loading.resolve(start_cfg)), rngs=nnx.Rngs(0))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda a: a + 0.1 * rng.standard_normal(a.shape).astype(a.dtype), params)
  model = nnx.merge(graphdef, params, rest)
  mean, std = stats.authors_stats()
  checkpoint.save_inference(str(tmp_path / "start"), model, start_cfg, mean=mean, std=std, step=3)

  device = lay.from_rules(16, injection="skip-2", measure_injecting=True, width_deg=10.0)
  cfg = _cfg("linear", current_carrying=current_carrying)
  system = loading.resolve(cfg, {"step": 0, "device": device.record()})  # the device kept
  new = CDEIT(**config_lib.model_kwargs(cfg, system), rngs=nnx.Rngs(1))
  like = nnx.state(new, nnx.Param)
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  got, line = loading.initial_params(str(tmp_path / "start"), cfg, like, sharding)
  assert "the patch embedding's EIM channel dropped" in line
  plain = lambda tree: {
    jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(tree)
  }
  was, now = plain(nnx.to_pure_dict(params)), plain(nnx.to_pure_dict(got))
  assert set(now) == set(was)
  for key, value in was.items():
    if "x_embedder" in key and "kernel" in key:
      assert value.shape[2] == 4 and now[key].shape[2] == 3
      np.testing.assert_array_equal(now[key], value[:, :, [0, 2, 3], :])
    else:
      np.testing.assert_array_equal(now[key], value)
  other = _cfg("linear", hidden_size=64)
  with pytest.raises(
    InputError, match=r"its model is not this config's \(model\.cond: .*hidden_size"
  ):
    loading.initial_params(str(tmp_path / "start"), other, like, sharding)


def test_a_models_system_is_resolved_once_into_one_value():
  """`loading.resolve`: KTC2023's segmenter reads the challenge's device without each level's
  electrodes (the values each level loses, counted against the challenge's own NaN frames in
  tests/test_layout.py) and outputs classes; a model of CDEIT's EIM has no removal sets whatever
  the simulator's rule; a checkpoint's kept device wins over the config's."""
  ktc = config_lib.load(str(REPO / "configs" / "ktc2023_model.py"))
  system = loading.resolve(ktc)
  assert system.device.signature == lay.preset("ktc2023").signature
  assert system.removals == "ktc2023" and len(system.sets) == 7
  assert system.removed.sum(1).tolist() == [0, 732, 952, 1156, 1344, 1726, 1843]
  assert system.output.gives_classes and system.units.name.startswith("ktc2023")
  eim = config_lib.load(str(REPO / "configs" / "test.py"))
  eim.simulator.removals = "ktc2023"
  system = loading.resolve(eim)
  assert system.removals == "none" and system.removed.shape == (1, 208)
  assert not system.removed.any() and not system.output.gives_classes
  assert (system.units.gain, system.units.current_ratio) == (1.0, 1.0)  # simulation units
  kept = lay.from_rules(16, injection="skip-2", width_deg=10.0)
  got = loading.resolve(_cfg("linear"), {"step": 1, "device": kept.record()}).device
  assert got.signature == kept.signature
