"""Training: EMA semantics, sharded/accumulated steps, resume, multi-process, failure modes."""

import json
import logging
import pathlib
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import (
  RESUME_STEPS,
  TEST_CONFIG,
  final_state,
  finish,
  run_train,
  two_processes,
  wait_for_first_log,
  wandb_offline_runs,
)
from flax import nnx

from cdeit_jax import config_lib
from cdeit_jax.checkpoints import checkpoint, loading, train_checkpoint
from cdeit_jax.common import sharding as shd
from cdeit_jax.common.errors import InputError
from cdeit_jax.data import sources
from cdeit_jax.train import training

REPO = pathlib.Path(__file__).parent.parent


def cfg_(**over):
  cfg = config_lib.load(TEST_CONFIG)
  for k, v in over.items():
    node = cfg
    *path, leaf = k.split(".")
    for p in path:
      node = node[p]
    node[leaf] = v
  return cfg


@pytest.fixture(scope="module")
def uef_batch():
  src = sources.NpzSource(str(REPO / "data" / "uef2017"), "uef2017", "authors")
  exs = [src[i] for i in range(16)]
  return {k: np.stack([e[k] for e in exs]) for k in ("cond", "target")}


def build(cfg, devices, batch_size, accum=1, shard_params=False):
  """The training loop's objects (`training.setup`) for `devices`, compiled for `batch_size`:
  (mesh, step(state, batch, rng), a fresh state)."""
  mesh = shd.make_mesh(devices)
  cfg.accum_steps = accum
  ts = training.setup(cfg, loading.resolve(cfg), mesh)
  c = training.compile_train_step(ts, batch_size, mesh, shard_params)
  host = jax.device_get(ts.state)
  constants = jax.device_put(ts.constants, c.constants_shardings)
  # The step donates its state: every caller gets a fresh copy on the devices.
  return (
    mesh,
    lambda state, batch, rng: c.fn(state, batch, rng, constants),
    lambda: jax.device_put(host, c.state_shardings),
  )


def put(batch, mesh, n):
  return {k: jax.device_put(v[:n], shd.batch_sharded(mesh)) for k, v in batch.items()}


def leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


# ----------------------------------------------------------------------------- EMA


def ema_pytorch_reference(ws, beta=0.995, update_every=10, after=100, power=2 / 3):
  """ema_pytorch 0.5.2's EMA.update() called after each optimizer step, as plain Python."""
  ema, out = None, []
  for n, w in enumerate(ws):
    if n % update_every == 0:
      if n <= after:
        ema = w
      else:
        d = min(beta, 1 - (1 + (n - after - 1)) ** (-power))
        ema = ema * d + w * (1 - d)
    out.append(ema)
  return out


def test_grad_norm_warning_sees_every_step_of_the_window():
  from cdeit_jax.train.log_windows import unusual_grad_norms

  assert unusual_grad_norms(11, [0.5, 2.0, 3.0]) == []
  # a spike in the middle of the window (the last step is normal)
  assert unusual_grad_norms(11, [0.5, 5e3, 2.0]) == [
    "gradient norm outside [1e-07, 1000] at 1 step(s) (12); 5e+03 at step 12"
  ]
  out = unusual_grad_norms(1, [1e-9, 1.0, 2e4, 1e-8])
  assert out == ["gradient norm outside [1e-07, 1000] at 3 step(s) (1, 3, 4); 1e-09 at step 1"]


@pytest.mark.e2e
def test_ctrl_c_saves_the_step_and_is_one_line(tmp_path):
  """Ctrl-C (SIGINT) during training: the step is saved, as on SIGTERM, then exit 130 with one
  line, no traceback (and no hang on a save cut short); every saved step reads."""
  wd = tmp_path / "run"
  p = run_train(
    wd, "--config.steps=400", "--config.log_every=2", "--config.eval_every=4", wait=False
  )
  deadline = time.time() + 300
  while not list((wd / "checkpoints").glob("*/commit_success.txt")) and time.time() < deadline:
    time.sleep(0.1)
  p.send_signal(signal.SIGINT)
  _, err = p.communicate(timeout=300)
  assert p.returncode == 130, err[-3000:]
  assert "interrupted (Ctrl-C) after step" in err and "Traceback" not in err
  steps = checkpoint.all_steps(str(wd))
  assert steps and all(checkpoint.read_meta(str(wd), st)["step"] == st for st in steps)


def test_unusable_workdirs_are_one_line(tmp_path):
  """A workdir that is a file, and one whose lock path is a folder: one line each, exit 1."""
  (tmp_path / "file").write_text("")
  rc, _, err = run_train(tmp_path / "file")
  assert rc == 1 and "--workdir" in err and "exists and is not a folder" in err, err[-2000:]
  assert "Traceback" not in err
  (tmp_path / "wd" / "lock").mkdir(parents=True)
  rc, _, err = run_train(tmp_path / "wd")
  assert rc == 1 and "cannot open the workdir's lock file (Is a directory)" in err, err[-2000:]
  assert "Traceback" not in err


def test_resume_below_the_checkpoints_step_is_refused(tmp_path, straight_run):
  """--config.steps under the step a workdir holds trains nothing: one line says so (exit 1)."""
  import shutil

  wd = tmp_path / "run"
  shutil.copytree(straight_run, wd, ignore=shutil.ignore_patterns("lock"))
  rc, _, err = run_train(wd, "--config.steps=10", *RESUME_STEPS[1:])
  assert rc == 1 and "config.steps=10 is below the step of" in err and "Traceback" not in err


def test_schedule_decides_every_periodic_action():
  """log_every 5, eval_every 10, 23 steps: a log window ends at 5, 10, 15, 20 and 23;
  validation and a checkpoint at 10, 20 and the last step; a preemption stop saves at once."""
  from cdeit_jax.train.train_loop import Schedule

  s = Schedule(cfg_(log_every=5, eval_every=10, steps=23))
  steps = range(1, 24)
  assert [k for k in steps if s.log(k, False)] == [5, 10, 15, 20, 23]
  assert [k for k in steps if s.validate(k)] == [10, 20, 23]
  assert [k for k in steps if s.save(k, False)] == [10, 20, 23]
  assert s.save(7, True) and s.log(7, True) and not s.validate(7)


