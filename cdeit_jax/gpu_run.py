"""One prepared command for a lent GPU (`make gpu-run OUT=DIR`): in at most 9 minutes, start-up,
installs and compilations included, the figures the mission asks of the platform and a model
trained at a scale two CPU cores never reach, in at most 8 flat files.

Stages, in order; each writes its figures when it ends (a run cut short keeps what it reached);
one that fails does not stop the next; one that cannot run where it is is recorded as skipped,
with the reason:
1. `check` (2 minutes): the accelerator check (python -m cdeit_jax.accelerator_check) at
   the platform's size (the published model in bfloat16, configs/gpu.py, on a GPU) ->
   accelerator_check.json
2. `pytorch` (2 minutes): ours and the published PyTorch code side by side on the same chip, the
   same model, dtype and global batch (bench/bench_vs_reference.py) -> vs_pytorch.json; skipped
   without a checkout of the published code (--reference, default `reference/CDEIT`, carried
   with the working tree and git-ignored) or without torch
3. `train` (the rest): train.py --config configs/gpu_ktc2023.py on fresh simulations made on the
   chip, under `config.time_budget_s`, then its EMA weights exported as one file
   (python -m cdeit_jax.export) -> ktc2023_gpu.safetensors, train.json
4. `simulator` (45 s, kept free for it; 150 s on a CPU): the simulator's examples/s against the
   train step's consumption at the trained size (bench/bench_simulate.py --source) ->
   simulator.json: what the next size choice needs
Beside stage 1, on the CPU (it takes no GPU memory and no time of its own; a CPU rehearsal runs it
after stage 1, its time not counted in the minutes): `deviceless`, the compile of stage 1's train
step for compile-only GPUs of the machine's kind and count (`train.py --compile_topology
h200-1`: XLA's spec of the chip, no device), whose memory goes into gpu_run.json beside the
memory the device reports for the same step (`memory`): how far the deviceless figures the docs
give for GPUs are from a GPU's.
gpu_run.json holds every stage's status, time and reason, and the machine; gpu_run.log the end of
every stage's output. Exit 0 when the model file was written, 1 when not.

On a CPU it is the rehearsal: the same stages and files with sizes a CPU runs in seconds
(configs/gpu.py:rehearsal, configs/gpu_ktc2023.py:rehearsal, a 2-minute training budget), so the
first GPU finds nothing untried. Scratch (checkpoints, the compilation cache shared by the
stages, each stage's whole output) goes to --scratch, kept; by default to a temporary folder,
removed at the end.

  python -m cdeit_jax.gpu_run --out DIR [--reference reference/CDEIT] [--minutes 9]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_FILE = "ktc2023_gpu.safetensors"
FILES = ("accelerator_check.json", "vs_pytorch.json", "train.json", "simulator.json")
SUMMARY, LOG = "gpu_run.json", "gpu_run.log"
LIMITS = {"check": 120.0, "pytorch": 120.0, "simulator": 45.0}
DEVICELESS_S = {"gpu": 150.0, "cpu": 300.0}  # from its start, beside stage 1; no stage waits longer
GPUS = {"H100": "h100", "H200": "h200"}  # device kind -> --compile_topology name
EXPORT_S = 40.0  # kept after training for the export (a process, its imports, one step's read)
REHEARSAL_TRAIN_S = 120.0  # the training budget of the rehearsal on a CPU
TAIL = 40_000  # characters of each stage's output kept in gpu_run.log
# what a lent machine sends back of OUT (the device tool's limits)
RETURNS = {"files": 8, "file_bytes": 16 * 2**20, "bytes": 64 * 2**20, "depth": 2}
NAME = re.compile(r"[A-Za-z0-9._-]+")


def return_problems(out: str) -> list[str]:
  """What under `out` a lent machine would not send back (RETURNS: at most 8 files, 16 MiB each
  and 64 MiB together, no deeper than two folders, names of letters, digits, '.', '_' and '-');
  [] when all of it comes back."""
  problems, files = [], []
  for root, dirs, names in os.walk(out):
    rel = os.path.relpath(root, out)
    parts = [] if rel == "." else rel.split(os.sep)
    for d in dirs:
      if not NAME.fullmatch(d):
        problems.append(f"{os.path.join(rel, d)}: a folder name of other characters")
    for n in names:
      path = os.path.join(rel, n) if parts else n
      files.append(path)
      if not NAME.fullmatch(n):
        problems.append(f"{path}: a name of other characters")
      if len(parts) > RETURNS["depth"]:
        problems.append(f"{path}: deeper than {RETURNS['depth']} folders")
      size = os.path.getsize(os.path.join(root, n))
      if size > RETURNS["file_bytes"]:
        problems.append(f"{path}: {size / 2**20:.1f} MiB, over {RETURNS['file_bytes'] >> 20} MiB")
  if len(files) > RETURNS["files"]:
    problems.append(f"{len(files)} files, over {RETURNS['files']}")
  total = sum(os.path.getsize(os.path.join(out, f)) for f in files)
  if total > RETURNS["bytes"]:
    problems.append(f"{total / 2**20:.1f} MiB in all, over {RETURNS['bytes'] >> 20} MiB")
  return problems


class Stages:
  """The run's record: each stage's status, seconds and reason, written to OUT after each."""

  def __init__(self, out: str, scratch: str, minutes: float):
    self.out, self.scratch, self.t0 = out, scratch, time.perf_counter()
    self.deadline = self.t0 + 60.0 * minutes
    self.record: dict = {"minutes": minutes, "stages": {}, "scratch": scratch}
    self.log: list[str] = []
    self.running: list[dict] = []  # stages started and not yet finished (`start`)

  def left(self) -> float:
    return self.deadline - time.perf_counter()

  def done(self, name: str, status: str, seconds: float, **extra) -> None:
    self.record["stages"][name] = {"status": status, "seconds": round(seconds, 1), **extra}
    self.record["seconds"] = round(time.perf_counter() - self.t0, 1)
    self.write()

  def skipped(self, name: str, reason: str) -> None:
    self.done(name, "skipped", 0.0, reason=reason)

  def write(self) -> None:
    _write(os.path.join(self.out, SUMMARY), json.dumps(self.record, indent=1) + "\n")
    _write(os.path.join(self.out, LOG), "".join(self.log))


def _write(path: str, text: str) -> None:
  """`text` at `path`, whole or not at all (a regular file only: `fileio.atomic_write`)."""
  from cdeit_jax.common import fileio

  fileio.write_text(path, text)


class Stopped(Exception):
  """This run got SIGTERM or SIGINT (`stop_on_signals`): its stage is stopped, its scratch
  removed, and it exits with 128 + the signal's number."""

  def __init__(self, signum: int):
    super().__init__(signal.Signals(signum).name)
    self.signum = signum


