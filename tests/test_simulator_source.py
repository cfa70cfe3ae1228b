"""The simulator as a data source: batches made on the devices equal the simulate command's
examples, runs on 8 fake devices train, resume bit for bit and match a 1-device run."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import sigterm_after_first_log

from cdeit_jax import config_lib
from cdeit_jax.checkpoints import checkpoint, loading
from cdeit_jax.common import sharding as shd
from cdeit_jax.data import simulator_source, sources, synthetic

REPO = pathlib.Path(__file__).parent.parent
TEST_CONFIG = str(REPO / "configs" / "test.py")
# The test config's tiny model trained on fresh simulations. (The physics-informed model, whose
# operator and calibration are the step's constants, is stepped in-process below: its operator
# costs each train.py process ~20 s here.)
# The train.py runs use the one fixed measuring system (its condensed solve is ~5x cheaper on
# CPU); test_batches_... checks the source with a system drawn per example.
NOMINAL = [
  "--config.simulator.system.gain=(1.0,1.0)",
  "--config.simulator.system.contact_impedance=(0.0,0.0)",
  "--config.simulator.system.rotation_deg=0",
  "--config.simulator.system.jitter_deg=0",
  "--config.simulator.system.width_deg=(4.0,4.0)",
  "--config.simulator.system.width_jitter=0",
  "--config.simulator.system.passive=0",
  "--config.simulator.system.radius=(1.0,1.0)",
  "--config.simulator.system.background=(1.0,1.0)",
  "--config.simulator.system.snr_spread_db=0",
]
SIM = [
  "--config.data.source=simulator",
  "--config.data.units=simulated",
  "--config.data.stats=None",
  "--config.simulator.stats_examples=8",
  "--config.simulator.valid_examples=8",
  "--config.log_every=2",
  "--config.eval_every=4",
  *NOMINAL,
]


def _cfg(batch_size=8, nominal=False):
  """The test config on the simulator source; `nominal`: with the fixed system, as SIM's runs."""
  cfg = config_lib.load(TEST_CONFIG)
  cfg.data.update(source="simulator", units="simulated", stats=None)
  cfg.batch_size = batch_size
  if nominal:
    import dataclasses

    from cdeit_jax.eit.spec import SystemSpec

    cfg.simulator.system.update(dataclasses.asdict(SystemSpec.nominal()))
  return cfg


def _stats(ys):
  """numpy's mean and std (N-1) in float64, shaped (1, 16, 13) as the authors'."""
  y = np.asarray(ys, np.float64)
  return (
    y.mean(0).reshape(1, 16, 13).astype(np.float32),
    y.std(0, ddof=1).reshape(1, 16, 13).astype(np.float32),
  )


@pytest.mark.slow  # 32 s; training on 8 devices from the simulator runs by default
def test_batches_are_the_streams_examples_on_any_devices():
  """Step k's batch holds training examples k*G .. k*G+G-1 (as `python -m cdeit_jax.simulate`
  writes them: same function, test_simulate checks the files), standardised into the EIM the
  files' loader makes; the same on 1 and 8 devices, bit for bit."""
  cfg = _cfg()
  # the reference examples' own statistics (one compiled program for both uses)
  ys, xs = synthetic.example_arrays(cfg.simulator, "train", np.arange(24, 32), shd.make_mesh())
  mean, std = _stats(ys)
  out = []
  for devices in (jax.devices()[:1], jax.devices()):
    mesh = shd.make_mesh(devices)
    fn = simulator_source.batch_fn(cfg, loading.resolve(cfg), mesh, mean, std)
    b = fn(jax.device_put(np.int32(3), shd.replicated(mesh)))
    assert b["cond"].sharding.spec == shd.batch_sharded(mesh).spec
    out.append(jax.device_get(b))
  np.testing.assert_array_equal(out[0]["cond"], out[1]["cond"])
  np.testing.assert_array_equal(out[0]["target"], out[1]["target"])
  ref = sources.ArraySource(ys, xs, mean, std, name="reference")
  for i in range(8):
    np.testing.assert_array_equal(out[1]["target"][i], ref[i]["target"])
    np.testing.assert_allclose(out[1]["cond"][i], ref[i]["cond"], rtol=0, atol=1e-5)


def _run(workdir, *over, devices=8, wait=True):
  env = dict(os.environ)
  env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
  cmd = [
    sys.executable,
    str(REPO / "train.py"),
    "--config",
    TEST_CONFIG,
    "--workdir",
    str(workdir),
    *SIM,
    *over,
  ]
  p = subprocess.Popen(
    cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO
  )
  if not wait:
    return p
  out, err = p.communicate(timeout=400)
  assert p.returncode == 0, err[-3000:]
  return err


def _losses(workdir):
  return {
    r["step"]: r["loss"] for r in map(json.loads, (workdir / "metrics.jsonl").open()) if "loss" in r
  }


