"""eval.py --data greit: the standard GREIT test (EIDORS' "GREIT test parameters" tutorial, Adler
et al. 2009) on the model's own measuring system: 100 targets of radius 0.05 (label +1: sigma 10
times the background's) at r = 0 ... 0.9 along the +x axis, simulated noise-free by the built-in
simulator (`eit.greit.target_voltages`), reconstructed by the model and by every baseline (the
in-tool Tikhonov and GREIT), and their GREIT figures (`metrics.GREIT`, EIDORS' definitions or
`--config.eval.greit_figures=pyeit`) and noise figures (`eit.greit.noise_figure`: the centre
target with the simulator's noise at the model's `config.simulator.snr_db`, 64 draws, each of
CDEIT's images of it sampled with the noise of the noise-free one's, so that only the data's noise
moves it).

A sampler's image is the mean of its samples; a segmenter's (`output="classes"`, models/ktc2023)
is its class contrast p_conductive - p_resistive (`Reconstruction.images`), in the same label units
as the targets. The baselines' images are not scaled (AR is a ratio to the centre targets').

Writes OUT/greit.npz (`positions` (N, 2) in units of the tank's radius, `medium` (H, W), one (N,
H, W) array per method), OUT/greit.png (each figure against the radius) and OUT/greit.json
(every target's figures per method, the noise figures, the settings) last, published whole
(`outputs.publish`).
"""

from __future__ import annotations

import io
import json
import time

import jax.numpy as jnp
import numpy as np

from cdeit_jax.common import logs
from cdeit_jax.common.errors import InputError
from cdeit_jax.eit import greit, phantom, tikhonov
from cdeit_jax.infer import greit_merit, metrics, outputs

log = logs.log.getChild("greit")
NUM_TARGETS, MAX_RADIUS = 100, 0.9
TABLE_RADII = (0.0, 0.3, 0.5, 0.7, 0.9)  # the closing table's targets
OUTPUTS = ("greit.npz", "greit.png", "greit.json")  # greit.json last: a complete test
BASELINES = {  # name -> the reconstruction of a system from its present values
  "tikhonov": tikhonov.of_values,
  "greit": greit.of_values,
}


def positions(n: int = NUM_TARGETS) -> np.ndarray:
  """(n, 2) the targets' centres: r = 0 ... 0.9 evenly along the +x axis."""
  r = np.linspace(0.0, MAX_RADIUS, n)
  return np.stack([r, np.zeros_like(r)], 1)


def run(kind, workdir: str, data_path, out: str, overrides=None, units=None) -> dict:
  """`data_kinds`' greit (no data, no units: the targets are simulated in the simulator's)."""
  from cdeit_jax.infer import reconstructor, run_opening

  t0 = time.perf_counter()
  with run_opening.open_run(workdir, overrides) as opened:
    run_, cfg, system = opened.run, opened.cfg, opened.system
    outputs.check_place(out, None, run_.workdir)
    opened.frames.check_kind(kind, workdir)
    e = cfg.eval
    if e.greit_figures not in greit_merit.DEFINITIONS:
      raise InputError(
        f"--config.eval.greit_figures={e.greit_figures!r}: one of {greit_merit.DEFINITIONS}"
      )
    if not (isinstance(e.removal, int) and 0 <= e.removal < len(system.sets)):
      raise InputError(
        f"--config.eval.removal={e.removal!r}: this model knows the electrode-removal sets "
        f"0..{len(system.sets) - 1}"
      )
    outputs.check_out(out, None, run_.workdir, OUTPUTS)
    rec = reconstructor.Reconstructor.from_opened(opened)
  n = NUM_TARGETS if e.max_examples is None else min(NUM_TARGETS, e.max_examples)
  test = simulate(system.device, system.removed[e.removal], positions(n), cfg.simulator.snr_db)
  t1 = time.perf_counter()
  images, noise_figures = reconstruct(rec, test)
  images = {m: np.asarray(v, np.float32) for m, v in images.items()}  # as greit.npz holds them
  sampled = time.perf_counter() - t1
  figures = {
    m: metrics.greit_figures(im, test["positions"], test["medium"], test["truths"], e.greit_figures)
    for m, im in images.items()
  }
  result = {
    "targets": [
      {
        "position": [float(v) for v in p],
        "figures": {m: {k: float(v[i]) for k, v in f.items()} for m, f in figures.items()},
      }
      for i, p in enumerate(test["positions"])
    ],
    "noise_figure": noise_figures,
    "definition": e.greit_figures,
    "definitions": {
      "figures": greit_merit.__doc__.split("\n\n", 1)[1].strip(),
      "test": __doc__.split("\n\n")[0],
    },
    "settings": {
      "checkpoint": rec.checkpoint,
      "layout": system.device.describe(),
      "removal": e.removal,
      "targets": n,
      "target_radius": greit.TARGET_RADIUS,
      "target_label": greit.TARGET_LABEL,
      "noise_snr_db": float(cfg.simulator.snr_db),
      "noise_draws": greit.NOISE_DRAWS,
      "num_samples": rec.num_samples,
      "sampling_steps": rec.steps,
      "seed": rec.seed,
      "sampling_seconds": sampled,
    },
  }
  write(out, test, images, figures, result)
  result["settings"]["seconds"] = time.perf_counter() - t0
  result["table"] = table(test["positions"], figures, noise_figures)
  result["written"] = ", ".join(OUTPUTS)
  return result


