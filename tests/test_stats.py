"""Normalisation statistics: the torch-free .pth reader against .npy and against torch itself."""

import logging
import pathlib
import pickle
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from cdeit_jax.data import stats

ASSETS = "cdeit_jax/assets"
REPO = pathlib.Path(__file__).parent.parent


def test_pth_equals_npy():
  for name in ("mean", "std"):
    a = stats.read_pth_tensor(f"{ASSETS}/{name}.pth")
    b = np.load(f"{ASSETS}/{name}.npy")
    assert a.dtype == np.float32 and a.shape == (1, 16, 13)
    np.testing.assert_array_equal(a, b)


def test_pth_of_strided_tensor_matches_torch(tmp_path):
  torch = pytest.importorskip("torch")
  t = torch.arange(60, dtype=torch.float64).reshape(3, 20)[:, 2:15].t()  # offset + strides
  torch.save(t, tmp_path / "x.pth")
  np.testing.assert_array_equal(stats.read_pth_tensor(str(tmp_path / "x.pth")), t.numpy())


def test_pth_with_code_is_refused(tmp_path):
  class Evil:
    def __reduce__(self):
      return (print, ("pwned",))

  path = tmp_path / "evil.pth"
  with zipfile.ZipFile(path, "w") as z:
    z.writestr("evil/data.pkl", pickle.dumps(Evil(), protocol=2))
  with pytest.raises(ValueError, match="refusing to load .*print"):
    stats.read_pth_tensor(str(path))


def test_bad_stats_are_named(tmp_path):
  np.save(tmp_path / "mean.npy", np.zeros((1, 16, 12), np.float32))
  np.save(tmp_path / "std.npy", np.ones((1, 16, 13), np.float32))
  with pytest.raises(ValueError, match=r"mean has shape \(1, 16, 12\)"):
    stats.load_stats(str(tmp_path))
  np.save(tmp_path / "mean.npy", np.zeros((1, 16, 13), np.float32))
  np.save(tmp_path / "std.npy", np.zeros((1, 16, 13), np.float32))
  with pytest.raises(ValueError, match="std has 208 entries <= 0"):
    stats.load_stats(str(tmp_path))
  (tmp_path / "empty").mkdir()
  with pytest.raises(FileNotFoundError, match="no mean.npy/std.npy"):
    stats.load_stats(str(tmp_path / "empty"))
  (tmp_path / "junk.pth").write_bytes(b"junk")
  with pytest.raises(ValueError, match="junk.pth: not a PyTorch zip archive"):
    stats.read_pth_tensor(str(tmp_path / "junk.pth"))


