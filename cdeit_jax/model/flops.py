"""FLOP counts that count every loop iteration (XLA's cost analysis counts a loop body once).

`forward_flops` is the analytic matmul count of one image's forward pass from the model's sizes
(2 FLOPs per multiply-add: every linear layer, the patch embedding and both attention matmuls).
A training example costs 3 forward passes (forward, and a backward pass of twice its work), the
usual model-FLOPs convention for MFU: recomputation (blocked attention's backward, remat) is not
counted. `jaxpr_matmul_flops` is a second, independent count read off a traced function's
jaxpr, scaling loop bodies by their trip counts; the tests check one against the other.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cdeit_jax.common.errors import InputError


def forward_flops(
  *,
  image_size: int = 128,
  patch_size: int = 2,
  in_channels: int = 1,
  hidden_size: int = 512,
  num_heads: int = 16,
  mlp_ratio: float = 4.0,
  num_scales: int = 4,
  window_size: int | None = None,
  freq_dim: int = 256,
  cond_alphas=(),
  cond_grid: int = 32,
  cond_priors=("noser",),
  system,
  **_: Any,
) -> float:
  """Matmul FLOPs of one image's forward pass of a model of the resolved `system`
  (`model.system.ModelSystem`; takes `CDEIT`'s keywords, `config_lib.model_kwargs`)."""
  del num_heads  # heads split the width; the FLOPs do not depend on their number
  c, hid = hidden_size, int(hidden_size * mlp_ratio)
  grid = image_size // patch_size
  window = window_size or grid // 4

  def block(tokens: int, attended: int) -> float:
    linear = 2 * tokens * c * (3 * c + c + 2 * hid)  # qkv, proj, mlp fc1 + fc2
    scores = 2 * 2 * tokens * attended * c  # q k^T and p v, all heads
    return linear + scores + 2 * c * 6 * c  # + adaLN modulation

  from cdeit_jax.eit import conditioning

  priors = conditioning.check_priors(cond_priors or ("noser",))
  levels = len(tuple(cond_alphas)) * len(priors) if system.condition.linear else 0
  pixels = image_size**2
  # physics-informed condition: U^T y, then one (208 x pixels) product per level
  total = 2 * 208 * 208 + levels * 2 * 208 * pixels if levels else 0
  eim = in_channels
  if system.reads_values:  # any system: one (R x coarse pixels) product per removal set and level
    from cdeit_jax.eit import phantom

    values = system.device.num_values
    sets = len(system.sets)
    coarse = int(phantom.disk_mask(cond_grid).sum())
    total = 2 * values * sets * levels * coarse + 2 * sets * levels * coarse  # + the set's pick
    g = cond_grid  # bilinear upsampling to the image, one axis after the other
    total += 2 * levels * (image_size * g * g + image_size * image_size * g)
    eim = 0
  kind = system.output
  image, out = kind.noisy_channels(in_channels), kind.out_channels(in_channels)
  total += 2 * grid**2 * (patch_size**2 * (image + eim + levels)) * c  # patch embedding
  total += 2 * freq_dim * c + 2 * c * c  # timestep MLP
  total += 4 * block(grid**2, window**2)  # swinIn1/2, swinOut1/2
  for s in range(1, num_scales + 1):
    tokens = (grid >> s) ** 2
    total += 2 * tokens * 4 * c * c + 2 * block(tokens, tokens)  # merge + two global blocks
  total += block((grid >> num_scales) ** 2, (grid >> num_scales) ** 2)  # mid
  for s in range(num_scales - 1, -1, -1):
    tokens = (grid >> s) ** 2
    total += 2 * tokens * c * c + 2 * tokens * 2 * c * c + 2 * block(tokens, tokens)  # conv, fuse
  total += 2 * c * 2 * c + 2 * grid**2 * c * patch_size**2 * out  # final layer
  return float(total)


def train_flops_per_example(model_cfg: Any) -> float:
  return 3.0 * forward_flops(**dict(model_cfg))


def sample_flops_per_image(model_cfg: Any, steps: int) -> float:
  return steps * forward_flops(**dict(model_cfg))


# ----------------------------------------------------------------------------- from a jaxpr


def _dot_flops(eqn) -> float:
  lhs, rhs = (v.aval.shape for v in eqn.invars[:2])
  (contract, _), (batch, _) = eqn.params["dimension_numbers"]
  k = int(np.prod([lhs[d] for d in contract]))
  out = int(np.prod(eqn.outvars[0].aval.shape))
  return 2.0 * out * k


def _conv_flops(eqn) -> float:
  rhs = eqn.invars[1].aval.shape
  spec = eqn.params["dimension_numbers"].rhs_spec  # (out feature dim, in feature dim, spatial...)
  per_output = int(np.prod([rhs[d] for d in spec[1:]]))
  return 2.0 * int(np.prod(eqn.outvars[0].aval.shape)) * per_output


def jaxpr_matmul_flops(jaxpr) -> float:
  """dot_general and convolution FLOPs of a (closed) jaxpr, loop bodies times their trip count."""
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
  total = 0.0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "dot_general":
      total += _dot_flops(eqn)
    elif name == "conv_general_dilated":
      total += _conv_flops(eqn)
    elif name == "while":
      raise InputError("jaxpr_matmul_flops: a while loop has no static trip count")
    else:
      times = eqn.params["length"] if name == "scan" else 1
      for sub in _subjaxprs(eqn):
        total += times * jaxpr_matmul_flops(sub)
  return total


def _subjaxprs(eqn):
  """The jaxprs in an equation's parameters (scan, cond branches, pjit, custom_vjp, remat)."""
  for v in eqn.params.values():
    for x in v if isinstance(v, (list, tuple)) else [v]:
      if hasattr(x, "eqns") or hasattr(getattr(x, "jaxpr", None), "eqns"):
        yield x
