"""What the simulator simulates, as plain dataclasses (no JAX): configs read these defaults."""

from __future__ import annotations

import dataclasses

from cdeit_jax.errors import InputError

MAX_INCLUSIONS = 4
KINDS = ("disc", "ellipse", "half_disc", "annulus")


@dataclasses.dataclass(frozen=True)
class PhantomSpec:
  """Distribution of random phantoms (sizes in units of the disk radius)."""
  min_inclusions: int = 1
  max_inclusions: int = 4
  min_size: float = 0.15         # radius (disc, half-disc, annulus) or major semi-axis (ellipse)
  max_size: float = 0.45
  min_aspect: float = 0.4        # ellipse minor / major
  annulus_inner: float = 0.6     # annulus inner radius ratio (the authors' recipe)
  max_radius: float = 0.95       # every inclusion lies inside |p| <= max_radius
  v_min: float = 0.5             # |label| range: sigma = 10^v, v in +-[v_min, v_max]
  v_max: float = 1.0
  separation: float = 0.03       # minimum gap between inclusions' bounding circles

  def validate(self) -> None:
    if not 1 <= self.min_inclusions <= self.max_inclusions <= MAX_INCLUSIONS:
      raise InputError(f"need 1 <= min_inclusions <= max_inclusions <= {MAX_INCLUSIONS}")
    if not 0 < self.min_size <= self.max_size < self.max_radius <= 1:
      raise InputError("need 0 < min_size <= max_size < max_radius <= 1")
    if not 0 < self.v_min <= self.v_max:
      raise InputError("need 0 < v_min <= v_max")
    if not 0 < self.min_aspect <= 1:
      raise InputError("need 0 < min_aspect <= 1 (an ellipse's minor / major axis)")
    if not 0 < self.annulus_inner < 1:
      raise InputError("need 0 < annulus_inner < 1 (an annulus's inner / outer radius)")
    if not self.separation >= 0:
      raise InputError("need separation >= 0")
