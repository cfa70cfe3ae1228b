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
thread of the holder. A newcomer takes a lock not renewed for `lease_s` (its holder died without
releasing it, e.g. a lost VM); a younger one it watches, and refuses as soon as it is renewed, or
takes it once it has lapsed. The holder checks at each renewal
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
from cdeit_jax.errors import CdeitError, InputError

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
    try:
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
      raise InputError(f"{self.path}: cannot open the workdir's lock file ({e.strerror}); "
                       "remove what is there or give another --workdir") from None
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
  return f"pid {h.get('pid', '?')} on {h.get('host', '?')} since {h.get('since', '?')}"


def _holder() -> dict:
  return {"host": socket.gethostname(), "pid": os.getpid(),
          "since": time.strftime("%Y-%m-%d %H:%M:%S"), "token": uuid.uuid4().hex}


class _Lease:
  """The object-store lock (module docstring): taken on construction, renewed by a daemon thread
  until release()."""

  def __init__(self, path: str, workdir: str, lease_s: float):
    self.path, self.lease_s = path, lease_s
    self._wait_for_lapse(workdir)
    self.me = _holder()
    self._write()
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._renew, name="cdeit-workdir-lease", daemon=True)
    self._thread.start()

  def _wait_for_lapse(self, workdir: str) -> None:
    """Return once the lock is free or lapsed; raise WorkdirBusy as soon as its holder renews it.
    A fresh lock is watched rather than refused at once: a run restarted right after its
    predecessor died (kill -9, a VM lost) then takes over by itself within one lease."""
    h, told = self._read(), False
    while h is not None:
      age = time.time() - float(h.get("renewed", 0))
      if age >= self.lease_s:
        log.info("taking over the lock of %s (%s: not renewed for %.0f s)", workdir,
                 _describe(h), age)
        return
      if not told:
        log.info("%s is locked by %s, renewed %.0f s ago: waiting up to %.0f s to see whether "
                 "it is renewed (its holder is alive) or lapses", workdir, _describe(h), age,
                 self.lease_s - age)
        told = True
      time.sleep(min(self.lease_s / 8, self.lease_s - age))
      now = self._read()
      if now is not None and (now.get("token"), now.get("renewed")) != (h.get("token"),
                                                                      h.get("renewed")):
        raise WorkdirBusy(
            f"{workdir} is in use by another training ({_describe(now)}; it renews its lock); "
            "wait for it to finish, stop it, or give another --workdir")
      h = now

  def _read(self) -> dict | None:
    try:
      h = json.loads(fileio.read_text(self.path) or "null")
      return h if isinstance(h, dict) else None
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
