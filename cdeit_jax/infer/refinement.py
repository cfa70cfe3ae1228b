"""A KTC2023 answer refined against its own frame: each answered object moved, scaled and given
its contrast by a few Levenberg-Marquardt steps, under a Gaussian prior around the network's
answer (issue 78; docs/ktc2023.md, "Refinement against the frame").

An answer (a class map: 0 water, 1 resistive, 2 conductive) is cut into its objects, each class's
connected regions of at least `MIN_PIXELS`. Object k is drawn as its own mask moved by t_k pixels
and scaled by e^{s_k} about its centre (bilinear, so that the simulated frame is smooth in t_k and
s_k), at log10 contrast v_k = v0 e^{u_k} (resistive -v_k, conductive +v_k; v0 its class's). The
parameters minimise

  (misfit / tau)^2 + sum_k |t_k / move|^2 + (s_k / scale)^2 + (u_k / CONTRAST_STD)^2

where the misfit is the relative residual of the frame's values after its drift
(`frame_misfit`'s model: d = drift F(x) + (drift - 1) F(1)), and tau the misfit the tank's own
truths leave (the forward model's error, far above the noise: 0.12-0.15 on the public targets).
A step is taken only when it lowers both the objective and the misfit, and the steps
stop at `steps`, at the first that lowers neither, or when the frame's time budget is spent:
an answer is never moved away from its frame, and where the frame says little (few values, a
misfit flat in the parameters) the prior keeps it where the network put it.

Why moves and scales, not pixels: a free per-pixel update fits the model's error (the public
targets' misfit fell below their truths' and their score fell, 23.23 -> 22.9 of 28), while an
object's place and size are what the frames tell apart best (a truth moved by an eighth of the
radius misfits 0.30 against its own 0.13).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from cdeit_jax.common.errors import InputError
from cdeit_jax.eit.measurement import IMAGE_SIZE

MIN_PIXELS = 4  # an object of fewer pixels (of the 128 grid) is kept as it is
CONTRAST_STD = 0.5  # the prior's std of log(v_k / v0_k): an object's log10 contrast
TRIES = 8  # damping increases per step before the steps stop


@dataclasses.dataclass(frozen=True)
class Refinement:
  """The settings (`config.eval.refinement`, "objects:tau=0.13:move=3:scale=0.1:steps=6:budget=8"
  or "" for none): tau (the misfit taken as the frame's error), move (pixels) and scale (log
  factor): the prior's std of an object's shift and size; resistive and conductive: the log10
  contrast each class starts at (and its prior's mean); steps: at most this many joint steps;
  budget: seconds a frame may take."""

  tau: float = 0.13
  move: float = 3.0
  scale: float = 0.1
  resistive: float = 2.0
  conductive: float = 1.5
  steps: int = 6
  budget: float = 8.0

  def __post_init__(self):
    for name in ("tau", "move", "scale", "resistive", "conductive", "budget"):
      v = getattr(self, name)
      if not (np.isfinite(v) and v > 0):
        raise InputError(f"refinement {name}={v}: a number > 0")
    if not (isinstance(self.steps, int) and self.steps >= 0):
      raise InputError(f"refinement steps={self.steps}: an integer >= 0")

  @classmethod
  def parse(cls, text: str, where: str = "--config.eval.refinement") -> Refinement | None:
    """The refinement a string names (`Refinement`'s docstring); None for "" or "none"; an
    InputError naming `where`."""
    text = str(text or "").strip()
    if text in ("", "none"):
      return None
    kind, *parts = [p.strip() for p in text.split(":")]
    fields = {f.name: f.type for f in dataclasses.fields(cls)}
    if kind != "objects":
      raise InputError(
        f"{where}={text!r}: 'objects' with any of {', '.join(f'{k}=' for k in fields)} after "
        "':' (e.g. objects:tau=0.13:move=3), or '' for none"
      )
    given = {}
    for part in parts:
      key, sep, value = part.partition("=")
      if not sep or key not in fields:
        raise InputError(
          f"{where}={text!r}: {part!r} is not KEY=VALUE of a key among {', '.join(fields)}"
        )
      try:
        given[key] = int(value) if key == "steps" else float(value)
      except ValueError:
        raise InputError(f"{where}={text!r}: {key}={value!r} is not a number") from None
    try:
      return cls(**given)
    except InputError as e:
      raise InputError(f"{where}={text!r}: {e}") from None

  def __str__(self) -> str:
    return "objects:" + ":".join(
      f"{f.name}={getattr(self, f.name):g}" for f in dataclasses.fields(self)
    )


@dataclasses.dataclass(frozen=True)
class Piece:
  """One object of an answer: its class, mask (128 x 128 float) and centre (row, column)."""

  cls: int
  mask: np.ndarray
  centre: np.ndarray


def objects(answer: np.ndarray) -> list[Piece]:
  """The objects of a class map: each class's connected regions (4-connected) of at least
  `MIN_PIXELS`, resistive first."""
  from scipy import ndimage

  out = []
  for k in (1, 2):
    labels, n = ndimage.label(answer == k)
    for j in range(1, n + 1):
      m = labels == j
      if m.sum() >= MIN_PIXELS:
        out.append(Piece(k, m.astype(np.float64), np.array(ndimage.center_of_mass(m))))
  return out


class Refiner:
  """Refines answers of one measuring system (`simulator`: its float64 CEM, the calibrated
  device's) by `settings`; one compiled objective per number of objects."""

  def __init__(self, simulator, settings: Refinement):
    self.simulator, self.settings = simulator, settings
    self._fns: dict[int, dict] = {}

  @classmethod
  def of(cls, device, settings: Refinement) -> Refiner:
    """The refiner of a measuring system (a `Layout`'s physics): its simulator in float64."""
    import jax

    from cdeit_jax.eit.simulator import Simulator

    with jax.enable_x64(True):
      return cls(Simulator(layout=device, dtype=np.float64), settings)

  def refine_all(self, answers, differences) -> tuple[np.ndarray, list[dict]]:
    """`refine` of each answer (N, 128, 128) against its difference (N, R), in float64: the
    refined answers stacked and their records."""
    import jax

    with jax.enable_x64(True):
      done = [self.refine(a, d) for a, d in zip(answers, differences)]
    return np.stack([a for a, _ in done]), [r for _, r in done]

  def _functions(self, n: int) -> dict:
    """render(theta) -> (image, warped masks) and the residual vector and its Jacobian, for n
    objects; theta = n x (row shift, column shift, log scale), then each object's log of its
    contrast over its class's starting one."""
    if n in self._fns:
      return self._fns[n]
    import jax
    import jax.numpy as jnp
    from jax.scipy.ndimage import map_coordinates

    sim = self.simulator
    size = IMAGE_SIZE
    rows, cols = np.meshgrid(
      np.arange(size, dtype=float), np.arange(size, dtype=float), indexing="ij"
    )
    geo_std = np.array([self.settings.move, self.settings.move, self.settings.scale])

    def render(theta, masks, centres, signs, v0):
      image, warped = jnp.zeros((size, size)), []
      for k in range(n):
        shift, log_scale = theta[3 * k : 3 * k + 2], theta[3 * k + 2]
        si = centres[k, 0] + (rows - centres[k, 0] - shift[0]) * jnp.exp(-log_scale)
        sj = centres[k, 1] + (cols - centres[k, 1] - shift[1]) * jnp.exp(-log_scale)
        m = map_coordinates(masks[k], [si, sj], order=1, cval=0.0)
        warped.append(m)
        image = image + m * signs[k] * v0[k] * jnp.exp(theta[3 * n + k])
      return image, jnp.stack(warped)

    def residual(theta, masks, centres, signs, v0, d, ok, tau):
      image, _ = render(theta, masks, centres, signs, v0)
      vh = jnp.asarray(sim.vh)
      y = jnp.where(ok, sim.difference(sim.image_conductivity(image)), 0.0)
      g = jnp.where(ok, y + vh, 0.0)
      drift = jnp.vdot(d - y, g) / jnp.vdot(g, g)  # the frame's drift, in closed form
      r = (d - y - drift * g) / jnp.linalg.norm(d)
      prior = (theta[: 3 * n].reshape(n, 3) / geo_std).ravel()
      return jnp.concatenate([r / tau, prior, theta[3 * n :] / CONTRAST_STD])

    fns = {
      "render": jax.jit(render),
      "residual": jax.jit(residual),
      "jacobian": jax.jit(jax.jacfwd(residual)),
    }
    self._fns[n] = fns
    return fns

  def refine(self, answer: np.ndarray, difference: np.ndarray) -> tuple[np.ndarray, dict]:
    """(the refined class map, a record) of one answer (128 x 128, 0/1/2) and its frame's
    difference (R,): simulation units (over the calibrated gain), NaN where a value is missing.
    The record: objects, steps taken, the misfit before and after, seconds."""
    import jax.numpy as jnp

    t0 = time.perf_counter()
    s = self.settings
    pieces = objects(answer)
    record = {"objects": len(pieces), "steps": 0, "misfit_before": None, "misfit": None}
    if not pieces or s.steps == 0:
      return np.asarray(answer, np.uint8), {**record, "seconds": time.perf_counter() - t0}
    n = len(pieces)
    f = self._functions(n)
    ok = np.isfinite(difference)
    v0 = np.array([s.resistive if p.cls == 1 else s.conductive for p in pieces])
    const = (
      jnp.asarray(np.stack([p.mask for p in pieces])),
      jnp.asarray(np.stack([p.centre for p in pieces])),
      jnp.asarray([-1.0 if p.cls == 1 else 1.0 for p in pieces]),
      jnp.asarray(v0),
      jnp.asarray(np.where(ok, difference, 0.0)),
      jnp.asarray(ok),
    )
    theta = np.zeros(4 * n)
    data = slice(0, int(ok.size))

    def misfit(r):
      return float(np.linalg.norm(r[data]) * s.tau)

    r = r0 = np.asarray(f["residual"](theta, *const, s.tau))
    cost, damping, taken = float(r @ r), 1e-2, 0
    while taken < s.steps and time.perf_counter() - t0 < s.budget:
      jac = np.asarray(f["jacobian"](theta, *const, s.tau))
      a, grad = jac.T @ jac, jac.T @ r
      for _ in range(TRIES):
        cand = theta + np.linalg.solve(a + damping * np.diag(np.diag(a) + 1e-12), -grad)
        r2 = np.asarray(f["residual"](cand, *const, s.tau))
        if float(r2 @ r2) < cost and misfit(r2) < misfit(r):  # lowers both, or is not taken
          theta, r, cost, damping = cand, r2, float(r2 @ r2), damping / 3
          taken += 1
          break
        damping *= 4
      else:
        break  # no damping lowered both: the frame asks for no further move
    _, warped = f["render"](theta, *const[:4])
    out = np.zeros(answer.shape, np.uint8)
    for p, m in zip(pieces, np.asarray(warped)):
      out[m > 0.5] = p.cls
    return out, {
      **record,
      "steps": taken,
      "misfit_before": misfit(r0),
      "misfit": misfit(r),
      "shift_px": [float(np.hypot(*theta[3 * k : 3 * k + 2])) for k in range(n)],
      "scale": [float(np.exp(theta[3 * k + 2])) for k in range(n)],
      "contrast": [float(v) for v in v0 * np.exp(theta[3 * n :])],
      "seconds": time.perf_counter() - t0,
    }
