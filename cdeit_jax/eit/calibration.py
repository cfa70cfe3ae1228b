"""Calibration of a measuring system from its reference (empty-tank) frame: what the simulator
must match to speak the device's units.

In 2-D the voltages of a homogeneous tank depend on the background conductivity s, the contact
impedance z and the tank radius R only through the gain 1/s and z s / R (docs/reference/
eit-conventions.md), so the reference frame fixes two numbers: the gain (measured / simulated
volts, the simulator at sigma = 1 and its nominal current) and the contact impedance in the
simulator's units. The gain is the least-squares fit in closed form for each z; z minimises the
remaining relative residual over the frame's present values, a bounded search over log10 z with
the simulator's own forward model (the same CEM that makes the training data). Where the
residual hardly changes with z (small z: the electrodes then short their boundary), z is not
identifiable and the fit says so.

Besides the best fit, the fit reports the range of each free value that fits as well
(`Calibration.ranges`): the points of a profile (z at its best for each width, or z alone)
whose squared residual exceeds the best one's by at most the best one's own (`MISFIT`). A real
tank's residual (UEF2017's 1.4 %, KTC2023's 7.7 %) is the model's own error, far above its
noise and shared by every pattern (held-out patterns' residual differs by 40 % between halves of
the patterns, and falls by 2 % along the whole valley in each), so a change of the fit below it
is no evidence. Above the electrodes' true width the contact impedance makes up for any width
(the valley), so a frame fixes only the narrowest width: a range that reaches the search's
bound is never "identifiable", and the nominal value of an unidentified width is the middle of
its range. `configs/device.py` trains across the ranges (the randomised system).

A frame that cannot be the empty tank of this system is refused in one line (`check`): a gain
that is not positive (the frame's sign is flipped: a reversed measurement or current pattern),
a relative residual beyond `MAX_RESIDUAL` (not the empty tank's pattern: noise, a constant, a
target's frame, another device's), a gain beyond `GAIN_RANGE` (no unit of volts gives it), no
non-zero value, or a current pattern whose values are one constant (`_frame`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from cdeit_jax.common.errors import InputError
from cdeit_jax.eit.fem import CEM
from cdeit_jax.eit.layout import CURRENT, Layout, spacing
from cdeit_jax.eit.mesh import make_mesh, spec_for
from cdeit_jax.eit.system import DrawnSystem

WIDTH_RANGE = (0.05, 0.9)  # the electrode widths searched, as fractions of the spacing
PROFILE_POINTS = 41  # widths of the profile over the width (a fit of z at each)
BISECTIONS = 6  # the ranges' ends between the profile's points, to 1/64 of its step
LOG10_Z = (-4.0, 0.0)  # the contact impedances searched (simulator units; below 1e-4 the
# electrodes short their boundary already, and float32 solves lose digits)
# The largest relative residual of a reference frame accepted as the empty tank: real tanks fit
# to 0.014-0.098 (KTC2023's ref.mat 0.077; UEF2017's skip-2 tank 0.098 with too narrow
# electrodes, 0.014 with its own), damaged frames not below 0.99 (noise, a constant).
MAX_RESIDUAL = 0.3
# Measured / simulated volts of any real device: the simulator's volts at 1 mA and unit
# conductivity against a device's volts, millivolts or microvolts (KTC2023 1978, UEF2017 1041).
GAIN_RANGE = (1e-6, 1e12)
# Points of a profile whose squared residual is within (1 + MISFIT) of the best one's fit as
# well: a change of the fit below the model's own misfit is no evidence (module docstring).
MISFIT = 1.0
MAX_WIDTH_SPREAD = 0.2  # an identified width: half its range at most this fraction of it
MAX_LOG10_Z_SPREAD = 0.25  # an identified contact impedance: half its range in decades


@dataclasses.dataclass(frozen=True)
class Calibration:
  """The fit of one reference frame (module docstring)."""

  gain: float  # measured / simulated volts
  contact_impedance: float  # simulator units (z s / R)
  residual: float  # ||u - gain v|| / ||u|| over the present values
  values: int  # values fitted
  # per fitted value ("contact_impedance", "width_deg"): whether the frame determines it
  identifiable: dict = dataclasses.field(default_factory=dict)
  width_deg: float | None = None  # the electrodes' angular width (fitted, given or the layout's)
  errors: dict = dataclasses.field(default_factory=dict)  # one sigma: gain, log10_z, width_deg
  # per fitted value: (low, high), the values that fit as well as the best (module docstring)
  ranges: dict = dataclasses.field(default_factory=dict)

  def check(self, what: str, misfit: str = "") -> Calibration:
    """Itself, or an InputError naming `what` when the fit cannot be the empty tank's (module
    docstring); `misfit`: where the residual lies, when that points at a cause."""
    where = f"{what}: {self.describe()}"
    if not self.residual <= MAX_RESIDUAL:
      raise InputError(
        f"{where}: a residual beyond {MAX_RESIDUAL} means the frame is not the empty tank's "
        "pattern of this system (noise, a constant, a target's frame, another device's, or a "
        f"bad or disconnected electrode){'; ' + misfit if misfit else ''}; give the empty "
        "tank's frame"
      )
    if not (np.isfinite(self.gain) and self.gain > 0):
      raise InputError(
        f"{where}: the gain is not positive, so the frame's sign is flipped (a reversed "
        "measurement or current pattern, or a negated frame); give the empty tank's frame as "
        "the device measures it"
      )
    if not GAIN_RANGE[0] <= self.gain <= GAIN_RANGE[1]:
      raise InputError(
        f"{where}: outside {GAIN_RANGE[0]:g}..{GAIN_RANGE[1]:g} measured per simulated volt, "
        "which no unit of volts gives; give the frame in the device's volts"
      )
    return self

  def describe(self) -> str:
    e = self.errors
    gain = f"{self.gain:.6g}" + (f" +- {e['gain']:.3g}" if "gain" in e else "")
    z = f"{self.contact_impedance:.3g}" + self._unknown("contact_impedance", lambda v: f"{v:.2g}")
    if "contact_impedance" not in self.identifiable:
      z += " (given)"
    elif self.identifiable["contact_impedance"] and "log10_z" in e:
      z += f" (x/ 10^{e['log10_z']:.2f})"
    width = ""
    if self.width_deg is not None:
      width = f", electrode width {self.width_deg:.4g}"
      if self.identifiable.get("width_deg") and "width_deg" in e:
        width += f" +- {e['width_deg']:.2g}"
      width += " degrees" + self._unknown("width_deg", lambda v: f"{v:.3g}")
    return (
      f"gain {gain} (measured / simulated volts), contact impedance {z}{width}, relative "
      f"residual {self.residual:.4f} over {self.values} values"
    )

  def _unknown(self, name: str, fmt) -> str:
    """' (not identifiable: LOW-HIGH fit as well)' for a value the frame does not determine."""
    if name not in self.identifiable or self.identifiable[name]:
      return ""
    lo, hi = self.ranges[name]
    return f" (not identifiable: {fmt(lo)} to {fmt(hi)} fit as well)"

  @property
  def undetermined(self) -> list[str]:
    """The fitted values the frame does not determine."""
    return [k for k, ok in self.identifiable.items() if not ok]


class Homogeneous:
  """The simulator's homogeneous (sigma = 1) values (R,) of `layout` in float64 for any contact
  impedance and electrode width: one compiled solve of the layout's electrodes placed on its
  mesh's boundary (`fem.CEM` with a drawn system), the interior condensed away once."""

  def __init__(self, layout: Layout, current: float = CURRENT):
    mesh = make_mesh(spec_for(layout))
    centroid = mesh.nodes[mesh.triangles].mean(1)
    support = np.zeros(mesh.num_elements, bool)
    support[np.argmin(np.hypot(*centroid.T))] = True  # sigma = 1 everywhere: one element left
    self.layout = layout
    self.spacing = spacing(layout.angles)
    with jax.enable_x64(True):
      cem = CEM(mesh, 1.0, current, dtype=jnp.float64, support=support, layout=layout)
      drawn = cem.drawn(False)
      ones = jnp.ones(mesh.num_elements, jnp.float64)
      angles = jnp.asarray(layout.angles, jnp.float64)

      def each(log10_z, centres, widths):  # per electrode (E,) each
        system = DrawnSystem(
          centres=centres,
          half_widths=widths / 2,
          weights=10.0**-log10_z,
          gain=jnp.ones(()),
          snr_offset_db=jnp.zeros(()),
          drift=jnp.ones(()),
        )
        return layout.measure(drawn.electrode_potentials(ones, system))

      e = layout.num_electrodes
      self._values = jax.jit(lambda z, w: each(jnp.full(e, z), angles, jnp.full(e, w)))
      self.electrodes = jax.jit(each)  # `eit.electrode_fit`: each electrode its own
      self.electrodes_jacobian = jax.jit(jax.jacfwd(each, argnums=(0, 1, 2)))

  def __call__(self, contact_impedance: float, width: float | None = None) -> np.ndarray:
    """Values (R,) at contact impedance z and electrode width (radians; default the layout's)."""
    w = self.layout.width if width is None else width
    with jax.enable_x64(True):
      return np.asarray(self._values(np.log10(contact_impedance), w), np.float64)


