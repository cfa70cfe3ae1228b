"""Reconstruct a device's voltage frames into images.

  python -m cdeit_jax.reconstruct --workdir RUN --frames F --out O --units uef2017
  python -m cdeit_jax.reconstruct --workdir RUN --frames F --out O --reference_row 0 \\
      --voltage_ratio 1040.856 --current_ratio 2 --config.sampling.num_samples=8

F: `.npy`, `.npz`, `.mat` or `.csv`, frames as rows (N, R) of the model's measuring system's
values in its order (CDEIT's 208, or a device's, NaN where a removal set leaves one out), or
the device's own file (`cdeit_jax.infer.frames`). They are difference voltages, or frames with
a reference frame (the file's `reference`, --reference FILE or --reference_row K): dv = v -
v_ref. Their units: --units or the ratios, else the model's device's own (a calibrated device's
gain, `make device-model`; a preset's, e.g. ktc2023's), else the simulator's. Writes
O/frames.npz (`images`, `std` for K > 1), O/frames.mat, O/montage.png and O/frames.gif.
Row i is sampled as eval.py samples example i: the same voltages, seed and settings give
eval.py's `pred`. The sampling settings are eval.py's (--config.sampling.*, --config.eval.weights,
--config.model.dtype, ...).
"""

if __name__ == "__main__":
  from cdeit_jax.common import cpu_tuning

  cpu_tuning.apply()  # before jax starts (may re-execute this command once)

from absl import flags

from cdeit_jax import cli

cli.define_checkpoint_config("--config.sampling.num_samples=8, --config.sampling.steps=3")
flags.DEFINE_string(
  "workdir",
  None,
  "a run directory (local or gs://): its best validated "
  "checkpoint, else the latest; or one RUN/checkpoints/STEP",
)
flags.DEFINE_string(
  "frames",
  None,
  "frames file: .npy, .npz, .mat or .csv, rows of the model's measuring system's voltages "
  "(208 for CDEIT's; NaN: a removed electrode's)",
)
flags.DEFINE_string("out", None, "output folder")
flags.DEFINE_string(
  "units",
  None,
  "the device's units: simulated, uef2017, ktc2023 (or give --voltage_ratio and "
  "--current_ratio); default: the model's device's own (a calibrated device's, make "
  "device-model; a preset's), else simulated",
)
flags.DEFINE_float(
  "voltage_ratio", None, "measured / simulated voltage units (overrides the units')"
)
flags.DEFINE_float(
  "current_ratio", None, "measured / simulated current units (overrides the units')"
)
flags.DEFINE_string(
  "reference",
  None,
  "a file with the reference frame (one row): the images are of frames minus it",
)
flags.DEFINE_integer("reference_row", None, "the frames file's row that is the reference frame")
flags.DEFINE_boolean(
  "skip_bad_frames",
  False,
  "image the other frames when some hold NaN or "
  "infinite voltages (they are listed, their images NaN); default: refuse",
)
flags.DEFINE_integer(
  "chunk",
  256,
  "frames per sampler call (bounds the sampler's memory; the "
  "images of every frame are kept until they are written)",
)
flags.DEFINE_float("fps", 10.0, "frames per second of the GIF")
flags.DEFINE_boolean("figures", True, "write montage.png and frames.gif")
flags.DEFINE_boolean(
  "negate",
  False,
  "read the frames and the reference negated: a device that measures with the opposite sign "
  "to the model's (its empty tank's values negative; a negated reference is refused)",
)
cli.define_cluster_flags()
cli.define_cache_flag()
flags.mark_flags_as_required(["workdir", "frames", "out"])
FLAGS = flags.FLAGS


def main(argv):
  """The command: its flags, then `reconstruct_frames.reconstruct`."""
  del argv
  cli.init_distributed()
  import dataclasses

  from cdeit_jax.infer import reconstruct_frames

  fields = dataclasses.fields(reconstruct_frames.Request)  # the flags, by the same names
  request = reconstruct_frames.Request(**{f.name: FLAGS[f.name].value for f in fields})
  print(reconstruct_frames.reconstruct(request, cli.checkpoint_overrides()))


if __name__ == "__main__":
  cli.run(main)
