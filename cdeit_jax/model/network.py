"""The CDEIT network (a DiT-style U-net of adaLN-Zero transformer blocks) in Flax NNX.

Follows the published PyTorch `DiT` of CDEIT exactly (see docs/reference/cdeit-model.md and
`tests/fixtures/`); layouts are NHWC inside, parameters float32, compute in
`dtype` (bfloat16 on accelerators), with norms, softmax and the timestep
embedding kept in float32. Here: the condition's wiring and `CDEIT`; its layers are in
`model.layers`.
"""

from __future__ import annotations

from typing import Any

import einops
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cdeit_jax.common.errors import InputError
from cdeit_jax.model import attention
from cdeit_jax.model.layers import (
  Block,
  Down,
  FinalLayer,
  Up,
  _linear,
  sincos_axis_table,
  timestep_embedding,
  zeros,
)

Array = jax.Array
DType = Any


# ----------------------------------------------------------------------------- the network


MAX_TABLE_BYTES = 1 << 30
"""The most that the tables a model computes itself may take (its position table, the token grid
squared by hidden_size in float32, made at every call: 8 MiB for the published model; Swin's
relative position index): sizes beyond it (an edited checkpoint or model file) are refused by
`check_sizes` before anything is allocated."""


def check_sizes(
  system,
  *,
  image_size: Any,
  patch_size: Any,
  in_channels: Any,
  hidden_size: Any,
  num_heads: Any,
  mlp_ratio: Any,
  num_scales: Any,
  window_size: Any,
  cond_size: Any,
  freq_dim: Any,
  cond_grid: Any,
) -> tuple[int, int]:
  """(token grid, attention window) of CDEIT's sizes, every one checked before anything is
  built: whole numbers in range (mlp_ratio a number), dividing as the network needs, and the
  tables they imply within MAX_TABLE_BYTES; an InputError naming the first that does not fit
  (a config's, or an edited checkpoint's)."""
  whole = lambda v: isinstance(v, (int, np.integer)) and not isinstance(v, bool)
  counts = dict(
    image_size=image_size,
    patch_size=patch_size,
    in_channels=in_channels,
    hidden_size=hidden_size,
    num_heads=num_heads,
    num_scales=num_scales,
    window_size=window_size,
    cond_size=cond_size,
    freq_dim=freq_dim,
    cond_grid=cond_grid,
  )
  for name, v in counts.items():
    low = 0 if name == "num_scales" else 1
    if not (whole(v) and v >= low) and not (name == "window_size" and v is None):
      raise InputError(f"config.model.{name}: {v!r} must be a whole number >= {low}")
  if isinstance(mlp_ratio, bool) or not isinstance(mlp_ratio, (int, float)):
    raise InputError(f"config.model.mlp_ratio: {mlp_ratio!r} must be a number > 0")
  if not 0 < mlp_ratio < 1e4:
    raise InputError(f"config.model.mlp_ratio: {mlp_ratio!r} must be a number > 0 (and < 1e4)")
  if image_size % patch_size:
    raise InputError(f"image_size {image_size} is not divisible by patch_size {patch_size}")
  grid = image_size // patch_size
  if num_scales >= grid.bit_length() or grid % (2**num_scales):
    raise InputError(
      f"token grid {grid} (image_size/patch_size) must be divisible by "
      f"2**num_scales = 2**{num_scales}"
    )
  window = grid // 4 if window_size is None else window_size
  if grid % window:
    raise InputError(f"window_size {window} does not divide the token grid {grid}")
  table = max(grid * grid * hidden_size * 4, window**4 * 8)
  if table > MAX_TABLE_BYTES:
    raise InputError(
      f"image_size {image_size}, patch_size {patch_size}, hidden_size {hidden_size} and window "
      f"{window} make tables of {table / 2**30:.3g} GiB, over the {MAX_TABLE_BYTES / 2**30:g} "
      "GiB a model here may compute: not a model of this project (an edited checkpoint?)"
    )
  if image_size % cond_size:
    raise InputError(f"image_size {image_size} is not divisible by cond_size {cond_size}")
  if system.condition.linear and image_size != 128:
    name = system.condition.name
    raise InputError(f"cond {name!r} needs image_size 128 (the simulator's grid), got {image_size}")
  return grid, window


def _removal_embedding(system, conditioner, dim: int, rngs: nnx.Rngs) -> nnx.Embed:
  """The removal set (KTC2023: the level) as an input: a learnt vector per set, added to the
  timestep's, which conditions every block (adaLN), as KTC2023's winners gave the level."""
  if not (system.reads_values and conditioner.num_sets > 1):
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


def _conditioner(system, alphas: tuple, grid: int, priors: tuple):
  """The physics-informed condition's module of the model's system (None for the published
  EIM), built only when asked for, its settings checked against the condition kind."""
  from cdeit_jax.eit import conditioning

  priors = conditioning.check_priors(priors)
  system.condition.check(system.device, priors, system.current_carrying)
  return system.condition.conditioner(system, alphas, grid, priors)


