"""Model folders that ship with the code (`models/cdeit16`, `models/ktc2023`): one inference
step (the EMA weights and their metadata, `checkpoint.save_inference`) under `checkpoints/STEP`,
read by every command as a training run is, and `manifest.json` beside it: how the model was
made (config, device, recipe, steps, training time and machine, data seed), its public scores,
and the SHA-256 of every file of the step. A folder whose files do not match its manifest is
refused in one line before anything is read from it (`verify`, called by
`checkpoint.locate`), so a damaged or edited model never reconstructs silently.

  python -m cdeit_jax.ship --workdir runs/cdeit16 --out models/cdeit16 \\
      --scores uef2017=runs/cdeit16/eval_uef2017/metrics.json --recipe "make cdeit16-model"
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any

from cdeit_jax.common import fileio, stages
from cdeit_jax.common.errors import InputError

MANIFEST = "manifest.json"
FORMAT = "cdeit-jax model v1"
OWN = "manifest_sha256"  # the manifest's own fields' SHA-256 (`own_digest`)
CHECKPOINTS = "checkpoints"  # as checkpoint.CHECKPOINTS (that module imports this one)


class ManifestError(InputError):
  """A model folder whose files are not those its manifest names (one line)."""


def restore_advice(folder: str) -> str:
  """How to put a model folder back as it was shipped. A folder git tracks (its manifest is in
  the index): the commands that restore its tracked files and remove every file added there
  (`git checkout` alone leaves added files behind), run from any folder (`git -C`). Any other
  (a copy, which `git clean` inside some other checkout would delete whole): copy it again."""
  if _tracked(folder):
    return (
      f"git -C {folder} checkout -- . && git -C {folder} clean -fdx . (a copy outside git: copy "
      "it again, or ship it again with python -m cdeit_jax.ship)"
    )
  return (
    "copy it again from where it came (it is no folder a git checkout tracks, so git cannot "
    "restore it), or ship it again with python -m cdeit_jax.ship"
  )


def _tracked(folder: str) -> bool:
  """Whether a local `folder`'s manifest is tracked by the git checkout it lies in."""
  import subprocess

  if fileio.is_remote(folder):
    return False
  try:
    r = subprocess.run(
      ["git", "-C", folder, "ls-files", "--error-unmatch", MANIFEST],
      capture_output=True,
      timeout=20,
    )
  except (OSError, subprocess.TimeoutExpired):  # no git, or a folder git cannot enter
    return False
  return r.returncode == 0


def stage_prefix(folder: str) -> str:
  """The name, beside model folder `folder`, of ship's stages: `.NAME.shipping-PID-XXXX`."""
  return f".{os.path.basename(fileio.resolve(folder))}.shipping-"


def replaced_prefix(folder: str) -> str:
  """The name, beside `folder`, under which ship keeps the model it replaces between its two
  renames: `.NAME.replaced-PID-XXXX`."""
  return f".{os.path.basename(fileio.resolve(folder))}.replaced-"


def left_between_renames(folder: str) -> str | None:
  """Where the model of a missing local `folder` is when a ship was stopped between its two
  renames (the model moved aside, its new copy not yet in place): ship's backup beside it, of a
  process gone (`replaced_prefix`), or an older ship's `NAME.old`; None when `folder` exists or
  no such folder holds a manifest."""
  folder = fileio.resolve(folder)
  if fileio.is_remote(folder) or os.path.lexists(folder):
    return None
  parent = os.path.dirname(folder)
  for left in [*sorted(stages.stale(parent, replaced_prefix(folder))), f"{folder}.old"]:
    if os.path.isfile(os.path.join(left, MANIFEST)):
      return left
  return None


def missing_note(folder: str) -> str:
  """'' or, for a model folder a stopped ship left aside (`left_between_renames`), what to do,
  to follow a 'no such folder' message."""
  left = left_between_renames(folder)
  if left is None:
    return ""
  return (
    f"; its model is in {left} (a python -m cdeit_jax.ship stopped between its two renames): "
    f"run that ship again, which puts it back first, or: mv {left} {fileio.resolve(folder)}"
  )


def is_model_folder(folder: str) -> bool:
  """Whether `folder` is a model folder that ships with the code: it holds `manifest.json`
  (a file, or anything else under that name: a damaged one) beside a `checkpoints/` folder, or
  it has lost its manifest (`lost_manifest`)."""
  p = fileio.path(folder)
  return ((p / MANIFEST).exists() and (p / CHECKPOINTS).is_dir()) or lost_manifest(folder)


def lost_manifest(folder: str) -> bool:
  """Whether `folder` is obviously a model folder whose manifest was deleted, wherever it lies
  (in `models/` or a copy elsewhere): no manifest, and under `checkpoints/` one step as only
  `python -m cdeit_jax.ship` writes it (EMA weights and metadata only, made of a run's step:
  "RUN step N (EMA weights)"; an interpolation's says "WiSE-FT: ...")."""
  p = fileio.path(folder)
  if (p / MANIFEST).exists() or not (p / CHECKPOINTS).is_dir():
    return False
  steps = [q for q in (p / CHECKPOINTS).iterdir()]
  if len(steps) != 1 or not steps[0].name.isdigit():
    return False
  items = {q.name for q in steps[0].iterdir()}
  if "ema" not in items or {"params", "opt_state"} & items:
    return False
  try:
    source = json.loads((steps[0] / "meta" / "metadata").read_text()).get("source", "")
  except (OSError, ValueError, AttributeError):
    return False
  return bool(re.fullmatch(r".+ step \d+ \(EMA weights\)", source)) and not source.startswith(
    "WiSE-FT:"
  )


