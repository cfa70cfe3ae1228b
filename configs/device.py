"""A CDEIT for your own device (`make device-model DEVICE=ref.mat RUN=W`, docs/your_device.md):
the shipped 16-electrode model, `models/cdeit16`, fine-tuned on simulations of the device. The
argument is the calibrated device file that `python -m cdeit_jax.calibrate` writes (its
electrodes, patterns, electrode width, contact impedance and gain, fitted to the empty tank):

  python -m cdeit_jax.calibrate --device ref.mat --out W/device.npz
  python -m cdeit_jax.simulate --config configs/device.py:W/device.npz --out W/data \\
      --num_train 3000 --num_valid 64 --num_test 64 --tr_splits valid,test
  python train.py --config configs/device.py:W/device.npz --workdir W --config.data.path=W/data

The network reads the device's own linear reconstructions (the NOSER-weighted Tikhonov images of
its values, `config.model.cond="linear"`), which are images whatever the device, so it starts
from models/cdeit16's weights (its EIM channel's patch embedding dropped,
`checkpoints.loading.initial_params`); `FINE_TUNE_STEPS` steps of 16 then fit it to the device.
The targets stay the demo's (each object's log10 contrast): trained to draw objects at +-1 as
models/cdeit16 does, a fine-tuned skip-1 model scored RMSE 0.173 on UEF2017's tank against 0.151
(docs/your_device.md).
configs/device_scratch.py trains the same network from random weights for 5,000 steps instead.
The device's measuring system is drawn per example around its calibration: gain within 10 %,
contact impedances from a third to three times the fitted one, electrodes turned by up to a
degree and moved by half a degree each, their width within 10 % (5 % apart), the tank's radius
within 3 % and its background within 10 %, the noise 40 +- 5 dB. A width or contact impedance
that the empty tank does not determine (the calibration's range: above the electrodes' true
width, the contact impedance makes up for any width) is drawn across the whole range that fits,
within what the simulator takes.
"""

import dataclasses
import logging
import os

import numpy as np

from cdeit_jax import config_lib
from cdeit_jax.common.errors import InputError
from cdeit_jax.eit import layout, turns
from cdeit_jax.eit.device_files import RANGE_KEYS
from cdeit_jax.eit.spec import WIDTH_DEG_LIMITS, SystemSpec

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START = os.path.join(REPO, "models", "cdeit16")  # the shipped model every device starts from
FINE_TUNE_STEPS = 1500  # validation loss (lr 5e-4) 0.0357 / 0.0352 / 0.0350 at 500 / 1,000 / 1,500


def get_config(device: str | None = None):
  """The fine-tuning recipe (module docstring)."""
  c = _for_device(device)
  c.init_from = START
  c.steps = FINE_TUNE_STEPS
  # the demo's learning rate, a shorter warm-up: skip-1's best validation loss 0.0348 (lr 1e-3)
  # against 0.0350 (5e-4), its validation RMSE 0.1558 against 0.1566
  c.optimizer.update(lr=1e-3, warmup_steps=50)
  c.eval_every = 500
  return c


def _for_device(device: str | None = None):
  """configs/demo.py's network for the device, its measuring system drawn around the fit."""
  if not device:
    raise InputError(
      "configs/device.py needs the calibrated device: --config configs/device.py:DEVICE.npz "
      "(python -m cdeit_jax.calibrate --device ref.mat --out DEVICE.npz)"
    )
  try:
    with np.load(device, allow_pickle=False) as d:
      z, width = float(d["contact_impedance"]), float(d["width_deg"])
      ranges = {k: tuple(map(float, d[key])) for k, key in RANGE_KEYS.items() if key in d}
  except (OSError, KeyError, ValueError) as e:
    raise InputError(
      f"configs/device.py:{device}: not a calibrated device ({e}); make it with python -m "
      "cdeit_jax.calibrate --device ref.mat --out DEVICE.npz"
    ) from None
  c = config_lib.load(os.path.join(os.path.dirname(os.path.abspath(__file__)), "demo.py"))
  spread = SystemSpec(
    gain=(0.9, 1.1),
    contact_impedance=drawn(device, "contact_impedance", (z / 3, 3 * z), ranges, (1e-9, 1e9)),
    rotation_deg=1.0,
    jitter_deg=0.5,
    width_deg=drawn(device, "width_deg", (0.9 * width, 1.1 * width), ranges, WIDTH_DEG_LIMITS),
    width_jitter=0.05,
    passive=0.0,
    radius=(0.97, 1.03),
    background=(0.9, 1.1),
    snr_spread_db=5.0,
  )
  c.simulator.update(
    layout=os.path.abspath(device),
    removals="none",
    contact_impedance=z,
    system=dataclasses.asdict(spread),
  )
  c.model.cond = "linear"  # the Tikhonov images of the device's values (no EIM)
  # the values on current-carrying electrodes left out of those images: on UEF2017's real
  # frames RMSE 0.1513 -> 0.1489 (skip-1), 0.1484 -> 0.1485 (skip-3), where the simulations'
  # validation loss prefers them (0.0351 -> 0.0365, 0.0344 -> 0.0357): the simulator models
  # those values exactly, real electrodes do not (docs/your_device.md)
  c.model.current_carrying = "drop"
  # each sample drawn for the tank turned or mirrored another way, where the device has those
  # symmetries: validation RMSE 0.1558 -> 0.1541 (skip-1), 0.1544 -> 0.1524 (skip-3)
  c.sampling.symmetric = turns.has_symmetries(layout.from_device_file(device)[0])
  c.sampling.num_samples = 16  # valid RMSE 0.1558 / 0.1544 / 0.1541 with 8 / 16 / 32 (skip-3)
  return c


def drawn(device: str, name: str, around: tuple, ranges: dict, limits: tuple) -> tuple:
  """The range `name` is drawn from: `around` the calibrated value, widened to what the frame
  allows (the calibration's range), within what the simulator takes (`limits`; one log line
  when clipped)."""
  lo, hi = around
  if name in ranges:
    lo, hi = min(lo, ranges[name][0]), max(hi, ranges[name][1])
  out = (max(lo, limits[0]), min(hi, limits[1]))
  if out != (lo, hi):
    logging.getLogger("cdeit_jax").info(
      f"configs/device.py:{device}: {name} drawn from {out[0]:.4g} to {out[1]:.4g}, the "
      f"simulator's limits, instead of {lo:.4g} to {hi:.4g}"
    )
  return out
