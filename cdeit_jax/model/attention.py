"""Attention backends for CDEIT's global blocks, one setting (`config.model.attention_impl`).

- `xla`: `jax.nn.dot_product_attention` (the whole tokens x tokens score matrix; fine for the
  windowed blocks and short grids, too big for the 4,096-token grid).
- `blocked`: memory-efficient attention in plain JAX (keys in blocks with an online softmax and
  a custom VJP that recomputes scores block by block), for CPU and as the portable fallback.
- `cudnn`: cuDNN's fused attention through `jax.nn.dot_product_attention` (NVIDIA GPUs; float16 /
  bfloat16 only: other dtypes fall back to `blocked`).
- `splash`: the Pallas splash-attention TPU kernel (`jax.experimental.pallas.ops.tpu`), run per
  device under `shard_map` over the mesh's batch axis.
- `auto` (the default): splash on TPU, cudnn on GPUs for 16-bit compute, blocked otherwise.

`blocked` also runs the windowed blocks (256-token windows with a relative position bias, one key
block per window); with `splash` they stay on XLA, where their score matrices are small.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from cdeit_jax.common.errors import InputError

IMPLS = ("auto", "xla", "blocked", "cudnn", "splash")
SPLASH_BLOCK = 512
BLOCKED_BLOCK = 256  # 2 CPU cores, 4,096 tokens: 0.42 s per forward vs 0.44 (512), 0.49 (1024)


def resolve(impl: str | None, platform: str, dtype) -> str:
  """The backend that `impl` means on `platform` ('cpu', 'gpu'/'cuda', 'tpu') for `dtype`.

  A platform kernel asked for where it cannot run (splash off TPU, cuDNN off NVIDIA GPUs or in
  float32) falls back to what `auto` picks there, so that a checkpoint trained on one platform
  evaluates on another."""
  impl = impl or "auto"
  if impl not in IMPLS:
    raise InputError(f"config.model.attention_impl: {impl!r} must be one of {IMPLS}")
  sixteen_bit = jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
  gpu = platform in ("gpu", "cuda")
  if impl == "splash" and platform != "tpu" or impl == "cudnn" and not (gpu and sixteen_bit):
    impl = "auto"
  if impl == "auto":
    if platform == "tpu":
      return "splash"
    return "cudnn" if gpu and sixteen_bit else "blocked"
  return impl


# ----------------------------------------------------------------------------- blocked (CPU)
# jax.nn.dot_product_attention has no memory-efficient CPU path and the Pallas kernels target
# TPU/GPU only, so this is written here: FlashAttention's algorithm over key blocks in plain JAX.
# Heads go first inside ((B, N, T, D): contiguous batched matmuls). Measured on 2 CPU cores, batch
# 2, float32: a 4,096-token forward 0.42 s (keys in (B, T, N, D) order: 0.57 s); a windowed block
# 0.034 s against 0.109 s for jax.nn.dot_product_attention; the published forward pass 2.3 s
# against 9.2 s with XLA's attention (whose backward pass does not fit 24 GB at batch 2).


def _heads_first(x):
  return jnp.swapaxes(x, 1, 2)


def _key_blocks(x, block):
  """(B, N, S, D) -> (S/block, B, N, block, D)."""
  b, n, s, d = x.shape
  return jnp.moveaxis(x.reshape(b, n, s // block, block, d), 2, 0)


def _bias_blocks(bias, block):
  """(Bb, N, T, S) -> (S/block, Bb, N, T, block)."""
  b, n, t, s = bias.shape
  return jnp.moveaxis(bias.reshape(b, n, t, s // block, block), 3, 0)


def _forward(qh, kh, vh, bias, block):
  """Heads-first inputs; returns heads-first output (float32) and the log-sum-exp (B, N, T)."""
  b, n, t, d = qh.shape
  qs = qh * (1.0 / math.sqrt(d))

  def body(carry, blk):
    m, l, acc = carry
    s = jnp.einsum("bntd,bnsd->bnts", qs, blk["k"], preferred_element_type=jnp.float32)
    if "bias" in blk:
      s = s + blk["bias"].astype(jnp.float32)
    m_new = jnp.maximum(m, jnp.max(s, axis=-1))
    p = jnp.exp(s - m_new[..., None])
    corr = jnp.exp(m - m_new)
    l = l * corr + jnp.sum(p, axis=-1)
    acc = acc * corr[..., None] + jnp.einsum(
      "bnts,bnsd->bntd", p.astype(vh.dtype), blk["v"], preferred_element_type=jnp.float32
    )
    return (m_new, l, acc), None

  init = (
    jnp.full((b, n, t), -jnp.inf, jnp.float32),
    jnp.zeros((b, n, t), jnp.float32),
    jnp.zeros((b, n, t, d), jnp.float32),
  )
  (m, l, acc), _ = jax.lax.scan(body, init, _blocks(kh, vh, bias, block))
  return acc / l[..., None], m + jnp.log(l)


def _blocks(kh, vh, bias, block):
  xs = {"k": _key_blocks(kh, block), "v": _key_blocks(vh, block)}
  if bias is not None:
    xs["bias"] = _bias_blocks(bias, block)
  return xs


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def blocked_attention(q, k, v, bias=None, block: int = BLOCKED_BLOCK):
  """softmax(q k^T / sqrt(D) + bias) v for (B, T, N, D) inputs and an optional (1 or B, N, T, S)
  bias, keys in blocks of `block` tokens (a block of all S keys for windows).

  Peak memory is one (B, N, T, block) score block instead of (B, N, T, S); the backward pass
  recomputes each block's scores from the saved log-sum-exp (no score matrix is kept).
  """
  return _fwd(q, k, v, bias, block)[0]


def _fwd(q, k, v, bias, block):
  qh, kh, vh = (_heads_first(x) for x in (q, k, v))
  out, lse = _forward(qh, kh, vh, bias, block)
  out = out.astype(q.dtype)
  return _heads_first(out), (qh, kh, vh, bias, out, lse)


def _bwd(block, res, dout):
  qh, kh, vh, bias, out, lse = res
  scale = 1.0 / math.sqrt(qh.shape[-1])
  do = _heads_first(dout)
  delta = jnp.sum(do.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)  # (B, N, T)
  qs = qh * scale

  def body(dq, blk):
    kb, vb = blk["k"], blk["v"]
    s = jnp.einsum("bntd,bnsd->bnts", qs, kb, preferred_element_type=jnp.float32)
    if "bias" in blk:
      s = s + blk["bias"].astype(jnp.float32)
    p = jnp.exp(s - lse[..., None])  # (B, N, T, block)
    dv = jnp.einsum("bnts,bntd->bnsd", p.astype(do.dtype), do, preferred_element_type=jnp.float32)
    dp = jnp.einsum("bntd,bnsd->bnts", do, vb, preferred_element_type=jnp.float32)
    ds = p * (dp - delta[..., None])  # d loss / d scores
    dq = dq + jnp.einsum(
      "bnts,bnsd->bntd", ds.astype(qh.dtype), kb, preferred_element_type=jnp.float32
    )
    dk = jnp.einsum("bnts,bntd->bnsd", ds.astype(qh.dtype), qs, preferred_element_type=jnp.float32)
    out = {"k": dk, "v": dv}
    if "bias" in blk:
      # the sum over the batch as a matmul: XLA:CPU's reduction over this leading axis is 40x slower
      out["bias"] = (
        (jnp.ones((1, ds.shape[0]), ds.dtype) @ ds.reshape(ds.shape[0], -1)).reshape(
          1, *ds.shape[1:]
        )
        if blk["bias"].shape[0] == 1
        else ds
      )
    return dq, out

  dq, grads = jax.lax.scan(body, jnp.zeros(qh.shape, jnp.float32), _blocks(kh, vh, bias, block))
  unblock = lambda x, like: _heads_first(jnp.moveaxis(x, 0, 2).reshape(like.shape)).astype(
    like.dtype
  )
  dbias = None
  if bias is not None:
    dbias = jnp.moveaxis(grads["bias"], 0, 3).reshape(bias.shape).astype(bias.dtype)
  return (
    _heads_first(dq * scale).astype(qh.dtype),
    unblock(grads["k"], kh),
    unblock(grads["v"], vh),
    dbias,
  )


blocked_attention.defvjp(_fwd, _bwd)


# ----------------------------------------------------------------------------- splash (TPU)


def _splash_kernel(tokens: int, heads: int, block: int, interpret: bool):
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

  mask = sm.MultiHeadMask([sm.FullMask((tokens, tokens)) for _ in range(heads)])
  sizes = sk.BlockSizes(
    block_q=block,
    block_kv=block,
    block_kv_compute=block,
    block_q_dkv=block,
    block_kv_dkv=block,
    block_kv_dkv_compute=block,
    block_q_dq=block,
    block_kv_dq=block,
  )
  return sk.make_splash_mha(
    mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret
  )


def splash_attention(
  q, k, v, block: int = SPLASH_BLOCK, interpret: bool = False, batch_axis: str = "data"
):
  """Splash attention for (B, T, N, D) inputs; under a mesh (`jax.set_mesh`) with `batch_axis`,
  each device runs the kernel on its own batch shard (a Pallas call is not auto-partitioned)."""
  b, t, n, d = q.shape
  kernel = _splash_kernel(t, n, min(block, t), interpret)

  def local(q, k, v):
    out = jax.vmap(kernel)(
      _heads_first(q * (1.0 / math.sqrt(d))).astype(q.dtype), _heads_first(k), _heads_first(v)
    )
    return _heads_first(out)

  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or batch_axis not in mesh.axis_names or mesh.shape[batch_axis] == 1:
    return local(q, k, v)
  spec = P(batch_axis)
  return jax.shard_map(
    local, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec, check_vma=False
  )(q, k, v)


# ----------------------------------------------------------------------------- dispatch


def attend(q, k, v, bias=None, *, impl: str = "xla", interpret: bool = False):
  """Attention of (B, T, N, D) inputs with an optional (1, N, T, T) bias, by backend `impl`
  (already resolved, see `resolve`)."""
  keys = k.shape[1]
  if impl == "blocked":  # windows and short grids: one block of all keys
    long = keys > BLOCKED_BLOCK and keys % BLOCKED_BLOCK == 0
    return blocked_attention(q, k, v, bias, BLOCKED_BLOCK if long else keys)
  if impl == "splash" and bias is None and keys == q.shape[1] and keys % SPLASH_BLOCK == 0:
    return splash_attention(q, k, v, SPLASH_BLOCK, interpret=interpret)
  if impl == "cudnn":
    return jax.nn.dot_product_attention(q, k, v, bias=bias, implementation="cudnn")
  return jax.nn.dot_product_attention(q, k, v, bias=bias)