_homogeneous: dict = {}


def homogeneous_model(layout: Layout, current: float = CURRENT) -> Homogeneous:
  """`Homogeneous` of a layout, kept for the last two layouts (a fit tries hundreds of systems)."""
  key = (layout.signature, layout.currents.tobytes(), current)
  if key not in _homogeneous:
    while len(_homogeneous) >= 2:
      _homogeneous.pop(next(iter(_homogeneous)))
    _homogeneous[key] = Homogeneous(layout, current)
  return _homogeneous[key]


def homogeneous(layout: Layout, contact_impedance: float, current: float = CURRENT) -> np.ndarray:
  """The simulator's homogeneous (sigma = 1) values (R,) of `layout`, in float64."""
  return homogeneous_model(layout, current)(contact_impedance)


def fit(
  layout: Layout,
  reference: np.ndarray,
  what: str = "the reference frame",
  *,
  width: bool = False,
  contact_impedance: float | None = None,
  width_deg: float | None = None,
) -> Calibration:
  """Fit gain and contact impedance (unless `contact_impedance` is given) and, with `width`, the
  electrodes' width (unless `width_deg` is given; else the layout's) to `reference` (R,), NaN
  where a value is missing, each fitted value with the range that fits as well; a frame that
  cannot be this system's empty tank is an InputError naming `what` (`Calibration.check`)."""
  from scipy.optimize import minimize_scalar

  u, present = _frame(layout, reference, what)
  model = homogeneous_model(layout)
  widths = tuple(model.spacing * f for f in WIDTH_RANGE)
  for name, value, ok, why in (
    ("contact_impedance", contact_impedance, lambda v: v > 0, "it must be above 0"),
    (
      "width_deg",
      width_deg,
      lambda v: widths[0] <= np.deg2rad(v) <= widths[1],
      f"a width must lie within {np.rad2deg(widths[0]):.3g} to {np.rad2deg(widths[1]):.4g} "
      "degrees, the gaps between electrodes",
    ),
  ):
    if value is not None and not (np.isfinite(value) and ok(value)):
      raise InputError(f"{what}: {name}={value!r} cannot be ({why})")
  fixed_w = np.deg2rad(width_deg) if width_deg is not None else (None if width else layout.width)
  free_z = contact_impedance is None

  def gain_residual(log10_z: float, w: float) -> tuple[float, float, np.ndarray]:
    v = model(10.0**log10_z, w)[present]
    g = float(v @ u / (v @ v))
    return g, float(np.linalg.norm(u - g * v) / np.linalg.norm(u)), v

  res = lambda x, w: gain_residual(x, w)[1]
  best_z = lambda w: _best_log10_z(res, w)
  profile, at = [], None  # (residual, log10 z, width) of the points that say what else fits
  if fixed_w is not None:  # z alone (or nothing)
    w = fixed_w
    if free_z:
      log10_z = best_z(w)
      at = lambda x: (res(x, w), float(x), w)
      profile = [at(x) for x in np.linspace(*LOG10_Z, PROFILE_POINTS)]
    else:
      log10_z = float(np.log10(contact_impedance))
  elif not free_z:  # the width alone
    log10_z = float(np.log10(contact_impedance))
    best = minimize_scalar(
      lambda w: res(log10_z, w), bounds=widths, method="bounded", options={"xatol": 1e-4}
    )
    w = float(best.x)
    at = lambda wk: (res(log10_z, wk), log10_z, wk)
    profile = [at(wk) for wk in np.linspace(*widths, PROFILE_POINTS)]
  else:  # both
    log10_z, w, profile = _z_and_width(gain_residual, u, widths)
    at = lambda wk: (lambda x: (res(x, wk), x, wk))(_best_log10_z(res, wk))
  residual = res(log10_z, w)
  free = {"contact_impedance": free_z, "width_deg": fixed_w is None}
  ranges, identifiable = _ranges(profile, at, residual, log10_z, w, free, widths)
  if free["width_deg"] and not identifiable["width_deg"]:  # the middle of what fits
    w = float(np.deg2rad(np.mean(ranges["width_deg"])))
    log10_z = best_z(w) if free_z else log10_z
  gain, residual, v = gain_residual(log10_z, w)
  names = [k for k, on in (("log10_z", free_z), ("width", fixed_w is None)) if on]
  errors = _errors(model, u, v, gain, present, log10_z, w, names)
  for name, key, to in (
    ("width_deg", "width_deg", float),
    ("contact_impedance", "log10_z", np.log10),
  ):
    if name in ranges:  # the range's half-width: where it is wider than the local estimate,
      # and always for a value the frame does not determine (the local one sees a flat valley)
      half = float(np.ptp([to(x) for x in ranges[name]])) / 2
      errors[key] = max(errors.get(key, 0.0), half) if identifiable[name] else half
  fit = Calibration(
    gain,
    10.0**log10_z,
    residual,
    int(present.sum()),
    identifiable,
    float(np.rad2deg(w)),
    errors,
    ranges,
  )
  misfit = "" if residual <= MAX_RESIDUAL else _misfit(layout, present, u - gain * v)
  return fit.check(what, misfit)