def model_folder_of(path: str) -> str | None:
  """The model folder that ships with the code that `path` is or lies inside, at any depth (the
  nearest from `path` up: links resolved, buckets too); None for any other path. `path` need
  not exist (an output about to be made)."""
  p = fileio.path(fileio.real(path))
  for folder in (p, *p.parents):
    if str(folder).rstrip("/").endswith(":") or str(folder) in ("/", ""):
      break  # the root, or a bucket's scheme
    if is_model_folder(str(folder)):
      return str(folder)
  return None


def refuse_write(path: str, flag: str) -> None:
  """The one rule of every command that writes: nothing is written into a model folder that
  ships with the code, at any depth (its files are its manifest's; a changed or added file makes
  every command refuse it). An InputError in one line naming `flag` and the folder, raised before
  any work; reads nothing else."""
  folder = model_folder_of(path)
  if folder is None:
    return
  where = "is" if fileio.real(path) == folder else "lies inside"
  checked = (
    f"its {MANIFEST} is missing: its one step is as ship writes it"
    if lost_manifest(folder)
    else f"every file is checked against its {MANIFEST}"
  )
  raise InputError(
    f"{flag} {path} {where} the model folder {folder}, a shipped model's, which is read-only "
    f"({checked}): give a path outside it; if anything was written there, restore it: "
    f"{restore_advice(folder)}"
  )


def files_of(folder: str) -> list[str]:
  """Every file under `folder` (local or a bucket's), as sorted paths relative to it."""
  return fileio.files_below(folder)


def digest(folder: str, files: list[str]) -> str:
  """SHA-256 over `files` (paths relative to `folder`) in order: each path, its size, its bytes;
  a file added, removed, renamed or changed by one byte changes it."""
  h = hashlib.sha256()
  for rel in files:
    data = fileio.path(fileio.join(folder, rel)).read_bytes()
    h.update(rel.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
  return h.hexdigest()


def own_digest(manifest: dict[str, Any]) -> str:
  """SHA-256 of the manifest's own fields (recipe, config, scores, training... all but
  `manifest_sha256` itself, as sorted JSON): an edit to any of them changes it."""
  fields = {k: v for k, v in manifest.items() if k != OWN}
  return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def step_files(workdir: str, step: int) -> list[str]:
  """The files of a step, relative to the workdir."""
  rel = f"{CHECKPOINTS}/{step}"
  return [f"{rel}/{f}" for f in files_of(fileio.join(workdir, rel))]


def _damaged(workdir: str, problem: str) -> ManifestError:
  return ManifestError(
    f"model folder {workdir}: {problem}; the model is damaged or was edited: restore it: "
    f"{restore_advice(workdir)}"
  )


def read(workdir: str) -> dict[str, Any] | None:
  """The folder's manifest, or None where it has none (a training run); a manifest that is not
  JSON, is a folder, or is missing from what is obviously a model folder (`lost_manifest`) is a
  ManifestError."""
  path = fileio.join(workdir, MANIFEST)
  if fileio.path(path).is_dir():
    raise _damaged(workdir, f"its {MANIFEST} is a folder, not the model's manifest")
  text = fileio.read_text(path)
  if text is None:
    if missing_note(workdir):
      raise ManifestError(f"model folder {workdir}: no such folder{missing_note(workdir)}")
    if lost_manifest(workdir):
      raise _damaged(workdir, f"its {MANIFEST} is missing (its one step is as ship writes it)")
    return None
  try:
    manifest = json.loads(text)
    if manifest.get("format") != FORMAT or not isinstance(manifest.get("files"), list):
      raise ValueError(f"not a {FORMAT} manifest")
  except (ValueError, AttributeError) as e:
    raise ManifestError(
      f"{path}: unreadable ({e}); restore the model folder: {restore_advice(workdir)}"
    ) from None
  return manifest


def verify(workdir: str) -> dict[str, Any] | None:
  """Check a model folder (local or in a bucket) against its manifest (nothing to check without
  one): the manifest's own fields must match its own SHA-256, and the files of its step must be
  exactly those listed, with the listed SHA-256; else a ManifestError naming the folder and what
  differs. Returns the manifest."""
  manifest = read(workdir)
  if manifest is None:
    return manifest
  step = manifest.get("step")
  have = step_files(workdir, step)
  listed = list(manifest["files"])
  steps = sorted(q.name for q in fileio.path(fileio.join(workdir, CHECKPOINTS)).iterdir())
  problem = None
  if manifest.get(OWN) != own_digest(manifest):
    problem = (
      f"its {MANIFEST} was edited (its fields, recipe, config, scores..., do not match its own "
      f"{OWN}{'' if OWN in manifest else ', which it lacks'})"
    )
  elif steps != [str(step)]:
    problem = f"it holds steps {steps}, its manifest step {step} only"
  elif have != listed:
    extra, missing = sorted(set(have) - set(listed)), sorted(set(listed) - set(have))
    problem = f"files {'added' if extra else 'missing'}: {(extra or missing)[:3]}"
  elif digest(workdir, have) != manifest.get("sha256"):
    problem = "its weights' SHA-256 is not the manifest's (a file was changed)"
  if problem:
    raise _damaged(workdir, problem)
  return manifest


def write(workdir: str, step: int, record: dict[str, Any]) -> dict[str, Any]:
  """Write the manifest of the model folder `workdir` (its one step `step`): `record` (config,
  device, recipe, training, scores) with the format, the step, its files and their SHA-256, and
  the SHA-256 of all those fields (`own_digest`)."""
  files = step_files(workdir, step)
  manifest = {
    "format": FORMAT,
    "step": step,
    **record,
    "files": files,
    "sha256": digest(workdir, files),
  }
  manifest[OWN] = own_digest(manifest)
  fileio.write_text(fileio.join(workdir, MANIFEST), json.dumps(manifest, indent=1) + "\n")
  return manifest
