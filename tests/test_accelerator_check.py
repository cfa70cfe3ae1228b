"""`make accelerator-check` in its CPU mode (the test config's small model, 8 fake devices): every
section of `python -m cdeit_jax.accelerator_check` runs and the JSON holds every figure,
with the bars checked against their independent truths (float32 for the bfloat16 numerics, XLA's
attention for the platform's, the uninterrupted run for the resumed one)."""

import json
import subprocess
import sys

import pytest
from conftest import REPO


@pytest.mark.e2e
def test_the_cpu_accelerator_check_writes_every_figure_and_passes(tmp_path):
  out = tmp_path / "check"
  p = subprocess.run(
    [sys.executable, "-m", "cdeit_jax.accelerator_check", "--out", str(out), "--steps", "1"],
    cwd=REPO,
    capture_output=True,
    text=True,
  )
  assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
  r = json.loads((out / "accelerator_check.json").read_text())
  assert r["platform"] == "cpu" and r["devices"] == 8 and r["passed"] and r["missed"] == []
  t = r["train"]
  assert t["samples_per_s"] > 0 and t["tflops_per_device"] > 0 and t["global_batch"] == 16
  assert 0 < t["fraction_of_matmul_rate"] < 1 and t["matmul_gflops_f32"] > 0
  assert t["dtype"] == "float32" and t["attention_impl"] == "blocked" and t["peak_rss_bytes"] > 0
  n = r["numerics"]
  assert 0 < n["bf16_vs_f32_loss_rel"] <= 0.05 and 0.99 <= n["bf16_vs_f32_grad_cos"] < 1
  assert 0 < n["attention_max_abs_err"] <= 0.02
  assert r["sampling"]["images_per_s"] > 0 and r["reconstruct"]["frames_per_s"] > 0
  assert r["sampling"]["images_per_s"] == r["reconstruct"]["frames_per_s"] * 8
  res = r["resume"]
  assert res["exact"] and res["ema_weights_equal"] and res["val_losses_equal"]
  assert res["stopped_at_step"] < res["steps"]
  assert "resume       exact True" in p.stdout and p.stdout.rstrip().endswith(
    "accelerator_check.json"
  )
