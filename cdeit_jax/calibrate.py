"""Calibrate a device from its empty-tank frame: the measuring system that a model for it is
trained on (`configs/device.py`, `make device-model`).

  python -m cdeit_jax.calibrate --device ref.mat --out runs/mydevice/device.npz
  python -m cdeit_jax.calibrate --device uef.mat --patterns 0-15 --width_deg 10.2 --out D.npz
  python -m cdeit_jax.calibrate --device ref.mat --electrode_cm 2.5 --tank_cm 28 --out D.npz

DEVICE is the device's reference file (`.mat`/`.npz`, KTC's or UEF's keys, docs/your_device.md)
holding its currents, measurement pattern and the empty tank's frame. The fit
(`cdeit_jax.eit.calibration`) finds the gain (measured / simulated volts), the contact impedance
and the electrodes' angular width, each with its uncertainty and the range that fits as well; a
value given on the command line is held instead. A value the frame does not determine is said
so, with its range, which a model for the device is trained across (configs/device.py). Writes
OUT (the device with its geometry, calibration and ranges, which every command reads as
`config.simulator.layout`) and the fit's whole record as JSON beside it (OUT's name with
`.json`: `record_file`), and prints one line of the fit.
"""

from __future__ import annotations

import json
import math

import numpy as np
from absl import flags

FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
  del argv
  calibrate(
    FLAGS.device, FLAGS.out, patterns=FLAGS.patterns, width_deg=FLAGS.width_deg,
    electrode_cm=FLAGS.electrode_cm, tank_cm=FLAGS.tank_cm,
    contact_impedance=FLAGS.contact_impedance, first_deg=FLAGS.first_deg,
    clockwise=FLAGS.clockwise, electrodes=FLAGS.electrodes,
  )  # fmt: skip


def calibrate(
  device_file: str,
  out: str,
  *,
  patterns: str | None,
  width_deg: float | None,
  electrode_cm: float | None,
  tank_cm: float | None,
  contact_impedance: float | None,
  first_deg: float | None,
  clockwise: bool | None,
  electrodes: bool,
) -> None:
  """`device_file`'s device calibrated to its empty tank (module docstring), written to `out`
  (.npz), its JSON record beside it (`record_file`); the fit printed in one line."""
  from cdeit_jax.checkpoints import shipped
  from cdeit_jax.common import fileio, logs
  from cdeit_jax.common.errors import InputError
  from cdeit_jax.eit import calibration, device_files, layout

  logs.console()
  if not out.lower().endswith(".npz"):
    raise InputError(f"--out {out}: the calibrated device is written as an .npz file")
  shipped.refuse_write(out, "--out")
  fileio.refuse_own_input(out, "--out", [("--device", device_file)], writes=())
  # a device file this command wrote is replaced (a rerun), nothing else; its folder is made
  fileio.output_file(
    out, "--out", device_files.is_saved_device, device_files.SAVED, makes_folder=True
  )
  fileio.output_file(
    record_file(out), "--out", _is_record, "a calibration record", makes_folder=True
  )
  width_deg = given_width(width_deg, electrode_cm, tank_cm)
  lay, reference = layout.from_device_file(
    device_file,
    first_deg=first_deg,
    clockwise=clockwise,
    patterns=patterns,
  )
  if reference is None:
    raise InputError(f"{device_file}: no empty-tank frame (Uelref or Uel) to calibrate with")
  refuse_another_device(out, lay, calibrated=False)  # another protocol: before the fit
  fit = calibration.fit(
    lay,
    reference,
    device_file,
    width=width_deg is None,
    width_deg=width_deg,
    contact_impedance=contact_impedance,
  )
  logs.log.info(f"calibration of {lay.describe()} from {device_file}: {fit.describe()}")
  logs.log.info(what_follows(fit, width_deg))
  record = {}
  if electrodes:
    record["electrodes"] = per_electrode(lay, reference, fit)
  device = calibration.calibrated(lay, fit)
  refuse_another_device(out, device)
  fileio.makedirs(fileio.dirname(out))
  device_files.save_device(out, device, reference, ranges=fit.ranges)
  kept = record_file(out)
  fileio.write_text(
    kept,
    json.dumps({"device": device.describe(), "out": out, **vars(fit), **record}, indent=1),
    ours=_is_record,
    what="a calibration record",
  )
  print(f"calibrated {device.describe()}: {out} (the fit: {fit.describe()}; its record: {kept})")


def record_file(out: str) -> str:
  """The calibration's JSON record of the device file `out` (.npz): beside it, named alike."""
  return out[: -len(".npz")] + ".json"


def _is_record(path: str) -> bool:
  """Whether `path` is a calibration record this command wrote (a rerun replaces it)."""
  from cdeit_jax.common import fileio

  try:
    got = json.loads(fileio.read_text(path) or "")
  except ValueError:
    return False
  return isinstance(got, dict) and {"device", "out", "gain"} <= set(got)


def per_electrode(lay, reference, fit) -> dict:
  """Each electrode's contact impedance, centre and width fitted around the global fit
  (`eit.electrode_fit`), logged with the residual before and after, in the frame and on held-out
  patterns; the JSON record. The device keeps the global fit: on UEF2017's tank the electrodes'
  own values fit the frame better and held-out patterns worse (docs/your_device.md)."""
  from cdeit_jax.common import logs
  from cdeit_jax.eit import electrode_fit

  each = electrode_fit.fit(lay, reference, fit)
  held = electrode_fit.held_out(lay, reference, fit)
  logs.log.info(f"{each.describe(held)}; the device keeps the global fit")
  record = {**each.as_dict(), "held_out": held}
  if held["per_electrode"] >= held["global"]:  # what held-out patterns do not confirm
    record["determined"] = {k: [False] * len(v) for k, v in record["determined"].items()}
  return record


