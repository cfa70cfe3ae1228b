"""infer.metrics: the image metrics against hand computations and independent implementations."""

import numpy as np
import pytest

from cdeit_jax.eit import phantom as ph
from cdeit_jax.eit.phantom import disk_mask
from cdeit_jax.infer import metrics

DISK = ph.disk_mask(128)


@pytest.fixture(scope="module")
def pair():
  rng = np.random.default_rng(0)
  gt = np.zeros((128, 128))
  gt[30:60, 40:80] = 1.0
  gt[80:100, 20:50] = -1.0
  pred = np.clip(gt * 0.7 + rng.normal(0, 0.2, gt.shape), -1, 1)
  return pred, gt


def test_rmse_psnr_pearson_by_hand(pair):
  pred, gt = pair
  assert metrics.rmse(pred, gt) == pytest.approx(np.sqrt(((pred - gt) ** 2).mean()), rel=1e-12)
  p01, g01 = pred / 2 + 0.5, gt / 2 + 0.5
  want = 10 * np.log10(g01.max() ** 2 / (((g01 - p01) ** 2).mean() + 1e-12))
  assert metrics.psnr(pred, gt) == pytest.approx(want, rel=1e-12)
  assert metrics.pearson(pred, gt) == pytest.approx(
    np.corrcoef(pred.ravel(), gt.ravel())[0, 1], rel=1e-10
  )
  assert np.isnan(metrics.pearson(pred, np.zeros_like(gt)))
  stack_p, stack_g = np.stack([pred, gt]), np.stack([gt, gt])
  overall, rows = metrics.summary(stack_p, stack_g)
  assert overall["rmse"] == pytest.approx(np.sqrt(((stack_p - stack_g) ** 2).mean()))
  assert overall["psnr"] == pytest.approx((rows[0]["psnr"] + rows[1]["psnr"]) / 2)
  assert rows[1]["ssim"] == pytest.approx(1.0) and rows[1]["cc"] == pytest.approx(1.0)


def test_ssim_matches_scikit_image(pair):
  skm = pytest.importorskip("skimage.metrics")
  pred, gt = pair
  want = skm.structural_similarity(
    gt / 2 + 0.5,
    pred / 2 + 0.5,
    data_range=1.0,
    gaussian_weights=True,
    sigma=1.5,
    use_sample_covariance=False,
  )
  assert metrics.ssim(pred, gt) == pytest.approx(want, abs=1e-10)


def test_baseline_scaling_and_disk_mask():
  b = np.array([[0.5, -2.0], [1.0, 0.0]])
  np.testing.assert_allclose(metrics.scale_baseline(b), b / 2.0)
  m = disk_mask(128)
  assert m[64, 64] and m[0, 64] and not m[0, 0] and m.mean() == pytest.approx(np.pi / 4, abs=0.01)


def test_ssim_inside_the_disk_ignores_the_background():
  """An error in the corners (beyond the 11 x 11 window's reach of the disk) lowers the SSIM of
  the square but not the SSIM inside the disk; an error inside the disk lowers both."""
  rng = np.random.default_rng(0)
  gt = np.where(DISK, rng.uniform(-1, 1, DISK.shape), 0.0)
  r = np.hypot(*np.moveaxis(ph.pixel_centres(128)[:, :, 0], -1, 0))
  corners = gt.copy()
  far = r > 1 + 8 / 64
  corners[far] = rng.uniform(-1, 1, far.sum())
  assert metrics.ssim(corners, gt) < 0.95
  assert metrics.ssim_disk(corners, gt) == pytest.approx(1.0, abs=1e-9)
  inside = gt * 0.5
  assert metrics.ssim_disk(inside, gt) < 0.99


def test_the_registry_names_each_figure_once_with_its_direction():
  """The figures of an image (the evaluations' columns, in order) and GREIT's, each with which
  way is better: a lower RMSE, a higher PSNR, a PE nearer 0, an AR nearer 1."""
  assert [f.name for f in metrics.IMAGE] == ["rmse", "psnr", "ssim", "ssim_disk", "cc"]
  assert [f.name for f in metrics.GREIT] == ["AR", "PE", "RES", "SD", "RNG"]
  f = metrics.FIGURES
  assert f["rmse"].is_better(0.1, 0.2) and not f["rmse"].is_better(0.2, 0.1)
  assert f["psnr"].is_better(22, 20) and f["PE"].is_better(-0.01, 0.02)
  assert f["AR"].is_better(0.95, 1.1) and f["SD"].is_better(0.0, 0.1)
  assert [k for k, v in f.items() if not v.empty] == ["cc", "AR", "PE", "RES", "SD", "RNG"]
  assert metrics.HEADLINE is f["rmse"]
