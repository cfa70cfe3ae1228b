"""Ahead-of-time compile for a TPU v5e-8 on this CPU machine (libtpu's compile-only devices)."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("libtpu", reason="libtpu is not installed (pip install -e '.[tpu]'); "
                    ".ci/run installs it")

from cdeit_jax import aot, config_lib, flops  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--config.model.patch_size=4", "--config.model.hidden_size=32",
         "--config.model.num_heads=4", "--config.model.num_scales=2"]


def _small_cfg(batch):
  cfg = config_lib.load(os.path.join(ROOT, "configs", "v5e8.py"))
  cfg.model.update(patch_size=4, hidden_size=32, num_heads=4, num_scales=2)  # 1,024-token top
  cfg.batch_size = batch
  return cfg


def test_small_model_compiles_for_v5e8(tmp_path):
  report = aot.compile_check(_small_cfg(64), "v5e-8", str(tmp_path), print_fn=lambda *a: None)
  saved = json.loads((tmp_path / "compile.json").read_text())
  assert saved == json.loads(json.dumps(report))
  assert saved["fits"] and saved["within_margin"]
  assert (saved["topology"], saved["num_devices"], saved["num_hosts"]) == ("v5e-8", 8, 1)
  assert saved["device_kind"] == "TPU v5 lite"
  assert saved["attention_impl"] == "splash"
  assert saved["hbm_bytes_per_device"] == int(15.75 * 2 ** 30)
  m = saved["memory"]
  assert saved["peak_bytes_per_device"] == (m["argument_size_in_bytes"] + m["output_size_in_bytes"]
                                            - m["alias_size_in_bytes"] + m["temp_size_in_bytes"]
                                            + m["generated_code_size_in_bytes"])
  assert 0 < saved["peak_bytes_per_device"] < saved["hbm_bytes_per_device"]
  assert m["alias_size_in_bytes"] > 0  # the state is donated
  kw = config_lib.model_kwargs(_small_cfg(64), "tpu")
  assert saved["flops_per_step"] == 64 * 3 * flops.forward_flops(**kw)
  assert saved["sampler"]["fits"] and saved["sampler"]["global_batch"] == 64
  assert saved["sampler"]["flops_per_call"] == 64 * 5 * flops.forward_flops(**kw)


def test_cli_says_when_it_does_not_fit(tmp_path):
  """A batch far too big: exit 1, fits false with the compiler's figure, concrete advice."""
  env = dict(os.environ, XLA_FLAGS="", ALLOW_MULTIPLE_LIBTPU_LOAD="1")  # this process holds libtpu
  r = subprocess.run(
      [sys.executable, os.path.join(ROOT, "train.py"), "--config", "configs/v5e8.py",
       "--compile_topology", "v5e-8", "--workdir", str(tmp_path), *SMALL,
       "--config.model.attention_impl=xla", "--config.batch_size=65536"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
  assert r.returncode == 1, r.stderr[-3000:]
  saved = json.loads((tmp_path / "compile.json").read_text())
  assert saved["fits"] is False and not saved["within_margin"]
  assert saved["peak_bytes_per_device"] > saved["hbm_bytes_per_device"]
  assert "does not fit: set config.model.attention_impl=auto" in r.stdout
  assert "config.accum_steps=2" in saved["advice"]


def test_unknown_topology_is_named():
  with pytest.raises(ValueError, match="--compile_topology 'v9-8': unknown"):
    aot.topology_devices("v9-8")
