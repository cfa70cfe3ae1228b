"""The CDEIT network (a DiT-style U-net of adaLN-Zero transformer blocks) in Flax NNX.

Follows the published PyTorch `DiT` of CDEIT exactly (see docs/reference/cdeit-model.md and
`tests/fixtures/`); layouts are NHWC inside, parameters float32, compute in
`dtype` (bfloat16 on accelerators), with norms, softmax and the timestep
embedding kept in float32.
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
from cdeit_jax.model import attention, output_kinds

Array = jax.Array
DType = Any

# The condition: "eim" (the published model) or "eim+linear" (physics-informed: one linear
# reconstruction of the voltages per regularisation level, cdeit_jax.eit.conditioning), or
# "linear": those reconstructions alone, of any measuring system's voltages (B, R) (`layout`).
COND_MODES = ("eim", "eim+linear", "linear")
# what the network outputs: "image", the denoiser's clean image x0 (diffusion); "classes", the
# logits of KTC2023's 3 classes per pixel from the condition alone (a segmenter: `segment`)
VALUES = "linear"  # the condition of a model of any measuring system: its values (B, R)


def reads_values(cond: str) -> bool:
  """Whether a model of condition `cond` reads its measuring system's values (B, R) (any
  system's), rather than CDEIT's EIM of 208 voltages."""
  return cond == VALUES


# Arguments that describe the measuring system, not the network: configs set them in
# `config.simulator` (the system the data come from), not in `config.model`.
SYSTEM_ARGS = ("layout", "removals")

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


# ----------------------------------------------------------------------------- the network


def cond_shape(kw: dict) -> tuple[int, ...]:
  """One example's condition shape for CDEIT's keyword arguments `kw`: the EIM (16, 16, 1), or
  with cond "linear" the layout's values (R,)."""
  if reads_values(kw.get("cond", "eim")):
    from cdeit_jax.eit import layout

    return (layout.as_layout(kw.get("layout", "cdeit16")).num_values,)
  size = kw.get("cond_size", 16)
  return (size, size, 1)


def _token_grid(
  image_size: int, patch_size: int, num_scales: int, window_size, cond_size: int, cond: str
) -> tuple[int, int]:
  """(token grid, attention window) of CDEIT's sizes; an InputError naming what does not fit."""
  if image_size % patch_size:
    raise InputError(f"image_size {image_size} is not divisible by patch_size {patch_size}")
  grid = image_size // patch_size
  if grid % (2**num_scales):
    raise InputError(
      f"token grid {grid} (image_size/patch_size) must be divisible by "
      f"2**num_scales = {2**num_scales}"
    )
  window = grid // 4 if window_size is None else window_size
  if grid % window:
    raise InputError(f"window_size {window} does not divide the token grid {grid}")
  if image_size % cond_size:
    raise InputError(f"image_size {image_size} is not divisible by cond_size {cond_size}")
  if cond not in COND_MODES:
    raise InputError(f"cond {cond!r} must be one of {COND_MODES}")
  if cond != "eim" and image_size != 128:
    raise InputError(f"cond {cond!r} needs image_size 128 (the simulator's grid), got {image_size}")
  return grid, window


def _removal_embedding(cond: str, conditioner, dim: int, rngs: nnx.Rngs) -> nnx.Embed:
  """The removal set (KTC2023: the level) as an input: a learnt vector per set, added to the
  timestep's, which conditions every block (adaLN), as KTC2023's winners gave the level."""
  if not (reads_values(cond) and conditioner.num_sets > 1):
    raise InputError(
      'removal_input needs cond "linear" and two or more electrode-removal sets '
      "(config.simulator.removals); set config.model.removal_input=False"
    )
  return nnx.Embed(
    conditioner.num_sets,
    dim,
    embedding_init=nnx.initializers.normal(0.02),
    param_dtype=jnp.float32,
    rngs=rngs,
  )


def _check_output(output: str, cond: str) -> None:
  output_kinds.of(output).check(cond)


