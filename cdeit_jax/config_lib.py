"""The default configuration (the CDEIT authors' recipe) and helpers to load and use configs.

Config files in `configs/` are small ml_collections files with `get_config()` that start from
`default_config()` here and change what differs. Each default lives once: `model` is `CDEIT`'s
keyword arguments and `diffusion` `Diffusion`'s, read from their signatures; the phantoms'
from `PhantomSpec`; the measuring system's from `cdeit_jax.eit.measurement`. Reading a config
imports no physics (no simulator, no conditioning).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import os
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
