"""config_lib: a stored config reads back as it was stored (the shipped models' too); given by a
user, a key or flag this version does not have is unknown, in one line."""

import json
import subprocess
import sys

import pytest

from cdeit_jax import config_lib
from cdeit_jax.common.errors import InputError

REPO = __import__("pathlib").Path(__file__).parent.parent


def test_a_stored_config_reads_back_as_it_was_stored():
  """Each shipped model's stored config reads back with its own values (the units its data were
  in among them); a key this version does not have is left out, one it added keeps its
  default."""
  for name in ("cdeit16", "ktc2023"):
    shipped = json.loads((REPO / "models" / name / "manifest.json").read_text())["config"]
    cfg = config_lib.from_json(shipped)
    assert cfg.data.units == shipped["data"]["units"]
    for key in ("cond", "hidden_size", "patch_size", "num_scales"):
      assert cfg.model[key] == shipped["model"][key], key
  stored = config_lib.default_config().to_dict()
  stored["data"] = {**stored["data"], "units": "uef2017", "preset": "ktc2023"}
  del stored["data"]["stats"]
  cfg = config_lib.from_json(stored)
  assert cfg.data.units == "uef2017" and "preset" not in cfg.data and cfg.data.stats is None


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
      "error: --config.data.preset: no such config key (data has no preset;",
    ),
  ],
)
def test_an_unknown_flag_is_one_line(argv, line):
  r = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=180, cwd=REPO)
  assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
  assert any(s.startswith(line) for s in r.stderr.splitlines()), r.stderr
