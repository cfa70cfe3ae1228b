"""A simulated time series of voltage frames, as a device would record it (`make moving-demo`).

  python -m cdeit_jax.sequence --out runs/moving.npz [--num_frames 90] [--snr_db 40]

Two lung-like regions (resistive ellipses left and right) fill and empty, and a conductive disc
travels once around the tank along the wall, then across the centre. Each frame is the absolute
voltage vector of the nominal simulated system (`eit.default_simulator`, simulation units:
preset `simulated`) with white noise at `snr_db`; the reference frame is the empty tank's, with
its own noise. Writes an npz with `frames` (N, 208), `reference` (208,) and `targets`
(N, 128, 128), the true label images, which `python -m cdeit_jax.reconstruct` reads as is.
"""

from __future__ import annotations

import zipfile

import numpy as np
from absl import app, flags

from cdeit_jax.eit.spec import KINDS, MAX_INCLUSIONS, ROW

FLAGS = flags.FLAGS
LUNG = -0.6  # label (log10 conductivity ratio) of a full lung region
OBJECT = 0.8  # label of the travelling conductive disc
BREATH = 30  # frames per breath


def phantoms(num_frames: int) -> np.ndarray:
  """(num_frames, MAX_INCLUSIONS, ROW) phantom parameters of the sequence
  ([active, kind, cx, cy, a, b, angle, label, p] per inclusion, `eit.phantom`)."""
  out = np.zeros((num_frames, MAX_INCLUSIONS, ROW))
  t = np.arange(num_frames)
  fill = LUNG * (1 - np.cos(2 * np.pi * t / BREATH)) / 2
  ellipse, disc = KINDS.index("ellipse"), KINDS.index("disc")
  for i, cx in enumerate((-0.38, 0.38)):  # semi-axes 0.2 across, 0.34 along y
    out[:, i] = np.stack(
      [
        np.ones_like(fill),
        np.full_like(fill, ellipse),
        np.full_like(fill, cx),
        np.full_like(fill, 0.05),
        np.full_like(fill, 0.2),
        np.full_like(fill, 0.34),
        np.zeros_like(fill),
        fill,
        np.zeros_like(fill),
      ],
      -1,
    )
  around = int(round(num_frames * 2 / 3))  # once around the wall, then across the centre
  phi = -np.pi / 2 + 2 * np.pi * np.arange(around) / max(around, 1)
  path = np.concatenate(
    [
      np.stack([0.78 * np.cos(phi), 0.78 * np.sin(phi)], -1),
      np.stack([np.zeros(num_frames - around), np.linspace(-0.78, 0.78, num_frames - around)], -1),
    ]
  )
  out[:, 2, :2] = (1, disc)
  out[:, 2, 2:4] = path
  out[:, 2, 4] = 0.12
  out[:, 2, 7] = OBJECT
  return out


def simulate(
  num_frames: int = 90, snr_db: float | None = 40.0, seed: int = 0
) -> dict[str, np.ndarray]:
  """{'frames' (N, 208), 'reference' (208,), 'targets' (N, 128, 128)} of the sequence."""
  import jax

  from cdeit_jax import eit
  from cdeit_jax.eit import layout
  from cdeit_jax.eit import phantom as ph

  sim = eit.default_simulator(
    layout.preset("cdeit16"), "float64" if jax.config.jax_enable_x64 else "float32"
  )
  params = phantoms(num_frames)
  frames = np.asarray(jax.jit(lambda p: sim.cem.voltages(sim.phantom_conductivity(p)))(params))
  reference = np.asarray(sim.vh)
  if snr_db is not None:
    key = jax.random.key(seed)
    frames = np.asarray(eit.add_noise(frames, snr_db, jax.random.fold_in(key, 0)))
    reference = np.asarray(eit.add_noise(reference, snr_db, jax.random.fold_in(key, 1)))
  targets = np.asarray(jax.jit(jax.vmap(ph.render_image))(params))
  return {
    "frames": frames.astype(np.float64),
    "reference": reference.astype(np.float64),
    "targets": targets.astype(np.float32),
  }


MARK, WRITER = "written_by", "cdeit_jax.sequence"  # in the file: what --out may replace
WHAT = "a moving sequence (python -m cdeit_jax.sequence)"


def ours(path: str) -> bool:
  """Whether `path` is a sequence this command wrote (its MARK), which --out replaces."""
  from cdeit_jax.common import fileio

  try:
    return str(fileio.load_npz(path, [MARK]).get(MARK, "")) == WRITER
  except (OSError, ValueError, EOFError, zipfile.BadZipFile):
    return False


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}: every setting is a flag")
  from cdeit_jax.checkpoints import shipped
  from cdeit_jax.common import fileio

  f = FLAGS
  shipped.refuse_write(f.out, "--out")
  fileio.writable_folder(fileio.dirname(fileio.resolve(f.out)), "--out")
  fileio.output_file(f.out, "--out", ours, WHAT)  # a sequence is replaced, nothing else
  seq = simulate(f.num_frames, None if np.isinf(f.snr_db) else f.snr_db, f.seed)

  def write(path):
    with open(path, "wb") as fh:
      np.savez(fh, **seq, **{MARK: np.asarray(WRITER)})

  fileio.atomic_write(f.out, write, ours=ours, what=WHAT)
  print(
    f"wrote {f.out}: {f.num_frames} frames of {seq['frames'].shape[1]} voltages, a "
    "reference frame (the empty tank) and the true images"
  )


if __name__ == "__main__":
  from cdeit_jax import cli

  flags.DEFINE_string("out", None, "the npz file to write", required=True)
  flags.DEFINE_integer("num_frames", 90, "frames after the reference frame", lower_bound=3)
  flags.DEFINE_float("snr_db", 40.0, "noise (dB); inf: none")
  flags.register_validator(
    "snr_db", lambda v: not np.isnan(v), "--snr_db=nan: give a number of dB (inf: no noise)"
  )
  flags.DEFINE_integer("seed", 0, "seed of the noise")
  cli.run(main)