def _conditioner(
  cond: str, alphas, layout, removals, grid, current_carrying="use", priors=("noser",)
):
  """The physics-informed condition's module (None for the published "eim"), built only when
  asked for, of the measuring system `layout` (its contact impedance included)."""
  from cdeit_jax.eit import conditioning
  from cdeit_jax.eit import layout as layout_lib

  priors = conditioning.check_priors(priors)
  if priors != ("noser",) and not reads_values(cond):
    raise InputError(
      f'cond_priors {priors!r} apply to cond "linear" (a device\'s values); cond {cond!r} '
      'has NOSER images alone: leave config.model.cond_priors at ("noser",)'
    )
  if not reads_values(cond) and layout.signature != layout_lib.preset("cdeit16").signature:
    raise InputError(
      f"cond {cond!r} reads CDEIT's 16-electrode EIM; the measuring system "
      f'{layout.describe()} needs cond "linear" (config.model.cond)'
    )
  if current_carrying != "use" and not reads_values(cond):
    raise InputError(
      f'current_carrying {current_carrying!r} applies to cond "linear" (a device\'s values); '
      f"cond {cond!r} reads CDEIT's 208, none on a current-carrying electrode "
      "(config.model.current_carrying)"
    )
  if cond == "eim":
    return None
  if cond == "eim+linear":
    return conditioning.LinearConditioner(alphas, layout=layout)
  return conditioning.LayoutConditioner(
    layout,
    alphas,
    removals=removals,
    grid=grid,
    current_carrying=current_carrying,
    priors=priors,
  )


