"""The background's drift between each KTC2023 target frame and its empty tank's, per case with a
truth, as JSON (`cdeit_jax.data.frame_drift` fits it).

  python -m cdeit_jax.frame_drift --data data/ktc2023/levels [--contrast 2]
"""

from __future__ import annotations

import json

import numpy as np
from absl import flags

from cdeit_jax.common.errors import InputError
from cdeit_jax.data.frame_drift import fit

FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
  del argv

  from cdeit_jax.data import ktc2023
  from cdeit_jax.eit.simulator import Simulator

  for flag, value, what in (
    ("--contrast", FLAGS.contrast, "the objects' log10 conductivity ratio to the water's, e.g. 2"),
    ("--contact_impedance", FLAGS.contact_impedance, "in the simulator's units, e.g. 1e-4"),
  ):
    if not (np.isfinite(value) and value > 0):
      raise InputError(f"{flag} {value:g}: must be a positive number ({what})")
  cases = [c for c in ktc2023.read_cases(FLAGS.data, "--data") if c.truth is not None]
  if not cases:
    raise InputError(f"--data {FLAGS.data}: no case with a truth (trueN.mat) to fit the drift to")
  sims, out = {}, {}
  for c in cases:
    layout = c.layout.with_contact_impedance(FLAGS.contact_impedance).physics
    if layout not in sims:
      sims[layout] = Simulator(layout=layout)
    out[c.name] = fit(sims[layout], c.reference, c.frame, c.truth, FLAGS.contrast)
  print(json.dumps({"data": FLAGS.data, "contrast": FLAGS.contrast, "cases": out}, indent=1))


if __name__ == "__main__":
  from cdeit_jax import cli

  flags.DEFINE_string("data", None, "folder of level_K folders (data/ktc2023/levels)")
  flags.DEFINE_float("contrast", 2.0, "the objects' log10 conductivity ratio to the water's")
  flags.DEFINE_float("contact_impedance", 1e-4, "simulator units (KTC2023's calibration: 1e-4)")
  flags.mark_flag_as_required("data")
  cli.run(main)
