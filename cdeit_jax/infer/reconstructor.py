"""The public inference API: difference voltages (or a reference frame and frames) in a device's
units -> images, with a trained or imported CDEIT.

  from cdeit_jax import Reconstructor
  rec = Reconstructor.from_workdir("runs/demo", units="uef2017")
  out = rec.reconstruct(frames=v, reference=v_ref, num_samples=8)  # dv = v - v_ref
  out.images, out.std                                              # (N, 128, 128) each

eval.py and `python -m cdeit_jax.reconstruct` sample through this object, so a test set's
predictions and a stream's frames come from one conditioning (`measurement.condition` with the
checkpoint's statistics and the units' ratios; a model of another measuring system reads its
R standardised values), one set of guards (`frame_guards`: `rec.guards`), one compiled sampler
(`sampling`) and one noise rule (row r: fold_in(fold_in(key(seed), sample k), example index)).

Batches are padded to a bucket (the devices times 1, 2, 4, ... up to the largest batch that
fits), each compiled once, so a stream of batches of any size never recompiles.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import nnx

from cdeit_jax.common import logs
from cdeit_jax.common import sharding as shd
from cdeit_jax.common.errors import InputError
from cdeit_jax.data import sources
from cdeit_jax.data import stats as stats_lib
from cdeit_jax.eit import layout, measurement, symmetry
from cdeit_jax.infer import frame_guards, intervals, run_frames, run_opening, sampling
from cdeit_jax.infer.run_opening import MAX_SAMPLES, is_int
from cdeit_jax.model.diffusion import Diffusion

log = logs.log.getChild("eval")


@dataclasses.dataclass(frozen=True)
class Reconstruction:
  """What `Reconstructor.reconstruct` returns (label units), as the model's output kind gives it
  (`Output.reconstruction`): `images` (N, 128, 128), the mean over K samples; `std` (N, 128, 128)
  the calibrated per-pixel std, None for K = 1; `samples` (K, N, 128, 128) when asked for; a
  segmenter's `probabilities` (N, 128, 128, 3) of water, resistive and conductive, its image
  and std those of its class contrast (-1, 0, +1) under them; `calibration` the std's
  (`infer.intervals`), whose `interval` at any level it holds."""

  images: np.ndarray
  std: np.ndarray | None = None
  samples: np.ndarray | None = None
  probabilities: np.ndarray | None = None
  calibration: intervals.Calibration | None = None

  def interval(self, level: float = intervals.TWO_SIGMA) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) (N, 128, 128): the per-pixel interval at coverage `level` (default "2
    std", 95.4 %), the std's calibrated scale for that level."""
    if self.std is None:
      raise InputError("an interval needs the std of several samples (num_samples > 1)")
    c = self.calibration or intervals.UNCALIBRATED
    half = self.std * np.float32(c.scale(level) / c.std_scale)
    return self.images - half, self.images + half

  def turned(self, radians: float) -> Reconstruction:
    """This reconstruction with its object turned counter-clockwise by `radians` about the
    tank's centre (`turns.turn_images`: the images, stds, samples and class probabilities
    alike): a model's images of a device whose electrodes are the model's turned by that angle
    (`turns.offset`)."""
    from cdeit_jax.eit import turns

    turn = lambda a, axes: None if a is None else turns.turn_images(a, radians, axes)
    return dataclasses.replace(
      self,
      images=turn(self.images, (-1, -2)),
      std=turn(self.std, (-1, -2)),
      samples=turn(self.samples, (-1, -2)),
      probabilities=turn(self.probabilities, (-2, -3)),
    )

  @property
  def nonfinite(self) -> np.ndarray:
    """The frames (indices) whose image holds NaN or infinite pixels."""
    return np.flatnonzero(~np.isfinite(self.images).all(axis=(1, 2)))


