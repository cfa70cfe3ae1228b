"""A model in one file (`checkpoints/model_file.py`): `python -m cdeit_jax.export` writes it and
`python -m cdeit_jax.convert` turns it back into a workdir. The truth is the model folder it came
from (models/ktc2023: a device of 32 electrodes and the condition's calibration, a fine-tuning's
training record; models/cdeit16: an uncertainty scale): the same weights bit for bit, the same
metadata; a changed, cut or foreign file is one line."""

import json
import os
import pathlib
import re
import shutil
import stat
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO
from flax import nnx

from cdeit_jax import convert
from cdeit_jax.checkpoints import checkpoint, loading, model_file, shipped
from cdeit_jax.common.errors import InputError, MissingFile
from cdeit_jax.infer import run_opening, shipping

MODELS = REPO / "models"


@pytest.fixture(scope="module", params=["ktc2023", "cdeit16"])
def exported(request, tmp_path_factory):
  """(a model folder, exported as one file, the export's figures, that file imported again)."""
  d = tmp_path_factory.mktemp("model_file")
  model = MODELS / request.param
  got = shipping.export(str(model), str(d / f"{request.param}.safetensors"))
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
  m = shipping.ship(str(imported), str(out), "imported", [], None)
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


def _header_file(path, header: dict, body: bytes = b"") -> None:
  text = json.dumps(header).encode()
  path.write_bytes(len(text).to_bytes(8, "little") + text + body)


def test_what_is_not_a_model_file_is_named(tmp_path):
  """A file of another format named .safetensors is said to be that format (not "truncated"),
  and header entries that are not tensors' descriptions are named, each in one line."""
  import gzip

  good = tmp_path / "good.safetensors"
  model_file.write(str(good), {"b": np.ones(5, np.float32)}, {"meta": {"step": 1}})
  gz, npy = tmp_path / "gz.safetensors", tmp_path / "npy.safetensors"
  gz.write_bytes(gzip.compress(good.read_bytes()))
  with open(npy, "wb") as fh:
    np.save(fh, np.ones(3))
  meta = {"format": model_file.FORMAT, "record": "{}", "sha256": ""}
  cases = {gz: "it is a gzip archive", npy: "it is a NumPy .npy array"}
  for name, entry, words in (
    ("int", 5, "entry 'a' is a int, not a tensor's description"),
    ("list", [1, 2], "entry 'a' is a list, not a tensor's description"),
    ("no_shape", {"dtype": "F32", "data_offsets": [0, 4]}, "entry 'a' has no dtype and shape"),
    ("offsets", {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}, "has no data_offsets"),
  ):
    p = tmp_path / f"{name}.safetensors"
    _header_file(p, {"__metadata__": meta, "a": entry}, b"\0" * 4)
    cases[p] = words
  for p, words in cases.items():
    with pytest.raises(model_file.ModelFileError, match=words) as e:
      model_file.read(str(p))
    assert "\n" not in str(e.value) and "copy the whole file again" not in str(e.value), p


@pytest.fixture(scope="module")
def tiny_file(tiny_run, tmp_path_factory):
  """configs/test.py's model (step 7) exported as a model file, with an uncertainty scale."""
  (pathlib.Path(tiny_run) / "checkpoints" / "7" / run_opening.UNCERTAINTY_FILE).write_text(
    json.dumps({"scale": 0.811})
  )
  path = tmp_path_factory.mktemp("tiny_file") / "tiny.safetensors"
  shipping.export(tiny_run, str(path))
  return path


def _forged(src, dst, edit):
  """`src` with its record or tensors edited and its digest recomputed (as anyone can, with
  `model_file.digest`): what only the importer's own checks can refuse."""
  arrays, record, _ = model_file.read(str(src))
  arrays = {k: np.array(v) for k, v in arrays.items()}
  edit(arrays, record)
  model_file.write(str(dst), arrays, record)
  return dst


def _sizes(key, value):
  def edit(arrays, record):
    record["meta"]["model"][key] = value
    record["meta"]["config"]["model"][key] = value

  return edit


def _first(arrays, change):
  k = sorted(arrays)[0]
  arrays[k] = change(arrays[k])


