"""The Kuopio Tomography Challenge 2023's data as the challenge ships them: a folder of
`level_K` folders (or one level folder), each with `ref.mat` (the empty tank: `Injref`, `Mpat`,
`Uelref`), `dataN.mat` (target N: `Inj`, `Mpat`, `Uel`, NaN where the level removed electrodes)
and, where known, `trueN.mat` (`truth`, (256, 256): 0 water, 1 resistive, 2 conductive).
"""

from __future__ import annotations

import dataclasses
import os
import re

import numpy as np

from cdeit_jax.common import matfile
from cdeit_jax.common.errors import InputError, MissingFile
from cdeit_jax.eit import layout as lay
from cdeit_jax.eit import reference_match

_LEVEL = re.compile(r"^level_(\d+)$")
_DATA = re.compile(r"^data(\d+)\.mat$")


@dataclasses.dataclass(frozen=True)
class Case:
  """One target of one level: its measuring system, the empty tank's and the target's frames
  (R,) in the device's volts (NaN: removed), and the truth where known."""

  level: int
  target: int
  layout: lay.Layout
  reference: np.ndarray
  frame: np.ndarray
  truth: np.ndarray | None
  path: str

  @property
  def name(self) -> str:
    return f"level_{self.level}/{self.target}"

  @property
  def difference(self) -> np.ndarray:
    """The target's frame minus the empty tank's (NaN where either is missing)."""
    return self.frame - self.reference


def _level_folders(path: str, flag: str) -> list[tuple[int, str]]:
  if not os.path.isdir(path):
    raise MissingFile(
      f"{flag} {path}: no such folder; give the challenge's folder of levels (the public data "
      "ship in data/ktc2023/levels) or one level_K folder"
    )
  m = _LEVEL.match(os.path.basename(os.path.normpath(path)))
  if m:
    return [(int(m.group(1)), path)]
  found = sorted(
    (int(m.group(1)), os.path.join(path, n))
    for n in os.listdir(path)
    if (m := _LEVEL.match(n)) and os.path.isdir(os.path.join(path, n))
  )
  _distinct(path, [(k, os.path.basename(f)) for k, f in found], "level")
  if not found:
    raise MissingFile(
      f"{flag} {path}: no level_K folders; give the challenge's folder of levels (each "
      "with ref.mat and dataN.mat) or one level folder"
    )
  return found


def _distinct(where: str, numbered: list[tuple[int, str]], what: str) -> None:
  """Refuse two names for one number (level_1 and level_01, data1.mat and data01.mat): their
  scores would be counted twice under one name."""
  seen: dict[int, str] = {}
  for k, name in numbered:
    if k in seen:
      raise InputError(f"{where}: {seen[k]} and {name} are both {what} {k}; keep one of them")
    seen[k] = name


def _truth(path: str) -> np.ndarray:
  """A trueN.mat's (256, 256) classes: 0 water, 1 resistive, 2 conductive, nothing else."""
  return read_classes(path, "truth")


def read_classes(path: str, key: str = "reconstruction") -> np.ndarray:
  """A MAT-file's (256, 256) array `key` of classes (0 water, 1 resistive, 2 conductive, nothing
  else): a truth's (`truth`) or an answer's (`reconstruction`, the challenge's format)."""
  t = matfile.read(path)
  if key not in t or np.shape(t[key]) != (256, 256):
    raise InputError(f"{path}: expected a (256, 256) array '{key}'")
  classes = np.asarray(t[key])
  if classes.dtype.kind not in "iuf" or not np.isin(classes, (0, 1, 2)).all():
    bad = ~np.isin(classes, (0, 1, 2))
    others = np.unique(classes[bad]) if classes.dtype.kind in "iuf" else []
    raise InputError(
      f"{path}: '{key}' holds values other than 0 (water), 1 (resistive) and 2 (conductive)"
      + (f": {', '.join(f'{v:g}' for v in others[:5])}" if len(others) else "")
    )
  return classes.astype(np.uint8)


def read_cases(path: str, flag: str = "--data_path") -> list[Case]:
  """Every target of every level under `path` (given as `flag`), by level then target."""
  cases = []
  for level, folder in _level_folders(path, flag):
    ref_path = os.path.join(folder, "ref.mat")
    if not os.path.exists(ref_path):
      raise MissingFile(f"{folder}: no ref.mat (the empty tank's measurement, Injref/Mpat/Uelref)")
    layout, reference = lay.from_device_file(ref_path)
    if reference is None:
      raise InputError(f"{ref_path}: no Uelref (the empty tank's voltages)")
    if not np.isfinite(reference).any():
      raise InputError(f"{ref_path}: every value of Uelref is NaN; give the empty tank's voltages")
    if cases and not layout.measures_as(cases[0].layout):
      raise InputError(
        f"{ref_path}: the level is of {layout.describe()}, {cases[0].path}'s of "
        f"{cases[0].layout.describe()}; give the levels of one measuring system"
      )
    named = sorted((int(m.group(1)), n) for n in os.listdir(folder) if (m := _DATA.match(n)))
    _distinct(folder, named, "target")
    if not named:
      raise MissingFile(f"{folder}: no dataN.mat files")
    for n, name in named:
      data_path = os.path.join(folder, name)
      data_layout, frame = lay.from_device_file(data_path)
      if frame is None:
        raise InputError(f"{data_path}: no Uel (the target's voltages)")
      if not np.isfinite(frame).any():
        raise InputError(f"{data_path}: every value of Uel is NaN; give the target's voltages")
      if not data_layout.measures_as(layout):
        raise InputError(f"{data_path}: its Inj/Mpat are not those of {ref_path}")
      lacking = np.isfinite(frame) & ~np.isfinite(reference)
      if lacking.any():  # a level removes electrodes from the targets' frames, not the tank's
        raise InputError(
          f"{ref_path}: Uelref is NaN at {int(lacking.sum())} values that {name} holds "
          f"(measurements {reference_match.listed(np.flatnonzero(lacking))}); give the empty "
          "tank's whole frame"
        )
      truth = None
      truth_path = os.path.join(folder, f"true{n}.mat")
      if os.path.exists(truth_path):
        truth = _truth(truth_path)
      cases.append(Case(level, n, layout, reference, frame, truth, data_path))
  return cases
