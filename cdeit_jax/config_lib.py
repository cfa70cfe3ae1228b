"""The default configuration (the CDEIT authors' recipe) and helpers to load and use configs.

Config files in `configs/` are small ml_collections files with `get_config()` that start from
`default_config()` here and change what differs. Each default lives once: `model` is `CDEIT`'s
keyword arguments and `diffusion` `Diffusion`'s, read from their signatures; the phantoms'
from `PhantomSpec`; the measuring system's from `cdeit_jax.eit.measurement`. Reading a config
imports no physics (no simulator, no conditioning).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import inspect
import os
import textwrap
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from ml_collections import config_dict

from cdeit_jax.common.errors import InputError, MissingFile
from cdeit_jax.eit import layout as layout_lib
from cdeit_jax.eit import measurement
from cdeit_jax.eit.spec import PhantomSpec, SystemSpec
from cdeit_jax.model import attention, condition_kinds, output_kinds
from cdeit_jax.model.diffusion import Diffusion
from cdeit_jax.model.network import CDEIT
from cdeit_jax.model.system import MODEL_KEYS

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class TrainingSource:
  """A kind of training data (`config.data.source`), as the config and the loop see it; the
  data layer opens each (`data.training_data.OPENERS`, keyed by the same names)."""

  name: str
  simulates: bool  # examples made by the simulator during training: no data.path, no epochs
  what: str  # in words, for errors


# The one table of training data sources (the first is the default).
SOURCES = {
  s.name: s
  for s in (
    TrainingSource("files", False, "npz folders under data.path"),
    TrainingSource("simulator", True, "examples made on the devices from config.simulator"),
  )
}


def training_source(cfg: ml_collections.ConfigDict) -> TrainingSource:
  """The source `config.data.source` names; an InputError naming the sources."""
  if cfg.data.source not in SOURCES:
    kinds = " or ".join(f"{s.name!r} ({s.what})" for s in SOURCES.values())
    raise InputError(f"config.data.source: {cfg.data.source!r} must be {kinds}")
  return SOURCES[cfg.data.source]


def signature_defaults(
  fn, skip: tuple[str, ...] = (), only: tuple[str, ...] | None = None
) -> dict[str, Any]:
  """The keyword defaults of `fn` (or of the names in `only`) as config values; a None default
  becomes a placeholder of its annotated type (`int | None` -> placeholder(int))."""
  out = {}
  for name, p in inspect.signature(fn).parameters.items():
    if name in skip or p.default is inspect.Parameter.empty or (only and name not in only):
      continue
    if p.default is None:
      kind = next(t for t in (int, float, str) if t.__name__ in str(p.annotation).split(" | "))
      out[name] = config_dict.placeholder(kind)
    else:
      out[name] = p.default
  return out


def _sampling_config() -> ml_collections.ConfigDict:
  """Sampling (eval.py, the Reconstructor): taken from the checkpoint's config, overridable there
  with --config.sampling.steps=10 and so on."""
  return ml_collections.ConfigDict(
    dict(
      **signature_defaults(Diffusion.sample_fn, only=("steps", "eta")),
      num_samples=1,  # K samples per measurement: the mean is the reconstruction, the std its
      # per-pixel uncertainty
      seed=0,
      batch_size=config_dict.placeholder(int),  # global; default: the largest that fits
      # > 0: move each x0 estimate towards the measurements, x0 + S M_alpha (y - J x0)
      data_consistency=0.0,
      data_consistency_alpha=0.1,
      # sample k of a frame sees the tank turned or mirrored by the k-th of its 8 symmetries and
      # is turned back (cdeit_jax.eit.symmetry): with K = 8 the mean is symmetric; K = 1 is
      # unchanged
      symmetric=False,
    )
  )


def _eval_config() -> ml_collections.ConfigDict:
  """Evaluation (eval.py): taken from the checkpoint's config, overridable there."""
  return ml_collections.ConfigDict(
    dict(
      step=config_dict.placeholder(int),  # default: the best validated step, else the latest
      weights="ema",  # ema | raw
      stats=config_dict.placeholder(str),  # folder with mean/std overriding the checkpoint's
      voltage_ratio=config_dict.placeholder(float),
      current_ratio=config_dict.placeholder(float),
      max_examples=config_dict.placeholder(int),  # only the first N files
      skip_bad_files=False,
      tikhonov=False,  # also the built-in one-step Tikhonov/NOSER baseline
      greit=False,  # also the GREIT baseline (cdeit_jax.eit.greit)
      # --data greit: the GREIT figures' definitions, EIDORS' ("eidors") or pyEIT's ("pyeit")
      greit_figures="eidors",
      figure=True,
      # K > 1 on simulations (the validation split): fit the split-conformal scales of the std
      # (infer.intervals) and keep them in the checkpoint's step folder (a model
      # folder that ships with the code is read-only: beside the outputs instead), where
      # every later evaluation of that step applies it
      fit_uncertainty=False,
      # the std's calibration to apply instead of the step's: an uncertainty.json (one fitted
      # beside the outputs of a model folder that ships with the code)
      calibration=config_dict.placeholder(str),
      # coverage levels fitted and reported beside 68.3 % and 95.4 % ("1 and 2 std"), e.g. (0.9,)
      interval_levels=(),
      # --data ktc2023_challenge: how the samples become the challenge's answer
      # (cdeit_jax.infer.answer_rules: "mean:T" conductive where the mean image, in label units,
      # is above +T, resistive below -T; "vote:T:Q" per-pixel class fractions of the samples;
      # ":area=A" drops a class covering under A of the tank)
      answer_rule="mean:0.3",
      # --data ktc2023_challenge: each answer refined against its own frame, its objects moved,
      # scaled and given their contrast (cdeit_jax.infer.refinement: "objects:tau=...:move=...",
      # "" none)
      refinement="",
      # --data ktc2023_challenge: the Tikhonov answer (the linearised one, and the baseline
      # beside a model's) keeps the pixels beyond this fraction of its image's largest magnitude
      tikhonov_segment_level=0.4,
      # a model with electrode removals (config.simulator.removals): --data simulated images
      # every example without the electrodes of this set (0: none removed; ktc2023: level K is
      # set K - 1); the Tikhonov baseline uses the same values
      removal=0,
    )
  )