def stop_on_signals() -> None:
  """SIGTERM and SIGINT raise `Stopped` in the main thread, wherever it waits: a stage runs in
  a process group of its own (a signal to this one does not reach it), so `run` passes the
  stop on to it."""

  def stop(signum, frame):
    raise Stopped(signum)

  for s in (signal.SIGTERM, signal.SIGINT):
    signal.signal(s, stop)


def end(p: subprocess.Popen) -> None:
  """Stop stage `p`'s process group: SIGTERM (train.py saves its step on it), SIGKILL 20 s
  later if it still runs; further signals wait until it has ended."""
  for s in (signal.SIGTERM, signal.SIGINT):
    signal.signal(s, signal.SIG_IGN)
  with contextlib.suppress(ProcessLookupError):
    os.killpg(p.pid, signal.SIGTERM)
  try:
    p.wait(timeout=20)
  except subprocess.TimeoutExpired:
    with contextlib.suppress(ProcessLookupError):
      os.killpg(p.pid, signal.SIGKILL)
    p.wait()
  stop_on_signals()


def start(stages: Stages, name: str, cmd: list[str], env: dict) -> dict:
  """`cmd` started in its own process group, its output to the scratch folder; kept in
  `stages.running` until `finish` (a signal to this run stops every started stage: `main`)."""
  path = os.path.join(stages.scratch, f"{name}.out")
  fh = open(path, "w")
  p = subprocess.Popen(
    cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
  )
  job = {"name": name, "cmd": cmd, "p": p, "fh": fh, "path": path, "t0": time.perf_counter()}
  stages.running.append(job)
  return job


