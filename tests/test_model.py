"""The network against the reference PyTorch code's outputs (tests/fixtures)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import FIXTURES, TINY, nhwc, system_of
from flax import nnx

from cdeit_jax.model.layers import (
  relative_position_index,
  sincos_pos_embed_2d,
  timestep_embedding,
)
from cdeit_jax.model.network import CDEIT, count_params


@pytest.fixture(scope="module")
def forward_fixture():
  with np.load(FIXTURES / "dit_small_forward.npz") as z:
    return {k: z[k] for k in z.files}


def _forward(model, f):
  fn = nnx.jit(lambda m, x, t, y: m(x, t, y))
  return np.asarray(
    fn(model, jnp.asarray(nhwc(f["x"])), jnp.asarray(f["t"]), jnp.asarray(nhwc(f["y"])))
  )


@pytest.mark.parametrize("chunk", [None])  # the default path; chunked: small_model elsewhere
def test_forward_matches_reference(small_state_dict, forward_fixture, chunk):
  from cdeit_jax.convert import load_torch_state_dict

  model = load_torch_state_dict(
    CDEIT(system=system_of(), hidden_size=64, attention_query_chunk=chunk, rngs=nnx.Rngs(0)),
    small_state_dict,
  )
  out = _forward(model, forward_fixture)
  ref = nhwc(forward_fixture["out"])
  assert out.shape == (2, 128, 128, 1)
  assert np.abs(out - ref).max() < 1e-4


def test_fixed_tables_match_reference_buffers(small_state_dict):
  np.testing.assert_array_equal(sincos_pos_embed_2d(64, 64), small_state_dict["pos_embed"][0])
  np.testing.assert_array_equal(
    relative_position_index(16),
    small_state_dict["blocks.swinIn1.attn.attn.relative_position_index"],
  )


def test_timestep_embedding_hand_computed():
  emb = np.asarray(timestep_embedding(jnp.array([0, 7]), dim=8))
  freqs = np.exp(-np.log(10000.0) * np.arange(4) / 4)
  want = np.concatenate([np.cos(np.outer([0, 7], freqs)), np.sin(np.outer([0, 7], freqs))], 1)
  np.testing.assert_allclose(emb, want, rtol=1e-6, atol=1e-6)


def test_bfloat16_forward_close_to_float32(small_state_dict, forward_fixture):
  from cdeit_jax.convert import load_torch_state_dict

  model = load_torch_state_dict(
    CDEIT(
      system=system_of(),
      hidden_size=64,
      dtype=jnp.bfloat16,
      attention_query_chunk=1024,
      rngs=nnx.Rngs(0),
    ),
    small_state_dict,
  )
  out = _forward(model, forward_fixture)
  ref = nhwc(forward_fixture["out"])
  assert out.dtype == np.float32
  err = np.abs(out - ref)
  # Measured on CPU (XLA, jax 0.10.2): max 0.0056, mean 0.0013, with outputs of std 0.39.
  assert err.max() < 0.02 and err.mean() < 0.004
  assert np.corrcoef(out.ravel(), ref.ravel())[0, 1] > 0.999


def test_bfloat16_keeps_params_float32():
  model = CDEIT(
    system=system_of(), hidden_size=32, num_heads=4, dtype=jnp.bfloat16, rngs=nnx.Rngs(0)
  )
  dtypes = {v.dtype for v in jax.tree.leaves(nnx.state(model, nnx.Param))}
  assert dtypes == {jnp.dtype(jnp.float32)}


def test_fresh_model_is_adaln_zero():
  """adaLN-Zero: zero adaLN and final layers make a fresh network output exactly zero."""
  model = CDEIT(system=system_of(), **TINY, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(1), (2, 32, 32, 1))
  out = nnx.jit(lambda m, *a: m(*a))(model, x, jnp.array([1, 500]), jnp.ones((2, 16, 16, 1)))
  assert np.all(np.asarray(out) == 0)
  assert np.all(np.asarray(model.swinIn1.adaLN_modulation.kernel[...]) == 0)
  kernel = np.asarray(model.mid.mlp.fc1.kernel[...])
  bound = np.sqrt(6 / (32 + 128))  # xavier-uniform, fan_in 32, fan_out 128
  assert np.abs(kernel).max() <= bound and np.abs(kernel).max() > 0.9 * bound


@pytest.mark.slow
def test_remat_gives_same_output_and_gradients(tiny_model):
  x = jax.random.normal(jax.random.key(0), (2, 32, 32, 1))
  t, y = jnp.array([3, 800]), jax.random.normal(jax.random.key(1), (2, 16, 16, 1))
  state = nnx.state(tiny_model)

  def grads(remat):
    m = CDEIT(system=system_of(), **TINY, remat=remat, rngs=nnx.Rngs(0))
    nnx.update(m, state)
    loss = lambda m: jnp.mean(m(x, t, y) ** 2)
    return nnx.jit(nnx.value_and_grad(loss))(m)

  (l0, g0), (l1, g1) = grads(False), grads(True)
  assert abs(float(l0) - float(l1)) < 1e-6
  for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


def test_published_size_parameter_count_and_compiles():
  model = nnx.eval_shape(lambda: CDEIT(system=system_of(), rngs=nnx.Rngs(0)))
  assert count_params(model) == 109_719_108
  graphdef, state = nnx.split(model)
  fn = jax.jit(lambda s, x, t, y: nnx.merge(graphdef, s)(x, t, y))
  lowered = fn.lower(
    state,
    jax.ShapeDtypeStruct((2, 128, 128, 1), jnp.float32),
    jax.ShapeDtypeStruct((2,), jnp.int32),
    jax.ShapeDtypeStruct((2, 16, 16, 1), jnp.float32),
  )
  compiled = lowered.compile()
  out = compiled.out_info
  assert out.shape == (2, 128, 128, 1)


@pytest.mark.parametrize(
  "kwargs, match",
  [
    (dict(image_size=100), "patch_size"),
    (dict(num_scales=7), "2\\*\\*num_scales"),
    (dict(hidden_size=60, num_heads=16), "divisible by num_heads"),
    (dict(window_size=24), "window_size"),
  ],
)
def test_bad_sizes_are_named(kwargs, match):
  with pytest.raises(ValueError, match=match):
    CDEIT(system=system_of(), **kwargs, rngs=nnx.Rngs(0))


def test_bad_input_shapes_are_named(tiny_model):
  with pytest.raises(ValueError, match="cond must be"):
    tiny_model(jnp.zeros((1, 32, 32, 1)), jnp.zeros((1,), jnp.int32), jnp.zeros((1, 16, 13, 1)))


@pytest.mark.slow  # 11 s; the chunked path is the fixture model's, checked against the reference
def test_query_chunked_attention_matches_full(tiny_model):
  """Chunking queries (lax.map + remat) changes memory, not results or gradients."""
  x = jax.random.normal(jax.random.key(0), (2, 32, 32, 1))
  t, y = jnp.array([3, 800]), jax.random.normal(jax.random.key(1), (2, 16, 16, 1))
  state = nnx.state(tiny_model)
  out = []
  for chunk in (None, 16):  # global attention at grids 8 (64 tokens) and 4: 4 and 1 chunks
    m = CDEIT(system=system_of(), **TINY, attention_query_chunk=chunk, rngs=nnx.Rngs(0))
    nnx.update(m, state)
    loss = lambda m: jnp.mean(m(x, t, y) ** 2)
    out.append(nnx.jit(nnx.value_and_grad(loss))(m))
  (l0, g0), (l1, g1) = out
  assert abs(float(l0) - float(l1)) < 1e-6
  for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
