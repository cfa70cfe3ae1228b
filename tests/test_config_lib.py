"""config_lib: renamed keys (`RENAMED_KEYS`) read from stored configs under their new names and
refused, in one line naming the new name, wherever a user gives them; and the renamed flags."""

import subprocess
import sys

import pytest

from cdeit_jax import config_lib
from cdeit_jax.common.errors import InputError

REPO = __import__("pathlib").Path(__file__).parent.parent


def test_a_stored_config_with_an_old_key_reads_as_the_new_one():
  """A checkpoint written before data.preset became data.units keeps its units."""
  stored = config_lib.default_config().to_dict()
  stored["data"] = {k: v for k, v in stored["data"].items() if k != "units"}
  stored["data"]["preset"] = "uef2017"
  cfg = config_lib.from_json(stored)
  assert cfg.data.units == "uef2017" and "preset" not in cfg.data
  assert config_lib.from_json(config_lib.default_config().to_dict()).data.units == "simulated"


def test_an_old_key_given_is_refused_naming_the_new_one():
  cfg = config_lib.default_config()
  with pytest.raises(InputError, match=r"^--config.data.preset is --config.data.units now$"):
    config_lib.override(cfg, {"data.preset": "uef2017"})
  cfg.data.preset = "uef2017"  # as a config file of the old spelling sets it
  with pytest.raises(InputError, match=r"config.data.preset.*is config.data.units now"):
    config_lib.check_training_config(cfg, 1, need_data=False)


@pytest.mark.parametrize(
  "argv, line",
  [
    (
      ["-m", "cdeit_jax.reconstruct", "--workdir=x", "--frames=y", "--out=z", "--preset=uef2017"],
      "error: --preset is --units now (the data's units: one word across commands)",
    ),
    (
      ["train.py", "--config=configs/test.py", "--workdir=x", "--config.data.preset=uef2017"],
      "error: --config.data.preset is --config.data.units now",
    ),
  ],
)
def test_a_renamed_flag_is_one_line(argv, line):
  r = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=180, cwd=REPO)
  assert r.returncode == 2, r.stderr
  assert r.stderr.strip().splitlines()[-1] == line, r.stderr