def _data_config() -> ml_collections.ConfigDict:
  """The training data (train.py)."""
  return ml_collections.ConfigDict(
    dict(
      # files: npz folders under `path`; simulator: fresh examples made on the devices every step
      # from `config.simulator` (no files, no epochs; cdeit_jax.data.simulator_source)
      source=next(iter(SOURCES)),
      path=config_dict.placeholder(str),  # dataset root holding train/ valid/ test/
      units="simulated",  # "simulated" or a system of layout.PRESETS (sets the two ratios)
      voltage_ratio=config_dict.placeholder(float),
      current_ratio=config_dict.placeholder(float),
      stats=config_dict.placeholder(str),  # folder with mean/std; default: the dataset root
      skip_bad_files=False,  # True: skip unreadable/invalid files with a warning
      cache=True,  # keep decoded arrays in memory (CDEIT datasets are small)
      num_workers=0,
      num_threads=4,
      prefetch=8,
      seed=0,
      # files: turn and mirror each training example by one of the tank's 8 symmetries, drawn
      # afresh each epoch (cdeit_jax.eit.symmetry; exact for evenly spaced electrodes)
      augment=False,
      train_split="train",
      valid_split="valid",
    )
  )


def _simulator_config() -> ml_collections.ConfigDict:
  """The simulated distribution (cdeit_jax.data.synthetic): read by `python -m cdeit_jax.simulate`
  (files) and by the simulator data source (config.data.source="simulator") alike."""
  return ml_collections.ConfigDict(
    dict(
      seed=0,  # example i of a split is a function of (seed, split, i)
      snr_db=config_dict.FieldReference(40.0, field_type=float),  # noise on vh and vi; None: none
      contact_impedance=measurement.CONTACT_IMPEDANCE,
      # the measuring system: a preset of cdeit_jax.eit.layout ("cdeit16": CDEIT's 208 values;
      # "ktc2023") or a device's reference file (.mat/.npz, KTC or UEF keys); other than cdeit16
      # it needs config.model.cond="linear"
      layout="cdeit16",
      # electrodes removed, one set drawn per training example: "none", or "ktc2023" (the
      # challenge's 7 levels); a model reads only frames missing one of these sets
      removals="none",
      phantom=ml_collections.ConfigDict(dataclasses.asdict(PhantomSpec())),
      # the measuring system, drawn per example (eit.spec.SystemSpec: gain, contact impedances,
      # electrode layout, radius, background, SNR spread); SystemSpec.nominal() switches it off
      system=ml_collections.ConfigDict(dataclasses.asdict(SystemSpec())),
      tikhonov_alpha=config_dict.placeholder(float),  # TR in files; None: reconstruct's default
      # simulator source: normalisation statistics (and the physics-informed calibration) from
      # the first `stats_examples` training examples; validation on valid examples 0..N-1
      stats_examples=1024,
      valid_examples=256,
    )
  )


def default_config() -> ml_collections.ConfigDict:
  """The published model and diffusion, the authors' training recipe."""
  c = ml_collections.ConfigDict()
  # CDEIT's arguments. cond: "eim" (published) or "eim+linear" (physics-informed); dtype: the
  # compute dtype; attention_impl: auto = splash (TPU), cudnn (GPU, 16-bit), blocked (elsewhere),
  # or xla, blocked, cudnn, splash; attention_query_chunk: lower attention memory (xla backend).
  # (`cond`, `output` and `current_carrying` are what the model is of, `model.system.MODEL_KEYS`:
  # names that `checkpoints.loading.resolve` turns into its `ModelSystem`)
  c.model = ml_collections.ConfigDict(
    {**signature_defaults(CDEIT.__init__, skip=("system",)), **MODEL_KEYS}
  )
  c.diffusion = ml_collections.ConfigDict(signature_defaults(Diffusion.__init__))
  c.sampling, c.eval = _sampling_config(), _eval_config()
  c.data, c.simulator = _data_config(), _simulator_config()
  # Training: the authors' recipe.
  c.seed = 0
  c.batch_size = 16  # global, over all devices and hosts
  c.accum_steps = 1  # micro-batches per step (each spread over all devices)
  c.steps = 200_000
  # Wall-clock seconds this invocation of train.py may take, start-up and compilation included
  # (None: no limit): the run validates and saves before they end, and a warm-up-and-cosine
  # schedule decays over the steps the measured rate fits into them (cdeit_jax/train/budget.py);
  # `steps` stays the most it takes. A resumed run gets the budget afresh.
  c.time_budget_s = config_dict.placeholder(float)
  # Fine-tuning: a workdir or model folder (models/cdeit16) whose EMA weights start a new run
  # (optimizer and EMA from there afresh); its config.model must be this one's. Ignored once the
  # workdir has a checkpoint of its own (the run resumes from that).
  c.init_from = ""
  c.optimizer = ml_collections.ConfigDict(
    dict(
      lr=1e-5,
      b1=0.9,
      b2=0.999,
      eps=1e-8,
      grad_clip=1.0,
      schedule="constant",  # constant | warmup_cosine
      warmup_steps=0,
      end_lr_factor=0.0,
    )
  )
  c.ema = ml_collections.ConfigDict(
    dict(beta=0.995, update_every=10, update_after_step=100, power=2 / 3)
  )  # ema_pytorch 0.5.2 defaults
  c.shard_params = False  # True: FSDP-style, params/optimizer state split over the data axis
  # the devices the config is made for (configs/v5e8.py: 8); a run on fewer says so at start-up,
  # with how to get as many on a CPU (None: any number)
  c.expected_devices = config_dict.placeholder(int)
  c.log_every = 100
  c.eval_every = 1000  # validation loss (EMA weights, fixed seed); also the checkpoint interval
  c.eval_batch_size = config_dict.placeholder(int)  # default: batch_size
  c.eval_max_batches = config_dict.placeholder(int)  # default: the whole valid split
  c.eval_seed = 1234
  # A profiler trace (XProf / TensorBoard's profile plugin, Perfetto) of the steps start_step ..
  # start_step + num_steps - 1 (numbered by the state's step before each) in WORKDIR/profile;
  # python: also every Python function call (large traces).
  c.profile = ml_collections.ConfigDict(
    dict(start_step=config_dict.placeholder(int), num_steps=3, python=False)
  )
  c.keep_checkpoints = 3  # the latest few; the best (lowest validation loss) is kept as well
  c.async_checkpoints = True
  # gs:// workdirs: the lock is a lease renewed every lease/4 s; a run that cannot prove it holds
  # it stops (cdeit_jax/train/workdir_lock.py), a newcomer takes a lease not renewed for this long
  c.lock_lease_s = 120.0
  # Weights & Biases (the optional extra cdeit-jax[wandb]; cdeit_jax/common/tracking.py): a project
  # turns it on. mode: "" = online with credentials, else offline (WANDB_MODE, if set, decides);
  # "online", "offline" or "disabled".
  c.wandb = ml_collections.ConfigDict(dict(project="", entity="", name="", tags=(), mode=""))
  return c


