"""Attention backends against XLA's reference attention: forward and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import system_of
from flax import nnx

from cdeit_jax.common import sharding as shd
from cdeit_jax.model import attention
from cdeit_jax.model.network import CDEIT


def _qkv(shape, dtype=jnp.float32, seed=0):
  r = np.random.default_rng(seed)
  return tuple(jnp.asarray(r.standard_normal(shape), dtype) for _ in range(4))


def _grads(fn, q, k, v, w):
  loss = lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) * w.astype(jnp.float32))
  return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)


def _rel(a, b):
  a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
  return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 5e-6), (jnp.bfloat16, 2e-2)])
def test_blocked_matches_xla(dtype, tol):
  q, k, v, w = _qkv((2, 1024, 4, 32), dtype)
  ref = jax.nn.dot_product_attention(q, k, v)
  out = attention.blocked_attention(q, k, v, None, 256)
  assert out.dtype == dtype
  assert _rel(out, ref) < tol
  for g, g_ref in zip(
    _grads(lambda *a: attention.blocked_attention(*a, None, 256), q, k, v, w),
    _grads(jax.nn.dot_product_attention, q, k, v, w),
  ):
    assert _rel(g, g_ref) < tol


@pytest.mark.parametrize("block", [64, 256])
def test_blocked_with_bias_matches_xla(block):
  """Windows: a (1, N, T, T) relative position bias, its gradient summed over the batch."""
  q, k, v, w = _qkv((3, 256, 4, 16))
  bias = jnp.asarray(np.random.default_rng(5).standard_normal((1, 4, 256, 256)), jnp.float32)
  ours = lambda q, k, v, b: attention.blocked_attention(q, k, v, b, block)
  ref = lambda q, k, v, b: jax.nn.dot_product_attention(q, k, v, bias=b)
  assert _rel(ours(q, k, v, bias), ref(q, k, v, bias)) < 5e-6
  grad = lambda f: jax.grad(lambda *a: jnp.sum(f(*a) * w), argnums=(0, 1, 2, 3))(q, k, v, bias)
  for g, g_ref in zip(grad(ours), grad(ref)):
    assert g.shape == g_ref.shape
    assert _rel(g, g_ref) < 5e-6


def test_blocked_queries_and_keys_of_different_lengths():
  """Query chunks (attention_query_chunk) attend over all keys: T != S."""
  q, k, v, _ = _qkv((1, 1024, 2, 16))
  out = attention.blocked_attention(q[:, :128], k, v, None, 256)
  assert _rel(out, jax.nn.dot_product_attention(q[:, :128], k, v)) < 5e-6


def test_splash_kernel_interpreted_matches_xla():
  """The TPU kernel, run by Pallas' interpreter on CPU: forward and gradients."""
  q, k, v, w = _qkv((2, 512, 2, 32))
  splash = lambda q, k, v: attention.splash_attention(q, k, v, 256, interpret=True)
  assert _rel(splash(q, k, v), jax.nn.dot_product_attention(q, k, v)) < 5e-6
  for g, g_ref in zip(_grads(splash, q, k, v, w), _grads(jax.nn.dot_product_attention, q, k, v, w)):
    assert _rel(g, g_ref) < 5e-6


def test_splash_runs_per_device_under_a_mesh():
  """Under jax.set_mesh the kernel runs on each device's batch shard (shard_map)."""
  mesh = shd.make_mesh()
  assert mesh.shape[shd.DATA] == 8
  q, k, v, _ = _qkv((8, 256, 2, 16))
  fn = jax.jit(
    lambda q, k, v: attention.splash_attention(q, k, v, 128, interpret=True),
    in_shardings=shd.batch_sharded(mesh),
    out_shardings=shd.batch_sharded(mesh),
  )
  with jax.set_mesh(mesh):
    lowered = fn.lower(q, k, v)
    out = lowered.compile()(*(jax.device_put(x, shd.batch_sharded(mesh)) for x in (q, k, v)))
  assert "shard_map" in lowered.as_text() or "sdy.manual_computation" in lowered.as_text()
  assert _rel(out, jax.nn.dot_product_attention(q, k, v)) < 5e-6


