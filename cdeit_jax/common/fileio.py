"""One path layer for every file the commands read or write: local paths and object-store URLs
(`gs://bucket/...`) alike, through etils.epath (the layer orbax uses; gs:// goes through gcsfs).

Outputs are never half-written on either: a local file is written under a temporary name and
renamed; an object is uploaded in one request, and an object store shows an object only once its
upload has finished (a killed upload leaves nothing), so nothing half-written ever appears under
its final name. Objects cannot be appended to, so an append-only log on an object store is
rewritten whole, in the background (`AppendLog`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import io
import logging
import os
import pathlib
import secrets
import shutil
import stat
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence

import fsspec.config
import fsspec.core
import numpy as np
from etils import epath

from cdeit_jax.common.errors import CdeitError, InputError

PathLike = str | os.PathLike

log = logging.getLogger("cdeit_jax.common.fileio")

# gcsfs caches directory listings forever by default, so objects written by another process (the
# other hosts, the run before a resume) stay unseen and deleted ones stay listed: checkpoint steps
# would be missed or "found". Listings here are few (folders, checkpoint steps): never cache them.
for _protocol in ("gs", "gcs"):
  fsspec.config.conf.setdefault(_protocol, {}).setdefault("use_listings_cache", False)


def is_remote(p: PathLike) -> bool:
  """Whether `p` is a URL (gs://..., any fsspec scheme) rather than a local path."""
  return "://" in os.fspath(p)


def resolve(p: PathLike) -> str:
  """An absolute local path (`~` expanded), or the URL as given without a trailing slash."""
  s = os.fspath(p)
  return s.rstrip("/") if is_remote(s) else os.path.abspath(os.path.expanduser(s))


def path(p: PathLike) -> epath.Path:
  """`p` (resolved) as an epath.Path: exists(), is_dir(), iterdir(), read_bytes(), mkdir()..."""
  return epath.Path(resolve(p))


def join(base: PathLike, *parts: str) -> str:
  return os.fspath(epath.Path(os.fspath(base)).joinpath(*parts))


def dirname(p: PathLike) -> str:
  return os.fspath(path(p).parent)


def basename(p: PathLike) -> str:
  return path(p).name


def makedirs(p: PathLike) -> None:
  """Create a local folder and its parents (object stores have no folders: nothing to do)."""
  if not is_remote(p):
    os.makedirs(resolve(p), exist_ok=True)


def _is_link_message(p: str) -> str:
  return (
    f"{p} is a symbolic link: cdeit-jax writes no file through a link (whatever it points to "
    "would be changed); remove the link"
  )


def open_nofollow(p: PathLike, flags: int, mode: int = 0o644) -> int:
  """`os.open` of a local file, refusing a symbolic link as its last component (O_NOFOLLOW):
  a file in a shared folder is never written through a link planted there (an InputError
  naming it)."""
  p = resolve(p)
  try:
    return os.open(p, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
  except OSError as e:
    if e.errno == errno.ELOOP and os.path.islink(p):
      raise InputError(_is_link_message(p)) from None
    raise


def refuse_link(p: PathLike) -> None:
  """An InputError when local path `p` is a symbolic link (for files a library opens itself)."""
  if not is_remote(p) and os.path.islink(resolve(p)):
    raise InputError(_is_link_message(resolve(p)))


def real(p: PathLike) -> str:
  """`p` resolved: a local path through its symbolic links (the part that exists), or the URL
  as given."""
  return resolve(p) if is_remote(p) else os.path.realpath(resolve(p))


def within(inner: str, outer: str) -> bool:
  """Whether path `inner` is `outer` or lies below it (both resolved alike)."""
  return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def refuse_own_input(
  out: PathLike,
  flag: str,
  inputs: Sequence[tuple[str, PathLike | None]],
  writes: Sequence[str] | None = None,
) -> None:
  """The one check that no command's output replaces its own input: `out` (given as `flag`) is
  refused in one line, before any work, when it is one of `inputs` ((what, path) pairs, e.g.
  ("--device", D); None skipped), lies inside one, or holds one: anywhere below it when the
  command replaces or fills `out` whole (`writes` None), else at one of the paths `writes`
  (inside `out`) it writes. Links resolved (a hard link to the same file too); reads and makes
  nothing."""
  o = real(out)
  for what, given in inputs:
    if given is None:
      continue
    i = real(given)
    same = o == i or (
      not is_remote(o) and os.path.exists(o) and os.path.exists(i) and os.path.samefile(o, i)
    )
    if same:
      where = "is"
    elif within(o, i):
      where = "lies inside"
    elif writes is None and within(i, o):
      where = "contains"
    elif writes is not None and any(i == join(o, w) for w in writes):
      where = f"would replace, as {basename(i)},"
    else:
      continue
    raise InputError(
      f"{flag} {out} {where} {what} ({given}): a command's output never replaces or mixes "
      f"with its own input; give another {flag}"
    )


def files_below(p: PathLike) -> list[str]:
  """Every file below folder `p` (local or a bucket's), as sorted '/'-joined paths relative to
  it; [] where there is no such folder."""
  root = path(p)
  if not root.is_dir():
    return []
  found = []

  def walk(folder, prefix: str) -> None:
    for q in folder.iterdir():
      if q.is_dir():
        walk(q, f"{prefix}{q.name}/")
      else:
        found.append(f"{prefix}{q.name}")

  walk(root, "")
  return sorted(found)


def output_folder(p: PathLike, flag: str) -> None:
  """An InputError naming `flag` when output folder `p` exists and is not a folder (a file, a
  device, a FIFO, a socket); reads and makes nothing."""
  if (path(p).exists() or os.path.lexists(resolve(p))) and not path(p).is_dir():
    raise InputError(f"{flag} {p}: exists and is not a folder; give a folder path")


def writable_folder(p: PathLike, flag: str) -> None:
  """Create folder `p` if needed and check that files can be written there; an InputError
  naming `flag` (e.g. "--workdir") when `p` is a file, read-only or cannot be created."""
  output_folder(p, flag)
  folder = path(p)
  try:
    makedirs(p)
    if is_remote(p):
      probe = folder / f".write-test-{os.getpid()}"
      probe.write_text("")
      probe.unlink()
    else:  # an exclusive create: never through a link planted under a predictable name
      fd, probe = tempfile.mkstemp(prefix=".write-test-", dir=resolve(p))
      os.close(fd)
      os.unlink(probe)
  except OSError as e:
    raise InputError(
      f"{flag} {p}: cannot write there ({e.strerror or e}); give a writable folder"
    ) from (e if is_remote(p) else None)


def move(src: PathLike, dst: PathLike) -> None:
  """Move a file or folder to `dst` (whose parent is created): a rename when local; on an object
  store a copy, then a delete, of every object (epath's rename refuses there, as a destination
  "folder" exists only once something is in it; gcsfs's own mv tries GCS's moveTo first, which
  local GCS servers lack, and retries it for seconds per object before copying anyway)."""
  src, dst = resolve(src), resolve(dst)
  if not is_remote(src):
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    os.rename(src, dst)
    return
  fs, _ = fsspec.core.url_to_fs(src)
  fs.copy(src, dst, recursive=True)
  fs.rm(src, recursive=True)


def remove_tree(p: PathLike) -> None:
  """Remove a folder and everything in it, if it exists (local or object store)."""
  p = resolve(p)
  if not is_remote(p):
    shutil.rmtree(p, ignore_errors=True)
    return
  fs, _ = fsspec.core.url_to_fs(p)
  if fs.exists(p):
    fs.rm(p, recursive=True)


def open_binary(p: PathLike) -> io.BufferedIOBase:
  """A seekable binary reader: a local file, or the whole object read in one request."""
  if not is_remote(p):
    return open(resolve(p), "rb")
  return io.BytesIO(path(p).read_bytes())


# numpy parses .npy headers with ast.literal_eval, which is not thread-safe before CPython 3.13
# ("SystemError: AST constructor recursion depth mismatch": seen on 3.11.7 when a test read an
# npz while grain's reader threads read others). Every numpy file this package reads is decoded
# here, under one lock; worker processes (num_workers) are unaffected.
_NUMPY_LOCK = threading.Lock() if sys.version_info < (3, 13) else contextlib.nullcontext()


def numpy_lock():
  """The lock that every numpy header parse of this package holds (above)."""
  return _NUMPY_LOCK


def load_numpy(
  source: PathLike | bytes, keys: Sequence[str] | None = None
) -> np.ndarray | dict[str, np.ndarray]:
  """A .npy's array or a .npz's arrays (all, or `keys` where present; a path, or the file's
  bytes), fully decoded under the lock.

  numpy's own errors (ValueError, OSError, EOFError, zipfile.BadZipFile) pass through for the
  caller to name its file and field.
  """
  fh = io.BytesIO(source) if isinstance(source, bytes) else open_binary(source)
  with fh, _NUMPY_LOCK:
    loaded = np.load(fh, allow_pickle=False)
    if isinstance(loaded, np.ndarray):
      return loaded
    with loaded as z:
      return {k: z[k] for k in (z.files if keys is None else [k for k in keys if k in z.files])}


def load_npz(source: PathLike | bytes, keys: Sequence[str] | None = None) -> dict[str, np.ndarray]:
  """`load_numpy` of a file that must be an .npz archive (ValueError for a single .npy array)."""
  z = load_numpy(source, keys)
  if not isinstance(z, dict):
    raise ValueError("a single .npy array, not an .npz archive of named arrays")
  return z


def load_npy(source: PathLike | bytes) -> np.ndarray:
  """`load_numpy` of a file that must be one .npy array (ValueError for an .npz archive)."""
  a = load_numpy(source)
  if isinstance(a, dict):
    raise ValueError("an .npz archive of named arrays, not one .npy array: name it .npz")
  return a


class DiskFull(CdeitError, OSError):
  """No space left where an output goes (one line naming the folder)."""


def no_space(where: str, what: str = "nothing was half-written there") -> DiskFull:
  """The one-line error for a full disk under `where`."""
  err = DiskFull(
    f"no space left on the device of {where}: free some space or write somewhere else ({what})"
  )
  err.errno = errno.ENOSPC
  return err


# What a path holds, in words, for the kinds of file that are not regular files (`lstat`'s mode).
_KINDS = (
  (stat.S_ISDIR, "a folder"),
  (stat.S_ISCHR, "a character device"),
  (stat.S_ISBLK, "a block device"),
  (stat.S_ISFIFO, "a named pipe (FIFO)"),
  (stat.S_ISSOCK, "a socket"),
)


def _not_a_file(p: str) -> str | None:
  """What local path `p` is when it exists and is neither a regular file nor a symbolic link
  (which a rename replaces, never what it points to), else None."""
  try:
    mode = os.lstat(p).st_mode
  except (FileNotFoundError, NotADirectoryError):
    return None
  if stat.S_ISREG(mode) or stat.S_ISLNK(mode):
    return None
  return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def _target_problem(p: str, ours: Callable[[str], bool] | None) -> str | None:
  """Why a file may not be published at `p` (resolved): it is not a regular file or a missing
  path, or it is an existing file that `ours` (a test that this project wrote it) refuses;
  None when it may."""
  if is_remote(p):
    return None if ours is None or not path(p).exists() or ours(p) else "ours"
  kind = _not_a_file(p)
  if kind is not None:
    return kind
  if ours is not None and os.path.isfile(p) and not os.path.islink(p) and not ours(p):
    return "ours"
  return None


def _refusal(p: str, flag: str | None, problem: str, what: str) -> InputError:
  named = f"{flag} {p}" if flag else p
  if problem == "ours":
    return InputError(
      f"{named}: is a file that cdeit-jax did not write as {what}; it is never replaced (move it "
      "away, or give another path)"
    )
  return InputError(
    f"{named}: is {problem}: cdeit-jax writes {what} as a regular file only; give a file path"
  )


def output_file(
  p: PathLike,
  flag: str,
  ours: Callable[[str], bool] | None = None,
  what: str = "this output",
  *,
  makes_folder: bool = False,
) -> None:
  """The one check of a command's output file (`flag`, e.g. "--out"), before any work: refused
  in one line when `p` is anything but a regular file or a missing path (a folder, a device, a
  FIFO, a socket: as `atomic_write` refuses it), a symbolic link, a file in a folder that is
  missing or cannot be written, or an existing file that `ours` does not recognise as one this
  project writes there (`what`, e.g. "a model file"; None: no existing file is replaced).
  `makes_folder`: the command makes a missing folder (the nearest one there is must then be
  writable). Leaves nothing behind."""
  p = resolve(p)
  problem = _target_problem(p, ours if ours is not None else (lambda _: False))
  if problem is not None:
    raise _refusal(p, flag, problem, what)
  if is_remote(p):
    return
  if os.path.islink(p):
    raise InputError(_is_link_message(p))
  folder = above = os.path.dirname(p)
  while not os.path.exists(above):
    above = os.path.dirname(above)
  if not os.path.isdir(above) or (above != folder and not makes_folder):
    why = "does not exist" if os.path.isdir(above) else f"is under {above}, which is not a folder"
    raise InputError(
      f"{flag} {p}: its folder {folder} {why}; make the folder first (mkdir -p), or give "
      "another path"
    )
  folder = above
  try:  # a probe, as `writable_folder`'s (root may write where the mode bits say not)
    fd, probe = tempfile.mkstemp(prefix=".write-test-", dir=folder)
    os.close(fd)
    os.unlink(probe)
  except OSError as e:
    raise InputError(
      f"{flag} {p}: its folder {folder} cannot be written ({e.strerror or e}); give another path"
    ) from None


def atomic_write(
  p: PathLike,
  write: Callable[[str], object],
  *,
  ours: Callable[[str], bool] | None = None,
  what: str = "this output",
) -> None:
  """Call write(tmp) with a local temporary file name, then publish that file as `p`: renamed in
  the same folder (local), or uploaded in one request (object store). Only a regular file or a
  missing path is replaced (a folder, a device, a FIFO, a socket is refused before anything is
  written, and again just before the rename), and with `ours`, an existing file only if `ours`
  says this project wrote it (`what` names it; `output_file` is the same check before a
  command's work). The temporary file is removed on any failure; a full disk is a `DiskFull`
  naming the folder."""
  p = resolve(p)

  def check() -> None:
    problem = _target_problem(p, ours)
    if problem is not None:
      raise _refusal(p, None, problem, what)

  check()
  if not is_remote(p):
    # A fresh name made by an exclusive create (never an existing file or a link planted there;
    # `os.replace` then swaps a link at `p` itself, never what it points to), with the mode an
    # ordinary create gets (mkstemp's would be 0600).
    tmp = os.path.join(os.path.dirname(p), f".{os.path.basename(p)}.{secrets.token_hex(6)}.tmp")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666))
    try:
      write(tmp)
      check()
      os.replace(tmp, p)
    except BaseException as e:
      with contextlib.suppress(OSError):
        os.unlink(tmp)
      if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        raise no_space(os.path.dirname(p)) from None
      raise
    return
  with tempfile.TemporaryDirectory(prefix="cdeit-upload-") as d:
    tmp = os.path.join(d, os.path.basename(p))
    write(tmp)
    epath.Path(p).write_bytes(pathlib.Path(tmp).read_bytes())


