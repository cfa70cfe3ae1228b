"""`make gpu-run` (python -m cdeit_jax.gpu_run) rehearsed on a CPU, as a lent GPU would run
it: every stage recorded (done, or skipped with its reason), the files a lent machine sends back
within its limits, and the model file imported by convert and answering the challenge's public
28 with eval.py; the limits' check against folders made to break each."""

import contextlib
import json
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest
from conftest import REPO

from cdeit_jax import gpu_run
from cdeit_jax.common import topologies


def test_what_a_lent_machine_would_not_send_back_is_named(tmp_path):
  ok = tmp_path / "ok"
  (ok / "a" / "b").mkdir(parents=True)
  (ok / "a" / "b" / "deep_enough.json").write_text("{}")
  for i in range(7):
    (ok / f"f{i}.log").write_text("x")
  assert gpu_run.return_problems(str(ok)) == []
  bad = tmp_path / "bad"
  (bad / "a" / "b" / "c").mkdir(parents=True)
  (bad / "a" / "b" / "c" / "too_deep.json").write_text("{}")
  (bad / "big.bin").write_bytes(b"\0" * (16 * 2**20 + 1))
  (bad / "space name.txt").write_text("x")
  for i in range(7):
    (bad / f"f{i}.log").write_text("x")
  problems = gpu_run.return_problems(str(bad))
  assert len(problems) == 4, problems
  assert any("too_deep.json: deeper than 2" in p for p in problems)
  assert any(p.startswith("big.bin: 16.0 MiB, over 16") for p in problems)
  assert any("space name.txt: a name of other characters" in p for p in problems)
  assert any(p == "10 files, over 8" for p in problems)


def test_the_deviceless_memory_stands_beside_the_devices():
  """gpu_run.json's `memory`: the deviceless compile's figures, the accelerator check's for the
  same step on the device, and device / deviceless (by hand: 30 / 24, 20 / 16, 105 / 100)."""
  compiled = {
    "topology": "h200-1",
    "device_kind": "NVIDIA H200 141GB HBM3e",
    "global_batch": 32,
    "peak_bytes_per_device": 24,
    "memory": {"temp_size_in_bytes": 16, "peak_bytes": 24},
    "hbm_bytes_per_device": 100,
    "fused_attention": {"calls": 42},
  }
  check = {
    "train": {
      "device": "NVIDIA H200",
      "global_batch": 32,
      "memory_per_device": {"temp_size_in_bytes": 20, "peak_bytes": 30},
      "device_bytes_limit": 105,
      "device_peak_bytes": 31,
      "fused_attention": {"calls": 42},
    }
  }
  m = gpu_run.memory_beside(compiled, check)
  assert m["device_over_deviceless"] == {"peak": 1.25, "temporaries": 1.25, "limit": 1.05}
  assert m["deviceless"]["peak_bytes_per_device"] == 24 and m["device"]["bytes_limit"] == 105
  assert m["device"]["peak_bytes_in_use"] == 31 and m["deviceless"]["topology"] == "h200-1"
  empty = gpu_run.memory_beside(compiled, None)  # the check left no figures
  assert empty["device"]["peak_bytes_per_device"] is None
  assert set(empty["device_over_deviceless"].values()) == {None}


def test_the_deviceless_topology_is_the_machines():
  if not topologies.cuda_plugin_installed():
    assert (
      gpu_run.deviceless_topology({"platform": "gpu", "device_kind": "x", "devices": 1})[0] is None
    )
    return
  gpu = lambda kind, n: gpu_run.deviceless_topology(
    {"platform": "gpu", "device_kind": kind, "devices": n}
  )
  assert gpu("NVIDIA H200", 1) == ("h200-1", "") and gpu("NVIDIA H100 80GB HBM3", 8)[0] == "h100-8"
  assert gpu("NVIDIA A100-SXM4-80GB", 1)[0] is None and "no target spec" in gpu("NVIDIA A100", 1)[1]
  assert gpu_run.deviceless_topology({"platform": "cpu", "device_kind": "cpu", "devices": 1})[
    0
  ] == ("h100-1")


