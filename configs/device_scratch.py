"""A CDEIT for your own device, trained from random weights: configs/device.py's network, data and
measuring system without its start (models/cdeit16), with the demo's budget (5,000 steps of 16)
and optimizer. About 4 times as long as the fine-tuning; docs/your_device.md compares the two.

  make device-model DEVICE=ref.mat RUN=W DEVICE_CONFIG=configs/device_scratch.py
"""

import os

from cdeit_jax import config_lib

HERE = os.path.dirname(os.path.abspath(__file__))


def get_config(device: str | None = None):
  c = config_lib.load(os.path.join(HERE, "device.py") + (f":{device}" if device else ""))
  demo = config_lib.load(os.path.join(HERE, "demo.py"))
  c.init_from = ""
  c.steps, c.eval_every = demo.steps, demo.eval_every
  c.optimizer = demo.optimizer
  return c
