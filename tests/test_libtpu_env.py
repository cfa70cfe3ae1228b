"""cdeit_jax/common/libtpu_env.py: libtpu on a machine without a TPU says nothing alarming."""

import importlib.util
import os
import subprocess
import sys

import pytest
from conftest import REPO

from cdeit_jax.common import libtpu_env


def test_the_variables_are_set_only_without_a_tpu_and_never_over_the_users(monkeypatch):
  monkeypatch.setattr(libtpu_env, "libtpu_installed", lambda: True)
  monkeypatch.setattr(libtpu_env, "tpu_chips_present", lambda: False)
  env = libtpu_env.quiet_environment({"PATH": "/bin"})
  assert env == {"PATH": "/bin", **libtpu_env.QUIET}
  mine = {"TPU_WORKER_HOSTNAMES": "10.0.0.2,10.0.0.3"}  # a user's (or a pod's) own setting
  assert libtpu_env.quiet_environment(mine) == mine
  assert libtpu_env.quiet_environment({"CDEIT_LIBTPU_ENV": "0"}) == {"CDEIT_LIBTPU_ENV": "0"}
  monkeypatch.setattr(libtpu_env, "tpu_chips_present", lambda: True)  # a TPU VM
  assert libtpu_env.quiet_environment({}) == {}
  monkeypatch.setattr(libtpu_env, "tpu_chips_present", lambda: False)
  monkeypatch.setattr(libtpu_env, "libtpu_installed", lambda: False)  # no [tpu] extra
  assert libtpu_env.quiet_environment({}) == {}


LIBTPU_BLOCK = ("unexpected worker hostname", "Failed to find host bounds", "Unable to initialize")


@pytest.mark.skipif(
  importlib.util.find_spec("libtpu") is None or libtpu_env.tpu_chips_present(),
  reason="needs libtpu (pip install -e '.[tpu]') on a machine without a TPU",
)
def test_a_command_starting_jax_beside_libtpu_prints_no_libtpu_block():
  """A command's start (cpu_tuning.apply, then JAX's backends) on this machine, with libtpu
  installed and no TPU: nothing of libtpu's start-up block; without the settings (turned off)
  the block is there, as a user saw it."""
  code = (
    "from cdeit_jax.common import cpu_tuning; cpu_tuning.apply(); import logging, jax; "
    "logging.basicConfig(level=logging.INFO); print(jax.devices()[0].platform)"
  )
  base = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS" and not k.startswith("TPU_")}
  runs = {}
  for switch in ("1", "0"):
    env = dict(base, CDEIT_LIBTPU_ENV=switch, CDEIT_CPU_TUNING="0")
    # another JAX process of this machine may hold libtpu's lock file, which would stop libtpu
    # before its block in the run without the settings
    env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    p = subprocess.run(
      [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0 and p.stdout.strip() == "cpu", p.stderr[-2000:]
    runs[switch] = p.stderr
  assert not any(text in runs["1"] for text in LIBTPU_BLOCK), runs["1"][-2000:]
  assert all(text in runs["0"] for text in LIBTPU_BLOCK), runs["0"][-2000:]


def test_a_cpu_or_gpu_install_drops_jaxs_missing_tpu_line_too(monkeypatch):
  """Without libtpu (a CPU or GPU install) and without a TPU, JAX's `Unable to initialize
  backend 'tpu'` line is dropped as well; with a TPU chip present it is kept."""
  import logging

  from cdeit_jax.common import libtpu_env

  logger = logging.getLogger("jax._src.xla_bridge")
  record = logger.makeRecord(
    logger.name, logging.INFO, "x", 1, "Unable to initialize backend 'tpu': no libtpu", (), None
  )
  monkeypatch.setattr(libtpu_env, "libtpu_installed", lambda: False)
  for chips, shown in ((True, True), (False, False)):
    monkeypatch.setattr(logger, "filters", [])
    monkeypatch.setattr(libtpu_env, "tpu_chips_present", lambda c=chips: c)
    monkeypatch.setenv("CDEIT_LIBTPU_ENV", "1")
    libtpu_env.apply()
    assert logger.filter(record) == shown, chips