@pytest.mark.slow  # 8 minutes on 2 cores, and its stages' own time limits are cut short when
# other tests load them (the deviceless compile runs beside the check): make test-all; the
# signal and refusal paths of the same script run by default and in the end-to-end tier
def test_the_rehearsal_writes_what_a_gpu_run_brings_back(tmp_path):
  out, scratch = tmp_path / "out", tmp_path / "scratch"
  env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")  # one CPU device, as a laptop has
  # the check's own limit (120 s: no section starts after 60 s): with 90 s, CI's 2 cores, another
  # test beside it, cut the check short at its limit
  p = subprocess.run(
    [sys.executable, "-m", "cdeit_jax.gpu_run", "--out", str(out), "--scratch", str(scratch),
     "--reference", str(tmp_path / "no_reference"), "--check-s", "120", "--train-s", "45",
     "--simulator-s", "150"],
    cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
  )  # fmt: skip
  assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
  summary = json.loads((out / "gpu_run.json").read_text())
  assert summary["rehearsal"] and summary["platform"] == "cpu" and summary["returns"] == "all"
  stages = summary["stages"]
  assert [stages[s]["status"] for s in ("check", "train", "simulator")] == ["ok"] * 3, stages
  assert stages["pytorch"]["status"] == "skipped"
  assert "no published code at" in stages["pytorch"]["reason"]
  if topologies.cuda_plugin_installed():  # the check's step, compiled for one H100 too
    assert stages["deviceless"]["status"] == "ok" and stages["deviceless"]["topology"] == "h100-1"
    mem = summary["memory"]
    assert mem["deviceless"]["global_batch"] == mem["device"]["global_batch"] == 2
    assert mem["deviceless"]["device_kind"] == "NVIDIA H100 80GB HBM3"
    on, off = mem["device"]["peak_bytes_per_device"], mem["deviceless"]["peak_bytes_per_device"]
    assert on > 0 and off > 0 and mem["device_over_deviceless"]["peak"] == round(on / off, 4)
  else:
    assert stages["deviceless"]["status"] == "skipped"
    assert "'.[cuda-aot]'" in stages["deviceless"]["reason"]
  files = sorted(os.listdir(out))
  assert files == sorted(summary["files"]) and len(files) <= 8
  assert not scratch.exists() or any(scratch.iterdir())  # given: kept (the default is removed)
  models = [f for f in files if not re.search(r"\.(json|txt|log|png)$", f)]
  assert models == [gpu_run.MODEL_FILE]
  check = json.loads((out / "accelerator_check.json").read_text())
  assert check["train"]["samples_per_s"] > 0 and check["config"] == "configs/gpu.py:rehearsal"
  assert stages["check"]["sections_skipped"] == check["skipped"]
  train = json.loads((out / "train.json").read_text())
  assert (
    train["steps"] == train["exported"]["step"] > 0
    and train["validation"][-1][0] == (train["steps"])
  )
  # ended by its budget (which also covers start-up: on a busy CPU that alone may take it)
  assert train["time_budget_s"] == 45
  assert "config.time_budget_s=45 s: step" in (scratch / "train.out").read_text()
  sim = json.loads((out / "simulator.json").read_text())
  assert sim["sim_examples_per_s"] > 0 and sim["step_samples_per_s"] > 0
  # the model comes back as one file: imported, it answers the challenge's public cases
  workdir = tmp_path / "imported"
  model = out / gpu_run.MODEL_FILE
  c = subprocess.run(
    [sys.executable, "-m", "cdeit_jax.convert", "--checkpoint", str(model), "--workdir",
     str(workdir)],
    cwd=REPO, env=env, capture_output=True, text=True,
  )  # fmt: skip
  assert c.returncode == 0, c.stderr[-3000:]
  e = subprocess.run(
    [sys.executable, "eval.py", "--workdir", str(workdir), "--data", "ktc2023_challenge",
     "--data_path", "data/ktc2023/levels", "--out", str(tmp_path / "answers")],
    cwd=REPO, env=env, capture_output=True, text=True,
  )  # fmt: skip
  assert e.returncode == 0, e.stderr[-3000:]
  metrics = json.loads((tmp_path / "answers" / "metrics.json").read_text())
  assert len(list((tmp_path / "answers").glob("level_*/*.mat"))) == 28, metrics
  # one changed byte: refused in one line
  bad = tmp_path / "bad.safetensors"
  data = bytearray(model.read_bytes())
  data[-100] ^= 1
  bad.write_bytes(bytes(data))
  r = subprocess.run(
    [sys.executable, "-m", "cdeit_jax.convert", "--checkpoint", str(bad), "--workdir",
     str(tmp_path / "w2")],
    cwd=REPO, env=env, capture_output=True, text=True,
  )  # fmt: skip
  errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
  assert r.returncode != 0 and len(errors) == 1 and "SHA-256" in errors[0]


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  return True


