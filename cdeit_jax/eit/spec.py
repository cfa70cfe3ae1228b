"""What the simulator simulates, as plain dataclasses (no JAX): configs read these defaults.

`PhantomSpec`: the random objects in the tank. `SystemSpec`: the random measuring system that
sees them (gain, contact impedances, electrode layout, tank radius, background, noise), so that a
model trained on simulations meets real devices it never saw (`cdeit_jax.eit.system`).
"""

from __future__ import annotations

import dataclasses
import math

from cdeit_jax.common.errors import InputError

MAX_INCLUSIONS = 6
ROW = 9  # a phantom row: [active, kind, cx, cy, a, b, angle, v, p]
KINDS = ("disc", "ellipse", "half_disc", "annulus", "rectangle", "polygon", "star")
MAX_SIDES = 6  # polygons have 3..MAX_SIDES sides; stars 3..MAX_SIDES - 1 lobes
TARGETS = ("label", "class")  # what PhantomSpec.target may be


@dataclasses.dataclass(frozen=True)
class PhantomSpec:
  """Distribution of random phantoms (sizes in units of the disk radius). Every kind's bounding
  circle has radius `a` (the placement keeps those circles apart)."""

  min_inclusions: int = 1
  max_inclusions: int = 5
  min_size: float = 0.12  # bounding radius a
  max_size: float = 0.45
  min_aspect: float = 0.4  # ellipse minor / major; rectangle short / long side
  annulus_inner: float = 0.6  # annulus inner radius ratio (the authors' recipe)
  max_radius: float = 0.95  # every inclusion lies inside |p| <= max_radius
  v_min: float = 0.5  # |label| range: sigma = 10^v, v in +-[v_min, v_max]
  v_max: float = 1.0
  # the resistive objects' own |label| range, v in -[resistive_v_min, resistive_v_max]
  # (0, 0: v_min, v_max): real tanks' plastic is far more resistive than their metal is
  # conductive (KTC2023's public targets, docs/ktc2023.md)
  resistive_v_min: float = 0.0
  resistive_v_max: float = 0.0
  separation: float = 0.03  # minimum gap between inclusions' bounding circles
  near_wall: float = 0.25  # fraction of candidate placements touching |p| = max_radius
  kinds: str = ",".join(KINDS)  # the kinds drawn (uniformly), comma-separated
  # what the 128 x 128 target shows inside an inclusion: "label", its v (the contrast's log10);
  # "class", sign(v) = +-1, the convention of UEF2017's and KTC2023's ground truths (a class map:
  # the voltages are the same, only the picture the network learns to draw changes)
  target: str = "label"

  def kind_ids(self) -> tuple[int, ...]:
    names = [k.strip() for k in str(self.kinds).split(",") if k.strip()]
    unknown = sorted(set(names) - set(KINDS))
    if unknown or not names:
      raise InputError(f"kinds={self.kinds!r}: name some of {', '.join(KINDS)} (comma-separated)")
    return tuple(sorted({KINDS.index(k) for k in names}))

  def resistive_range(self) -> tuple[float, float]:
    """The resistive objects' |label| range (`resistive_v_min`, `resistive_v_max`)."""
    if (self.resistive_v_min, self.resistive_v_max) == (0, 0):
      return self.v_min, self.v_max
    return self.resistive_v_min, self.resistive_v_max

  def validate(self) -> None:
    if not 1 <= self.min_inclusions <= self.max_inclusions <= MAX_INCLUSIONS:
      raise InputError(f"need 1 <= min_inclusions <= max_inclusions <= {MAX_INCLUSIONS}")
    if not 0 < self.min_size <= self.max_size < self.max_radius <= 1:
      raise InputError("need 0 < min_size <= max_size < max_radius <= 1")
    if not 0 < self.v_min <= self.v_max:
      raise InputError("need 0 < v_min <= v_max")
    if (self.resistive_v_min, self.resistive_v_max) != (0, 0) and not (
      0 < self.resistive_v_min <= self.resistive_v_max
    ):
      raise InputError(
        "need 0 < resistive_v_min <= resistive_v_max, or both 0 (the range of v_min, v_max)"
      )
    if not 0 < self.min_aspect <= 1:
      raise InputError("need 0 < min_aspect <= 1 (an ellipse's minor / major axis)")
    if not 0 < self.annulus_inner < 1:
      raise InputError("need 0 < annulus_inner < 1 (an annulus's inner / outer radius)")
    if not self.separation >= 0:
      raise InputError("need separation >= 0")
    if not 0 <= self.near_wall <= 1:
      raise InputError("need 0 <= near_wall <= 1 (a fraction of the placements)")
    if self.target not in TARGETS:
      raise InputError(f"target={self.target!r}: give one of {', '.join(TARGETS)}")
    self.kind_ids()


