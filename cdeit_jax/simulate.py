"""Generate a simulated CDEIT dataset with the built-in EIT simulator.

  python -m cdeit_jax.simulate --out DATA --num_train 20000 --num_valid 1000 --num_test 1000
  python -m cdeit_jax.simulate --config configs/demo.py --out DATA --num_train 3000 \
      --config.simulator.seed=1 --config.simulator.phantom.max_inclusions=2

The examples follow `config.simulator` (`cdeit_jax.data.synthetic`: the distribution that the
simulator data source, `config.data.source="simulator"`, draws from too; the default config's
unless --config names another). Writes DATA/{train,valid,test}/NNNNNNN.npz (`ys` (208, 1)
difference voltages in volts, `xs` (128, 128) label image, `TR` (128, 128) the one-step
Tikhonov/NOSER reconstruction), DATA/mean.npy and DATA/std.npy (1, 16, 13) of the training
split, and DATA/simulate.json (the settings). Example i of a split depends only on (seed, split,
i): file i of a split is example i of the simulator source's stream for that split, the same for
any batch size or device count, and a run with larger counts (or one that was stopped) extends
the folder, computing only the missing files. Every file is written atomically.
"""

from __future__ import annotations

if __name__ == "__main__":
  from cdeit_jax.common import cpu_tuning

  cpu_tuning.apply(simulate=True)  # before jax starts: one host device per core

import concurrent.futures
import functools
import json
import sys
import time

import ml_collections
import numpy as np

from cdeit_jax.common import fileio, logs
from cdeit_jax.common.errors import InputError
from cdeit_jax.data.npz_files import file_name, savez
from cdeit_jax.data.synthetic import SPLITS


def _described(record: dict) -> str:
  """A stored device record in words: its name, electrodes, patterns and their rule."""
  from cdeit_jax.eit import layout

  try:
    return layout.Layout.from_record(record).describe()
  except (InputError, KeyError, TypeError, ValueError):  # unreadable: its name alone
    return repr(record.get("name"))


def _check_settings(out: str, sim: ml_collections.ConfigDict, tr_splits=SPLITS) -> None:
  """Refuse to extend a folder generated with other settings, or with unknown ones (it would mix
  two datasets); record the settings of a new folder."""
  from cdeit_jax.data import synthetic

  path = fileio.join(out, "simulate.json")
  want = {**synthetic.settings_json(sim), "tr_splits": sorted(tr_splits)}
  if fileio.path(path).exists():
    try:
      have = json.loads(fileio.path(path).read_text())
    except (OSError, ValueError) as e:
      raise InputError(f"{path}: unreadable ({e}); restore it or choose a new --out") from None
    # Records written before tr_splits and the device were recorded do not say; they are not
    # rewritten.
    diff = {
      k: (have.get(k), v)
      for k, v in want.items()
      if have.get(k) != v and (k in have or k not in ("tr_splits", "device"))
    }
    if diff:
      short = lambda k, v: (  # a device by its protocol and calibration, not its arrays
        f"{_described(v)} (width {np.rad2deg(v.get('width', 0.0)):.4g} degrees, gain "
        f"{v.get('gain')}, contact impedance {v.get('contact_impedance')})"
        if k == "device" and isinstance(v, dict)
        else repr(v)
      )
      listing = ", ".join(
        f"{k}: folder has {short(k, a)}, asked {short(k, b)}" for k, (a, b) in diff.items()
      )
      hint = {
        1: " (format 1: made by cdeit-jax 0.1, whose phantoms were drawn with numpy; this "
        "version cannot extend it)",
        2: " (format 2: four phantom kinds and one fixed measuring system; this version "
        "draws other phantoms and a system per example, so it cannot extend it: its "
        "files still load for training and evaluation)",
      }.get(have.get("format"), "")
      advice = (
        "Its examples are another device's: choose a new --out (a run of make device-model is "
        "one device: give another RUN)."
        if "device" in diff
        else "Pass the folder's settings (--config.simulator.*) to extend it, or choose a new "
        "--out."
      )
      raise InputError(
        f"{path}: the folder was generated with other settings ({listing}){hint}. {advice}"
      )
    return
  splits = [fileio.path(fileio.join(out, sp)) for sp in SPLITS]
  found = [
    str(d) for d in splits if d.is_dir() and any(f.name.endswith(".npz") for f in d.iterdir())
  ]
  if found:
    raise InputError(
      f"{out}: holds examples ({', '.join(found)}) but no simulate.json, so the "
      "settings that made them are unknown; choose a new --out (extending it "
      "could mix two datasets)"
    )
  fileio.makedirs(out)
  fileio.write_text(path, json.dumps(want, indent=1))


