"""Electrodes and patterns by rule, as arrays (`eit.layout` makes them a `Layout`): electrode
centres evenly spaced round the tank and their default width; pyEIT-like rules (adjacent, skip-k,
opposite, against-k injections; adjacent or skip-k measurements, with or without
current-carrying electrodes) as a current matrix and rows; KTC2023's patterns."""

from __future__ import annotations

import re

import numpy as np

from cdeit_jax.common.errors import InputError

CDEIT_WIDTH_DEG = 4.0  # the CDEIT simulations' electrodes (docs/reference/eit-conventions.md)


def default_width(n: int) -> float:
  """Degrees: CDEIT's 4 for 16 electrodes, else half the spacing."""
  return CDEIT_WIDTH_DEG if n == 16 else 180.0 / n


def evenly_spaced(n: int, first_deg: float = 90.0, clockwise: bool = True) -> np.ndarray:
  """Centres (radians) of `n` evenly spaced electrodes, electrode 0 at `first_deg`."""
  step = -2 * np.pi / n if clockwise else 2 * np.pi / n
  return np.deg2rad(first_deg) + step * np.arange(n)


_SKIP = re.compile(r"^skip-(\d+)$")
_AGAINST = re.compile(r"^against-(\d+)$")


def _injection_pairs(n: int, rule: str) -> list[tuple[int, int]]:
  """(electrode with -I, electrode with +I) per pattern, CDEIT's sign for the skip rules."""
  if rule == "adjacent":
    rule = "skip-0"
  if rule == "opposite":
    if n % 2:
      raise InputError(f"injection 'opposite' needs an even electrode count, got {n}")
    rule = f"skip-{n // 2 - 1}"
  if m := _SKIP.match(rule):
    s = int(m.group(1))
    if not 0 <= s <= n - 2:
      raise InputError(f"injection {rule!r}: the skip must be in 0..{n - 2} for {n} electrodes")
    return [(k, (k + s + 1) % n) for k in range(n)]
  if m := _AGAINST.match(rule):
    ref = int(m.group(1))
    if not 0 <= ref < n:
      raise InputError(f"injection {rule!r}: the electrode must be in 0..{n - 1}")
    return [(ref, k) for k in range(n) if k != ref]
  raise InputError(
    f"injection {rule!r}: use 'adjacent', 'opposite', 'skip-K' or 'against-K' (K an electrode)"
  )


def rule_patterns(
  n: int, injection: str, measurement: str, measure_injecting: bool
) -> tuple[np.ndarray, np.ndarray]:
  """(currents (n, P), rows (R, 3)) of `n` electrodes (an integer >= 4) by the rules
  `injection` and `measurement` (`eit.layout.from_rules`); an InputError for a rule that is
  not one, or a pattern that measures nothing."""
  for what, rule in (("injection", injection), ("measurement", measurement)):
    if not isinstance(rule, str):
      raise InputError(f"{what}={rule!r}: give a rule's name, e.g. 'adjacent' or 'skip-2'")
  m = _SKIP.match("skip-0" if measurement == "adjacent" else measurement)
  if not m or not 0 <= int(m.group(1)) <= n - 2:
    raise InputError(f"measurement {measurement!r}: use 'adjacent' or 'skip-K', K in 0..{n - 2}")
  ms = int(m.group(1)) + 1
  pairs = _injection_pairs(n, injection)
  currents = np.zeros((n, len(pairs)))
  rows = []
  for p, (lo, hi) in enumerate(pairs):
    currents[lo, p], currents[hi, p] = -1.0, 1.0
    for e in range(n):
      pair = {e, (e + ms) % n}
      if measure_injecting or not pair & {lo, hi}:
        rows.append((p, e, (e + ms) % n))
    if not rows or rows[-1][0] != p:
      raise InputError(
        f"{n} electrodes, {injection} injection, {measurement} measurement: pattern {p} "
        "measures nothing (every pair touches a current-carrying electrode); measure on them "
        "too (measure_injecting=True) or choose other rules"
      )
  return currents, np.array(rows)


def ktc2023_patterns() -> tuple[np.ndarray, np.ndarray]:
  """(currents (32, 76), rows (2356, 3)) of KTC2023's system: currents through the 16 even
  (0-based) electrodes: 16 skip-1 pairs (+ at 2p, - at 2p+2) and 15 patterns against each of
  electrodes 0, 8, 16, 24 (+ at the other, - at it); each pattern measures U_m - U_{m+1},
  m = 0..30."""
  n, odd = 32, list(range(0, 32, 2))
  pairs = [(2 * p, (2 * p + 2) % n) for p in range(16)]
  pairs += [(e, ref) for ref in (0, 8, 16, 24) for e in odd if e != ref]
  currents = np.zeros((n, len(pairs)))
  for p, (plus, minus) in enumerate(pairs):
    currents[plus, p], currents[minus, p] = 1.0, -1.0
  rows = np.array([(p, m, m + 1) for p in range(len(pairs)) for m in range(n - 1)])
  return currents, rows
