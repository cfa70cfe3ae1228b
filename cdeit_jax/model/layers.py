"""The layers of the CDEIT network (`model.network`): the fixed tables (sin-cos positions, Swin's
relative position index), the timestep embedding, the norm, MLP, attention and adaLN-Zero blocks,
patch merging and upsampling, and the final layer, each as the published PyTorch `DiT` has it
(docs/reference/cdeit-model.md); parameters float32, compute in `dtype`, norms, softmax and the
timestep embedding in float32.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import einops
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cdeit_jax.common.errors import InputError
from cdeit_jax.model import attention

Array = jax.Array
DType = Any

xavier_uniform = nnx.initializers.xavier_uniform()
zeros = nnx.initializers.zeros_init()


# ----------------------------------------------------------------------------- fixed tables


@functools.lru_cache(maxsize=8)
def sincos_axis_table(dim: int, grid: int) -> np.ndarray:
  """(grid, dim // 2) sin-cos embedding of positions 0..grid-1 (computed in float64, as the
  reference's numpy code)."""
  if dim % 4:
    raise InputError(f"hidden_size must be a multiple of 4 for the sin-cos table, got {dim}")
  d = dim // 2
  omega = 1.0 / 10000 ** (np.arange(d // 2, dtype=np.float64) / (d / 2.0))
  out = np.einsum("m,d->md", np.arange(grid, dtype=np.float64), omega)
  table = np.concatenate([np.sin(out), np.cos(out)], axis=1).astype(np.float32)
  table.setflags(write=False)  # cached: shared by every caller
  return table


def sincos_pos_embed_2d(dim: int, grid: int) -> np.ndarray:
  """MAE/DiT 2-D sin-cos table (grid*grid, dim), the reference's `pos_embed` buffer: the first
  half embeds the column, the second the row (DiT's meshgrid(w, h))."""
  axis = sincos_axis_table(dim, grid)
  cols = np.broadcast_to(axis[None, :, :], (grid, grid, dim // 2))
  rows = np.broadcast_to(axis[:, None, :], (grid, grid, dim // 2))
  return np.concatenate([cols, rows], axis=-1).reshape(grid * grid, dim)


def relative_position_index(window: int) -> np.ndarray:
  """Swin's (window^2, window^2) index into the ((2w-1)^2, heads) relative position bias table."""
  coords = np.stack(np.meshgrid(np.arange(window), np.arange(window), indexing="ij")).reshape(2, -1)
  rel = (coords[:, :, None] - coords[:, None, :]).transpose(1, 2, 0) + (window - 1)
  return rel[:, :, 0] * (2 * window - 1) + rel[:, :, 1]


def timestep_embedding(t: Array, dim: int = 256, max_period: float = 10000.0) -> Array:
  """Sinusoidal embedding of integer timesteps, `[cos, sin]` order, float32 (as DiT)."""
  half = dim // 2
  freqs = jnp.exp(-math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / half)
  args = t.astype(jnp.float32)[:, None] * freqs[None]
  emb = jnp.concatenate([jnp.cos(args), jnp.sin(args)], axis=-1)
  if dim % 2:
    emb = jnp.concatenate([emb, jnp.zeros_like(emb[:, :1])], axis=-1)
  return emb


def modulate(x: Array, shift: Array, scale: Array) -> Array:
  """adaLN modulation; x (B, ..., C), shift/scale (B, C)."""
  expand = (slice(None),) + (None,) * (x.ndim - 2)
  return x * (1 + scale[expand]) + shift[expand]


# ----------------------------------------------------------------------------- layers


class L2Norm(nnx.Module):
  """The reference's "RMSNorm": `x / max(||x||_2, 1e-12) * g * sqrt(dim)`, computed in float32."""

  def __init__(self, dim: int):
    self.g = nnx.Param(jnp.ones((dim,), jnp.float32))
    self.scale = math.sqrt(dim)

  def __call__(self, x: Array) -> Array:
    x = x.astype(jnp.float32)
    norm = jnp.sqrt(jnp.sum(jnp.square(x), axis=-1, keepdims=True))
    return x / jnp.maximum(norm, 1e-12) * (self.g[...] * self.scale)


def _linear(
  din: int,
  dout: int,
  dtype: DType,
  rngs: nnx.Rngs,
  *,
  use_bias: bool = True,
  kernel_init=xavier_uniform,
) -> nnx.Linear:
  return nnx.Linear(
    din,
    dout,
    use_bias=use_bias,
    dtype=dtype,
    param_dtype=jnp.float32,
    kernel_init=kernel_init,
    bias_init=zeros,
    rngs=rngs,
  )


class Mlp(nnx.Module):
  def __init__(self, dim: int, hidden: int, dtype: DType, rngs: nnx.Rngs):
    self.fc1 = _linear(dim, hidden, dtype, rngs)
    self.fc2 = _linear(hidden, dim, dtype, rngs)

  def __call__(self, x: Array) -> Array:
    return self.fc2(jax.nn.silu(self.fc1(x)))


class Attention(nnx.Module):
  """Multi-head self-attention on a (B, H, W, C) grid: global, or inside non-overlapping windows
  (Swin W-MSA, no shift) with a learned relative position bias."""

  def __init__(
    self,
    dim: int,
    num_heads: int,
    dtype: DType,
    rngs: nnx.Rngs,
    *,
    window: int | None = None,
    implementation: str | None = None,
    query_chunk: int | None = None,
  ):
    if dim % num_heads:
      raise InputError(f"hidden_size {dim} is not divisible by num_heads {num_heads}")
    self.num_heads = num_heads
    self.window = window
    self.implementation = implementation
    self.query_chunk = query_chunk
    self.qkv = _linear(dim, 3 * dim, dtype, rngs)
    self.proj = _linear(dim, dim, dtype, rngs)
    if window is not None:
      init = nnx.initializers.truncated_normal(stddev=0.02)
      self.relative_position_bias_table = nnx.Param(
        init(rngs.params(), ((2 * window - 1) ** 2, num_heads), jnp.float32)
      )

  def __call__(self, x: Array) -> Array:
    b, h, w, c = x.shape
    if self.window is None:
      tokens = x.reshape(b, h * w, c)
      bias = None
    else:
      ws = self.window
      tokens = einops.rearrange(x, "b (nh wh) (nw ww) c -> (b nh nw) (wh ww) c", wh=ws, ww=ws)
      index = relative_position_index(ws).reshape(-1)
      bias = self.relative_position_bias_table[...][index]
      bias = einops.rearrange(bias, "(q k) n -> 1 n q k", q=ws * ws)
    qkv = self.qkv(tokens)
    q, k, v = jnp.split(qkv.reshape(*tokens.shape[:2], 3, self.num_heads, -1), 3, axis=2)
    q, k, v = (a[:, :, 0] for a in (q, k, v))  # (B', T, heads, head_dim)
    if bias is not None:
      bias = bias.astype(q.dtype)  # fused kernels (cuDNN) want the bias in the compute dtype
    out = self._attend(q, k, v, bias)
    out = self.proj(out.reshape(*tokens.shape[:2], c))
    if self.window is None:
      return out.reshape(b, h, w, c)
    ws = self.window
    return einops.rearrange(
      out, "(b nh nw) (wh ww) c -> b (nh wh) (nw ww) c", b=b, nh=h // ws, wh=ws
    )

  def _attend(self, q, k, v, bias):
    attend = lambda q: attention.attend(q, k, v, bias, impl=self.implementation)
    t, chunk = q.shape[1], self.query_chunk
    if bias is not None or not chunk or t <= chunk or self.implementation == "splash":
      return attend(q)
    if t % chunk:
      raise InputError(f"attention_query_chunk {chunk} does not divide the {t} tokens")
    # Queries in chunks, one after another, each rematerialised for the backward pass: peak
    # memory of the (chunk x tokens) logits instead of (tokens x tokens); same result per row.
    qc = jnp.moveaxis(q.reshape(q.shape[0], t // chunk, chunk, *q.shape[2:]), 1, 0)
    out = jax.lax.map(jax.checkpoint(attend), qc)
    return jnp.moveaxis(out, 0, 1).reshape(q.shape[0], t, *out.shape[3:])


class Block(nnx.Module):
  """adaLN-Zero transformer block (DiT) on a (B, H, W, C) grid."""

  def __init__(
    self,
    dim: int,
    num_heads: int,
    mlp_ratio: float,
    dtype: DType,
    rngs: nnx.Rngs,
    *,
    window: int | None = None,
    attention_impl: str | None = None,
    query_chunk: int | None = None,
  ):
    self.norm1 = L2Norm(dim)
    self.attn = Attention(
      dim,
      num_heads,
      dtype,
      rngs,
      window=window,
      implementation=attention_impl,
      query_chunk=query_chunk,
    )
    self.norm2 = L2Norm(dim)
    self.mlp = Mlp(dim, int(dim * mlp_ratio), dtype, rngs)
    self.adaLN_modulation = _linear(dim, 6 * dim, dtype, rngs, kernel_init=zeros)

  def __call__(self, x: Array, c: Array) -> Array:
    mod = self.adaLN_modulation(jax.nn.silu(c)).astype(jnp.float32)
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = jnp.split(mod, 6, axis=-1)
    x = x + gate_msa[:, None, None] * self.attn(modulate(self.norm1(x), shift_msa, scale_msa))
    x = x + gate_mlp[:, None, None] * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))
    return x


class PatchMerging(nnx.Module):
  """Swin patch merging: 2x2 neighbours -> 4C, LayerNorm, Linear(4C, C) without bias."""

  def __init__(self, dim: int, dtype: DType, rngs: nnx.Rngs):
    self.norm = nnx.LayerNorm(
      4 * dim, epsilon=1e-5, dtype=jnp.float32, param_dtype=jnp.float32, rngs=rngs
    )
    self.reduction = _linear(4 * dim, dim, dtype, rngs, use_bias=False)

  def __call__(self, x: Array) -> Array:
    # Order (0,0), (1,0), (0,1), (1,1) as (row, col): even/even, odd/even, even/odd, odd/odd.
    x = jnp.concatenate(
      [x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], axis=-1
    )
    return self.reduction(self.norm(x))


class Down(nnx.Module):
  def __init__(self, dim, num_heads, mlp_ratio, dtype, rngs, attention_impl, query_chunk):
    self.merge = PatchMerging(dim, dtype, rngs)
    self.blocks = nnx.List(
      [
        Block(
          dim,
          num_heads,
          mlp_ratio,
          dtype,
          rngs,
          attention_impl=attention_impl,
          query_chunk=query_chunk,
        )
        for _ in range(2)
      ]
    )


class Up(nnx.Module):
  """Nearest 2x upsample, 1x1 conv, concat [up, skip], Linear(2C, C), two global blocks."""

  def __init__(self, dim, num_heads, mlp_ratio, dtype, rngs, attention_impl, query_chunk):
    # The reference's 1x1 Conv2d keeps PyTorch's default init: U(+-1/sqrt(fan_in)).
    bound_init = nnx.initializers.variance_scaling(1 / 3, "fan_in", "uniform")
    self.conv = _linear(dim, dim, dtype, rngs, kernel_init=bound_init)
    self.conv.bias = nnx.Param(
      jax.random.uniform(
        rngs.params(), (dim,), jnp.float32, -1 / math.sqrt(dim), 1 / math.sqrt(dim)
      )
    )
    self.fuse = _linear(2 * dim, dim, dtype, rngs)
    self.blocks = nnx.List(
      [
        Block(
          dim,
          num_heads,
          mlp_ratio,
          dtype,
          rngs,
          attention_impl=attention_impl,
          query_chunk=query_chunk,
        )
        for _ in range(2)
      ]
    )

  def upsample(self, x: Array, skip: Array) -> Array:
    x = jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2)
    return self.fuse(jnp.concatenate([self.conv(x), skip], axis=-1))


class FinalLayer(nnx.Module):
  def __init__(self, dim: int, patch: int, out_channels: int, dtype: DType, rngs: nnx.Rngs):
    self.norm_final = L2Norm(dim)
    self.adaLN_modulation = _linear(dim, 2 * dim, dtype, rngs, kernel_init=zeros)
    # the output projection in float32 whatever `dtype`: the loss's gradient of its bias is a sum
    # over every pixel of residuals that nearly cancel, which a 16-bit output rounds away. bf16
    # against f32 on one batch (tests/test_bfloat16.py): that gradient's cosine 0.52 -> 1.00 at
    # the published size, all gradients' 0.99968 -> 0.99985 (test model: 0.89 -> 1.00, 0.985 ->
    # 0.9995). It is one hidden x 64 matmul per token, against a block's dozens.
    self.linear = _linear(dim, patch * patch * out_channels, jnp.float32, rngs, kernel_init=zeros)

  def __call__(self, x: Array, c: Array) -> Array:
    shift, scale = jnp.split(self.adaLN_modulation(jax.nn.silu(c)).astype(jnp.float32), 2, axis=-1)
    return self.linear(modulate(self.norm_final(x), shift, scale))
