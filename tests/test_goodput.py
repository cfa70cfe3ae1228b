"""Operating a run: the persistent compilation cache, a profile of chosen steps, and where the
wall time goes (train.py subprocesses with the test config)."""

import gzip
import json

import pytest
from conftest import run_train

PROFILE = ["--config.profile.start_step=5", "--config.profile.num_steps=3"]


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
  """A 10-step run with a fresh compilation cache and a profile of steps 5-7 (validation and a
  checkpoint at step 6 inside it; compiled at step 3, so the trace is not filled with the
  compiler's events)."""
  tmp = tmp_path_factory.mktemp("profiled")
  rc, _, err = run_train(
    tmp / "run",
    "--config.steps=10",
    "--config.log_every=2",
    "--config.eval_every=3",
    f"--compilation_cache={tmp / 'cache'}",
    *PROFILE,
  )
  assert rc == 0, err[-3000:]
  return tmp, err


def test_profile_holds_the_steps_and_the_host_phases(profiled):
  tmp, err = profiled
  traces = list((tmp / "run" / "profile").rglob("perfetto_trace.json.gz"))
  assert len(traces) == 1 and list((tmp / "run" / "profile").rglob("*.xplane.pb"))
  events = json.load(gzip.open(traces[0]))["traceEvents"]
  steps = sorted(int(e["args"]["step_num"]) for e in events if e.get("name") == "train")
  assert steps == [5, 6, 7]
  names = {e.get("name") for e in events}
  assert {"data", "validation", "checkpoint", "logging"} <= names, sorted(
    n for n in names if n and n.islower() and len(n) < 12
  )
  assert "profile of steps 5..7 written to" in err


def test_time_split_adds_up_to_the_wall_time(profiled):
  """Each window's phases and the run's parts add up to their wall time with at most 2 % left
  unmeasured; goodput is the step time's share."""
  tmp, _ = profiled
  records = [json.loads(line) for line in (tmp / "run" / "metrics.jsonl").open()]
  phases = ("step", "data", "validation", "checkpoint", "logging", "profile")
  for r in records:
    measured = sum(r[f"time_{p}_s"] for p in phases)
    assert measured + r["time_other_s"] == pytest.approx(r["window_s"], rel=1e-9)
    assert abs(r["time_other_s"]) <= 0.02 * r["window_s"] + 1e-3, r
  run = records[-1]["run"]
  parts = ("startup", "compile", *phases)
  assert sum(run[f"{p}_s"] for p in parts) == pytest.approx(run["wall_s"], rel=0.02)
  assert run["compile_s"] > 0 and run["startup_s"] > 0 and run["step_s"] > 0
  assert run["goodput"] == pytest.approx(run["step_s"] / run["wall_s"])
  assert sum(r["time_step_s"] for r in records) == pytest.approx(run["step_s"], rel=1e-6)


def test_a_second_run_loads_its_step_from_the_cache(profiled):
  tmp, err = profiled
  assert "train step compiled in" in err
  rc, _, err = run_train(
    tmp / "again",
    "--config.steps=2",
    "--config.log_every=1",
    "--config.eval_every=2",
    f"--compilation_cache={tmp / 'cache'}",
    "--config.profile.start_step=7",  # beyond this run: said, not silently skipped
  )
  assert rc == 0, err[-3000:]
  assert "train step loaded from the persistent compilation cache in" in err
  assert "config.profile.start_step=7 is outside this run's steps 0..1" in err
  assert not (tmp / "again" / "profile").exists()
  first = json.loads((tmp / "run" / "metrics.jsonl").read_text().splitlines()[-1])["run"]
  second = json.loads((tmp / "again" / "metrics.jsonl").read_text().splitlines()[-1])["run"]
  assert second["compile_s"] < first["compile_s"] / 2, (first, second)


_JIT = """
import sys, warnings
warnings.simplefilter("always")
from cdeit_jax.common import compile_cache, logs
logs.console()
compile_cache.enable(sys.argv[1])
import jax, jax.numpy as jnp
jax.jit(lambda x: jnp.sin(x) * 3)(jnp.float32(1.0)).block_until_ready()
print("hits", compile_cache.hits())
"""


def test_damaged_cache_entries_are_replaced(tmp_path):
  """A truncated entry (a writer killed) and one with a changed byte are removed at the next
  start, written again by that run, and loaded by the one after: no run after the damage sees
  JAX's read error."""
  import os
  import subprocess
  import sys
  import time

  script, cache = tmp_path / "jit.py", tmp_path / "cache"
  script.write_text(_JIT)

  def run() -> tuple[int, str]:
    p = subprocess.run(
      [sys.executable, str(script), str(cache)], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return int(p.stdout.split()[-1]), p.stderr

  assert run()[0] == 0  # two programs (the lambda, the float32 conversion) compiled and written
  entries = sorted(cache.glob("*-cache"))
  assert len(entries) == 2, entries
  whole = {e.name: e.read_bytes() for e in entries}
  first, second = entries
  first.write_bytes(whole[first.name][: len(whole[first.name]) // 2])
  changed = bytearray(whole[second.name])
  changed[len(changed) // 2] ^= 0xFF
  second.write_bytes(bytes(changed))
  old = time.time() - 120  # settled: not an entry another process may still be writing
  for e in entries:
    os.utime(e, (old, old))
  hits, err = run()
  assert "removed 2 damaged entries" in err and first.name in err, err
  assert "Error reading persistent compilation cache" not in err, err
  assert hits == 0 and {e.name: e.read_bytes() for e in entries} == whole
  hits, err = run()
  assert hits == 2 and "damaged" not in err and "Error reading" not in err, err