def test_ema_matches_ema_pytorch_semantics():
  ws = np.random.default_rng(0).normal(size=3200)
  want = ema_pytorch_reference(list(ws))

  def body(ema, inp):
    n, w = inp
    e = training.ema_update({"w": ema}, {"w": w}, n, **config_lib.default_config().ema)["w"]
    return e, e

  _, got = jax.lax.scan(body, jnp.float32(0), (jnp.arange(3200), jnp.asarray(ws, jnp.float32)))
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)
  assert float(training.ema_decay(jnp.int32(3000), 0.995, 100, 2 / 3)) == pytest.approx(0.995)
  assert float(training.ema_decay(jnp.int32(110), 0.995, 100, 2 / 3)) == pytest.approx(
    1 - 10 ** (-2 / 3), rel=1e-6
  )


# ----------------------------------------------------------------------------- the step


@pytest.fixture(scope="module")
def step8():
  """The test config's step compiled for 8 devices and a global batch of 8."""
  return build(cfg_(), jax.devices(), 8)


def test_one_step_on_8_devices_equals_1_device(uef_batch, step8):
  rng = jax.random.key(0)
  out = []
  fsdp = build(cfg_(), jax.devices(), 8, shard_params=True)
  for mesh, c, fresh in (build(cfg_(), jax.devices()[:1], 8), step8, fsdp):
    state = fresh()
    for _ in range(2):
      state, metrics = c(state, put(uef_batch, mesh, 8), rng)
    out.append((state, metrics))
  (s1, m1), (s8, m8), (sf, mf) = out
  for s, m in ((s8, m8), (sf, mf)):  # replicated and FSDP-sharded params on 8 devices
    assert abs(float(m1["loss"]) - float(m["loss"])) < 1e-6
    for a, b in zip(
      leaves((s1.params, s1.ema, s1.opt_state)), leaves((s.params, s.ema, s.opt_state))
    ):
      np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
  assert int(s8.step) == 2
  fc1 = sf.params["mid"]["mlp"]["fc1"]["kernel"].get_value()  # (32, 128): split over 8 devices
  assert fc1.sharding.spec == jax.sharding.PartitionSpec(None, "data")
  assert {s.data.shape for s in fc1.addressable_shards} == {(32, 16)}
  assert all(
    s.data.shape == s8.params["mid"]["attn"]["qkv"]["kernel"].shape
    for s in s8.params["mid"]["attn"]["qkv"]["kernel"].get_value().addressable_shards
  )


def test_accumulation_equals_one_big_step(uef_batch):
  cfg, rng = cfg_(), jax.random.key(1)
  devices = jax.devices()[:4]
  mesh, big, s_big = build(cfg, devices, 8, accum=1)
  _, acc, s_acc = build(cfg, devices, 8, accum=2)  # 2 micro-batches of 4 over 4 devices
  s_big, m_big = big(s_big(), put(uef_batch, mesh, 8), rng)
  s_acc, m_acc = acc(s_acc(), put(uef_batch, mesh, 8), rng)
  assert abs(float(m_big["loss"]) - float(m_acc["loss"])) < 1e-6
  assert abs(float(m_big["grad_norm"]) - float(m_acc["grad_norm"])) < 1e-5
  for a, b in zip(leaves(s_big.params), leaves(s_acc.params)):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def test_overfits_a_fixed_batch(step8):
  """A batch with a strong signal: +-1 blocks whose condition is the block pattern itself."""
  signs = np.random.default_rng(0).choice([-1.0, 1.0], size=(8, 16, 16, 1)).astype(np.float32)
  target = np.repeat(np.repeat(signs, 8, axis=1), 8, axis=2)
  mesh, c, fresh = step8  # the test config's lr of 1e-3
  state = fresh()
  batch, rng = put({"cond": signs, "target": target}, mesh, 8), jax.random.key(2)
  losses = []
  for _ in range(80):
    state, m = c(state, batch, rng)
    losses.append(m["loss"])
  losses = np.asarray(jax.device_get(losses))
  assert np.all(np.isfinite(losses))
  assert losses[:5].mean() > 0.9  # a fresh (adaLN-zero) model predicts 0: L1 = mean |target| = 1
  assert losses[-10:].mean() < 0.3 * losses[:5].mean(), losses


# ----------------------------------------------------------------------------- the loop


def _two_processes(workdir, *overrides):
  """train.py with the test config as 2 local processes x 2 CPU devices (gloo's all-reduce, one
  per parameter on CPU, takes 1 ms among 4 devices and 5.5 ms among 8: 0.2 s a step, not 1 s)."""
  return two_processes(
    "train.py", "--config", TEST_CONFIG, "--workdir", str(workdir), *overrides, devices=2
  )


