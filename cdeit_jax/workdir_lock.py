"""One training per workdir: a lock on `<workdir>/lock`, held for the whole run.

Local (and NFS) workdirs: the lock is `fcntl.flock` on an open file. The kernel drops it when the
holder's process ends in any way (kill -9 included), and on NFS Linux emulates flock with POSIX
locks that the server drops when the client's lease lapses, so a dead run's lock is taken over
with no liveness guessing and no race between two newcomers. (The `filelock` package wraps the
same call but truncates the file on every attempt, which would erase the holder's name that the
error message shows.) The file itself is never deleted: deleting it would let a later run lock a
fresh inode while an earlier one still holds the old.

Object stores (gs://) have no locks and no rename, so there the lock is a lease: the `lock`
object names its holder and the time it was last renewed, rewritten every `lease_s / 4` by a
thread of the holder; a newcomer refuses a lock renewed within `lease_s` and takes over an older
one (its holder died without releasing it, e.g. a preempted VM). The holder checks at each renewal
that the object still names it, and releasing deletes the object only if it does. Two newcomers
starting within the same second could both see the lock free (the read-then-write is not one
request); on GCS a generation precondition would close that, which the fsspec layer used here does
not offer.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import threading
import time
import uuid

from cdeit_jax import fileio
from cdeit_jax.errors import CdeitError

LOCK_NAME = "lock"
LEASE_S = 120.0  # an object-store lock not renewed for this long belongs to a dead run

log = logging.getLogger("cdeit_jax.lock")


class WorkdirBusy(CdeitError, RuntimeError):
  """Another live process trains in this workdir."""


class WorkdirLock:
  def __init__(self, workdir: str, lease_s: float = LEASE_S):
    self.workdir = fileio.resolve(workdir)
    self.path = fileio.join(self.workdir, LOCK_NAME)
    self.lease_s = lease_s
    self._fd: int | None = None
    self._lease: _Lease | None = None

  def acquire(self) -> "WorkdirLock":
    if fileio.is_remote(self.path):
      self._lease = _Lease(self.path, self.workdir, self.lease_s)
      return self
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
    if self._lease is not None:
      self._lease.release()
      self._lease = None
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
    return _describe(h)
  except (ValueError, KeyError, OSError):
    return "holder unknown"


def _describe(h: dict) -> str:
  return f"pid {h['pid']} on {h['host']} since {h['since']}"


def _holder() -> dict:
  return {"host": socket.gethostname(), "pid": os.getpid(),
          "since": time.strftime("%Y-%m-%d %H:%M:%S"), "token": uuid.uuid4().hex}


class _Lease:
  """The object-store lock (module docstring): taken on construction, renewed by a daemon thread
  until release()."""

  def __init__(self, path: str, workdir: str, lease_s: float):
    self.path, self.lease_s = path, lease_s
    h = self._read()
    if h is not None:
      age = time.time() - float(h.get("renewed", 0))
      if age < lease_s:
        raise WorkdirBusy(
            f"{workdir} is in use by another training ({_describe(h)}; lock renewed {age:.0f} s "
            "ago); wait for it to finish, stop it, or give another --workdir. The lock of a run "
            f"that died without releasing it lapses {lease_s:.0f} s after its last renewal.")
      log.info("taking over the lock of %s (%s: not renewed for %.0f s)", workdir, _describe(h),
               age)
    self.me = _holder()
    self._write()
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._renew, name="cdeit-workdir-lease", daemon=True)
    self._thread.start()

  def _read(self) -> dict | None:
    try:
      text = fileio.read_text(self.path)
      return json.loads(text) if text else None
    except ValueError:  # not ours to interpret: treated as free
      return None

  def _write(self) -> None:
    fileio.write_text(self.path, json.dumps({**self.me, "renewed": time.time()}))

  def _renew(self) -> None:
    while not self._stop.wait(self.lease_s / 4):
      try:
        h = self._read()
        if h is not None and h.get("token") != self.me["token"]:
          log.error("the lock of this workdir was taken over by %s (this run's lease lapsed); "
                    "two trainings now write the same workdir: stop one", _describe(h))
          return
        self._write()
      except Exception as e:  # a transient store error: the lease survives a missed renewal
        log.warning("could not renew the workdir lock %s (%s: %s)", self.path,
                    type(e).__name__, e)

  def release(self) -> None:
    self._stop.set()
    self._thread.join()
    h = self._read()
    if h is not None and h.get("token") == self.me["token"]:
      fileio.path(self.path).unlink(missing_ok=True)
