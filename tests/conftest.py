"""Test setup: 8 fake CPU devices (set before jax is imported) and shared fixtures."""

import os

os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as the commands run (common/cpu_tuning.py)
# One persistent compilation cache for the session, inherited by the train.py subprocesses
# (the same train step then compiles once: 14 s -> 3 s on 2 CPU cores).
# Made by the first process only (pytest-xdist's workers inherit it), and removed when it ends.
import tempfile  # noqa: E402

OWN_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  OWN_CACHE = os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="cdeit_jax_cache_")

import pathlib  # noqa: E402
import shutil  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

FIXTURES = pathlib.Path(__file__).parent / "fixtures"


def system_of(cond="eim", layout=None, removals=None, output="image", current_carrying="use"):
  """The `ModelSystem` that `loading.resolve` makes of the default config with these names (the
  published model's with none): what the commands hand down, made here the one way they make it."""
  from cdeit_jax import config_lib
  from cdeit_jax.checkpoints import loading

  cfg = config_lib.default_config()
  cfg.model.update(cond=cond, output=output, current_carrying=current_carrying)
  if layout is not None:
    cfg.simulator.layout = layout
  if removals is not None:
    cfg.simulator.removals = removals
  return loading.resolve(cfg)


def attention_layers(cfg) -> tuple[int, int]:
  """(global, windowed) attention layers of `cfg`'s model, counted in its module graph."""
  from flax import nnx

  from cdeit_jax import config_lib
  from cdeit_jax.checkpoints import loading
  from cdeit_jax.model.layers import Attention
  from cdeit_jax.model.network import CDEIT

  kw = config_lib.model_kwargs(cfg, loading.resolve(cfg), "gpu")
  model = nnx.eval_shape(lambda: CDEIT(**kw, rngs=nnx.Rngs(0)))
  layers = [m for _, m in nnx.iter_graph(model) if isinstance(m, Attention)]
  return sum(m.window is None for m in layers), sum(m.window is not None for m in layers)


def nhwc(a: np.ndarray) -> np.ndarray:
  """NCHW (reference) -> NHWC (ours), on the last three axes."""
  return np.moveaxis(np.asarray(a), -3, -1)


# Tests that share an expensive fixture run in one pytest-xdist worker (`make test` distributes
# with --dist loadgroup), so that it is built once, not once per worker: fixture -> group.
# `straight_run` is left out: its tests are a third of the end-to-end tier, and spread over both
# workers they finish sooner than the second build of the fixture (a 24-step train.py run) costs.
SHARED_FIXTURES = {
  "gcs": "gcs",
  "model_folder": "model_folder",
  **{f: f for f in ("device_run", "small_set", "fixture_run", "step8", "profiled")},
}
E2E_FIXTURES = ("straight_run", "fine_tuned_run", "profiled", "device_run")
"""Fixtures that are whole runs: train.py in subprocesses (a straight run, a fine-tuning, a
profiled run) or a device's path in one process (its file, simulations, a training step and the
saved run: `device_run`). A test using one is end-to-end (marker `e2e`: CI's second tier,
`make test-e2e`, not the README's `make test`)."""


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the groups
def pytest_collection_modifyitems(config, items):
  for item in items:
    group = next((g for f, g in SHARED_FIXTURES.items() if f in item.fixturenames), None)
    if group is not None:
      item.add_marker(pytest.mark.xdist_group(group))
    if any(f in item.fixturenames for f in E2E_FIXTURES):
      item.add_marker(pytest.mark.e2e)


_SESSION = {}


def pytest_sessionstart(session):
  import time

  _SESSION["start"] = time.perf_counter()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
  """The machine's matmul rate beside the suite's time (the README's test command's budget is
  15 minutes on 2 cores; a slower machine's time is read against its rate)."""
  if hasattr(config, "workerinput"):  # an xdist worker: the controller prints it
    return
  import time

  from cdeit_jax.common import hardware

  wall = time.perf_counter() - _SESSION.get("start", time.perf_counter())
  rate = hardware.matmul_gflops()
  terminalreporter.write_line(
    f"suite wall time {wall:.0f} s on {os.cpu_count()} cores; this machine's float32 matmul "
    f"rate {rate:.0f} GFLOP/s (XLA, 2048^3)"
  )


