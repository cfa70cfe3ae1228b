"""The path layer's guarantees: atomic writes leave nothing half-written, a full disk is recognised
under the errors libraries wrap it in; MAT-files written in place read back with scipy."""

import errno
import os
import re

import numpy as np
import pytest

from cdeit_jax.common import compat, fileio, matfile
from cdeit_jax.common.errors import InputError


def test_a_failed_atomic_write_leaves_the_old_file_and_no_temporary(tmp_path):
  target = tmp_path / "out.bin"
  target.write_bytes(b"old")

  def half_then_full(tmp):
    with open(tmp, "wb") as fh:
      fh.write(b"half")
    raise OSError(errno.ENOSPC, "No space left on device")

  with pytest.raises(fileio.DiskFull, match=f"no space left on the device of {tmp_path}: "):
    fileio.atomic_write(str(target), half_then_full)
  assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["out.bin"]

  def broken(tmp):
    with open(tmp, "wb") as fh:
      fh.write(b"half")
    raise RuntimeError("a bug")

  with pytest.raises(RuntimeError, match="a bug"):  # not ours: the error as it was
    fileio.atomic_write(str(target), broken)
  assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["out.bin"]


def _raised(make):
  try:
    make()
  except BaseException as e:  # noqa: BLE001
    return e


def test_a_full_disk_is_found_inside_wrapped_errors():
  def wrapped():
    try:
      raise OSError(errno.ENOSPC, "No space left on device")
    except OSError as e:
      raise RuntimeError("saving failed") from e

  def during():
    try:
      raise ValueError(
        'INTERNAL: Error writing local file "/x/ocdbt.process_0/d/1": '
        "No space left on device [os_error='No space left on device']"
      )
    except ValueError:
      raise RuntimeError("while handling it, this")  # noqa: B904

  grouped = lambda: (_ for _ in ()).throw(
    ExceptionGroup("saves", [KeyError("k"), _raised(wrapped)])
  )
  for make in (wrapped, during, grouped):
    assert compat.is_disk_full(_raised(make)), make
  assert not compat.is_disk_full(
    _raised(lambda: (_ for _ in ()).throw(OSError(errno.EACCES, "denied")))
  )
  assert not compat.is_disk_full(ValueError("no space for this argument"))


def test_mat_arrays_written_in_place_read_back(tmp_path):
  """Rows in any order, two matrices, small variables beside (a number, a cell of text, an empty
  array): a MATLAB v7.3 file that a second reader (mat73) and our own read back as written,
  with MATLAB's header; a v7.3 file from another writer (hdf5storage) reads as it was saved."""
  import hdf5storage
  import mat73

  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((7, 5, 3)), rng.standard_normal((7, 4))
  path = str(tmp_path / "m.mat")
  w = matfile.Writer(path, {"a": a.shape, "b": b.shape}, {"scale": 0.5})
  for lo, hi in ((3, 7), (0, 3)):
    w.write("a", lo, a[lo:hi])
  w.write("b", 0, b)
  w.close({"names": np.asarray(["x", "yy"], dtype=object), "none": np.zeros(0)})
  with open(path, "rb") as fh:
    assert fh.read(19) == b"MATLAB 7.3 MAT-file"
  m = mat73.loadmat(path)
  np.testing.assert_array_equal(m["a"], a)
  np.testing.assert_array_equal(m["b"], b)
  assert m["scale"] == 0.5 and m["names"] == ["x", "yy"] and m["none"] is None
  ours = matfile.read(path)  # numbers only, as MATLAB shapes them
  np.testing.assert_array_equal(ours["a"], a)
  assert ours["scale"].shape == (1, 1) and ours["none"].size == 0 and "names" not in ours
  c = rng.standard_normal((4, 6))
  hdf5storage.savemat(str(tmp_path / "c.mat"), {"c": c, "v": c[0]}, format="7.3")
  got = matfile.read(str(tmp_path / "c.mat"))
  np.testing.assert_array_equal(got["c"], c)
  np.testing.assert_array_equal(got["v"], c[:1])  # a vector is a row, as MATLAB's


