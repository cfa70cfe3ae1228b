"""The CPU train step and 5-step sampler side by side with the published PyTorch CDEIT; JSON.

  python bench/bench_vs_reference.py --reference REF_CHECKOUT [--batch 2 --threads 2]

Same machine, same batch, float32, published model, one run: ours (attention "auto", i.e. the
blocked backend on CPU; `cdeit_jax.common.cpu_tuning` applied as the commands do), then the
reference (`bench/reference/ref_bench.py`, once as is and once with the same settings as ours:
huge-page malloc, one OpenBLAS thread). It needs torch and a checkout of the public
shuaikaishi/CDEIT repository; `bench/reference/ref_shim` stands in for the few timm/ema_pytorch
names its model file imports. Then the model's attention calls alone on both sides
(`bench/bench_attention.py`, `bench/reference/ref_attention.py`, the latter with our settings),
which split each train step into attention and the rest, and torch's float32 2,048^3 matmul rate
beside XLA's (timed by the train bench), the roof each side's FLOP/s is compared with. Ratios are
of step and sampler times (unrounded). Prints one JSON line with both and the ratios.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from attention_calls import totals  # noqa: E402  (bench/: the attention totals of both sides)

from cdeit_jax.common import cpu_tuning  # noqa: E402


def run(cmd: list[str], env: dict) -> dict:
  r = subprocess.run(cmd, env=env, capture_output=True, text=True)
  if r.returncode:
    raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
  return json.loads(r.stdout.strip().splitlines()[-1])


def check_reference(path: str) -> None:
  """Stops before any timing (minutes) when the reference side cannot run."""
  missing = [f for f in ("models.py", "diffusion") if not os.path.exists(os.path.join(path, f))]
  if missing:
    raise SystemExit(
      f"--reference {path}: no {' or '.join(missing)} there; give a checkout of the published "
      "CDEIT code (github.com/shuaikaishi/CDEIT), the folder holding models.py and diffusion/"
    )
  if importlib.util.find_spec("torch") is None:
    raise SystemExit(
      f"{sys.executable} has no torch, which the reference needs: pip install torch (the CPU build)"
    )


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--reference", required=True, help="checkout of the published CDEIT code")
  p.add_argument("--batch", type=int, default=2)
  p.add_argument("--threads", type=int, default=2, help="CPU threads for torch")
  a = p.parse_args()
  check_reference(a.reference)
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
  py = sys.executable
  train = run(
    [
      py,
      os.path.join(HERE, "bench_train.py"),
      "--per-device-batch",
      str(a.batch),
      "--steps",
      "3",
      "--sync-each-step",
    ],
    env,
  )
  sample = run(
    [
      py,
      os.path.join(HERE, "bench_model.py"),
      "--batch",
      str(a.batch),
      "--sample",
      "--repeats",
      "2",
    ],
    env,
  )
  ref_env = dict(
    env, PYTHONPATH=os.pathsep.join([os.path.join(HERE, "reference", "ref_shim"), a.reference])
  )
  ref_cmd = [py, os.path.join(HERE, "reference", "ref_bench.py"), str(a.batch), str(a.threads)]
  ref = run(ref_cmd, ref_env)
  # the same settings as ours (cdeit_jax.common.cpu_tuning: malloc, OpenBLAS threads), so that
  # neither side is favoured
  ref_tuned = run(ref_cmd, cpu_tuning.tuned_environment(ref_env))
  attn = run([py, os.path.join(HERE, "bench_attention.py"), "--batch", str(a.batch)], env)
  attn.pop("matmul_gflops_f32", None)  # ours is the train bench's, timed beside its step
  ref_attn = run(
    [
      py,
      os.path.join(HERE, "reference", "ref_attention.py"),
      str(a.batch),
      str(a.threads),
      json.dumps(
        {
          name: [s["tokens"], s["windows"], s["blocks_in_model"]]
          for name, s in attn["shapes"].items()
        }
      ),
    ],
    cpu_tuning.tuned_environment(ref_env),
  )
  ref_attn.update(totals(ref_attn["shapes"]))
  # the same model and batch: the reference's step does the FLOPs ours counts
  flops = train["flops_per_step_per_device"]
  ref_tflops = flops / ref_tuned["train_step_s"] / 1e12
  out = {
    "bench": "cpu_vs_reference",
    "batch": a.batch,
    "dtype": "float32",
    # both sides: the fastest of the timed train steps; sampling: ours the median of 2, the
    # reference one timed call
    "ours": {
      "train_samples_per_s": train["samples_per_s_best"],
      "train_step_s": train["step_s_min"],
      "train_step_s_mean": train["step_s"],
      "train_tflops": train["tflops_per_device"],
      "train_peak_rss_bytes": train["peak_rss_bytes"],
      "sample_images_per_s": sample["sampler_images_per_s"],
      "sample_s": sample["sampler_s"],
      "sample_peak_rss_bytes": sample["peak_rss_bytes"],
      "attention_impl": train["attention_impl"],
      "matmul_gflops_f32": train["matmul_gflops_f32"],
      "fraction_of_matmul_rate": train["fraction_of_matmul_rate"],
    },
    "reference": ref,
    "reference_hugepages": dict(
      ref_tuned,
      train_tflops=ref_tflops,
      matmul_gflops_f32=ref_attn["matmul_gflops_f32"],
      fraction_of_matmul_rate=round(ref_tflops * 1e3 / ref_attn["matmul_gflops_f32"], 3),
    ),
    # the train step split: the model's attention calls timed alone (forward + backward, times
    # the blocks that run each), and the rest of the step
    "attention": {"ours": attn, "reference_hugepages": ref_attn},
    "train_step_split_s": {
      "ours": {
        "attention": attn["train_step_attention_s"],
        "rest": round(train["step_s_min"] - attn["train_step_attention_s"], 3),
      },
      "reference_hugepages": {
        "attention": ref_attn["train_step_attention_s"],
        "rest": round(ref_tuned["train_step_s"] - ref_attn["train_step_attention_s"], 3),
      },
    },
    # of times, not of the rounded samples/s
    "train_speedup": ref["train_step_s"] / train["step_s_min"],
    "sample_speedup": ref["sample_s"] / sample["sampler_s"],
    "train_speedup_vs_hugepages": ref_tuned["train_step_s"] / train["step_s_min"],
    "sample_speedup_vs_hugepages": ref_tuned["sample_s"] / sample["sampler_s"],
  }
  print(json.dumps(out))


if __name__ == "__main__":
  main()
