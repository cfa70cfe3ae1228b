"""Test setup: 8 fake CPU devices (set before jax is imported) and shared fixtures."""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as the commands run (cdeit_jax/cpu_tuning.py)
# One persistent compilation cache for the session, inherited by the train.py subprocesses
# (the same train step then compiles once: 14 s -> 3 s on 2 CPU cores).
import tempfile  # noqa: E402

os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", tempfile.mkdtemp(prefix="cdeit_jax_cache_"))

import pathlib  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

FIXTURES = pathlib.Path(__file__).parent / "fixtures"


def nhwc(a: np.ndarray) -> np.ndarray:
  """NCHW (reference) -> NHWC (ours), on the last three axes."""
  return np.moveaxis(np.asarray(a), -3, -1)


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
  from cdeit_jax.model import CDEIT
  model = CDEIT(hidden_size=64, attention_query_chunk=1024, rngs=nnx.Rngs(0))
  return load_torch_state_dict(model, small_state_dict)


TINY = dict(image_size=32, patch_size=2, hidden_size=32, num_heads=4, num_scales=2)
"""A tiny geometry (token grid 16, window 4, scales 16 -> 8 -> 4) for tests of behaviour: the
published geometry spends ~8 s per CPU forward in global attention over 4096 tokens."""


@pytest.fixture(scope="session")
def tiny_model():
  """A tiny CDEIT with random (non-zero) weights everywhere, so every path matters."""
  import jax
  from flax import nnx

  from cdeit_jax.model import CDEIT
  model = CDEIT(**TINY, rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  leaves, treedef = jax.tree.flatten(state)
  rng = np.random.default_rng(1)
  leaves = [np.asarray(l) + 0.05 * rng.standard_normal(l.shape).astype(np.float32) for l in leaves]
  return nnx.merge(graphdef, jax.tree.unflatten(treedef, [jax.numpy.asarray(l) for l in leaves]))


def wait_for_first_log(workdir: pathlib.Path, timeout: float = 300) -> None:
  """Wait until a train.py run in `workdir` has written its first metrics line."""
  import time
  metrics = workdir / "metrics.jsonl"
  deadline = time.time() + timeout
  while time.time() < deadline and not (metrics.exists() and metrics.read_text().strip()):
    time.sleep(0.05)


def sigterm_after_first_log(p, workdir: pathlib.Path, timeout: float = 300) -> int:
  """SIGTERM the train.py process `p` once its first metrics line is written; returns the
  latest checkpointed step after it exited cleanly."""
  import signal

  from cdeit_jax import checkpoint
  wait_for_first_log(workdir, timeout)
  p.send_signal(signal.SIGTERM)
  _, err = p.communicate(timeout=timeout)
  assert p.returncode == 0, err[-3000:]
  mngr = checkpoint.train_manager(str(workdir))
  stopped = mngr.latest_step()
  mngr.close()
  return stopped
