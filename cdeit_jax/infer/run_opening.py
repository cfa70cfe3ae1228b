"""Opening a run for inference (the Reconstructor, eval.py, the reconstruct command and the
challenge's evaluation): a workdir's or model folder's checkpoint chosen (`choose`: its first
candidate whose metadata reads) with its config and the command's overrides checked
(`settings`: only the sampling, eval and W&B settings and the model's runtime keys may be set),
its weights loaded onto the devices (`load`), and the calibration of the uncertainty a step
keeps (`calibration`, `calibration_file`; `infer.intervals`); `open_run` does the opening once,
what the run's frames are (`run_frames`) resolved with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import jax
import ml_collections
import numpy as np

from cdeit_jax import config_lib
from cdeit_jax.checkpoints import checkpoint, loading, reader
from cdeit_jax.common import fileio, logs
from cdeit_jax.common import sharding as shd
from cdeit_jax.common.errors import InputError
from cdeit_jax.eit import measurement
from cdeit_jax.infer import intervals, refinement, run_frames
from cdeit_jax.model.system import ModelSystem

log = logs.log.getChild("eval")

# What eval.py and the reconstruct command may set; everything else (model, data, diffusion) is
# the checkpoint's.
SETTABLE = (
  "sampling.",
  "eval.",
  "wandb.",
  *(f"model.{k}" for k in loading.RUNTIME_MODEL_KEYS),
)
UNCERTAINTY_FILE = "uncertainty.json"  # in a step folder: the std's calibration (intervals)
# in a workdir: the device whose frames the run's model reads translated (`cdeit_jax.translate`)
TRANSLATION_FILE, MODEL_FOLDER = checkpoint.TRANSLATION_FILE, checkpoint.MODEL_FOLDER
MAX_SAMPLES = 1024  # samples per frame: a frame's K share its batches (1024 x 64 KB per frame)


def settings(
  meta: dict[str, Any], overrides: dict[str, Any], flag: str = "--config."
) -> ml_collections.ConfigDict:
  """The checkpoint's config with `overrides` (dotted keys) applied and the sampling settings
  checked; errors name `<flag><key>` (`--config.<key>`; ship's `--set <key>`)."""
  for key in overrides:
    if not key.startswith(SETTABLE):
      raise InputError(
        f"--config.{key}: evaluation takes the model, data and training settings "
        "from the checkpoint; only config.sampling.*, config.eval.*, config.wandb.* and "
        f"config.model.{{{','.join(loading.RUNTIME_MODEL_KEYS)}}} can be set"
      )
  cfg = loading.model_config(meta)
  config_lib.override(cfg, overrides, flag)
  s, e = cfg.sampling, cfg.eval

  def need(ok: bool, key: str, msg: str) -> None:
    if not ok:
      section, leaf = key.split(".")
      raise InputError(f"{flag}{key}={cfg[section][leaf]!r}: {msg}")

  need(s.steps >= 1, "sampling.steps", "must be >= 1")
  need(
    is_int(s.num_samples) and 1 <= s.num_samples <= MAX_SAMPLES,
    "sampling.num_samples",
    f"must be an integer from 1 to {MAX_SAMPLES}",
  )
  need(
    0 <= s.eta <= 1,
    "sampling.eta",
    "must be in [0, 1] (0: deterministic DDIM, 1: the published sampler)",
  )
  need(s.data_consistency >= 0, "sampling.data_consistency", "must be >= 0 (0 = off)")
  need(s.data_consistency_alpha > 0, "sampling.data_consistency_alpha", "must be > 0")
  need(isinstance(s.symmetric, bool), "sampling.symmetric", "must be True or False")
  need(e.max_examples is None or e.max_examples >= 1, "eval.max_examples", "must be >= 1")
  for ratio in ("voltage_ratio", "current_ratio"):  # the units' own rule, checked up front
    r = e.get(ratio)
    try:
      ok = r is None or measurement.checked_ratios(r, 1.0) is not None
    except InputError:
      ok = False
    need(ok, f"eval.{ratio}", "must be a positive number (measured / simulated units)")
  # a bad one: one line naming the flag
  refinement.Refinement.parse(e.get("refinement", ""), f"{flag}eval.refinement")
  need(
    e.weights in checkpoint.WEIGHT_ITEMS,
    "eval.weights",
    f"must be one of {sorted(checkpoint.WEIGHT_ITEMS)}",
  )
  return cfg


def uncertainty_scale(path: str) -> float:
  """The 1-std scale of the calibration kept at `path` (a step folder's UNCERTAINTY_FILE); 1 if
  none."""
  return intervals.read(path).std_scale


def calibration(run: reader.Run, step: int, cfg: ml_collections.ConfigDict):
  """The `intervals.Calibration` a step's std is read with: the file `--config.eval.calibration`
  names (one fitted elsewhere, e.g. beside the outputs of a fit on a model folder that ships with
  the code), else the step's own (`calibration_file`; none: uncalibrated)."""
  given = cfg.eval.calibration
  if given is not None and not fileio.path(given).exists():
    raise InputError(
      f"--config.eval.calibration={given}: no such file (an {UNCERTAINTY_FILE} that eval.py "
      "--config.eval.fit_uncertainty=True wrote)"
    )
  return intervals.read(given or calibration_file(run, step))


def check_overrides(overrides: dict[str, Any]) -> None:
  """Bad keys and values fail before any work (against the default config)."""
  settings({"model": {}}, overrides)


def choose(
  run: reader.Run, overrides: dict[str, Any]
) -> tuple[reader.Meta, dict[int, str], ml_collections.ConfigDict]:
  """(meta, skipped, config) of the run's first candidate whose metadata reads, its config with
  `overrides` applied and checked."""
  meta, skipped = run.first_readable()
  return meta, skipped, settings(meta.record, overrides)


def load(
  run: reader.Run,
  meta: reader.Meta,
  skipped: dict[int, str],
  cfg: ml_collections.ConfigDict,
  overrides: dict[str, Any],
  mesh: jax.sharding.Mesh,
  system: ModelSystem,
) -> reader.Loaded:
  """The model of the first candidate from `meta`'s step on whose weights load, replicated over
  `mesh`, with the model's runtime overrides; logs the steps passed over. `system`: what the
  model is of, as the command resolved it (`loading.resolve`)."""
  runtime = {k.split(".", 1)[1]: v for k, v in overrides.items() if k.startswith("model.")}
  loaded = run.load(
    system,
    weights=cfg.eval.weights,
    sharding=shd.replicated(mesh),
    start=meta.step,
    passed=skipped,
    **runtime,
  )
  for bad, reason in loaded.skipped.items():
    log.warning(f"skipping checkpoint step {bad}: {reason}")
  log.info(f"checkpoint {run.step_dir(loaded.meta.step)}: {loaded.reason}")
  return loaded


@dataclasses.dataclass(frozen=True)
class Opened:
  """A run opened for inference, everything about it resolved once: the reader's `run`, its
  chosen candidate (`meta`, `skipped`: `choose`), its config with the command's `overrides`
  (`cfg`), the model's measuring system (`system`, `loading.resolve`) and what its frames are
  (`frames`, a `run_frames.Frames`: the model's own system's values, or a translated run's
  device's, `translated_run.TranslatedDevice`)."""

  run: reader.Run
  meta: reader.Meta
  skipped: dict[int, str]
  cfg: ml_collections.ConfigDict
  overrides: dict[str, Any]
  system: ModelSystem
  frames: run_frames.Frames
  path: str  # the workdir as given (a translated run's: the folder beside its model)

  @property
  def workdir(self) -> str:
    return self.run.workdir


@contextlib.contextmanager
def open_run(path: str, overrides: dict[str, Any] | None = None) -> Iterator[Opened]:
  """The run at `path` opened for inference (`Opened`), its overrides checked first. A
  translated run (`python -m cdeit_jax.translate`) keeps its model whole in `MODEL_FOLDER`
  beside its device (`TRANSLATION_FILE`): its model is read from there, and its frames are the
  device's; this is the one place that tells the two apart."""
  from cdeit_jax.infer import translated_run

  overrides = dict(overrides or {})
  check_overrides(overrides)
  translated = fileio.join(path, TRANSLATION_FILE)
  is_translated = fileio.path(translated).exists()
  folder = fileio.join(path, MODEL_FOLDER) if is_translated else path
  with reader.open_run(folder, overrides.get("eval.step")) as run:
    meta, skipped, cfg = choose(run, overrides)
    system = loading.resolve(cfg, meta.record)
    frames = (
      translated_run.TranslatedDevice.open(translated, system.device)
      if is_translated
      else run_frames.Frames(system.device)
    )
    yield Opened(run, meta, skipped, cfg, overrides, system, frames, path)


def config_of(path: str, overrides: dict[str, Any] | None = None) -> ml_collections.ConfigDict:
  """The config the run at `path` is evaluated with (its chosen checkpoint's, `overrides`
  applied): what the commands' --config_help lists."""
  with open_run(path, overrides) as opened:
    return opened.cfg


def load_opened(opened: Opened, mesh: jax.sharding.Mesh) -> reader.Loaded:
  """`load` of an opened run's chosen candidate."""
  o = opened
  return load(o.run, o.meta, o.skipped, o.cfg, o.overrides, mesh, o.system)


def calibration_file(run: reader.Run, step: int) -> str:
  """Where a step keeps its uncertainty scale (UNCERTAINTY_FILE)."""
  return fileio.join(run.step_dir(step), UNCERTAINTY_FILE)


def is_int(v: Any) -> bool:
  """Whether `v` is an integer (numpy's too), not a bool."""
  return isinstance(v, (int, np.integer)) and not isinstance(v, bool)