def write_text(p: PathLike, text: str, **replaces) -> None:
  """Write `text` to `p` atomically (`replaces`: `atomic_write`'s `ours` and `what`)."""
  atomic_write(p, lambda t: pathlib.Path(t).write_text(text), **replaces)


def read_text(p: PathLike) -> str | None:
  """The text of `p`, or None if there is no such file (one request on an object store)."""
  try:
    return path(p).read_text()
  except FileNotFoundError:
    return None


def json_holds(p: PathLike, keys) -> bool:
  """Whether `p` is a JSON object holding every one of `keys` (a command's own output, which it
  may replace); False for a missing or unreadable file."""
  import json

  try:
    got = json.loads(read_text(p) or "")
  except (OSError, ValueError):
    return False
  return isinstance(got, dict) and set(keys) <= set(got)


class AppendLog:
  """A text log written in appends: a line-buffered local file, or an object store's object
  rewritten whole after each append by one background thread (so the caller never waits on the
  network; appends made during an upload go out in the next). `initial` is the text the log
  starts from, replacing what the file holds; None continues the file. close() waits for the
  last upload; a failed upload is logged as a warning and retried with the next append or
  close."""

  def __init__(self, p: PathLike, initial: str | None = None):
    self.path = resolve(p)
    self._remote = is_remote(self.path)
    if not self._remote:
      if initial is not None:
        write_text(self.path, initial)
      flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
      self._fh = os.fdopen(open_nofollow(self.path, flags), "a", buffering=1)
      return
    self._parts = [initial if initial is not None else read_text(self.path) or ""]
    self._lock = threading.Lock()
    self._dirty = self._busy = False
    self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="cdeit-upload")

  def write(self, text: str) -> None:
    if not self._remote:
      self._fh.write(text)
      return
    with self._lock:
      self._parts.append(text)
      self._dirty = True
      if self._busy:
        return
      self._busy = True
    self._pool.submit(self._drain)

  def _drain(self) -> None:
    while True:
      with self._lock:
        if not self._dirty:
          self._busy = False
          return
        text, self._dirty = "".join(self._parts), False
      try:
        write_text(self.path, text)
      except Exception as e:  # keep training; the next append or close() tries again
        log.warning("could not write %s (%s: %s); will retry", self.path, type(e).__name__, e)
        with self._lock:
          self._dirty, self._busy = True, False
        return

  def close(self) -> None:
    if not self._remote:
      self._fh.close()
      return
    self._pool.shutdown(wait=True)
    with self._lock:
      dirty = self._dirty
    if dirty:  # the last upload failed: one more try, and its error is the caller's
      write_text(self.path, "".join(self._parts))