def finish(stages: Stages, job: dict, limit: float) -> tuple[int, str]:
  """Wait for a started `job` until `limit` seconds from its start (then SIGTERM, and SIGKILL 20 s
  later: train.py saves its step on SIGTERM), stopped so when this run is (`Stopped`, raised
  again); (exit code, output). The output's end goes to the log."""
  p = job["p"]
  try:
    rc = p.wait(timeout=max(limit - (time.perf_counter() - job["t0"]), 1.0))
  except subprocess.TimeoutExpired:
    end(p)
    rc = 124
  except Stopped:
    stop_all(stages)
    raise
  stages.running.remove(job)
  job["fh"].close()
  with open(job["path"], errors="replace") as fh:
    text = fh.read()
  took = time.perf_counter() - job["t0"]
  stages.log.append(
    f"===== {job['name']}: exit {rc} after {took:.1f} s: {' '.join(job['cmd'])}\n{text[-TAIL:]}\n"
  )
  return rc, text


def stop_all(stages: Stages) -> None:
  """Stop every started stage (`end`), each logged as stopped by a signal."""
  while stages.running:
    job = stages.running.pop()
    end(job["p"])
    job["fh"].close()
    took = time.perf_counter() - job["t0"]
    stages.log.append(f"===== {job['name']}: stopped by a signal after {took:.1f} s\n")


def run(stages: Stages, name: str, cmd: list[str], limit: float, env: dict) -> tuple[int, str]:
  """`cmd` in its own process group, stopped at `limit` seconds; (exit code, output)."""
  return finish(stages, start(stages, name, cmd, env), limit)


def deviceless_topology(info: dict) -> tuple[str | None, str]:
  """The compile-only topology of this machine's accelerators (`h200-1`, ...; a CPU rehearses
  with H100s), or None and why not."""
  from cdeit_jax.common import topologies  # reads no JAX backend

  if not topologies.cuda_plugin_installed():
    return None, f"JAX's CUDA plugin is not installed ({topologies.INSTALL})"
  n = info["devices"]
  if info["platform"] == "cpu":
    return f"h100-{min(n, topologies.MAX_GPUS)}", ""  # a CPU rehearses with H100s
  gpu = next((g for kind, g in GPUS.items() if kind in info["device_kind"]), None)
  if gpu is None or n > topologies.MAX_GPUS:
    return None, f"no target spec of {n} x {info['device_kind']} (cdeit_jax/assets/gpu_targets)"
  return f"{gpu}-{n}", ""


def memory_beside(deviceless: dict | None, check: dict | None) -> dict:
  """The train step's memory per device as the deviceless compile gave it and as the device's
  own compile and allocator report it (the accelerator check's `train` section), with the
  ratios device / deviceless."""
  d, t = deviceless or {}, (check or {}).get("train") or {}
  on = t.get("memory_per_device") or {}
  ratio = lambda a, b: round(a / b, 4) if a and b else None
  return {
    "deviceless": {
      k: d.get(k)
      for k in ("topology", "device_kind", "global_batch", "attention_impl", "fits")
      + ("peak_bytes_per_device", "memory", "hbm_bytes_per_device", "fused_attention")
    },
    "device": {
      "device_kind": t.get("device"),
      "global_batch": t.get("global_batch"),
      "attention_impl": t.get("attention_impl"),
      "peak_bytes_per_device": on.get("peak_bytes"),
      "memory": on or None,
      "bytes_limit": t.get("device_bytes_limit"),
      "peak_bytes_in_use": t.get("device_peak_bytes"),
      "fused_attention": t.get("fused_attention"),
    },
    "device_over_deviceless": {
      "peak": ratio(on.get("peak_bytes"), d.get("peak_bytes_per_device")),
      "temporaries": ratio(
        on.get("temp_size_in_bytes"), (d.get("memory") or {}).get("temp_size_in_bytes")
      ),
      "limit": ratio(t.get("device_bytes_limit"), d.get("hbm_bytes_per_device")),
    },
  }


