"""A model for a device of another protocol on the same electrodes as a trained model's: the model
reads the device's frames translated into its own measuring system's (`eit.translation`).

  python -m cdeit_jax.translate --device runs/mydevice/device.npz --model models/cdeit16 \\
      --out runs/mydevice

DEVICE is a calibrated device file (`python -m cdeit_jax.calibrate`: its frames' units are its
fitted gain). When its electrodes are MODEL's (the same count at the same places, e.g. UEF2017's
tank under skip-k currents and CDEIT's 16 electrodes), OUT becomes a run: MODEL, copied whole into
OUT/model, and `translation.npz` (the device), which `reconstruct --workdir OUT` and
`Reconstructor.from_workdir(OUT)` read: each frame, in the device's units, minus its reference,
is translated into MODEL's values and imaged by MODEL. Otherwise it exits with status 3, saying
why, and writes nothing (`make device-model` then fine-tunes a model for the device). No
training and no simulation: about 10 s on 2 CPU cores.
"""

from __future__ import annotations

import os
import shutil
import sys

from absl import flags

FLAGS = flags.FLAGS
NOT_TRANSLATABLE = 3  # the exit status when the device's electrodes are not the model's


def main(argv: list[str]) -> None:
  del argv
  translate(FLAGS.device, FLAGS.model, FLAGS.out)


def translate(device_file: str, model_folder: str, out: str) -> None:
  """OUT made a run that reads `device_file`'s frames with `model_folder`'s model (module
  docstring); exits NOT_TRANSLATABLE, writing nothing, when their electrodes differ."""
  from cdeit_jax.checkpoints import checkpoint, loading, reader, shipped
  from cdeit_jax.common import fileio, logs
  from cdeit_jax.common.errors import InputError
  from cdeit_jax.eit import layout, translation
  from cdeit_jax.infer import run_opening

  logs.console()
  shipped.refuse_write(out, "--out")
  fileio.output_folder(out, "--out")
  device, _ = layout.from_device_file(device_file)
  if device.contact_impedance is None:
    calibrated = os.path.join(out, "device.npz")
    raise InputError(
      f"--device {device_file}: not a calibrated device (no gain or contact impedance); "
      f"calibrate it first (python -m cdeit_jax.calibrate --device {device_file} --out "
      f"{calibrated}) and give --device {calibrated}; make device-model DEVICE={device_file} "
      f"RUN={out} does both"
    )
  with reader.open_run(model_folder) as run:
    meta, _, cfg = run_opening.choose(run, {})
    system = loading.resolve(cfg, meta.record)
  order = translation.electrode_order(device, system.device)
  if order is None:
    print(
      f"{device.describe()} has not the electrodes of {model_folder}'s system "
      f"({system.device.describe()}): no translation; a model is trained for it instead",
      file=sys.stderr,
    )
    sys.exit(NOT_TRANSLATABLE)
  target = os.path.join(out, run_opening.TRANSLATION_FILE)
  if os.path.exists(os.path.join(out, checkpoint.CHECKPOINTS)):
    raise InputError(
      f"--out {out} holds a trained run's checkpoints; give a new folder for the translated model"
    )
  for name, what, kind in (  # what a rerun replaces must be what this command made
    (run_opening.MODEL_FOLDER, "folder", os.path.isdir),
    (run_opening.TRANSLATION_FILE, "file", os.path.isfile),
  ):
    there = os.path.join(out, name)
    if os.path.islink(there) or (os.path.lexists(there) and not kind(there)):
      raise InputError(
        f"--out {out}: {name} there is not the {what} a translated run keeps; move it "
        "away or give another --out"
      )
  tr = translation.Translator.between(device, system.device)
  determined = tr.determined()
  # the model copied whole (its manifest too: every command checks a shipped model's files)
  # before the translation is written: a folder with a translation.npz has its model
  model = os.path.join(out, run_opening.MODEL_FOLDER)
  fileio.makedirs(out)
  staged = model + ".partial"
  shutil.rmtree(staged, ignore_errors=True)
  shutil.copytree(model_folder, staged)
  old = model + ".old"  # a rerun's model set aside, removed once the new one is in place
  shutil.rmtree(old, ignore_errors=True)
  if os.path.exists(model):
    os.replace(model, old)
  os.replace(staged, model)
  shutil.rmtree(old, ignore_errors=True)
  # the calibrated device file itself, as it was read (any patterns and pairs it holds)
  fileio.atomic_write(target, lambda tmp: shutil.copyfile(device_file, tmp))
  logs.log.info(
    f"{device.describe()} translated into {system.device.describe()} through the tank's "
    f"transfer matrix: the device's values determine {determined:.2%} of the target values' "
    f"prior variance (noise {tr.noise_db:g} dB); {out} reads the device's frames with "
    f"{model_folder}'s model"
  )
  print(f"translated model: {out} (then: python -m cdeit_jax.reconstruct --workdir {out})")


if __name__ == "__main__":
  from cdeit_jax import cli

  flags.DEFINE_string("device", None, "the calibrated device (python -m cdeit_jax.calibrate)")
  flags.DEFINE_string("model", "models/cdeit16", "the model whose system the frames become")
  flags.DEFINE_string("out", None, "the run folder to write (make device-model's RUN)")
  flags.mark_flags_as_required(["device", "out"])
  cli.run(main)
