"""Hidden staging folders named by the process that writes them (`PREFIX<pid>...`): an output
is made whole in one and moved into place, and the folders a killed process left (SIGKILL, a
lost machine) are found by their pid and removed by the next writer (`stale`)."""

from __future__ import annotations

import os

from cdeit_jax.common import fileio


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