def _misfit(layout: Layout, present: np.ndarray, r: np.ndarray) -> str:
  """Where a bad fit's residual `r` (the present values') lies, in words: the electrode whose
  values (measured on it, or driven through it) hold several times their share of it (a
  disconnected or bad electrode: measure without it, its values NaN), and the worst values."""
  rows = layout.rows[present]
  drives = layout.currents[:, rows[:, 0]] != 0  # (E, values): the pattern drives electrode e
  on = (
    drives
    | (np.arange(layout.num_electrodes)[:, None] == rows[:, 1])
    | (np.arange(layout.num_electrodes)[:, None] == rows[:, 2])
  )
  share = (on * r**2).sum(1) / max(float(r @ r), 1e-300)  # of the misfit, per electrode
  fair = on.mean(1)  # of the values, per electrode
  worst = np.flatnonzero(present)[np.argsort(-np.abs(r))[:5]]
  note = f"the worst-fitting values are {', '.join(map(str, sorted(worst.tolist())))}"
  e = int(np.argmax(share / np.maximum(fair, 1e-12)))
  if share[e] >= 2 * fair[e] and share[e] >= 0.5:
    note = (
      f"electrode {e}'s values ({int(on[e].sum())} of {len(r)}) hold {share[e]:.0%} of the "
      f"misfit: is it disconnected or bad? (give its values as NaN to calibrate without it); "
      + note
    )
  return note


