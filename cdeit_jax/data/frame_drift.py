"""The background's drift between each target frame and its empty tank's, measured on cases with
truths (KTC2023's public levels): what `SystemSpec.drift` has to span.

  python -m cdeit_jax.frame_drift --data data/ktc2023/levels [--contrast 2]

Per case, the difference frame - reference in simulation units (over the gain that fits the
reference frame to the empty tank's simulated voltages F(1), least squares) is fitted as
a * F(truth) + (drift - 1) * F(1): F(truth) the simulator's difference voltages of the truth's
objects at conductivity 10^(+-contrast) times the water's (plastic and metal, far beyond it),
`drift` the target frame's voltages over the empty tank's at equal conductivities (a target
frame measured drift * (F(1) + F(truth)) gives exactly that fit, a = drift). Prints JSON per
case: the drift, a, and the relative residual with and without the drift's term.
"""

from __future__ import annotations

import numpy as np

from cdeit_jax.common.errors import InputError
from cdeit_jax.eit.phantom import IMAGE_SIZE


def label_of_truth(truth: np.ndarray, contrast: float) -> np.ndarray:
  """A challenge truth (256, 256; 0 water, 1 resistive, 2 conductive; row 0 at the top) as a
  label image on our grid (128, 128; row index growing with +y; `infer.ktc_score.
  to_challenge_grid` is its inverse): each 2 x 2 block's majority class (ties to water) at
  -contrast, 0, +contrast."""
  t = np.asarray(truth)[::-1]
  n = t.shape[0] // IMAGE_SIZE
  share = lambda k: (t == k).reshape(IMAGE_SIZE, n, IMAGE_SIZE, n).mean(axis=(1, 3))
  return np.where(share(2) > 0.5, contrast, np.where(share(1) > 0.5, -contrast, 0.0))


def fit(
  simulator, reference: np.ndarray, frame: np.ndarray, truth: np.ndarray, contrast: float
) -> dict[str, float]:
  """The drift of one case (module docstring): a dict of drift, a, the gain and the relative
  residuals with and without the drift's term, over the values both frames have."""
  import jax.numpy as jnp

  vh = np.asarray(simulator.vh, np.float64)
  ok = np.isfinite(reference) & np.isfinite(frame)
  gain = float(reference[ok] @ vh[ok] / (vh[ok] @ vh[ok]))
  d = ((frame - reference) / gain)[ok]
  xs = jnp.asarray(label_of_truth(truth, contrast), simulator.dtype)[None]
  y = np.asarray(simulator.image_voltages(xs), np.float64)[0][ok]
  if not np.isfinite(y).all():  # float32 solves break down at very large conductivity ratios
    raise InputError(
      f"--contrast {contrast:g}: the simulator's voltages of objects at 10^{contrast:g} times the "
      "water's conductivity are not finite; give a smaller contrast (2: plastic and metal, far "
      "beyond the water)"
    )
  both = np.stack([y, vh[ok]], 1)
  (a, b), *_ = np.linalg.lstsq(both, d, rcond=None)
  alone = d - y * (d @ y) / (y @ y)
  rel = lambda r: float(np.linalg.norm(r) / np.linalg.norm(d))
  return {
    "drift": round(1.0 + float(b), 5),
    "a": round(float(a), 4),
    "gain": round(gain, 3),
    "residual": round(rel(d - both @ np.array([a, b])), 4),
    "residual_without_drift": round(rel(alone), 4),
  }
