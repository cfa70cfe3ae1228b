"""Calibrate a device from its empty-tank frame: the measuring system that a model for it is
trained on (`configs/device.py`, `make device-model`).

  python -m cdeit_jax.calibrate --device ref.mat --out runs/mydevice/device.npz
  python -m cdeit_jax.calibrate --device uef.mat --patterns 0-15 --width_deg 10.2 --out D.npz

DEVICE is the device's reference file (`.mat`/`.npz`, KTC's or UEF's keys, docs/your_device.md)
holding its currents, measurement pattern and the empty tank's frame. The fit
(`cdeit_jax.eit.calibration`) finds the gain (measured / simulated volts), the contact impedance
and the electrodes' angular width, each with its uncertainty; a value given on the command line
is held instead. Writes OUT (the device with its geometry and calibration, which every command
reads as `config.simulator.layout`) and prints the fit as one JSON line.
"""

from __future__ import annotations

import json

from absl import flags

FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
  del argv
  from cdeit_jax.checkpoints import shipped
  from cdeit_jax.common import fileio, logs
  from cdeit_jax.common.errors import InputError
  from cdeit_jax.eit import calibration, layout

  logs.console()
  if not FLAGS.out.lower().endswith(".npz"):
    raise InputError(f"--out {FLAGS.out}: the calibrated device is written as an .npz file")
  shipped.refuse_write(FLAGS.out, "--out")
  fileio.refuse_own_input(FLAGS.out, "--out", [("--device", FLAGS.device)], writes=())
  lay, reference = layout.from_device_file(
    FLAGS.device,
    first_deg=FLAGS.first_deg,
    clockwise=FLAGS.clockwise,
    patterns=FLAGS.patterns,
  )
  if reference is None:
    raise InputError(f"{FLAGS.device}: no empty-tank frame (Uelref or Uel) to calibrate with")
  fit = calibration.fit(
    lay,
    reference,
    FLAGS.device,
    width=FLAGS.width_deg is None,
    width_deg=FLAGS.width_deg,
    contact_impedance=FLAGS.contact_impedance,
  )
  logs.log.info(f"calibration of {lay.describe()} from {FLAGS.device}: {fit.describe()}")
  device = calibration.calibrated(lay, fit)
  fileio.makedirs(fileio.dirname(FLAGS.out))
  layout.save_device(FLAGS.out, device, reference)
  print(json.dumps({"device": device.describe(), "out": FLAGS.out, **vars(fit)}))


if __name__ == "__main__":
  from cdeit_jax import cli

  flags.DEFINE_string("device", None, "the device's reference file (.mat or .npz)", required=True)
  flags.DEFINE_string("out", None, "the calibrated device (.npz)", required=True)
  flags.DEFINE_string("patterns", None, "the current patterns to keep, e.g. 0-15 (default: all)")
  flags.DEFINE_float("width_deg", None, "the electrodes' angular width if known (else fitted)")
  flags.DEFINE_float("contact_impedance", None, "the contact impedance if known (else fitted)")
  flags.DEFINE_float("first_deg", None, "electrode 0's angle from +x (default: the top)")
  flags.DEFINE_boolean(
    "clockwise", None, "electrodes numbered clockwise (default: UEF's keys yes, KTC's no)"
  )
  cli.define_cache_flag()
  cli.run(main)
