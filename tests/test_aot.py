"""Ahead-of-time compiles on this CPU machine: for a TPU v5e-8 (libtpu's compile-only devices)
and for NVIDIA H100s (JAX's CUDA plugin and XLA's H100 spec; no GPU)."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from conftest import attention_layers

from cdeit_jax import config_lib
from cdeit_jax.checkpoints import loading
from cdeit_jax.common import topologies
from cdeit_jax.model import flops
from cdeit_jax.train import aot

needs_libtpu = pytest.mark.skipif(
  importlib.util.find_spec("libtpu") is None,
  reason="libtpu is not installed (pip install -e '.[tpu]'); .ci/run installs it",
)
needs_cuda_plugin = pytest.mark.skipif(
  not topologies.cuda_plugin_installed(),
  reason="JAX's CUDA plugin is not installed (pip install -e '.[cuda-aot]'); .ci/run installs it",
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = [
  "--config.model.patch_size=4",
  "--config.model.hidden_size=32",
  "--config.model.num_heads=4",
  "--config.model.num_scales=2",
]


def _small_cfg(batch, config="v5e8"):
  cfg = config_lib.load(os.path.join(ROOT, "configs", f"{config}.py"))
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


@needs_libtpu
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


@needs_libtpu
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
  # one line says what this is, then each program as it starts and its seconds; no libtpu block
  first, *rest = r.stdout.splitlines()
  assert "compile-only check for v5e-8 (8 TPU v5 lite devices); libtpu compiles" in first
  assert rest[:2] == ["compiling the train step (global batch 65536, bfloat16) ..."] + [
    f"train step refused by the compiler (memory) in {saved['compile_s']} s"
  ]
  assert "compiling eval.py's sampler (batch 65536) ..." in rest
  assert "unexpected worker hostname" not in r.stderr and "E0000" not in r.stderr, r.stderr


def _cudnn_calls(global_layers: int, windowed: int, backward: bool) -> dict[str, int]:
  """One fused call per attention layer (windowed ones carry their position bias), and as many
  backward ones in a train step."""
  calls = {"__cudnn$fmhaSoftmax": global_layers, "__cudnn$fmhaScaleBiasSoftmax": windowed}
  if backward:
    calls.update({f"{k}Backward": v for k, v in calls.items()})
  return {k: v for k, v in calls.items() if v}


def _peak_is_the_sum(m: dict) -> bool:
  return m["peak_bytes"] == (
    m["argument_size_in_bytes"]
    + m["output_size_in_bytes"]
    - m["alias_size_in_bytes"]
    + m["temp_size_in_bytes"]
    + m["generated_code_size_in_bytes"]
  )


@needs_cuda_plugin
def test_a_tiny_model_compiles_for_one_h100(tmp_path):
  """configs/gpu.py's recipe (bfloat16, attention "auto") at the test model's size, compiled for
  one compile-only H100 (about 45 s on 2 cores): the platform is the devices' own (this
  process's is the CPU), so "auto" is cuDNN's attention as on a GPU, and the compiled step holds
  one fused forward and one backward call per attention layer of the model."""
  import jax

  cfg = _small_cfg(2, "gpu")
  cfg.model.update(patch_size=8, num_scales=1)  # 16 x 16 tokens, one scale
  report = aot.compile_check(cfg, "h100-1", str(tmp_path), print_fn=lambda *a: None, sampler=False)
  saved = json.loads((tmp_path / "compile.json").read_text())
  assert saved == json.loads(json.dumps(report)) and "sampler" not in saved
  assert (saved["platform"], saved["device_kind"]) == ("gpu", "NVIDIA H100 80GB HBM3")
  assert (saved["num_devices"], saved["num_hosts"], saved["per_device_batch"]) == (1, 1, 2)
  assert jax.default_backend() == "cpu" and saved["attention_impl"] == "cudnn"
  assert saved["hbm_bytes_per_device"] == int(84942979072 * topologies.mem_fraction())
  assert saved["fits"] and 0 < saved["peak_bytes_per_device"] < saved["hbm_bytes_per_device"]
  assert _peak_is_the_sum(saved["memory"]) and saved["memory"]["alias_size_in_bytes"] > 0
  layers = attention_layers(cfg)
  assert saved["fused_attention"]["targets"] == _cudnn_calls(*layers, backward=True)
  assert saved["flops_per_step"] == 2 * 3 * _traced_forward_flops(cfg)


@needs_cuda_plugin
@pytest.mark.e2e
def test_the_gpu_config_compiles_for_eight_h100s(tmp_path):
  """`train.py --config configs/gpu.py --compile_topology h100-8` in a process of its own, JAX's
  platforms left unset (the command limits them to the CPU itself): the published model in
  bfloat16, 4 a GPU, fits, with cuDNN's attention in the step and the sampler (3-4 min)."""
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
  cmd = [sys.executable, "train.py", "--config", "configs/gpu.py"]
  cmd += ["--compile_topology", "h100-8", "--workdir", str(tmp_path)]
  r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
  assert r.returncode == 0, r.stderr[-3000:]
  saved = json.loads((tmp_path / "compile.json").read_text())
  assert (saved["num_devices"], saved["global_batch"], saved["per_device_batch"]) == (8, 32, 4)
  assert saved["attention_impl"] == "cudnn" and saved["dtype"] == "bfloat16"
  assert saved["params"] == 109_719_108 and saved["fits"] and saved["within_margin"]
  assert _peak_is_the_sum(saved["memory"])
  layers = attention_layers(config_lib.load(os.path.join(ROOT, "configs", "gpu.py")))
  assert saved["fused_attention"]["targets"] == _cudnn_calls(*layers, backward=True)
  cfg = config_lib.load(os.path.join(ROOT, "configs", "gpu.py"))
  assert saved["flops_per_step"] == 32 * 3 * _traced_forward_flops(cfg)
  s = saved["sampler"]
  assert s["fits"] and s["global_batch"] == 32 and _peak_is_the_sum(s["memory"])
  assert s["fused_attention"]["targets"] == _cudnn_calls(*layers, backward=False)
  assert "h100-8" in r.stdout and "cudnn" in r.stdout
