"""A foreign EIT system for robustness tests: one device that no training distribution centres on.

  python -m cdeit_jax.simulate --config configs/foreign.py --out FOREIGN --num_test 64
  python eval.py --workdir RUN --data simulated --data_path FOREIGN/test \
      --config.eval.tikhonov=True --config.sampling.num_samples=8

One fixed system (drawn once from `device_seed`): 32 electrodes of which 16 drive and measure
(the other 16 float in the gaps), 9-degree electrodes turned and moved by a few degrees, contact
impedances between 0.03 and 0.3 (above most of the training range), a tank 15 % smaller and a
background 10 % less conductive than the unit disk's, and a gain of 1.3: the voltages come out
about 1.4 times the nominal system's, with the same shapes. Its phantoms carry the real tanks'
labels (about +-1: metal and plastic), other seeds than the training data's, 35 dB noise.
"""

from cdeit_jax import config_lib


def get_config():
  c = config_lib.default_config()
  c.simulator.seed = 20231
  c.simulator.snr_db = 35.0
  c.simulator.system.update(
    gain=(1.3, 1.3),
    contact_impedance=(0.03, 0.3),
    rotation_deg=6.0,
    jitter_deg=2.0,
    width_deg=(9.0, 9.0),
    width_jitter=0.1,
    passive=1.0,
    radius=(0.85, 0.85),
    background=(0.9, 0.9),
    snr_spread_db=0.0,
    device_seed=7,
  )
  c.simulator.phantom.update(v_min=0.8, v_max=1.0)
  return c
