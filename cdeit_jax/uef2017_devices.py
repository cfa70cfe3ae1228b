"""The UEF2017 tank through the device path, protocol by protocol: where its gap to the
16-electrode path goes (docs/your_device.md, "The tank's adjacent protocol").

The tank's adjacent files (`data/uef2017/`) are difference frames, CDEIT's 208 values, without
the empty tank's frame that `make device-model` calibrates from. `adjacent` writes that protocol
as a device of its own: the 16 adjacent differences of each adjacent pattern (the 48 on
current-carrying electrodes NaN in every frame, as configs/device.py drops them), in the UEF2017
files' units, with the electrodes' width and contact impedance (and the ranges that fit as well)
of a calibration of the same tank under another protocol; and the 22 cases' frames with their
truths (`targets`), which eval.py scores as a recording (beside Tikhonov and the empty image).

  python -m cdeit_jax.calibrate --device data/uef2017_protocols/skip1/ref.mat --out W/skip1.npz
  python -m cdeit_jax.uef2017_devices adjacent --calibrated W/skip1.npz --out W/adjacent
  python -m cdeit_jax.simulate --config configs/device.py:W/adjacent/device.npz \\
      --out W/adjacent/data --num_train 3000 --num_valid 64 --num_test 64 --tr_splits valid,test
  python train.py --config configs/device.py:W/adjacent/device.npz --workdir W/adjacent \\
      --config.data.path=W/adjacent/data
  python eval.py --workdir W/adjacent --data recording --data_path W/adjacent/frames.npz \\
      --out W/adjacent/eval --config.eval.tikhonov=True
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import numpy as np

from cdeit_jax.checkpoints import shipped
from cdeit_jax.common import fileio
from cdeit_jax.common.errors import InputError
from cdeit_jax.eit import device_files, layout

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ADJACENT = os.path.join(REPO, "data", "uef2017")
NAMES = os.path.join(REPO, "data", "uef2017_protocols", "skip1", "names.txt")


def names() -> list[str]:
  """The 22 cases in the protocol folders' order (names.txt)."""
  with open(NAMES) as fh:
    return fh.read().split()


def truths() -> np.ndarray:
  """(22, 128, 128) the true images, in `names()`'s order."""
  return np.stack([np.load(os.path.join(ADJACENT, f"{n}.npz"))["xs"] for n in names()])


def adjacent_device(calibrated: str) -> tuple[layout.Layout, dict]:
  """(the tank's adjacent protocol with every adjacent difference (256 values) in the UEF2017
  files' units, the ranges) with the width and contact impedance of `calibrated`, a calibration
  of the same tank under another protocol."""
  try:
    with np.load(calibrated, allow_pickle=False) as d:
      width, z = float(d["width_deg"]), float(d["contact_impedance"])
      ranges = {
        k: tuple(map(float, d[key])) for k, key in device_files.RANGE_KEYS.items() if key in d
      }
  except (OSError, KeyError, ValueError) as e:
    raise InputError(
      f"--calibrated {calibrated}: not a calibrated device ({' '.join(str(e).split())[:120]}); "
      "make it with python -m cdeit_jax.calibrate --device ref.mat --out DEVICE.npz"
    ) from None
  uef = layout.preset("uef2017")  # CDEIT's geometry and the files' units
  full = layout.from_rules(16, measure_injecting=True, width_deg=width)
  assert np.array_equal(full.angles, uef.angles) and np.array_equal(full.currents, uef.currents)
  lay = dataclasses.replace(
    full,
    name="UEF2017 adjacent (every pair)",
    gain=uef.gain,
    current_ratio=uef.current_ratio,
    contact_impedance=z,
  )
  return lay, ranges


def adjacent_frames(lay: layout.Layout) -> np.ndarray:
  """(22, 256) the cases' difference frames in `lay`'s order: CDEIT's 208 `ys` where the pair
  touches no current-carrying electrode, NaN where it does."""
  uef = layout.preset("uef2017")
  where = {tuple(r): i for i, r in enumerate(lay.rows.tolist())}
  index = np.array([where[tuple(r)] for r in uef.rows.tolist()])
  out = np.full((len(names()), lay.num_values), np.nan)
  for i, n in enumerate(names()):
    out[i, index] = np.load(os.path.join(ADJACENT, f"{n}.npz"))["ys"][:, 0]
  return out


def cmd_adjacent(args) -> None:
  shipped.refuse_write(args.out, "--out")  # before any work: never into a shipped model's folder
  fileio.output_folder(args.out, "--out")
  lay, ranges = adjacent_device(args.calibrated)
  os.makedirs(args.out, exist_ok=True)
  device_files.save_device(os.path.join(args.out, "device.npz"), lay, ranges=ranges)
  frames = adjacent_frames(lay)

  def write(tmp):
    with open(tmp, "wb") as fh:
      np.savez(fh, frames=frames, targets=truths().astype(np.float32))

  fileio.atomic_write(os.path.join(args.out, "frames.npz"), write)
  print(json.dumps({"device": lay.describe(), "out": args.out, "frames": list(frames.shape)}))


def main() -> None:
  from cdeit_jax import cli

  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  sub = p.add_subparsers(dest="cmd", required=True)
  a = sub.add_parser("adjacent", help="the adjacent protocol as a device, and its frames")
  a.add_argument("--calibrated", required=True, help="the same tank calibrated (device.npz)")
  a.add_argument("--out", required=True, help="folder for device.npz and frames.npz")
  args = cli.parse_args(p)
  try:
    {"adjacent": cmd_adjacent}[args.cmd](args)
  except InputError as e:  # ours: one line; any other error keeps its traceback
    sys.exit(f"error: {e}")


if __name__ == "__main__":
  main()