def test_a_bucket_without_credentials_is_one_line_before_any_work(tmp_path):
  """eval.py on a gs:// workdir with no Google credentials anywhere (no key file, no gcloud
  login, no local GCS server): one line naming the flag and what to do, not a minute of retries
  and tracebacks."""
  import subprocess
  import sys

  env = {
    k: v
    for k, v in os.environ.items()
    if k
    not in ("GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL")
  }
  env["HOME"] = str(tmp_path)  # no gcloud application-default credentials there
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  r = subprocess.run(
    [
      sys.executable,
      "eval.py",
      "--workdir",
      "gs://no-bucket/run",
      "--data",
      "uef2017",
      "--data_path",
      "data/uef2017",
      "--out",
      str(tmp_path / "out"),
    ],
    capture_output=True,
    text=True,
    cwd=repo,
    env=env,
    timeout=120,
  )
  assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
  assert r.stderr.count("error:") == 1
  assert "--workdir gs://no-bucket/run: no Google credentials for gs://" in r.stderr
  assert "gcloud auth application-default login" in r.stderr


def test_progress_is_log_lines_where_stderr_is_not_a_terminal(caplog, monkeypatch):
  """Not a terminal (a log file, a pipe): lines through the project's logger, at most one per
  interval and one at the end, with the count, the rate and the postfix that tqdm would show
  (both of tqdm's forms of set_postfix)."""
  import logging

  from cdeit_jax.common import logs

  monkeypatch.setattr("sys.stderr.isatty", lambda: False)
  with caplog.at_level(logging.INFO, logger="cdeit_jax"):
    with logs.progress(10, "simulating", "example") as bar:
      bar.every = 0.0  # every update says a line
      bar.update(4)
      bar.set_postfix(examples_per_s="2.0")
      bar.set_postfix({"loss": "0.1"}, refresh=False)
      bar.update(6)
  lines = [r.getMessage() for r in caplog.records if r.name == "cdeit_jax"]
  assert lines[0].startswith("simulating: 4/10 examples (") and "examples/s" in lines[0]
  assert lines[1].startswith("simulating: 10/10 examples") and lines[1].endswith(", loss=0.1)")


def test_numpy_files_decode_alike_from_paths_bytes_and_many_threads(tmp_path):
  """`load_numpy` gives a .npy's array and a .npz's arrays (or the named ones present) from a path
  or the file's bytes; 8 threads decoding at once under its lock get the written arrays. (The
  race the lock guards against, CPython < 3.13's `ast` under numpy's header parser, is rare: 20,000
  unlocked loads in 8 threads did not hit it here, so this test cannot show it.)"""
  import concurrent.futures

  rng = np.random.default_rng(0)
  arrays = {"ys": rng.normal(size=(208, 1)).astype(np.float32), "xs": rng.normal(size=(128, 128))}
  np.savez(tmp_path / "a.npz", **arrays)
  np.save(tmp_path / "b.npy", arrays["xs"])
  z = fileio.load_numpy(str(tmp_path / "a.npz"))
  assert sorted(z) == ["xs", "ys"] and all(np.array_equal(z[k], arrays[k]) for k in z)
  assert list(fileio.load_numpy((tmp_path / "a.npz").read_bytes(), ["ys", "TR"])) == ["ys"]
  np.testing.assert_array_equal(fileio.load_numpy((tmp_path / "b.npy").read_bytes()), arrays["xs"])
  with pytest.raises(ValueError, match="a single .npy array, not an .npz archive"):
    fileio.load_npz(str(tmp_path / "b.npy"))
  with pytest.raises(ValueError, match="an .npz archive of named arrays, not one .npy array"):
    fileio.load_npy((tmp_path / "a.npz").read_bytes())
  np.testing.assert_array_equal(fileio.load_npy(str(tmp_path / "b.npy")), arrays["xs"])

  def read(i):
    z = fileio.load_numpy(str(tmp_path / ("a.npz" if i % 2 else "b.npy")))
    return np.array_equal(z["ys"], arrays["ys"]) if i % 2 else np.array_equal(z, arrays["xs"])

  with concurrent.futures.ThreadPoolExecutor(8) as pool:
    assert all(pool.map(read, range(800)))


def _specials(folder):
  """{what: path} of the kinds of path that are not regular files, made in `folder`: a FIFO, a
  socket, a folder, and a character device where this process may make one (root: mknod, with
  /dev/null's numbers; /dev's own devices are never touched)."""
  import socket
  import stat

  made = {"a named pipe (FIFO)": folder / "fifo", "a folder": folder / "dir"}
  os.mkfifo(made["a named pipe (FIFO)"])
  made["a folder"].mkdir()
  sock = socket.socket(socket.AF_UNIX)
  sock.bind(str(folder / "sock"))
  sock.close()
  made["a socket"] = folder / "sock"
  try:
    os.mknod(folder / "chr", 0o644 | stat.S_IFCHR, os.makedev(1, 3))
    made["a character device"] = folder / "chr"
  except PermissionError:  # not root: the other kinds still make the case
    pass
  return made