def test_two_processes_stop_together_on_sigterm_and_match_one(tmp_path, straight_run, monkeypatch):
  """2 processes x 2 devices: SIGTERM to process 1 only, and JAX's preemption service makes
  both stop after the same step and save it (checked every step, not only at log boundaries);
  the rerun resumes there, and losses and final weights are those of the 1 x 8 straight run
  (same config, seed and windows). With W&B on (offline): one run, written by process 0 only,
  kept under one id across the resume, its summary's loss metrics.jsonl's last."""
  import importlib.util

  tracked = importlib.util.find_spec("wandb") is not None  # the optional extra (test extra)
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_DIR", str(tmp_path / "D"))
  wd = tmp_path / "two"
  flags = [*RESUME_STEPS, *(["--config.wandb.project=check"] if tracked else [])]
  procs = _two_processes(wd, *flags)
  wait_for_first_log(wd)
  procs[1].send_signal(signal.SIGTERM)
  errs = finish(procs)
  run_id = json.loads((wd / "wandb.json").read_text())["id"] if tracked else None
  mngr = train_checkpoint.train_manager(str(wd))
  stopped = mngr.latest_step()
  mngr.close()
  assert stopped is not None and 2 <= stopped < 24, stopped
  assert f"SIGTERM: saved step {stopped}" in errs[0]  # the primary logs the agreed step
  assert "devices: 4 x cpu over 2 process(es)" in errs[0]
  errs = finish(_two_processes(wd, *flags))
  assert f"resumed from {wd}/checkpoints/{stopped}" in errs[0]
  one = {r["step"]: r for r in map(json.loads, (straight_run / "metrics.jsonl").open())}
  two = [json.loads(line) for line in (wd / "metrics.jsonl").open()]
  if tracked:
    (run,) = wandb_offline_runs(tmp_path / "D")
    assert run["id"] == run_id and run["summary"]["loss"] == two[-1]["loss"]
    assert run["summary"]["device"].startswith("devices: 4 x cpu over 2 process(es)")
  # one writer: the 2-step windows, and the window that ended at the agreed step
  assert [r["step"] for r in two] == sorted(set(range(2, 25, 2)) | {stopped})
  same = [r for r in two if r["step"] % 2 == 0 and r["step"] - 2 >= stopped or r["step"] <= 2]
  np.testing.assert_allclose(
    [r["loss"] for r in same], [one[r["step"]]["loss"] for r in same], rtol=1e-5
  )
  np.testing.assert_allclose(two[-1]["val_loss"], one[24]["val_loss"], rtol=1e-5)
  from flax import nnx

  weights = lambda w: jax.tree.leaves(
    nnx.state(loading.load(str(w), step=24, weights="raw")[0], nnx.Param)
  )
  for a, b in zip(weights(straight_run), weights(wd)):  # 2 x 2 against 1 x 8 devices
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-5)


@pytest.mark.parametrize(
  "over, match",
  [
    ({"batch_size": 10}, r"config.batch_size=10: does not divide evenly over 8 devices x 1"),
    ({"batch_size": 8, "accum_steps": 2}, r"config.batch_size=8: .* 8 devices x 2 accumulation"),
    ({"optimizer.lr": -1.0}, r"config.optimizer.lr=-1.0: must be > 0"),
    ({"optimizer.schedule": "linear"}, r"config.optimizer.schedule='linear'"),
    ({"model.dtype": "float8"}, r"config.model.dtype: 'float8'"),
    ({"data.units": "tank"}, r"config.data.units='tank': unknown units"),
    ({"steps": 0}, r"config.steps=0: must be a positive integer"),
    ({"eval_batch_size": -8}, r"config.eval_batch_size=-8: must be a positive integer"),
    ({"wandb.mode": "sometimes"}, r"config.wandb.mode='sometimes': must be 'online', 'offline'"),
  ],
)
def test_bad_config_values_are_named(over, match):
  with pytest.raises(ValueError, match=match):
    config_lib.check_training_config(cfg_(**over), num_devices=8)


def test_a_non_finite_step_before_any_checkpoint_says_none_was_saved(tmp_path):
  """A run whose loss turns non-finite before its first checkpoint says that none was saved
  (not "the last good checkpoint is step None"); with one, it names its step."""
  from cdeit_jax.train import log_windows

  for last_good, words in ((None, "No checkpoint was saved before it"), (8, "is step 8 in")):
    w = log_windows.Window(0, 2, 1.0)
    w.add({"finite": np.bool_(True)})
    w.add({"finite": np.bool_(False)})
    with pytest.raises(log_windows.NonFiniteLoss) as e:
      w.close(2, last_good, str(tmp_path))
    assert "non-finite at step 2" in str(e.value) and words in str(e.value)
    assert "None" not in str(e.value)


def test_non_finite_loss_stops_and_keeps_checkpoint(tmp_path, straight_run):
  import shutil

  wd = tmp_path / "run"
  shutil.copytree(straight_run, wd)
  before = final_state(wd, cfg_(steps=24))
  rc, _, err = run_train(
    wd,
    "--config.steps=32",
    "--config.eval_every=4",
    "--config.log_every=2",
    "--config.optimizer.lr=1e30",
    "--config.optimizer.grad_clip=0.0",
  )
  assert rc == 1
  assert "became non-finite at step" in err and "last good checkpoint is step 24" in err
  after = final_state(wd, cfg_(steps=24), jax.devices()[:1])  # saved on 8 devices, restored on 1
  assert after[0] == 24
  for a, b in zip(before[1], after[1]):
    np.testing.assert_array_equal(a, b)


def test_checkpoints_keep_latest_and_best(tmp_path):
  mngr = train_checkpoint.train_manager(str(tmp_path), keep=2, async_save=False)
  import orbax.checkpoint as ocp

  for step, val in zip(range(1, 6), [5.0, 1.0, 4.0, 3.0, 2.0]):
    mngr.save(
      step,
      args=ocp.args.Composite(meta=ocp.args.JsonSave({"val_loss": val})),
      metrics={"val_loss": val},
    )
  mngr.wait_until_finished()
  assert sorted(mngr.all_steps()) == [2, 4, 5]  # best (1.0 at step 2) + the latest two
  mngr.close()


def test_compile_out_of_memory_gives_advice_not_a_traceback(tmp_path, monkeypatch):
  """A step the devices cannot hold ends in one MemoryError that says what to change; train.py
  prints it as one line. The error is XLA's own (a real allocation of 32 TiB); the TPU
  compiler's wording is checked in test_compat."""
  from cdeit_jax.train import train_loop

  def refuse(*args, **kwargs):
    jax.jit(lambda: jnp.zeros((1 << 43,), jnp.float32))().block_until_ready()

  monkeypatch.setattr(training, "compile_train_step", refuse)
  cfg = cfg_(batch_size=16)  # 2 per device: the accumulation tip applies
  cfg.model.attention_impl = "xla"
  with pytest.raises(MemoryError) as e:
    train_loop.train(cfg, str(tmp_path))
  text = str(e.value)
  assert "does not fit the devices' memory" in text and "Out of memory allocating" in text
  for tip in (
    "config.model.attention_impl=auto",
    "config.accum_steps=2",
    "config.model.remat=True",
    "config.shard_params=True",
    "--compile_topology",
  ):
    assert tip in text


