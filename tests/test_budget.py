"""A wall-clock budget (`config.time_budget_s`, cdeit_jax/train/budget.py) and the schedule whose
horizon it sets (`training.learning_rate_fn`): optax's schedule as the independent truth, hand
computations for the budget's decisions, and train.py stopping inside its budget."""

import json
import time

import jax
import numpy as np
import optax
import pytest
from conftest import TEST_CONFIG, finish, run_train, two_processes

from cdeit_jax import config_lib
from cdeit_jax.checkpoints import loading
from cdeit_jax.common import sharding as shd
from cdeit_jax.train import budget, training


def _cfg(**optimizer):
  cfg = config_lib.load(TEST_CONFIG)
  cfg.optimizer.update(optimizer)
  return cfg


@pytest.mark.parametrize("warmup", [0, 10])
def test_the_schedule_is_optaxs_warmup_cosine_at_any_horizon(warmup):
  cfg = _cfg(schedule="warmup_cosine", lr=3e-3, warmup_steps=warmup, end_lr_factor=0.05)
  lr = jax.jit(training.learning_rate_fn(cfg))
  for horizon in (11, 50, 400):
    want = optax.warmup_cosine_decay_schedule(0.0, 3e-3, warmup, horizon, 3e-3 * 0.05)
    counts = np.array([0, 1, 5, 9, 10, 11, 30, 49, 50, 51, 399, 400, 1000])
    got = np.array([lr(c, horizon) for c in counts])
    np.testing.assert_allclose(got, [want(c) for c in counts], rtol=2e-6, atol=1e-12)
  constant = training.learning_rate_fn(_cfg(schedule="constant", lr=2e-4))
  assert float(constant(7, 3)) == pytest.approx(2e-4)


def test_a_new_horizon_moves_the_decay_in_the_compiled_step():
  cfg = _cfg(schedule="warmup_cosine", lr=1e-3, warmup_steps=0, end_lr_factor=0.0)
  mesh = shd.make_mesh()
  ts = training.setup(cfg, loading.resolve(cfg), mesh)
  c = training.compile_train_step(ts, cfg.batch_size, mesh)
  state = jax.device_put(ts.state, c.state_shardings)
  constants = jax.device_put(ts.constants, c.constants_shardings)
  rng = np.random.default_rng(0)
  batch = {
    "cond": rng.standard_normal((cfg.batch_size, 16, 16, 1)).astype(np.float32),
    "target": rng.uniform(-1, 1, (cfg.batch_size, 128, 128, 1)).astype(np.float32),
  }
  batch = jax.device_put(batch, shd.batch_sharded(mesh))
  assert int(training.horizon_of(state)) == cfg.steps
  state, m = c.fn(state, batch, jax.random.key(0), constants)
  # cos(pi * 0 / steps): the peak
  assert float(m["lr"]) == pytest.approx(1e-3)
  state = training.with_horizon(state, 2)  # step 1 of 2: half-way down the cosine
  state, m = c.fn(state, batch, jax.random.key(0), constants)
  assert float(m["lr"]) == pytest.approx(1e-3 * 0.5 * (1 + np.cos(np.pi / 2)), abs=1e-9)
  assert int(training.horizon_of(state)) == 2
  state, m = c.fn(state, batch, jax.random.key(0), constants)
  assert float(m["lr"]) == pytest.approx(0.0, abs=1e-9)  # past the horizon: the end value


@pytest.mark.parametrize("seconds", [0, -5, float("nan"), float("inf"), float("1e400")])
def test_a_budget_that_is_not_a_finite_time_is_refused_before_any_work(seconds):
  """0, negative, NaN, infinite (`inf`, or 1e400 as a command line parses it): refused in one
  line naming the key and saying what it takes, by the check every training passes before its
  setup (an infinite budget used to crash after the first window); a string is refused by the
  config's type already."""
  cfg = config_lib.load(TEST_CONFIG)
  cfg.time_budget_s = seconds
  with pytest.raises(ValueError, match="config.time_budget_s=.*: must be a finite number of") as e:
    config_lib.check_training_config(cfg, num_devices=8)
  assert "\n" not in str(e.value) and "or None: no limit" in str(e.value)
  cfg.time_budget_s = 60.0
  config_lib.check_training_config(cfg, num_devices=8)