FORGERIES = {
  "uncertainty not a string": (
    lambda a, r: r.update(uncertainty={"scale": 0.811}),
    "its record's uncertainty is not a calibration export writes",
  ),
  "uncertainty's scale": (
    lambda a, r: r.update(uncertainty='{"scale": -1}'),
    "its record's uncertainty is not a calibration export writes .*got '\\{\"scale\": -1\\}'",
  ),
  "training not a mapping": (lambda a, r: r.update(training=[1]), "'training' is not a mapping"),
  "step": (lambda a, r: r["meta"].update(step="7"), "is not a checkpoint's \\(step '7'\\)"),
  "stats": (lambda a, r: r["meta"].update(stats={"mean": "x"}), "stats must hold the lists"),
  "hidden_size 2^24": (_sizes("hidden_size", 2**24), "make tables of 16 GiB, over the 1 GiB"),
  "negative hidden_size": (_sizes("hidden_size", -32), "hidden_size: -32 must be a whole number"),
  "num_heads 0": (_sizes("num_heads", 0), "num_heads: 0 must be a whole number >= 1"),
  "depth": (_sizes("num_scales", 10**6), "must be divisible by 2\\*\\*num_scales = 2\\*\\*1000000"),
  "mlp_ratio": (_sizes("mlp_ratio", float("inf")), "mlp_ratio: inf must be a number > 0"),
  "window_size 0": (_sizes("window_size", 0), "window_size: 0 must be a whole number >= 1"),
  "patch_size 0": (_sizes("patch_size", 0), "patch_size: 0 must be a whole number >= 1"),
  "NaN weights": (
    lambda a, r: _first(a, lambda x: np.where(np.arange(x.size).reshape(x.shape) == 0, np.nan, x)),
    "1 of its weight tensors hold NaN or infinite values",
  ),
  "int32 weights": (
    lambda a, r: _first(a, lambda x: x.astype(np.int32)),
    "1 of its weight tensors are not float32 \\(.* \\(int32\\)\\)",
  ),
  "float16 weights": (
    lambda a, r: _first(a, lambda x: x.astype(np.float16)),
    "are not float32 \\(.* \\(float16\\)\\)",
  ),
}


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_a_forged_model_file_is_refused_before_anything_is_made(
  tiny_file, tmp_path, monkeypatch, forgery
):
  """Each class of what an edited record (its digest recomputed) can say, refused in one line
  naming the file and the field, before anything is allocated for it (the sin-cos table of a
  forged hidden_size is never computed) or written (the workdir is never made)."""
  from cdeit_jax.model import network

  table = network.sincos_axis_table

  def bounded(dim, grid):
    assert dim * grid <= 2**20, f"sincos_axis_table({dim}, {grid}) allocated"
    return table(dim, grid)

  monkeypatch.setattr(network, "sincos_axis_table", bounded)
  edit, words = FORGERIES[forgery]
  bad = _forged(tiny_file, tmp_path / "forged.safetensors", edit)
  with pytest.raises(model_file.ModelFileError, match=words) as e:
    convert.import_model_file(str(bad), str(tmp_path / "w"))
  assert "\n" not in str(e.value) and str(bad) in str(e.value)
  assert not (tmp_path / "w").exists()


def test_a_workdir_holds_one_model_and_wrote_is_what_it_reads(tiny_file, tmp_path):
  """The model file imported whole (its step, weights and uncertainty scale, nothing staged
  left); then another model (a lower step: orbax would skip it without a word), the same file
  again, a translated run, a training run and a file as the workdir are refused in one line
  that says what to do, and the workdir is as it was: its readers take the one model."""
  w = tmp_path / "w"
  step_dir = convert.import_model_file(str(tiny_file), str(w))
  assert step_dir == str(w / "checkpoints" / "7") and os.listdir(w) == ["checkpoints"]
  assert run_opening.uncertainty_scale(f"{step_dir}/{run_opening.UNCERTAINTY_FILE}") == 0.811
  lower = _forged(tiny_file, tmp_path / "step4.safetensors", lambda a, r: r["meta"].update(step=4))
  before = sorted(str(p.relative_to(w)) for p in w.rglob("*"))
  for given in (lower, tiny_file):
    with pytest.raises(InputError, match="holds a model already \\(checkpoints/ has step 7, "):
      convert.import_model_file(str(given), str(w))
  assert sorted(str(p.relative_to(w)) for p in w.rglob("*")) == before
  assert checkpoint.resolve(str(w)) == (str(w), 7)
  translated, training = tmp_path / "translated", tmp_path / "training"
  translated.mkdir()
  (translated / "translation.npz").write_bytes(b"")
  training.mkdir()
  (training / "metrics.jsonl").write_text("")
  (tmp_path / "file").write_text("")
  for where, words in (
    (translated, "is a translated run's .*its model is .*/model.*give a new --workdir"),
    (training, "is a training run's \\(it holds metrics.jsonl\\): give a new --workdir"),
    (tmp_path / "file", "exists and is not a folder; give a new folder"),
  ):
    with pytest.raises(InputError, match=words):
      convert.import_model_file(str(lower), str(where))
  assert sorted(os.listdir(translated)) == ["translation.npz"]