@pytest.mark.e2e
def test_a_full_disk_while_saving_is_one_line_and_the_saved_steps_stay(tmp_path, monkeypatch):
  """The disk fills at the second checkpoint (the error as orbax's asynchronous save raises it:
  TensorStore's text inside a ValueError): one DiskFull naming the workdir; the first step is
  whole and a rerun resumes from it."""
  from cdeit_jax.common import fileio
  from cdeit_jax.train import train_loop

  real = train_checkpoint.save_train
  saves = []

  def fills(mngr, state, data_iter, meta, val_loss=None):
    saves.append(meta["step"])
    if len(saves) == 2:
      try:
        raise ValueError(
          'RESOURCE_EXHAUSTED: Error writing local file "ocdbt.process_0/d/1": '
          "Failed to write 35471 bytes to file 11: No space left on device "
          "[os_error_code='28']"
        )
      except ValueError as e:
        raise RuntimeError("commit failed") from e
    return real(mngr, state, data_iter, meta, val_loss)

  monkeypatch.setattr(train_checkpoint, "save_train", fills)
  cfg = cfg_(batch_size=8)
  cfg.steps, cfg.eval_every, cfg.log_every = 8, 4, 4
  with pytest.raises(
    fileio.DiskFull,
    match=f"no space left on the device of {tmp_path}: .* rerun the same command to resume",
  ) as e:
    train_loop.train(cfg, str(tmp_path))
  assert "\n" not in str(e.value)
  assert checkpoint.all_steps(str(tmp_path)) == [saves[0]]
  monkeypatch.setattr(train_checkpoint, "save_train", real)
  assert train_loop.train(cfg, str(tmp_path))["step"] == 8
  assert checkpoint.all_steps(str(tmp_path))[-1] == 8


# ----------------------------------------------------------------------------- faults


def _records(workdir):
  return [json.loads(l) for l in (pathlib.Path(workdir) / "metrics.jsonl").open()]


def _wait_for(predicate, timeout=120):
  deadline = time.time() + timeout
  while time.time() < deadline:
    if predicate():
      return True
    time.sleep(0.02)
  return False


def _logged_steps(workdir):
  path = pathlib.Path(workdir) / "metrics.jsonl"
  if not path.exists():
    return []
  return [json.loads(l)["step"] for l in path.read_text().splitlines() if l.endswith("}")]


def _assert_equals_straight(workdir, straight):
  """Same final state, data position and validation metrics as the uninterrupted run, and a
  metrics.jsonl with each step once, in order, the same steps as the uninterrupted run's."""
  cfg = cfg_(steps=24)
  s_step, s_leaves, s_next = final_state(straight, cfg)
  k_step, k_leaves, k_next = final_state(workdir, cfg)
  assert s_step == k_step == 24 and s_next == k_next
  for a, b in zip(s_leaves, k_leaves):
    np.testing.assert_array_equal(a, b)
  k_log, s_log = _records(workdir), _records(straight)
  assert [r["step"] for r in k_log] == [r["step"] for r in s_log]
  assert [r.get("val_loss") for r in k_log] == [r.get("val_loss") for r in s_log]
  assert checkpoint.all_steps(str(workdir)) == checkpoint.all_steps(str(straight))
  assert checkpoint.best_step(str(workdir)) == checkpoint.best_step(str(straight))


@pytest.mark.parametrize(
  "when",
  [
    pytest.param("compile", marks=pytest.mark.slow),
    pytest.param("between_checkpoints", marks=pytest.mark.slow),
    "save_started",
  ],
)
def test_kill_9_then_resume_equals_straight_run(tmp_path, straight_run, when):
  """kill -9 while compiling, between two checkpoints, and as an asynchronous save starts (its
  metrics line is written right after the save is handed to orbax); the rerun loses nothing."""
  wd = tmp_path / "run"
  p = run_train(wd, *RESUME_STEPS, wait=False)
  if when == "compile":
    assert _wait_for(lambda: (wd / "lock").exists())
    time.sleep(1.0)
  elif when == "between_checkpoints":
    assert _wait_for(lambda: any(8 < s < 16 for s in _logged_steps(wd)))
  else:
    assert _wait_for(lambda: 16 in _logged_steps(wd))
  p.kill()
  p.communicate(timeout=60)
  rc, _, err = run_train(wd, *RESUME_STEPS)
  assert rc == 0, err[-3000:]
  assert not list((wd / "checkpoints").glob("*tmp*"))  # leftovers of the killed save are gone
  _assert_equals_straight(wd, straight_run)


def test_unfinished_save_and_damaged_latest_fall_back(tmp_path, straight_run):
  """A half-written step (orbax's temporary folder) is ignored, and a latest step with a
  truncated weight file is skipped with one line: training resumes from the newest intact step
  and ends where the uninterrupted run does; the damaged step is kept aside, not deleted."""
  import shutil

  wd = tmp_path / "run"
  rc, _, err = run_train(wd, "--config.steps=16", *RESUME_STEPS[1:])
  assert rc == 0, err[-3000:]
  shutil.copytree(wd / "checkpoints" / "16", wd / "checkpoints" / "24.orbax-checkpoint-tmp-1")
  (wd / "checkpoints" / "24.orbax-checkpoint-tmp-1" / "commit_success.txt").unlink(missing_ok=True)
  chunks = [
    f
    for f in (wd / "checkpoints" / "16" / "params").rglob("*")
    if f.is_file() and f.stat().st_size > 64 and "d" in f.parent.name
  ]
  assert chunks, sorted((wd / "checkpoints" / "16").rglob("*"))
  for f in chunks:
    f.write_bytes(f.read_bytes()[:16])  # truncated
  rc, _, err = run_train(wd, *RESUME_STEPS)
  assert rc == 0, err[-3000:]
  skipped = [l for l in err.splitlines() if "skipping checkpoint step 16" in l]
  assert len(skipped) == 1 and "checkpoints/16/params: unreadable" in skipped[0], err[-3000:]
  assert "Traceback" not in err
  assert "resumed from" in err and err.count("moved damaged checkpoint") == 1
  assert len(list((wd / "damaged").iterdir())) == 1
  assert (wd / "debug.log").read_text().count("Traceback") >= 1  # the whole error, kept
  _assert_equals_straight(wd, straight_run)