def _best_log10_z(res, w: float) -> float:
  """log10 z of the least residual at width `w` (a bounded search, or the range's better end)."""
  from scipy.optimize import minimize_scalar

  ends = [res(x, w) for x in LOG10_Z]
  best = minimize_scalar(
    lambda x: res(x, w), bounds=LOG10_Z, method="bounded", options={"xatol": 0.005}
  )
  return float(best.x) if best.fun <= min(ends) else LOG10_Z[int(np.argmin(ends))]


def _ranges(
  profile: list, at, residual: float, log10_z: float, w: float, free: dict, widths: tuple
) -> tuple[dict, dict]:
  """({value: (low, high)}, {value: identifiable}) of the free values: the profile's points
  that fit as well as the best (`MISFIT`) and the best itself. A range that reaches the search's
  bound, or is wide (`MAX_WIDTH_SPREAD`, `MAX_LOG10_Z_SPREAD`), is not identifiable."""
  floor = (1.0 + MISFIT) * residual**2
  xs, ws = np.asarray(_near(profile, at, floor) + [(log10_z, w)]).T
  ranges, identifiable = {}, {}
  if free["contact_impedance"]:
    lo, hi = float(xs.min()), float(xs.max())
    ranges["contact_impedance"] = (10.0**lo, 10.0**hi)
    identifiable["contact_impedance"] = bool(
      lo > LOG10_Z[0] + 0.01 and hi < LOG10_Z[1] - 0.01 and (hi - lo) / 2 <= MAX_LOG10_Z_SPREAD
    )
  if free["width_deg"]:
    step = (widths[1] - widths[0]) / (PROFILE_POINTS - 1)
    lo, hi = float(ws.min()), float(ws.max())
    ranges["width_deg"] = (float(np.rad2deg(lo)), float(np.rad2deg(hi)))
    identifiable["width_deg"] = bool(
      lo > widths[0] + step / 2
      and hi < widths[1] - step / 2
      and (hi - lo) / 2 <= MAX_WIDTH_SPREAD * w
    )
  return ranges, identifiable


