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
`python -m cdeit_jax.answer_study`. The folder is written in a stage of its own beside --out,
read back as the commands read it, and put in its place whole, one ship at a time
(`_put_in_place`, `_turn`); an --out that is not a model folder (no manifest) is refused.
"""

from __future__ import annotations

import contextlib
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


MAX_SCORES_BYTES = 1_000_000  # an evaluation's metrics.json is some KB; a larger file is not one


def scores(pairs: list[str]) -> dict:
  """{name: the metrics (and settings) of an evaluation's metrics.json} of NAME=PATH pairs; a
  file that is not an evaluation's (not a JSON object with a `metrics` object holding a number,
  a NaN or infinity anywhere, a std scale that is not a positive number, over 1 MB) is refused
  in one line naming --scores."""
  from cdeit_jax.common.errors import InputError

  out = {}
  for pair in pairs or []:
    name, sep, path = pair.partition("=")
    if not sep or not name:
      raise InputError(f"--scores {pair!r}: give NAME=PATH to an evaluation's metrics.json")

    def refuse(why: str, name=name, path=path) -> InputError:
      return InputError(
        f"--scores {name}={path}: {why}; give the metrics.json eval.py wrote (its 'metrics')"
      )

    def constant(text: str):
      raise ValueError(f"{text} is no number JSON knows")

    try:
      if os.path.getsize(path) > MAX_SCORES_BYTES:
        raise refuse(f"{os.path.getsize(path)} bytes, not an evaluation's metrics.json")
      with open(path) as fh:
        m = json.load(fh, parse_constant=constant)
    except (OSError, ValueError) as e:
      raise refuse(f"not a readable metrics.json ({e})") from None
    metrics = m.get("metrics") if isinstance(m, dict) else None
    if not isinstance(metrics, dict) or not _holds_number(metrics):
      raise refuse("holds no 'metrics' object with figures")
    if not isinstance(m.get("settings", {}), dict):
      raise refuse("its 'settings' is not an object")
    u = metrics.get("uncertainty")
    if u is not None and not (
      isinstance(u, dict) and all(_positive(u[k]) for k in ("scale", "scale_2std") if k in u)
    ):
      raise refuse("its 'uncertainty' holds no positive std scales")
    out[name] = {k: m[k] for k in ("metrics", "settings") if k in m}
  return out


def _positive(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf


def _holds_number(tree) -> bool:
  """Whether a JSON tree holds a number (a figure) anywhere."""
  if isinstance(tree, dict):
    return any(_holds_number(v) for v in tree.values())
  if isinstance(tree, list):
    return any(_holds_number(v) for v in tree)
  return isinstance(tree, (int, float)) and not isinstance(tree, bool)


SETTABLE = ("eval.", "sampling.")
# settings a model folder never ships with: a path to a file or folder (no other machine has
# it; a model folder holds its own statistics and calibration), or another step than its one
NOT_SHIPPED = {
  "eval.stats": "a model folder keeps no path to a folder outside it (its statistics are its "
  "step's)",
  "eval.calibration": "a model folder keeps no path to a file outside it (ship a calibration "
  "into its step with --calibration FILE)",
  "eval.step": "a model folder holds one step, which its readers open",
}
KINDS = {bool: "True or False", int: "an integer", float: "a number", tuple: "a tuple"}


def settings(pairs: list[str]) -> dict:
  """{dotted key: value} of KEY=VALUE pairs, each an evaluation setting (eval.*, sampling.*)
  read as its field's type in the default config (as ml_collections' config_flags reads
  `--config.KEY=VALUE`: the same parsers; "None" for a setting that may be None), a float
  finite; a path or a step refused (`NOT_SHIPPED`). One line naming --set for anything else."""
  from cdeit_jax import config_lib
  from cdeit_jax.common.errors import InputError

  defaults = config_lib.default_config()
  out = {}
  for pair in pairs or []:
    key, sep, text = pair.partition("=")
    if not sep or not key.startswith(SETTABLE):
      raise InputError(
        f"--set {pair!r}: give KEY=VALUE of an evaluation setting (eval.*, sampling.*), e.g. "
        "--set eval.answer_rule=vote:0.3:0.5"
      )
    out[key] = _setting(key, text, defaults)
  return out


def _setting(key: str, text: str, defaults) -> object:
  """The value of `--set key=text` (`settings`)."""
  import ml_collections
  from absl import flags
  from ml_collections.config_flags import tuple_parser

  from cdeit_jax.common.errors import InputError

  section, _, leaf = key.partition(".")
  node = defaults[section]
  if "." in leaf or leaf not in node or isinstance(node[leaf], ml_collections.ConfigDict):
    raise InputError(
      f"--set {key}={text}: no such setting; config.{section} has {', '.join(sorted(node))}"
    )
  if key in NOT_SHIPPED and text.strip() not in ("None", "none", ""):
    raise InputError(f"--set {key}={text}: {NOT_SHIPPED[key]}; leave it None")
  kind = node.get_type(leaf)
  if node[leaf] is None and text.strip() in ("None", "none", "null"):
    return None
  parsers = {  # config_flags' parsers of these field types
    bool: flags.BooleanParser(),
    int: flags.IntegerParser(),
    float: flags.FloatParser(),
    str: flags.ArgumentParser(),
    tuple: tuple_parser.TupleParser(),
  }
  if kind not in parsers:
    raise InputError(f"--set {key}={text}: a {kind.__name__} setting cannot be set by ship")
  try:
    value = parsers[kind].parse(text)
  except (ValueError, TypeError, SyntaxError) as e:
    optional = " (or None)" if node[leaf] is None else ""
    raise InputError(
      f"--set {key}={text}: not {KINDS.get(kind, kind.__name__)}{optional} "
      f"({' '.join(str(e).split())})"
    ) from None
  if isinstance(value, float) and not math.isfinite(value):
    raise InputError(f"--set {key}={text}: must be a finite number")
  return value


def apply_settings(cfg, values: dict, record: dict) -> None:
  """Set `values` (`settings`) in `cfg` and check the result as every reader does
  (`run_opening.settings` on the step's metadata `record` with this config; an answer rule as
  eval.py reads it): one line naming --set."""
  from cdeit_jax import config_lib
  from cdeit_jax.infer import run_opening
  from cdeit_jax.infer.answer_rules import AnswerRule

  config_lib.override(cfg, values, "--set ")
  run_opening.settings({**record, "config": json.loads(cfg.to_json_best_effort())}, {}, "--set ")
  if "eval.answer_rule" in values:
    AnswerRule.parse(cfg.eval.answer_rule, "--set eval.answer_rule")


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
  out = _out_folder(out)
  if shipped.model_folder_of(os.path.dirname(out)) is not None:  # itself: replaced whole
    shipped.refuse_write(out, "--out")
  fileio.refuse_own_input(out, "--out", [("--workdir", workdir)])  # replaced whole
  os.makedirs(os.path.dirname(out), exist_ok=True)
  with _turn(out):
    if os.path.exists(out) and os.listdir(out) and shipped.read(out) is None:
      raise InputError(f"--out {out}: holds files and no {shipped.MANIFEST}; give a new folder")
    with reader.open_run(workdir, step) as run:
      meta, skipped = run.first_readable()
      loaded = run.load(loading.resolve(meta.config, meta.record), weights="ema", passed=skipped)
      meta = loaded.meta
      apply_settings(meta.config, chosen, meta.record)
      scale = fileio.read_text(run_opening.calibration_file(run, meta.step))
      where = run.workdir

    def fill(stage: str) -> dict:
      checkpoint.save_inference(
        stage,
        loaded.model,
        meta.config,
        mean=meta.mean,
        std=meta.std,
        step=meta.step,
        source=f"{where} step {meta.step} (EMA weights)",
        files={} if scale is None else {run_opening.UNCERTAINTY_FILE: scale},
      )
      record = {
        "name": os.path.basename(out),
        "recipe": recipe,
        "config": json.loads(meta.config.to_json_best_effort()),
        "device": meta.record.get("device") or loaded.model.system.device.record(),
        "training": {**training_of(workdir, meta), "shipped": time.strftime("%Y-%m-%d")},
        "scores": given,
      }
      return shipped.write(stage, meta.step, record)

    return _put_in_place(out, fill)


def _out_folder(out: str) -> str:
  """--out as an absolute path, a symbolic link followed: `--out LINK` ships the model folder
  the link names, in its place, and the link keeps naming it (replacing the link by a folder
  would leave every other user of the link on the old model). Not a folder: one line."""
  from cdeit_jax.common import fileio
  from cdeit_jax.common.errors import InputError

  out = os.path.abspath(out)
  if os.path.islink(out):
    target = os.path.realpath(out)
    if not os.path.isdir(target):
      raise InputError(f"--out {out}: a symbolic link to {target}, which is no folder")
    out = target
  fileio.output_folder(out, "--out")
  return out


@contextlib.contextmanager
def _turn(out: str):
  """This ship's turn at --out: the lock on its folder's parent (`stages.locked`: two ships
  into one folder never interleave; one finds the other busy), a model a stopped ship left
  aside between its two renames put back (`shipped.left_between_renames`, this ship's own
  backups only), and the stages and backups of ships no longer running removed."""
  from cdeit_jax.checkpoints import shipped
  from cdeit_jax.common import logs, stages

  parent = os.path.dirname(out)
  busy = (
    f"--out {out}: another python -m cdeit_jax.ship is writing in {parent} now; wait for it "
    "to end and run this again"
  )
  with stages.locked(parent, busy):
    left = shipped.left_between_renames(out)
    if left is not None and os.path.basename(left).startswith(shipped.replaced_prefix(out)):
      os.rename(left, out)
      logs.log.warning(f"{out}: put back from {left}, where a stopped ship had left it")
    for prefix in (shipped.stage_prefix(out), shipped.replaced_prefix(out)):
      for stale in stages.stale(parent, prefix):
        shutil.rmtree(stale, ignore_errors=True)
    yield


def _put_in_place(out: str, fill) -> dict:
  """`fill(stage)` (it writes the model folder in an empty stage of this ship's own beside
  `out` and returns its manifest), the stage proved to read back as every command reads a model
  folder (`_reads_back`), then put in `out`'s place: `out` renamed aside, the stage renamed to
  `out`, the old one removed. Anything refused: the stage removed, `out` as it was."""
  import tempfile

  from cdeit_jax.checkpoints import shipped

  parent = os.path.dirname(out)
  stage = tempfile.mkdtemp(dir=parent, prefix=f"{shipped.stage_prefix(out)}{os.getpid()}-")
  try:
    manifest = fill(stage)
    _reads_back(stage, out)
    if os.path.exists(out):
      aside = tempfile.mkdtemp(dir=parent, prefix=f"{shipped.replaced_prefix(out)}{os.getpid()}-")
      os.rename(out, aside)  # onto the empty folder just made: the name is this ship's
      try:
        os.rename(stage, out)
      except BaseException:
        os.rename(aside, out)
        raise
      shutil.rmtree(aside, ignore_errors=True)
    else:
      os.rename(stage, out)
  finally:
    shutil.rmtree(stage, ignore_errors=True)
  shipped.verify(out)
  return manifest


def _reads_back(stage: str, out: str) -> None:
  """The staged folder read as every command opens a model folder (`run_opening.open_run`: its
  manifest verified, its config loaded and checked); else one line, nothing put in place."""
  from cdeit_jax.common.errors import CdeitError, InputError
  from cdeit_jax.infer import run_opening

  try:
    with run_opening.open_run(stage) as opened:
      weights, have = opened.cfg.eval.weights, opened.meta.record.get("weights", [])
  except CdeitError as e:
    raise InputError(
      f"--out {out}: the folder shipped would not be read ({e}); {out} is left as it was"
    ) from None
  if weights not in have:  # what loading its weights would refuse
    raise InputError(
      f"--set eval.weights={weights}: the model folder holds the {', '.join(have)} weights only"
    )


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
  names; its weights, training and other scores kept byte for byte. Staged beside `out`, read
  back and put in its place whole (`_put_in_place`); its manifest."""
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
  out = _out_folder(out)
  if not os.path.isdir(os.path.dirname(out)):
    raise InputError(f"--out {out}: no such model folder (nor the folder it would lie in)")
  with _turn(out):
    manifest = shipped.verify(out)
    if manifest is None:
      raise InputError(
        f"--out {out}: no {shipped.MANIFEST}; --calibration and --set ship a model folder "
        "again (ship a run with --workdir)"
      )
    if cal is not None:
      if manifest.get("config", {}).get("model", {}).get("output") == "classes":
        raise InputError(
          f"--calibration {calibration}: {out} is a segmenter's (its outputs are classes, "
          "with no std to calibrate); leave --calibration out"
        )
      # every score the manifest will hold is of this calibration
      _same_calibration(cal, calibration, manifest["scores"], given)
    _warn_of_other_settings(chosen, manifest["scores"], given)

    def fill(stage: str) -> dict:
      shutil.copytree(out, stage, dirs_exist_ok=True, symlinks=True)
      return _stage_again(stage, manifest, calibration, cal, chosen, given)

    return _put_in_place(out, fill)


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


def _warn_of_other_settings(chosen: dict, kept: dict, given: dict) -> None:
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


def _set_in_step(step_dir: str, chosen: dict) -> dict:
  """The settings (`settings`) set in the config a staged step's `meta` holds, checked as the
  readers check it (`apply_settings`); the config, for the manifest."""
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
  apply_settings(cfg, chosen, meta)
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
