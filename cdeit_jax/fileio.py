"""Atomic file writes: outputs are never half-written."""

from __future__ import annotations

import os
from typing import Callable


def atomic_write(path: str, write: Callable[[str], object]) -> None:
  """Call write(tmp) on a temporary name in the same folder, then rename it to `path`."""
  tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp")
  write(tmp)
  os.replace(tmp, path)
