"""One training per workdir: a lock on `<workdir>/lock`, held for the whole run.

Local (and NFS) workdirs: the lock is `fcntl.flock` on an open file. The kernel drops it when the
holder's process ends in any way (kill -9 included), and on NFS Linux emulates flock with POSIX
locks that the server drops when the client's lease lapses, so a dead run's lock is taken over
with no liveness guessing and no race between two newcomers. (The `filelock` package wraps the
same call but truncates the file on every attempt, which would erase the holder's name that the
error message shows.) The file is deleted only by a run refused before its first step that created
it (`release(remove=True)`, while still holding it), so that a refused run leaves nothing behind; a
run that locked the file's old inode meanwhile sees that the path no longer names it and opens the
path again, so two runs never hold two inodes of one lock.

Object stores (gs://) have no locks and no rename, so there the lock is a lease: the `lock`
object names its holder and the time it was last renewed, rewritten every `lease_s / 4` by a
thread of the holder. A newcomer takes a lock not renewed for `lease_s` (its holder died without
releasing it, e.g. a lost VM); a younger one it watches, and refuses as soon as it is renewed, or
takes it once it has lapsed. Releasing deletes the object only if it still names the holder.

Fencing: a holder that cannot prove it still holds the lease stops writing at once. Its renewal
thread gives up the run (one line, exit 3, `os._exit`: no checkpoint commit, retention delete or
metrics upload can follow, not even an in-flight async save's) when the object names another
holder, or when its last confirmed renewal is older than `SAFETY` lease lengths (it was paused,
or the store was unreachable: a newcomer may take the lease at 1.0); and the training loop checks
the object before every checkpoint save (`check`). Clocks may differ between hosts by less than
(1 - SAFETY) lease lengths (30 s at the default). Two newcomers
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
import sys
import threading
import time
import uuid
from collections.abc import Callable

from cdeit_jax.common import fileio
from cdeit_jax.common.errors import CdeitError, InputError

LOCK_NAME = "lock"
LEASE_S = 120.0  # an object-store lock not renewed for this long belongs to a dead run
SAFETY = 0.75  # a holder whose renewal is older than this many leases stops (fencing)

log = logging.getLogger("cdeit_jax.lock")


class WorkdirBusy(CdeitError, RuntimeError):
  """Another live process trains in this workdir."""


class LeaseLost(CdeitError, RuntimeError):
  """This run can no longer prove that it holds its workdir's lease."""


def stop_now(message: str) -> None:
  """The fenced run's end: one line, exit 3, at once (no thread may write another byte)."""
  sys.stderr.write(f"\nerror: {message}\n")  # on a line of its own (after a progress bar)
  sys.stderr.flush()
  os._exit(3)


class WorkdirLock:
  def __init__(
    self, workdir: str, lease_s: float = LEASE_S, on_lost: Callable[[str], None] = stop_now
  ):
    self.workdir = fileio.resolve(workdir)
    self.path = fileio.join(self.workdir, LOCK_NAME)
    if not (isinstance(lease_s, (int, float)) and lease_s > 0):
      raise InputError(f"config.lock_lease_s={lease_s!r}: give a number of seconds > 0")
    self.lease_s = lease_s
    self.on_lost = on_lost
    self._fd: int | None = None
    self._lease: _Lease | None = None

  def check(self, read: bool = False) -> None:
    """Raise LeaseLost unless this run provably holds its lease (a gs:// workdir; with `read`,
    the lock object is read too). A local lock (flock) cannot be lost while the process lives."""
    if self._lease is not None:
      self._lease.check(read)

  def acquire(self) -> WorkdirLock:
    if fileio.is_remote(self.path):
      self._lease = _Lease(self.path, self.workdir, self.lease_s, self.on_lost)
      return self
    while True:
      fd = self._lock_file()
      if _names(self.path, fd):
        break
      os.close(fd)  # a refused run deleted the file we locked: lock the path's new one
    record = json.dumps(
      {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "since": time.strftime("%Y-%m-%d %H:%M:%S"),
      }
    ).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, record, 0)
    self._fd = fd
    return self

  def _lock_file(self) -> int:
    """The lock file opened (created if missing) and locked; WorkdirBusy when held."""
    try:
      fd = fileio.open_nofollow(self.path, os.O_RDWR | os.O_CREAT)
    except OSError as e:
      raise InputError(
        f"{self.path}: cannot open the workdir's lock file ({e.strerror}); "
        "remove what is there or give another --workdir"
      ) from None
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = _read_holder(fd)
      os.close(fd)
      raise WorkdirBusy(
        f"{os.path.dirname(self.path)} is in use by another training ({holder}); wait for it "
        "to finish, stop it, or give another --workdir"
      ) from None
    except BaseException:
      os.close(fd)
      raise
    return fd

  def release(self, remove: bool = False) -> None:
    """Unlock; `remove`: delete the lock file too (a refused run that created it)."""
    if self._lease is not None:
      self._lease.release()
      self._lease = None
    if self._fd is not None:
      if remove and _names(self.path, self._fd):
        os.unlink(self.path)  # while held: a newcomer that locks this inode next sees it gone
      os.ftruncate(self._fd, 0)
      fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None

  def __enter__(self) -> WorkdirLock:
    return self.acquire()

  def __exit__(self, *exc) -> None:
    self.release()