def test_retention_keeps_the_best_across_restarts(tmp_path):
  """The issue's case: the best step (lowest validation loss) is an old one; a restarted manager
  must still know its loss and keep it (orbax's policy forgot metrics across restarts)."""
  import orbax.checkpoint as ocp

  def save(step, val):
    mngr = train_checkpoint.train_manager(str(tmp_path), keep=2, async_save=False)
    mngr.save(
      step,
      args=ocp.args.Composite(meta=ocp.args.JsonSave({"step": step})),
      metrics=None if val is None else {"val_loss": val},
    )
    mngr.wait_until_finished()
    mngr.close()

  # a restart (a new manager) before every save; 47 is the SIGTERM save without a loss
  for step, val in [
    (10, 0.09),
    (20, 0.08),
    (30, 0.0705),
    (40, 0.07047),
    (47, None),
    (50, 0.07056),
    (60, 0.07091),
  ]:
    save(step, val)
  assert checkpoint.all_steps(str(tmp_path)) == [40, 50, 60]
  assert checkpoint.best_step(str(tmp_path)) == 40


def test_second_training_in_a_workdir_is_refused_and_a_dead_ones_lock_taken(tmp_path):
  from cdeit_jax.train import workdir_lock

  holder = subprocess.Popen(
    [
      sys.executable,
      "-c",
      "import sys, time; from cdeit_jax.train import workdir_lock; "
      f"workdir_lock.WorkdirLock({str(tmp_path)!r}).acquire(); print('held', flush=True); "
      "time.sleep(600)",
    ],
    stdout=subprocess.PIPE,
    text=True,
    cwd=REPO,
  )
  assert holder.stdout.readline().strip() == "held"
  rc, _, err = run_train(tmp_path, "--config.steps=2")
  assert rc == 1 and f"in use by another training (pid {holder.pid} on" in err, err[-2000:]
  assert not (tmp_path / "checkpoints").exists()
  holder.kill()  # kill -9: the kernel releases its lock
  holder.wait()
  with workdir_lock.WorkdirLock(str(tmp_path)):
    with pytest.raises(workdir_lock.WorkdirBusy, match="in use by another training"):
      workdir_lock.WorkdirLock(str(tmp_path)).acquire()


def test_resume_refuses_a_changed_batch_size_and_warns_on_changed_optimizer(tmp_path, straight_run):
  from cdeit_jax.train import resume

  meta = checkpoint.read_meta(str(straight_run))
  with pytest.raises(
    checkpoint.CheckpointError, match=r"config.batch_size: checkpoint 8, now 16.*new --workdir"
  ):
    resume.check_resume(cfg_(batch_size=16), meta, "here")
  with pytest.raises(checkpoint.CheckpointError, match=r"config.model.hidden_size: checkpoint 32"):
    resume.check_resume(cfg_(**{"model.hidden_size": 64}), meta, "here")
  warnings = resume.check_resume(
    cfg_(steps=24, **{"optimizer.lr": 5e-4, "model.attention_impl": "xla"}), meta, "here"
  )
  assert warnings == [
    "warning: resuming here with changed config.optimizer.lr: 0.001 -> 0.0005 "
    "(the run no longer equals an uninterrupted one)"
  ]


def test_metrics_jsonl_is_cut_to_the_resumed_step(tmp_path):
  from cdeit_jax.common import logs

  path = tmp_path / "metrics.jsonl"
  lines = [{"step": s, "loss": s / 10} for s in (2, 4, 6, 4, 6, 8, 10)]
  path.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"step": 12, "lo')
  logger = logs.MetricLogger(str(tmp_path), total_steps=10, start_step=6)
  logger.close()
  assert logger.dropped == 5
  assert [json.loads(l) for l in path.open()] == [
    {"step": 2, "loss": 0.2},
    {"step": 4, "loss": 0.4},
    {"step": 6, "loss": 0.6},
  ]


@pytest.mark.parametrize(
  "args, message",
  [
    (["--config", "configs/nope.py"], "error: --config configs/nope.py: no such file"),
    (
      ["--config", TEST_CONFIG, "--config.modle.x=1"],
      "error: --config.modle.x: no such config key (model has no x; docs/config.md lists every "
      "key)",
    ),
  ],
)
def test_config_flag_mistakes_are_one_line(tmp_path, args, message):
  p = subprocess.run(
    [sys.executable, str(REPO / "train.py"), *args, "--workdir", str(tmp_path)],
    capture_output=True,
    text=True,
    cwd=REPO,
    timeout=120,
  )
  assert p.returncode == 2 and p.stderr.strip().splitlines()[-1].startswith(message), p.stderr
  assert "Traceback" not in p.stderr


def test_none_on_the_command_line_is_none():
  cfg = cfg_()
  cfg.data.stats = "None"
  config_lib.none_strings(cfg)
  assert cfg.data.stats is None and cfg.data.units == "uef2017"


