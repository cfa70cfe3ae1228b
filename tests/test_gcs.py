"""Data, workdirs and outputs in a bucket: the commands with gs:// paths against a real GCS JSON API
server on 127.0.0.1 (conftest.gcs). Selected by `pytest -m gcs`."""

import json
import os
import pathlib
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import (
  REPO,
  RESUME_STEPS,
  TEST_CONFIG,
  final_state,
  run_train,
  sigterm_after_first_log,
)

from cdeit_jax import config_lib
from cdeit_jax.common import fileio
from cdeit_jax.data import stats
from cdeit_jax.infer import outputs
from cdeit_jax.train import workdir_lock

pytestmark = pytest.mark.gcs
UEF = REPO / "data" / "uef2017"


@pytest.fixture(scope="module")
def bucket_data(gcs):
  """The 22 UEF2017 cases copied to gs://.../data/uef2017 (the test config's data root)."""
  url = f"{gcs}/data"
  for f in sorted(UEF.iterdir()):
    fileio.path(f"{url}/uef2017/{f.name}").write_bytes(f.read_bytes())
  return url


def _objects(url: str) -> list[str]:
  """Every object under `url`, as paths relative to it."""
  import fsspec

  root = url.removeprefix("gs://")
  return sorted(p.removeprefix(root + "/") for p in fsspec.filesystem("gs").find(root))


def _eval(*args: str) -> subprocess.Popen:
  return subprocess.Popen(
    [
      sys.executable,
      str(REPO / "eval.py"),
      "--data",
      "uef2017",
      "--config.sampling.steps=2",
      "--config.sampling.seed=5",
      *args,
    ],
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    cwd=REPO,
  )


@pytest.mark.slow  # 95 s; by default a bucket workdir trains and resumes in the lease test and
# eval.py reads and writes a bucket in test_eval_reads_a_bucket_run_and_writes_the_bucket
def test_train_killed_resumed_and_evaluated_in_a_bucket(gcs, bucket_data, straight_run, tmp_path):
  """train.py reads its data from the bucket and keeps its workdir there; after a SIGTERM the
  rerun resumes from the bucket's checkpoint and ends bit-equal to the uninterrupted local run;
  eval.py then reads that workdir and the bucket's test set, writes its outputs to the bucket,
  and they equal those of evaluating the local run."""
  wd = f"{gcs}/runs/killed"
  data_flag = f"--config.data.path={bucket_data}"
  p = run_train(wd, *RESUME_STEPS, data_flag, wait=False)
  stopped = sigterm_after_first_log(p, wd, timeout=180)
  assert stopped is not None and 2 <= stopped < 24, stopped
  rc, _, err = run_train(wd, *RESUME_STEPS, data_flag)
  assert rc == 0, err[-3000:]
  assert f"resumed from {wd}/checkpoints/{stopped}" in err
  cfg = config_lib.load(TEST_CONFIG)
  cfg.steps = 24
  s_step, s_leaves, s_next = final_state(straight_run, cfg)
  k_step, k_leaves, k_next = final_state(wd, cfg)
  assert s_step == k_step == 24
  for a, b in zip(s_leaves, k_leaves):
    np.testing.assert_array_equal(a, b)  # identical on CPU
  assert s_next == k_next  # the data iterator resumed at the same position

  # metrics.jsonl in the bucket: each logged step once; the windows wholly after the resume
  # have the straight run's losses exactly
  s_log = {r["step"]: r["loss"] for r in map(json.loads, (straight_run / "metrics.jsonl").open())}
  k_lines = fileio.read_text(f"{wd}/metrics.jsonl").splitlines()
  k_log = {r["step"]: r["loss"] for r in map(json.loads, k_lines)}
  assert [json.loads(line)["step"] for line in k_lines] == sorted(set(range(2, 25, 2)) | {stopped})
  after = [s for s in k_log if s % 2 == 0 and s - 2 >= stopped]
  assert after and [s_log[s] for s in after] == [k_log[s] for s in after]
  objects = _objects(wd)
  assert any(o.startswith("tensorboard/events.out.tfevents.") for o in objects), objects
  assert "lock" not in objects  # released at the end of each run
  assert not [o for o in objects if o.endswith(".tmp") or "/.write-test" in o], objects

  # eval.py: the bucket's workdir and data, outputs into the bucket; and the local equivalent
  _evaluated_alike(wd, bucket_data, straight_run, tmp_path / "local")


