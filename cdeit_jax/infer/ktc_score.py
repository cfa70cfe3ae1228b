"""The Kuopio Tomography Challenge 2023's score, and our images as the challenge's answers.

Score of one target (the organisers' `scoringFunction` and `KTCssim`, KTC2023 code on Zenodo
record 8252370): for class 2 (conductive) and class 1 (resistive) separately, the binary masks of
truth and answer are compared by an SSIM with a Gaussian window (sigma r = 80 pixels, taken to
+-ceil(2 r), normalised by the window's weight inside the image, `same`-size convolution) and
constants c1 = 1e-4, c2 = 9e-4; the SSIM map's mean is the class's score; the target's score is
the mean of the two (at most 1). The Gaussian window is separable, so it runs as two 1-D
correlations (scipy.ndimage) instead of the organisers' 2-D convolution: the same sums.

An answer is a (256, 256) array of 0 (water), 1 (resistive), 2 (conductive) on the challenge's
pixel grid: row 0 at the top (+y), the tank filling the square. Our images (128 x 128, row index
growing with +y) become one by `to_challenge_grid` (each pixel to 2 x 2, rows reversed).
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from cdeit_jax.common.errors import InputError

SIZE = 256
RADIUS = 80.0
C1, C2 = 1e-4, 9e-4


def _window(r: float = RADIUS) -> np.ndarray:
  half = int(np.ceil(2 * r))
  x = np.arange(-half, half + 1, dtype=np.float64)
  return np.exp(-0.5 * x**2 / r**2)  # the 2-D kernel's constant factor cancels in every ratio


def _smooth(a: np.ndarray, w: np.ndarray) -> np.ndarray:
  a = ndimage.correlate1d(a, w, axis=0, mode="constant", cval=0.0)
  return ndimage.correlate1d(a, w, axis=1, mode="constant", cval=0.0)


def ssim(truth: np.ndarray, reco: np.ndarray, r: float = RADIUS) -> float:
  """The organisers' SSIM of two images of one shape (module docstring)."""
  t, g = np.asarray(truth, np.float64), np.asarray(reco, np.float64)
  if t.shape != g.shape:
    raise InputError(f"ssim: shapes {t.shape} and {g.shape} differ")
  w = _window(r)
  norm = _smooth(np.ones_like(t), w)
  mean = lambda a: _smooth(a, w) / norm
  mt, mr = mean(t), mean(g)
  st, sr, str_ = mean(t * t) - mt**2, mean(g * g) - mr**2, mean(t * g) - mt * mr
  num = (2 * mt * mr + C1) * (2 * str_ + C2)
  den = (mt**2 + mr**2 + C1) * (st + sr + C2)
  return float(np.mean(num / den))


def score(truth: np.ndarray, answer: np.ndarray) -> float:
  """One target's challenge score: the mean of the class-2 and class-1 mask SSIMs."""
  truth, answer = np.asarray(truth), np.asarray(answer)
  if truth.shape != (SIZE, SIZE):
    raise InputError(f"a KTC2023 truth is ({SIZE}, {SIZE}), got {truth.shape}")
  if answer.shape != (SIZE, SIZE):
    return 0.0  # the organisers' rule for an answer of the wrong shape
  mask = lambda a, c: (np.abs(a - c) < 0.1).astype(np.float64)
  return 0.5 * (ssim(mask(truth, 2), mask(answer, 2)) + ssim(mask(truth, 1), mask(answer, 1)))