def test_a_workdir_named_by_digits_is_a_workdir_not_a_step(tmp_path, straight_run):
  """`runs/2024` evaluates its best validated step, as `runs/r2024` does; only
  `.../checkpoints/<digits>` is one step."""
  import shutil

  from cdeit_jax.checkpoints import reader

  ranked = checkpoint.ranked_steps(str(straight_run))
  latest = max(checkpoint.all_steps(str(straight_run)))
  for name in ("2024", "r2024"):
    wd = tmp_path / "runs" / name
    shutil.copytree(straight_run, wd, ignore=shutil.ignore_patterns("lock"))
    assert checkpoint.step_folder(str(wd)) is None
    with reader.open_run(str(wd)) as run:
      order = run.candidates
    assert order[: len(ranked)] == ranked and sorted(order) == checkpoint.all_steps(str(wd))
    step_dir = wd / "checkpoints" / str(latest)
    assert checkpoint.step_folder(str(step_dir)) == latest
    with reader.open_run(str(step_dir)) as run:
      assert run.candidates == [latest]


def test_the_reader_opens_a_run_once_and_says_what_it_skipped(tmp_path, straight_run, monkeypatch):
  """One CheckpointManager for a run's listing, metadata and weights; the typed metadata is the
  stored record's; loading past a damaged best step returns that step in `skipped` (the
  caller's dict untouched) and names why the next step was used."""
  import shutil

  from cdeit_jax.checkpoints import reader

  wd = tmp_path / "run"
  shutil.copytree(straight_run, wd, ignore=shutil.ignore_patterns("lock"))
  ranked = checkpoint.ranked_steps(str(wd))
  for f in (wd / "checkpoints" / str(ranked[0]) / "ema").rglob("*"):
    if f.is_file() and f.parent.name == "d":
      f.write_bytes(b"")
  opened = []
  real = checkpoint.manager
  monkeypatch.setattr(checkpoint, "manager", lambda *a, **k: opened.append(a) or real(*a, **k))
  passed = {}
  with reader.open_run(str(wd)) as run:
    assert run.candidates[: len(ranked)] == ranked
    meta, skipped = run.first_readable()
    system = loading.resolve(meta.config, meta.record)
    loaded = run.load(system, weights="ema", start=meta.step, passed=passed)
  assert len(opened) == 1 and skipped == {} and passed == {}
  record = checkpoint.read_meta(str(wd), ranked[1])
  assert loaded.meta.step == ranked[1] and loaded.meta.record == record
  assert loaded.meta.weights == tuple(record["weights"])
  np.testing.assert_array_equal(loaded.meta.mean.ravel(), record["stats"]["mean"])
  assert list(loaded.skipped) == [ranked[0]] and "/ema: unreadable" in loaded.skipped[ranked[0]]
  assert (
    loaded.reason.startswith("validation loss ") and f"rank 2 of {len(ranked)}" in loaded.reason
  )
  assert f"steps {ranked[0]} could not be read" in loaded.reason


def test_eval_uses_the_best_intact_step(tmp_path, straight_run, caplog):
  """The best step's EMA weights truncated, then its metadata garbled: evaluation names the step
  in one line and uses the next best step that loads."""
  import shutil

  from cdeit_jax.infer import data_kinds

  wd = tmp_path / "run"
  shutil.copytree(straight_run, wd, ignore=shutil.ignore_patterns("lock"))
  ranked = checkpoint.ranked_steps(str(wd))
  assert len(ranked) == 2, ranked  # the test config keeps 2

  def run(out):
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cdeit_jax"):
      r = data_kinds.evaluate(
        str(wd),
        "uef2017",
        str(REPO / "data" / "uef2017"),
        str(tmp_path / out),
        {"eval.max_examples": 2, "eval.figure": False},
      )
    return r["settings"]["checkpoint_step"], caplog.text

  for f in (wd / "checkpoints" / str(ranked[0]) / "ema").rglob("*"):
    if f.is_file() and f.parent.name == "d":
      f.write_bytes(b"")
  step, text = run("a")
  assert step == ranked[1]
  assert f"skipping checkpoint step {ranked[0]}: checkpoint" in text and "/ema: unreadable" in text
  assert "Traceback" in (tmp_path / "a" / "debug.log").read_text()
  (wd / "checkpoints" / str(ranked[0]) / "meta" / "metadata").write_text("{garbled")
  step, text = run("b")
  assert step == ranked[1] and "meta/metadata: unreadable: JSONDecodeError" in text


def test_init_from_starts_a_new_run_at_the_checkpoints_ema_weights(fine_tuned_run, straight_run):
  """config.init_from: a 1-step run at a learning rate of 1e-30 keeps what it started from (to
  1e-20), which must be the source's EMA weights (not its raw ones, not a fresh initialisation)."""
  wd, log = fine_tuned_run
  assert f"initialised from the EMA weights of {straight_run}/checkpoints/24" in log
  source_ema, _ = loading.load(str(straight_run), weights="ema", step=24)
  source_raw, _ = loading.load(str(straight_run), weights="raw", step=24)
  started, meta = loading.load(str(wd), weights="raw")
  assert meta["step"] == 1 and meta["config"]["init_from"] == str(straight_run)
  params = lambda m: leaves(nnx.state(m, nnx.Param))
  for a, b in zip(params(started), params(source_ema)):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-20)
  # EMA and raw weights are different sets after 24 steps
  assert any(not np.array_equal(a, b) for a, b in zip(params(started), params(source_raw)))


def test_init_from_refuses_another_model_naming_the_keys(straight_run):
  cfg = cfg_(**{"model.hidden_size": 64, "model.attention_impl": "xla"})
  with pytest.raises(InputError, match=r"init_from=.*model\.hidden_size: 32 there, 64 here") as e:
    loading.initial_params(str(straight_run), cfg, None, None)
  assert "attention_impl" not in str(e.value) and "\n" not in str(e.value)