def simulate(device, removed: np.ndarray, pos: np.ndarray, snr_db: float) -> dict:
  """The test's targets measured by `device`: positions, truths (N, 128, 128, label units), the
  medium, the values (N, R) (NaN where `removed`), and the centre target's noise draws."""
  params = greit.target_params(pos)
  ys = greit.target_voltages(device, params)
  centre = int(np.argmin(np.hypot(*pos.T)))
  return {
    "positions": pos,
    "truths": np.stack([np.asarray(phantom.render_image(jnp.asarray(p))) for p in params]),
    "medium": phantom.disk_mask(phantom.IMAGE_SIZE),
    "values": np.where(removed, np.nan, ys),
    "present": ~removed,
    "device": device,
    "centre": centre,
    "noise": np.where(removed, np.nan, greit.noise_draws(device, ys[centre], snr_db)),
  }


def reconstruct(rec, test: dict) -> tuple[dict[str, np.ndarray], dict[str, float]]:
  """({method: images (N, H, W)}, {method: noise figure}) of the model (`rec`, a Reconstructor)
  and the baselines. The model's images of the noisy centre target are each sampled alone with
  the noise-free one's example index, so its sampler's noise is the same in all of them."""
  values, present, c = test["values"], test["present"], test["centre"]
  noisy_values = values[c] + test["noise"]
  images = {"cdeit": rec.reconstruct_values(values, where="the GREIT targets").images}
  noisy = {
    "cdeit": np.stack(
      [rec.reconstruct_values(v[None], first_index=c, where="the GREIT targets").images[0]
       for v in noisy_values]
    )
  }  # fmt: skip
  for name, of_values in BASELINES.items():
    method = of_values(test["device"], present)
    images[name] = method(np.nan_to_num(values))
    noisy[name] = method(np.nan_to_num(noisy_values))
  nf = {
    m: greit.noise_figure(values[c], test["noise"], images[m][c], noisy[m], test["medium"])
    for m in images
  }
  return images, nf


def table(pos: np.ndarray, figures: dict[str, dict], noise_figures: dict[str, float]) -> str:
  """A markdown table: each method's figures at the targets nearest `TABLE_RADII`."""
  heads = [f.label for f in metrics.GREIT]
  lines = [
    "| method | r | " + " | ".join(heads) + " | NF |",
    "|---|---|" + "---|" * (len(heads) + 1),
  ]
  r = np.hypot(*pos.T)
  for m, f in figures.items():
    for want in TABLE_RADII:
      i = int(np.argmin(np.abs(r - want)))
      cells = [fig.fmt.format(f[fig.name][i]) for fig in metrics.GREIT]
      lines.append(f"| {m} | {r[i]:.2f} | " + " | ".join(cells) + f" | {noise_figures[m]:.3f} |")
  return "\n".join(lines)


def write(out: str, test: dict, images: dict, figures: dict, result: dict) -> list[str]:
  """greit.npz, greit.png and greit.json (last), published whole."""
  from cdeit_jax.common import fileio

  def write_all(folder: str) -> list[str]:
    def npz(p):
      with open(p, "wb") as fh:  # a handle: np.savez would append ".npz" to the temporary name
        np.savez(fh, positions=test["positions"], medium=test["medium"], **images)

    fileio.atomic_write(fileio.join(folder, "greit.npz"), npz)
    fileio.atomic_write(fileio.join(folder, "greit.png"), lambda p: figure(p, test, figures))
    text = json.dumps(outputs.json_clean(result), indent=1, allow_nan=False)
    fileio.write_text(fileio.join(folder, "greit.json"), text)
    return list(OUTPUTS)

  return outputs.publish(out, write_all)


def figure(path: str, test: dict, figures: dict) -> None:
  """Each GREIT figure against the target's radius, one panel each, as the paper draws them."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  r = np.hypot(*test["positions"].T)
  fig, axes = plt.subplots(
    len(metrics.GREIT), 1, figsize=(5, 1.6 * len(metrics.GREIT)), sharex=True
  )
  for ax, f in zip(axes, metrics.GREIT):
    for m, values in figures.items():
      ax.plot(r, values[f.name], label=m)
    ax.set_ylabel(f.label)
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=7, ncol=len(figures))
  axes[-1].set_xlabel("target radius (fraction of the tank's)")
  fig.tight_layout()
  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=80)
  plt.close(fig)
  with open(path, "wb") as fh:
    fh.write(buf.getvalue())