def _crafted_pth(path, *, numel, offset, size, stride, stored=None):
  """A .pth archive written opcode by opcode (no torch): one FloatStorage of `numel` declared
  elements (`stored` actually present) and a tensor header (offset, size, stride) over it."""
  import struct

  def text(s):
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b

  def integer(v):
    return b"J" + struct.pack("<i", v)

  def ints(vs):
    return b"(" + b"".join(integer(v) for v in vs) + b"t"

  pid = (
    b"("
    + text("storage")
    + b"ctorch\nFloatStorage\n"
    + text("0")
    + text("cpu")
    + integer(numel)
    + b"tQ"
  )
  pkl = (
    b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n("
    + pid
    + integer(offset)
    + ints(size)
    + ints(stride)
    + b"\x89ccollections\nOrderedDict\n)Rt"
    + b"R."
  )
  stored = numel if stored is None else stored
  with zipfile.ZipFile(path, "w") as z:
    z.writestr("x/data.pkl", pkl)
    z.writestr("x/byteorder", "little")
    z.writestr("x/data/0", np.arange(1, stored + 1, dtype="<f4").tobytes())
  return str(path)


def test_crafted_pth_headers_are_refused_before_reading(tmp_path):
  # The honest form of the format reads back (an independent check of the hand-written opcodes).
  ok = _crafted_pth(tmp_path / "ok.pth", numel=6, offset=1, size=(2, 2), stride=(1, 2))
  np.testing.assert_array_equal(stats.read_pth_tensor(ok), [[2, 4], [3, 5]])
  # Size/stride running far past a one-float storage (this crashed the process before).
  far = _crafted_pth(tmp_path / "far.pth", numel=1, offset=0, size=(16, 13), stride=(10**7, 10**6))
  with pytest.raises(ValueError, match=r"far.pth: tensor of size \(16, 13\).*reaches element"):
    stats.read_pth_tensor(far)
  # A small overshoot (read a few floats past the buffer).
  near = _crafted_pth(tmp_path / "near.pth", numel=4, offset=2, size=(3,), stride=(1,))
  with pytest.raises(ValueError, match="near.pth: .*reaches element 4 of a storage of 4"):
    stats.read_pth_tensor(near)
  neg = _crafted_pth(tmp_path / "neg.pth", numel=4, offset=0, size=(2,), stride=(-1,))
  with pytest.raises(ValueError, match="neg.pth: negative offset, size or stride"):
    stats.read_pth_tensor(neg)
  short = _crafted_pth(
    tmp_path / "short.pth", numel=208, offset=0, size=(208,), stride=(1,), stored=1
  )
  with pytest.raises(ValueError, match="short.pth: storage 'x/data/0' holds 4 bytes, not the 208"):
    stats.read_pth_tensor(short)


def test_transposed_stats_are_refused():
  mean = np.zeros((13, 16), np.float32)
  with pytest.raises(ValueError, match=r"mean has shape \(13, 16\).*16 current injections"):
    stats.check_stats(mean, np.ones((1, 16, 13), np.float32))
  m, s = stats.check_stats(np.zeros(208), np.ones((16, 13)))
  assert m.shape == s.shape == stats.STATS_SHAPE


def test_running_statistics_of_any_cut_equal_numpy():
  """One pass over batches of any sizes (single examples, batches, one batch) gives numpy's
  two-pass float64 mean and std (N-1)."""
  from cdeit_jax.eit import measurement

  rng = np.random.default_rng(0)
  ys = 3e-4 + 1e-5 * rng.standard_normal((37, 208))  # tank-like: a large mean, a small spread
  want_mean, want_std = ys.mean(0), ys.std(0, ddof=1)
  for cuts in ([37], [1] * 37, [5, 1, 1, 20, 10], [2, 35]):
    running, lo = measurement.RunningStats(), 0
    for n in cuts:
      running.add(ys[lo : lo + n] * 2.0, voltage_ratio=2.0)
      lo += n
    mean, std = running.result()
    assert mean.shape == std.shape == (1, 16, 13) and mean.dtype == np.float32
    np.testing.assert_allclose(mean.ravel(), want_mean, rtol=1e-6)
    np.testing.assert_allclose(std.ravel(), want_std, rtol=1e-5)
  with pytest.raises(ValueError, match="a std .N-1. needs at least 2"):
    measurement.RunningStats().result()


def test_stats_command_on_a_bad_folder_is_one_line(tmp_path):
  d = tmp_path / "train"
  d.mkdir()
  (d / "junk.npz").write_bytes(b"not a zip")
  np.savez(d / "a.npz", ys=np.ones((208, 1)), xs=np.zeros((128, 128)))
  np.savez(d / "b.npz", ys=np.full((208, 1), 2.0), xs=np.zeros((128, 128)))
  run = lambda *a: subprocess.run(
    [sys.executable, "-m", "cdeit_jax.voltage_stats", str(d), *a],
    capture_output=True,
    text=True,
    cwd=REPO,
  )
  r = run()
  assert r.returncode == 1 and "Traceback" not in r.stderr
  assert "junk.npz: not a readable npz" in r.stderr and "--skip_bad_files" in r.stderr
  r = run("--skip_bad_files", "--out", str(tmp_path / "stats"))
  assert r.returncode == 0, r.stderr
  np.testing.assert_allclose(np.load(tmp_path / "stats" / "mean.npy"), 1.5)
  (tmp_path / "a_file").write_text("")
  r = run("--skip_bad_files", "--out", str(tmp_path / "a_file" / "stats"))
  assert r.returncode == 1 and "Traceback" not in r.stderr
  assert f"--out {tmp_path / 'a_file' / 'stats'}: cannot write there" in r.stderr


# ----------------------------------------------------------------------------- which statistics


def _folder(root, mean, std, ext=".npy"):
  """A dataset folder in the authors' layout: ROOT/test/ (the split) and ROOT/mean, ROOT/std."""
  (root / "test").mkdir(parents=True)
  for name, a in (("mean", mean), ("std", std)):
    np.save(root / f"{name}{ext}", a)
  return str(root / "test")


def _digest(mean, std):
  import hashlib

  return hashlib.sha256(
    np.asarray(mean, "<f4").tobytes() + np.asarray(std, "<f4").tobytes()
  ).hexdigest()


def test_a_checkpoints_statistics_win_over_the_data_folders_and_those_are_named(tmp_path, caplog):
  """The authors' layout (mean/std beside the split folder) with a checkpoint: the checkpoint's
  are used, the folder's named with the flag that would use them; no checkpoint (a new
  training): the folder's, said in the log; given ones win over both."""
  mean, std = stats.authors_stats()
  other = (mean + 1.0, std * 2.0)
  split = _folder(tmp_path / "data", *other)
  with caplog.at_level(logging.INFO, logger="cdeit_jax.data.stats"):
    got = stats.resolve_stats(split, None, (mean, std))
  np.testing.assert_array_equal(got.mean, mean)
  np.testing.assert_array_equal(got.std, std)
  assert got.record() == {"source": "checkpoint", "files": None, "sha256": _digest(mean, std)}
  (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
  root = str(tmp_path / "data")
  assert f"{root}/mean.npy and {root}/std.npy differ" in warning
  assert f"--config.eval.stats={root}" in warning
  # the same values beside the data: nothing to say
  caplog.clear()
  same = _folder(tmp_path / "same", mean, std)
  with caplog.at_level(logging.INFO, logger="cdeit_jax.data.stats"):
    assert stats.resolve_stats(same, None, (mean, std)).source == "checkpoint"
  assert not caplog.records
  # a new training: the data folder's, stated
  with caplog.at_level(logging.INFO, logger="cdeit_jax.data.stats"):
    got = stats.resolve_stats(split, None, None)
  np.testing.assert_array_equal(got.mean, other[0].astype(np.float32))
  assert got.source == root and got.files == (f"{root}/mean.npy", f"{root}/std.npy")
  assert got.digest() == _digest(*other)
  assert "the data folder's" in caplog.records[-1].getMessage()
  # given: a folder, "authors", arrays; the data folder's then never looked at
  assert stats.resolve_stats(split, root, (mean, std)).source == root
  assert stats.resolve_stats(split, "authors", None).digest() == _digest(mean, std)
  assert stats.resolve_stats(None, other, (mean, std)).source == "given"
  # a frames file (no folder): the checkpoint's
  assert stats.resolve_stats(None, None, (mean, std)).source == "checkpoint"


def test_unreadable_statistics_beside_the_data_do_not_stop_an_evaluation(tmp_path, caplog):
  mean, std = stats.authors_stats()
  split = _folder(tmp_path / "data", mean[..., :12], std[..., :12])
  with caplog.at_level(logging.WARNING, logger="cdeit_jax.data.stats"):
    assert stats.resolve_stats(split, None, (mean, std)).source == "checkpoint"
  assert "mean has shape (1, 16, 12)" in caplog.records[-1].getMessage()
  with pytest.raises(ValueError, match=r"mean has shape \(1, 16, 12\)"):
    stats.resolve_stats(split, None, None)  # a training has nothing else: refused
