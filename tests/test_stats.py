"""Normalisation statistics: the torch-free .pth reader against .npy and against torch itself."""

import pickle
import zipfile

import numpy as np
import pytest

from cdeit_jax import stats

ASSETS = "cdeit_jax/assets"


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