def _evaluated_alike(wd: str, bucket_data: str, local_run: pathlib.Path, local_out: pathlib.Path):
  """eval.py of the bucket's workdir `wd` on the bucket's test set into WD/eval, and of the same
  run kept locally on the local files: the bucket's outputs are all there and equal the local
  ones, its metrics name the bucket's workdir and data."""
  remote_out = f"{wd}/eval"
  runs = [
    _eval("--workdir", wd, "--data_path", f"{bucket_data}/uef2017", "--out", remote_out),
    _eval("--workdir", str(local_run), "--data_path", str(UEF), "--out", str(local_out)),
  ]
  for r in runs:
    _, e = r.communicate(timeout=300)
    assert r.returncode == 0, e[-3000:]
  assert sorted(_objects(remote_out)) == sorted([*outputs.OUTPUTS, outputs.MANIFEST])
  with fileio.open_binary(f"{remote_out}/predictions.npz") as fh:
    remote = dict(np.load(fh))
  local = np.load(local_out / "predictions.npz")
  np.testing.assert_array_equal(remote["pred"], local["pred"])
  r_metrics = json.loads(fileio.read_text(f"{remote_out}/metrics.json"))
  l_metrics = json.loads((local_out / "metrics.json").read_text())
  assert r_metrics["metrics"] == l_metrics["metrics"]
  assert r_metrics["settings"]["checkpoint"] == wd
  assert r_metrics["settings"]["data_path"] == f"{bucket_data}/uef2017"


# make test-all: 29 s; a model folder in a bucket is read in
#  test_a_model_folder_in_a_bucket_is_verified_and_read_only
@pytest.mark.slow
def test_eval_reads_a_bucket_run_and_writes_the_bucket(gcs, bucket_data, straight_run, tmp_path):
  """eval.py with the workdir (a trained run's files copied into the bucket), the test set and
  --out all in the bucket writes every output there, equal to evaluating the local run."""
  wd = f"{gcs}/runs/copied"
  for f in sorted(p for p in straight_run.rglob("*") if p.is_file()):
    fileio.path(f"{wd}/{f.relative_to(straight_run).as_posix()}").write_bytes(f.read_bytes())
  _evaluated_alike(wd, bucket_data, straight_run, tmp_path / "local")


def test_statistics_of_a_bucket_folder(gcs, bucket_data):
  """Statistics computed from the bucket's copy equal the local folder's; written to and read
  back from the bucket unchanged."""
  local = stats.compute_stats(str(UEF), "uef2017", progress=False)
  remote = stats.compute_stats(f"{bucket_data}/uef2017", "uef2017", progress=False)
  for a, b in zip(local, remote):
    np.testing.assert_array_equal(a, b)
  stats.write_stats(f"{gcs}/stats", *remote)
  for a, b in zip(stats.load_stats(f"{gcs}/stats"), remote):
    np.testing.assert_array_equal(a, b)


def test_outputs_in_a_bucket_are_never_half_written(gcs):
  """A write that fails part-way leaves the old object (or none); an append log ends with every
  append in order, though each append only starts a background rewrite."""
  path, new = f"{gcs}/atomic/metrics.json", f"{gcs}/atomic/new.json"
  fileio.write_text(path, "old")

  def broken(tmp):
    pathlib.Path(tmp).write_text("half")
    raise RuntimeError("killed while writing")

  for p in (path, new):
    with pytest.raises(RuntimeError, match="killed"):
      fileio.atomic_write(p, broken)
  assert fileio.read_text(path) == "old"
  assert not fileio.path(new).exists()
  log = fileio.AppendLog(f"{gcs}/atomic/log.jsonl", "first\n")
  for i in range(40):
    log.write(f"{i}\n")
  log.close()
  assert fileio.read_text(f"{gcs}/atomic/log.jsonl") == "first\n" + "".join(
    f"{i}\n" for i in range(40)
  )


def test_workdir_lease_in_a_bucket(gcs):
  """Object stores have no locks: the lease refuses a second training as soon as it sees the
  first renew it (past one lease length), is gone after release; a dead holder's lease is taken
  at once when old, and after it lapses when young."""
  wd, lease = f"{gcs}/runs/lease", 2.0
  lock_path = f"{wd}/lock"
  held = workdir_lock.WorkdirLock(wd, lease_s=lease).acquire()
  time.sleep(1.5 * lease)  # only the renewals keep it
  t0 = time.perf_counter()
  with pytest.raises(
    workdir_lock.WorkdirBusy, match=rf"{wd} is in use by another training \(pid {os.getpid()} on "
  ):
    workdir_lock.WorkdirLock(wd, lease_s=lease).acquire()
  assert time.perf_counter() - t0 < lease  # refused at the first renewal seen
  held.release()
  assert not fileio.path(lock_path).exists()

  def dead(age):
    fileio.write_text(
      lock_path,
      json.dumps(
        {
          "host": "gone",
          "pid": 1,
          "since": "2026-01-01",
          "token": "dead",
          "renewed": time.time() - age,
        }
      ),
    )

  for age in (10 * lease, 0.5 * lease):  # long dead; just died
    dead(age)
    t0 = time.perf_counter()
    taker = workdir_lock.WorkdirLock(wd, lease_s=lease).acquire()
    waited = time.perf_counter() - t0
    assert json.loads(fileio.read_text(lock_path))["pid"] == os.getpid()
    taker.release()
    assert waited < 0.5 * lease if age > lease else 0.4 * lease < waited < 2 * lease, waited


