"""eval.py's kinds of test data, behind one small registry (big_vision's evaluators, MaxText's
`dataset_type`): a kind names the module that reads its format and the units it is read in
unless `--units` says otherwise.

  simulated          a folder of npz files in the simulator's units (`infer.evaluate`)
  uef2017            a folder of npz files in the UEF2017 tank's units (`infer.evaluate`)
  recording          one frames file of a device, with its true images (`infer.recording`)
  ktc2023_challenge  KTC2023's level_K folders, answered as the challenge asks
                     (`infer.challenge`; each level calibrated from its ref.mat); without a
                     model (no --workdir), the linearised answers
  greit              no data: GREIT's 100 small targets simulated on the model's system, their
                     GREIT figures of merit beside the baselines' (`infer.greit_test`)

A name of another named system (`measurement.unit_names`, e.g. ktc2023) is a folder of npz files
in that system's units, as before. Each module has `run(kind, workdir, data_path, out,
overrides, units)`; `data_kinds.evaluate` resolves the kind once and calls it.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from cdeit_jax.common.errors import InputError
from cdeit_jax.eit import measurement


@dataclasses.dataclass(frozen=True)
class Kind:
  """One kind of test data: its name, the module that evaluates it, its default units (a name of
  `measurement.unit_names`; None: the model's device's own, `measurement.own_units`),
  whether other units may be given (the challenge calibrates each level itself), whether it
  answers without a model (the challenge's linearised answers), whether it reads data (the
  GREIT test simulates its own), whether it is a device's own frames (`device_frames`: what a
  translated run's device gives, `run_frames`) and whether a std's calibration may be fitted on
  it (`fits_uncertainty`: simulations of the model's own distribution)."""

  name: str
  module: str
  units: str | None
  summary: str
  takes_units: bool = True
  needs_model: bool = True
  needs_data: bool = True
  device_frames: bool = False
  fits_uncertainty: bool = False
  no_units: str = ""  # why a kind that takes no units needs none

  def units_of(self, units: str | None, device, voltage_ratio=None, current_ratio=None):
    """The units the data are read in, resolved once: `units` (--units), else the kind's, else
    the model's device's own (`device`, a layout); `voltage_ratio`/`current_ratio`
    (--config.eval.*) override either ratio."""
    if units is not None and not self.takes_units:
      raise InputError(
        f"--units {units}: --data {self.name} reads no units ({self.no_units}); leave --units out"
      )
    base = units if units is not None else self.units
    if base is None:
      base = measurement.own_units(device)
    return measurement.in_units(device, base, voltage_ratio, current_ratio)


_NPZ = "cdeit_jax.infer.evaluate"
KINDS = {
  k.name: k
  for k in (
    Kind(
      "simulated",
      _NPZ,
      "simulated",
      "a folder of npz files (python -m cdeit_jax.simulate)",
      fits_uncertainty=True,
    ),
    Kind("uef2017", _NPZ, "uef2017", "a folder of npz files in the UEF2017 tank's units"),
    Kind(
      "recording",
      "cdeit_jax.infer.recording",
      None,
      "one frames file of the model's device (frames, reference, targets), in its units",
      device_frames=True,
    ),
    Kind(
      "ktc2023_challenge",
      "cdeit_jax.infer.challenge",
      None,
      "KTC2023's level_K folders, answered as the challenge asks (the linearised answers "
      "without --workdir)",
      takes_units=False,
      needs_model=False,
      no_units="each level is calibrated from its reference frame",
    ),
    Kind(
      "greit",
      "cdeit_jax.infer.greit_test",
      None,
      "no data: the GREIT test's 100 targets simulated on the model's system",
      takes_units=False,
      needs_data=False,
      no_units="its targets are simulated in the simulator's units",
    ),
  )
}


def names() -> list[str]:
  return list(KINDS)


def get(name: str) -> Kind:
  """The kind `name`; a named system's (`measurement.unit_names`) is npz files in its units."""
  if name in KINDS:
    return KINDS[name]
  if isinstance(name, str) and measurement.preset_ratios(name) is not None:
    return Kind(name, _NPZ, name, f"a folder of npz files in {name}'s units")
  raise InputError(
    f"--data {name!r}: give one of {', '.join(KINDS)} (or a folder of npz files in a named "
    f"system's units: {', '.join(measurement.unit_names())})"
  )


def evaluate(
  path: str | None,
  data_name: str,
  data_path: str | None,
  out: str,
  overrides: dict[str, Any] | None = None,
  units: str | None = None,
) -> dict[str, Any]:
  """eval.py's work: reconstruct the test data at `data_path`, of kind `data_name` (resolved
  once here, then its module's `run`), with the checkpoint at `path` (a run: its best validated
  step that loads, else the latest; or one `RUN/checkpoints/STEP`; None: no model, for a kind
  that answers without one) and write every output into `out`; returns metrics.json's content.
  `units`: the data's units (a name of `measurement.unit_names`), else the kind's.

  `overrides` (dotted keys, as `--config.sampling.steps=2` gives them) change the sampling and
  evaluation settings and the model's runtime keys of the checkpoint's config."""
  from cdeit_jax.infer import outputs

  with outputs.left_as_found(out):  # a refusal leaves no empty --out behind
    kind = get(data_name)
    if path is None and kind.needs_model:
      raise InputError(
        f"--data {data_name}: give the model to evaluate with --workdir (a run directory); "
        f"only {', '.join(k.name for k in KINDS.values() if not k.needs_model)} answers "
        "without one"
      )
    if units is not None and not kind.takes_units:
      kind.units_of(units, None)  # the refusal, before any work
    if (data_path is None) == kind.needs_data:
      raise InputError(
        f"--data {data_name}: give the data with --data_path"
        if kind.needs_data
        else f"--data {data_name} simulates its own targets: leave --data_path out"
      )
    return importlib.import_module(kind.module).run(kind, path, data_path, out, overrides, units)