def _weights(workdir):
  meta = checkpoint.read_meta(str(workdir), 16)
  model, _ = loading.load(str(workdir), step=16, weights="raw")
  from flax import nnx

  return meta, [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
  wd = tmp_path_factory.mktemp("sim_straight")
  err = _run(wd, "--config.steps=16")
  assert "simulator source: 8 statistics and 8 validation examples" in err
  return wd


@pytest.mark.e2e
def test_trains_on_8_devices_and_stores_the_statistics(straight):
  losses = _losses(straight)
  assert sorted(losses) == [2, 4, 6, 8, 10, 12, 14, 16]
  assert all(np.isfinite(v) for v in losses.values())
  # learning, measured on the fixed validation examples (EMA weights: copies of the weights up
  # to step 100, taken every 10 steps; 0.0875 at step 4, 0.0780 at 16 when written)
  val = {
    r["step"]: r["val_loss"]
    for r in map(json.loads, (straight / "metrics.jsonl").open())
    if r.get("val_loss") is not None
  }
  assert sorted(val) == [4, 8, 12, 16] and val[16] < 0.95 * val[4], val
  meta = checkpoint.read_meta(str(straight), 16)
  mean, std = checkpoint.meta_stats(meta)
  cfg = _cfg(nominal=True)
  ys, _ = simulator_source.fixed_examples(cfg, "train", 8, shd.make_mesh())
  want_mean, want_std = _stats(ys)
  np.testing.assert_array_equal(mean, want_mean)
  np.testing.assert_array_equal(std, want_std)
  assert not (straight / "checkpoints" / "16" / "data").exists()  # the step is the position


@pytest.mark.slow  # kill/resume of the file source runs by default (test_training); here the
# stream's position is the step, which test_trains_on_8_devices_... checks is all that is saved
def test_sigterm_and_resume_equal_the_straight_run(straight, tmp_path):
  wd = tmp_path / "killed"
  p = _run(wd, "--config.steps=16", wait=False)
  stopped = sigterm_after_first_log(p, wd)
  assert stopped is not None and stopped < 16, stopped
  err = _run(wd, "--config.steps=16")
  assert "resumed from" in err and "simulator source: statistics from the checkpoint" in err
  (m1, w1), (m2, w2) = _weights(straight), _weights(wd)
  assert checkpoint.meta_stats(m1)[1].tolist() == checkpoint.meta_stats(m2)[1].tolist()
  for a, b in zip(w1, w2):
    np.testing.assert_array_equal(a, b)
  s, k = _losses(straight), _losses(wd)
  after = [step for step in k if step - 2 >= stopped]
  assert after and [s[step] for step in after] == [k[step] for step in after]


@pytest.mark.slow  # the file source's 1-against-8 check runs by default (test_training)
def test_one_device_gives_the_losses_of_eight():
  """Three steps of the physics-informed model on simulator batches, on 1 and on 8 devices."""
  from cdeit_jax.train import training

  cfg = _cfg(nominal=True)
  cfg.model.cond = "eim+linear"
  ys, xs = synthetic.example_arrays(cfg.simulator, "train", np.arange(16), shd.make_mesh())
  mean, std = _stats(ys)
  calib = sources.ArraySource(ys, xs, mean, std, name="calibration")
  losses = []
  for devices in (jax.devices()[:1], jax.devices()):
    mesh = shd.make_mesh(devices)
    ts = training.setup(cfg, loading.resolve(cfg), mesh, calibration_source=calib)
    c = training.compile_train_step(ts, cfg.batch_size, mesh)
    state = jax.device_put(ts.state, c.state_shardings)
    constants = jax.device_put(ts.constants, c.constants_shardings)
    make = simulator_source.batch_fn(cfg, loading.resolve(cfg), mesh, mean, std)
    run = []
    for _ in range(3):
      state, m = c.fn(state, make(state.step), jax.random.key(0), constants)
      run.append(float(m["loss"]))
    losses.append(run)
  np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5, atol=1e-7)


def test_sigterm_during_the_statistics_stops_within_a_chunk(tmp_path):
  """A SIGTERM while the simulator source makes its statistics (minutes at full size) stops
  training after the chunk in hand, with nothing saved, instead of when the steps begin."""
  import signal
  import threading
  import time

  from cdeit_jax.train import preemption, train_loop

  cfg = _cfg(nominal=True)
  cfg.simulator.stats_examples = 256 * 100

  def kill_once_handled():  # the signal only once train() handles it (else it ends pytest)
    for _ in range(6000):
      handler = signal.getsignal(signal.SIGTERM)
      if getattr(handler, "__func__", None) is preemption.Preemption._handle:
        os.kill(os.getpid(), signal.SIGTERM)
        return
      time.sleep(0.005)

  threading.Thread(target=kill_once_handled, daemon=True).start()
  result = train_loop.train(cfg, str(tmp_path / "run"))
  assert result == {"step": 0, "saved": False}
  assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # train() put the handler back
  assert not (tmp_path / "run" / "checkpoints").exists() or not list(
    (tmp_path / "run" / "checkpoints").iterdir()
  )