@pytest.mark.e2e
def test_sigterm_while_compiling_releases_the_lease(gcs, bucket_data):
  """train.py on a bucket workdir, SIGTERM as soon as its lease object exists (it is still
  starting: nothing is logged yet): it stops in one line with exit 0 and deletes its lock, so the
  next run need not wait out a lease."""
  import signal

  wd = f"{gcs}/runs/sigterm-start"
  p = run_train(wd, *RESUME_STEPS, f"--config.data.path={bucket_data}", wait=False)
  deadline = time.time() + 120
  while time.time() < deadline and not fileio.path(f"{wd}/lock").exists():
    time.sleep(0.1)
  assert not (fileio.read_text(f"{wd}/metrics.jsonl") or "").strip()
  p.send_signal(signal.SIGTERM)
  _, err = p.communicate(timeout=180)
  assert p.returncode == 0, err[-3000:]
  assert "Traceback" not in err and "rerun the same command" in err, err[-2000:]
  assert "lock" not in _objects(wd)


def test_a_lease_that_cannot_be_proven_stops_its_holder(gcs):
  """Fencing: a holder whose renewals stopped (a paused process) fails `check` once its last
  confirmed renewal is older than SAFETY leases, and its renewal thread gives the run up instead
  of writing a late renewal; a holder whose lock names another run fails `check(read=True)`."""
  wd, lease = f"{gcs}/runs/fence", 2.0
  lost = []
  held = workdir_lock.WorkdirLock(wd, lease_s=lease, on_lost=lost.append).acquire()
  held.check(read=True)  # holds it
  held._lease.confirmed -= workdir_lock.SAFETY * lease  # as if paused that long
  with pytest.raises(
    workdir_lock.LeaseLost,
    match=r"last confirmed \d+ s ago .* stopped "
    "writing",
  ):
    held.check()
  assert len(lost) == 1
  renewed = json.loads(fileio.read_text(f"{wd}/lock"))["renewed"]
  time.sleep(0.5 * lease)  # the renewal thread wrote nothing
  assert json.loads(fileio.read_text(f"{wd}/lock"))["renewed"] == renewed
  held.release()
  other = workdir_lock.WorkdirLock(wd, lease_s=lease, on_lost=lost.append).acquire()
  fileio.write_text(
    f"{wd}/lock",
    json.dumps({"host": "b", "pid": 2, "since": "now", "token": "b", "renewed": time.time()}),
  )
  with pytest.raises(workdir_lock.LeaseLost, match=r"taken over by pid 2 on b"):
    other.check(read=True)
  other.release()
  assert json.loads(fileio.read_text(f"{wd}/lock"))["token"] == "b"  # not released: not its


def test_a_paused_training_that_lost_its_lease_stops_and_the_other_finishes(
  gcs, bucket_data, straight_run
):
  """The issue's two orders of events, with train.py processes and a 6 s lease: A pauses (kill
  -STOP) after its first log, holding an unfinished step of its own; B takes the lapsed lease,
  leaves that step alone, and trains; A resumes and stops at once with one line (exit 3), writing
  nothing; B ends equal to an uninterrupted run, every kept step loadable."""
  import signal

  from conftest import wait_for_first_log

  wd = f"{gcs}/runs/fenced"
  flags = [*RESUME_STEPS, f"--config.data.path={bucket_data}", "--config.lock_lease_s=6"]
  a = run_train(wd, *flags, wait=False)
  wait_for_first_log(wd, timeout=180)
  a.send_signal(signal.SIGSTOP)
  unfinished = f"{wd}/checkpoints/16/params/in-progress"  # A's save cut short by the pause
  fileio.path(unfinished).write_text("A")
  first = fileio.read_text(f"{wd}/metrics.jsonl")
  b = run_train(wd, *flags, wait=False)
  deadline = time.time() + 180
  while fileio.read_text(f"{wd}/metrics.jsonl") == first and time.time() < deadline:
    time.sleep(0.25)
  assert json.loads(fileio.read_text(f"{wd}/lock"))["pid"] == b.pid
  assert fileio.path(unfinished).exists()  # B's start deleted nothing of A's
  a.send_signal(signal.SIGCONT)
  _, a_err = a.communicate(timeout=60)
  assert a.returncode == 3, a_err[-3000:]
  last = a_err.strip().splitlines()[-1]
  # which it notices first depends on where the pause caught its renewal thread: its lease's
  # age, or (paused between its time check and its read of the lock) B's token in the lock
  assert re.match(
    r"error: the (lease on|lock of) gs://\S+/runs/fenced .*this run stopped "
    r"writing",
    last,
  ), a_err[-2000:]
  assert a_err.count("error:") == 1, a_err[-2000:]
  _, b_err = b.communicate(timeout=300)
  assert b.returncode == 0, b_err[-3000:]
  cfg = config_lib.load(TEST_CONFIG)
  cfg.steps = 24
  s_step, s_leaves, s_next = final_state(straight_run, cfg)
  k_step, k_leaves, k_next = final_state(wd, cfg)
  assert s_step == k_step == 24 and s_next == k_next
  for x, y in zip(s_leaves, k_leaves):
    np.testing.assert_array_equal(x, y)
  from cdeit_jax.checkpoints import checkpoint, train_checkpoint

  mngr = train_checkpoint.train_manager(wd)
  assert mngr.all_steps()[-2:] == [16, 24]  # 16: A's unfinished step, B's now
  for step in mngr.all_steps():  # each loads (B saved 16 anew)
    assert checkpoint.read_meta(wd, step)["step"] == step
  mngr.close()
  assert not fileio.path(unfinished).exists()
  assert "lock" not in _objects(wd)


