"""Weights & Biases tracking of a training run and its evaluations (process 0 only; optional).

`config.wandb.project` turns it on; without it nothing here imports `wandb` (the optional extra
cdeit-jax[wandb]). The run's id is kept in WORKDIR/wandb.json, so a resumed training continues
the same run and eval.py logs into it. Without credentials the run is offline (one line says how
to sync it). W&B never stops a training: a failure is one warning, and tracking stops.

An offline run cannot be resumed by W&B (each process writes a new offline-run folder, and
`wandb sync` of several folders of one id keeps only one: wandb/wandb#3841). So a resumed offline
run is written anew: metrics.jsonl's records up to the resumed step are logged again into a
fresh folder of the same id, and the folders the earlier attempts wrote (listed in wandb.json)
are removed; one folder then holds the whole run.
"""

from __future__ import annotations

import json
import netrc
import os
import shutil
from typing import Any

import ml_collections

from cdeit_jax.common import fileio, logs
from cdeit_jax.common.errors import InputError

log = logs.log.getChild("wandb")

RUN_FILE = "wandb.json"  # in the workdir: {"id", "project", "entity", "offline_dirs"}
MODES = {"online": "online", "run": "online", "offline": "offline", "dryrun": "offline"}
# How long an online run may take to start before it goes offline (wandb's own default, 90 s,
# held every training up for 95 s when the server was unreachable); WANDB_INIT_TIMEOUT overrides
INIT_TIMEOUT_S = 15.0


def settings(cfg: ml_collections.ConfigDict) -> ml_collections.ConfigDict | None:
  """The config's W&B settings, or None when W&B is off (no project, mode 'disabled', a config
  from before W&B)."""
  w = cfg.get("wandb")
  if w is None or not w.project or w.mode == "disabled":
    return None
  check_mode_env()
  return w


def check_mode_env() -> None:
  """WANDB_MODE as wandb reads it, checked before any work: left empty it counts as unset (it is
  removed: wandb itself refuses an empty one); a word that is not a mode is an InputError (wandb
  would turn itself off with a validation error of several lines)."""
  mode = os.environ.get("WANDB_MODE")
  if mode is None:
    return
  if not mode.strip():
    os.environ.pop("WANDB_MODE")
    return
  if mode not in MODES and mode != "disabled":
    raise InputError(
      f"WANDB_MODE={mode!r}: not a W&B mode; set it to online, offline or disabled, or unset it "
      "(then online with credentials, else offline)"
    )


def has_credentials() -> bool:
  """An API key in WANDB_API_KEY or a `wandb login` entry in ~/.netrc (what wandb reads)."""
  if os.environ.get("WANDB_API_KEY"):
    return True
  try:
    return netrc.netrc().authenticators("api.wandb.ai") is not None
  except (OSError, netrc.NetrcParseError):
    return False


def resolve_mode(mode: str) -> tuple[str, bool]:
  """(online | offline | disabled, whether offline for want of credentials): the config's mode,
  else WANDB_MODE, else online with credentials and offline without."""
  mode = mode or os.environ.get("WANDB_MODE", "")
  if mode == "disabled":
    return mode, False
  if mode:
    return MODES.get(mode, "offline"), False
  return ("online", False) if has_credentials() else ("offline", True)


def _local_dir(folder: str) -> str | None:
  """Where wandb writes: WANDB_DIR if set, else a local `folder` (the training's workdir, the
  evaluation's --out), else wandb's default (the current directory)."""
  if os.environ.get("WANDB_DIR") or fileio.is_remote(folder):
    return None
  return folder


def read_run(workdir: str) -> dict[str, Any] | None:
  """The workdir's W&B run record, or None; a damaged one is an InputError naming the file (the
  commands log it as a warning: W&B's failures never stop them)."""
  path = fileio.join(workdir, RUN_FILE)
  text = fileio.read_text(path)
  if not text:
    return None
  try:
    record = json.loads(text)
    if not (isinstance(record, dict) and isinstance(record.get("id"), str)):
      raise ValueError("no run id")
  except ValueError as e:
    raise InputError(
      f"{path}: damaged ({e}); remove it (the W&B run it named is then not resumed) or restore it"
    ) from None
  return record