@pytest.mark.parametrize(
  "impl,platform,dtype,want",
  [
    ("auto", "tpu", "bfloat16", "splash"),
    ("auto", "gpu", "bfloat16", "cudnn"),
    ("auto", "gpu", "float32", "blocked"),
    ("auto", "cpu", "float32", "blocked"),
    (None, "cpu", "bfloat16", "blocked"),
    ("cudnn", "gpu", "float32", "blocked"),  # cuDNN takes 16-bit inputs only
    ("cudnn", "cpu", "bfloat16", "blocked"),
    ("splash", "cpu", "float32", "blocked"),  # a TPU checkpoint evaluated on CPU
    ("xla", "tpu", "bfloat16", "xla"),
  ],
)
def test_resolve(impl, platform, dtype, want):
  assert attention.resolve(impl, platform, dtype) == want


def test_resolve_rejects_unknown():
  with pytest.raises(ValueError, match="attention_impl"):
    attention.resolve("flash3", "cpu", jnp.float32)


@pytest.mark.slow  # the backend itself is checked by default on its own (above)
def test_model_with_blocked_attention_matches_xla():
  """A model whose top global blocks attend over 1,024 tokens: same output and gradients."""
  kw = dict(image_size=128, patch_size=4, hidden_size=32, num_heads=4, num_scales=2)
  kw["system"] = system_of()
  models = {impl: CDEIT(**kw, attention_impl=impl, rngs=nnx.Rngs(0)) for impl in ("xla", "blocked")}
  r = np.random.default_rng(0)
  x = jnp.asarray(r.standard_normal((2, 128, 128, 1)), jnp.float32)
  t = jnp.asarray([3, 700], jnp.int32)
  c = jnp.asarray(r.standard_normal((2, 16, 16, 1)), jnp.float32)
  # adaLN-Zero starts at zero: perturb every weight so that attention reaches the output
  graphdef, state = nnx.split(models["xla"])
  state = jax.tree.map(lambda a: a + 0.05 * jax.random.normal(jax.random.key(1), a.shape), state)
  outs, grads = {}, {}
  for impl, m in models.items():
    g, _ = nnx.split(m)
    forward = lambda s: nnx.merge(g, s)(x, t, c)
    outs[impl] = jax.jit(forward)(state)  # jitted: eager dispatch took 36 s, not 19 s, on CPU
    grads[impl] = jax.jit(jax.grad(lambda s: jnp.mean(forward(s) ** 2)))(state)
  assert _rel(outs["blocked"], outs["xla"]) < 1e-5
  for a, b in zip(jax.tree.leaves(grads["blocked"]), jax.tree.leaves(grads["xla"])):
    assert np.max(np.abs(np.asarray(a) - np.asarray(b))) <= 1e-4 * max(np.max(np.abs(b)), 1e-6)


def test_bench_shapes_are_the_published_models_calls(monkeypatch):
  """bench/bench_attention.py (and its PyTorch twin) time the published model's attention calls
  apart from the rest: their table (bench/attention_calls.py) must be the calls the model makes
  (traced, not run)."""
  import importlib.util
  import pathlib

  path = pathlib.Path(__file__).parents[1] / "bench" / "attention_calls.py"
  spec = importlib.util.spec_from_file_location("attention_calls", path)
  bench = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(bench)
  calls = []
  real = attention.attend

  def spy(q, k, v, bias=None, **kw):
    calls.append((q.shape, bias is not None))
    return real(q, k, v, bias, **kw)

  monkeypatch.setattr(attention, "attend", spy)
  batch = 2
  model = nnx.eval_shape(lambda: CDEIT(system=system_of(), rngs=nnx.Rngs(0)))  # the published sizes
  jax.eval_shape(
    lambda m: m(
      jnp.zeros((batch, 128, 128, 1)), jnp.zeros((batch,), jnp.int32), jnp.zeros((batch, 16, 16, 1))
    ),
    model,
  )
  seen = {}
  for (b, tokens, heads, head_dim), biased in calls:
    assert (heads, head_dim) == (bench.HEADS, bench.HEAD_DIM)
    key = (tokens, b // batch if biased else None)
    seen[key] = seen.get(key, 0) + 1
  want = {(tokens, windows): count for tokens, windows, count in bench.SHAPES.values()}
  assert seen == want