class CDEIT(nnx.Module):
  """CDEIT denoiser: predicts the clean image x0 from a noisy image, a timestep and the EIM.

  `system` (`model.system.ModelSystem`, from `checkpoints.loading.resolve`) is what the model is
  of: the measuring system whose values it reads, its electrode-removal rule, its condition
  kind and its output kind. The published model's is `resolve(config_lib.default_config())`:
  the EIM of CDEIT's 16 electrodes, images out. The other arguments default to the published
  network (109,719,108 parameters with the position table); these defaults are the config's
  (`config_lib.default_config` reads them from this signature).
  A physics-informed condition (`model.condition_kinds`: "eim+linear", or "linear" for any
  measuring system's values) adds one linear reconstruction of the voltages per level in
  `cond_alphas` (and per prior in `cond_priors`: `eit.conditioning.PRIORS`) as input channels,
  on a `cond_grid` grid, with the Jacobian of the system's device (its contact impedance
  included).
  `dtype` is the compute dtype (a name or a dtype); parameters stay float32.
  `attention_impl` picks the attention backend (see `cdeit_jax.model.attention`; default: the best
  for the platform). `attention_query_chunk` computes global attention over query chunks of that
  many tokens in turn (lower peak memory with the `xla` backend).
  Call: `x` (B, H, W, 1) float, `t` (B,) int, `cond` (B, 16, 16, 1) EIM (or (B, R) standardised
  values, NaN where missing) -> (B, H, W, 1) float32 (the physics-informed channels are computed
  inside the model). `removal_input=True` gives every block the frame's electrode-removal set
  (KTC2023: its level) as a learnt vector beside the timestep's. An output kind of one pass
  (`model.output_kinds`, "classes") makes the same network a segmenter: no noisy image, no
  timestep, and `segment(cond)` -> (B, H, W, 3) logits of KTC2023's classes (`model.classes`).
  """

  def __init__(
    self,
    *,
    system,
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
    cond_alphas: tuple = (0.03, 0.3),
    dtype: str | DType = "float32",
    attention_impl: str = "auto",
    attention_query_chunk: int | None = None,
    remat: bool = False,
    cond_grid: int = 32,
    cond_priors: tuple = ("noser",),
    removal_input: bool = False,
    rngs: nnx.Rngs,
  ):
    grid, window = check_sizes(  # before anything is allocated
      system,
      image_size=image_size,
      patch_size=patch_size,
      in_channels=in_channels,
      hidden_size=hidden_size,
      num_heads=num_heads,
      mlp_ratio=mlp_ratio,
      num_scales=num_scales,
      window_size=window_size,
      cond_size=cond_size,
      freq_dim=freq_dim,
      cond_grid=cond_grid,
    )
    system.output.check(system.condition)
    self.image_size, self.patch_size, self.in_channels = image_size, patch_size, in_channels
    self.system = system  # what it is of, as the command resolved it
    dtype = jnp.dtype(dtype)
    self.conditioner = conditioner = _conditioner(
      system, tuple(cond_alphas), cond_grid, tuple(cond_priors)
    )
    extra = 0 if self.conditioner is None else self.conditioner.num_channels
    eim_channels = system.condition.eim_channels(in_channels)
    self.hidden_size, self.grid, self.window, self.cond_size = hidden_size, grid, window, cond_size
    self.cond_shape = system.cond_shape(cond_size)
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
    image_channels = system.output.noisy_channels(in_channels)
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
      self.removal_embed = _removal_embedding(system, conditioner, dim, rngs)

    chunk = attention_query_chunk
    block = lambda win=None: Block(
      dim, *args, window=win, attention_impl=attention_impl, query_chunk=chunk
    )
    self.swinIn1, self.swinIn2 = block(window), block(window)
    self.downs = nnx.List([Down(dim, *args, attention_impl, chunk) for _ in range(num_scales)])
    self.mid = block()
    self.ups = nnx.List([Up(dim, *args, attention_impl, chunk) for _ in range(num_scales)])
    self.swinOut1, self.swinOut2 = block(window), block(window)
    self.out_channels = system.output.out_channels(in_channels)
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
  def removes_values(self) -> bool:
    """Whether training removes values from the condition (`remove_values`)."""
    return self.system.reads_values and self.conditioner.removed.shape[0] > 1

  def remove_values(self, cond: Array, key: Array) -> Array:
    """Training: each example's condition loses the values of one of the electrode sets the
    model is used with (`LayoutConditioner.remove_at_random`)."""
    return self.conditioner.remove_at_random(cond, key)

  def __call__(self, x: Array, t: Array, cond: Array) -> Array:
    """The denoiser: (B, H, W, in_channels) x0 from the noisy image x at timesteps t."""
    if not self.system.output.noisy_channels(self.in_channels):
      name = self.system.output.name
      raise InputError(f"this network outputs {name!r}, not images: call segment(cond)")
    size = self.image_size
    if x.shape[1:] != (size, size, self.in_channels):
      raise InputError(f"x must be (B, {size}, {size}, {self.in_channels}), got {x.shape}")
    return self._forward([x], t, cond, x.dtype)

  def segment(self, cond: Array) -> Array:
    """The one pass of an output kind that reads no noisy image, from the condition alone (the
    trunk's timestep is 0), float32: the segmenter's (`output="classes"`) (B, H, W, 3) logits of
    water, resistive and conductive per pixel."""
    if self.system.output.noisy_channels(self.in_channels):
      name = self.system.output.name
      raise InputError(f"this network outputs {name!r}, not classes: call it (x, t, cond)")
    t = jnp.zeros((cond.shape[0],), jnp.int32)
    return self._forward([], t, cond, jnp.float32)

  def _forward(self, inputs: list, t: Array, cond: Array, dtype) -> Array:
    size = self.image_size
    if self.system.reads_values:
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
