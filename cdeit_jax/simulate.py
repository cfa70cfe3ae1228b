"""Generate a simulated CDEIT dataset with the built-in EIT simulator.

  python -m cdeit_jax.simulate --out DATA --num-train 20000 --num-valid 1000 --num-test 1000 --seed 0

Writes DATA/{train,valid,test}/NNNNNNN.npz (`ys` (208, 1) difference voltages in volts, `xs`
(128, 128) label image, `TR` (128, 128) the one-step Tikhonov/NOSER reconstruction),
DATA/mean.npy and DATA/std.npy (1, 16, 13) of the training split, and DATA/simulate.json (the
settings). Example i of a split depends only on (seed, split, i): the output is the same for any
batch size or device count, and a run with larger counts (or one that was stopped) extends the
folder, computing only the missing files. Every file is written atomically.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import functools
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from cdeit_jax.fileio import atomic_write
from cdeit_jax.errors import InputError

SPLITS = ("train", "valid", "test")
FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class SimSettings:
  """Everything that determines the generated examples (stored in simulate.json)."""
  seed: int = 0
  snr_db: float | None = 40.0
  contact_impedance: float = 0.01
  phantom: dict = dataclasses.field(default_factory=dict)   # PhantomSpec overrides
  tikhonov_alpha: float | None = None                       # None: reconstruct.DEFAULT_ALPHA

  def to_json(self) -> dict:
    """The settings with every default spelled out, so a folder never extends with other
    defaults (of a later version) than it was made with."""
    from cdeit_jax.eit import PhantomSpec, reconstruct
    d = dataclasses.asdict(self)
    d["phantom"] = dataclasses.asdict(PhantomSpec(**self.phantom))
    d["tikhonov_alpha"] = self.tikhonov_alpha or reconstruct.DEFAULT_ALPHA
    return {"format": FORMAT_VERSION, **d}


def example_rng(seed: int, split: str, index: int) -> np.random.Generator:
  return np.random.default_rng([seed, SPLITS.index(split), index])


def example_key(seed: int, split: str, index) -> jax.Array:
  return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), SPLITS.index(split)), index)


def file_name(index: int) -> str:
  return f"{index:07d}.npz"


def _savez(p: str, arrays: dict) -> None:
  with open(p, "wb") as fh:  # a handle: np.savez would append ".npz" to the temporary name
    np.savez(fh, **arrays)


def _check_settings(out: str, settings: SimSettings, tr_splits=SPLITS) -> None:
  """Refuse to extend a folder generated with other settings, or with unknown ones (it would mix
  two datasets); record the settings of a new folder."""
  path = os.path.join(out, "simulate.json")
  want = {**settings.to_json(), "tr_splits": sorted(tr_splits)}
  if os.path.exists(path):
    try:
      with open(path) as fh:
        have = json.load(fh)
    except (OSError, ValueError) as e:
      raise InputError(f"{path}: unreadable ({e}); restore it or choose a new --out") from None
    # Records written before tr_splits was recorded do not say; they are not rewritten.
    diff = {k: (have.get(k), v) for k, v in want.items()
            if have.get(k) != v and (k in have or k != "tr_splits")}
    if diff:
      listing = ", ".join(f"{k}: folder has {a!r}, asked {b!r}" for k, (a, b) in diff.items())
      raise InputError(f"{path}: the folder was generated with other settings ({listing}). "
                       "Pass the folder's settings to extend it, or choose a new --out.")
    return
  found = [os.path.join(out, sp) for sp in SPLITS if os.path.isdir(os.path.join(out, sp))
           and any(f.endswith(".npz") for f in os.listdir(os.path.join(out, sp)))]
  if found:
    raise InputError(f"{out}: holds examples ({', '.join(found)}) but no simulate.json, so the "
                     "settings that made them are unknown; choose a new --out (extending it "
                     "could mix two datasets)")
  os.makedirs(out, exist_ok=True)
  def dump(p):
    with open(p, "w") as fh:
      json.dump(want, fh, indent=1)
  atomic_write(path, dump)


@functools.lru_cache(maxsize=8)
def _batch_fn(contact_impedance: float, snr_db: float | None, spec):
  """(params (B, 4, 8), keys (B,)) -> (ys (B, 208), xs (B, 128, 128)), jitted once per setting."""
  from cdeit_jax import eit
  from cdeit_jax.eit import phantom as ph
  sim = eit.default_simulator(contact_impedance=contact_impedance)

  def batch(params, keys):
    ys = sim.phantom_voltages(params, snr_db, keys if snr_db is not None else None,
                              spec.max_radius)
    return ys, jax.vmap(ph.render_image)(params)

  return jax.jit(batch)


class Generator:
  """Batched generation: phantom parameters on the host, everything else in one jitted call."""

  def __init__(self, settings: SimSettings, batch_size: int = 64):
    from cdeit_jax import eit
    from cdeit_jax import sharding as shd
    self.settings = settings
    self.spec = eit.PhantomSpec(**settings.phantom)
    self.spec.validate()
    devices = jax.local_devices()
    if jax.default_backend() == "cpu":
      # XLA:CPU runs the Cholesky through LAPACK (scipy's OpenBLAS); called from several host
      # devices at once it deadlocked here (8 fake devices, 2 cores). One CPU device uses all
      # cores anyway.
      devices = devices[:1]
    self.batch_size = -(-batch_size // len(devices)) * len(devices)  # a multiple of the devices
    self.tikhonov = None
    self.sharding = shd.batch_sharded(shd.make_mesh(devices))  # the batch over local devices
    self._fn = _batch_fn(settings.contact_impedance, settings.snr_db, self.spec)

  def reconstruct(self, ys: np.ndarray) -> np.ndarray:
    if self.tikhonov is None:
      from cdeit_jax.eit import reconstruct
      alpha = self.settings.tikhonov_alpha or reconstruct.DEFAULT_ALPHA
      self.tikhonov = reconstruct.default_tikhonov(alpha, self.settings.contact_impedance)
    return self.tikhonov(ys)

  def __call__(self, split: str, indices: np.ndarray, with_tr: bool = True) -> dict:
    """Arrays of the examples `indices` (at most batch_size) of `split`."""
    from cdeit_jax.eit import phantom as ph
    n, b = len(indices), self.batch_size
    padded = np.concatenate([indices, np.full(b - n, indices[-1])])
    params = np.stack([ph.random_params(example_rng(self.settings.seed, split, int(i)), self.spec)
                       for i in padded]).astype(np.float32)
    keys = jax.vmap(lambda i: example_key(self.settings.seed, split, i))(jnp.asarray(padded))
    ys, xs = self._fn(jax.device_put(params, self.sharding), jax.device_put(keys, self.sharding))
    ys, xs = np.asarray(ys)[:n], np.asarray(xs)[:n]
    out = {"ys": ys[..., None].astype(np.float32), "xs": xs.astype(np.float32)}
    if with_tr:
      out["TR"] = self.reconstruct(ys).astype(np.float32)
    return out


def generate(out: str, counts: dict[str, int], settings: SimSettings = SimSettings(),
             batch_size: int = 64, tr_splits=SPLITS, progress: bool = True) -> dict:
  """Fill OUT with `counts[split]` examples per split (keeping what is there); returns timings."""
  from tqdm import tqdm

  for split, n in counts.items():
    if split not in SPLITS or n < 0:
      raise InputError(f"counts: unknown split {split!r} or negative count {n}")
  _check_settings(out, settings, tr_splits)
  gen = Generator(settings, batch_size)
  todo = {}
  for split, n in counts.items():
    d = os.path.join(out, split)
    os.makedirs(d, exist_ok=True)
    have = set(os.listdir(d))
    todo[split] = np.array([i for i in range(n) if file_name(i) not in have], np.int64)
  total = sum(len(v) for v in todo.values())
  if len(todo.get("train", ())):
    # New training files make the statistics stale: remove them first, so that a run killed
    # before they are recomputed leaves no statistics (recomputed by the next run) rather than
    # old ones beside new files.
    for name in ("mean.npy", "std.npy"):
      if os.path.exists(os.path.join(out, name)):
        os.remove(os.path.join(out, name))
  t0, done = time.perf_counter(), 0
  with concurrent.futures.ThreadPoolExecutor(2) as pool, tqdm(
      total=total, desc=f"simulating into {out}", unit="example", disable=not progress) as bar:
    pending = []
    for split, idx in todo.items():
      for start in range(0, len(idx), gen.batch_size):
        chunk = idx[start:start + gen.batch_size]
        arrays = gen(split, chunk, with_tr=split in tr_splits)
        for k, i in enumerate(chunk):  # writes overlap the next batch's computation
          path = os.path.join(out, split, file_name(int(i)))
          ex = {a: v[k] for a, v in arrays.items()}
          pending.append(pool.submit(atomic_write, path, functools.partial(_savez, arrays=ex)))
        for f in [f for f in pending if f.done()]:
          f.result()                                    # re-raise a failed write now
        pending = [f for f in pending if not f.done()]
        done += len(chunk)
        bar.update(len(chunk))
        bar.set_postfix(examples_per_s=f"{done / (time.perf_counter() - t0):.1f}")
    for f in pending:
      f.result()
  elapsed = time.perf_counter() - t0
  if counts.get("train", 0) >= 2 and (len(todo["train"]) or not os.path.exists(
      os.path.join(out, "std.npy"))):
    from cdeit_jax import stats as stats_lib
    mean, std = stats_lib.compute_stats(os.path.join(out, "train"), progress=False)
    stats_lib.write_stats(out, mean, std)
  return {"generated": total, "seconds": elapsed,
          "examples_per_s": total / elapsed if total else None}


def main(argv=None) -> None:
  p = argparse.ArgumentParser(prog="python -m cdeit_jax.simulate", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", required=True, help="dataset folder (created or extended)")
  p.add_argument("--num-train", type=int, default=0)
  p.add_argument("--num-valid", type=int, default=0)
  p.add_argument("--num-test", type=int, default=0)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--snr-db", type=float, default=40.0, help="noise on vh and vi; negative: none")
  p.add_argument("--contact-impedance", type=float, default=0.01)
  p.add_argument("--batch-size", type=int, default=64)
  p.add_argument("--tr-splits", default="train,valid,test",
                 help="splits whose files get the Tikhonov reconstruction TR (comma-separated)")
  p.add_argument("--phantom", default="{}", help='PhantomSpec overrides as JSON, e.g. '
                 '\'{"max_inclusions": 2}\'')
  a = p.parse_args(argv)
  try:
    phantom = json.loads(a.phantom)
    from cdeit_jax.eit import PhantomSpec
    unknown = set(phantom) - {f.name for f in dataclasses.fields(PhantomSpec)}
    if unknown:
      raise InputError(f"--phantom: unknown fields {sorted(unknown)}; known: "
                       f"{[f.name for f in dataclasses.fields(PhantomSpec)]}")
    tr = tuple(s for s in a.tr_splits.split(",") if s)
    if set(tr) - set(SPLITS):
      raise InputError(f"--tr-splits: unknown splits {sorted(set(tr) - set(SPLITS))}")
    settings = SimSettings(seed=a.seed, snr_db=None if a.snr_db < 0 else a.snr_db,
                           contact_impedance=a.contact_impedance, phantom=phantom)
    counts = {"train": a.num_train, "valid": a.num_valid, "test": a.num_test}
    r = generate(a.out, counts, settings, a.batch_size, tr)
  except (ValueError, json.JSONDecodeError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  rate = f", {r['examples_per_s']:.1f} examples/s" if r["generated"] else ""
  print(f"{a.out}: generated {r['generated']} examples in {r['seconds']:.1f} s{rate}")


if __name__ == "__main__":
  main()
