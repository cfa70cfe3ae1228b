"""The train step and 5-step sampler side by side with the published PyTorch CDEIT; JSON.

  python bench/bench_vs_reference.py --reference REF [--batch 2 --threads 2]     # this CPU
  python bench/bench_vs_reference.py --reference REF --config configs/gpu.py --batch 32 \\
      --out vs_pytorch.json                                                    # a GPU, bfloat16

Same machine, same batch, same model (the published one, or `--config`'s, whose sizes the
reference's DiT takes: patch and width), one run: ours first (`bench/bench_train.py`,
`bench/bench_model.py --sample`, in the config's dtype), then the reference
(`bench/reference/ref_bench.py`) on the device ours ran on (a GPU: CUDA, in the same dtype,
bfloat16 as `torch.autocast`). It needs torch and a checkout of the public shuaikaishi/CDEIT
repository; `bench/reference/ref_shim` stands in for the few timm/ema_pytorch names its model
file imports. Both sides' TFLOP/s count the same model FLOPs (`cdeit_jax.model.flops`); on an
accelerator beside its vendor's bfloat16 peak and the bfloat16 matmul rate timed in the same run.

On a CPU (without `--quick`) the reference runs once as is and once with the same settings as
ours (huge-page malloc, one OpenBLAS thread), then the model's attention calls alone on both
sides (`bench/bench_attention.py`, `bench/reference/ref_attention.py`), which split each train
step into attention and the rest, and torch's float32 2,048^3 matmul rate beside XLA's. Ratios
are of step and sampler times (unrounded). Prints one JSON line (and writes it to `--out`).
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


def reference_sizes(config: str | None) -> dict:
  """The reference DiT's arguments for our model of `config` (None: the published one); stops
  with the reason when the reference has no such model (its U-net always has 4 scales)."""
  from cdeit_jax import config_lib

  m = (config_lib.load(config) if config else config_lib.default_config()).model
  same = dict(image_size=128, num_scales=4, mlp_ratio=4.0, window_size=None, in_channels=1)
  same.update(cond="eim", output="image", cond_size=16, freq_dim=256, num_heads=16)
  differ = [f"{k}={m.get(k)!r}" for k, v in same.items() if m.get(k) != v]
  if differ:
    raise SystemExit(
      f"--config {config}: the published code has no model with {', '.join(differ)} (its DiT "
      f"takes only the patch and the width: {same})"
    )
  return {"patch": m.patch_size, "hidden": m.hidden_size, "dtype": m.dtype}


def ours_out(path: str) -> bool:
  """Whether `path` is a JSON this benchmark wrote (its `bench` field), which --out replaces."""
  try:
    with open(path) as fh:
      return str(json.load(fh).get("bench", "")).endswith("_vs_reference")
  except (OSError, ValueError, AttributeError):
    return False


def refuse(message: str) -> None:
  """A bad argument, in one line (no usage text), exit code 2, before any work."""
  print(f"error: {message}", file=sys.stderr)
  sys.exit(2)


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--reference", required=True, help="checkout of the published CDEIT code")
  p.add_argument("--batch", type=int, default=2, help="global batch (one device)")
  p.add_argument("--threads", type=int, default=2, help="CPU threads for torch")
  p.add_argument("--config", default=None, help="our config (default: the published model)")
  p.add_argument("--quick", action="store_true", help="CPU: no huge-page rerun, no attention split")
  p.add_argument("--out", default=None, help="also write the JSON here")
  p.add_argument("--cpu", action="store_true", help="on the CPU even where JAX has an accelerator")
  a = p.parse_args()
  if a.out:
    from cdeit_jax.checkpoints import shipped
    from cdeit_jax.common import fileio
    from cdeit_jax.common.errors import InputError

    try:
      shipped.refuse_write(a.out, "--out")  # before minutes of timing
      fileio.output_file(a.out, "--out", ours_out, "this benchmark's JSON")
    except InputError as e:
      refuse(str(e))
  check_reference(a.reference)
  sizes = reference_sizes(a.config)
  env = dict(os.environ, XLA_FLAGS="", **({"JAX_PLATFORMS": "cpu"} if a.cpu else {}))
  py = sys.executable
  config = ["--config", a.config] if a.config else []
  steps = ["--steps", "3" if sizes["dtype"] == "float32" else "5"]
  train = run(
    [
      py,
      os.path.join(HERE, "bench_train.py"),
      "--per-device-batch",
      str(a.batch),
      *steps,
      "--sync-each-step",
      *config,
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
      *config,
    ],
    env,
  )
  device = {"cpu": "cpu", "gpu": "cuda", "cuda": "cuda"}.get(train["backend"])
  if device is None:
    raise SystemExit(f"ours ran on {train['backend']}, where PyTorch has no device to compare")
  ref_env = dict(
    env, PYTHONPATH=os.pathsep.join([os.path.join(HERE, "reference", "ref_shim"), a.reference])
  )
  ref_cmd = [
    py, os.path.join(HERE, "reference", "ref_bench.py"), "--batch", str(a.batch), "--threads",
    str(a.threads), "--device", device, "--dtype", sizes["dtype"], "--patch", str(sizes["patch"]),
    "--hidden", str(sizes["hidden"]),
  ]  # fmt: skip
  ref = run(ref_cmd, ref_env)
  # the same model and batch: the reference's step and sampler do the FLOPs ours counts
  flops = train["flops_per_step_per_device"]
  sample_flops = sample["sampler_tflops"] * sample["sampler_s"] * 1e12
  peak = train["peak_tflops"]
  ref.update(
    train_tflops=flops / ref["train_step_s"] / 1e12,
    sample_tflops=sample_flops / ref["sample_s"] / 1e12,
  )
  ours = {
    "train_samples_per_s": train["samples_per_s_best"],
    "train_step_s": train["step_s_min"],
    "train_step_s_mean": train["step_s"],
    "train_tflops": train["tflops_per_device"],
    "train_peak_rss_bytes": train["peak_rss_bytes"],
    "device_peak_bytes": train["device_peak_bytes"],
    "sample_images_per_s": sample["sampler_images_per_s"],
    "sample_s": sample["sampler_s"],
    "sample_tflops": sample["sampler_tflops"],
    "sample_peak_rss_bytes": sample["peak_rss_bytes"],
    "attention_impl": train["attention_impl"],
    "compile_s": train["compile_s"],
  }
  if peak:
    for side in (ours, ref):
      side["train_fraction_of_peak"] = side["train_tflops"] / peak
      side["sample_fraction_of_peak"] = side["sample_tflops"] / peak
  else:
    ours.update(
      matmul_gflops_f32=train["matmul_gflops_f32"],
      fraction_of_matmul_rate=train["fraction_of_matmul_rate"],
    )
  out = {
    "bench": f"{device}_vs_reference",
    "device": train["device"],
    "batch": a.batch,
    "dtype": sizes["dtype"],
    "config": a.config or "the published model (configs/default.py)",
    "params": train["params"],
    "peak_tflops_bf16": peak,
    "matmul_tflops_bf16": train.get("matmul_tflops_bf16"),
    "ours": ours,
    "reference": ref,
    # of times, not of the rounded samples/s
    "train_speedup": ref["train_step_s"] / train["step_s_min"],
    "sample_speedup": ref["sample_s"] / sample["sampler_s"],
  }
  if device == "cpu" and not a.quick:
    out.update(cpu_extras(a, py, env, ref_cmd, ref_env, train, sample, flops))
  text = json.dumps(out)
  if a.out:
    from cdeit_jax.common import fileio

    fileio.atomic_write(
      a.out,
      lambda tmp: open(tmp, "w").write(text + "\n"),
      ours=ours_out,
      what="this benchmark's JSON",
    )
  print(text)


def cpu_extras(a, py, env, ref_cmd, ref_env, train, sample, flops) -> dict:
  """On a CPU: the reference with our process settings, and the step split into attention and
  the rest on both sides (module docstring)."""
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
  ref_tflops = flops / ref_tuned["train_step_s"] / 1e12
  return {
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
    "train_speedup_vs_hugepages": ref_tuned["train_step_s"] / train["step_s_min"],
    "sample_speedup_vs_hugepages": ref_tuned["sample_s"] / sample["sampler_s"],
  }


if __name__ == "__main__":
  main()
