"""CDEIT datasets: folders of npz files, the sim-to-real scaling, the EIM condition, and grain
pipelines that feed one global batch sharded over every host and device.

Each npz holds `ys` (208, 1) difference voltages and `xs` (128, 128) the conductivity-change
target, optionally `TR` and `xs_gn` (classical reconstructions, kept for evaluation).
"""

from __future__ import annotations

import concurrent.futures
import logging
import contextlib
import os
import sys
import threading
import zipfile
from collections.abc import Iterator, Sequence
from typing import Any

import grain
import jax
import numpy as np

from cdeit_jax import stats as stats_lib
from cdeit_jax.eit.fem import measurement_pairs
from cdeit_jax.fileio import atomic_write
from cdeit_jax.errors import InputError, MissingFile

log = logging.getLogger(__name__)

# name -> (voltage_ratio, current_ratio): measured / simulated units (reference document).
PRESETS = {"simulated": (1.0, 1.0), "uef2017": (1040.856, 2.0), "ktc2023": (1978.0, 2.0)}
NUM_ELECTRODES, NUM_MEAS = 16, 13
IMAGE_SIZE = 128
BASELINE_KEYS = ("TR", "xs_gn")


# (16, 13) column of each measurement in the EIM: row k skips k-1, k, k+1 (the measurement protocol)
_EIM_COLS = measurement_pairs()


def eim(voltages: np.ndarray) -> np.ndarray:
  """Electrode interaction matrix (..., 16, 16) from standardised voltages (..., 16, 13)."""
  out = np.zeros(voltages.shape[:-1] + (NUM_ELECTRODES,), voltages.dtype)
  rows = np.arange(NUM_ELECTRODES)[:, None]
  out[..., rows, _EIM_COLS] = voltages
  return out


def resolve_ratios(preset: str, voltage_ratio: float | None = None,
                   current_ratio: float | None = None) -> tuple[float, float]:
  if preset not in PRESETS and (voltage_ratio is None or current_ratio is None):
    raise InputError(f"unknown data preset {preset!r}: use one of {sorted(PRESETS)}, or give both "
                     "voltage_ratio and current_ratio")
  v, c = PRESETS.get(preset, (None, None))
  return float(voltage_ratio if voltage_ratio is not None else v), \
      float(current_ratio if current_ratio is not None else c)


# numpy parses .npy headers with ast.literal_eval, which is not thread-safe on CPython 3.11
# ("SystemError: AST constructor recursion depth mismatch", seen here on 3.11.7 with grain's
# reader threads). Decoding is serialised there; worker processes (num_workers) are unaffected.
_NPZ_LOCK = threading.Lock() if sys.version_info < (3, 13) else contextlib.nullcontext()


def _read_npz(path: str, keys: Sequence[str] | None = None) -> dict[str, np.ndarray]:
  """The arrays of an npz (all, or `keys` where present), decoded under the lock."""
  with _NPZ_LOCK, np.load(path, allow_pickle=False) as z:
    return {k: z[k] for k in (z.files if keys is None else [k for k in keys if k in z.files])}


# ----------------------------------------------------------------------------- validation


class DatasetError(InputError):
  """A dataset folder or file is unusable; the message names every bad file."""


def check_file(path: str) -> str | None:
  """None if `path` is a usable CDEIT npz, else what is wrong with it."""
  try:
    z = _read_npz(path)
  except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
    return f"not a readable npz ({type(e).__name__}: {e})"
  for key, shape in (("ys", (208, 1)), ("xs", (IMAGE_SIZE, IMAGE_SIZE))):
    if key not in z:
      return f"missing key {key!r} (has {sorted(z)})"
    a = z[key]
    if a.size != int(np.prod(shape)) or a.shape not in (shape, (shape[0],)):
      return f"{key} has shape {a.shape}, expected {shape}"
    if not np.issubdtype(a.dtype, np.number):
      return f"{key} has dtype {a.dtype}, expected a float array"
    if not np.all(np.isfinite(a)):
      return f"{key} holds {int(np.size(a) - np.isfinite(a).sum())} non-finite values"
  return None


def list_files(directory: str) -> list[str]:
  if not os.path.isdir(directory):
    raise DatasetError(f"data folder {directory}: does not exist (expected a folder of .npz "
                       "files, e.g. DATA/train)")
  files = sorted(f for f in os.listdir(directory) if f.endswith(".npz"))
  if not files:
    raise DatasetError(f"data folder {directory}: holds no .npz files")
  return files


