"""A model in one file (`checkpoints/model_file.py`): `python -m cdeit_jax.export` writes it and
`python -m cdeit_jax.convert` turns it back into a workdir. The truth is the model folder it came
from (models/ktc2023: a device of 32 electrodes and the condition's calibration, a fine-tuning's
training record; models/cdeit16: an uncertainty scale): the same weights bit for bit, the same
metadata; a changed, cut or foreign file is one line."""

import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO
from flax import nnx

from cdeit_jax import convert, export, ship
from cdeit_jax.checkpoints import checkpoint, loading, model_file, shipped
from cdeit_jax.common.errors import MissingFile
from cdeit_jax.infer import run_opening

MODELS = REPO / "models"


@pytest.fixture(scope="module", params=["ktc2023", "cdeit16"])
def exported(request, tmp_path_factory):
  """(a model folder, exported as one file, the export's figures, that file imported again)."""
  d = tmp_path_factory.mktemp("model_file")
  model = MODELS / request.param
  got = export.export(str(model), str(d / f"{request.param}.safetensors"))
  convert.import_model_file(got["path"], str(d / "imported"))
  return model, pathlib.Path(got["path"]), got, d / "imported"


def _params(path):
  model, meta = loading.load(str(path))
  flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
  return [(path, np.asarray(v.get_value())) for path, v in flat], meta


@pytest.mark.e2e  # exports and imports whole models (about a minute)
def test_a_model_folder_round_trips_through_one_file(exported):
  model, path, got, imported = exported
  manifest = shipped.read(str(model))
  assert got["step"] == manifest["step"] and got["bytes"] == path.stat().st_size < 16 * 2**20
  (want, meta0), (back, meta1) = _params(model), _params(imported)
  assert len(want) == len(back) == len(model_file.read(str(path))[0])
  for (p0, a), (p1, b) in zip(want, back):
    assert p0 == p1 and a.dtype == b.dtype and np.array_equal(a, b), p0
  assert got["params"] == sum(a.size for _, a in want)
  for key in ("step", "stats", "calibration", "device"):
    assert meta1[key] == meta0[key], key
  # config and model as this version reads them (keys added since the folder was shipped: their
  # defaults)
  assert loading.model_config(meta1).to_json() == loading.model_config(meta0).to_json()
  assert meta1["weights"] == ["ema"] and meta1["source"].startswith(f"model file {path}")
  # what the model folder says of its training travels with it (machine, time, what it came of)
  assert meta1["training"] == {k: v for k, v in manifest["training"].items() if k != "shipped"}
  scale = f"checkpoints/{manifest['step']}/{run_opening.UNCERTAINTY_FILE}"
  kept = [(folder / scale).read_text() for folder in (model, imported) if (folder / scale).exists()]
  assert len(kept) in (0, 2) and len(set(kept)) <= 1
  assert run_opening.uncertainty_scale(str(imported / scale)) == (
    run_opening.uncertainty_scale(str(model / scale))
  )


@pytest.mark.e2e  # exports and imports whole models (about a minute)
def test_an_imported_model_ships_with_the_training_it_carries(exported, tmp_path):
  model, _, _, imported = exported
  out = tmp_path / "models" / "again"
  m = ship.ship(str(imported), str(out), "imported", [], None)
  before = shipped.read(str(model))["training"]
  assert {k: v for k, v in m["training"].items() if k != "shipped"} == {
    k: v for k, v in before.items() if k != "shipped"
  }


def _flip(data: bytes, at: int) -> bytes:
  return data[:at] + bytes([data[at] ^ 1]) + data[at + 1 :]


def test_a_changed_cut_or_foreign_file_is_one_line(tmp_path):
  from safetensors.numpy import save_file

  arrays = {"a/kernel": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(5, np.float32)}
  record = {"meta": {"step": 7, "config": {}}, "training": {"seconds": 1.5}}
  good = tmp_path / "good.safetensors"
  sha = model_file.write(str(good), arrays, record)
  got, rec, sha2 = model_file.read(str(good))
  assert sha2 == sha == model_file.digest(json.dumps(record, sort_keys=True), arrays)
  assert rec == record and all(np.array_equal(got[k], arrays[k]) for k in arrays)
  assert model_file.is_model_file(str(good))
  data = good.read_bytes()
  header = int.from_bytes(data[:8], "little")
  digit = data.index(b'"seconds\\": 1.5') + len(b'"seconds\\": 1')  # inside the record's text
  cases = {
    "tensor byte": (_flip(data, len(data) - 3), "not the ones written"),
    "record byte": (data[:digit] + b"7" + data[digit + 1 :], "not the ones written"),
    "cut": (data[: 8 + header + 10], "truncated"),
    "header cut": (data[: 8 + header // 2], "truncated"),
    "bytes added": (data + b"\0\0", "longer than written"),
    "empty": (b"", "not a cdeit-jax model file"),
  }
  for name, (content, message) in cases.items():
    bad = tmp_path / f"{name}.safetensors"
    bad.write_bytes(content)
    with pytest.raises(model_file.ModelFileError, match=message) as e:
      model_file.read(str(bad))
    assert "\n" not in str(e.value) and str(bad) in str(e.value), name
  foreign = tmp_path / "foreign.safetensors"
  save_file(arrays, str(foreign), metadata={"format": "pt"})
  with pytest.raises(model_file.ModelFileError, match="not a cdeit-jax model file"):
    model_file.read(str(foreign))
  assert not model_file.is_model_file(str(foreign))
  with pytest.raises(MissingFile):
    model_file.read(str(tmp_path / "nothing.safetensors"))


@pytest.mark.e2e  # exports and imports whole models (about a minute)
def test_convert_refuses_an_altered_file_and_a_config_in_one_line(exported, tmp_path):
  _, path, _, _ = exported
  altered = tmp_path / "altered.safetensors"
  shutil.copy(path, altered)
  data = altered.read_bytes()
  altered.write_bytes(_flip(data, len(data) // 2))

  def convert_cli(*args):
    p = subprocess.run(
      [sys.executable, "-m", "cdeit_jax.convert", *args], cwd=REPO, capture_output=True, text=True
    )
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    return p.returncode, lines, p.stderr

  rc, lines, err = convert_cli("--checkpoint", str(altered), "--workdir", str(tmp_path / "w1"))
  assert rc != 0 and len(lines) == 1 and "SHA-256" in lines[0] and "Traceback" not in err
  assert not (tmp_path / "w1" / checkpoint.CHECKPOINTS).exists()
  rc, lines, _ = convert_cli(
    "--checkpoint", str(path), "--workdir", str(tmp_path / "w2"), "--config", "configs/test.py"
  )
  assert rc != 0 and len(lines) == 1 and "carries its config" in lines[0]
