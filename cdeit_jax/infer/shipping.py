"""What `python -m cdeit_jax.ship` does: a trained run made into a model folder that ships with
the code (`models/cdeit16`, `models/ktc2023`; `cdeit_jax.checkpoints.shipped`), or a model
folder shipped again with a new calibration of its std or new settings (`ship_again`); and
what `python -m cdeit_jax.export` does, a run or model folder as one model file (`export`),
which records the training as a model folder's manifest does.

  python -m cdeit_jax.ship --workdir runs/cdeit16 --out models/cdeit16 --recipe "make ..." \\
      --scores uef2017=runs/cdeit16/eval_uef2017/metrics.json
  python -m cdeit_jax.ship --out models/cdeit16 --calibration FIT/uncertainty.json \\
      --scores simulated=EVAL/metrics.json
  python -m cdeit_jax.ship --out models/ktc2023 --set eval.refinement=objects \\
      --scores ktc2023_public=EVAL/metrics.json

The run's best validated step (or --step) is loaded with its EMA weights and written as one
inference step (EMA only; the step's uncertainty scale beside it), with `manifest.json`: the
config, the device, the recipe, the steps, the training time (`training_record`: every
logged window of metrics.jsonl, killed invocations' included, with the ended ones' start-up) and
the machine, the data seeds, the scores given, and the SHA-256 of the step's files. A fine-tuned
run (`config.init_from`) records what it started from and the seconds of both (`seconds_in_all`).
`--set eval.answer_rule=...` (repeatable; eval.* and sampling.* keys) changes a setting the model
is evaluated with by default, e.g. the KTC2023 answer rule chosen for it by
`python -m cdeit_jax.answer_study`. The folder is written beside --out and put in its
place whole; an --out that is not a model folder (no manifest) is refused.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import time

import numpy as np


def training_record(workdir: str) -> dict:
  """The wall time that made a run's model: every logged window in metrics.jsonl (the steps,
  data waits, validations and checkpoints of each invocation, one that was killed included up to
  its last committed record) plus the start-up and compilation of the invocations that ended
  (their last record carries `run`; a killed one's start-up is not recorded anywhere)."""
  from cdeit_jax.common import fileio

  text = fileio.read_text(fileio.join(workdir, "metrics.jsonl")) or ""
  windows, setup, ended = 0.0, 0.0, 0
  for line in text.splitlines():
    record = json.loads(line)
    windows += record.get("window_s", 0.0)
    if "run" in record:
      setup += record["run"]["startup_s"] + record["run"]["compile_s"]
      ended += 1
  return {"seconds": round(windows + setup, 1), "ended_invocations": ended}


def started_from(path: str, start: dict | None = None) -> dict:
  """The training behind a run's `config.init_from` (a workdir or a model folder), and the
  training behind that one's, nested: where, steps, seconds (`training_record`, or a model
  folder's manifest). `start`: the step the fine-tuning recorded it started from (checked:
  `loading.start_folder`), else `path`'s newest (a run fine-tuned before starts were recorded)."""
  from cdeit_jax.checkpoints import checkpoint, loading, shipped

  if start:
    workdir, step = loading.start_folder(start, f"config.init_from={path!r}")
  else:
    workdir, step = checkpoint.resolve(path)
  manifest = shipped.read(workdir)
  if manifest is not None:
    t = manifest.get("training", {})
    return {
      "model": os.path.abspath(workdir),
      "steps": t.get("steps"),
      "seconds": t.get("seconds_in_all", t.get("seconds")),
    }
  record = {"workdir": os.path.abspath(workdir), "steps": step, **training_record(workdir)}
  meta = checkpoint.read_meta(workdir, step)
  earlier = meta.get("config", {}).get("init_from")
  if earlier:
    record["started_from"] = started_from(earlier, meta.get("init_from"))
  return record


def _seconds_in_all(record: dict) -> float:
  below = record.get("started_from")
  return round(record["seconds"] + (_seconds_in_all(below) if below else 0.0), 1)


def machine() -> str:
  """This machine in one line: CPU, cores, JAX's devices."""
  import jax

  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as fh:
      cpu = next(ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name"))
  except (OSError, StopIteration):
    pass
  d = jax.devices()
  return f"{cpu}, {os.cpu_count()} cores; jax {jax.__version__}, {len(d)} x {d[0].device_kind}"


def scores(pairs: list[str]) -> dict:
  """{name: the metrics (and settings) of an evaluation's metrics.json} of NAME=PATH pairs."""
  from cdeit_jax.common.errors import InputError

  out = {}
  for pair in pairs or []:
    name, sep, path = pair.partition("=")
    if not sep or not name:
      raise InputError(f"--scores {pair!r}: give NAME=PATH to an evaluation's metrics.json")
    try:
      with open(path) as fh:
        m = json.load(fh)
    except (OSError, ValueError) as e:
      raise InputError(f"--scores {name}={path}: not a readable metrics.json ({e})") from None
    out[name] = {k: m[k] for k in ("metrics", "settings") if k in m}
  return out


SETTABLE = ("eval.", "sampling.")


def settings(pairs: list[str]) -> dict[str, str]:
  """{dotted key: text} of KEY=VALUE pairs, each an evaluation setting (eval.*, sampling.*)."""
  from cdeit_jax.common.errors import InputError

  out = {}
  for pair in pairs or []:
    key, sep, text = pair.partition("=")
    if not sep or not key.startswith(SETTABLE):
      raise InputError(
        f"--set {pair!r}: give KEY=VALUE of an evaluation setting (eval.*, sampling.*), e.g. "
        "--set eval.answer_rule=vote:0.3:0.5"
      )
    out[key] = text
  return out


def apply_settings(cfg, given: dict[str, str]) -> None:
  """Set each text in `cfg` as its key's type (an unknown key or unreadable value: one line
  naming --set); an answer rule is checked as eval.py reads it."""
  from cdeit_jax import config_lib
  from cdeit_jax.common.errors import InputError
  from cdeit_jax.infer.answer_rules import AnswerRule
  from cdeit_jax.infer.refinement import Refinement

  for key, text in given.items():
    try:
      old = cfg
      for k in key.split("."):
        old = old[k]
      kind = type(old)
      if kind is bool:
        if text not in ("True", "False"):
          raise ValueError("True or False")
        value = text == "True"
      else:
        value = kind(text) if kind in (int, float, str) else text
    except (KeyError, ValueError) as e:
      raise InputError(f"--set {key}={text}: {e}") from None
    config_lib.override(cfg, {key: value})
  if "eval.answer_rule" in given:
    AnswerRule.parse(cfg.eval.answer_rule, "--set eval.answer_rule")
  if "eval.refinement" in given:
    Refinement.parse(cfg.eval.refinement, "--set eval.refinement")


def training_of(workdir: str, meta) -> dict:
  """What made the model of a run's step (`meta`, a `reader.Meta`): the manifest's `training`.
  A model folder's is its manifest's, and an imported model file's (`python -m
  cdeit_jax.convert`) the one the file carries, wherever it was trained; a run's: its steps and
  time (`training_record`; a fine-tuning's start counted too), this machine, the data seeds."""
  from cdeit_jax.checkpoints import shipped

  again = shipped.read(workdir)  # a model folder shipped again (another rule, say)
  if again is not None:
    return {k: v for k, v in again["training"].items() if k != "shipped"}
  if isinstance(meta.record.get("training"), dict):  # an imported model file
    return dict(meta.record["training"])
  cfg = meta.config
  made_of = meta.record.get("source")
  training = {"steps": meta.step, **training_record(workdir)}
  if cfg.get("init_from"):  # fine-tuned: what it started from counts too
    training["started_from"] = started_from(cfg.init_from, meta.record.get("init_from"))
    training["seconds_in_all"] = _seconds_in_all(training)
  return {
    **training,
    "machine": machine(),
    "data_seed": {"simulator": int(cfg.simulator.seed), "data": int(cfg.data.seed)},
    "source": f"{os.path.abspath(workdir)} step {meta.step}",
    # what an imported or interpolated checkpoint says it is made of
    **({"made_of": made_of} if made_of and made_of != "train.py" else {}),
  }


def ship(
  workdir: str,
  out: str,
  recipe: str,
  score_pairs: list[str],
  step: int | None,
  set_pairs: list[str] | None = None,
) -> dict:
  """Write the model folder `out` of the run at `workdir` (module docstring); its manifest."""
  from cdeit_jax.checkpoints import checkpoint, loading, reader, shipped
  from cdeit_jax.common import fileio
  from cdeit_jax.common.errors import InputError
  from cdeit_jax.infer import run_opening

  given = scores(score_pairs)  # every input checked before anything is written
  chosen = settings(set_pairs)
  out = os.path.abspath(out)
  if shipped.model_folder_of(os.path.dirname(out)) is not None:  # itself: replaced whole
    shipped.refuse_write(out, "--out")
  fileio.refuse_own_input(out, "--out", [("--workdir", workdir)])  # replaced whole
  fileio.output_folder(out, "--out")
  if os.path.exists(out) and os.listdir(out) and shipped.read(out) is None:
    raise InputError(f"--out {out}: holds files and no {shipped.MANIFEST}; give a new folder")
  with reader.open_run(workdir, step) as run:
    meta, skipped = run.first_readable()
    loaded = run.load(loading.resolve(meta.config, meta.record), weights="ema", passed=skipped)
    meta = loaded.meta
    apply_settings(meta.config, chosen)
    scale_file = run_opening.calibration_file(run, meta.step)
    stage = f"{out}.shipping"
    shutil.rmtree(stage, ignore_errors=True)
    checkpoint.save_inference(
      stage,
      loaded.model,
      meta.config,
      mean=meta.mean,
      std=meta.std,
      step=meta.step,
      source=f"{run.workdir} step {meta.step} (EMA weights)",
    )
    scale = fileio.read_text(scale_file)
    if scale is not None:
      step_dir = fileio.join(stage, checkpoint.CHECKPOINTS, str(meta.step))
      fileio.write_text(fileio.join(step_dir, run_opening.UNCERTAINTY_FILE), scale)
  record = {
    "name": os.path.basename(out),
    "recipe": recipe,
    "config": json.loads(meta.config.to_json_best_effort()),
    "device": meta.record.get("device") or loaded.model.system.device.record(),
    "training": {**training_of(workdir, meta), "shipped": time.strftime("%Y-%m-%d")},
    "scores": given,
  }
  manifest = shipped.write(stage, meta.step, record)
  old = f"{out}.old"
  if os.path.exists(out):
    os.replace(out, old)
  os.replace(stage, out)
  shutil.rmtree(old, ignore_errors=True)
  shipped.verify(out)
  return manifest


def ship_again(
  out: str,
  calibration: str | None,
  score_pairs: list[str],
  set_pairs: list[str] | None = None,
) -> dict:
  """The model folder `out` shipped again: with the std's calibration kept in `calibration` (an
  uncertainty.json that `eval.py --config.eval.fit_uncertainty=True` wrote; `infer.intervals`)
  in place of its step's, and/or with the evaluation settings of `set_pairs` (KEY=VALUE, eval.*
  and sampling.*: what the model is evaluated with by default, e.g. a KTC2023 refinement), and
  the scores given (NAME=PATH of eval.py's metrics.json, evaluated with them) in place of those
  names; its weights, training and other scores kept byte for byte. Staged beside `out` and put
  in its place whole; its manifest."""
  from cdeit_jax.checkpoints import shipped
  from cdeit_jax.common import fileio
  from cdeit_jax.common.errors import InputError
  from cdeit_jax.infer import intervals, run_opening

  given = scores(score_pairs)  # every input checked before anything is written
  chosen = settings(set_pairs)
  if calibration is None and not chosen:
    raise InputError("--out alone: give --calibration, --set or both to ship it again")
  if calibration is not None and not fileio.path(calibration).exists():
    raise InputError(
      f"--calibration {calibration}: no such file (an {run_opening.UNCERTAINTY_FILE} that "
      "eval.py --config.eval.fit_uncertainty=True wrote)"
    )
  # a record the readers take, else one line naming it
  cal = None if calibration is None else intervals.read(calibration)
  out = os.path.abspath(out)
  manifest = shipped.verify(out)
  if manifest is None:
    raise InputError(
      f"--out {out}: no {shipped.MANIFEST}; --calibration and --set ship a model folder again "
      "(ship a run with --workdir)"
    )
  if cal is not None:  # every score the manifest will hold is of this calibration
    _same_calibration(cal, calibration, manifest["scores"], given)
  _warn_of_other_settings(chosen, manifest["scores"], given)
  stage = f"{out}.shipping"
  shutil.rmtree(stage, ignore_errors=True)
  shutil.copytree(out, stage)
  try:
    manifest = _stage_again(stage, manifest, calibration, cal, chosen, given)
  except BaseException:
    shutil.rmtree(stage, ignore_errors=True)  # a refused setting leaves no half-made copy
    raise
  old = f"{out}.old"
  os.replace(out, old)
  os.replace(stage, out)
  shutil.rmtree(old, ignore_errors=True)
  shipped.verify(out)
  return manifest


def _stage_again(stage, manifest, calibration, cal, chosen, given) -> dict:
  """`ship_again`'s changes made in the staged copy; its new manifest."""
  from cdeit_jax.checkpoints import checkpoint, shipped
  from cdeit_jax.common import fileio
  from cdeit_jax.infer import run_opening

  step = manifest["step"]
  step_dir = fileio.join(stage, checkpoint.CHECKPOINTS, str(step))
  kept = ("format", "step", "files", "sha256", shipped.OWN)
  record = {k: v for k, v in manifest.items() if k not in kept}
  record["training"] = dict(record["training"])
  if cal is not None:
    fileio.write_text(
      fileio.join(step_dir, run_opening.UNCERTAINTY_FILE), fileio.read_text(calibration)
    )
    record["training"]["recalibrated"] = time.strftime("%Y-%m-%d")
  if chosen:
    record["config"] = _set_in_step(step_dir, chosen)
    record["training"]["settings_changed"] = time.strftime("%Y-%m-%d")
  record["scores"] = {**manifest["scores"], **given}
  return shipped.write(stage, step, record)


def _warn_of_other_settings(chosen: dict[str, str], kept: dict, given: dict) -> None:
  """Log each score kept (not given again) whose evaluation recorded another value of a setting
  now set (eval.py's metrics.json records e.g. `answer_rule`, `refinement`): it no longer
  scores the model as it now answers."""
  from cdeit_jax.common import logs
  from cdeit_jax.infer.answer_rules import AnswerRule
  from cdeit_jax.infer.refinement import Refinement

  spelled = {  # the settings a metrics.json records in their own spelling
    "answer_rule": lambda t: str(AnswerRule.parse(t)),
    "refinement": lambda t: str(Refinement.parse(t) or ""),
  }
  for name, score in kept.items():
    recorded = score.get("settings") or {}
    for key, text in chosen.items():
      leaf = key.rpartition(".")[2]
      same = spelled.get(leaf, str)
      if name not in given and leaf in recorded and same(str(recorded[leaf])) != same(text):
        logs.log.warning(
          f"the manifest's score {name!r} was evaluated with {leaf}={recorded[leaf]!r}, not "
          f"{text!r}: evaluate it again and give it as --scores {name}=..."
        )


def _same_calibration(cal, path: str, kept: dict, given: dict) -> None:
  """Refuse, naming it, a score given or kept whose intervals are of other std scales."""
  from cdeit_jax.common.errors import InputError
  from cdeit_jax.infer import intervals

  scales = (cal.std_scale, cal.scale(intervals.TWO_SIGMA))
  for name, score in {**kept, **given}.items():
    u = score.get("metrics", {}).get("uncertainty")
    got = None if u is None else (u.get("scale"), u.get("scale_2std", 2 * u.get("scale", 0)))
    if got is not None and not all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(got, scales)):
      where = f"--scores {name}" if name in given else f"the manifest's score {name!r}"
      raise InputError(
        f"{where}: its intervals were evaluated with the std scales {got[0]:.4g} / {got[1]:.4g} "
        f"(1 / 2 std), not --calibration's {scales[0]:.4g} / {scales[1]:.4g}: evaluate it with "
        f"eval.py --config.eval.calibration={path} and give its metrics.json as --scores {name}=..."
      )


def _set_in_step(step_dir: str, chosen: dict[str, str]) -> dict:
  """The settings set in the config a staged step's `meta` holds (as `apply_settings` reads
  them); the config, for the manifest."""
  import ml_collections

  from cdeit_jax import config_lib
  from cdeit_jax.common import fileio

  path = fileio.join(step_dir, "meta", "metadata")
  meta = json.loads(fileio.read_text(path))
  cfg = ml_collections.ConfigDict(meta["config"])
  defaults = config_lib.default_config()
  for key in chosen:  # a setting newer than the model's config: its section gets it
    section, _, leaf = key.rpartition(".")
    if section in cfg and leaf not in cfg[section] and leaf in defaults[section]:
      with cfg.unlocked():
        cfg[section][leaf] = defaults[section][leaf]
  apply_settings(cfg, chosen)
  meta["config"] = json.loads(cfg.to_json_best_effort())
  fileio.write_text(path, json.dumps(meta))
  return meta["config"]


def export(workdir: str, out: str, step: int | None = None) -> dict:
  """Write the model file `out` of the run at `workdir` (module docstring); returns
  {path, sha256, step, bytes, params}."""
  from flax import nnx

  from cdeit_jax.checkpoints import loading, model_file, reader, shipped
  from cdeit_jax.common import fileio
  from cdeit_jax.infer import run_opening

  shipped.refuse_write(out, "--out")
  fileio.refuse_own_input(out, "--out", [("--workdir", workdir)])
  # a regular file or a new one, in a folder that exists; a model file is replaced, nothing else
  fileio.output_file(out, "--out", model_file.is_model_file, model_file.WHAT)
  with reader.open_run(workdir, step) as run:
    meta, skipped = run.first_readable()
    loaded = run.load(
      loading.resolve(meta.config, meta.record), weights="ema", passed=skipped, weights_only=True
    )
    meta = loaded.meta
    scale = fileio.read_text(run_opening.calibration_file(run, meta.step))
    where = run.workdir
  arrays = {
    "/".join(map(str, path)): np.asarray(v.get_value(), np.float32)
    for path, v in nnx.to_flat_state(loaded.model)
  }
  record = {
    "meta": {**meta.record, "weights": ["ema"]},
    "training": training_of(where, meta),
    "uncertainty": scale,
    "exported": {
      "from": f"{os.path.abspath(where)} step {meta.step} (EMA weights; {loaded.reason})",
      "date": time.strftime("%Y-%m-%d %H:%M:%S"),
      "machine": machine(),
    },
  }
  sha = model_file.write(out, arrays, record)
  return {
    "path": out,
    "sha256": sha,
    "step": meta.step,
    "bytes": fileio.path(out).stat().length,
    "params": int(sum(a.size for a in arrays.values())),
  }