def validate(directory: str, files: Sequence[str], *, skip_bad: bool = False,
             num_threads: int = 8) -> list[str]:
  """Check every file; raise listing all bad ones, or (skip_bad) warn and drop them."""
  paths = [os.path.join(directory, f) for f in files]
  with concurrent.futures.ThreadPoolExecutor(num_threads) as pool:
    problems = list(pool.map(check_file, paths))
  bad = [(f, p) for f, p in zip(files, problems) if p is not None]
  if not bad:
    return list(files)
  listing = "\n".join(f"  {os.path.join(directory, f)}: {p}" for f, p in bad[:50])
  more = f"\n  ... and {len(bad) - 50} more" if len(bad) > 50 else ""
  if not skip_bad:
    raise DatasetError(f"data folder {directory}: {len(bad)} of {len(files)} files are bad:\n"
                       f"{listing}{more}\nFix or remove them, or skip them: "
                       "--config.data.skip_bad_files=True (train.py), "
                       "--config.eval.skip_bad_files=True (eval.py), --skip-bad-files "
                       "(python -m cdeit_jax.data stats).")
  log.warning("data folder %s: skipping %d of %d bad files:\n%s%s", directory, len(bad),
              len(files), listing, more)
  good = [f for f, p in zip(files, problems) if p is None]
  if not good:
    raise DatasetError(f"data folder {directory}: every file is bad")
  return good


# ----------------------------------------------------------------------------- the source