@pytest.mark.e2e
def test_a_fine_tuning_on_its_starts_system_reads_its_inputs_as_the_start_did(tmp_path):
  """config.init_from on the same measuring system: the run standardises its voltages with the
  start's statistics and keeps the start's condition calibration (set here far from what the
  UEF2017 data would give), so the start's weights see the inputs they learnt and the two runs
  interpolate; `data.stats` given explicitly wins and the calibration is computed on the data; a
  start for another system has nothing to keep."""
  from cdeit_jax.data import stats
  from cdeit_jax.eit import layout
  from cdeit_jax.model.network import CDEIT

  pi = {"model.cond": "eim+linear", "model.cond_alphas": (0.03, 0.3)}
  cfg = cfg_(**pi)
  model = CDEIT(**config_lib.model_kwargs(cfg, loading.resolve(cfg)), rngs=nnx.Rngs(0))
  mean, std = stats.authors_stats()
  mean, std = mean * 1.5, std * 2.0
  model.conditioner.voltage_mean[...] = jnp.asarray(mean.ravel(), jnp.float32)
  model.conditioner.voltage_std[...] = jnp.asarray(std.ravel(), jnp.float32)
  model.conditioner.scale[...] = jnp.asarray([7.0, 3.0], jnp.float32)
  start = tmp_path / "start"
  checkpoint.save_inference(str(start), model, cfg, mean=mean, std=std, step=7)
  calibration = checkpoint.calibration_of(model)

  kept = loading.start_inputs(str(start), model.system.device)
  np.testing.assert_array_equal(kept[0][0], mean)
  np.testing.assert_array_equal(kept[0][1], std)
  assert kept[1] == calibration
  assert loading.start_inputs(str(start), layout.as_layout("ktc2023")) is None

  flags = ["--config.steps=1", "--config.optimizer.lr=1e-30", f"--config.init_from={start}"]
  flags += ["--config.model.cond=eim+linear", "--config.model.cond_alphas=(0.03, 0.3)"]
  runs = {
    "kept": run_train(tmp_path / "kept", *flags, "--config.data.stats=None", wait=False),
    "given": run_train(tmp_path / "given", *flags, wait=False),  # the test config's "authors"
  }
  logs = dict(zip(runs, finish(list(runs.values()))))
  assert "its voltage statistics and condition calibration kept" in logs["kept"]
  assert "calibration kept" not in logs["given"]
  meta = {k: checkpoint.read_meta(str(tmp_path / k), 1) for k in runs}
  was, std_was = checkpoint.meta_stats(meta["kept"])
  np.testing.assert_allclose(was, mean, rtol=1e-7)
  np.testing.assert_allclose(std_was, std, rtol=1e-7)
  assert meta["kept"]["calibration"] == calibration
  authors = stats.authors_stats()
  np.testing.assert_allclose(checkpoint.meta_stats(meta["given"])[0], authors[0], rtol=1e-7)
  scale = [v for k, v in meta["given"]["calibration"].items() if k.endswith("scale")][0]
  assert not np.allclose(scale, [7.0, 3.0], rtol=0.5)  # computed on UEF2017's frames