def pytest_unconfigure(config):
  if OWN_CACHE is not None:
    shutil.rmtree(OWN_CACHE, ignore_errors=True)


@pytest.fixture(scope="session")
def fixtures_dir() -> pathlib.Path:
  return FIXTURES


@pytest.fixture(scope="session")
def small_state_dict() -> dict:
  with np.load(FIXTURES / "dit_small_state_dict.npz") as z:
    return {k: z[k] for k in z.files}


@pytest.fixture(scope="session")
def small_model(small_state_dict):
  """The reference's hidden_size=64 model with the fixture's weights (float32).

  Global attention runs in query chunks of 1024 (same results; 40% faster on CPU); the
  unchunked path is checked against the reference in test_model.
  """
  from flax import nnx

  from cdeit_jax.convert import load_torch_state_dict
  from cdeit_jax.model.network import CDEIT

  model = CDEIT(system=system_of(), hidden_size=64, attention_query_chunk=1024, rngs=nnx.Rngs(0))
  return load_torch_state_dict(model, small_state_dict)


TINY = dict(image_size=32, patch_size=2, hidden_size=32, num_heads=4, num_scales=2)
"""A tiny geometry (token grid 16, window 4, scales 16 -> 8 -> 4) for tests of behaviour: the
published geometry spends ~8 s per CPU forward in global attention over 4096 tokens."""


