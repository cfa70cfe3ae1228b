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
from typing import Any

from cdeit_jax.common import fileio
from cdeit_jax.common.errors import InputError

MANIFEST = "manifest.json"
FORMAT = "cdeit-jax model v1"
CHECKPOINTS = "checkpoints"  # as checkpoint.CHECKPOINTS (that module imports this one)


class ManifestError(InputError):
  """A model folder whose files are not those its manifest names (one line)."""


def restore_advice(folder: str) -> str:
  """The commands that put a model folder back as it was shipped: its tracked files restored
  and every file added there removed (`git checkout` alone leaves added files behind)."""
  return (
    f"git checkout -- {folder} && git clean -fdx {folder} (a copy outside git: copy it again, "
    "or ship it again with python -m cdeit_jax.ship)"
  )


def is_model_folder(folder: str) -> bool:
  """Whether `folder` is a model folder that ships with the code: it holds `manifest.json`
  (a file, or anything else under that name: a damaged one) beside a `checkpoints/` folder."""
  p = fileio.path(folder)
  return (p / MANIFEST).exists() and (p / CHECKPOINTS).is_dir()


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
  raise InputError(
    f"{flag} {path} {where} the model folder {folder}, which ships with the code and is "
    f"read-only (every file is checked against its {MANIFEST}): give a path outside it; if "
    f"anything was written there, restore it: {restore_advice(folder)}"
  )


def files_of(folder: str) -> list[str]:
  """Every file under `folder`, as sorted paths relative to it ('/'-separated)."""
  out = []
  for root, _, names in os.walk(folder):
    for n in names:
      out.append(os.path.relpath(os.path.join(root, n), folder).replace(os.sep, "/"))
  return sorted(out)


def digest(folder: str, files: list[str]) -> str:
  """SHA-256 over `files` (paths relative to `folder`) in order: each path, its size, its bytes;
  a file added, removed, renamed or changed by one byte changes it."""
  h = hashlib.sha256()
  for rel in files:
    with open(os.path.join(folder, rel), "rb") as fh:
      data = fh.read()
    h.update(rel.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
  return h.hexdigest()


def step_files(workdir: str, step: int) -> list[str]:
  """The files of a step, relative to the workdir."""
  rel = f"{CHECKPOINTS}/{step}"
  return [f"{rel}/{f}" for f in files_of(os.path.join(workdir, rel))]


def read(workdir: str) -> dict[str, Any] | None:
  """The folder's manifest, or None where it has none (a training run); a manifest that is not
  JSON is a ManifestError."""
  path = fileio.join(workdir, MANIFEST)
  text = fileio.read_text(path)
  if text is None:
    return None
  try:
    manifest = json.loads(text)
    if manifest.get("format") != FORMAT or not isinstance(manifest.get("files"), list):
      raise ValueError(f"not a {FORMAT} manifest")
  except (ValueError, AttributeError) as e:
    raise ManifestError(f"{path}: unreadable ({e}); restore the model folder") from None
  return manifest


def verify(workdir: str) -> dict[str, Any] | None:
  """Check a model folder against its manifest (nothing to check without one): the files of
  its step must be exactly those listed, with the listed SHA-256; else a ManifestError naming
  the folder and what differs. Returns the manifest."""
  manifest = read(workdir)
  if manifest is None or fileio.is_remote(workdir):
    return manifest
  step = manifest.get("step")
  have = step_files(workdir, step) if os.path.isdir(f"{workdir}/{CHECKPOINTS}/{step}") else []
  listed = list(manifest["files"])
  steps = sorted(os.listdir(os.path.join(workdir, CHECKPOINTS)))
  problem = None
  if steps != [str(step)]:
    problem = f"it holds steps {steps}, its manifest step {step} only"
  elif have != listed:
    extra, missing = sorted(set(have) - set(listed)), sorted(set(listed) - set(have))
    problem = f"files {'added' if extra else 'missing'}: {(extra or missing)[:3]}"
  elif digest(workdir, have) != manifest.get("sha256"):
    problem = "its weights' SHA-256 is not the manifest's (a file was changed)"
  if problem:
    raise ManifestError(
      f"model folder {workdir}: {problem}; the model is damaged or was edited: restore it: "
      f"{restore_advice(workdir)}"
    )
  return manifest


def write(workdir: str, step: int, record: dict[str, Any]) -> dict[str, Any]:
  """Write the manifest of the model folder `workdir` (its one step `step`): `record` (config,
  device, recipe, training, scores) with the format, the step, its files and their SHA-256."""
  files = step_files(workdir, step)
  manifest = {
    "format": FORMAT,
    "step": step,
    **record,
    "files": files,
    "sha256": digest(workdir, files),
  }
  fileio.write_text(fileio.join(workdir, MANIFEST), json.dumps(manifest, indent=1) + "\n")
  return manifest
