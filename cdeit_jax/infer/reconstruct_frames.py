"""The reconstruct command's work (`python -m cdeit_jax.reconstruct`): a device's frames file
through a run's Reconstructor into images, written as they come (`infer.frames.FramesWriter`),
with the command's checks of its flags (`Request`) and of eval.py's settings it takes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class Request:
  """The reconstruct command's flags (cdeit_jax/reconstruct.py says each)."""

  workdir: str
  frames: str
  out: str
  units: str | None = None
  voltage_ratio: float | None = None
  current_ratio: float | None = None
  reference: str | None = None
  reference_row: int | None = None
  skip_bad_frames: bool = False
  chunk: int = 256
  fps: float = 10.0
  figures: bool = True
  negate: bool = False


def reconstruct(req: Request, overrides: dict) -> str:
  """Image `req.frames` with the run at `req.workdir` (eval.py's settings `overrides`) into
  `req.out`; returns the line that says what was done. An --out folder made here is removed
  again when a refusal leaves it empty."""
  from cdeit_jax.infer import outputs

  with outputs.left_as_found(req.out), contextlib.ExitStack() as stack:
    return _reconstruct(req, dict(overrides), stack)


def _reconstruct(req: Request, overrides: dict, stack: contextlib.ExitStack) -> str:
  import time

  import numpy as np

  from cdeit_jax.checkpoints import shipped
  from cdeit_jax.common import compile_cache, fileio, logs
  from cdeit_jax.infer import frames, outputs, run_opening
  from cdeit_jax.infer.frame_guards import listed
  from cdeit_jax.infer.reconstructor import Reconstructor

  t_start = time.perf_counter()
  shipped.refuse_write(req.out, "--out")  # before the model or the frames are read
  inputs = [("--frames", req.frames), ("--reference", req.reference)]
  fileio.refuse_own_input(req.out, "--out", inputs, writes=frames.OUTPUTS)
  voltage_ratio, current_ratio = _settings(req, overrides)
  with run_opening.open_run(req.workdir, overrides) as opened:
    # the frames are the values of `opened.frames.device` (the model's, or a translated run's)
    recording, reference, ref_where = _frames_and_reference(
      req, opened.frames.device, opened.workdir
    )
    stack.enter_context(recording)
    t0 = time.perf_counter()
    with compile_cache.Watch() as cache:
      rec = Reconstructor.from_opened(
        opened, units=req.units, voltage_ratio=voltage_ratio, current_ratio=current_ratio
      )
  where, n = req.frames, recording.n
  ok = _checked(req, rec, recording, reference, where, ref_where)
  calls = _calls(ok, n, req.chunk)
  for size in {len(run) for runs in calls.values() for run in runs}:
    rec.sampler.prepare(size * rec.num_samples)  # timing starts after compilation
  setup_s = time.perf_counter() - t0
  skipped = np.setdiff1d(np.arange(n), ok)
  if len(skipped):
    logs.log.warning(
      f"{where}: skipping {len(skipped)} rows with NaN or infinite voltages "
      f"(their images are NaN): {listed(skipped)}"
    )
  k = rec.num_samples
  logs.log.info(
    f"{rec!r} from {rec.checkpoint}: ready in {setup_s:.1f} s "
    f"({'compilation cache' if cache.hit else 'compiled'}); {len(ok)} frames"
  )
  primary = jax_primary()
  staged = outputs.Staged(req.out) if primary else None
  with outputs.failing(staged) if primary else contextlib.nullcontext():
    sink = None
    if primary:  # every frame written as it comes: memory stays flat
      sink = frames.FramesWriter(
        staged.work, n, rec.shape[0], k > 1, skipped, rec.current_ratio / rec.voltage_ratio
      )
    bar = logs.progress(len(ok), "reconstructing", "frame", enabled=primary)
    t0 = time.perf_counter()
    for (lo, hi), runs in calls.items():
      # frames lo .. hi minus the reference, read from the file now (memory stays flat)
      dv = rec.guards.difference(
        frames=recording.rows(lo, hi),
        reference=reference,
        where=where,
        ref_where=ref_where,
        first_row=lo,
      )
      for run in runs:
        r = rec.reconstruct(  # checked above, as a whole
          dv[run - lo], first_index=int(run[0]), progress=lambda m: bar.update(m / k), checked=True
        )
        if sink is not None:
          sink.add(int(run[0]), r.images, r.std)
    sample_s = time.perf_counter() - t0
    bar.close()
    written = []
    if sink is not None:
      shown = recording.targets(sink.kept)
      written = sink.finish(
        {**_info(req, rec, reference, k), "reference_from": ref_where},
        fps=req.fps,
        figures=req.figures,
        targets=shown,
      )
      if sink.nonfinite:
        logs.log.warning(
          f"{where}: rows {listed(sink.nonfinite)} gave NaN or infinite images "
          "(listed in frames.npz's and frames.mat's `skipped`); check those frames' voltages"
        )
      staged.commit(written)
  rate = len(ok) / sample_s
  return (
    f"reconstructed {len(ok)} frames ({k} sample{'s' if k > 1 else ''} each, {rec.steps} "
    f"steps) in {sample_s:.2f} s: {rate:.1f} frames/s after {setup_s:.1f} s of loading and "
    f"compilation ({time.perf_counter() - t_start:.1f} s in all); "
    f"{', '.join(written) or 'nothing'} in {req.out}"
  )


