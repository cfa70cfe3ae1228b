"""Reconstruct a test set with CDEIT and write metrics, predictions and figures.

  python eval.py --workdir RUN_DIR --data uef2017 --data-path data/uef2017 --out OUT_DIR
  python eval.py --checkpoint RUN_DIR/checkpoints/2000 --data simulated --data-path DATA/test \\
      --num-samples 8 --out OUT_DIR

Writes OUT_DIR/metrics.json, metrics.csv, predictions.npz, predictions.mat, reconstructions.png.
"""

import argparse
import logging
import sys


def parse(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  src = p.add_mutually_exclusive_group(required=True)
  src.add_argument("--workdir", help="a run directory (train.py or python -m cdeit_jax.convert); "
                   "uses its best validated checkpoint, else the latest")
  src.add_argument("--checkpoint", help="a specific checkpoint: RUN_DIR/checkpoints/STEP or a run")
  p.add_argument("--data", required=True, help="preset: simulated, uef2017, ktc2023 (or any name "
                 "with --voltage-ratio and --current-ratio)")
  p.add_argument("--data-path", required=True, help="folder of CDEIT npz files")
  p.add_argument("--out", required=True, help="output folder")
  p.add_argument("--step", type=int, default=None, help="checkpoint step within --workdir")
  p.add_argument("--weights", choices=["ema", "raw"], default="ema")
  p.add_argument("--sampling-steps", type=int, default=5)
  p.add_argument("--eta", type=float, default=1.0)
  p.add_argument("--data-consistency", type=float, default=0.0, metavar="S",
                 help="between sampler steps, move each x0 estimate towards the measurements: "
                 "x0 + S M_alpha (y - J x0) with the linearised forward model (0 = off)")
  p.add_argument("--data-consistency-alpha", type=float, default=0.1,
                 help="regularisation level of M_alpha in --data-consistency")
  p.add_argument("--num-samples", type=int, default=1, help="K samples per measurement: the mean "
                 "is the reconstruction, the per-pixel std its uncertainty")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--batch-size", type=int, default=None, help="global (default: the largest of "
                 "8, 4, 2, 1 per device whose compiled sampler fits the memory)")
  p.add_argument("--stats", default=None, help="folder with mean/std overriding the checkpoint's")
  p.add_argument("--voltage-ratio", type=float, default=None)
  p.add_argument("--current-ratio", type=float, default=None)
  p.add_argument("--max-examples", type=int, default=None, help="only the first N files")
  p.add_argument("--config", default=None, help="config file whose model section must match")
  p.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                 help="compute dtype (default: the checkpoint's)")
  p.add_argument("--attention-query-chunk", type=int, default=None,
                 help="global attention over query chunks of this many tokens (less memory)")
  p.add_argument("--tikhonov", action="store_true", help="also reconstruct with the built-in "
                 "one-step Tikhonov/NOSER (cdeit_jax.eit) and report it beside CDEIT")
  p.add_argument("--no-figure", action="store_true")
  p.add_argument("--skip-bad-files", action="store_true", help="skip unreadable or invalid data "
                 "files with a warning (default: stop and list them)")
  p.add_argument("--coordinator-address", default=None)
  p.add_argument("--num-processes", type=int, default=None)
  p.add_argument("--process-id", type=int, default=None)
  return p.parse_args(argv)


def main(argv=None):
  a = parse(argv)
  if argv is None:
    from cdeit_jax import cpu_tuning
    cpu_tuning.apply()  # before jax starts (may re-execute this command once)
  logging.getLogger("absl").setLevel(logging.WARNING)
  import jax
  if a.coordinator_address:
    jax.distributed.initialize(a.coordinator_address, a.num_processes, a.process_id)
  from cdeit_jax import config_lib, evaluate
  from cdeit_jax.data import DatasetError
  try:
    s = evaluate.EvalSettings(
        checkpoint=a.workdir or a.checkpoint, data=a.data, data_path=a.data_path, out=a.out,
        weights=a.weights, step=a.step, sampling_steps=a.sampling_steps, eta=a.eta,
        num_samples=a.num_samples, seed=a.seed, batch_size=a.batch_size, stats=a.stats,
        voltage_ratio=a.voltage_ratio, current_ratio=a.current_ratio,
        max_examples=a.max_examples, config=config_lib.load(a.config) if a.config else None,
        dtype=a.dtype, attention_query_chunk=a.attention_query_chunk, figure=not a.no_figure,
        tikhonov=a.tikhonov, data_consistency=a.data_consistency,
        data_consistency_alpha=a.data_consistency_alpha, skip_bad_files=a.skip_bad_files)
    r = evaluate.evaluate(s, log=lambda *x, **k: print(*x, **k, file=sys.stderr))
  except (ValueError, FileNotFoundError, DatasetError, ImportError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  if "metrics" in r:
    for name, m in r["metrics"].items():
      print(f"{name:8s} RMSE {m['rmse']:.4f}  PSNR {m['psnr']:.2f}  SSIM {m['ssim']:.4f}  "
            f"SSIM(disk) {m['ssim_disk']:.4f}  CC {m.get('cc', float('nan')):.4f}")
    print(f"sampling: {r['images_per_s']:.2f} images/s, {r['ms_per_image']:.1f} ms/image on "
          f"{r['devices']} device(s); outputs in {a.out}")


if __name__ == "__main__":
  main()