def _range(spec, name: str, low: float, high: float = math.inf) -> tuple[float, float]:
  value = getattr(spec, name)
  try:
    lo, hi = (float(v) for v in value)
  except (TypeError, ValueError):
    raise InputError(f"{name}={value!r}: give a pair (min, max)") from None
  if not (low <= lo <= hi <= high and math.isfinite(lo) and math.isfinite(hi)):
    raise InputError(f"{name}={value!r}: need {low} <= min <= max <= {high}")
  return lo, hi


WIDTH_DEG_LIMITS = (0.5, 20.0)  # the electrode widths a SystemSpec may draw (degrees)


@dataclasses.dataclass(frozen=True)
class SystemSpec:
  """Distribution of the measuring system, one draw per example. A range (min, max) with
  min == max, or a spread of 0, switches that randomisation off; `nominal()` switches all off
  (the fixed system of `config.simulator.contact_impedance`, 4-degree electrodes, the CDEIT
  recipe). Log-uniform: gain, contact impedance, radius, background, drift; uniform: the rest.

  In 2-D the radius and the background only enter as the contact impedance z / (radius sigma_bg)
  and the voltage scale 1 / sigma_bg (`cdeit_jax.eit.system`), so they are cheap."""

  gain: tuple = (0.8, 1.4)  # voltage amplitude factor (the device's calibration)
  contact_impedance: tuple = (0.003, 0.1)  # per electrode, drawn independently
  rotation_deg: float = 4.0  # all electrodes turned by +-this
  jitter_deg: float = 1.5  # each electrode's centre moved by +-this
  width_deg: tuple = (3.0, 12.0)  # electrode width, one per example
  width_jitter: float = 0.15  # each electrode's width times 1 +- this
  passive: float = 0.3  # probability of a passive (floating) electrode in
  # every gap (a 32-electrode tank driven on 16)
  radius: tuple = (0.9, 1.1)  # tank radius / the unit disk's
  background: tuple = (0.7, 1.4)  # background conductivity / sigma_bg
  snr_spread_db: float = 10.0  # SNR uniform in snr_db +- this
  drift: tuple = (1.0, 1.0)  # the target frame's voltages / the empty tank's, one per
  # example: the background's change between the two measurements (temperature, salt;
  # KTC2023's public targets 0.92-1.004, docs/ktc2023.md); per example also with device_seed
  device_seed: int = -1  # >= 0: every example is measured by the one
  # system drawn from this seed (one device)

  @classmethod
  def nominal(cls, width_deg: float = 4.0) -> SystemSpec:
    return cls(
      gain=(1.0, 1.0),
      contact_impedance=(0.0, 0.0),
      rotation_deg=0.0,
      jitter_deg=0.0,
      width_deg=(width_deg, width_deg),
      width_jitter=0.0,
      passive=0.0,
      radius=(1.0, 1.0),
      background=(1.0, 1.0),
      snr_spread_db=0.0,
      drift=(1.0, 1.0),
      device_seed=-1,
    )

  def is_nominal(self, width_deg: float = 4.0) -> bool:
    """Whether every example sees the same system as the mesh's nominal one (the fast path).
    contact_impedance (0, 0) means `config.simulator.contact_impedance`."""
    n = self.nominal(width_deg)
    return all(
      tuple(getattr(self, f.name)) == tuple(getattr(n, f.name))
      if isinstance(getattr(n, f.name), tuple)
      else getattr(self, f.name) == getattr(n, f.name)
      for f in dataclasses.fields(self)
      if f.name != "device_seed"
    )

  def validate(self) -> None:
    _range(self, "gain", 1e-6)
    lo, _ = _range(self, "contact_impedance", 0.0)
    if lo == 0 and tuple(self.contact_impedance) != (0.0, 0.0):
      raise InputError("contact_impedance: need 0 < min <= max, or (0, 0) for the nominal value")
    _range(self, "width_deg", *WIDTH_DEG_LIMITS)
    _range(self, "radius", 1e-3)
    _range(self, "background", 1e-6)
    _range(self, "drift", 0.5, 2.0)
    for name, hi in (
      ("rotation_deg", 180.0),
      ("jitter_deg", 2.5),
      ("width_jitter", 0.5),
      ("passive", 1.0),
      ("snr_spread_db", 60.0),
    ):
      v = getattr(self, name)
      if not (isinstance(v, (int, float)) and 0 <= v <= hi):
        raise InputError(f"{name}={v!r}: need 0 <= {name} <= {hi}")
    if not (isinstance(self.device_seed, int) and self.device_seed >= -1):
      raise InputError(
        f"device_seed={self.device_seed!r}: need an integer >= 0, or -1 for a system per example"
      )
    # Widths are clipped per example so that neighbours keep a gap (`eit.system.draw`).