def _checked(req: Request, rec, recording, reference, where: str, ref_where: str):
  """The recording's rows that can be imaged (`FrameGuards.check_recording`, the whole judged
  once); a square R x R file is said to be read as one frame a row (its shape cannot tell rows
  from columns, and EIDORS keeps frames as columns), in a refusal and as a warning."""
  from cdeit_jax.common import logs
  from cdeit_jax.common.errors import InputError

  n = recording.n
  square = (
    f"{where} is a square {n} x {n} array, read as one frame a row; if its frames are its "
    "columns (EIDORS's layout), give it transposed"
  )
  try:
    ok = rec.guards.check_recording(
      recording, reference, where, skip_bad=req.skip_bad_frames, ref_where=ref_where
    )
  except InputError as e:
    if not recording.square:
      raise
    raise InputError(f"{e}. Note: {square}") from None
  if recording.square:
    logs.log.warning(square)
  return ok


# eval.py's settings that reconstruct applies too
EVAL_KEYS = ("eval.step", "eval.weights", "eval.stats")


def _settings(req: Request, overrides: dict) -> tuple[float | None, float | None]:
  """eval.py's settings given to reconstruct (`overrides`), checked: those it applies kept,
  the ratios taken out (`_ratios`, returned), any other refused in one line."""
  from cdeit_jax.common.errors import InputError
  from cdeit_jax.infer import run_opening

  run_opening.check_overrides(overrides)
  if any(k.startswith("wandb.") for k in overrides):
    raise InputError(
      f"--config.{next(k for k in overrides if k.startswith('wandb.'))}: reconstruct logs nothing "
      "to W&B; eval.py logs an evaluation into a run's W&B run (docs/training.md)"
    )
  ratios = _ratios(req, overrides)
  unused = [k for k in overrides if k.startswith("eval.") and k not in EVAL_KEYS]
  if unused:
    raise InputError(
      f"--config.{unused[0]}: reconstruct does not use it (of eval.py's settings it takes "
      f"{', '.join('--config.' + k for k in EVAL_KEYS)} and the units' ratios; its own flags say "
      "the rest: --units, --skip_bad_frames, --figures); leave it out, or evaluate with eval.py"
    )
  return ratios


def _ratios(req: Request, overrides: dict) -> tuple[float | None, float | None]:
  """(voltage ratio, current ratio): --voltage_ratio / --current_ratio, or eval.py's
  --config.eval.voltage_ratio / current_ratio (taken out of `overrides`); both given and not
  equal is refused in one line."""
  from cdeit_jax.common.errors import InputError

  got = []
  for name in ("voltage_ratio", "current_ratio"):
    flag, setting = getattr(req, name), overrides.pop(f"eval.{name}", None)
    if flag is not None and setting is not None and flag != setting:
      raise InputError(
        f"--{name}={flag:g} and --config.eval.{name}={setting:g} disagree; give one of them"
      )
    got.append(flag if flag is not None else setting)
  return got[0], got[1]