def _names(p: str, fd: int) -> bool:
  """Whether path `p` is still the file open as `fd` (not deleted or replaced since)."""
  try:
    st = os.stat(p, follow_symlinks=False)
  except FileNotFoundError:
    return False
  own = os.fstat(fd)
  return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def _read_holder(fd: int) -> str:
  try:
    h = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    return _describe(h)
  except (ValueError, KeyError, OSError):
    return "holder unknown"


def _describe(h: dict) -> str:
  return f"pid {h.get('pid', '?')} on {h.get('host', '?')} since {h.get('since', '?')}"


def _holder() -> dict:
  return {
    "host": socket.gethostname(),
    "pid": os.getpid(),
    "since": time.strftime("%Y-%m-%d %H:%M:%S"),
    "token": uuid.uuid4().hex,
  }


class _Lease:
  """The object-store lock (module docstring): taken on construction, renewed by a daemon thread
  until release()."""

  def __init__(
    self, path: str, workdir: str, lease_s: float, on_lost: Callable[[str], None] = stop_now
  ):
    self.path, self.workdir, self.lease_s, self.on_lost = path, workdir, lease_s, on_lost
    self.lost: str | None = None
    self._wait_for_lapse(workdir)
    self.me = _holder()
    self.confirmed = time.time()  # before the write: the lease runs from no earlier than this
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
        log.info(
          "taking over the lock of %s (%s: not renewed for %.0f s)", workdir, _describe(h), age
        )
        return
      if not told:
        log.info(
          "%s is locked by %s, renewed %.0f s ago: waiting up to %.0f s to see whether "
          "it is renewed (its holder is alive) or lapses",
          workdir,
          _describe(h),
          age,
          self.lease_s - age,
        )
        told = True
      time.sleep(min(self.lease_s / 8, self.lease_s - age))
      now = self._read()
      if now is not None and (now.get("token"), now.get("renewed")) != (
        h.get("token"),
        h.get("renewed"),
      ):
        raise WorkdirBusy(
          f"{workdir} is in use by another training ({_describe(now)}; it renews its lock); "
          "wait for it to finish, stop it, or give another --workdir"
        )
      h = now

  def _read(self) -> dict | None:
    try:
      h = json.loads(fileio.read_text(self.path) or "null")
      return h if isinstance(h, dict) else None
    except ValueError:  # not ours to interpret: treated as free
      return None

  def _write(self) -> None:
    fileio.write_text(self.path, json.dumps({**self.me, "renewed": time.time()}))

  def _late(self) -> str | None:
    age = time.time() - self.confirmed
    if age > SAFETY * self.lease_s:
      return (
        f"the lease on {self.workdir} was last confirmed {age:.0f} s ago (lease "
        f"{self.lease_s:.0f} s: this process was paused or the store unreachable), so "
        "another training may own the workdir now; this run stopped writing. Rerun to "
        "resume if no other run uses it"
      )
    return None

  def _taken(self, h: dict | None) -> str | None:
    if h is not None and h.get("token") != self.me["token"]:
      return (
        f"the lock of {self.workdir} was taken over by {_describe(h)} (this run's lease "
        "lapsed); this run stopped writing and leaves the workdir to it"
      )
    return None

  def _lose(self, why: str) -> None:
    if self.lost is None:
      self.lost = why
      self.on_lost(why)

  def check(self, read: bool = False) -> None:
    why = self.lost or self._late() or (self._taken(self._read()) if read else None)
    if why:
      self._lose(why)
      raise LeaseLost(why)

  def _renew(self) -> None:
    while not self._stop.wait(self.lease_s / 4):
      if self.lost:
        return
      t = time.time()
      why = self._late()  # a renewal this late could overlap a newcomer's: never write it
      try:
        why = why or self._taken(self._read())
        # paused between the check above and here, the read is stale and the write could cover
        # a newcomer's lock: check the time again (the window left is the write's own request;
        # closing it would need a conditional write, an object generation precondition, which
        # fileio does not make)
        why = why or self._late()
        if why is None:
          self._write()
          self.confirmed = t
      except Exception as e:  # a transient store error: the lease survives a missed renewal
        log.warning("could not renew the workdir lock %s (%s: %s)", self.path, type(e).__name__, e)
      if why:
        self._lose(why)
        return

  def release(self) -> None:
    self._stop.set()
    self._thread.join()
    h = self._read()
    if h is not None and h.get("token") == self.me["token"]:
      fileio.path(self.path).unlink(missing_ok=True)