@pytest.fixture(scope="session")
def tiny_model():
  """A tiny CDEIT with random (non-zero) weights everywhere, so every path matters."""
  import jax
  from flax import nnx

  from cdeit_jax.model.network import CDEIT

  model = CDEIT(system=system_of(), **TINY, rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  leaves, treedef = jax.tree.flatten(state)
  rng = np.random.default_rng(1)
  leaves = [np.asarray(l) + 0.05 * rng.standard_normal(l.shape).astype(np.float32) for l in leaves]
  return nnx.merge(graphdef, jax.tree.unflatten(treedef, [jax.numpy.asarray(l) for l in leaves]))


def wait_for_first_log(workdir, timeout: float = 300) -> None:
  """Wait until a train.py run in `workdir` (a folder or gs:// URL) has written its first
  metrics line."""
  import time

  from cdeit_jax.common import fileio

  metrics = fileio.join(workdir, "metrics.jsonl")
  pause = 0.25 if fileio.is_remote(metrics) else 0.05  # the emulator serves one request at a time
  deadline = time.time() + timeout
  while time.time() < deadline and not (fileio.read_text(metrics) or "").strip():
    time.sleep(pause)


def sigterm_after_first_log(p, workdir, timeout: float = 300) -> int:
  """SIGTERM the train.py process `p` once its first metrics line is written; returns the
  latest checkpointed step after it exited cleanly."""
  import signal

  from cdeit_jax.checkpoints import train_checkpoint

  wait_for_first_log(workdir, timeout)
  p.send_signal(signal.SIGTERM)
  _, err = p.communicate(timeout=timeout)
  assert p.returncode == 0, err[-3000:]
  mngr = train_checkpoint.train_manager(str(workdir))
  stopped = mngr.latest_step()
  mngr.close()
  return stopped


# ----------------------------------------------------------------------------- train.py runs

REPO = pathlib.Path(__file__).parent.parent
TEST_CONFIG = str(REPO / "configs" / "test.py")
RESUME_STEPS = ["--config.steps=24", "--config.log_every=2", "--config.eval_every=8"]


def free_port() -> int:
  import socket

  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def run_train(workdir, *overrides, env=None, wait=True):
  """train.py with the test config in `workdir`: (returncode, stdout, stderr), or the running
  process (`wait=False`)."""
  import subprocess
  import sys

  cmd = [
    sys.executable,
    str(REPO / "train.py"),
    "--config",
    TEST_CONFIG,
    "--workdir",
    str(workdir),
    *overrides,
  ]
  p = subprocess.Popen(
    cmd,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    env=env or os.environ.copy(),
    cwd=REPO,
  )
  if wait:
    out, err = p.communicate(timeout=300)
    return p.returncode, out, err
  return p


def two_processes(script: str, *args: str, devices: int = 4) -> list:
  """`python script args` as 2 local processes x `devices` CPU devices (jax.distributed on
  127.0.0.1, the --coordinator_address/--num_processes/--process_id flags of train.py and
  eval.py)."""
  import subprocess
  import sys

  port = free_port()
  env = dict(
    os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu"
  )
  return [
    subprocess.Popen(
      [
        sys.executable,
        str(REPO / script),
        *args,
        f"--coordinator_address=127.0.0.1:{port}",
        "--num_processes=2",
        f"--process_id={i}",
      ],
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      env=env,
      cwd=REPO,
    )
    for i in range(2)
  ]


def finish(procs, timeout: float = 300) -> list[str]:
  """Wait for every process; assert each succeeded; their stderr texts."""
  errs = []
  for p in procs:
    _, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, err[-3000:]
    errs.append(err)
  return errs


@pytest.fixture(scope="session")
def straight_run(tmp_path_factory):
  """A 24-step run of train.py with the test config, uninterrupted."""
  wd = tmp_path_factory.mktemp("straight")
  rc, _, err = run_train(wd, *RESUME_STEPS)
  assert rc == 0, err[-3000:]
  return wd


@pytest.fixture(scope="session")
def fine_tuned_run(straight_run, tmp_path_factory):
  """One step from the uninterrupted run's EMA weights (config.init_from) at a learning rate of
  1e-30: the weights it started from, kept to 1e-20. (workdir, its train.py output)"""
  wd = tmp_path_factory.mktemp("fine_tuned")
  rc, out, err = run_train(
    wd, "--config.steps=1", "--config.optimizer.lr=1e-30", f"--config.init_from={straight_run}"
  )
  assert rc == 0, err[-3000:]
  return wd, out + err


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
  """The test config's model with random non-zero weights (a fresh model predicts exactly 0),
  saved as an inference checkpoint (step 7) with the authors' statistics."""
  import jax
  from flax import nnx

  from cdeit_jax import config_lib
  from cdeit_jax.checkpoints import checkpoint
  from cdeit_jax.data import stats
  from cdeit_jax.model.network import CDEIT

  wd = tmp_path_factory.mktemp("tiny_run")
  cfg = config_lib.load(str(REPO / "configs" / "test.py"))
  from cdeit_jax.checkpoints import loading

  model = CDEIT(**config_lib.model_kwargs(cfg, loading.resolve(cfg)), rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  rng = np.random.default_rng(3)
  state = jax.tree.map(lambda a: a + 0.05 * rng.standard_normal(a.shape).astype(np.float32), state)
  mean, std = stats.authors_stats()
  checkpoint.save_inference(str(wd), nnx.merge(graphdef, state), cfg, mean=mean, std=std, step=7)
  return str(wd)


def final_state(workdir, cfg, devices=None):
  """(step, state leaves, data iterator position) of the latest checkpoint of `workdir` (a
  folder or gs:// URL), restored onto `devices`."""
  import jax

  from cdeit_jax.checkpoints import train_checkpoint
  from cdeit_jax.common import fileio
  from cdeit_jax.common import sharding as shd
  from cdeit_jax.data import pipeline, sources
  from cdeit_jax.eit.layout import preset
  from cdeit_jax.train import training

  mesh = shd.make_mesh(devices)
  from cdeit_jax.checkpoints import loading

  state = training.setup(cfg, loading.resolve(cfg), mesh).state
  abstract = jax.eval_shape(lambda: state)
  sh = shd.state_shardings(abstract, mesh)
  src = sources.NpzSource(fileio.join(cfg.data.path, cfg.data.train_split), "uef2017", "authors")
  it = iter(pipeline.train_dataset(src, cfg.batch_size, cfg.data, preset("cdeit16")))
  mngr = train_checkpoint.train_manager(str(workdir))
  step = mngr.latest_step()
  state, meta = train_checkpoint.restore_train(mngr, step, jax.device_put(state, sh), sh, it)
  mngr.close()
  leaves = [np.asarray(x) for x in jax.tree.leaves((state.params, state.ema, state.opt_state))]
  return step, leaves, next(it)["index"].tolist()


# ----------------------------------------------------------------------------- a GCS server

GCS_BUCKET = "cdeit-test"


@pytest.fixture(scope="session")
def gcs(tmp_path_factory):
  """gs://cdeit-test on a real GCS JSON API server started here on 127.0.0.1
  (tests/gcs_server.py: the gcp-storage-emulator package, in memory), with every client pointed
  at it by its emulator settings, here and in the subprocesses: gcsfs (etils.epath) and
  google-cloud-storage (tensorboardX) by STORAGE_EMULATOR_HOST, TensorStore (orbax's arrays) by
  TENSORSTORE_GCS_HTTP_URL with a test token."""
  import subprocess
  import sys
  import time
  import urllib.request

  pytest.importorskip("gcp_storage_emulator")
  port = free_port()
  logfile = open(tmp_path_factory.mktemp("gcs") / "server.log", "w")
  server = subprocess.Popen(
    [sys.executable, str(REPO / "tests" / "gcs_server.py"), str(port), GCS_BUCKET],
    stdout=logfile,
    stderr=subprocess.STDOUT,
  )
  url = f"http://127.0.0.1:{port}"
  deadline = time.time() + 60
  while True:
    try:
      urllib.request.urlopen(f"{url}/storage/v1/b/{GCS_BUCKET}", timeout=1).read()
      break
    except OSError:
      assert server.poll() is None and time.time() < deadline, "the GCS server did not start"
      time.sleep(0.1)
  settings = {
    "STORAGE_EMULATOR_HOST": url,
    "TENSORSTORE_GCS_HTTP_URL": url,
    "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
    "GOOGLE_CLOUD_PROJECT": "cdeit-test",
    # gcsfs asks the Storage Control API (which the emulator lacks) for the layout
    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
  }
  saved = {k: os.environ.get(k) for k in settings}
  os.environ.update(settings)
  pytest.importorskip("gcsfs")  # after the settings: gcsfs reads its feature switch on import
  yield f"gs://{GCS_BUCKET}"
  for k, v in saved.items():
    if v is None:
      os.environ.pop(k, None)
    else:
      os.environ[k] = v
  server.terminate()
  server.wait(timeout=30)
  logfile.close()


# ----------------------------------------------------------------------------- another device

SKIP2 = dict(injection="skip-2", measure_injecting=True, clockwise=False)
DEVICE_MODEL = dict(hidden_size=32, num_scales=1, cond_grid=16)  # tiny, for another device


def device_file(path, layout) -> None:
  """A device's reference file in KTC's keys (currents and measurement pattern, no values) of
  a layout that measures the same pairs under every pattern."""
  import scipy.io

  pairs = layout.rows[layout.rows[:, 0] == 0][:, 1:]
  mpat = np.zeros((layout.num_electrodes, len(pairs)))
  mpat[pairs[:, 0], np.arange(len(pairs))] = 1
  mpat[pairs[:, 1], np.arange(len(pairs))] = -1
  scipy.io.savemat(path, {"Injref": 2e-3 * layout.currents, "Mpat": mpat})


def device_volts(layout, xs, gain: float = 500.0, contact_impedance: float = 0.05):
  """(the empty tank's frame, the frame of label image `xs`) of a device of `layout`, in its
  own volts (`gain` times the simulator's)."""
  import jax.numpy as jnp

  from cdeit_jax.eit import simulator

  sim = simulator.Simulator(layout=layout.with_contact_impedance(contact_impedance))
  volts = lambda sigma: gain * np.asarray(sim.cem.voltages(sigma), np.float64)
  return volts(jnp.ones(sim.mesh.num_elements)), volts(sim.image_conductivity(jnp.asarray(xs)))


def disc(cx: float = 0.35, cy: float = 0.3, r: float = 0.25, value: float = 1.0) -> np.ndarray:
  """A label image (128, 128) of one disc (rows grow with +y, the simulator's grid)."""
  yy, xx = (np.mgrid[:128, :128] - 63.5) / 64
  return np.where((xx - cx) ** 2 + (yy - cy) ** 2 < r**2, value, 0.0).astype(np.float32)


def challenge_folder(folder, layout, removed: list[int]) -> None:
  """KTC2023-style files (ref.mat, data1.mat, true1.mat) of the device: a conductive disc, the
  values of `removed` electrodes NaN."""
  import scipy.io

  from cdeit_jax.infer import ktc_score

  xs = disc()
  ref, target = device_volts(layout, xs)
  target = np.where(layout.without(removed), np.nan, target)
  pairs = layout.rows[layout.rows[:, 0] == 0][:, 1:]
  mpat = np.zeros((16, len(pairs)))
  mpat[pairs[:, 0], np.arange(len(pairs))], mpat[pairs[:, 1], np.arange(len(pairs))] = 1, -1
  inj = 2e-3 * layout.currents
  folder.mkdir(parents=True)
  scipy.io.savemat(folder / "ref.mat", {"Injref": inj, "Mpat": mpat, "Uelref": ref[:, None]})
  scipy.io.savemat(folder / "data1.mat", {"Inj": inj, "Mpat": mpat, "Uel": target[:, None]})
  truth = ktc_score.to_challenge_grid(np.where(xs > 0, 2, 0).astype(np.uint8))
  scipy.io.savemat(folder / "true1.mat", {"truth": truth})


@pytest.fixture(scope="session")
def device_run(tmp_path_factory):
  """A tiny CDEIT for a 16-electrode skip-2 device (counter-clockwise, measuring on its
  current-carrying electrodes; KTC's keys) trained one step with electrode 3 removed or not
  (removals '-;3'), in one process: its device file, simulated data (16 train, 8 test), the
  config, the first step's metrics and model, and the saved run (its weights made random and
  non-zero, as `tiny_run`'s)."""
  import types

  import jax
  import jax.numpy as jnp

  from cdeit_jax import config_lib, simulate
  from cdeit_jax.checkpoints import checkpoint
  from cdeit_jax.common import sharding as shd
  from cdeit_jax.data import sources
  from cdeit_jax.eit import layout as lay
  from cdeit_jax.train import training

  root = tmp_path_factory.mktemp("device_run")
  layout = lay.from_rules(16, **SKIP2)
  device = root / "device.mat"
  device_file(device, layout)
  cfg = config_lib.load(str(REPO / "configs" / "ktc2023.py"))
  cfg.simulator.update(layout=str(device), removals="-;3", contact_impedance=0.05)
  cfg.model.update(DEVICE_MODEL)
  cfg.batch_size = 8
  data = root / "data"
  simulate.generate(str(data), {"train": 16, "test": 8}, cfg.simulator, 8, ("test",), False)
  train = sources.NpzSource(str(data / "train"), num_values=256, vector_cond=True)
  from cdeit_jax.checkpoints import loading

  ts = training.setup(cfg, loading.resolve(cfg), shd.make_mesh(), calibration_source=train)
  batch = {
    "cond": jnp.asarray(np.stack([train[i]["cond"] for i in range(8)])),
    "target": jnp.asarray(np.stack([train[i]["target"] for i in range(8)])),
  }
  state, metrics = jax.jit(ts.step_fn)(ts.state, batch, jax.random.key(0), ts.constants)
  model = training.nnx.merge(ts.graphdef, state.params, ts.constants)
  # saved with random non-zero weights: one step leaves the zero-initialised output layer near 0
  rng = np.random.default_rng(5)
  noisy = jax.tree.map(
    lambda a: a + 0.05 * rng.standard_normal(a.shape).astype(np.float32), state.params
  )
  run = root / "run"
  saved = training.nnx.merge(ts.graphdef, noisy, ts.constants)
  checkpoint.save_inference(str(run), saved, cfg, mean=train.mean, std=train.std)
  return types.SimpleNamespace(
    root=root,
    layout=layout,
    device=device,
    cfg=cfg,
    data=data,
    train=train,
    state=state,
    metrics=metrics,
    model=model,
    run=str(run),
  )


def wandb_offline_runs(root) -> list[dict]:
  """The offline W&B runs under `root`/wandb, each read from its run-ID.wandb file: {"dir", "id",
  "project", "config", "history" (one dict a record), "summary" (the updates applied in order)}.

  Read here from the file's own format (wandb 0.31 ships no Python reader: a ':W&B' header of 7
  bytes, then LevelDB log records in 32 KiB blocks, each a 7-byte header (crc32, length, type
  1 full / 2 first / 3 middle / 4 last) and a wandb_internal_pb2.Record)."""
  import json
  import struct

  from wandb.proto import wandb_internal_pb2 as pb

  def records(data: bytes):
    assert data[:4] == b":W&B"
    pos, buf = 7, b""
    while pos + 7 <= len(data):
      left = 32768 - pos % 32768
      crc, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
      if left < 7 or (n == 0 and kind == 0):
        pos += left
        continue
      buf += data[pos + 7 : pos + 7 + n]
      pos += 7 + n
      if kind in (1, 4):
        r = pb.Record()
        r.ParseFromString(buf)
        yield r
        buf = b""

  key = lambda item: item.key or "/".join(item.nested_key)
  runs = []
  for folder in sorted(pathlib.Path(root, "wandb").glob("offline-run-*")):
    (path,) = folder.glob("run-*.wandb")
    run = {"dir": folder, "config": {}, "history": [], "summary": {}}
    for r in records(path.read_bytes()):
      kind = r.WhichOneof("record_type")
      if kind == "run":
        run.update(id=r.run.run_id, project=r.run.project)
        run["config"].update({key(i): json.loads(i.value_json) for i in r.run.config.update})
      elif kind == "config":
        run["config"].update({key(i): json.loads(i.value_json) for i in r.config.update})
      elif kind == "history":
        run["history"].append({key(i): json.loads(i.value_json) for i in r.history.item})
      elif kind == "summary":
        run["summary"].update({key(i): json.loads(i.value_json) for i in r.summary.update})
    runs.append(run)
  return runs


def device_arrays(layout):
  """The currents and one Mpat column per measured pair of a layout that measures the same
  pairs under every pattern."""
  pairs = layout.rows[layout.rows[:, 0] == 0][:, 1:]
  mpat = np.zeros((layout.num_electrodes, len(pairs)))
  mpat[pairs[:, 0], np.arange(len(pairs))] = 1
  mpat[pairs[:, 1], np.arange(len(pairs))] = -1
  return 2e-3 * layout.currents, mpat


def rel_l2(a, b) -> float:
  """||a - b|| / ||b||."""
  return float(np.linalg.norm(np.ravel(a) - np.ravel(b)) / np.linalg.norm(np.ravel(b)))


def disc_params(cx: float, cy: float, r: float, sigma: float) -> np.ndarray:
  """One phantom's parameters (MAX_INCLUSIONS, ROW): a disc of conductivity `sigma` (times the
  background's) at (cx, cy), radius r."""
  from cdeit_jax.eit import phantom as ph

  p = np.zeros((ph.MAX_INCLUSIONS, ph.ROW))
  p[0] = [1, 0, cx, cy, r, 0, 0, np.log10(sigma), 0]
  return p


@pytest.fixture(scope="module")
def sim64():
  """CDEIT's simulator in float64."""
  import jax

  from cdeit_jax import eit
  from cdeit_jax.eit.layout import preset

  with jax.enable_x64(True):
    yield eit.Simulator(preset("cdeit16"), dtype="float64")
