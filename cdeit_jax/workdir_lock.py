"""One training per workdir: an advisory lock on `<workdir>/lock`, held for the whole run.

The lock is `fcntl.flock` on an open file. The kernel drops it when the holder's process ends in
any way (kill -9 included), and on NFS Linux emulates flock with POSIX locks that the server drops
when the client's lease lapses, so a dead run's lock is taken over with no liveness guessing and
no race between two newcomers. (The `filelock` package wraps the same call but truncates the file
on every attempt, which would erase the holder's name that the error message shows.) The file
itself is never deleted: deleting it would let a later run lock a fresh inode while an earlier
one still holds the old.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time

from cdeit_jax.errors import CdeitError

LOCK_NAME = "lock"


class WorkdirBusy(CdeitError, RuntimeError):
  """Another live process trains in this workdir."""


class WorkdirLock:
  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, LOCK_NAME)
    self._fd: int | None = None

  def acquire(self) -> "WorkdirLock":
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = _read_holder(fd)
      os.close(fd)
      raise WorkdirBusy(
          f"{os.path.dirname(self.path)} is in use by another training ({holder}); wait for it "
          "to finish, stop it, or give another --workdir") from None
    except BaseException:
      os.close(fd)
      raise
    record = json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                         "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, record, 0)
    self._fd = fd
    return self

  def release(self) -> None:
    if self._fd is not None:
      os.ftruncate(self._fd, 0)
      fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None

  def __enter__(self) -> "WorkdirLock":
    return self.acquire()

  def __exit__(self, *exc) -> None:
    self.release()


def _read_holder(fd: int) -> str:
  try:
    h = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    return f"pid {h['pid']} on {h['host']} since {h['since']}"
  except (ValueError, KeyError, OSError):
    return "holder unknown"
