"""Ahead-of-time compile for a TPU v5e-8 on this CPU machine (libtpu's compile-only devices)."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip(
  "libtpu", reason="libtpu is not installed (pip install -e '.[tpu]'); .ci/run installs it"
)

from cdeit_jax import config_lib
from cdeit_jax.checkpoints import loading
from cdeit_jax.model import flops  # noqa: E402
from cdeit_jax.train import aot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = [
  "--config.model.patch_size=4",
  "--config.model.hidden_size=32",
  "--config.model.num_heads=4",
  "--config.model.num_scales=2",
]


def _small_cfg(batch):
  cfg = config_lib.load(os.path.join(ROOT, "configs", "v5e8.py"))
  cfg.model.update(patch_size=4, hidden_size=32, num_heads=4, num_scales=2)  # 1,024-token top
  cfg.batch_size = batch
  return cfg


def _traced_forward_flops(cfg) -> float:
  """Matmul FLOPs of one example's forward pass, counted in the traced jaxpr."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from cdeit_jax.model.network import CDEIT

  kw = dict(config_lib.model_kwargs(cfg, loading.resolve(cfg), "cpu"), attention_impl="xla")
  graphdef, state = nnx.split(nnx.eval_shape(lambda: CDEIT(**kw, rngs=nnx.Rngs(0))))
  size = kw["image_size"]
  jaxpr = jax.make_jaxpr(lambda s, x, t, c: nnx.merge(graphdef, s)(x, t, c))(
    state,
    jax.ShapeDtypeStruct((1, size, size, 1), jnp.float32),
    jax.ShapeDtypeStruct((1,), jnp.int32),
    jax.ShapeDtypeStruct((1, 16, 16, 1), jnp.float32),
  )
  return flops.jaxpr_matmul_flops(jaxpr)


@pytest.mark.slow  # 1.5 min on 2 cores; `make test-all`
def test_small_model_compiles_for_v5e8(tmp_path):
  report = aot.compile_check(_small_cfg(64), "v5e-8", str(tmp_path), print_fn=lambda *a: None)
  saved = json.loads((tmp_path / "compile.json").read_text())
  assert saved == json.loads(json.dumps(report))
  assert saved["fits"] and saved["within_margin"]
  assert (saved["topology"], saved["num_devices"], saved["num_hosts"]) == ("v5e-8", 8, 1)
  assert saved["device_kind"] == "TPU v5 lite"
  assert saved["attention_impl"] == "splash"
  assert saved["hbm_bytes_per_device"] == int(15.75 * 2**30)
  m = saved["memory"]
  assert saved["peak_bytes_per_device"] == (
    m["argument_size_in_bytes"]
    + m["output_size_in_bytes"]
    - m["alias_size_in_bytes"]
    + m["temp_size_in_bytes"]
    + m["generated_code_size_in_bytes"]
  )
  assert 0 < saved["peak_bytes_per_device"] < saved["hbm_bytes_per_device"]
  assert m["alias_size_in_bytes"] > 0  # the state is donated
  # FLOPs: the traced model's matmuls (a second count, not the analytic formula the report uses),
  # 3 forwards per training example, 5 sampler steps per image
  fwd = _traced_forward_flops(_small_cfg(64))
  assert saved["flops_per_step"] == 64 * 3 * fwd
  assert saved["sampler"]["fits"] and saved["sampler"]["global_batch"] == 64
  assert saved["sampler"]["flops_per_call"] == 64 * 5 * fwd


@pytest.mark.slow  # make test-all: 24 s; TPU lowering: test_lowering.py
def test_cli_says_when_it_does_not_fit(tmp_path):
  """A batch far too big: exit 1, fits false with the compiler's figure, concrete advice."""
  env = dict(os.environ, XLA_FLAGS="", ALLOW_MULTIPLE_LIBTPU_LOAD="1")  # this process holds libtpu
  r = subprocess.run(
    [
      sys.executable,
      os.path.join(ROOT, "train.py"),
      "--config",
      "configs/v5e8.py",
      "--compile_topology",
      "v5e-8",
      "--workdir",
      str(tmp_path),
      *SMALL,
      "--config.model.attention_impl=xla",
      "--config.batch_size=65536",
    ],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert r.returncode == 1, r.stderr[-3000:]
  saved = json.loads((tmp_path / "compile.json").read_text())
  assert saved["fits"] is False and not saved["within_margin"]
  assert saved["peak_bytes_per_device"] > saved["hbm_bytes_per_device"]
  assert "does not fit: set config.model.attention_impl=auto" in r.stdout
  assert "config.accum_steps=2" in saved["advice"]


def test_unknown_topology_is_named():
  with pytest.raises(ValueError, match="--compile_topology 'v9-8': unknown"):
    aot.topology_devices("v9-8")