def get_config() -> ml_collections.ConfigDict:
  """This module as a config file (the commands' default `--config`)."""
  return default_config()


def check_training_config(
  cfg: ml_collections.ConfigDict,
  num_devices: int,
  num_processes: int = 1,
  *,
  need_data: bool = True,
) -> None:
  """Check every training value up front; errors name the key and say how to fix it.
  `need_data=False` skips the dataset path (compile-only checks)."""

  def need(ok: bool, key: str, msg: str):
    if not ok:
      raise InputError(f"config.{key}={_get(cfg, key)!r}: {msg}")

  condition_kinds.of(cfg.model.cond), output_kinds.of(cfg.model.output)  # names checked now
  model_kwargs(cfg, None)
  for key in ("batch_size", "accum_steps", "steps", "log_every", "eval_every", "keep_checkpoints"):
    need(isinstance(_get(cfg, key), int) and _get(cfg, key) > 0, key, "must be a positive integer")
  need(
    cfg.batch_size % (num_devices * cfg.accum_steps) == 0,
    "batch_size",
    f"does not divide evenly over {num_devices} devices x {cfg.accum_steps} accumulation "
    f"steps; use a multiple of {num_devices * cfg.accum_steps}",
  )
  need(
    cfg.batch_size % num_processes == 0,
    "batch_size",
    f"does not divide over {num_processes} processes",
  )
  need(
    cfg.eval_batch_size is None
    or (isinstance(cfg.eval_batch_size, int) and cfg.eval_batch_size > 0),
    "eval_batch_size",
    "must be a positive integer (or None: batch_size)",
  )
  eb = cfg.eval_batch_size or cfg.batch_size
  need(eb % num_devices == 0, "eval_batch_size", f"must be a multiple of {num_devices} devices")
  need(
    cfg.profile.start_step is None
    or (isinstance(cfg.profile.start_step, int) and cfg.profile.start_step >= 0),
    "profile.start_step",
    "must be a step number >= 0 (or None: no profile)",
  )
  need(
    isinstance(cfg.profile.num_steps, int) and cfg.profile.num_steps > 0,
    "profile.num_steps",
    "must be a positive integer",
  )
  if "wandb" in cfg:
    need(
      cfg.wandb.mode in ("", "online", "offline", "disabled"),
      "wandb.mode",
      "must be 'online', 'offline', 'disabled' or '' (online with credentials, else offline)",
    )
  need(
    cfg.time_budget_s is None
    or (
      isinstance(cfg.time_budget_s, (int, float))
      and not isinstance(cfg.time_budget_s, bool)
      and 0 < cfg.time_budget_s < float("inf")
    ),
    "time_budget_s",
    "must be a finite number of seconds > 0 (or None: no limit; a run without a budget ends at "
    "config.steps)",
  )
  need(cfg.optimizer.lr > 0, "optimizer.lr", "must be > 0")
  need(cfg.optimizer.grad_clip >= 0, "optimizer.grad_clip", "must be >= 0 (0 disables clipping)")
  need(
    cfg.optimizer.schedule in ("constant", "warmup_cosine"),
    "optimizer.schedule",
    "must be 'constant' or 'warmup_cosine'",
  )
  need(0 < cfg.ema.beta < 1, "ema.beta", "must be in (0, 1)")
  need(cfg.ema.update_every > 0, "ema.update_every", "must be > 0")
  need(cfg.sampling.steps >= 1, "sampling.steps", "must be >= 1")
  need(cfg.diffusion.num_steps >= 1, "diffusion.num_steps", "must be >= 1")
  need(
    measurement.preset_ratios(cfg.data.units) is not None
    or (cfg.data.voltage_ratio is not None and cfg.data.current_ratio is not None),
    "data.units",
    f"unknown units: use one of {', '.join(measurement.unit_names())}, or set data.voltage_ratio "
    "and data.current_ratio",
  )
  need(
    cfg.data.source in SOURCES,
    "data.source",
    "must be " + " or ".join(f"{s.name!r} ({s.what})" for s in SOURCES.values()),
  )
  need(
    cfg.data.path is not None or not need_data or training_source(cfg).simulates,
    "data.path",
    f"set the dataset root holding {cfg.data.train_split}/ and {cfg.data.valid_split}/ "
    "(--config.data.path=DIR), or train on fresh simulations: --config.data.source=simulator",
  )