class Reconstructor:
  """A CDEIT with its conditioning and compiled sampler: voltages -> images.

  `config` is the model's config (`loading.model_config(meta)`, or the checkpoint's with
  overrides): `config.sampling` (steps, eta, num_samples, seed, batch_size, data consistency),
  `config.diffusion`, `config.simulator.contact_impedance`. `mean`, `std` (1, 16, 13) are the
  statistics the model's condition is standardised with (the checkpoint's). `frames` says what
  the frames are (`run_frames.Frames`: by default the model's own system's values; a translated
  run's device's, `translated_run.TranslatedDevice`, whose values are translated into the
  model's). `units` (a name of `measurement.unit_names`, or a device in its units) or the ratios
  say in which units the frames' voltages are (`measurement.in_units`; neither: the frames'
  device's own, `measurement.own_units`).
  `uncertainty_scale` calibrates the std (an `intervals.Calibration`, as `eval.py
  --config.eval.fit_uncertainty=True` fits it, or one factor read as a Gaussian's): the offered
  std is the raw one times its 1-std scale.

  Its parts: `guards` (`frame_guards.FrameGuards`) check the frames every entry point takes,
  `sampler` (`sampling.BucketedSampler`) samples their conditions, and `output` (the model's
  `output_kinds.Output`) says a frame's steps and samples and what its answer is."""

  checkpoint: str | None = None  # where the weights came from (from_workdir)

  def __init__(
    self,
    model: nnx.Module,
    config: ml_collections.ConfigDict,
    mean: np.ndarray,
    std: np.ndarray,
    *,
    units: str | layout.Layout | None = None,
    voltage_ratio: float | None = None,
    current_ratio: float | None = None,
    mesh: jax.sharding.Mesh | None = None,
    uncertainty_scale: float | intervals.Calibration = 1.0,
    num_examples: int | None = None,
    frames: run_frames.Frames | None = None,
  ):
    self.config = config
    self.frames = frames if frames is not None else run_frames.Frames(model.system.device)
    self.device = self.frames.device  # the device whose frames the API takes
    s = config.sampling
    # what the model outputs (config.model.output): its steps, samples and answers
    self.output = model.system.output
    self.steps, self.eta = self.output.diffusion_steps(s.steps), float(s.eta)
    self.num_samples, self.seed = self.output.samples_per_frame(s.num_samples), int(s.seed)
    if units is None and voltage_ratio is None and current_ratio is None:
      units = measurement.own_units(self.device)
    self.units = measurement.in_units(
      self.device, units or measurement.SIMULATED, voltage_ratio, current_ratio
    )
    self.voltage_ratio, self.current_ratio = self.units.gain, self.units.current_ratio
    self.mean, self.std = stats_lib.check_stats(
      np.asarray(mean), np.asarray(std), source="the statistics"
    )
    # what they are (from_workdir: the checkpoint's, or those --config.eval.stats names)
    self.statistics = stats_lib.Statistics(self.mean, self.std, source="given")
    self.calibration = (
      uncertainty_scale
      if isinstance(uncertainty_scale, intervals.Calibration)
      else intervals.Calibration.of_scale(float(uncertainty_scale))
    )
    self.uncertainty_scale = self.calibration.std_scale
    # the one set of guards of the frames (the absolute frames' allows for the model's drift):
    # the model's own, as the frames are judged (a translated device's: on their translation)
    own = frame_guards.FrameGuards(
      model, self.mean, self.std, self.units, frame_guards.drift_allowance(config)
    )
    self.guards = self.frames.guards(own, self.units)
    self.mesh = mesh if mesh is not None else shd.make_mesh()
    self.shape = (model.image_size, model.image_size, model.out_channels)
    self.cond_shape = model.cond_shape
    self._read_system(model, own.removed)
    graphdef, weights = nnx.split(model)
    correction_graphdef = None
    if s.data_consistency:
      from cdeit_jax.eit import conditioning

      dc = conditioning.DataConsistency(
        self.mean,
        self.std,
        strength=s.data_consistency,
        alpha=s.data_consistency_alpha,
        layout=self.layout,
      )
      correction_graphdef, dc_state = nnx.split(dc)
      weights = (weights, jax.device_put(dc_state, shd.replicated(self.mesh)))
    self.symmetric = bool(s.symmetric)
    sampler = sampling.make_sampler(
      graphdef,
      Diffusion(**config.diffusion),
      self.steps,
      self.eta,
      self.shape,
      self.mesh,
      correction_graphdef,
      (self.mean, self.std) if self.symmetric else None,
      self.layout if self.symmetric and self.vector else None,
    )
    # The largest batch: the one that fits (or config.sampling.batch_size); smaller buckets are
    # compiled when a batch first needs them.
    self.sampler = sampling.BucketedSampler(
      sampler,
      weights,
      self.mesh,
      jax.random.key(self.seed),
      self.shape,
      self.cond_shape,
      num_examples or 8 * self.mesh.devices.size,
      s.batch_size,
    )

  def _read_system(self, model: nnx.Module, removed: np.ndarray) -> None:
    """The measuring system whose values the model reads (`layout`), as a vector (`vector`) or
    as CDEIT's EIM, with the values its removal sets leave out (`removed`). Sampler settings the
    system cannot take are refused."""
    s = self.config.sampling
    self.vector = model.system.reads_values
    self.layout = model.system.device
    if self.vector and s.data_consistency:
      raise InputError(
        "--config.sampling.data_consistency reads CDEIT's 16-electrode EIM; this model "
        f"(measuring system {self.layout.describe()}) samples without it: set it to 0"
      )
    if self.vector and s.symmetric and (removed.any() or not symmetry.symmetric(self.layout)):
      raise InputError(
        f"--config.sampling.symmetric: the tank's turns and mirror are not symmetries of this "
        f"model's device ({self.layout.describe()}"
        + (", whose electrode-removal sets they would not keep)" if removed.any() else ")")
        + "; set it to False"
      )

  @classmethod
  def from_workdir(
    cls,
    path: str,
    *,
    units: str | layout.Layout | None = None,
    voltage_ratio: float | None = None,
    current_ratio: float | None = None,
    overrides: dict[str, Any] | None = None,
    mesh: jax.sharding.Mesh | None = None,
  ) -> Reconstructor:
    """The checkpoint at `path` (local or gs://; a run: its best validated step, else the
    latest; or one `RUN/checkpoints/STEP`; a translated run: its model, reading its device's
    frames), with eval.py's overrides (dotted keys: `{"sampling.num_samples": 8,
    "model.dtype": "bfloat16"}`)."""
    with run_opening.open_run(path, overrides) as opened:
      return cls.from_opened(
        opened, units=units, voltage_ratio=voltage_ratio, current_ratio=current_ratio, mesh=mesh
      )

  @classmethod
  def from_opened(
    cls,
    opened: run_opening.Opened,
    *,
    units: str | layout.Layout | None = None,
    voltage_ratio: float | None = None,
    current_ratio: float | None = None,
    mesh: jax.sharding.Mesh | None = None,
    num_examples: int | None = None,
  ) -> Reconstructor:
    """`from_workdir` of a run a command opened (`run_opening.open_run`: its candidate, config,
    system and frames resolved already), its weights loaded onto `mesh` here."""
    mesh = mesh if mesh is not None else shd.make_mesh()
    loaded = run_opening.load_opened(opened, mesh)
    # the checkpoint's statistics, or those --config.eval.stats names
    statistics = stats_lib.resolve_stats(
      None, opened.cfg.eval.stats, (loaded.meta.mean, loaded.meta.std)
    )
    rec = cls(
      loaded.model,
      opened.cfg,
      statistics.mean,
      statistics.std,
      units=units,
      voltage_ratio=voltage_ratio,
      current_ratio=current_ratio,
      mesh=mesh,
      uncertainty_scale=run_opening.calibration(opened.run, loaded.meta.step, opened.cfg),
      num_examples=num_examples,
      frames=opened.frames,
    )
    rec.checkpoint = opened.run.step_dir(loaded.meta.step)
    rec.statistics = statistics
    return rec

  # --------------------------------------------------------------------------- the API

  def condition(self, dv: np.ndarray) -> np.ndarray:
    """The model's conditions of difference voltages (N, R) in the device's units (`units` or
    the ratios): the EIM (N, 16, 16, 1) of CDEIT's 208 voltages, or another system's
    standardised values (N, R), NaN where missing."""
    return self._condition(frame_guards.float32(dv) / np.float32(self.voltage_ratio))

  def _condition(self, values: np.ndarray) -> np.ndarray:
    """`condition` of the frames' values in simulation units (the model's values of them,
    `frames`)."""
    values = frame_guards.float32(self.frames(frame_guards.float32(values)))
    if self.vector:
      return sources.condition(values, 1.0, self.mean, self.std, vector=True)[0]
    return measurement.condition(values, 1.0, self.mean, self.std, self.layout)[0]

  def reconstruct(
    self,
    voltages: np.ndarray | None = None,
    *,
    frames: np.ndarray | None = None,
    reference: np.ndarray | None = None,
    num_samples: int | None = None,
    first_index: int = 0,
    keep_samples: bool = False,
    progress: Callable[[int], None] | None = None,
    checked: bool = False,
  ) -> Reconstruction:
    """Images of difference voltages `voltages` (N, R) or (R,), or of `frames` (N, R) minus a
    `reference` frame (R,), in the device's units (`units` or the ratios), values in the
    measuring system's order (CDEIT's 208, or the model's system's R, NaN where a removal set
    of the model leaves a value out). Frame i's noise is that of example `first_index + i`
    (eval.py's example index), so the same voltages and seed give eval.py's predictions.
    `num_samples` (default config.sampling.num_samples) samples per frame, all in the same
    batches. `checked`: the frames are part of a recording `guards.check_recording` passed (whose
    verdict on the whole is not asked again of each part)."""
    dv = self.guards.difference(voltages, frames=frames, reference=reference)
    values = dv / np.float32(self.voltage_ratio)
    if not checked:
      self.guards.check_values(values, "voltages", units=self.units.name)
    return self._sample(self._condition(values), num_samples, first_index, keep_samples, progress)

  def reconstruct_values(
    self,
    values: np.ndarray,
    *,
    num_samples: int | None = None,
    first_index: int = 0,
    where: str = "values",
    keep_samples: bool = False,
    hints: frame_guards.Hints = frame_guards.RECONSTRUCT,
  ) -> Reconstruction:
    """Images of difference values (N, R) already in simulation units (a device's values
    divided by its calibrated gain, `eit.calibration`; the sign as the simulator's, electrode
    + minus electrode -), NaN where a removal set of the model leaves a value out: `reconstruct`
    without the units, through the same guards (`guards.check_values`; `hints`: what their
    refusals ask for, in the words of the command that reads the values)."""
    values = frame_guards.float32(self.guards.rows(values, where))
    self.guards.check_values(values, where, hints=hints)
    return self._sample(self._condition(values), num_samples, first_index, keep_samples, None)

  def reconstruct_conditions(
    self,
    cond: np.ndarray,
    *,
    num_samples: int | None = None,
    first_index: int = 0,
    keep_samples: bool = False,
    progress: Callable[[int], None] | None = None,
  ) -> Reconstruction:
    """Images of conditions `cond` (N, *cond_shape) made already (eval.py's test sets, which
    their sources condition as in training), one sample of every frame at a time, each sampler
    call a full largest batch of frames (one compiled size, so a test set's images do not
    depend on how it is chunked); frame i's noise is that of example `first_index + i`, as in
    `reconstruct`."""
    n = len(cond)
    k = self._samples(num_samples, first_index, n)
    index = (first_index + np.arange(n)).astype(np.int32)
    outs = np.stack(
      [
        self.sampler.sample_rows(cond, index, np.full(n, j, np.int32), progress, full=True)
        for j in range(k)
      ]
    )
    frame_major = outs.swapaxes(0, 1).reshape(n * k, *outs.shape[2:])
    fields = self.output.reconstruction(frame_major, n, self.uncertainty_scale, keep_samples)
    return Reconstruction(**fields, calibration=self.calibration)

  def _samples(self, num_samples: int | None, first_index: int, n: int) -> int:
    """The samples a frame of `n` takes (`num_samples`, default the config's), checked with
    the first example index."""
    k = self.num_samples if num_samples is None else num_samples
    if not is_int(k) or not 1 <= k <= MAX_SAMPLES:
      raise InputError(f"num_samples={num_samples!r}: must be an integer from 1 to {MAX_SAMPLES}")
    last = np.iinfo(np.int32).max - n  # example indices are int32
    if not is_int(first_index) or not 0 <= first_index <= last:
      raise InputError(f"first_index={first_index!r}: must be an integer from 0 to {last}")
    return self.output.samples_per_frame(k)  # a deterministic kind: one pass is all

  def _sample(
    self,
    cond: np.ndarray,
    num_samples: int | None,
    first_index: int,
    keep_samples: bool,
    progress: Callable[[int], None] | None,
  ) -> Reconstruction:
    n = len(cond)
    k = self._samples(num_samples, first_index, n)
    rows_frame = np.repeat(np.arange(n), k)  # frame-major: a frame's K samples share a batch
    rows_sample = np.tile(np.arange(k, dtype=np.int32), n)
    imgs = self.sampler.sample_rows(
      cond[rows_frame], (first_index + rows_frame).astype(np.int32), rows_sample, progress=progress
    )
    fields = self.output.reconstruction(imgs, n, self.uncertainty_scale, keep_samples)
    return Reconstruction(**fields, calibration=self.calibration)

  def __repr__(self) -> str:
    return (
      f"Reconstructor({self.checkpoint or 'model'}, units={self.units.name!r}, "
      f"steps={self.steps}, num_samples={self.num_samples}, buckets={self.sampler.buckets})"
      f"{self.frames.reading()}"
    )