class CDEIT(nnx.Module):
  """CDEIT denoiser: predicts the clean image x0 from a noisy image, a timestep and the EIM.

  Args default to the published model (109,719,108 parameters with the position table); these
  defaults are the config's (`config_lib.default_config` reads them from this signature).
  `cond` is the condition: "eim" (published) or "eim+linear", which adds one linear
  reconstruction of the same voltages per level in `cond_alphas` as input channels
  (`cdeit_jax.eit.conditioning`), with the Jacobian of the measuring system `layout` (CDEIT's,
  with its contact impedance).
  `dtype` is the compute dtype (a name or a dtype); parameters stay float32.
  `attention_impl` picks the attention backend (see `cdeit_jax.model.attention`; default: the best
  for the platform). `attention_query_chunk` computes global attention over query chunks of that
  many tokens in turn (lower peak memory with the `xla` backend).
  `cond="linear"` takes the standardised voltages (B, R) of the measuring system `layout` (an
  `eit.layout.Layout` with its contact impedance, or a preset or a device file; `self.layout`
  holds it resolved), NaN where
  a value is missing (one of the
  electrode sets of the rule `removals`), and conditions on their linear reconstructions alone.
  Call: `x` (B, H, W, 1) float, `t` (B,) int, `cond` (B, 16, 16, 1) EIM (or (B, R) voltages) ->
  (B, H, W, 1) float32 (the physics-informed channels are computed inside the model).
  `current_carrying="drop"` leaves the values measured on a current-carrying electrode out of the
  linear reconstructions (cond "linear"; `eit.conditioning.CURRENT_CARRYING`).
  `cond_priors` (cond "linear") makes one channel per prior and level (`eit.conditioning.PRIORS`:
  "noser", "laplace", "smooth"); `removal_input=True` gives every block the frame's
  electrode-removal set (KTC2023: its level) as a learnt vector beside the timestep's.
  `output="classes"` makes the same network a segmenter: no noisy image, no timestep, and
  `segment(cond)` -> (B, H, W, 3) logits of KTC2023's classes (`model.classes`).
  """

  def __init__(
    self,
    *,
    image_size: int = 128,
    patch_size: int = 2,
    in_channels: int = 1,
    hidden_size: int = 512,
    num_heads: int = 16,
    mlp_ratio: float = 4.0,
    num_scales: int = 4,
    window_size: int | None = None,
    cond_size: int = 16,
    freq_dim: int = 256,
    cond: str = "eim",
    cond_alphas: tuple = (0.03, 0.3),
    dtype: str | DType = "float32",
    attention_impl: str = "auto",
    attention_query_chunk: int | None = None,
    remat: bool = False,
    cond_grid: int = 32,
    layout: str | Any = "cdeit16",
    removals: str = "none",
    output: str = "image",
    current_carrying: str = "use",
    cond_priors: tuple = ("noser",),
    removal_input: bool = False,
    rngs: nnx.Rngs,
  ):
    grid, window = _token_grid(image_size, patch_size, num_scales, window_size, cond_size, cond)
    _check_output(output, cond)
    self.image_size, self.patch_size, self.in_channels = image_size, patch_size, in_channels
    self.cond_mode, self.output = cond, output
    self.output_kind = output_kinds.of(output)  # what it outputs, as one value
    dtype = jnp.dtype(dtype)
    from cdeit_jax.eit import layout as layout_lib

    self.layout = layout_lib.as_layout(layout)  # the measuring system whose values it reads
    self.conditioner = conditioner = _conditioner(
      cond, tuple(cond_alphas), self.layout, removals, cond_grid, current_carrying, cond_priors
    )
    extra = 0 if self.conditioner is None else self.conditioner.num_channels
    eim_channels = 0 if reads_values(cond) else in_channels
    self.hidden_size, self.grid, self.window, self.cond_size = hidden_size, grid, window, cond_size
    self.cond_shape = (conditioner.num_values,) if reads_values(cond) else (cond_size, cond_size, 1)
    self.freq_dim, self.dtype, self.remat = freq_dim, jnp.dtype(dtype), remat
    # "auto" (or None) picks the backend of the default device; callers compiling for another
    # platform (train.py --compile_topology) resolve it first (config_lib.model_kwargs).
    if attention_impl in (None, "auto"):
      attention_impl = attention.resolve(attention_impl, jax.default_backend(), dtype)
    elif attention_impl not in attention.IMPLS:
      raise InputError(f"attention_impl {attention_impl!r} must be one of {attention.IMPLS}")
    self.attention_impl = attention_impl
    dim, args = hidden_size, (num_heads, mlp_ratio, dtype, rngs)

    sincos_axis_table(dim, grid)  # checks hidden_size now, not at the first call
    # Patch embedding: the conv is initialised like a Linear over (kh, kw, in) -> out.
    image_channels = self.output_kind.noisy_channels(in_channels)
    self.x_embedder = nnx.Conv(
      image_channels + eim_channels + extra,
      dim,
      (patch_size, patch_size),
      strides=patch_size,
      padding="VALID",
      dtype=dtype,
      param_dtype=jnp.float32,
      bias_init=zeros,
      rngs=rngs,
      kernel_init=nnx.initializers.xavier_uniform(in_axis=(0, 1, 2), out_axis=3),
    )
    normal = nnx.initializers.normal(0.02)
    self.t_fc1 = _linear(freq_dim, dim, dtype, rngs, kernel_init=normal)
    self.t_fc2 = _linear(dim, dim, dtype, rngs, kernel_init=normal)
    self.removal_input = bool(removal_input)
    if self.removal_input:
      self.removal_embed = _removal_embedding(cond, conditioner, dim, rngs)

    chunk = attention_query_chunk
    block = lambda win=None: Block(
      dim, *args, window=win, attention_impl=attention_impl, query_chunk=chunk
    )
    self.swinIn1, self.swinIn2 = block(window), block(window)
    self.downs = nnx.List([Down(dim, *args, attention_impl, chunk) for _ in range(num_scales)])
    self.mid = block()
    self.ups = nnx.List([Up(dim, *args, attention_impl, chunk) for _ in range(num_scales)])
    self.swinOut1, self.swinOut2 = block(window), block(window)
    self.out_channels = self.output_kind.out_channels(in_channels)
    self.final_layer = FinalLayer(dim, patch_size, self.out_channels, dtype, rngs)

  def pos_embed(self) -> Array:
    """(grid, grid, hidden) sin-cos position table: [column embedding, row embedding].

    Not a variable (nothing to store or pass around): built in the graph from the (grid, dim/2)
    axis table, bit-equal to the reference's float64 numpy buffer (float32 sin/cos in the graph
    would differ by ~3e-6) and small as a constant (64 KB at the published size, not 16 MB)."""
    g, axis = self.grid, jnp.asarray(sincos_axis_table(self.hidden_size, self.grid))
    return jnp.concatenate(
      [
        jnp.broadcast_to(axis[None], (g, g, axis.shape[-1])),
        jnp.broadcast_to(axis[:, None], (g, g, axis.shape[-1])),
      ],
      axis=-1,
    )

  def _block(self, blk: Block, x: Array, c: Array) -> Array:
    if self.remat:
      return nnx.remat(lambda m, x, c: m(x, c))(blk, x, c)
    return blk(x, c)

  @property
  def reads_values(self) -> bool:
    """Whether it reads its measuring system's values (B, R) (`reads_values`)."""
    return reads_values(self.cond_mode)

  @property
  def removes_values(self) -> bool:
    """Whether training removes values from the condition (`remove_values`)."""
    return self.reads_values and self.conditioner.removed.shape[0] > 1

  def remove_values(self, cond: Array, key: Array) -> Array:
    """Training: each example's condition loses the values of one of the electrode sets the
    model is used with (`LayoutConditioner.remove_at_random`)."""
    return self.conditioner.remove_at_random(cond, key)

  def __call__(self, x: Array, t: Array, cond: Array) -> Array:
    """The denoiser: (B, H, W, in_channels) x0 from the noisy image x at timesteps t."""
    if not self.output_kind.noisy_channels(self.in_channels):
      raise InputError(f"this network outputs {self.output!r}, not images: call segment(cond)")
    size = self.image_size
    if x.shape[1:] != (size, size, self.in_channels):
      raise InputError(f"x must be (B, {size}, {size}, {self.in_channels}), got {x.shape}")
    return self._forward([x], t, cond, x.dtype)

  def segment(self, cond: Array) -> Array:
    """The one pass of an output kind that reads no noisy image, from the condition alone (the
    trunk's timestep is 0), float32: the segmenter's (`output="classes"`) (B, H, W, 3) logits of
    water, resistive and conductive per pixel."""
    if self.output_kind.noisy_channels(self.in_channels):
      raise InputError(f"this network outputs {self.output!r}, not classes: call it (x, t, cond)")
    t = jnp.zeros((cond.shape[0],), jnp.int32)
    return self._forward([], t, cond, jnp.float32)

  def _forward(self, inputs: list, t: Array, cond: Array, dtype) -> Array:
    size = self.image_size
    if self.reads_values:
      if cond.shape[1:] != (self.conditioner.num_values,):
        raise InputError(
          f"cond must be (B, {self.conditioner.num_values}) voltages, got {cond.shape}"
        )
    elif cond.shape[1:] != (self.cond_size, self.cond_size, 1):
      raise InputError(f"cond must be (B, {self.cond_size}, {self.cond_size}, 1), got {cond.shape}")
    else:
      up = size // self.cond_size
      inputs = [*inputs, jnp.repeat(jnp.repeat(cond.astype(dtype), up, axis=1), up, axis=2)]
    if self.conditioner is not None:
      inputs.append(self.conditioner(cond).astype(dtype))
    h = self.x_embedder(jnp.concatenate(inputs, axis=-1)).astype(jnp.float32)
    h = h + self.pos_embed()[None]

    c = timestep_embedding(t, self.freq_dim)
    c = self.t_fc2(jax.nn.silu(self.t_fc1(c))).astype(jnp.float32)
    if self.removal_input:
      c = c + self.removal_embed(self.conditioner.set_index(cond))

    h = self._block(self.swinIn2, self._block(self.swinIn1, h, c), c)
    skips = []
    for down in self.downs:
      skips.append(h)
      h = down.merge(h).astype(jnp.float32)
      for blk in down.blocks:
        h = self._block(blk, h, c)
    h = self._block(self.mid, h, c)
    for up_layer, skip in zip(self.ups, reversed(skips)):
      h = up_layer.upsample(h, skip).astype(jnp.float32)
      for blk in up_layer.blocks:
        h = self._block(blk, h, c)
    h = self._block(self.swinOut2, self._block(self.swinOut1, h, c), c)

    out = self.final_layer(h, c).astype(jnp.float32)  # (B, g, g, p*p*C), ordered (p, q, C)
    p = self.patch_size
    return einops.rearrange(
      out, "b gh gw (ph pw c) -> b (gh ph) (gw pw) c", ph=p, pw=p, c=self.out_channels
    )


def count_params(model: CDEIT, include_fixed: bool = True) -> int:
  """Number of parameters; `include_fixed` counts the position table as the reference does (its
  `pos_embed` is an `nn.Parameter` with requires_grad=False)."""
  n = sum(int(np.prod(v.shape)) for v in jax.tree.leaves(nnx.state(model, nnx.Param)))
  return n + (model.grid * model.grid * model.hidden_size if include_fixed else 0)