def test_the_budget_decides_from_what_it_measured():
  b = budget.Budget(100.0, start=0.0, steps=10**6)  # margin: max(2, 1 %) = 2 s
  b.begin(0, 10.0)  # steps begin 10 s in (start-up and compilation)
  # window 1 (its rate includes the data's compilation): 10 steps in 10 s; nothing measured yet
  d = b.decide(10, 20.0, window_s=10.0)
  assert not d.stop and d.horizon == 10 + int(1.0 * (100 - 20 - 2)) and d.seconds_left == 80
  b.ended_window(5.0)  # its validation and checkpoint took 5 s
  # from now on the rate counts from the first window's end: 40 steps in 40 s
  d = b.decide(50, 60.0, window_s=10.0)
  assert not d.stop and d.horizon == 50 + int(1.0 * (100 - 60 - 5 - 2))
  assert b.decide(90, 95.0, window_s=1.0).stop  # 100 - 95 - 5 - 2 < 0
  # between windows (one process): at the last moment the final validation and save still fit
  assert not b.expired(92.9) and b.expired(93.0)
  capped = budget.Budget(100.0, start=0.0, steps=30)
  capped.begin(0, 0.0)
  assert capped.decide(10, 10.0, window_s=1.0).horizon == 30  # never past config.steps


@pytest.mark.e2e
def test_train_py_validates_and_saves_inside_its_budget(tmp_path):
  # 60 s: with the other test worker busy, 35 s left 6 steps after start-up and compilation,
  # too few for a window to set the horizon the schedule decays to
  seconds = 60.0
  t0 = time.perf_counter()
  rc, out, err = run_train(
    tmp_path,
    "--config.steps=1000000",
    f"--config.time_budget_s={seconds}",
    "--config.optimizer.schedule=warmup_cosine",
    "--config.optimizer.warmup_steps=5",
    "--config.eval_every=100000",
  )
  wall = time.perf_counter() - t0
  assert rc == 0, err[-3000:]
  # the budget counts from train.py's first line (the run's own wall_s, below); the interpreter's
  # start and exit are beside it (11 s on a busy 2-core machine): here only "it ended"
  assert wall < seconds + 30, wall
  records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  last = records[-1]
  assert f"config.time_budget_s={seconds:g} s: step" in err and last["run"]["wall_s"] <= seconds
  # validated at the first window (the cost of the end measured) and at the last step, saved
  validated = [r["step"] for r in records if "val_loss" in r]
  assert validated[0] == records[0]["step"] and validated[-1] == last["step"] > validated[0]
  saved = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
  assert saved[-1] == last["step"]
  # the decay ended with the time: the last window's learning rate is near the end value (0)
  assert last["horizon"] <= last["step"] + 5 and last["lr"] < 0.1 * 1e-3


@pytest.mark.e2e
def test_two_processes_stop_at_the_same_step_inside_the_budget(tmp_path):
  """2 processes x 4 devices: process 0's clock decides at each window's end for both (one
  broadcast), so both stop, validate and save at the same step, inside the budget. (120 s: on a
  busy 2-core machine the two processes' start-up and first window alone took 48 s, and at 75 s
  a slower day's run made 2 steps and ended at 81 s.)"""
  seconds = 120.0
  t0 = time.perf_counter()
  procs = two_processes(
    "train.py",
    "--config", TEST_CONFIG, "--workdir", str(tmp_path),
    "--config.steps=1000000", f"--config.time_budget_s={seconds}", "--config.log_every=2",
    "--config.optimizer.schedule=warmup_cosine", "--config.eval_every=100000",
  )  # fmt: skip
  errs = finish(procs)
  assert time.perf_counter() - t0 < seconds + 30  # it ended (start and exit beside the budget)
  records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  stopped = records[-1]["step"]
  assert f"config.time_budget_s={seconds:g} s: step {stopped} validated and saved" in errs[0]
  assert "val_loss" in records[-1] and records[-1]["run"]["wall_s"] <= seconds
  saved = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
  assert saved[-1] == stopped and "over 2 process(es)" in errs[0]
