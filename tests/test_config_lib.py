"""config_lib: a stored config's renamed key (`RENAMED_KEYS`: models/cdeit16 records `data.preset`)
reads under its new name; given by a user, an old key or flag is unknown, in one line."""

import json
import subprocess
import sys

import pytest

from cdeit_jax import config_lib
from cdeit_jax.common.errors import InputError

REPO = __import__("pathlib").Path(__file__).parent.parent


def test_a_stored_config_with_an_old_key_reads_as_the_new_one():
  """The shipped models/cdeit16 was written before data.preset became data.units: its stored
  config keeps its units."""
  shipped = json.loads((REPO / "models" / "cdeit16" / "manifest.json").read_text())["config"]
  assert "preset" in shipped["data"] and "units" not in shipped["data"]
  assert config_lib.from_json(shipped).data.units == shipped["data"]["preset"]
  stored = config_lib.default_config().to_dict()
  stored["data"] = {k: v for k, v in stored["data"].items() if k != "units"}
  stored["data"]["preset"] = "uef2017"
  cfg = config_lib.from_json(stored)
  assert cfg.data.units == "uef2017" and "preset" not in cfg.data
  assert config_lib.from_json(config_lib.default_config().to_dict()).data.units == "simulated"


def test_an_old_key_given_is_an_unknown_one():
  cfg = config_lib.default_config()
  with pytest.raises(InputError, match=r"^--config.data.preset='uef2017': no such key; config"):
    config_lib.override(cfg, {"data.preset": "uef2017"})


@pytest.mark.parametrize(
  "argv, line",
  [
    (
      ["-m", "cdeit_jax.reconstruct", "--workdir=x", "--frames=y", "--out=z", "--preset=uef2017"],
      "error: Unknown command line flag 'preset'",
    ),
    (
      ["train.py", "--config=configs/test.py", "--workdir=x", "--config.data.preset=uef2017"],
      "error: --config.data.preset: no such config key:",
    ),
  ],
)
def test_an_unknown_flag_is_one_line(argv, line):
  r = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=180, cwd=REPO)
  assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
  assert any(s.startswith(line) for s in r.stderr.splitlines()), r.stderr