class Generator:
  """Examples of `config.simulator` computed on this process's devices (each its share of the
  batch, `synthetic.example_arrays`), with the Tikhonov image `TR` on the host."""

  def __init__(self, sim: ml_collections.ConfigDict, batch_size: int = 64):
    import jax

    from cdeit_jax.common import sharding as shd
    from cdeit_jax.data import synthetic

    self.sim = sim
    self.device = synthetic.generator(sim).layout  # the simulated device (checks the settings)
    self.mesh = shd.make_mesh(jax.local_devices())
    n = self.mesh.size
    self.batch_size = -(-batch_size // n) * n  # a multiple of the devices
    self.tikhonov = None

  def reconstruct(self, ys: np.ndarray) -> np.ndarray:
    if self.tikhonov is None:
      from cdeit_jax.eit import tikhonov

      alpha = self.sim.tikhonov_alpha or tikhonov.DEFAULT_ALPHA
      self.tikhonov = tikhonov.of_values(self.device, None, alpha)
    return self.tikhonov(ys)

  def __call__(self, split: str, indices: np.ndarray, with_tr: bool = True) -> dict:
    """Arrays of the examples `indices` (at most batch_size) of `split`."""
    from cdeit_jax.data import synthetic

    ys, xs = synthetic.example_arrays(
      self.sim, split, np.asarray(indices), self.mesh, pad_to=self.batch_size
    )
    out = {"ys": ys[..., None].astype(np.float32), "xs": xs.astype(np.float32)}
    if with_tr:
      out["TR"] = self.reconstruct(ys).astype(np.float32)
    return out


def _missing(n: int, have: set[int], size: int):
  """The indices below n not in `have`, in ascending chunks of `size` (lazily: a count of 10^8
  starts at once and takes no memory)."""
  chunk = []
  for i in range(n):
    if i not in have:
      chunk.append(i)
      if len(chunk) == size:
        yield np.asarray(chunk, np.int64)
        chunk = []
  if chunk:
    yield np.asarray(chunk, np.int64)


def generate(
  out: str,
  counts: dict[str, int],
  sim: ml_collections.ConfigDict,
  batch_size: int = 64,
  tr_splits=SPLITS,
  progress: bool = True,
) -> dict:
  """Fill OUT with `counts[split]` examples per split of the distribution `sim`
  (`config.simulator`), keeping what is there; returns timings."""

  for split, n in counts.items():
    if split not in SPLITS or n < 0:
      raise InputError(f"counts: unknown split {split!r} or negative count {n}")
  out = fileio.resolve(out)
  _check_settings(out, sim, tr_splits)
  gen = Generator(sim, batch_size)
  todo = {}
  for split, n in counts.items():
    d = fileio.join(out, split)
    fileio.makedirs(d)
    names = [f.name for f in fileio.path(d).iterdir()] if fileio.path(d).is_dir() else []
    have = {
      int(f[:-4])
      for f in names
      if f.endswith(".npz") and f[:-4].isdigit() and f == file_name(int(f[:-4])) and int(f[:-4]) < n
    }
    todo[split] = (n, have)
  total = sum(n - len(have) for n, have in todo.values())
  new_train = "train" in todo and todo["train"][0] > len(todo["train"][1])
  if new_train:
    # New training files make the statistics stale: remove them first, so that a run killed
    # before they are recomputed leaves no statistics (recomputed by the next run) rather than
    # old ones beside new files.
    for name in ("mean.npy", "std.npy"):
      fileio.path(fileio.join(out, name)).unlink(missing_ok=True)
  t0, done = time.perf_counter(), 0
  with (
    concurrent.futures.ThreadPoolExecutor(2) as pool,
    logs.progress(total, f"simulating into {out}", "example", enabled=progress) as bar,
  ):
    pending = []
    for split, (n, have) in todo.items():
      for chunk in _missing(n, have, gen.batch_size):
        arrays = gen(split, chunk, with_tr=split in tr_splits)
        for k, i in enumerate(chunk):  # writes overlap the next batch's computation
          path = fileio.join(out, split, file_name(int(i)))
          ex = {a: v[k] for a, v in arrays.items()}
          write = functools.partial(savez, arrays=ex)
          pending.append(pool.submit(fileio.atomic_write, path, write))
        for f in [f for f in pending if f.done()]:
          f.result()  # re-raise a failed write now
        pending = [f for f in pending if not f.done()]
        done += len(chunk)
        bar.update(len(chunk))
        bar.set_postfix(examples_per_s=f"{done / (time.perf_counter() - t0):.1f}")
    for f in pending:
      f.result()
  elapsed = time.perf_counter() - t0
  if counts.get("train", 0) >= 2 and (
    new_train or not fileio.path(fileio.join(out, "std.npy")).exists()
  ):
    from cdeit_jax.data import stats as stats_lib

    mean, std = stats_lib.compute_stats(
      fileio.join(out, "train"), progress=False, num_values=gen.device.num_values
    )
    stats_lib.write_stats(out, mean, std)
  return {
    "generated": total,
    "seconds": elapsed,
    "examples_per_s": total / elapsed if total else None,
  }


def main(argv: list[str]) -> None:
  del argv
  logs.console()  # progress lines where stderr is not a terminal
  f = FLAGS
  tr = tuple(x for x in f.tr_splits.split(",") if x)
  if set(tr) - set(SPLITS):
    raise InputError(
      f"--tr_splits: unknown splits {sorted(set(tr) - set(SPLITS))}; use a "
      f"comma-separated subset of {','.join(SPLITS)}"
    )
  counts = {"train": f.num_train, "valid": f.num_valid, "test": f.num_test}
  from cdeit_jax.checkpoints import shipped

  shipped.refuse_write(f.out, "--out")
  fileio.output_folder(f.out, "--out")
  r = generate(f.out, counts, f.config.simulator, f.batch_size, tr)
  rate = f", {r['examples_per_s']:.1f} examples/s" if r["generated"] else ""
  print(f"{f.out}: generated {r['generated']} examples in {r['seconds']:.1f} s{rate}")


if __name__ == "__main__":
  from absl import flags
  from ml_collections import config_flags

  from cdeit_jax import cli, config_lib

  try:
    config_flags.DEFINE_config_file(
      "config",
      config_lib.__file__,
      "config file; its `simulator` section is the "
      "distribution (default: the default config); change keys with "
      "--config.simulator.snr_db=30",
      lock_config=True,
    )
  except (KeyError, AttributeError) as e:  # an unknown --config.KEY on the command line
    cli.unknown_config_key(sys.argv, e)
  flags.DEFINE_string("out", None, "dataset folder (created or extended)")
  for split in SPLITS:
    flags.DEFINE_integer(f"num_{split}", 0, f"examples in {split}/", lower_bound=0)
  flags.DEFINE_integer(
    "batch_size",
    64,
    "examples per device call (rounded up to a multiple of the devices)",
    lower_bound=1,
  )
  flags.DEFINE_string(
    "tr_splits",
    ",".join(SPLITS),
    "splits whose files get the Tikhonov reconstruction TR (comma-separated)",
  )
  cli.define_cache_flag()
  flags.mark_flags_as_required(["out"])
  FLAGS = flags.FLAGS
  cli.run(main)