def test_a_signal_stops_the_stage_it_reaches(tmp_path):
  """SIGTERM to the run while a stage runs (in a process group of its own, which no signal to
  the run reaches): the stage is stopped too, and the run stops with `Stopped`; the handlers
  are this process's own for the test, restored after it."""
  import signal
  import threading

  stages = gpu_run.Stages(str(tmp_path), str(tmp_path), 1.0)
  pid_file = tmp_path / "pid"
  code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
  saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

  def term_once_started():
    while not pid_file.exists() or not pid_file.read_text():
      time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)

  try:
    gpu_run.stop_on_signals()
    threading.Thread(target=term_once_started, daemon=True).start()
    t0 = time.perf_counter()
    with pytest.raises(gpu_run.Stopped, match="SIGTERM"):
      gpu_run.run(stages, "stage", [sys.executable, "-c", code], 60, dict(os.environ))
  finally:
    for s, handler in saved.items():
      signal.signal(s, handler)
  assert time.perf_counter() - t0 < 20 and not _alive(int(pid_file.read_text()))
  assert "stage: stopped by a signal" in stages.log[-1]


@pytest.mark.e2e
def test_make_gpu_run_stopped_by_sigterm_stops_its_stage_and_removes_its_scratch(tmp_path):
  """The whole run (the rehearsal), SIGTERMed while its first stage runs: it exits 143 within
  the stage's grace, no process of the stage is left, its temporary scratch folder is gone and
  gpu_run.json says it was stopped."""
  import signal

  out = tmp_path / "out"
  env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")
  p = subprocess.Popen(
    [sys.executable, "-m", "cdeit_jax.gpu_run", "--out", str(out), "--reference",
     str(tmp_path / "no")],
    cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
  )  # fmt: skip
  deadline = time.time() + 300
  scratch = None
  while time.time() < deadline and p.poll() is None:
    summary = out / "gpu_run.json"
    if summary.exists():
      scratch = json.loads(summary.read_text())["scratch"]
      if os.path.exists(os.path.join(scratch, "check.out")):
        break
    time.sleep(0.5)
  assert scratch and p.poll() is None, p.communicate()[1][-3000:]
  time.sleep(3)  # the stage under way
  p.send_signal(signal.SIGTERM)
  _, err = p.communicate(timeout=60)
  assert p.returncode == 143, err[-3000:]
  assert not os.path.exists(scratch)
  left = []
  for proc in pathlib.Path("/proc").iterdir():
    with contextlib.suppress(OSError):
      if proc.name.isdigit() and scratch.encode() in (proc / "cmdline").read_bytes():
        left.append(proc.name)
  assert left == []
  assert json.loads((out / "gpu_run.json").read_text())["stopped"] == "SIGTERM"
