"""Training: state, optimizer, the authors' EMA, and the jit-compiled sharded train/eval steps.

The train step is a pure function of (state, batch, rng, constants): per-step randomness is
`fold_in(rng, state.step)`, so runs are reproducible and resume exactly. `constants` are the
model's fixed variables (the physics-informed model's linear operator and calibration; empty for
the published model): computed from the config, never changed by training, so they are not part
of the state (nor of its checkpoints), and they are passed, not closed over, so that the arrays
are not embedded in the executable. Gradient accumulation runs inside the step (`lax.scan` over
micro-batches, each spread over every device).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import nnx, struct
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from cdeit_jax.common import sharding as shd
from cdeit_jax.common.errors import InputError
from cdeit_jax.common.variables import Fixed
from cdeit_jax.model.diffusion import Diffusion
from cdeit_jax.model.network import CDEIT


class TrainState(struct.PyTreeNode):
  step: jax.Array  # optimizer steps done (int32 scalar)
  params: nnx.State  # trained parameters (nnx.Param), float32
  opt_state: optax.OptState
  ema: nnx.State  # EMA of `params` (the authors' ema_pytorch semantics)


def create_state(
  model: CDEIT, tx: optax.GradientTransformation
) -> tuple[nnx.GraphDef, TrainState, nnx.State]:
  """(graphdef, fresh training state, the model's constants)."""
  graphdef, params, constants = nnx.split(model, nnx.Param, Fixed)
  state = TrainState(
    step=jnp.zeros((), jnp.int32),
    params=params,
    opt_state=tx.init(params),
    ema=jax.tree.map(jnp.copy, params),
  )
  return graphdef, state, constants


# ----------------------------------------------------------------------------- optimizer


class ScheduleState(NamedTuple):
  """The learning-rate schedule's state, part of the optimizer state (so checkpoints keep it):
  optimizer steps done, and `horizon`, the step its decay ends at (`config.steps`, or under a
  wall-clock budget the step the budget is expected to reach: `train.budget`)."""

  count: jax.Array  # int32
  horizon: jax.Array  # int32


LearningRate = Callable[[jax.Array, jax.Array], jax.Array]  # (count, horizon) -> lr


def learning_rate_fn(cfg: ml_collections.ConfigDict) -> LearningRate:
  """The schedule as a function of the step and the horizon (a traced value, so a horizon set
  during training changes no compiled code). Warm-up and cosine as optax's
  `warmup_cosine_decay_schedule` with `decay_steps=horizon` (written out here because optax's
  takes its length as a Python number)."""
  o = cfg.optimizer
  if o.schedule == "constant":
    return lambda count, horizon: jnp.asarray(o.lr, jnp.float32)
  if o.schedule != "warmup_cosine":
    raise InputError(
      f"config.optimizer.schedule: {o.schedule!r} is not 'constant' or 'warmup_cosine'"
    )
  peak, warm, end = float(o.lr), int(o.warmup_steps), float(o.lr * o.end_lr_factor)

  def lr(count: jax.Array, horizon: jax.Array) -> jax.Array:
    c = jnp.asarray(count, jnp.float32)
    decay = jnp.maximum(jnp.asarray(horizon, jnp.float32) - warm, 1.0)
    cosine = 0.5 * (1.0 + jnp.cos(jnp.pi * jnp.clip((c - warm) / decay, 0.0, 1.0)))
    value = end + (peak - end) * cosine
    return jnp.where(c < warm, peak * c / max(warm, 1), value) if warm else value

  return lr


def default_horizon(cfg: ml_collections.ConfigDict) -> int:
  """The horizon without a budget: the run's steps (at least one past the warm-up)."""
  return max(int(cfg.steps), int(cfg.optimizer.warmup_steps) + 1)


def scale_by_learning_rate(lr: LearningRate, horizon: int) -> optax.GradientTransformation:
  """optax's `scale_by_learning_rate` for a schedule of (count, horizon), the horizon kept in
  the state (`ScheduleState`)."""

  def init(params):
    del params
    return ScheduleState(jnp.zeros([], jnp.int32), jnp.asarray(horizon, jnp.int32))

  def update(updates, state, params=None):
    del params
    step = -lr(state.count, state.horizon)
    updates = jax.tree.map(lambda g: jnp.asarray(step, g.dtype) * g, updates)
    return updates, ScheduleState(optax.safe_increment(state.count), state.horizon)

  return optax.GradientTransformation(init, update)


def make_optimizer(
  cfg: ml_collections.ConfigDict,
) -> tuple[optax.GradientTransformation, LearningRate]:
  """Adam (PyTorch defaults: eps 1e-8 outside the sqrt, no weight decay) after global-norm
  clipping, its learning rate `learning_rate_fn`'s."""
  o = cfg.optimizer
  lr = learning_rate_fn(cfg)
  # identity() keeps the state's structure when clipping is off, so checkpoints still restore.
  clip = optax.clip_by_global_norm(o.grad_clip) if o.grad_clip else optax.identity()
  adam = optax.scale_by_adam(b1=o.b1, b2=o.b2, eps=o.eps)
  return optax.chain(clip, adam, scale_by_learning_rate(lr, default_horizon(cfg))), lr


def horizon_of(state: TrainState) -> jax.Array:
  """The step the learning rate's decay ends at (`ScheduleState.horizon`)."""
  return optax.tree_utils.tree_get(state.opt_state, "horizon")


def with_horizon(state: TrainState, horizon: int) -> TrainState:
  """`state` whose schedule now ends at `horizon` (placed as the old value: no recompilation)."""
  old = horizon_of(state)
  new = jax.device_put(jnp.asarray(horizon, jnp.int32), old.sharding)
  return state.replace(opt_state=optax.tree_utils.tree_set(state.opt_state, horizon=new))


# ----------------------------------------------------------------------------- EMA


def ema_decay(n: jax.Array, beta: float, update_after_step: int, power: float) -> jax.Array:
  """ema_pytorch 0.5.2's decay at counter n (> update_after_step):
  min(beta, 1 - (n - after)^-power)."""
  epoch = jnp.maximum(n.astype(jnp.float32) - update_after_step, 1.0)
  return jnp.clip(1.0 - epoch ** (-power), 0.0, beta)


def ema_update(
  ema, params, n: jax.Array, *, beta: float, update_every: int, update_after_step: int, power: float
):
  """One `EMA.update()` of ema_pytorch 0.5.2 (its defaults are `config.ema`'s) after optimizer
  step n (counting from 0): acts only
  when n % update_every == 0; copies the weights while n <= update_after_step; else
  ema = ema * d + w * (1 - d)."""

  def act(ema):
    d = ema_decay(n, beta, update_after_step, power)
    return jax.lax.cond(
      n <= update_after_step,
      lambda: jax.tree.map(lambda p: p.astype(jnp.float32), params),
      lambda: jax.tree.map(lambda e, p: e * d + p * (1 - d), ema, params),
    )

  return jax.lax.cond(n % update_every == 0, act, lambda e: e, ema)


# ----------------------------------------------------------------------------- steps


def _draws(key: jax.Array, target: jax.Array, num_steps: int):
  k_t, k_n = jax.random.split(key)
  t = jax.random.randint(k_t, (target.shape[0],), 0, num_steps)
  return t, jax.random.normal(k_n, target.shape, jnp.float32)


def make_train_step(
  graphdef: nnx.GraphDef,
  diffusion: Diffusion,
  tx: optax.GradientTransformation,
  lr: LearningRate,
  accum_steps: int,
  e: ml_collections.ConfigDict,
  mesh: jax.sharding.Mesh | None = None,
) -> Callable[[TrainState, dict, jax.Array, nnx.State], tuple[TrainState, dict]]:
  """The pure train step; `batch` holds `cond` (G,16,16,1) (or (G, R) voltages) and `target`
  (G,H,W,1); `accum_steps`
  micro-batches per step; `e` the EMA settings (`config.ema`)."""

  def loss_fn(params, constants, mb):
    model = nnx.merge(graphdef, params, constants)
    return model.system.output.loss(
      model, diffusion, mb["target"], mb["t"], mb["cond"], mb["noise"]
    )

  grad_fn = jax.value_and_grad(loss_fn)

  def micro_batches(x):
    """(G, ...) -> (k, G/k, ...): micro-batch j takes rows j, j+k, ..., so each is spread over
    every device like the full batch."""
    k = accum_steps
    x = jnp.swapaxes(x.reshape(x.shape[0] // k, k, *x.shape[1:]), 0, 1)
    if mesh is not None:
      x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(None, shd.DATA)))
    return x

  def train_step(state: TrainState, batch: dict, rng: jax.Array, constants: nnx.State):
    key = jax.random.fold_in(rng, state.step)
    t, noise = _draws(key, batch["target"], diffusion.num_steps)
    cond = batch["cond"]
    model = nnx.merge(graphdef, state.params, constants)
    if model.removes_values:  # a device's removed electrodes, drawn per example
      cond = model.remove_values(cond, jax.random.fold_in(key, 2))
    data = {"cond": cond, "target": batch["target"], "t": t, "noise": noise}
    if accum_steps == 1:
      loss, grads = grad_fn(state.params, constants, data)
    else:

      def body(carry, mb):
        loss_sum, g_sum = carry
        loss, g = grad_fn(state.params, constants, mb)
        return (loss_sum + loss, jax.tree.map(jnp.add, g_sum, g)), None

      zeros = jax.tree.map(jnp.zeros_like, state.params)
      (loss, grads), _ = jax.lax.scan(
        body, (jnp.zeros((), jnp.float32), zeros), jax.tree.map(micro_batches, data)
      )
      loss = loss / accum_steps
      grads = jax.tree.map(lambda g: g / accum_steps, grads)
    grad_norm = optax.global_norm(grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    ema = ema_update(
      state.ema,
      params,
      state.step,
      beta=e.beta,
      update_every=e.update_every,
      update_after_step=e.update_after_step,
      power=e.power,
    )
    new = state.replace(step=state.step + 1, params=params, opt_state=opt_state, ema=ema)
    metrics = {
      "loss": loss,
      "grad_norm": grad_norm,
      "lr": lr(state.step, horizon_of(state)),
      "finite": jnp.isfinite(loss) & jnp.isfinite(grad_norm),
    }
    return new, metrics

  return train_step


def make_eval_step(graphdef: nnx.GraphDef, diffusion: Diffusion):
  """(weights, constants, batch with mask, key) -> (sum of the per-example losses: L1, or a
  segmenter's cross-entropy; number of examples)."""

  def eval_step(params, constants, batch, key):
    model = nnx.merge(graphdef, params, constants)
    t, noise = _draws(key, batch["target"], diffusion.num_steps)
    err = model.system.output.per_example_loss(
      model, diffusion, batch["target"], t, batch["cond"], noise
    )
    return jnp.sum(err * batch["mask"]), jnp.sum(batch["mask"])

  return eval_step


# ----------------------------------------------------------------------------- compilation


@dataclasses.dataclass
class Setup:
  """The objects of a training run, built once from the config (the training loop, the
  benchmark, the AOT check and the tests use it)."""

  graphdef: nnx.GraphDef
  state: TrainState  # concrete, or ShapeDtypeStructs when built `abstract`
  constants: nnx.State  # the model's fixed variables (see the module docstring)
  step_fn: Callable
  diffusion: Diffusion
  num_params: int
  model_kwargs: dict
  system: Any  # what the model is of (`model.system.ModelSystem`), resolved once


def setup(
  cfg: ml_collections.ConfigDict,
  system,
  mesh: jax.sharding.Mesh,
  *,
  platform: str | None = None,
  abstract: bool = False,
  calibration_source=None,
) -> Setup:
  """Model, optimizer, state and the pure train step of `cfg` for `mesh`'s platform; `abstract`
  builds shapes only (no parameters are materialised: compile-only checks). A physics-informed
  model is calibrated on `calibration_source` (the training `NpzSource`) when given. `system`:
  what the model is of, as the command resolved it (`loading.resolve`)."""
  from cdeit_jax import config_lib
  from cdeit_jax.checkpoints import loading
  from cdeit_jax.model.network import count_params

  platform = platform or mesh.devices.flat[0].platform
  kw = config_lib.model_kwargs(cfg, system, platform)
  tx, lr = make_optimizer(cfg)

  make = lambda: loading.build(cfg, system, seed=cfg.seed, platform=platform)
  if abstract:
    model = nnx.eval_shape(make)
    graphdef = nnx.split(model, nnx.Param, Fixed)[0]
    state, constants = jax.eval_shape(lambda: create_state(make(), tx)[1:])
  else:
    model = make()
    if calibration_source is not None and model.conditioner is not None:
      from cdeit_jax.eit import conditioning

      conditioning.calibrate(model.conditioner, calibration_source)
    graphdef, state, constants = create_state(model, tx)
  num_params = count_params(model)
  diffusion = Diffusion(**cfg.diffusion)
  step_fn = make_train_step(graphdef, diffusion, tx, lr, cfg.accum_steps, cfg.ema, mesh)
  return Setup(graphdef, state, constants, step_fn, diffusion, num_params, kw, system)


@dataclasses.dataclass
class CompiledStep:
  fn: Any  # the compiled executable: (state, batch, rng, constants)
  state_shardings: Any
  constants_shardings: Any
  batch_shardings: dict
  flops_per_step: float  # model FLOPs of the whole step (all devices; loops counted)
  memory: dict[str, int]
  compile_s: float


def abstract_batch(
  global_batch: int, image_size: int, in_channels: int = 1, cond_shape: tuple = (16, 16, 1)
) -> dict[str, jax.ShapeDtypeStruct]:
  return {
    "cond": jax.ShapeDtypeStruct((global_batch, *cond_shape), jnp.float32),
    "target": jax.ShapeDtypeStruct(
      (global_batch, image_size, image_size, in_channels), jnp.float32
    ),
  }


def compile_train_step(
  ts: Setup, global_batch: int, mesh: jax.sharding.Mesh, shard_params: bool = False
) -> CompiledStep:
  """The train step of `ts` jitted with explicit shardings and donated state (the constants are
  replicated and not donated), compiled ahead of time under `mesh` (`jax.set_mesh`, so that
  per-device kernels such as splash attention see it)."""
  import time

  from cdeit_jax.common import device_memory
  from cdeit_jax.model import flops

  shapes = lambda tree: jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), tree)
  abstract_state, abstract_constants = shapes(ts.state), shapes(ts.constants)
  state_sh = shd.state_shardings(abstract_state, mesh, shard_params)
  constants_sh = shd.state_shardings(abstract_constants, mesh)
  kw = ts.model_kwargs
  cond_shape = ts.system.cond_shape(kw.get("cond_size", 16))
  batch = abstract_batch(global_batch, kw["image_size"], kw.get("in_channels", 1), cond_shape)
  batch_sh = {k: shd.batch_sharded(mesh) for k in batch}
  jitted = jax.jit(
    ts.step_fn,
    in_shardings=(state_sh, batch_sh, shd.replicated(mesh), constants_sh),
    out_shardings=(state_sh, shd.replicated(mesh)),
    donate_argnums=(0,),
  )
  key = jax.eval_shape(lambda: jax.random.key(0))
  t0 = time.perf_counter()
  with jax.set_mesh(mesh):
    compiled = jitted.lower(abstract_state, batch, key, abstract_constants).compile()
  compile_s = time.perf_counter() - t0
  return CompiledStep(
    compiled,
    state_sh,
    constants_sh,
    batch_sh,
    flops.train_flops_per_example(kw) * global_batch,
    device_memory.memory_of(compiled),
    compile_s,
  )
