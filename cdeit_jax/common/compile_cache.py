"""JAX's persistent compilation cache for the commands: a restarted run (a preempted TPU VM, a
second evaluation) loads its compiled programs instead of compiling them again.

On by default in `~/.cache/cdeit-jax/jax` (local disk: the lookup is fast), or where
`JAX_COMPILATION_CACHE_DIR` or `--compilation_cache DIR` says (a `gs://` folder works too, as JAX
reads and writes the cache through etils.epath: useful on pods, whose hosts then share one
cache); `--compilation_cache=none` turns it off. `hits()` counts the programs loaded from it,
so a command can say whether its step came from the cache. Arrays that take seconds to derive
(the simulator's Jacobian) are kept beside the programs (`folder()/derived`).

Damaged entries are replaced: JAX writes an entry in place (a kill or a full disk leaves it
truncated) and never overwrites one that exists, so a damaged entry would make every later run
warn and compile again. `enable` therefore checks a local folder's new entries (`sweep`) and
removes those that do not decompress; JAX then writes them again at their next compilation.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import tempfile
import threading
import time
import zlib

import jax

from cdeit_jax.common import fileio

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
  folder = path or os.environ.get("JAX_COMPILATION_CACHE_DIR") or DEFAULT
  problem = None if fileio.is_remote(folder) else _unusable(folder)
  if problem:  # a broken cache costs compile time, never the command
    log.warning(f"compilation cache {folder}: {problem}; running without it")
    jax.config.update("jax_enable_compilation_cache", False)
    _folder = None
    return None
  _folder = folder
  jax.config.update("jax_enable_compilation_cache", True)
  jax.config.update("jax_compilation_cache_dir", folder)
  # every program, not only those that took a second to compile: start-up runs dozens of small
  # ones (the Jacobian, the calibration, the optimizer's initialisation)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  if not fileio.is_remote(folder):
    sweep(folder)
  return folder


def _unusable(folder: str) -> str | None:
  """Why the local folder cannot hold the cache (a file, not writable, a link loop), or None;
  made when missing, as JAX would at its first write."""
  if os.path.lexists(folder) and not os.path.isdir(folder):
    return "not a folder"
  try:
    os.makedirs(folder, exist_ok=True)
    fd, probe = tempfile.mkstemp(prefix=".write-test-", dir=folder)
    os.close(fd)
    os.unlink(probe)
  except OSError as e:
    return f"not usable ({e.strerror or e})"
  return None


_ENTRY = "-cache"  # JAX's names: "<module>-<hash>-cache", and "<module>-<hash>-atime" beside it
_CHECKED = ".cdeit-checked.json"  # {name: [size, mtime_ns]} of the entries found whole
_SETTLE_S = 60.0  # younger entries may still be being written by another process: not judged
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
log = logging.getLogger("cdeit_jax")


def _zstd_decompress():
  """A zstd decoder (the standard library's from Python 3.14, else `zstandard`), or None."""
  try:
    from compression import zstd  # Python 3.14+

    return zstd.decompress
  except ImportError:
    pass
  try:
    import zstandard

    return zstandard.ZstdDecompressor().decompress
  except ImportError:
    return None


def _whole(data: bytes) -> bool | None:
  """Whether a cache entry decompresses to at least its 4-byte compile time and a program (JAX
  compresses with zstd when a zstd library is installed, else zlib, whose checksum also catches
  changed bytes); None: a zstd entry and no decoder here to tell."""
  if data[:4] == _ZSTD_MAGIC:
    decode = _zstd_decompress()
    if decode is None:
      return None
  else:
    decode = zlib.decompress
  try:
    return len(decode(data)) > 4
  except Exception:  # each library's own error type for a truncated or changed stream
    return False


def sweep(path: str) -> list[str]:
  """Remove the entries of the local cache folder `path` that cannot be read whole (with their
  access-time files) and return their names. Only entries not already found whole (by size and
  modification time) and older than a minute are read, so a start-up reads each entry once."""
  try:
    names = sorted(n for n in os.listdir(path) if n.endswith(_ENTRY))
  except OSError:
    return []  # not made yet (JAX makes it at the first write), or not readable: JAX will say
  checked = _read_checked(path)
  found, removed, now = {}, [], time.time()
  for name in names:
    p = os.path.join(path, name)
    try:
      st = os.lstat(p)
      if not stat.S_ISREG(st.st_mode):
        continue  # not an entry JAX wrote (a folder, a link): never read, never removed
      if [st.st_size, st.st_mtime_ns] == checked.get(name):
        found[name] = checked[name]
        continue
      if now - st.st_mtime < _SETTLE_S:
        continue
      with open(p, "rb") as f:
        whole = _whole(f.read())
      if whole is False:
        for q in (p, p[: -len(_ENTRY)] + "-atime"):
          with contextlib.suppress(FileNotFoundError):
            if stat.S_ISREG(os.lstat(q).st_mode):
              os.remove(q)
        removed.append(name)
      elif whole:
        found[name] = [st.st_size, st.st_mtime_ns]
    except OSError:
      continue  # evicted or removed by another process meanwhile, or unreadable: left alone
  if removed:
    log.warning(
      f"compilation cache {path}: removed {len(removed)} damaged entr"
      f"{'y' if len(removed) == 1 else 'ies'} ({', '.join(removed[:3])}"
      f"{', ...' if len(removed) > 3 else ''}); they are compiled and written again"
    )
  if found != checked:
    try:
      fileio.write_text(os.path.join(path, _CHECKED), json.dumps(found))
    except OSError:
      pass  # a read-only cache: the entries are checked again next time, nothing else lost
  return removed


def _read_checked(path: str) -> dict:
  try:
    with open(os.path.join(path, _CHECKED)) as f:
      checked = json.load(f)
    return checked if isinstance(checked, dict) else {}
  except (OSError, ValueError):
    return {}


class Watch:
  """`with Watch() as w: ...compile...`; then `w.hit` tells whether a program came from the
  cache."""

  def __enter__(self) -> Watch:
    self._before = hits()
    return self

  def __exit__(self, *exc) -> None:
    self.hit = hits() > self._before