@pytest.mark.e2e
def test_a_fine_tuning_may_add_condition_priors_and_the_removal_input(tmp_path):
  """config.init_from a model with fewer inputs (one prior where the run has two, no removal
  input where it has one): a 1-step run at a learning rate of 1e-30 starts as the start's
  function, its patch embedding the start's in the first channels and zero in the added ones,
  the removal vectors zero, the start's condition scale kept for its channels and measured on
  the data for the added ones; a start with more inputs than the run is refused."""
  from cdeit_jax.model.network import CDEIT

  system = {"model.cond": "linear", "simulator.removals": "-;3", "model.cond_grid": 16}
  start_cfg = cfg_(**system)
  model = CDEIT(**config_lib.model_kwargs(start_cfg, loading.resolve(start_cfg)), rngs=nnx.Rngs(0))
  params = nnx.state(model, nnx.Param)
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(5), len(leaves))  # weights away from adaLN-zero's
  nnx.update(
    model,
    jax.tree.unflatten(
      tree, [x + 0.05 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
    ),
  )
  model.conditioner.scale[...] = jnp.asarray([7.0, 3.0], jnp.float32)
  mean, std = np.full((1, 16, 13), 1e-4), np.full((1, 16, 13), 2e-3)
  start = tmp_path / "start"
  checkpoint.save_inference(str(start), model, start_cfg, mean=mean, std=std, step=7)

  flags = ["--config.steps=1", "--config.optimizer.lr=1e-30", f"--config.init_from={start}"]
  flags += [f"--config.{k}={v}" for k, v in system.items()] + ["--config.data.stats=None"]
  flags += ["--config.model.cond_priors=('noser', 'laplace')", "--config.model.removal_input=True"]
  rc, _, err = run_train(tmp_path / "run", *flags)
  assert rc == 0, err[-3000:]
  added = "a model with fewer inputs: the channels of priors ('laplace',) and the removal input"
  assert added in err
  grown, meta = loading.load(str(tmp_path / "run"))
  assert grown.conditioner.num_channels == 4 and grown.removal_input
  scale = np.asarray(grown.conditioner.scale[...])
  np.testing.assert_array_equal(scale[:2], [7.0, 3.0])
  assert np.all(np.isfinite(scale[2:])) and not np.allclose(scale[2:], 1.0)  # measured
  kernel = np.asarray(grown.x_embedder.kernel[...])
  was = np.asarray(model.x_embedder.kernel[...])
  np.testing.assert_allclose(kernel[:, :, :3], was, rtol=1e-6, atol=0)  # noisy image + 2 levels
  # zero at the start: one Adam step at 1e-30 moves a weight by at most about 1e-30
  assert np.abs(kernel[:, :, 3:]).max() < 1e-28
  assert np.abs(np.asarray(grown.removal_embed.embedding[...])).max() < 1e-28
  rng = np.random.default_rng(0)
  cond = rng.standard_normal((4, 208)).astype(np.float32)
  cond[2:, grown.conditioner.removed[...][1]] = np.nan  # two frames without electrode 3
  x = rng.standard_normal((4, 128, 128, 1)).astype(np.float32)
  t = np.array([0, 10, 500, 999])
  np.testing.assert_allclose(
    np.asarray(grown(x, t, cond)), np.asarray(model(x, t, cond)), rtol=0, atol=1e-4
  )
  # the other way round (a start with the removal input, a run without) is another model
  rc, _, err = run_train(
    tmp_path / "back",
    "--config.steps=1",
    f"--config.init_from={tmp_path / 'run'}",
    *[f"--config.{k}={v}" for k, v in system.items()],
  )
  assert rc != 0 and "its model is not this config's" in err and "removal_input" in err


# ----------------------------------------------------------------------------- the log


class _Records(logging.Handler):
  def __init__(self):
    super().__init__()
    self.lines = []

  def emit(self, record):
    self.lines.append(record.getMessage())


def test_the_log_shows_the_setup_and_each_windows_figures(tmp_path, monkeypatch):
  """configs/test.py on the 8 fake devices, 10 steps, a window of 5, a config meant for 16: the
  start-up block names the mesh, the per-device batch and the dtypes; the fewer-devices line
  says how to get 16 on a CPU; each progress line shows its own window (the mean of the losses
  its steps computed, fetched here step by step) and that window's metrics.jsonl record; the
  summary comes after the last one."""
  from flax import nnx

  from cdeit_jax.common import logs
  from cdeit_jax.model.network import CDEIT
  from cdeit_jax.train import log_windows, train_loop

  losses = []
  add = log_windows.Window.add
  monkeypatch.setattr(
    log_windows.Window, "add", lambda w, m: (losses.append(float(m["loss"])), add(w, m))[1]
  )
  handler = _Records()
  logs.log.addHandler(handler)
  level = logs.log.level
  logs.log.setLevel(logging.INFO)
  try:
    cfg = cfg_(steps=10, log_every=5, eval_every=10, expected_devices=16)
    train_loop.train(cfg, str(tmp_path))
  finally:
    logs.log.removeHandler(handler)
    logs.log.setLevel(level)
  lines = handler.lines
  model = CDEIT(**config_lib.model_kwargs(cfg, loading.resolve(cfg)), rngs=nnx.Rngs(0))
  # the trained parameters and the fixed position table, as the reference counts them
  params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  params += (cfg.model.image_size // cfg.model.patch_size) ** 2 * cfg.model.hidden_size
  assert lines[0] == (
    "devices: 8 x cpu over 1 process(es); mesh data=8 (the batch split over it, parameters "
    "replicated)"
  )
  assert lines[1].startswith("this config is meant for 16 devices (config.expected_devices) and ")
  assert "runs on 8" in lines[1] and "--xla_force_host_platform_device_count=16" in lines[1]
  assert (
    "batch: global 8, 1 per device per micro-batch on 8 device(s); no gradient accumulation"
    in lines
  )
  (model_line,) = [x for x in lines if x.startswith("model: ")]
  assert model_line.startswith(f"model: {params:,} parameters in float32, computing in float32")
  records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  progress = [x for x in lines if x.startswith("step ")]
  assert [r["step"] for r in records] == [5, 10] and len(progress) == 2 and len(losses) == 10
  for r, line, window in zip(records, progress, (losses[:5], losses[5:])):
    assert r["loss"] == pytest.approx(np.mean(window), rel=1e-6)
    assert line.startswith(f"step {r['step']}/10: loss {np.mean(window):.4g} (mean of steps ")
    for text in (
      f"grad norm {r['grad_norm']:.3g}",
      f"lr {r['lr']:.3g}",
      f"{r['samples_per_sec']:.4g} samples/s",
      f"{r['tflops_per_device']:.3g} TFLOP/s per device",
    ):
      assert text in line
  assert "ETA " in progress[0] and f"val_loss {r['val_loss']:.4g}" in progress[1]
  assert lines.index(progress[-1]) == len(lines) - 2 and lines[-1].startswith("wall time ")


def test_the_batch_line_counts_devices_and_micro_batches():
  from cdeit_jax.train import train_loop

  assert train_loop.batch_line(cfg_(batch_size=64, accum_steps=2), 8) == (
    "batch: global 64, 4 per device per micro-batch on 8 device(s); gradient accumulation over "
    "2 micro-batches of 32"
  )
  assert train_loop.fewer_devices_line(8, 8) is None
  assert train_loop.fewer_devices_line(None, 1) is None
  assert "meant for 8 devices" in train_loop.fewer_devices_line(8, 1)
  assert config_lib.load(str(REPO / "configs" / "v5e8.py")).expected_devices == 8


def test_a_run_refused_before_its_first_step_leaves_nothing_it_made(tmp_path):
  """A bad data path: a new workdir (and the folder above it) is gone again; in the user's own
  folder only the user's file stays (no lock, no checkpoints folder)."""
  from cdeit_jax.train import train_loop

  bad = cfg_(**{"data.path": str(tmp_path / "no_data")})
  with pytest.raises(InputError, match="does not exist"):
    train_loop.train(bad, str(tmp_path / "new" / "run"))
  assert not (tmp_path / "new").exists()
  mine = tmp_path / "mine"
  mine.mkdir()
  (mine / "notes.txt").write_text("mine")
  with pytest.raises(InputError, match="does not exist"):
    train_loop.train(bad, str(mine))
  assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def test_a_deleted_lock_file_is_never_held_as_the_workdirs_lock(tmp_path):
  """A refused run deletes the lock file it made while holding it; a run that locked that inode
  meanwhile sees that the path no longer names it and locks the path's new file."""
  import os

  from cdeit_jax.train import workdir_lock

  first = workdir_lock.WorkdirLock(str(tmp_path)).acquire()
  first.release(remove=True)
  assert not (tmp_path / "lock").exists()
  lock = workdir_lock.WorkdirLock(str(tmp_path))
  real, opened = lock._lock_file, []

  def racing():  # the first file it locks is deleted before it looks
    fd = real()
    if not opened:
      os.unlink(lock.path)
    opened.append(os.fstat(fd).st_ino)
    return fd

  lock._lock_file = racing
  lock.acquire()
  try:
    assert len(opened) == 2 and os.stat(lock.path).st_ino == opened[1]
    with pytest.raises(workdir_lock.WorkdirBusy):
      workdir_lock.WorkdirLock(str(tmp_path)).acquire()
  finally:
    lock.release()
