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


def _level_folders(path: str) -> list[tuple[int, str]]:
  if not os.path.isdir(path):
    raise MissingFile(f"--data_path {path}: no such folder (a folder of level_K folders)")
  m = _LEVEL.match(os.path.basename(os.path.normpath(path)))
  if m:
    return [(int(m.group(1)), path)]
  found = sorted(
    (int(m.group(1)), os.path.join(path, n))
    for n in os.listdir(path)
    if (m := _LEVEL.match(n)) and os.path.isdir(os.path.join(path, n))
  )
  if not found:
    raise MissingFile(
      f"--data_path {path}: no level_K folders; give the challenge's folder of levels (each "
      "with ref.mat and dataN.mat) or one level folder"
    )
  return found


def read_cases(path: str) -> list[Case]:
  """Every target of every level under `path`, by level then target."""
  cases = []
  for level, folder in _level_folders(path):
    ref_path = os.path.join(folder, "ref.mat")
    if not os.path.exists(ref_path):
      raise MissingFile(f"{folder}: no ref.mat (the empty tank's measurement, Injref/Mpat/Uelref)")
    layout, reference = lay.from_device_file(ref_path)
    if reference is None:
      raise InputError(f"{ref_path}: no Uelref (the empty tank's voltages)")
    targets = sorted(int(m.group(1)) for n in os.listdir(folder) if (m := _DATA.match(n)))
    if not targets:
      raise MissingFile(f"{folder}: no dataN.mat files")
    for n in targets:
      data_path = os.path.join(folder, f"data{n}.mat")
      data_layout, frame = lay.from_device_file(data_path)
      if frame is None:
        raise InputError(f"{data_path}: no Uel (the target's voltages)")
      if not np.array_equal(np.sign(data_layout.currents), np.sign(layout.currents)) or (
        not np.array_equal(data_layout.rows, layout.rows)
      ):
        raise InputError(f"{data_path}: its Inj/Mpat are not those of {ref_path}")
      truth = None
      truth_path = os.path.join(folder, f"true{n}.mat")
      if os.path.exists(truth_path):
        t = matfile.read(truth_path)
        if "truth" not in t or np.shape(t["truth"]) != (256, 256):
          raise InputError(f"{truth_path}: expected a (256, 256) array 'truth'")
        truth = np.asarray(t["truth"], np.uint8)
      cases.append(Case(level, n, layout, reference, frame, truth, data_path))
  return cases