def _frames_and_reference(req: Request, system, workdir: str):
  """(the --frames recording, open (`infer.frames.Recording`), its reference frame or None, where
  that came from in words) of the measuring system `system` (the model's, or a translated run's
  device: its values per frame), from --frames, --reference and --reference_row, the flags
  checked first; --out checked against `workdir`'s checkpoints."""
  from cdeit_jax.common.errors import InputError
  from cdeit_jax.infer import frames

  if req.chunk < 1:
    raise InputError(f"--chunk={req.chunk}: must be >= 1")
  if req.figures and not frames.GIF_FPS[0] <= req.fps <= frames.GIF_FPS[1]:
    raise InputError(
      f"--fps={req.fps:g}: a GIF shows {math.ceil(frames.GIF_FPS[0] * 1e5) / 1e5:g} to "
      f"{frames.GIF_FPS[1]:g} frames "
      "a second (each frame lasts 1/100 s to 655.35 s); give one in that range, or --nofigures"
    )
  if not req.fps > 0:
    raise InputError(f"--fps={req.fps}: must be > 0")
  r, described = system.num_values, system.describe()
  recording = frames.Recording(req.frames, r, described, negate=req.negate)
  try:
    return recording, *_reference(req, recording, system, workdir)
  except BaseException:
    recording.close()
    raise


def _reference(req: Request, recording, system, workdir: str):
  """(the reference frame of --frames, --reference or --reference_row (one of them), or None;
  where it came from, in words); a device file given as --reference must be `system`'s."""
  from cdeit_jax.common.errors import InputError
  from cdeit_jax.infer import frame_guards, frames, outputs

  r, described = system.num_values, system.describe()
  reference, where = recording.reference, f"{req.frames}: its reference frame"
  outputs.check_out(req.out, workdir=workdir, names=frames.OUTPUTS)
  if req.reference is not None:
    if reference is not None:
      raise InputError(
        f"--reference {req.reference}: {req.frames} holds a reference frame "
        "already; give one of them"
      )
    where = f"--reference {req.reference}"
    with frames.Recording(req.reference, r, described, negate=req.negate) as ref:
      frame_guards.check_source(ref, system, where)
      if ref.empty is not None:  # a recording with its own empty tank (a Sciospec folder)
        reference, where = ref.empty, f"{where}: {ref.empty_where}"
      elif ref.n != 1:
        raise InputError(f"{where}: holds {ref.n} frames; give one")
      else:
        reference = ref.rows(0, 1)[0]
  if req.reference_row is not None:
    if reference is not None:
      raise InputError(
        "--reference_row: a reference frame is given already (the file's "
        "`reference` or --reference); give one"
      )
    if not 0 <= req.reference_row < recording.n:
      raise InputError(
        f"--reference_row={req.reference_row}: {req.frames} has rows 0 to {recording.n - 1}"
      )
    reference = recording.rows(req.reference_row, req.reference_row + 1)[0]
    where = f"--reference_row {req.reference_row} of {req.frames}"
  return reference, where


def _info(req: Request, rec, reference, k: int) -> dict:
  """What frames.npz records of how the images were made."""
  from cdeit_jax.common import fileio

  return {
    "checkpoint": rec.checkpoint,
    "frames": fileio.resolve(req.frames),
    "units": rec.units.name,
    "voltage_ratio": rec.voltage_ratio,
    "current_ratio": rec.current_ratio,
    "reference": "given" if reference is not None else "none (difference voltages)",
    "negated": req.negate,
    "sampling_steps": rec.steps,
    "eta": rec.eta,
    "num_samples": k,
    "seed": rec.seed,
    "uncertainty_scale": rec.uncertainty_scale,
  }


def jax_primary() -> bool:
  import jax

  return jax.process_index() == 0


def _calls(ok, n: int, chunk: int) -> dict:
  """{(lo, hi): runs}: the sampler's calls, for each block lo .. hi of at most `chunk` rows of
  the file, the runs of consecutive rows `ok` (sorted) in it; each row's example index is its
  row number (its noise is its own, whatever the chunking)."""
  import numpy as np

  calls = {}
  for lo in range(0, n, chunk):
    hi = min(lo + chunk, n)
    rows = ok[np.searchsorted(ok, lo) : np.searchsorted(ok, hi)]
    if len(rows):
      calls[lo, hi] = _runs(rows)
  return calls


def _runs(rows):
  """`rows` (sorted) cut into runs of consecutive numbers."""
  import numpy as np

  cuts = np.flatnonzero(np.diff(rows) != 1) + 1
  return np.split(rows, cuts)