def test_damaged_step_set_aside_and_debug_log_in_a_bucket(gcs):
  """A damaged step's objects move to WORKDIR/damaged/STEP-TIME (object stores have no folder
  rename), and the debug log appends to an object."""
  from cdeit_jax.common import logs
  from cdeit_jax.train import resume

  wd = f"{gcs}/runs/damaged"
  names = ["meta/metadata", "params/d/0a1b", "params/manifest.ocdbt"]
  for n in names:
    fileio.path(f"{wd}/checkpoints/7/{n}").write_text(n)
  moved = resume._set_aside(wd, [7])
  assert len(moved) == 1 and moved[0].startswith(f"{wd}/damaged/7-"), moved
  assert _objects(moved[0]) == names
  assert not fileio.path(f"{wd}/checkpoints/7").exists()
  fileio.write_text(f"{wd}/debug.log", "earlier run\n")
  logs.debug_log(wd)
  logs.debug.debug("step %d unreadable", 7)
  logs.debug_log(wd, enabled=False)  # closes the handler: waits for its upload
  assert fileio.read_text(f"{wd}/debug.log").splitlines()[0] == "earlier run"
  assert fileio.read_text(f"{wd}/debug.log").splitlines()[1].endswith(" step 7 unreadable")


def test_a_model_folder_in_a_bucket_is_verified_and_read_only(gcs):
  """models/cdeit16 copied into the bucket verifies and loads; one byte of a weight file, an
  edit to the manifest's recipe, or an added file is refused in one line (before: a bucket's
  model folder was read unchecked); a path below it is refused as an output."""
  from cdeit_jax.checkpoints import loading, shipped
  from cdeit_jax.common.errors import InputError

  src, url = REPO / "models" / "cdeit16", f"{gcs}/models/cdeit16"
  for f in sorted(p for p in src.rglob("*") if p.is_file()):
    fileio.path(f"{url}/{f.relative_to(src)}").write_bytes(f.read_bytes())
  assert shipped.verify(url)["name"] == "cdeit16"
  loading.load(url)
  step = json.loads((src / "manifest.json").read_text())["step"]
  with pytest.raises(InputError, match=rf"--out {url}/checkpoints/{step}/x lies inside the model"):
    shipped.refuse_write(f"{url}/checkpoints/{step}/x", "--out")
  weights = max(
    (p for p in src.rglob("*") if p.is_file() and "/ema/" in str(p)), key=lambda p: p.stat().st_size
  )
  target = fileio.path(f"{url}/{weights.relative_to(src)}")
  changed = bytearray(weights.read_bytes())
  changed[len(changed) // 2] ^= 1
  target.write_bytes(bytes(changed))
  with pytest.raises(shipped.ManifestError, match=rf"model folder {url}: its weights' SHA-256"):
    loading.load(url)
  target.write_bytes(weights.read_bytes())
  manifest = json.loads((src / "manifest.json").read_text())
  fileio.path(f"{url}/manifest.json").write_text(json.dumps({**manifest, "recipe": "x"}))
  with pytest.raises(shipped.ManifestError, match=r"its manifest.json was edited"):
    shipped.verify(url)
  fileio.path(f"{url}/manifest.json").write_bytes((src / "manifest.json").read_bytes())
  fileio.path(f"{url}/checkpoints/{step}/extra.txt").write_text("x")
  with pytest.raises(shipped.ManifestError, match=r"files added: \['checkpoints/.*/extra.txt'\]"):
    shipped.verify(url)