def _state(p):
  st = os.lstat(p)
  return st.st_mode, st.st_rdev, st.st_ino, st.st_size


@pytest.mark.parametrize("via", ["atomic_write", "write_text", "output_file"])
def test_writers_write_regular_files_only(tmp_path, via):
  """The one mechanism under every writer: a device, a FIFO, a socket or a folder where a file
  is to be written is refused in one line naming it and its kind, and is left as it was (a
  rename would have replaced any of them, /dev/full included); no temporary file is left."""
  specials = _specials(tmp_path)
  for what, p in specials.items():
    before = _state(p)
    with pytest.raises(InputError, match=re.escape(f"{p}: is {what}: cdeit-jax writes")) as e:
      if via == "atomic_write":
        fileio.atomic_write(str(p), lambda tmp: open(tmp, "wb").write(b"x"))
      elif via == "write_text":
        fileio.write_text(str(p), "x")
      else:
        fileio.output_file(str(p), "--out")
    assert "\n" not in str(e.value) and _state(p) == before, what
  assert sorted(q.name for q in tmp_path.iterdir()) == sorted(p.name for p in specials.values())


def test_an_output_file_replaces_only_what_the_command_wrote(tmp_path):
  """`ours` says which existing file a command may replace (a model file over a model file):
  any other is refused in one line before any work and at the publish, and kept; a new file, or
  one `ours` recognises, is written; a link at the path, a missing or unwritable folder are
  refused in one line."""
  ours = lambda p: open(p).read().startswith("ours")
  mine, theirs = tmp_path / "mine.txt", tmp_path / "theirs.txt"
  mine.write_text("ours 1")
  theirs.write_text("precious")
  fileio.output_file(str(mine), "--out", ours, "a test file")
  fileio.output_file(str(tmp_path / "new.txt"), "--out", ours, "a test file")
  fileio.write_text(str(mine), "ours 2", ours=ours, what="a test file")
  assert mine.read_text() == "ours 2"
  refusal = f"--out {theirs}: is a file that cdeit-jax did not write as a test file"
  with pytest.raises(InputError, match=refusal):
    fileio.output_file(str(theirs), "--out", ours, "a test file")
  with pytest.raises(InputError, match="did not write as a test file"):
    fileio.write_text(str(theirs), "ours", ours=ours, what="a test file")
  with pytest.raises(InputError, match="did not write"):  # without `ours`: no file is replaced
    fileio.output_file(str(mine), "--out")
  assert theirs.read_text() == "precious"
  (tmp_path / "link.txt").symlink_to(theirs)
  for p, words in (
    (tmp_path / "link.txt", "is a symbolic link"),
    (tmp_path / "no" / "such" / "x.txt", f"its folder {tmp_path / 'no' / 'such'} does not exist"),
    (theirs / "x.txt", f"is under {theirs}, which is not a folder"),
    ("/proc/x.txt", "its folder /proc cannot be written"),
  ):
    with pytest.raises(InputError, match=words):
      fileio.output_file(str(p), "--out", ours, "a test file")
  fileio.output_file(str(tmp_path / "no" / "x.txt"), "--out", ours, makes_folder=True)
  assert not (tmp_path / "no").exists() and theirs.read_text() == "precious"


def test_an_output_folder_is_a_folder_or_a_new_path(tmp_path):
  """A folder output (reconstruct's, simulate's, ship's, translate's ...) given a device, a
  FIFO, a socket or a file is refused in one line before any work, the path left as it was; a
  folder or a new path passes, and nothing is made."""
  (tmp_path / "file").write_text("precious")
  specials = {**_specials(tmp_path), "a file": tmp_path / "file"}
  for what, p in specials.items():
    before = _state(p)
    if what == "a folder":
      fileio.output_folder(str(p), "--out")
      continue
    with pytest.raises(InputError, match=f"--out {p}: exists and is not a folder"):
      fileio.output_folder(str(p), "--out")
    assert _state(p) == before, what
  fileio.output_folder(str(tmp_path / "new"), "--out")
  assert not (tmp_path / "new").exists() and (tmp_path / "file").read_text() == "precious"
