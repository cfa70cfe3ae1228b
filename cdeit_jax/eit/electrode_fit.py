"""Per-electrode calibration: each electrode's contact impedance, centre and width fitted to the
empty tank's frame around the global fit (`eit.calibration`), with each one's uncertainty and
whether the frame determines it (electrode fine-tuning: Darde, Hakula, Hyvonen and Staboulis,
Inverse Problems and Imaging 2012).

The parameters are the gain and, per electrode, log10 z, the centre's offset from the global
fit's and the log of its width over the global width. The fit minimises

  ||(u - gain v(z, centres, widths)) / s||^2 + ||(p - p0) / prior||^2

by Levenberg-Marquardt steps (the simulator's own homogeneous model and its forward-mode
Jacobian, `calibration.Homogeneous.electrodes`), with s the misfit per value taken as the noise
(the global fit's in a first round, then this fit's in a second) and a Gaussian prior around the
global fit (`PRIOR`). The one-sigma errors are the Laplace approximation's at the final misfit;
a parameter the frame determines is one whose error is below `DETERMINED` of
its prior's (else it stays the global value's range, as the global fit reports it).

A real tank's residual is the model's error more than noise, so a lower residual is no evidence
by itself: `held_out` scores each fold of the patterns with the fits to the others, for the
global fit and for this one.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from cdeit_jax.eit import calibration as cal
from cdeit_jax.eit.layout import Layout

# prior std around the global fit: log10 z (decades), centre (degrees), log width (a factor e^0.3)
PRIOR = {"log10_z": 1.0, "centre_deg": 2.0, "log_width": 0.3}
DETERMINED = 0.5  # a parameter the frame determines: its error below half its prior's std
ITERATIONS = 30  # Levenberg-Marquardt steps a round
ROUNDS = 2  # fits, each taking the misfit before it as the noise


@dataclasses.dataclass(frozen=True)
class ElectrodeFit:
  """The per-electrode fit of one frame (module docstring); arrays are (electrodes,)."""

  gain: float
  contact_impedance: np.ndarray
  centres_deg: np.ndarray
  widths_deg: np.ndarray
  errors: dict  # one sigma per electrode: "log10_z", "centre_deg", "width_deg"
  determined: dict  # bool per electrode, same keys
  residual_before: float  # the global fit's relative residual over the present values
  residual: float  # this fit's

  def describe(self, held: dict | None = None) -> str:
    """One line: the residual before and after, in the frame and on held-out patterns (`held`,
    `held_out`'s), and the parameters the frame determines; none when the held-out patterns
    fit worse (then the errors are the frame's alone, the misfit taken for noise)."""
    n = len(self.centres_deg)
    line = f"per electrode: relative residual {self.residual_before:.4f} -> {self.residual:.4f}"
    worse = held is not None and held["per_electrode"] >= held["global"]
    if held is not None:
      line += (
        f" in the frame, {held['global']:.4f} -> {held['per_electrode']:.4f} on held-out "
        "patterns (each quarter of them fitted without it)"
      )
    said = []
    for key, what, fmt in (
      ("centre_deg", "centres", lambda e: f"+- {e:.2g} degrees"),
      ("width_deg", "widths", lambda e: f"+- {e:.2g} degrees"),
      ("log10_z", "contact impedances", lambda e: f"x/ 10^{e:.2g}"),
    ):
      d = self.determined[key]
      if worse:
        said.append(f"{what} {fmt(float(np.median(self.errors[key])))}")
      else:
        said.append(
          f"{what} of {int(d.sum())} of {n} electrodes"
          + (f" ({fmt(float(np.median(self.errors[key][d])))})" if d.any() else "")
        )
    if worse:
      return (
        f"{line}: the frame does not determine the electrodes' own values (their errors from the "
        f"frame alone: {', '.join(said)})"
      )
    return f"{line}; the frame determines the {', '.join(said)}"

  def as_dict(self) -> dict:
    """The JSON record."""
    lists = lambda d: {k: np.asarray(v).tolist() for k, v in d.items()}
    return {
      "gain": self.gain,
      "contact_impedance": self.contact_impedance.tolist(),
      "centres_deg": self.centres_deg.tolist(),
      "widths_deg": self.widths_deg.tolist(),
      "errors": lists(self.errors),
      "determined": lists(self.determined),
      "residual_before": self.residual_before,
      "residual": self.residual,
    }


def fit(
  layout: Layout, reference: np.ndarray, global_fit: cal.Calibration, prior_std: dict | None = None
) -> ElectrodeFit:
  """Each electrode's contact impedance, centre and width fitted to `reference` (R,), NaN where
  missing, around `global_fit` (module docstring); `prior_std`: `PRIOR`'s keys (0: held)."""
  ps = {**PRIOR, **(prior_std or {})}
  u, present = cal._frame(layout, reference, "the reference frame")
  model = cal.homogeneous_model(layout)
  e = layout.num_electrodes
  z0, w0 = np.log10(global_fit.contact_impedance), np.deg2rad(global_fit.width_deg)
  c0 = np.asarray(layout.angles, np.float64)
  prior = np.concatenate(
    [
      [10.0],  # log gain: free
      np.full(e, max(ps["log10_z"], 1e-9)),
      np.full(e, max(np.deg2rad(ps["centre_deg"]), 1e-9)),
      np.full(e, max(ps["log_width"], 1e-9)),
    ]
  )
  p0 = np.concatenate([[np.log(global_fit.gain)], np.full(e, z0), np.zeros(e), np.zeros(e)])

  def unpack(p):
    return p[0], p[1 : e + 1], c0 + p[e + 1 : 2 * e + 1], w0 * np.exp(p[2 * e + 1 :])

  def values_and_jacobian(p):
    log_g, z, c, w = unpack(p)
    with jax.enable_x64(True):
      v = np.asarray(model.electrodes(z, c, w), np.float64)[present]
      jz, jc, jw = (np.asarray(j, np.float64)[present] for j in model.electrodes_jacobian(z, c, w))
    g = np.exp(log_g)
    jac = np.concatenate([(g * v)[:, None], g * jz, g * jc, g * jw * w[None, :]], axis=1)
    return g * v, jac

  def cost(p, f, sigma):
    return float(np.sum(((f - u) / sigma) ** 2) + np.sum(((p - p0) / prior) ** 2))

  p, (f, jac) = p0.copy(), values_and_jacobian(p0)
  for _ in range(ROUNDS):  # the misfit taken as the noise: the global fit's, then this fit's
    sigma = max(np.linalg.norm(u - f), 1e-9 * np.linalg.norm(u)) / np.sqrt(len(u))
    damping = 1e-3
    for _ in range(ITERATIONS):
      h = jac.T @ jac / sigma**2 + np.diag(1.0 / prior**2)
      grad = jac.T @ (f - u) / sigma**2 + (p - p0) / prior**2
      step = np.linalg.solve(h + damping * np.diag(np.diag(h)), -grad)
      trial = p + step
      f_t, jac_t = values_and_jacobian(trial)
      if cost(trial, f_t, sigma) < cost(p, f, sigma):
        p, f, jac, damping = trial, f_t, jac_t, damping / 3
        if np.max(np.abs(step) / prior) < 1e-4:
          break
      else:
        damping *= 10
  sigma = max(np.linalg.norm(u - f), 1e-9 * np.linalg.norm(u)) / np.sqrt(len(u))
  h = jac.T @ jac / sigma**2 + np.diag(1.0 / prior**2)
  err = np.sqrt(np.diag(np.linalg.inv(h)))
  log_g, z, c, w = unpack(p)
  parts = {
    "log10_z": err[1 : e + 1],
    "centre_deg": np.rad2deg(err[e + 1 : 2 * e + 1]),
    "width_deg": np.rad2deg(w * err[2 * e + 1 :]),
  }
  priors = {
    "log10_z": prior[1 : e + 1],
    "centre_deg": np.rad2deg(prior[e + 1 : 2 * e + 1]),
    "width_deg": np.rad2deg(w * prior[2 * e + 1 :]),
  }
  return ElectrodeFit(
    gain=float(np.exp(log_g)),
    contact_impedance=10.0**z,
    centres_deg=np.rad2deg(c),
    widths_deg=np.rad2deg(w),
    errors=parts,
    determined={k: parts[k] < DETERMINED * priors[k] for k in parts},
    residual_before=global_fit.residual,
    residual=float(np.linalg.norm(u - f) / np.linalg.norm(u)),
  )


def held_out(
  layout: Layout,
  reference: np.ndarray,
  global_fit: cal.Calibration,
  folds: int = 4,
  prior_std: dict | None = None,
) -> dict:
  """{"global": ..., "per_electrode": ...}: the relative residual on held-out patterns, each
  fold's patterns (pattern % folds) scored by the fits to the others (the squared residuals of
  every fold pooled): the global fit's width and contact impedance with the gain refitted, and
  this fit around them."""
  model = cal.homogeneous_model(layout)
  with jax.enable_x64(True):
    v = np.asarray(
      model(global_fit.contact_impedance, np.deg2rad(global_fit.width_deg)), np.float64
    )
  pattern = layout.rows[:, 0]
  out = {"global": 0.0, "per_electrode": 0.0}
  total = 0.0
  for k in range(folds):
    test = (pattern % folds == k) & np.isfinite(reference)
    train = ~(pattern % folds == k) & np.isfinite(reference)
    if not test.any() or not train.any():
      continue
    gain = float(v[train] @ reference[train] / (v[train] @ v[train]))
    res = float(
      np.linalg.norm(reference[train] - gain * v[train]) / np.linalg.norm(reference[train])
    )
    g = dataclasses.replace(global_fit, gain=gain, residual=res)
    f = fit(layout, np.where(train, reference, np.nan), g, prior_std)
    with jax.enable_x64(True):
      ve = np.asarray(
        model.electrodes(
          np.log10(f.contact_impedance), np.deg2rad(f.centres_deg), np.deg2rad(f.widths_deg)
        ),
        np.float64,
      )
    out["global"] += float(np.sum((reference[test] - gain * v[test]) ** 2))
    out["per_electrode"] += float(np.sum((reference[test] - f.gain * ve[test]) ** 2))
    total += float(np.sum(reference[test] ** 2))
  return {k: float(np.sqrt(v / total)) for k, v in out.items()}