def _frame(layout: Layout, reference: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
  """The reference's present values (float64) and the present mask; an InputError naming `what`
  for infinities, fewer than 2 values or an all-zero frame."""
  u = np.asarray(reference, np.float64).reshape(-1)
  present = layout.present(u)
  if np.isinf(u).any():
    raise InputError(
      f"{what}: infinite values at {np.flatnonzero(np.isinf(u))[:10].tolist()}; a missing "
      "value is NaN"
    )
  if present.sum() < 2:
    raise InputError(f"{what}: fewer than 2 finite values; give the empty tank's measurement")
  u = u[present]
  if not np.any(u != 0):
    raise InputError(f"{what}: every value is zero; give the empty tank's measurement")
  patterns = layout.rows[present, 0]
  for k in np.unique(patterns):  # an empty tank's values vary along every pattern's electrodes
    values = u[patterns == k]
    if len(values) >= 3 and np.all(values == values[0]):
      raise InputError(
        f"{what}: current pattern {int(k)}'s {len(values)} values are all {values[0]:g}, which no "
        "empty tank measures (a stuck or unconnected channel, a placeholder); give the frame as "
        "the device measured it, or those values as NaN (missing) to calibrate without them"
      )
  return u, present


def _z_and_width(gain_residual, u: np.ndarray, widths: tuple) -> tuple[float, float, list]:
  """log10 z, the width and the profile when both are free. They trade off along a curved valley,
  rippled where the electrodes' edges cross the mesh's boundary nodes, so a local search stops in
  the nearest ripple (a noise-free 10-degree device fitted at 12.4). The profile over the width
  (z at its best for each) finds the valley's lowest part, least squares then polishes it, and
  the profile says which widths fit as well (`_ranges`)."""
  from scipy.optimize import least_squares, minimize_scalar

  res = lambda x, w: gain_residual(x, w)[1]
  profile = []
  for wk in np.linspace(*widths, PROFILE_POINTS):
    b = minimize_scalar(
      lambda x, wk=wk: res(x, wk), bounds=LOG10_Z, method="bounded", options={"xatol": 0.01}
    )
    profile.append((float(b.fun), float(b.x), float(wk)))
  start = min(profile)[1:]
  scale = np.linalg.norm(u)

  def residuals(p):
    g, _, v = gain_residual(*p)
    return (u - g * v) / scale

  best = least_squares(
    residuals, np.asarray(start), bounds=tuple(zip(LOG10_Z, widths)), x_scale=(1.0, 0.01)
  )
  log10_z, w = (float(v) for v in best.x)
  if res(log10_z, w) > min(profile)[0]:  # polishing cannot lose what the profile found
    log10_z, w = start
  return log10_z, w, profile


def _near(profile: list, at, floor: float) -> list[tuple[float, float]]:
  """(log10 z, width) of the profile's points whose squared residual is at most `floor`, and
  where the profile crosses `floor` between a point within and its neighbour without (bisected
  on `at`, the profile's point at a coordinate: the range's ends between the grid's points)."""
  if not profile:
    return []
  axis = 2 if np.ptp([p[2] for p in profile]) > 0 else 1  # the coordinate the profile varies
  pts = sorted(profile, key=lambda p: p[axis])
  inside = [p[0] ** 2 <= floor for p in pts]
  out = [(p[1], p[2]) for p, ok in zip(pts, inside) if ok]
  for i in range(len(pts) - 1):
    if inside[i] != inside[i + 1]:
      a, b = (pts[i], pts[i + 1]) if inside[i] else (pts[i + 1], pts[i])  # within, without
      for _ in range(BISECTIONS):
        mid = at((a[axis] + b[axis]) / 2)
        a, b = (mid, b) if mid[0] ** 2 <= floor else (a, mid)
      out.append((a[1], a[2]))
  return out


def _errors(model, u, v, gain, present, log10_z, w, free) -> dict[str, float]:
  """One-sigma uncertainties of the gain and the free values (`free`: log10_z, width) from the
  residual's Jacobian by central differences: s^2 (J^T J)^-1."""
  cols, names = [-v], ["gain"]
  steps = {"log10_z": 1e-3, "width": 1e-4}

  def at(name: str, d: float) -> np.ndarray:
    x, ww = (log10_z + d, w) if name == "log10_z" else (log10_z, w + d)
    return model(10.0**x, ww)[present]

  for name in free:
    h = steps[name]
    cols.append(-gain * (at(name, h) - at(name, -h)) / (2 * h))
    names.append(name)
  jac = np.stack(cols, 1)
  r = u - gain * v
  dof = max(len(u) - len(names), 1)
  try:
    cov = (r @ r / dof) * np.linalg.inv(jac.T @ jac)
  except np.linalg.LinAlgError:
    return {}
  sd = np.sqrt(np.maximum(np.diag(cov), 0.0))
  out = dict(zip(names, (float(x) for x in sd)))
  if "width" in out:
    out["width_deg"] = float(np.rad2deg(out.pop("width")))
  return out


def calibrated(layout: Layout, fit: Calibration) -> Layout:
  """The layout as the fit found the device: its electrode width, gain and contact impedance."""
  return dataclasses.replace(
    layout,
    width=np.deg2rad(fit.width_deg) if fit.width_deg is not None else layout.width,
    gain=fit.gain,
    contact_impedance=fit.contact_impedance,
  )
