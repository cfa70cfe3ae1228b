"""Hidden staging folders named by the process that writes them (`PREFIX<pid>...`): an output
is made whole in one and moved into place, and the folders a killed process left (SIGKILL, a
lost machine) are found by their pid and removed by the next writer (`stale`); a folder's
writers take turns (`locked`)."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator

from cdeit_jax.common import fileio
from cdeit_jax.common.errors import InputError


def stale(folder: str, prefix: str) -> list[str]:
  """The staging folders `prefix<pid>[-...]` in local `folder` that no live process owns: those
  of processes that are gone, and one under this process's own pid (a pid reused, or a stage
  this process abandoned). In a bucket there is no pid to ask: they stay."""
  if fileio.is_remote(folder) or not os.path.isdir(fileio.resolve(folder)):
    return []
  found = []
  for entry in os.scandir(fileio.resolve(folder)):
    pid = entry.name.removeprefix(prefix).split("-")[0]
    if entry.name.startswith(prefix) and pid.isdigit():
      if int(pid) == os.getpid() or not alive(int(pid)):
        found.append(entry.path)
  return found


def alive(pid: int) -> bool:
  """Whether process `pid` runs (another user's counts)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's live process
    return True
  return True


@contextlib.contextmanager
def locked(folder: str, busy: str) -> Iterator[None]:
  """Hold an exclusive lock on local `folder` for the block: `flock` on the folder's own open
  descriptor, the mechanism of `train.workdir_lock` (the kernel drops it when its holder ends in
  any way, kill -9 included, so no stale lock is left; no file is made). Another holder: an
  InputError `busy` (one line saying what to wait for). A file system without flock on folders
  (some NFS): logged and not locked. In a bucket there is nothing to lock: the block runs."""
  if fileio.is_remote(folder):
    yield
    return
  fd = os.open(fileio.resolve(folder), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      raise InputError(busy) from None
    except OSError as e:  # no flock here: run unlocked, saying so
      logging.getLogger("cdeit_jax").warning(f"{folder}: cannot be locked ({e.strerror})")
    yield
  finally:
    os.close(fd)  # drops the lock
