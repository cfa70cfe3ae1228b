"""The train step and the sampler lower for NVIDIA GPUs and for TPUs on a CPU-only machine
(`.lower(lowering_platforms=...)`, shapes only, the published size of configs/gpu.py and
configs/v5e8.py in bfloat16): a change that breaks either platform's lowering fails here, before
any accelerator runs it. cuDNN's fused attention (`attention_impl="cudnn"`, what "auto" picks on a
GPU in 16-bit) lowers only where JAX can query cuDNN's version: with JAX's CUDA plugin installed
(`pip install -e '.[cuda-aot]'`, which also compiles it: tests/test_aot.py), not without ("cuDNN
is not detected"); on a GPU the accelerator check (python -m cdeit_jax.accelerator_check)
runs it."""

import jax
import pytest
from flax import nnx

from cdeit_jax import config_lib
from cdeit_jax.checkpoints import loading
from cdeit_jax.common import sharding as shd
from cdeit_jax.infer import sampling
from cdeit_jax.model.diffusion import Diffusion
from cdeit_jax.train import training

BATCH = 8  # one per fake device


def _config(name: str, attention: str):
  cfg = config_lib.load(f"configs/{name}.py")
  cfg.batch_size, cfg.accum_steps = BATCH, 1
  cfg.model.attention_impl = attention
  return cfg


def _train_step(cfg, platform: str, lowering: str) -> str:
  """The train step of `cfg` lowered for `lowering` (StableHLO text)."""
  mesh = shd.make_mesh()
  ts = training.setup(cfg, loading.resolve(cfg), mesh, platform=platform, abstract=True)
  shape = ts.system.cond_shape(cfg.model.cond_size)
  batch = training.abstract_batch(BATCH, cfg.model.image_size, 1, shape)
  key = jax.eval_shape(lambda: jax.random.key(0))
  with jax.set_mesh(mesh):
    traced = jax.jit(ts.step_fn).trace(ts.state, batch, key, ts.constants)
    return traced.lower(lowering_platforms=(lowering,)).as_text()


def _sampler(cfg, platform: str, lowering: str) -> str:
  """The sampler (the published 2 steps, eta 1) of `cfg` lowered for `lowering` (StableHLO
  text)."""
  mesh = shd.make_mesh()
  system = loading.resolve(cfg)
  model = nnx.eval_shape(lambda: loading.build(cfg, system, seed=0, platform=platform))
  graphdef, weights = nnx.split(model)
  size = cfg.model.image_size
  sampler = sampling.make_sampler(
    graphdef, Diffusion(**cfg.diffusion), 2, 1.0, (size, size, 1), mesh
  )
  cond = jax.ShapeDtypeStruct((BATCH, *system.cond_shape(cfg.model.cond_size)), jax.numpy.float32)
  index = jax.ShapeDtypeStruct((BATCH,), jax.numpy.int32)
  key = jax.eval_shape(lambda: jax.random.key(0))
  with jax.set_mesh(mesh):
    traced = sampler.trace(weights, cond, index, index, key)
    return traced.lower(lowering_platforms=(lowering,)).as_text()


@pytest.mark.parametrize("attention", ["blocked", "xla"])
def test_the_gpu_train_step_and_sampler_lower_for_cuda(attention):
  """configs/gpu.py's bfloat16 train step and sampler, with the portable attention backends
  (what a GPU runs in float32, or with attention_impl set), lower for CUDA."""
  cfg = _config("gpu", attention)
  assert cfg.model.dtype == "bfloat16"
  text = _train_step(cfg, "gpu", "cuda")
  assert "bf16" in text and "stablehlo.dot_general" in text
  assert "stablehlo.while" in _sampler(cfg, "gpu", "cuda")  # the sampler's loop


def test_the_gpu_runs_model_and_its_simulations_lower_for_cuda():
  """What make gpu-run trains (configs/gpu_ktc2023.py: KTC2023's segmenter in bfloat16) and the
  simulations it trains on, as a GPU makes them: the whole batch at once (on a CPU they are
  solved one at a time, synthetic.per_example), the Cholesky factorisations as cuSOLVER calls."""
  from cdeit_jax.data import synthetic

  cfg = _config("gpu_ktc2023", "blocked")
  assert cfg.model.dtype == "bfloat16" and cfg.data.source == "simulator"
  text = _train_step(cfg, "gpu", "cuda")
  assert "bf16" in text and "stablehlo.dot_general" in text
  gen = synthetic.generator(cfg.simulator)
  examples = jax.jit(lambda i: gen.examples("train", i, batched=True))
  index = jax.ShapeDtypeStruct((BATCH,), jax.numpy.int32)
  text = examples.trace(index).lower(lowering_platforms=("cuda",)).as_text()
  assert "@cusolver_potrf_ffi" in text and "stablehlo.while" not in text  # batched, no loop


def test_cudnn_attention_lowers_where_jax_finds_cudnn():
  """cuDNN's attention is lowered only where JAX can read cuDNN's version: with the CUDA plugin
  installed (its cuDNN wheel; no GPU needed), each call, forward and backward, as the custom
  partitioning JAX gives it (its `__cudnn$fmha` calls appear when XLA partitions the program:
  `--compile_topology h100-N`, tests/test_aot.py); without it, refused. If a JAX release lowers
  it without cuDNN, this test fails: then lower it above. The test model's size (7 s)."""
  from conftest import attention_layers

  from cdeit_jax.common import topologies

  cfg = _config("gpu", "cudnn")
  cfg.model.update(patch_size=8, hidden_size=32, num_heads=4, num_scales=1)
  if topologies.cuda_plugin_installed():
    calls = _train_step(cfg, "gpu", "cuda").count("@CustomSPMDPartitioning(")
    assert calls == 2 * sum(attention_layers(cfg))
  else:
    with pytest.raises(RuntimeError, match="cuDNN is not detected"):
      _train_step(cfg, "gpu", "cuda")


def test_the_tpu_train_step_and_sampler_lower_with_the_splash_kernel():
  """configs/v5e8.py's train step and sampler lower for TPU, the global blocks through the
  Pallas splash-attention kernel (a TPU custom call)."""
  cfg = _config("v5e8", "auto")
  text = _train_step(cfg, "tpu", "tpu")
  assert "tpu_custom_call" in text and "bf16" in text
  assert "tpu_custom_call" in _sampler(cfg, "tpu", "tpu")