def refuse_another_device(out: str, device, calibrated: bool = True) -> None:
  """A device file that a run's data, checkpoints or translation beside it were made for (`make
  device-model`: RUN/device.npz, RUN/data, RUN/checkpoints, RUN/translation.npz) is not
  replaced by another device: refused in one line naming both and how they differ, before
  anything is written (a run is one device). Called with the device file's layout before the
  fit (`calibrated` False: another protocol is refused at once) and with the calibrated device
  after it (another calibration of the same protocol); the same calibration again, a rerun that
  resumes, is written as before."""
  from cdeit_jax.common import fileio
  from cdeit_jax.common.errors import InputError
  from cdeit_jax.eit import layout
  from cdeit_jax.infer.run_opening import TRANSLATION_FILE

  if not fileio.path(out).is_file():
    return
  run = fileio.dirname(out)
  made = [
    n
    for n in ("data/simulate.json", "checkpoints", TRANSLATION_FILE)
    if fileio.path(fileio.join(run, n)).exists()
  ]
  if not made:
    return
  try:
    old, _ = layout.from_device_file(out)
  except InputError:
    return  # not a device file: nothing was made for it
  if not old.measures_as(device):
    how = f"{old.describe()}, where --device is {device.describe()}"
  elif not calibrated or old.record() == device.record():
    return  # the same protocol (its calibration is checked after the fit); the same device
  else:
    pick = lambda d: {
      "width": f"{np.rad2deg(d.width):.4g} degrees",
      "gain": f"{d.gain:.6g}",
      "contact impedance": f"{d.contact_impedance}",
    }
    was, now = pick(old), pick(device)
    diff = ", ".join(f"{k} {was[k]} there, {now[k]} here" for k in was if was[k] != now[k])
    how = f"{old.describe()}, calibrated otherwise than now ({diff or 'its geometry'})"
  holds = " and ".join(f"{run}/{n}" for n in made)
  raise InputError(
    f"--out {out} is the device of the run in {run} ({holds} {'are' if len(made) > 1 else 'is'} "
    f"of it): {how}; a run is one "
    "device: give the new device its own folder (--out NEW/device.npz; make device-model "
    f"RUN=NEW), or remove {run} to start that run again"
  )


def given_width(width_deg: float | None, electrode_cm: float | None, tank_cm: float | None):
  """The electrodes' width in degrees that the user gives (--width_deg, or --electrode_cm on a
  tank --tank_cm across: the arc 360 e / (pi d)), or None (fitted)."""
  from cdeit_jax.common.errors import InputError

  if (electrode_cm is None) != (tank_cm is None):
    raise InputError(
      "--electrode_cm and --tank_cm go together (the electrodes' width on a tank of that diameter)"
    )
  if electrode_cm is None:
    return width_deg
  if width_deg is not None:
    raise InputError("give the width once: --width_deg, or --electrode_cm with --tank_cm")
  if not (0 < electrode_cm < float("inf") and 0 < tank_cm < float("inf")):
    raise InputError(
      f"--electrode_cm {electrode_cm:g} and --tank_cm {tank_cm:g}: both must be above 0"
    )
  return float(360.0 * electrode_cm / (math.pi * tank_cm))


def what_follows(fit, width_deg: float | None) -> str:
  """One line: which of the width and contact impedance the model for this device is trained
  across (what the frame does not determine, within what the simulator takes), which are fitted
  and which given."""
  from cdeit_jax.eit.spec import WIDTH_DEG_LIMITS

  parts = []
  for name, unit, flag in (
    ("width_deg", "electrode width", "--width_deg (or --electrode_cm with --tank_cm)"),
    ("contact_impedance", "contact impedance", "--contact_impedance"),
  ):
    if name not in fit.identifiable:
      parts.append(f"the {unit} is given")
    elif fit.identifiable[name]:
      parts.append(f"the {unit} is fitted")
    else:
      lo, hi = fit.ranges[name]
      top = min(hi, WIDTH_DEG_LIMITS[1]) if name == "width_deg" else hi
      clip = f" (the simulator's widest; {hi:.3g} fit as well)" if top < hi else ""
      parts.append(
        f"the frame does not determine the {unit}: a model for this device (configs/device.py) "
        f"is trained across {lo:.3g} to {top:.3g}{clip}; give {flag} if you know it"
      )
  return "; ".join(parts)


if __name__ == "__main__":
  from cdeit_jax import cli

  flags.DEFINE_string("device", None, "the device's reference file (.mat or .npz)", required=True)
  flags.DEFINE_string("out", None, "the calibrated device (.npz)", required=True)
  flags.DEFINE_string("patterns", None, "the current patterns to keep, e.g. 0-15 (default: all)")
  flags.DEFINE_float("width_deg", None, "the electrodes' angular width if known (else fitted)")
  flags.DEFINE_float("electrode_cm", None, "the electrodes' width in cm (with --tank_cm)")
  flags.DEFINE_float("tank_cm", None, "the tank's diameter in cm (with --electrode_cm)")
  flags.DEFINE_float("contact_impedance", None, "the contact impedance if known (else fitted)")
  flags.DEFINE_float("first_deg", None, "electrode 0's angle from +x (default: the top)")
  flags.DEFINE_boolean(
    "clockwise", None, "electrodes numbered clockwise (default: UEF's keys yes, KTC's no)"
  )
  flags.DEFINE_boolean(
    "electrodes",
    True,
    "also fit each electrode's contact impedance, centre and width, and check them on held-out "
    "patterns (reported; the device keeps the global fit)",
  )
  cli.define_cache_flag()
  cli.run(main)