def status_of(rc: int, figures: bool) -> str:
  """A stage's status from its exit code (124: stopped at its time limit) and whether it left
  figures."""
  if rc == 0:
    return "ok"
  if rc == 124:
    return (
      "cut short at its time limit (the figures it reached are kept)" if figures else ("timed out")
    )
  return "failed"


def probe(env: dict) -> dict:
  """The platform JAX sees, from a child process (this one never starts a backend: on a GPU it
  would take the memory the stages need)."""
  code = (
    "import json, jax, jaxlib; d = jax.devices()[0]; print(json.dumps({'platform': d.platform, "
    "'device_kind': d.device_kind, 'devices': jax.device_count(), 'jax': jax.__version__}))"
  )
  r = subprocess.run(
    [sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=300
  )
  if r.returncode:
    raise SystemExit(f"gpu-run: JAX does not start here:\n{r.stderr[-2000:]}")
  return json.loads(r.stdout.strip().splitlines()[-1])


def reference_problem(path: str) -> str | None:
  """Why the published code cannot run here (None: it can)."""
  import importlib.util

  if not os.path.isfile(os.path.join(path, "models.py")):
    return (
      f"no published code at {path} (a checkout of github.com/shuaikaishi/CDEIT: models.py and "
      "diffusion/; give --reference, or REFERENCE= to make)"
    )
  if importlib.util.find_spec("torch") is None:
    return f"{sys.executable} has no torch"
  return None


def _json_file(path: str) -> dict | None:
  try:
    with open(path) as fh:
      return json.load(fh)
  except (OSError, ValueError):
    return None


def training_figures(workdir: str, cfg_path: str, budget: float) -> dict:
  """train.json: the run's logged windows, validations and totals (metrics.jsonl)."""
  records = []
  try:
    with open(os.path.join(workdir, "metrics.jsonl")) as fh:
      records = [json.loads(line) for line in fh if line.strip().endswith("}")]
  except OSError:
    pass
  windows = [r for r in records if "samples_per_sec" in r]
  steady = windows[1:] or windows  # the first window compiles the data's function
  mean = lambda key: sum(r[key] for r in steady) / len(steady) if steady else None
  last = records[-1] if records else {}
  return {
    "config": cfg_path,
    "time_budget_s": round(budget, 1),
    "steps": last.get("step"),
    "samples_per_s": mean("samples_per_sec"),
    "tflops_per_device": mean("tflops_per_device"),
    "fraction_of_peak": mean("fraction_of_peak")
    if steady and "fraction_of_peak" in steady[0]
    else None,
    "final_loss": last.get("loss"),
    "validation": [[r["step"], r["val_loss"]] for r in records if "val_loss" in r],
    "horizon": last.get("horizon"),
    "run": next((r["run"] for r in reversed(records) if "run" in r), None),
    "windows": [
      {k: r.get(k) for k in ("step", "loss", "lr", "samples_per_sec", "horizon", "window_s")}
      for r in windows
    ],
  }


def refuse(message: str) -> None:
  """A bad argument, in one line (no usage text), exit code 2, before any work."""
  print(f"error: {message}", file=sys.stderr)
  sys.exit(2)


def main() -> None:
  from cdeit_jax import cli

  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--out", required=True, help="the folder of the files that come back")
  p.add_argument("--scratch", default=None, help="checkpoints and caches (default: a temp folder)")
  p.add_argument("--reference", default=os.path.join(REPO, "reference", "CDEIT"))
  p.add_argument("--minutes", type=float, default=9.0, help="the whole run's time")
  p.add_argument("--check-s", type=float, default=LIMITS["check"], help="stage 1's time")
  p.add_argument(
    "--train-s", type=float, default=None, help="stage 3's budget (default: the rest; CPU: 120)"
  )
  p.add_argument("--simulator-s", type=float, default=None, help="stage 4's time (CPU: 150)")
  p.add_argument(
    "--spent-s", type=float, default=0.0, help="of the minutes, spent before (the wheels' install)"
  )
  a = cli.parse_args(p)
  gpu_run(
    a.out, scratch=a.scratch, reference=a.reference, minutes=a.minutes, check_s=a.check_s,
    train_s=a.train_s, simulator_s=a.simulator_s, spent_s=a.spent_s,
  )  # fmt: skip


def gpu_run(
  out_flag: str,
  *,
  scratch: str | None,
  reference: str,
  minutes: float,
  check_s: float,
  train_s: float | None,
  simulator_s: float | None,
  spent_s: float,
) -> None:
  """The whole run (module docstring) into `out_flag`; exits 0 when the model file was written,
  1 when not, 2 on a bad argument, 128 + the signal's number when stopped."""
  out = os.path.abspath(out_flag)
  from cdeit_jax.checkpoints import shipped  # reads no JAX backend
  from cdeit_jax.common import fileio
  from cdeit_jax.common.errors import InputError

  try:
    fileio.output_folder(out, "--out")
    shipped.refuse_write(out, "--out")
  except InputError as e:
    refuse(str(e))
  os.makedirs(out, exist_ok=True)
  stale = [f for f in os.listdir(out) if f in (*FILES, SUMMARY, LOG, MODEL_FILE)]
  if stale:
    refuse(f"--out {out_flag}: holds a run's files already ({', '.join(stale)}); give a new folder")
  kept = scratch is not None
  scratch = os.path.abspath(scratch or tempfile.mkdtemp(prefix="gpu-run-"))
  if scratch == out or scratch.startswith(out + os.sep):
    refuse(f"--scratch {scratch}: lies in --out, whose files are the ones that come back")
  os.makedirs(scratch, exist_ok=True)
  stages = Stages(out, scratch, minutes - spent_s / 60)
  stop_on_signals()
  try:
    written = run_stages(stages, out, scratch, reference, check_s, train_s, simulator_s)
  except Stopped as e:  # SIGTERM or SIGINT: the stage was stopped; what it reached is in OUT
    stop_all(stages)  # a stage started beside the one stopped (the deviceless compile)
    for s in (signal.SIGTERM, signal.SIGINT):
      signal.signal(s, signal.SIG_IGN)
    stages.record["stopped"] = str(e)
    stages.write()
    print(f"gpu-run: stopped by {e}; files in {out}", file=sys.stderr)
    sys.exit(128 + e.signum)
  finally:
    if not kept:  # the stages' checkpoints and caches (their logs' ends are in OUT)
      shutil.rmtree(scratch, ignore_errors=True)
  sys.exit(0 if written else 1)


def run_stages(
  stages: Stages,
  out: str,
  scratch: str,
  reference: str,
  check_s: float,
  train_s: float | None,
  simulator_s: float | None,
) -> bool:
  """The four stages (module docstring) into `out`; whether the model file was written."""
  env = dict(
    os.environ,
    PYTHONUNBUFFERED="1",
    JAX_COMPILATION_CACHE_DIR=os.path.join(scratch, "jax_cache"),  # shared by the stages
    PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
  )
  info = probe(env)
  cpu = info["platform"] == "cpu"
  stages.record.update(info, rehearsal=cpu, started=time.strftime("%Y-%m-%d %H:%M:%S"))
  stages.write()
  py = sys.executable
  bench = os.path.join(REPO, "bench")
  small = "configs/gpu.py:rehearsal" if cpu else "configs/gpu.py"
  batch = "2" if cpu else "32"
  check_stages(stages, out, scratch, env, info, small, batch, check_s)

  # 2. the published PyTorch code beside ours
  problem = reference_problem(reference)
  if problem:
    stages.skipped("pytorch", problem)
  else:
    t = time.perf_counter()
    limit = min(LIMITS["pytorch"], stages.left())
    cmd = [py, os.path.join(bench, "bench_vs_reference.py"), "--reference", reference]
    cmd += ["--config", small, "--batch", batch, "--quick", "--out", os.path.join(out, FILES[1])]
    rc, text = run(stages, "pytorch", cmd, limit, env)
    status = status_of(rc, False)
    why = {} if rc == 0 else {"reason": (text.strip().splitlines() or [""])[-1][:500]}
    stages.done("pytorch", status, time.perf_counter() - t, exit_code=rc, **why)

  # 3. the model: trained for the rest of the time, then exported as one file
  cfg = "configs/gpu_ktc2023.py:rehearsal" if cpu else "configs/gpu_ktc2023.py"
  sim_s = simulator_s or (150.0 if cpu else LIMITS["simulator"])
  model_path = os.path.join(out, MODEL_FILE)
  train_stage(stages, out, scratch, env, cpu, cfg, train_s, EXPORT_S + sim_s)

  # 4. the simulator's share of a step at the trained size (for the next size choice)
  limit = min(sim_s, stages.left())
  if limit < 15:
    stages.skipped("simulator", f"{max(limit, 0):.0f} s left")
  else:
    t = time.perf_counter()
    sim_batch = "4" if cpu else "64"
    cmd = [py, os.path.join(bench, "bench_simulate.py"), "--source", "--config", cfg]
    cmd += ["--batch", sim_batch, "--repeats", "2"]
    rc, text = run(stages, "simulator", cmd, limit, env)
    lines = [ln for ln in text.splitlines() if ln.startswith('{"bench": "simulator_source"')]
    if lines:
      _write(os.path.join(out, FILES[3]), lines[-1] + "\n")
    stages.done("simulator", status_of(rc, bool(lines)), time.perf_counter() - t, exit_code=rc)

  written = os.path.exists(model_path)
  stages.record["model_file"] = MODEL_FILE if written else None
  stages.write()
  # what would not come back, checked on the files as they are (this summary included)
  stages.record["returns"] = return_problems(out) or "all"
  sizes = {f: os.path.getsize(os.path.join(out, f)) for f in sorted(os.listdir(out))}
  stages.record["files"] = {**sizes, SUMMARY: None}  # its own size: the one it has when written
  stages.write()
  print(json.dumps(stages.record, indent=1))
  print(f"gpu-run: {'model ' + model_path if written else 'NO model file written'}; files in {out}")
  return written


def check_stages(
  stages: Stages,
  out: str,
  scratch: str,
  env: dict,
  info: dict,
  small: str,
  batch: str,
  check_s: float,
) -> None:
  """Stage 1, the accelerator check at the platform's size, and the deviceless compile beside
  it."""
  py = sys.executable
  cpu = info["platform"] == "cpu"
  # beside stage 1 (a CPU rehearsal: after it, not to slow it): its train step compiled for
  # compile-only GPUs, on the CPU
  topology, reason = deviceless_topology(info)
  job, deviceless = None, []
  if topology is None:
    stages.skipped("deviceless", reason)
  else:
    deviceless = [py, "train.py", "--config", small, "--compile_topology", topology]
    deviceless += ["--workdir", os.path.join(scratch, "deviceless")]
    deviceless += [f"--config.batch_size={int(batch) * int(topology.split('-')[1])}"]
    job = None if cpu else start(stages, "deviceless", deviceless, env)

  # 1. the accelerator check at the platform's size
  t = time.perf_counter()
  check = os.path.join(scratch, "check")
  limit = min(check_s, stages.left())
  cmd = [py, "-m", "cdeit_jax.accelerator_check", "--out", check, "--config", small]
  # no section starts after half the time: one started then has the other half to end in
  cmd += ["--per-device-batch", batch, "--budget-s", str(limit / 2)]
  rc, _ = run(stages, "check", cmd, limit, env)
  got = _json_file(os.path.join(check, "accelerator_check.json"))
  if got is not None:
    _write(os.path.join(out, FILES[0]), json.dumps(got, indent=1) + "\n")
  status = status_of(rc, got is not None)
  passed = (got or {}).get("passed")
  skipped = [k for k, v in (got or {}).items() if isinstance(v, dict) and "skipped" in v]
  stages.done(
    "check", status, time.perf_counter() - t, exit_code=rc, passed=passed, sections_skipped=skipped
  )
  if deviceless:
    job = job or start(stages, "deviceless", deviceless, env)
    rc, text = finish(stages, job, DEVICELESS_S["cpu" if cpu else "gpu"])
    compiled = _json_file(os.path.join(scratch, "deviceless", "compile.json"))
    stages.record["memory"] = memory_beside(compiled, got)
    status = "ok" if compiled is not None and rc in (0, 1) else status_of(rc, False)
    failed = {} if compiled else {"reason": (text.strip().splitlines() or [""])[-1][:500]}
    took = time.perf_counter() - job["t0"]
    if cpu:  # on a GPU it costs the other stages nothing: neither does it here
      stages.deadline += took
    stages.done("deviceless", status, took, exit_code=rc, topology=topology, **failed)


def train_stage(
  stages: Stages,
  out: str,
  scratch: str,
  env: dict,
  cpu: bool,
  cfg: str,
  train_s: float | None,
  reserve: float,
) -> None:
  """Stage 3: the model trained for the rest of the time but `reserve` s, then exported as one
  file."""
  t = time.perf_counter()
  py = sys.executable
  workdir = os.path.join(scratch, "train")
  budget = train_s or (REHEARSAL_TRAIN_S if cpu else stages.left() - reserve)
  budget = min(budget, stages.left() - reserve)
  model_path = os.path.join(out, MODEL_FILE)
  if budget < 30:
    stages.skipped("train", f"{budget:.0f} s left for training")
  else:
    cmd = [py, "train.py", "--config", cfg, "--workdir", workdir]
    cmd += [f"--config.time_budget_s={budget:.1f}"]
    # train.py stops itself inside its budget; this guard only ends a run that hangs (on a CPU,
    # whose start-up can take longer than a short budget, it waits longer: no loan is at stake)
    rc, _ = run(stages, "train", cmd, budget + (240 if cpu else 45), env)
    figures = training_figures(workdir, cfg, budget)
    ex_rc, ex_text = run(
      stages,
      "export",
      [py, "-m", "cdeit_jax.export", "--workdir", workdir, "--out", model_path],
      max(stages.left(), EXPORT_S),
      env,
    )
    exported = re.search(r"exported step (\d+) .*?: ([\d,]+) parameters, ([\d.]+) MiB", ex_text)
    if exported:
      figures["exported"] = {
        "step": int(exported.group(1)),
        "params": int(exported.group(2).replace(",", "")),
        "mib": float(exported.group(3)),
      }
    _write(os.path.join(out, FILES[2]), json.dumps(figures, indent=1) + "\n")
    ok = rc == 0 and os.path.exists(model_path)
    status = (
      "ok"
      if ok
      else "model written, training stopped early"
      if os.path.exists(model_path)
      else "failed"
    )
    stages.done(
      "train", status, time.perf_counter() - t, exit_code=rc, export_exit_code=ex_rc,
      model_file=MODEL_FILE if os.path.exists(model_path) else None,
    )  # fmt: skip


if __name__ == "__main__":
  main()