def to_challenge_grid(image: np.ndarray) -> np.ndarray:
  """A 128 x 128 image (row index growing with +y) on the challenge's 256 x 256 grid (row 0 at
  the top): each pixel to 2 x 2, rows reversed."""
  image = np.asarray(image)
  if image.shape[-2:] != (SIZE // 2, SIZE // 2):
    raise InputError(f"expected images (..., {SIZE // 2}, {SIZE // 2}), got {image.shape}")
  return np.repeat(np.repeat(image, 2, -2), 2, -1)[..., ::-1, :]


def segment(image: np.ndarray, level: float) -> np.ndarray:
  """Three classes from a continuous image in label units (+ conductive, - resistive): 2 where
  image > level * max|image|, 1 where image < -level * max|image|, else 0 (uint8)."""
  image = np.asarray(image, np.float64)
  top = np.abs(image).max(axis=(-2, -1), keepdims=True)
  out = np.zeros(image.shape, np.uint8)
  out[image > level * top] = 2
  out[image < -level * top] = 1
  out[np.broadcast_to(top, image.shape) == 0] = 0
  return out


def _smoothing_matrix(n: int = SIZE, r: float = RADIUS) -> np.ndarray:
  """M (n, n) with M @ a @ M.T == `_smooth(a, _window(r))`: the correlation with the window,
  zero outside the image, as a matrix (row i: the window centred on pixel i)."""
  w = _window(r)
  half = len(w) // 2
  d = np.arange(n)[None, :] - np.arange(n)[:, None]
  return np.where(np.abs(d) <= half, w[np.clip(d + half, 0, len(w) - 1)], 0.0)


class Scorer:
  """`score` of many answers against fixed truths: truths (N, 256, 256) of 0/1/2 on the
  challenge's grid, or (N, 128, 128) on ours (scored as `to_challenge_grid` of each, whose 2 x 2
  blocks fold into the smoothing matrix). The SSIM as matrix products, so a batch costs a few
  BLAS calls instead of N x 12 pairs of 1-D correlations; the truths' smoothed masks are kept,
  so each further answer set (a rule study scores dozens against the same truths) smooths only
  its own masks and their products. float32 by default: within 1e-8 of float64 on the public
  truths and on simulated ones (the masks' local means lie in [0, 1]); float64 equals `score`
  to 1e-12 (tests/test_answer_rules.py)."""

  CHUNK = 16  # targets per pass

  def __init__(self, truths: np.ndarray, dtype=np.float32):
    truths = np.asarray(truths)
    if truths.ndim != 3 or truths.shape[-2:] not in ((SIZE, SIZE), (SIZE // 2, SIZE // 2)):
      raise InputError(f"score: truths {truths.shape}: need (N, 256, 256) or (N, 128, 128)")
    self.shape, self.dtype = truths.shape, dtype
    n = truths.shape[-1]
    m = _smoothing_matrix()
    if n == SIZE // 2:  # each pixel a 2 x 2 block (the rows' order does not change the score)
      m = m.reshape(SIZE, n, 2).sum(-1)
    # the window's weight inside the image, m @ 1 @ m.T, is the outer product of m's row sums:
    # dividing by it scales rows and columns, so it folds into m
    m = m / m.sum(axis=1, keepdims=True)
    self._m, self._mt = m.astype(dtype), np.ascontiguousarray(m.T).astype(dtype)
    # per class: its mask and the mask's local mean
    self._truth = {}
    for c in (1, 2):
      t = (truths == c).astype(dtype)
      self._truth[c] = (t, self._smooth(t))

  def _smooth(self, a: np.ndarray) -> np.ndarray:
    """Local means m @ a @ m.T of images a (N, n, n); the right product as one 2-D GEMM."""
    num, n, _ = a.shape
    right = (a.reshape(num * n, n) @ self._mt).reshape(num, n, SIZE)
    return np.matmul(self._m, right)

  def __call__(self, answers: np.ndarray) -> np.ndarray:
    """(N,) scores of answers shaped as the truths."""
    answers = np.asarray(answers)
    if answers.shape != self.shape:
      raise InputError(
        f"score: truths {self.shape} and answers {answers.shape}: need (N, 256, 256) or "
        "(N, 128, 128) each"
      )
    total = np.zeros(self.shape[0])
    # a few targets at a time: the SSIM's dozen (k, 256, 256) temporaries stay small enough for
    # the allocator to reuse (whole-batch ones are fresh mappings, page-faulted on every pass)
    for lo in range(0, self.shape[0], self.CHUNK):
      part = slice(lo, lo + self.CHUNK)
      for c in (1, 2):
        t, mt = self._truth[c][0][part], self._truth[c][1][part]
        g = (answers[part] == c).astype(self.dtype)
        mg, mtg = self._smooth(g), self._smooth(t * g)
        # binary masks: t * t == t, so the mean of t^2 is mt
        st, sg, stg = mt - mt**2, mg - mg**2, mtg - mt * mg
        num = (2 * mt * mg + C1) * (2 * stg + C2)
        den = (mt**2 + mg**2 + C1) * (st + sg + C2)
        total[part] += (num / den).mean(axis=(-2, -1), dtype=np.float64)
    return 0.5 * total