def from_json(stored: dict[str, Any]) -> ml_collections.ConfigDict:
  """`default_config()` updated with a stored config (a checkpoint's `meta["config"]`): keys this
  version does not know are ignored, keys it added keep their defaults."""
  cfg = default_config()

  def update(node: ml_collections.ConfigDict, tree: dict) -> None:
    for k, v in tree.items():
      if k not in node:
        continue
      if isinstance(node[k], ml_collections.ConfigDict):
        if isinstance(v, dict):
          update(node[k], v)
      else:
        node[k] = tuple(v) if isinstance(v, list) and isinstance(node[k], tuple) else v

  update(cfg, stored)
  return cfg


def override(
  cfg: ml_collections.ConfigDict, values: dict[str, Any], flag: str = "--config."
) -> None:
  """Set dotted keys (`{"sampling.steps": 2}`); an unknown key or a wrongly typed value is an
  InputError naming `<flag><key>` (`--config.<key>`, or ship's `--set <key>`)."""
  for key, value in values.items():
    node, *path = [cfg, *key.split(".")]
    *parents, leaf = path
    try:
      for p in parents:
        node = node[p]
      if leaf not in node:
        raise KeyError(
          f"no such key; config.{'.'.join(parents) or '<top>'} has {', '.join(sorted(node.keys()))}"
        )
      node[leaf] = (
        tuple(value) if isinstance(value, list) and isinstance(node[leaf], tuple) else value
      )
    except (KeyError, TypeError, AttributeError) as e:
      raise InputError(f"{flag}{key}={value!r}: {e.args[0] if e.args else e}") from None


def none_strings(cfg: ml_collections.ConfigDict) -> None:
  """Read `--config.key=None` as None: config_flags passes the text "None" to optional string
  fields (`data.stats`, `data.path`, ...) as the string itself."""
  for key, value in list(cfg.items()):
    if isinstance(value, ml_collections.ConfigDict):
      none_strings(value)
    elif isinstance(value, str) and value.strip() in ("None", "none", "null"):
      with cfg.unlocked():
        cfg[key] = None


def _get(cfg, key):
  node = cfg
  for k in key.split("."):
    node = node[k]
  return node


def measuring_system(
  sim: ml_collections.ConfigDict, kept: layout_lib.Layout | None
) -> layout_lib.Layout:
  """The one measuring-system value of `config.simulator`: `kept` (a device a checkpoint keeps)
  or, given None, the config's `layout` (a preset or a device file), with the config's contact
  impedance, which the simulator, the Jacobian and the conditioning all use."""
  # (`none_strings` reads a "none" given on a command line as None)
  lay = kept if kept is not None else layout_lib.as_layout(str(sim.layout or "cdeit16"))
  return lay.with_contact_impedance(float(sim.contact_impedance))


def model_kwargs(
  cfg: ml_collections.ConfigDict, system, platform: str | None = None
) -> dict[str, Any]:
  """`CDEIT(**model_kwargs(cfg, system), rngs=...)` arguments: the config's `model` section but
  the keys the resolved `system` (`model.system.ModelSystem`) holds as values, with the
  attention backend resolved for `platform` (default: the default backend's)."""
  kw = {k: v for k, v in cfg.model.items() if k not in MODEL_KEYS}
  kw["system"] = system
  if "cond_alphas" in kw:
    alphas = kw["cond_alphas"]
    if isinstance(alphas, (int, float)):
      alphas = (alphas,)
    if not alphas or not all(isinstance(a, (int, float)) and a > 0 for a in alphas):
      raise InputError(
        f"config.model.cond_alphas: {alphas!r} must be one or more numbers > 0 "
        "(regularisation levels), e.g. (0.03, 0.3)"
      )
    kw["cond_alphas"] = tuple(float(a) for a in alphas)
  if kw.get("dtype") not in DTYPES:
    raise InputError(f"config.model.dtype: {kw.get('dtype')!r} is not one of {sorted(DTYPES)}")
  kw["dtype"] = DTYPES[kw["dtype"]]
  kw["attention_impl"] = attention.resolve(
    kw.get("attention_impl"), platform or jax.default_backend(), kw["dtype"]
  )
  return kw