def resolve_stats(split_dir: str, stats: Any = None,
                  checkpoint_stats: tuple[np.ndarray, np.ndarray] | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
  """Statistics to standardise with: explicit (arrays, a folder, or "authors"), else the dataset root's
  (the split folder's parent), else the checkpoint's. An explicit choice that differs from the
  checkpoint's is reported."""
  if isinstance(stats, str) and stats == "authors":
    stats = stats_lib.authors_stats()  # the CDEIT authors' statistics, shipped with the package
  if stats is not None:
    if isinstance(stats, (str, os.PathLike)):
      mean, std = stats_lib.load_stats(os.fspath(stats))
    else:
      mean, std = stats_lib.check_stats(*stats, source="stats argument")
    if checkpoint_stats is not None and not (
        np.allclose(mean, checkpoint_stats[0], rtol=1e-6, atol=0) and
        np.allclose(std, checkpoint_stats[1], rtol=1e-6, atol=0)):
      log.warning("the given normalisation statistics differ from those stored in the checkpoint "
                  "(the model was trained with the checkpoint's); using the given ones")
    return mean, std
  root = os.path.dirname(os.path.abspath(split_dir))
  if stats_lib.find_stats_files(root):
    return stats_lib.load_stats(root)
  if checkpoint_stats is not None:
    return stats_lib.check_stats(*checkpoint_stats, source="checkpoint")
  raise MissingFile(
      f"no normalisation statistics for {split_dir}: put mean/std (.npy or .pth) in {root}, "
      "pass stats=, or compute them with `python -m cdeit_jax.data stats DATA/train`")


class NpzSource:
  """Random-access source (grain protocol: `len`, `[i]`) over a folder of CDEIT npz files.

  Returns float32 `cond` (16, 16, 1) the EIM of the scaled, standardised voltages, `voltages`
  (16, 13), `target` (128, 128, 1), `index` and `name`; with `baselines=True` also the stored
  classical reconstructions (`TR`, `xs_gn`, NaN where a file lacks them).
  """

  def __init__(self, path: str, preset: str = "simulated", stats: Any = None, *,
               voltage_ratio: float | None = None, current_ratio: float | None = None,
               checkpoint_stats: tuple[np.ndarray, np.ndarray] | None = None,
               skip_bad: bool = False, validate_files: bool = True, cache: bool = False,
               baselines: bool = False):
    self.path = os.path.abspath(path)
    self.preset = preset
    self.voltage_ratio, self.current_ratio = resolve_ratios(preset, voltage_ratio, current_ratio)
    files = list_files(self.path)
    self.files = validate(self.path, files, skip_bad=skip_bad) if validate_files else files
    self.mean, self.std = resolve_stats(self.path, stats, checkpoint_stats)
    self._mean, self._std = self.mean.reshape(16, 13), self.std.reshape(16, 13)
    self.baselines = baselines
    self._cache: list[dict] | None = None
    if cache:
      self._cache = [self._load(i) for i in range(len(self.files))]

  def __len__(self) -> int:
    return len(self.files)

  def __repr__(self) -> str:
    return f"NpzSource({self.path!r}, preset={self.preset!r}, n={len(self)})"

  def condition(self, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(cond (16,16,1), voltages (16,13)) from raw `ys` (208,) in measured units."""
    v = np.asarray(ys, np.float32).reshape(16, 13) / np.float32(self.voltage_ratio)
    v = (v - self._mean) / self._std
    return eim(v)[..., None], v

  def _load(self, i: int) -> dict[str, Any]:
    path = os.path.join(self.path, self.files[i])
    try:
      z = _read_npz(path, ("ys", "xs") + (BASELINE_KEYS if self.baselines else ()))
      cond, v = self.condition(z["ys"])
      ex = {"cond": cond, "voltages": v,
            "target": np.asarray(z["xs"], np.float32).reshape(IMAGE_SIZE, IMAGE_SIZE, 1),
            "index": np.int32(i), "name": self.files[i]}
      if self.baselines:
        for k in BASELINE_KEYS:
          ex[k] = (np.asarray(z[k], np.float32).reshape(IMAGE_SIZE, IMAGE_SIZE, 1) if k in z
                   else np.full((IMAGE_SIZE, IMAGE_SIZE, 1), np.nan, np.float32))
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
      raise DatasetError(f"{path}: {e}") from e
    return ex

  def __getitem__(self, i: int) -> dict[str, Any]:
    if self._cache is not None:
      return self._cache[i]
    return self._load(i)


# ----------------------------------------------------------------------------- statistics


def compute_stats(split_dir: str, preset: str = "simulated", *, voltage_ratio: float | None = None,
                  progress: bool = True, skip_bad: bool = False
                  ) -> tuple[np.ndarray, np.ndarray]:
  """Per-measurement mean and std (N-1) of `ys / voltage_ratio` over a split, streaming in
  float64 (the authors' statistics, shape (1, 16, 13))."""
  from tqdm import tqdm

  ratio, _ = resolve_ratios(preset, voltage_ratio, 1.0)
  files = validate(split_dir, list_files(split_dir), skip_bad=skip_bad)
  if len(files) < 2:
    raise DatasetError(f"data folder {split_dir}: need at least 2 files for a std (N-1)")
  n, mean, m2 = 0, np.zeros(208), np.zeros(208)
  for f in tqdm(files, desc=f"stats {split_dir}", unit="file", disable=not progress):
    x = np.asarray(_read_npz(os.path.join(split_dir, f), ("ys",))["ys"], np.float64)
    x = x.reshape(208) / ratio
    n += 1  # Welford's update: one pass, numerically stable
    delta = x - mean
    mean += delta / n
    m2 += delta * (x - mean)
  std = np.sqrt(m2 / (n - 1))
  return mean.reshape(1, 16, 13).astype(np.float32), std.reshape(1, 16, 13).astype(np.float32)


def write_stats(out: str, mean: np.ndarray, std: np.ndarray) -> None:
  """Write OUT/mean.npy and OUT/std.npy, each atomically (never half-written)."""
  os.makedirs(out, exist_ok=True)
  for name, arr in (("mean", mean), ("std", std)):
    def save(p, a=arr):
      with open(p, "wb") as fh:  # a handle: np.save would append ".npy" to the temporary name
        np.save(fh, a)
    atomic_write(os.path.join(out, f"{name}.npy"), save)


# ----------------------------------------------------------------------------- pipelines


_TRAIN_KEYS = ("cond", "target", "index")


def _drop_name(ex: dict) -> dict:
  return {k: ex[k] for k in _TRAIN_KEYS}


def local_batch_size(global_batch: int) -> int:
  if global_batch % jax.process_count():
    raise InputError(f"global batch {global_batch} does not divide over {jax.process_count()} "
                     "processes")
  return global_batch // jax.process_count()


class _HostRows(grain.MapDataset):
  """This host's rows of every global batch of `parent` (a global example stream).

  Global batch k is parent[k*G : (k+1)*G]; host p gets its rows p*B .. p*B+B-1, so the hosts'
  local batches, concatenated in process order, are the global batch whatever the process count.
  """

  def __init__(self, parent: grain.MapDataset, global_batch: int, per_host: int, process: int):
    super().__init__(parent)
    self._g, self._b, self._p = global_batch, per_host, process
    self._len = (len(parent) // global_batch) * per_host

  def __len__(self) -> int:
    return self._len

  def __getitem__(self, index):
    if isinstance(index, slice):
      return self.slice(index)
    k, j = divmod(index, self._b)
    return self._parents[0][k * self._g + self._p * self._b + j]


def train_dataset(source: NpzSource, global_batch: int, opts: Any) -> grain.IterDataset:
  """Shuffled (seeded, reshuffled each epoch), repeated, batched host share of the global batch.

  `opts` is `config.data`: `seed`, `num_threads` (reader threads per process), `prefetch`
  (batches per process), `num_workers` (grain worker processes; 0 = in-process).

  The example order depends only on the seed, not on the number of hosts: each host reads only
  the examples of its rows of each global batch.
  """
  per_host = local_batch_size(global_batch)
  if len(source) < global_batch:
    raise DatasetError(f"{source.path}: {len(source)} examples, fewer than one global batch of "
                       f"{global_batch}")
  ds = grain.MapDataset.source(source).shuffle(seed=opts.seed).repeat().map(_drop_name)
  ds = _HostRows(ds, global_batch, per_host, jax.process_index())
  ds = ds.batch(per_host, drop_remainder=True)
  it = ds.to_iter_dataset(grain.ReadOptions(
      num_threads=opts.num_threads, prefetch_buffer_size=max(opts.prefetch, opts.num_threads)))
  if opts.num_workers > 0:
    from absl import flags
    if not flags.FLAGS.is_parsed():  # grain's workers read absl flags; outside an absl app
      flags.FLAGS.mark_as_parsed()   # (library use, tests) mark the defaults as parsed
    it = it.mp_prefetch(grain.MultiprocessingOptions(num_workers=opts.num_workers,
                                                     per_worker_buffer_size=opts.prefetch))
  return it


def eval_indices(n: int, global_batch: int) -> tuple[np.ndarray, np.ndarray]:
  """(indices, mask) of shape (num_batches, local_batch) for this host.

  Global batch k holds examples k*G .. k*G+G-1; host p takes the p-th block of each, so that the
  hosts' local batches, concatenated in process order, are the global batch. Padding (mask 0)
  repeats example 0.
  """
  per_host = local_batch_size(global_batch)
  num_batches = -(-n // global_batch)
  k = np.arange(num_batches)[:, None]
  pos = k * global_batch + jax.process_index() * per_host + np.arange(per_host)[None]
  mask = pos < n
  return np.where(mask, pos, 0), mask


def eval_batches(source: NpzSource, global_batch: int, keys: Sequence[str] = _TRAIN_KEYS,
                 limit: int | None = None) -> Iterator[dict[str, np.ndarray]]:
  """Host batches covering every example (or the first `limit`) exactly once across hosts,
  with `mask` and `index`."""
  n = len(source) if limit is None else min(len(source), limit)
  idx, mask = eval_indices(n, global_batch)
  for b in range(idx.shape[0]):
    exs = [source[int(i)] for i in idx[b]]
    batch = {k: np.stack([e[k] for e in exs]) for k in keys}
    batch["mask"] = mask[b].astype(np.float32)
    batch["index"] = idx[b].astype(np.int32)
    yield batch


def to_global(batch: dict[str, np.ndarray], mesh: jax.sharding.Mesh) -> dict[str, jax.Array]:
  """Host batch -> global jax.Arrays sharded over the mesh's data axis (leading dimension)."""
  from cdeit_jax import sharding as shd
  sharding = shd.batch_sharded(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in batch.items() if np.asarray(v).dtype.kind != "U"}


def main(argv: Sequence[str] | None = None) -> None:
  """`python -m cdeit_jax.data stats DATA/train [--preset P] [--out DIR]`."""
  import argparse
  p = argparse.ArgumentParser(prog="python -m cdeit_jax.data")
  sub = p.add_subparsers(dest="cmd", required=True)
  s = sub.add_parser("stats", help="compute mean.npy/std.npy (1,16,13) of a training split")
  s.add_argument("split", help="folder of npz files, e.g. DATA/train")
  s.add_argument("--preset", default="simulated", choices=sorted(PRESETS))
  s.add_argument("--voltage-ratio", type=float, default=None)
  s.add_argument("--out", default=None, help="where to write mean.npy/std.npy (default: the "
                 "split's parent, where the loaders look first)")
  s.add_argument("--skip-bad-files", action="store_true", help="skip unreadable or invalid "
                 "files with a warning (default: stop and list them)")
  a = p.parse_args(argv)
  try:
    mean, std = compute_stats(a.split, a.preset, voltage_ratio=a.voltage_ratio,
                              skip_bad=a.skip_bad_files)
  except DatasetError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  out = a.out or os.path.dirname(os.path.abspath(a.split))
  write_stats(out, mean, std)
  print(f"wrote {out}/mean.npy, {out}/std.npy from {a.split}: std median {np.median(std):.3e}")


if __name__ == "__main__":
  main()
