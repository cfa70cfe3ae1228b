"""Reconstruct a test set with CDEIT and write metrics, predictions and figures.

  python eval.py --workdir RUN --data uef2017 --data_path data/uef2017 --out OUT
  python eval.py --workdir RUN/checkpoints/2000 --data simulated --data_path DATA/test --out OUT \\
      --config.sampling.num_samples=8 --config.eval.tikhonov=True
  python eval.py --workdir runs/ktc2023 --data ktc2023_challenge --data_path DIR --out OUT \\
      --config.eval.tikhonov=True
  python eval.py --workdir runs/device --data recording --data_path frames.npz --out OUT
  python eval.py --data ktc2023_challenge --data_path DIR --out OUT   # no model: linearised
  python eval.py --workdir RUN --data greit --out OUT   # GREIT's figures of merit, no data

--data is the kind of test data (cdeit_jax/infer/data_kinds.py), --units the units it is in
(default: the kind's).

The settings are the checkpoint's config (`config.sampling`, `config.eval`, see
cdeit_jax/config_lib.py), changed with --config.KEY=VALUE; the model's runtime keys too
(--config.model.dtype=bfloat16, --config.model.attention_query_chunk=512); --config_help lists
every key with the checkpoint's value, its default and meaning (docs/config.md). Multi-host: the
same --coordinator_address/--num_processes/--process_id as train.py.
Writes OUT/metrics.json, metrics.csv, predictions.npz, predictions.mat, reconstructions.png;
for ktc2023_challenge OUT/level_K/N.mat (the challenge's answers), answers.png, metrics.json;
for greit OUT/greit.json, greit.npz, greit.png.
"""

if __name__ == "__main__":
  from cdeit_jax.common import cpu_tuning

  cpu_tuning.apply()  # before jax starts (may re-execute this command once)

from absl import flags

from cdeit_jax import cli

cli.define_checkpoint_config("--config.sampling.steps=10, --config.eval.tikhonov=True")
flags.DEFINE_string(
  "workdir",
  None,
  "a run directory (train.py or python -m cdeit_jax.convert): "
  "its best validated checkpoint that loads, else the latest; or one "
  "RUN/checkpoints/STEP; left out with --data ktc2023_challenge: the linearised answers "
  "(--config.simulator.tikhonov_alpha, --config.eval.tikhonov_segment_level)",
)
flags.DEFINE_string(
  "data",
  None,
  "kind of test data (cdeit_jax/infer/data_kinds.py): simulated (npz files of python -m "
  "cdeit_jax.simulate), uef2017 (npz files in the UEF2017 tank's units), recording (one frames "
  "file of the model's device with its true images as `targets`), ktc2023_challenge "
  "(KTC2023's level_K folders, answered as the challenge asks); or a named system's npz files "
  "(e.g. ktc2023); greit (no data: GREIT's figures of merit on 100 simulated targets)",
)
flags.DEFINE_string(
  "data_path",
  None,
  "the data: a folder of npz files, a frames file (recording), a folder of level_K folders "
  "(ktc2023_challenge); none for greit",
)
flags.DEFINE_string(
  "units",
  None,
  "the data's units: simulated, or a named system's (cdeit16, uef2017, ktc2023); default: the "
  "kind's (recording: the model's device's own, e.g. its calibrated gain); "
  "--config.eval.voltage_ratio and --config.eval.current_ratio override either ratio",
)
flags.DEFINE_string("out", None, "output folder")
cli.define_cluster_flags()
cli.define_cache_flag()
flags.mark_flags_as_required(["data", "out"])
FLAGS = flags.FLAGS


def main(argv):
  del argv
  cli.init_distributed()
  from cdeit_jax.infer import data_kinds

  overrides = cli.checkpoint_overrides()
  r = data_kinds.evaluate(
    FLAGS.workdir, FLAGS.data, FLAGS.data_path, FLAGS.out, overrides, FLAGS.units
  )
  if "images_per_s" not in r:  # the challenge's answers, the GREIT test
    print(r.get("table", "no truths: the answers are written, not scored"))
    written = r.get("written", "answers, figure and metrics.json")
    print(f"{written} in {FLAGS.out} ({r['settings']['seconds']:.1f} s)")
    return
  if "metrics" in r:
    from cdeit_jax.infer import metrics

    for name, m in r["metrics"].items():
      if name == "uncertainty":
        from cdeit_jax.infer.evaluation_table import uncertainty_note

        print("uncertainty" + uncertainty_note(m).replace(";", ":", 1))
        continue
      cells = [f"{f.label} " + f.fmt.format(m.get(f.name, float("nan"))) for f in metrics.IMAGE]
      print(f"{name:8s} " + "  ".join(cells))
    print(
      f"sampling: {r['images_per_s']:.2f} images/s, {r['ms_per_image']:.1f} ms/image on "
      f"{r['devices']} device(s); outputs in {FLAGS.out}"
    )


if __name__ == "__main__":
  cli.run(main)
