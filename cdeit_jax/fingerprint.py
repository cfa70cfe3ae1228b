"""Behaviour fingerprint: SHA-256 of what the code computes, to check that a refactoring changes
nothing (issue 73 item 7). Run it before and after, on the same machine, and compare the JSON:

  python -m cdeit_jax.fingerprint --out /tmp/fp > before.json

Each item is computed through the commands (stable across refactorings) or the public loading
API: simulations of three systems (CDEIT's 16 electrodes, KTC2023's with removals, a calibrated
device), the conditions each model kind computes from them, a 60-step training, both shipped
models' reconstructions of real data, and `make device-model`'s calibration. Timing files and
logs are not hashed, nor a frames file's `info` record (it names the checkout's paths); arrays are
hashed by value (dtype, shape, bytes).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(REPO), "shared")
SKIP1 = os.path.join(REPO, "data", "uef2017_protocols", "skip1")
if not os.path.isdir(SKIP1):
  SKIP1 = os.path.join(SHARED, "data", "uef2017_protocols", "skip1")


def _hash_arrays(h, name: str, arrays: dict) -> None:
  for k in sorted(arrays):
    a = np.asarray(arrays[k])
    if a.dtype == object:
      a = np.asarray([str(x) for x in a.ravel()])
    h.update(f"{name}:{k}:{a.dtype.str}:{a.shape}".encode())
    h.update(np.ascontiguousarray(a).tobytes())


def hash_tree(folder: str, skip=(".json", ".log", ".png", ".gif", ".txt", ".jsonl")) -> str:
  """SHA-256 over every npz/npy/mat array under `folder` (by value), in sorted path order."""
  import scipy.io

  h = hashlib.sha256()
  for root, dirs, files in sorted(os.walk(folder)):
    dirs.sort()
    for f in sorted(files):
      p = os.path.join(root, f)
      rel = os.path.relpath(p, folder)
      if f.endswith(skip):
        continue
      if f.endswith(".npz"):  # (`info`: provenance, the paths of the checkout and outputs)
        with np.load(p, allow_pickle=False) as z:
          _hash_arrays(h, rel, {k: z[k] for k in z.files if k != "info"})
      elif f.endswith(".npy"):
        _hash_arrays(h, rel, {"": np.load(p, allow_pickle=False)})
      elif f.endswith(".mat"):
        try:
          m = scipy.io.loadmat(p)
          _hash_arrays(h, rel, {k: v for k, v in m.items() if not k.startswith("__")})
        except (NotImplementedError, ValueError):  # v7.3: HDF5
          import h5py

          with h5py.File(p, "r") as m:
            _hash_arrays(h, rel, {k: m[k][()] for k in m if not k.startswith("#")})
  return h.hexdigest()


def run(*args: str) -> None:
  r = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True)
  if r.returncode:
    sys.stderr.write(r.stdout[-3000:] + r.stderr[-3000:])
    raise SystemExit(f"fingerprint: {' '.join(args)} failed (rc {r.returncode})")


def conditions(out: str) -> dict[str, str]:
  """The condition each model kind computes from simulated values: the EIM (published model),
  EIM + linear images (demo), linear images with removals (KTC2023), the calibrated device's."""
  import jax
  import jax.numpy as jnp

  from cdeit_jax import config_lib
  from cdeit_jax.checkpoints import loading

  got = {}
  for name, config, data in (
    ("default", "configs/default.py", "sim_cdeit16"),
    ("demo", "configs/demo.py", "sim_cdeit16"),
    ("ktc2023", "configs/ktc2023.py", "sim_ktc2023"),
    ("device", f"configs/device.py:{out}/device.npz", "sim_device"),
  ):
    cfg = config_lib.load(config)
    model = loading.build(cfg, loading.resolve(cfg))
    folder = os.path.join(out, data, "train")
    files = sorted(os.listdir(folder))[:8]
    ys = np.stack([np.load(os.path.join(folder, f))["ys"].ravel() for f in files])
    ys = ys.astype(np.float32)
    if model.conditioner is not None and model.system.condition.eim:
      from cdeit_jax.eit import measurement

      mean, std = ys.mean(0), ys.std(0) + 1e-3
      ys = np.asarray(measurement.condition(ys, 1.0, mean, std, measurement.cdeit16())[0])
    else:
      ys = (ys - ys.mean(0)) / (ys.std(0) + 1e-3)
    if model.conditioner is None:
      got[f"condition_{name}"] = "none (the EIM is the input itself)"
      continue
    c = model.conditioner(jnp.asarray(ys))
    h = hashlib.sha256()
    _hash_arrays(h, name, {"c": np.asarray(jax.device_get(c))})
    got[f"condition_{name}"] = h.hexdigest()
  return got