def test_a_failed_import_leaves_nothing(tiny_file, tmp_path, monkeypatch):
  """A failure while the step is staged (a full disk) leaves no step and no stage: the step
  appears whole or not at all; a stage a killed import left is removed by the next import."""
  from cdeit_jax.common import fileio

  def fail(src, dst):
    raise OSError(28, "No space left on device")

  with monkeypatch.context() as m:
    m.setattr(fileio, "move", fail)
    with pytest.raises(OSError):
      convert.import_model_file(str(tiny_file), str(tmp_path / "w"))
  assert list((tmp_path / "w").iterdir()) == []
  dead = subprocess.run(
    [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True
  )
  killed = tmp_path / "w" / f"{checkpoint.STAGE}{int(dead.stdout)}-0123"  # a SIGKILLed import's
  (killed / "checkpoints" / "7").mkdir(parents=True)
  convert.import_model_file(str(tiny_file), str(tmp_path / "w"))
  assert os.listdir(tmp_path / "w") == ["checkpoints"]


def test_export_writes_a_model_file_and_nothing_else(tiny_run, tiny_file, tmp_path):
  """`export --out` refuses a FIFO, a character device, a socket and a folder (each left as it
  was), a file it did not write (a frames .npy), a missing folder and one it cannot write, in
  one line before any work; a model file is replaced by the new one."""
  from test_fileio import _specials, _state

  frames = tmp_path / "x3.npy"
  np.save(frames, np.zeros((3, 208)))
  targets = {
    p: re.escape(f"is {what}: cdeit-jax writes") for what, p in _specials(tmp_path).items()
  }
  targets[frames] = "is a file that cdeit-jax did not write as a model file"
  targets[tmp_path / "none" / "m.safetensors"] = "its folder .*none does not exist"
  targets[pathlib.Path("/proc/m.safetensors")] = "its folder /proc cannot be written"
  for p, words in targets.items():
    before = _state(p) if os.path.lexists(p) else None
    with pytest.raises(InputError, match=words) as e:
      shipping.export(tiny_run, str(p))
    assert "\n" not in str(e.value) and str(e.value).startswith(f"--out {p}")
    assert (_state(p) if os.path.lexists(p) else None) == before
  again = tmp_path / "again.safetensors"
  shutil.copy(tiny_file, again)
  got = shipping.export(tiny_run, str(again))
  assert model_file.read(str(again))[2] == got["sha256"]


def _cli(*args):
  p = subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True)
  lines = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
  return p.returncode, lines, p.stdout, p.stderr


@pytest.mark.e2e  # the commands in subprocesses, on both shipped models' files
def test_the_commands_write_what_they_say_or_one_line(exported, tmp_path):
  """From the command line: convert says "wrote" for the step its workdir's readers take; a
  lower step into it, and a calibration edited to NaN, are one line each (nothing changed,
  nothing made); export onto a FIFO or into a missing folder is one line, the FIFO untouched."""
  _, path, got, _ = exported
  w = tmp_path / "w"
  rc, lines, out, err = _cli("cdeit_jax.convert", f"--checkpoint={path}", f"--workdir={w}")
  step = got["step"]
  assert rc == 0 and not lines, err[-2000:]
  assert f"wrote {w}/checkpoints/{step} (step {step}: what eval.py and reconstruct read" in out
  assert checkpoint.resolve(str(w)) == (str(w), step)
  lower = _forged(path, tmp_path / "lower.safetensors", lambda a, r: r["meta"].update(step=4))
  rc, lines, _, err = _cli("cdeit_jax.convert", f"--checkpoint={lower}", f"--workdir={w}")
  assert rc == 1 and len(lines) == 1 and "Traceback" not in err, err[-2000:]
  assert f"holds a model already (checkpoints/ has step {step}" in lines[0]
  assert sorted(os.listdir(w / "checkpoints")) == [str(step)]

  def nan_calibration(arrays, record):
    calibration = record["meta"]["calibration"]
    calibration[sorted(calibration)[0]][0] = float("nan")

  bad = _forged(path, tmp_path / "nan.safetensors", nan_calibration)
  rc, lines, _, err = _cli(
    "cdeit_jax.convert", f"--checkpoint={bad}", f"--workdir={tmp_path / 'n'}"
  )
  assert rc == 1 and len(lines) == 1 and "Traceback" not in err, err[-2000:]
  assert "holds NaN or infinite values" in lines[0] and not (tmp_path / "n").exists()
  fifo = tmp_path / "fifo"
  os.mkfifo(fifo)
  for out, words in (
    (fifo, "is a named pipe (FIFO)"),
    (tmp_path / "no" / "m.safetensors", "does not exist"),
  ):
    rc, lines, _, err = _cli("cdeit_jax.export", "--workdir=models/cdeit16", f"--out={out}")
    assert rc == 1 and len(lines) == 1 and "Traceback" not in err, err[-2000:]
    assert lines[0].startswith(f"error: --out {out}: ") and words in lines[0]
  assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and not (tmp_path / "no").exists()