def _init(w, mode: str, run_id: str | None, folder: str, config: dict, job_type: str):
  import wandb  # the optional extra: imported only when W&B is on

  return wandb.init(
    project=w.project,
    entity=w.entity or None,
    name=w.name or None,
    tags=list(w.tags) or None,
    id=run_id,
    resume="allow" if run_id else None,
    mode=mode,
    dir=_local_dir(folder),
    config=config,
    job_type=job_type,
    settings=wandb.Settings(
      console="off",
      silent=True,
      **({} if os.environ.get("WANDB_INIT_TIMEOUT") else {"init_timeout": INIT_TIMEOUT_S}),
    ),
  )


def _start(w, folder: str, run_id: str | None, config: dict, job_type: str):
  """(run, mode) or (None, mode) of run `run_id` (a new one if None) written under `folder`
  (`_local_dir`): online falls back to offline when it cannot start."""
  mode, no_credentials = resolve_mode(w.mode)
  if mode == "disabled":
    return None, mode
  try:
    run = _init(w, mode, run_id, folder, config, job_type)
  except Exception as e:  # noqa: BLE001 - W&B's failures never stop the command
    if mode != "online":
      raise
    log.warning(f"W&B: the online run did not start ({type(e).__name__}: {e}); logging offline")
    mode, run = "offline", _init(w, "offline", run_id, folder, config, job_type)
  if mode == "offline":
    why = "no W&B credentials (WANDB_API_KEY or `wandb login`): " if no_credentials else ""
    log.info(
      f"W&B: {why}logging offline to {os.path.dirname(run.dir)}; upload it with `wandb sync "
      f"{os.path.dirname(run.dir)}`"
    )
  return run, mode