def main() -> None:
  from cdeit_jax import cli

  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", required=True, help="a scratch folder (replaced)")
  ap.add_argument("--skip", default="", help="comma-separated items to leave out")
  a = cli.parse_args(ap)
  print(
    json.dumps(fingerprint(os.path.abspath(a.out), set(filter(None, a.skip.split(",")))), indent=1)
  )


def fingerprint(out: str, skip: set[str]) -> dict[str, str]:
  """Item -> SHA-256 (module docstring), computed in `out` (replaced), the items in `skip` left
  out."""
  from cdeit_jax.checkpoints import shipped
  from cdeit_jax.common import fileio

  shipped.refuse_write(out, "--out")  # it is replaced whole
  fileio.output_folder(out, "--out")  # a folder: a file given here is never removed
  subprocess.run(["rm", "-rf", out], check=True)
  os.makedirs(out)
  fp: dict[str, str] = {}
  small = ["--num_train", "16", "--num_valid", "8", "--num_test", "8", "--tr_splits", "valid,test"]

  run("-m", "cdeit_jax.calibrate", "--device", f"{SKIP1}/ref.mat", "--out", f"{out}/device.npz")
  fp["calibration_skip1"] = hash_tree(out)
  run("-m", "cdeit_jax.simulate", "--out", f"{out}/sim_cdeit16", *small)
  run(
    "-m",
    "cdeit_jax.simulate",
    "--config",
    "configs/ktc2023.py",
    "--out",
    f"{out}/sim_ktc2023",
    *small,
  )
  run(
    "-m", "cdeit_jax.simulate", "--config", f"configs/device.py:{out}/device.npz",
    "--out", f"{out}/sim_device", *small,
  )  # fmt: skip
  for k in ("sim_cdeit16", "sim_ktc2023", "sim_device"):
    fp[k] = hash_tree(os.path.join(out, k))
  if "conditions" not in skip:
    fp.update(conditions(out))
  if "train" not in skip:
    run("train.py", "--config", "configs/test.py", "--workdir", f"{out}/train", "--config.steps=60")
    from flax import nnx

    from cdeit_jax.checkpoints import loading

    for w in ("raw", "ema"):
      model, meta = loading.load(f"{out}/train", weights=w)
      h = hashlib.sha256()
      leaves = nnx.state(model, nnx.Param).to_pure_dict()
      import jax

      flat = jax.tree_util.tree_flatten_with_path(leaves)[0]
      _hash_arrays(h, w, {jax.tree_util.keystr(k): np.asarray(v) for k, v in flat})
      fp[f"train60_{w}_step{meta['step']}"] = h.hexdigest()
  if "shipped" not in skip:
    run(
      "eval.py", "--workdir", "models/cdeit16", "--data", "uef2017", "--data_path", "data/uef2017",
      "--out", f"{out}/eval_cdeit16", "--config.eval.tikhonov=True", "--config.eval.figure=False",
    )  # fmt: skip
    fp["shipped_cdeit16_uef2017"] = hash_tree(f"{out}/eval_cdeit16")
    cases = sorted(f for f in os.listdir(f"{REPO}/data/uef2017") if f.endswith(".npz"))
    ys = [np.load(f"{REPO}/data/uef2017/{f}")["ys"][:, 0] for f in cases]
    np.save(f"{out}/uef2017_frames.npy", np.stack(ys))
    run(
      "-m", "cdeit_jax.reconstruct", "--workdir", "models/cdeit16", "--frames",
      f"{out}/uef2017_frames.npy", "--units", "uef2017", "--out", f"{out}/rec_cdeit16",
    )  # fmt: skip
    fp["shipped_cdeit16_reconstruct"] = hash_tree(f"{out}/rec_cdeit16")
    run(
      "eval.py", "--workdir", "models/ktc2023", "--data", "ktc2023_challenge", "--data_path",
      "data/ktc2023/levels", "--out", f"{out}/eval_ktc2023", "--config.eval.tikhonov=True",
    )  # fmt: skip
    fp["shipped_ktc2023_challenge"] = hash_tree(f"{out}/eval_ktc2023")
  return fp


if __name__ == "__main__":
  main()