def load(path: str) -> ml_collections.ConfigDict:
  """`get_config()` of a config file, or `get_config(ARG)` of `FILE.py:ARG` as config_flags
  reads it (command lines use config_flags)."""
  path, sep, arg = path.partition(".py:")
  path += ".py" if sep else ""
  if not os.path.isfile(path):
    raise MissingFile(f"config file {path}: no such file")
  spec = importlib.util.spec_from_file_location(f"_cdeit_config_{abs(hash(path))}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not hasattr(module, "get_config"):
    raise InputError(f"config file {path}: defines no get_config()")
  return module.get_config(arg) if arg else module.get_config()


# ----------------------------------------------------------------------------- every key, explained

# The sections of the config tree in the order they are listed, each with its heading ("" is the
# top level: the training run's own keys).
SECTIONS = {
  "model": "the network (CDEIT's arguments, cdeit_jax/model/network.py): its sizes, what it reads "
  "and outputs, how it computes. A checkpoint keeps them; eval.py may change only dtype, "
  "attention_impl, attention_query_chunk and remat",
  "diffusion": "the diffusion process the model is trained on (cdeit_jax/model/diffusion.py)",
  "": "the training run (train.py)",
  "optimizer": "Adam after global-norm clipping (train.py; cdeit_jax/train/training.py)",
  "ema": "the weights' exponential moving average, ema_pytorch 0.5.2's rule: the EMA weights "
  "are validated, saved and evaluated",
  "data": "the training data (train.py; cdeit_jax/data)",
  "simulator": "the simulated measurements: python -m cdeit_jax.simulate's files and the "
  "simulator source (data.source=simulator); the model's measuring system",
  "simulator.phantom": "the random objects in the tank (cdeit_jax.eit.spec.PhantomSpec; sizes "
  "in units of the tank's radius)",
  "simulator.system": "the measuring system drawn per example (cdeit_jax.eit.spec.SystemSpec): "
  "a range (min, max) with min == max, or a spread of 0, switches that draw off",
  "sampling": "reconstructing (eval.py, python -m cdeit_jax.reconstruct, the Reconstructor): "
  "the checkpoint's values, changed with --config.sampling.KEY",
  "eval": "evaluating (eval.py): the checkpoint's values, changed with --config.eval.KEY",
  "profile": "a profiler trace of some training steps (XProf / TensorBoard, Perfetto) in "
  "WORKDIR/profile",
  "wandb": "Weights & Biases logging (pip install -e '.[wandb]'; docs/training.md)",
}

# What every key of `default_config()` means, by section (`SECTIONS`): the one place the
# commands' --config_help (`listing`) and docs/config.md (`markdown`, written by `make
# config-docs`) read, so a key added to the tree needs a line here (tests/test_config_docs.py).
KEYS = {
  # model: its sizes first
  "model.hidden_size": "width of every token at every scale (the patch embedding's output, "
  "every block's); a multiple of num_heads. Parameters grow with its square",
  "model.patch_size": "pixels per token side: the token grid is image_size / patch_size (64 x 64 "
  "at the defaults); attention's cost falls with its fourth power, the rest's with its square",
  "model.num_scales": "the U-net's levels: each halves the token grid (a patch merge, then two "
  "global blocks) and doubles it back on the way up; the token grid must divide by "
  "2**num_scales. There is no depth key: the network has 5 + 4 * num_scales blocks (21 at 4)",
  "model.num_heads": "attention heads of every block (each hidden_size / num_heads wide)",
  "model.mlp_ratio": "each block's MLP width / hidden_size",
  "model.window_size": "side, in tokens, of the attention windows of the four blocks at full "
  "resolution (the rest attend globally); None: the token grid / 4",
  "model.image_size": "side of the image in pixels (the simulator's 128; cond eim+linear and "
  "linear need 128)",
  "model.in_channels": "channels of the image (1: the conductivity change)",
  "model.freq_dim": "sinusoidal frequencies of the timestep's embedding, before its MLP",
  "model.cond_size": "side of the EIM the model reads (16: CDEIT's 16 electrodes), repeated "
  "up to image_size; cond linear reads no EIM",
  # model: what it reads and outputs
  "model.cond": "what the model reads: eim (the published 16 x 16 electrode interaction "
  "matrix), eim+linear (with linear reconstructions of the same voltages beside it) or linear "
  "(linear reconstructions of any measuring system's values; docs/simulator.md)",
  "model.cond_alphas": "cond eim+linear / linear: the linear reconstructions' regularisation "
  "levels, one input channel per level (and prior)",
  "model.cond_priors": "cond linear: the linear reconstructions' priors, any of noser, laplace, "
  "smooth (eim+linear: noser alone)",
  "model.cond_grid": "cond eim+linear / linear: side of the coarse grid the linear "
  "reconstructions are made on (then upsampled bilinearly); divides image_size",
  "model.current_carrying": "cond linear: use, or drop, the values measured on "
  "current-carrying electrodes in the linear reconstructions",
  "model.removal_input": "give every block the frame's electrode-removal set (KTC2023: its "
  "level) as a learnt vector beside the timestep's; needs cond linear and two or more sets in "
  "simulator.removals",
  "model.output": "what the model outputs: image (the diffusion sampler's images, published) or "
  "classes (a one-pass segmenter: water, resistive, conductive per pixel)",
  # model: how it computes (these may differ from the checkpoint's)
  "model.dtype": "compute dtype: float32, bfloat16 or float16; parameters stay float32",
  "model.attention_impl": "attention backend: auto (splash on TPU, cudnn on GPUs in 16 bits, "
  "blocked elsewhere), xla, blocked, cudnn or splash; one that cannot run on the platform falls "
  "back to auto's choice",
  "model.attention_query_chunk": "global attention over query chunks of this many tokens in "
  "turn (less memory with the xla backend); None: all at once",
  "model.remat": "recompute each block's activations in the backward pass: less memory, more "
  "compute",
  "diffusion.num_steps": "diffusion timesteps T of training; the sampler takes sampling.steps "
  "of them",
  "diffusion.beta_start": "noise variance beta of the first timestep (linear schedule)",
  "diffusion.beta_end": "noise variance beta of the last timestep",
  # the training run
  "seed": "seed of the initial weights and of every step's noise and timesteps (and removed "
  "electrode sets)",
  "batch_size": "the global batch: examples per step over all devices and hosts (a multiple "
  "of devices x accum_steps)",
  "accum_steps": "micro-batches per step (gradient accumulation), each spread over all devices",
  "steps": "training steps (with a time budget: the most it takes)",
  "time_budget_s": "wall-clock seconds this invocation may take, start-up and compilation "
  "included: it validates and saves in time, the schedule decays over the steps that fit "
  "(None: no limit)",
  "init_from": "fine-tuning: a workdir or model folder whose EMA weights start this run "
  "(optimizer and EMA afresh); ignored once the workdir has a checkpoint of its own",
  "shard_params": "split parameters and optimizer state over the devices (FSDP-style) instead "
  "of replicating them",
  "log_every": "steps between log lines (console, metrics.jsonl, TensorBoard)",
  "expected_devices": "the devices the config is made for (configs/v5e8.py: 8); a run on fewer "
  "says so in one line at start-up, with how to get that many on a CPU (XLA_FLAGS="
  "--xla_force_host_platform_device_count=N); None: any",
  "eval_every": "steps between validations (the EMA weights' loss at a fixed seed) and checkpoints",
  "eval_batch_size": "validation's global batch (None: batch_size)",
  "eval_max_batches": "validation batches each time (None: the whole validation split)",
  "eval_seed": "seed of validation's noise and timesteps (the same at every validation)",
  "keep_checkpoints": "the latest checkpoints kept; the best (lowest validation loss) is kept "
  "as well",
  "async_checkpoints": "save checkpoints in the background while training goes on",
  "lock_lease_s": "gs:// workdirs: seconds after its last renewal that a dead run's lock may be "
  "taken over (a run stops writing when it cannot renew within 3/4 of it)",
  "optimizer.lr": "the learning rate (warmup_cosine: its peak)",
  "optimizer.b1": "Adam's beta1",
  "optimizer.b2": "Adam's beta2",
  "optimizer.eps": "Adam's epsilon (outside the square root, as PyTorch's)",
  "optimizer.grad_clip": "the gradients' largest global norm (0: no clipping)",
  "optimizer.schedule": "constant, or warmup_cosine: a linear warm-up, then a cosine decay to "
  "lr * end_lr_factor at the last step (or the time budget's)",
  "optimizer.warmup_steps": "warmup_cosine: steps of the linear warm-up",
  "optimizer.end_lr_factor": "warmup_cosine: the final learning rate / lr",
  "ema.beta": "the EMA's largest decay",
  "ema.update_every": "optimizer steps between EMA updates",
  "ema.update_after_step": "the EMA copies the weights up to this step, then averages them",
  "ema.power": "the decay's warm-up: min(beta, 1 - (step - update_after_step) ** -power)",
  # the training data
  "data.source": "files (npz folders under data.path) or simulator (fresh examples made on the "
  "devices every step from the simulator section; no files, no epochs)",
  "data.path": "files: the dataset root holding the train_split and valid_split folders (local "
  "or gs://)",
  "data.units": "the files' units: simulated, or a measuring system's (cdeit16, uef2017, "
  "ktc2023), which sets the two ratios",
  "data.voltage_ratio": "measured / simulated voltage units, overriding the units' (None: the "
  "units')",
  "data.current_ratio": "measured / simulated current units, overriding the units' (None: the "
  "units')",
  "data.stats": "the statistics the voltages are standardised with: a folder with mean and std "
  "(.npy or .pth) or authors (the CDEIT authors', shipped); None: the dataset root's",
  "data.skip_bad_files": "skip unreadable or invalid files with a warning instead of refusing "
  "the dataset",
  "data.cache": "keep decoded examples in memory",
  "data.num_workers": "grain worker processes reading examples (0: in the training process)",
  "data.num_threads": "reader threads per process",
  "data.prefetch": "batches read ahead per process (per worker with num_workers > 0)",
  "data.seed": "seed of the files' order (reshuffled every epoch) and of data.augment",
  "data.augment": "files: turn and mirror each training example by one of the tank's 8 "
  "symmetries, drawn afresh each epoch (exact for evenly spaced electrodes)",
  "data.train_split": "the training folder under data.path",
  "data.valid_split": "the validation folder under data.path",
  # the simulator
  "simulator.seed": "example i of a split is a function of (seed, split, i) alone",
  "simulator.snr_db": "signal-to-noise ratio of the measurements' noise in dB (None: none)",
  "simulator.contact_impedance": "the electrodes' contact impedance (simulator units), used by "
  "the simulator, the Jacobian and the conditioning",
  "simulator.layout": "the measuring system: a preset (cdeit16: CDEIT's 16 electrodes and 208 "
  "values; uef2017, ktc2023) or a device's file (.mat or .npz); one whose electrodes and "
  "patterns are not CDEIT's needs model.cond linear",
  "simulator.removals": "electrodes removed, one set drawn per training example: none, ktc2023 "
  "(the challenge's 7 levels) or sets written out such as '-;3;3,4'",
  "simulator.tikhonov_alpha": "regularisation of the Tikhonov images (the TR of simulated "
  "files, the linearised KTC2023 answers); None: 0.1",
  "simulator.stats_examples": "data.source simulator: the statistics (and the linear "
  "conditioning's calibration) are measured on this many training examples",
  "simulator.valid_examples": "data.source simulator: validation examples",
  "simulator.phantom.min_inclusions": "fewest objects in a phantom",
  "simulator.phantom.max_inclusions": "most objects in a phantom (at most 6)",
  "simulator.phantom.min_size": "smallest bounding radius of an object",
  "simulator.phantom.max_size": "largest bounding radius of an object",
  "simulator.phantom.min_aspect": "an ellipse's smallest minor / major axis (a rectangle's "
  "short / long side)",
  "simulator.phantom.annulus_inner": "an annulus's inner / outer radius",
  "simulator.phantom.max_radius": "every object lies inside this radius",
  "simulator.phantom.v_min": "smallest |label| of an object: conductivity 10**v, v in "
  "+-[v_min, v_max]",
  "simulator.phantom.v_max": "largest |label| of an object",
  "simulator.phantom.resistive_v_min": "resistive objects' own smallest |label| (0 and 0: "
  "v_min and v_max)",
  "simulator.phantom.resistive_v_max": "resistive objects' own largest |label|",
  "simulator.phantom.separation": "smallest gap between objects' bounding circles",
  "simulator.phantom.near_wall": "fraction of candidate placements touching max_radius",
  "simulator.phantom.kinds": "the shapes drawn (uniformly), comma-separated: any of disc, "
  "ellipse, half_disc, annulus, rectangle, polygon, star",
  "simulator.phantom.target": "the image inside an object: label (its v) or class (+-1, as "
  "UEF2017's and KTC2023's truths)",
  "simulator.system.gain": "(min, max) of the voltages' amplitude factor (the device's "
  "calibration), log-uniform",
  "simulator.system.contact_impedance": "(min, max) of each electrode's contact impedance, "
  "drawn independently, log-uniform; (0, 0): simulator.contact_impedance",
  "simulator.system.rotation_deg": "all electrodes turned by up to +- this many degrees",
  "simulator.system.jitter_deg": "each electrode's centre moved by up to +- this many degrees",
  "simulator.system.width_deg": "(min, max) of the electrodes' width in degrees, one per example "
  "(clipped to keep a gap)",
  "simulator.system.width_jitter": "each electrode's width times 1 +- up to this",
  "simulator.system.passive": "probability of a passive (floating) electrode in every gap",
  "simulator.system.radius": "(min, max) of the tank's radius / the unit disk's, log-uniform",
  "simulator.system.background": "(min, max) of the background conductivity, log-uniform",
  "simulator.system.snr_spread_db": "each example's SNR is snr_db +- up to this",
  "simulator.system.drift": "(min, max) of the target frame's voltages / the empty tank's, "
  "log-uniform (the background's change between the two measurements)",
  "simulator.system.device_seed": ">= 0: every example is measured by the one system drawn from "
  "this seed (one device); -1: a system per example",
  # reconstructing
  "sampling.steps": "sampler steps per sample (the published 5): the time grows with them, the "
  "quality need not (docs/reconstructing.md)",
  "sampling.eta": "the sampler's noise: 0 deterministic (DDIM), 1 the published sampler",
  "sampling.num_samples": "samples per frame: their mean is the reconstruction, their std its "
  "per-pixel uncertainty",
  "sampling.seed": "seed of the sampler's noise",
  "sampling.batch_size": "frames per sampler call over all devices (None: the largest that fits)",
  "sampling.data_consistency": "> 0: move each step's image towards the measurements by this "
  "much of a linearised step, x0 + S M_alpha (y - J x0) (models that read the EIM)",
  "sampling.data_consistency_alpha": "regularisation alpha of that linearised step",
  "sampling.symmetric": "sample k sees the tank turned or mirrored by the k-th of its 8 "
  "symmetries and is turned back (with num_samples 8 the mean is symmetric)",
  # evaluating
  "eval.step": "the checkpoint step evaluated (None: the best validated one that loads, else "
  "the latest)",
  "eval.weights": "ema (the EMA weights) or raw (the optimizer's)",
  "eval.stats": "the statistics the voltages are standardised with: a folder with mean and std, "
  "or authors; None: those in the data folder's parent, else the checkpoint's",
  "eval.voltage_ratio": "the data's measured / simulated voltage units, overriding the units' "
  "(--units)",
  "eval.current_ratio": "the data's measured / simulated current units, overriding the units'",
  "eval.max_examples": "evaluate only the first N files (None: all)",
  "eval.skip_bad_files": "skip unreadable or invalid files with a warning",
  "eval.tikhonov": "also evaluate the one-step Tikhonov/NOSER baseline",
  "eval.greit": "also evaluate the GREIT baseline",
  "eval.greit_figures": "--data greit: the figures of merit as EIDORS (eidors) or pyEIT "
  "(pyeit) define them",
  "eval.figure": "write the figure of reconstructions (reconstructions.png)",
  "eval.fit_uncertainty": "num_samples > 1 on simulations: fit the std's split-conformal scales "
  "and keep them with the step, where later evaluations apply them",
  "eval.calibration": "an uncertainty.json to read the std with instead of the step's",
  "eval.interval_levels": "coverage levels fitted and reported beside 1 and 2 std, e.g. (0.9,)",
  "eval.answer_rule": "--data ktc2023_challenge: how samples become the answer: mean:T, "
  "vote:T:Q, argmax[:water=W] (a segmenter's), each with an optional :area=A "
  "(cdeit_jax/infer/answer_rules.py)",
  "eval.refinement": "--data ktc2023_challenge: each answer's objects moved, scaled and given "
  "their contrast to fit its frame, e.g. objects:tau=...:move=... ('' none; "
  "cdeit_jax/infer/refinement.py)",
  "eval.tikhonov_segment_level": "--data ktc2023_challenge: the Tikhonov answer keeps the pixels "
  "beyond this fraction of its image's largest magnitude",
  "eval.removal": "a model with electrode removals: the set --data simulated and GREIT's "
  "targets leave out (0: none removed; ktc2023: level K is set K - 1)",
  "profile.start_step": "first step traced (None: no trace)",
  "profile.num_steps": "steps traced",
  "profile.python": "also trace every Python function call (large traces)",
  "wandb.project": "a W&B project: set, the run logs to W&B from process 0",
  "wandb.entity": "the W&B team or user ('': your default)",
  "wandb.name": "the run's name ('': W&B's)",
  "wandb.tags": "the run's tags",
  "wandb.mode": "online, offline or disabled; '': WANDB_MODE if set, else online with "
  "credentials and offline without",
}


def leaves(cfg: ml_collections.ConfigDict, prefix: str = "") -> dict[str, Any]:
  """Every key of `cfg` (dotted, in the tree's order) with its value."""
  out = {}
  for k, v in cfg.items():
    if isinstance(v, ml_collections.ConfigDict):
      out.update(leaves(v, f"{prefix}{k}."))
    else:
      out[prefix + k] = v
  return out


def undescribed(cfg: ml_collections.ConfigDict | None = None) -> list[str]:
  """The keys of `cfg` (default: the default tree) without a meaning in `KEYS`."""
  return [k for k in leaves(default_config() if cfg is None else cfg) if k not in KEYS]


def key_type(cfg: ml_collections.ConfigDict, key: str) -> str:
  """The type a key takes, in words: "int", "float or None", "tuple of float"."""
  parent, _, leaf = key.rpartition(".")
  node = _get(cfg, parent) if parent else cfg
  value, kind = node[leaf], node.get_type(leaf)
  if isinstance(value, tuple):
    kinds = {type(v).__name__ for v in value}
    return f"tuple of {kinds.pop()}" if len(kinds) == 1 else "tuple"
  return f"{kind.__name__} or None" if value is None else kind.__name__


def _nearest_path(cfg: ml_collections.ConfigDict, key: str) -> tuple[list[str], Any]:
  """The parts of `key` each corrected to the nearest name where it is (difflib's, at a ratio of
  0.75: "preset" is not "prefetch"; else the one name it is a word of), as far as one is close,
  and the node they lead to."""
  node, parts = cfg, []
  for part in key.split("."):
    if not isinstance(node, ml_collections.ConfigDict):
      break
    names = [part] if part in node else list(node.keys())
    near = difflib.get_close_matches(part, names, n=1, cutoff=0.75)
    near = near or [n for n in names if part in n.split("_")]  # "heads": num_heads
    if len(near) != 1:
      break
    parts.append(near[0])
    node = node[near[0]]
  return parts, node


def closest_key(cfg: ml_collections.ConfigDict, key: str) -> str | None:
  """The key of `cfg` that `key` (not one of them) most likely meant: each part of its path
  corrected to the nearest name there, else a key of the same name in another section; None
  when none is close."""
  parts, node = _nearest_path(cfg, key)
  if len(parts) == key.count(".") + 1 and not isinstance(node, ml_collections.ConfigDict):
    return ".".join(parts)
  leaf = key.rpartition(".")[2]
  same = [k for k in leaves(cfg) if k.rpartition(".")[2] == leaf]
  return " or ".join(same[:3]) or None


def unknown_keys(cfg: ml_collections.ConfigDict, keys: list[str]) -> list[str]:
  """Of dotted `keys`, those that are not keys of `cfg`, each as an error naming it, with the
  key it most likely meant: "--config.model.hiden_size: no such config key (did you mean
  model.hidden_size?)", else what its path reaches."""
  known, out = leaves(cfg), []
  for key in keys:
    if key in known:
      continue
    near, (parts, node) = closest_key(cfg, key), _nearest_path(cfg, key)
    hint = "docs/config.md lists every key"
    if near:
      hint = f"did you mean {near}?"
    elif parts and isinstance(node, ml_collections.ConfigDict):
      hint = f"{'.'.join(parts)} has no {key.split('.')[len(parts)]}; {hint}"
    elif parts:
      hint = f"{'.'.join(parts)} is a key, not a section; {hint}"
    out.append(f"--config.{key}: no such config key ({hint})")
  return out


def listing(cfg: ml_collections.ConfigDict | None = None, source: str = "") -> str:
  """Every key of `cfg` (default: the defaults), section by section, one line each: its value,
  its default where `cfg` differs from it (marked `*`), its type and meaning (`KEYS`);
  `source` says where `cfg` is from. The commands' --config_help."""
  default = default_config()
  cfg = default if cfg is None else cfg
  values, defaults = leaves(cfg), leaves(default)
  kind = lambda key: key_type(default if key in defaults else cfg, key)  # a stored None's: None
  head = f"Config keys: the values of {source}" if source else "Config keys and their defaults"
  lines = [
    f"{head}; * where a value differs from the default. Set one with --config.KEY=VALUE "
    "(docs/config.md)."
  ]
  for section, keys in _by_section(values).items():
    lines += ["", f"{section or 'top level'}: {SECTIONS.get(section, '')}".rstrip(": ")]
    for key in keys:
      value, new = values[key], key not in defaults
      differs = new or value != defaults[key]
      note = "not in the defaults; " if new else f"default {defaults[key]!r}; " if differs else ""
      meaning = KEYS.get(key, "(not described)")
      lines.append(f"{'*' if differs else ' '} {key} = {value!r} ({note}{kind(key)}): {meaning}")
  return "\n".join(lines)


def _by_section(values: dict[str, Any]) -> dict[str, list[str]]:
  """The keys of `values` by section, in `SECTIONS`' order (then any other), each section's in
  `KEYS`' order (then any other)."""
  order = {k: i for i, k in enumerate(KEYS)}
  out = {s: [] for s in SECTIONS}
  for key in sorted(values, key=lambda k: order.get(k, len(order))):
    out.setdefault(key.rpartition(".")[0], []).append(key)
  return {s: keys for s, keys in out.items() if keys}


def markdown() -> str:
  """docs/config.md: every key of the default tree with its default, type and meaning, section
  by section (`make config-docs` writes it; a test keeps the file equal to this)."""
  cfg = default_config()
  values = leaves(cfg)
  para = lambda text: textwrap.fill(text, 100, break_on_hyphens=False, break_long_words=False)
  out = [
    "# Every config key",
    "",
    "<!-- Generated from cdeit_jax/config_lib.py (KEYS, SECTIONS) by `make config-docs`; edit "
    "the meanings there. -->",
    "",
    para(
      "One config tree holds every setting of training, evaluation and the simulator. A config "
      "file in `configs/` starts from these defaults (the CDEIT authors' model and recipe) and "
      "changes what differs; a command line changes any key with `--config.KEY=VALUE` "
      "(`--config.model.hidden_size=256`). eval.py and `python -m cdeit_jax.reconstruct` start "
      "from the checkpoint's config instead, of which they may change the `sampling`, `eval` and "
      "`wandb` keys and the model's runtime keys."
    ),
    "",
    "The commands print this list with the values they would use:",
    "",
    "```",
    "python train.py --config_help                          # the defaults",
    "python train.py --config configs/v5e8.py --config_help # a config's values beside them",
    "python eval.py --workdir models/cdeit16 --config_help  # a checkpoint's",
    "```",
    "",
    para(
      "A key that does not exist is refused in one line naming it and the key it most likely "
      "meant: `--config.model.hiden_size: no such config key (did you mean model.hidden_size?)`."
    ),
    "",
    para(
      "Coming from the PyTorch CDEIT: the defaults are the published network (image 128, patch "
      "2, width 512, 16 heads, 4 scales: 109,719,108 parameters) and the authors' training "
      "recipe. There is no depth key: the network has 5 + 4 * `num_scales` transformer blocks."
    ),
  ]
  for section, keys in _by_section(values).items():
    title = f"`{section}`" if section else "Top level"
    heading = SECTIONS[section][0].upper() + SECTIONS[section][1:] + "."
    out += ["", f"## {title}", "", para(heading), ""]
    out += ["| key | default | type | meaning |", "|---|---|---|---|"]
    for key in keys:
      cells = (f"`{key}`", f"`{values[key]!r}`", key_type(cfg, key), KEYS[key])
      out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
  return "\n".join(out) + "\n"