class Tracker:
  """A training's W&B run: `log` each metrics record, `finish` at the end. Off (every method a
  no-op) on processes other than 0, without a project, or after a W&B failure."""

  def __init__(self) -> None:
    self.run = None
    self.failed = False
    self.mode, self.config, self.summary = "disabled", {}, {}

  @classmethod
  def start(
    cls,
    cfg: ml_collections.ConfigDict,
    workdir: str,
    device: str,
    start_step: int,
    history: str,
    primary: bool,
  ) -> Tracker:
    """The run of `workdir` (resumed when WORKDIR/wandb.json names one), with the config and
    `device`; an offline run resumed at `start_step` is rewritten from `history` (the kept text
    of metrics.jsonl)."""
    t = cls()
    w = settings(cfg)
    if w is None or not primary:
      return t
    t._guard("start", t._open, w, cfg, workdir, device, start_step, history)
    return t

  def _open(self, w, cfg, workdir, device, start_step, history) -> None:
    record = read_run(workdir) if start_step > 0 else None
    self.config = cfg.to_dict()
    self.run, self.mode = _start(w, workdir, record["id"] if record else None, self.config, "train")
    if self.run is None:
      return
    self.run.summary["device"] = device
    self.summary = {"device": device}
    here = os.path.dirname(self.run.dir)
    saved = [s for s in (record or {}).get("checkpoint_steps", []) if s <= start_step]
    earlier = list((record or {}).get("offline_dirs", []))
    if self.mode == "offline" and record:  # rewritten whole: W&B cannot resume an offline run
      for line in (history or "").splitlines():
        r = json.loads(line)
        step = r.pop("step")
        self._log(_numbers(r, step if step in saved else None), step)
      for d in earlier:
        if os.path.abspath(d) != os.path.abspath(here):
          shutil.rmtree(d, ignore_errors=True)
      earlier = []
    self.workdir = workdir
    self.record = {
      "id": self.run.id,
      "project": w.project,
      "entity": w.entity,
      "offline_dirs": earlier + ([here] if self.mode == "offline" else []),
      "checkpoint_steps": saved,
    }
    fileio.write_text(fileio.join(workdir, RUN_FILE), json.dumps(self.record))

  def log(self, step: int, record: dict[str, Any], checkpoint: int | None = None) -> None:
    """One metrics.jsonl record at `step` (numbers only); `checkpoint`: the step just saved (also
    kept in wandb.json, so that a rewritten offline run logs it again)."""
    if self.run is None:
      return
    self._guard("log", self._log, _numbers(record, checkpoint), step)
    if checkpoint is not None and self.run is not None:
      self.record["checkpoint_steps"].append(checkpoint)
      self._guard(
        "log", fileio.write_text, fileio.join(self.workdir, RUN_FILE), json.dumps(self.record)
      )

  def _log(self, values: dict[str, float], step: int) -> None:
    """Log `values` at `step`, kept as the summary that an offline run's files get."""
    self.run.log(values, step=step)
    self.summary.update(values)

  def finish(self) -> None:
    """End the run; offline, its config and summary also go into the run's files/ as wandb's
    online runs have them (config.yaml, wandb-summary.json), readable before any sync."""
    run = self.run
    if run is None:
      return
    if self.mode == "offline":
      self._guard("finish", self._write_files, run.dir)
    if self.run is not None:  # (a failure above has finished it)
      self._guard("finish", run.finish)
    self.run = None

  def _write_files(self, folder: str) -> None:
    import yaml

    config = {k: {"value": v} for k, v in self.config.items()}
    fileio.write_text(os.path.join(folder, "config.yaml"), yaml.safe_dump(config))
    fileio.write_text(os.path.join(folder, "wandb-summary.json"), json.dumps(self.summary))

  def _guard(self, what: str, fn, *args, **kwargs) -> None:
    """Call `fn`; a failure is one warning and the end of tracking, never of the training."""
    try:
      fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - W&B's failures never stop the command
      if not self.failed:
        log.warning(f"W&B {what} failed ({type(e).__name__}: {e}); training goes on without it")
      self.failed = True
      run, self.run = self.run, None
      if run is not None and fn != run.finish:
        try:
          run.finish(exit_code=1)
        except Exception:  # noqa: BLE001
          pass


def _numbers(record: dict[str, Any], checkpoint: int | None) -> dict[str, float]:
  """A metrics record's numbers (its None values, written for non-finite ones, and its nested
  dicts left out), with the checkpoint step saved at it."""
  values = {k: v for k, v in record.items() if isinstance(v, (int, float))}
  if checkpoint is not None:
    values["checkpoint_step"] = checkpoint
  return values


def log_evaluation(
  cfg: ml_collections.ConfigDict,
  workdir: str,
  out: str,
  name: str,
  metrics: dict,
  figure: str | None,
) -> None:
  """eval.py's metrics (summary keys `name/method/metric`) and figure into the run of `workdir`
  (a new run when it has none), written under `out` (never the workdir: a model folder's files
  are fixed by its manifest); a W&B failure is one warning."""
  w = settings(cfg)
  if w is None:
    return
  try:
    record = read_run(workdir)
    run, _ = _start(w, out, record["id"] if record else None, {}, "eval")
    if run is None:
      return
    flat = {
      f"{name}/{method}/{k}": v
      for method, values in metrics.items()
      if isinstance(values, dict)
      for k, v in values.items()
      if isinstance(v, (int, float))
    }
    for k, v in flat.items():
      run.summary[k] = v
    if figure and os.path.exists(figure):
      import wandb

      run.log({f"{name}/figure": wandb.Image(figure)})
    run.finish()
  except Exception as e:  # noqa: BLE001 - W&B's failures never stop the command
    log.warning(f"W&B: the evaluation was not logged ({type(e).__name__}: {e})")
