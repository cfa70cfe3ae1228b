"""JAX's persistent compilation cache for the commands: a restarted run (a preempted TPU VM, a
second evaluation) loads its compiled programs instead of compiling them again.

On by default in `~/.cache/cdeit-jax/jax` (local disk: the lookup is fast), or where
`JAX_COMPILATION_CACHE_DIR` or `--compilation_cache DIR` says (a `gs://` folder works too, as JAX
reads and writes the cache through etils.epath: useful on pods, whose hosts then share one
cache); `--compilation_cache=none` turns it off. `hits()` counts the programs loaded from it,
so a command can say whether its step came from the cache. Arrays that take seconds to derive
(the simulator's Jacobian) are kept beside the programs (`folder()/derived`).
"""

from __future__ import annotations

import os
import threading

import jax

DEFAULT = os.path.join(os.path.expanduser("~"), ".cache", "cdeit-jax", "jax")
OFF = ("", "none", "None", "off")
_HIT = "/jax/compilation_cache/cache_hits"
_hits = 0
_lock = threading.Lock()


def _count(event: str, **kwargs) -> None:
  global _hits
  if event == _HIT:
    with _lock:
      _hits += 1


jax.monitoring.register_event_listener(_count)


def hits() -> int:
  """Programs loaded from the persistent cache so far in this process."""
  return _hits


_folder: str | None = None


def folder() -> str | None:
  """The cache folder in use (None: off, or never enabled in this process)."""
  return _folder


def enable(path: str | None = None) -> str | None:
  """Use the cache at `path` (default: JAX_COMPILATION_CACHE_DIR, else `DEFAULT`); a value of
  `OFF` disables it. Returns the folder in use (None: off). Call before the first compilation."""
  global _folder
  if path is not None and path.strip() in OFF:
    jax.config.update("jax_enable_compilation_cache", False)
    _folder = None
    return None
  _folder = folder = path or os.environ.get("JAX_COMPILATION_CACHE_DIR") or DEFAULT
  jax.config.update("jax_enable_compilation_cache", True)
  jax.config.update("jax_compilation_cache_dir", folder)
  # every program, not only those that took a second to compile: start-up runs dozens of small
  # ones (the Jacobian, the calibration, the optimizer's initialisation)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  return folder


class Watch:
  """`with Watch() as w: ...compile...`; then `w.hit` tells whether a program came from the
  cache."""

  def __enter__(self) -> Watch:
    self._before = hits()
    return self

  def __exit__(self, *exc) -> None:
    self.hit = hits() > self._before
