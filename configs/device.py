"""A CDEIT for your own device: the neutral recipe (`make device-model DEVICE=ref.mat RUN=W`,
docs/your_device.md). The argument is the calibrated device file that `python -m
cdeit_jax.calibrate` writes (its electrodes, patterns, electrode width, contact impedance and
gain, fitted to the empty tank):

  python -m cdeit_jax.calibrate --device ref.mat --out W/device.npz
  python -m cdeit_jax.simulate --config configs/device.py:W/device.npz --out W/data \\
      --num_train 3000 --num_valid 64 --num_test 64 --tr_splits valid,test
  python train.py --config configs/device.py:W/device.npz --workdir W --config.data.path=W/data

The demo's network, budget and phantoms (configs/demo.py), conditioned on the Tikhonov images of
the device's values (`config.model.cond="linear"`), trained on simulations of the device whose
measuring system is drawn per example around its calibration: gain within 10 %, contact
impedances from a third to three times the fitted one, electrodes turned by up to a degree and
moved by half a degree each, their width within 10 % (5 % apart), the tank's radius within 3 %
and its background within 10 %, the noise 40 +- 5 dB.
"""

import dataclasses
import os

import numpy as np

from cdeit_jax import config_lib
from cdeit_jax.common.errors import InputError
from cdeit_jax.eit.spec import SystemSpec


def get_config(device: str | None = None):
  if not device:
    raise InputError(
      "configs/device.py needs the calibrated device: --config configs/device.py:DEVICE.npz "
      "(python -m cdeit_jax.calibrate --device ref.mat --out DEVICE.npz)"
    )
  try:
    with np.load(device, allow_pickle=False) as d:
      z, width = float(d["contact_impedance"]), float(d["width_deg"])
  except (OSError, KeyError, ValueError) as e:
    raise InputError(
      f"configs/device.py:{device}: not a calibrated device ({e}); make it with python -m "
      "cdeit_jax.calibrate --device ref.mat --out DEVICE.npz"
    ) from None
  c = config_lib.load(os.path.join(os.path.dirname(os.path.abspath(__file__)), "demo.py"))
  spread = SystemSpec(
    gain=(0.9, 1.1),
    contact_impedance=(z / 3, 3 * z),
    rotation_deg=1.0,
    jitter_deg=0.5,
    width_deg=(0.9 * width, 1.1 * width),
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
  c.sampling.symmetric = False  # the tank's symmetries act on CDEIT's EIM only
  c.sampling.num_samples = 8
  return c
