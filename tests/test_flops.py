"""FLOP accounting: the analytic count against a hand count and against the traced jaxpr."""

import jax
import jax.numpy as jnp
import pytest
from conftest import TINY, system_of
from flax import nnx

from cdeit_jax import config_lib
from cdeit_jax.checkpoints import loading
from cdeit_jax.model import flops
from cdeit_jax.model.network import CDEIT


def test_published_forward_by_hand():
  """Every matmul of the published model (C=512, MLP 2048, patch 2), written out per stage."""
  c, h = 512, 2048
  blk = lambda t, a: 2 * t * c * (4 * c + 2 * h) + 4 * t * a * c + 12 * c * c
  fwd = (
    2 * 64**2 * 8 * c
    + 2 * 256 * c
    + 2 * c * c  # patch + time embeddings
    + 4 * blk(4096, 256)  # four windowed blocks
    + sum(8 * t * c * c + 2 * blk(t, t) for t in (1024, 256, 64, 16))  # downs
    + blk(16, 16)  # mid
    + sum(6 * t * c * c + 2 * blk(t, t) for t in (64, 256, 1024, 4096))  # ups
    + 4 * c * c
    + 2 * 4096 * c * 4
  )  # final layer
  cfg = config_lib.default_config()
  kw = config_lib.model_kwargs(cfg, loading.resolve(cfg))
  assert flops.forward_flops(**kw) == fwd
  assert fwd == pytest.approx(291e9, rel=0.02)  # the "about 291 GFLOP"
  assert flops.train_flops_per_example(kw) == 3 * fwd


# a model of any measuring system (its values, one removal set beside the full one)
ANY_SYSTEM = dict(
  patch_size=8,
  hidden_size=32,
  num_heads=4,
  num_scales=1,
  cond="linear",
  cond_alphas=(0.03, 0.3),
  cond_grid=16,
  removals="-;3",
)


@pytest.mark.parametrize(
  "kw",
  [
    TINY,
    dict(hidden_size=64, patch_size=4, num_scales=3),
    dict(TINY, window_size=8, mlp_ratio=2.0),
    dict(
      patch_size=8,
      hidden_size=32,
      num_heads=4,
      num_scales=1,
      cond="eim+linear",
      cond_alphas=(0.03, 0.3),
    ),
    ANY_SYSTEM,
    dict(ANY_SYSTEM, output="classes"),  # a segmenter
    # two priors (four channels) and the removal set as an input
    dict(ANY_SYSTEM, output="classes", cond_priors=("noser", "laplace"), removal_input=True),
  ],
)
@pytest.mark.parametrize("impl", ["xla", "blocked"])
def test_forward_matches_jaxpr(kw, impl):
  """The model's traced dot_general/conv FLOPs (scan bodies times their length) agree exactly."""
  names = {k: kw[k] for k in ("cond", "removals", "output") if k in kw}
  kw = {k: v for k, v in kw.items() if k not in names}
  kw["system"] = system_of(
    names.get("cond", "eim"), None, names.get("removals"), names.get("output", "image")
  )
  model = nnx.eval_shape(lambda: CDEIT(**kw, attention_impl=impl, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(model)
  size = model.image_size
  if model.system.output.gives_classes:  # a segmenter: segment(cond)
    jaxpr = jax.make_jaxpr(lambda s, c: nnx.merge(graphdef, s).segment(c))(
      state, jax.ShapeDtypeStruct((3, *model.cond_shape), jnp.float32)
    )
    assert flops.jaxpr_matmul_flops(jaxpr) == 3 * flops.forward_flops(**kw)
    return
  jaxpr = jax.make_jaxpr(lambda s, x, t, c: nnx.merge(graphdef, s)(x, t, c))(
    state,
    jax.ShapeDtypeStruct((3, size, size, 1), jnp.float32),
    jax.ShapeDtypeStruct((3,), jnp.int32),
    jax.ShapeDtypeStruct((3, *model.cond_shape), jnp.float32),
  )
  assert flops.jaxpr_matmul_flops(jaxpr) == 3 * flops.forward_flops(**kw)


def test_jaxpr_count_scales_loops():
  """A scan of 5 matmuls counts 5 times (XLA's cost analysis would count it once)."""
  a = jnp.ones((8, 16))
  b = jnp.ones((16, 4))
  fn = lambda a, b: jax.lax.scan(lambda c, _: (c, a @ b), 0.0, None, length=5)[1]
  assert flops.jaxpr_matmul_flops(jax.make_jaxpr(fn)(a, b)) == 5 * 2 * 8 * 16 * 4
