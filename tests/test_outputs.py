"""Where outputs may go and what publishing them may touch (`cdeit_jax.infer.outputs`): --out is
refused around the data and the checkpoints (links resolved), and a publication replaces or
removes only the files an earlier run listed in the folder's manifest."""

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

from cdeit_jax.common.errors import InputError
from cdeit_jax.infer import outputs


def _tree(root) -> dict[str, bytes]:
  """Every file under `root` (paths relative to it) with its bytes."""
  out = {}
  for d, _, files in os.walk(root):
    for f in files:
      p = os.path.join(d, f)
      out[os.path.relpath(p, root)] = open(p, "rb").read()
  return out


@pytest.fixture
def data(tmp_path):
  """A challenge-like data folder: levels/level_1 with the user's files."""
  level = tmp_path / "levels" / "level_1"
  level.mkdir(parents=True)
  for name in ("data1.mat", "ref.mat", "true1.mat"):
    (level / name).write_bytes(os.urandom(64))
  return level


def test_out_around_the_data_or_the_checkpoints_is_refused(tmp_path, data):
  """--out equal to, inside, or around the data folder (also through a link), or around a run's
  checkpoints, is refused in one line before anything is made; the data stay byte for byte."""
  before = _tree(tmp_path / "levels")
  link = tmp_path / "link"
  link.symlink_to(data)
  run = tmp_path / "run"
  (run / "checkpoints" / "7").mkdir(parents=True)
  cases = [
    (data, "is the data folder"),
    (data.parent, "contains the data folder"),
    (tmp_path, "contains the data folder"),
    (data / "answers", "lies inside the data folder"),
    (link, "is the data folder"),
  ]
  for out, words in cases:
    with pytest.raises(InputError, match=f"--out {out} {words} \\({data}\\)"):
      outputs.check_out(str(out), str(data), names=["level_1/1.mat", "metrics.json"])
  for out, words in ((run, "contains"), (run / "checkpoints" / "eval", "lies inside")):
    with pytest.raises(InputError, match=f"{words} the run's checkpoints"):
      outputs.check_out(str(out), workdir=str(run))
  assert not (data / "answers").exists()
  assert _tree(tmp_path / "levels") == before


def _publish(out, files: dict[str, str]):
  """Publish `files` ({path: text}, the last the marker) into `out` as a command does."""

  def write_all(folder):
    for name, text in files.items():
      os.makedirs(os.path.dirname(os.path.join(folder, name)), exist_ok=True)
      with open(os.path.join(folder, name), "w") as fh:
        fh.write(text)
    return list(files)

  outputs.check_out(str(out), names=list(files))
  return outputs.publish(str(out), write_all)


def test_publishing_touches_only_what_an_earlier_run_wrote(tmp_path):
  """A second publication replaces the first's files and removes those it lacks (a stale level,
  its folder when left empty); the user's files beside and inside the outputs' folders stay;
  the manifest lists exactly the files published last."""
  out = tmp_path / "out"
  _publish(out, {"level_1/1.mat": "a", "level_2/1.mat": "b", "metrics.json": "{}"})
  (out / "level_1" / "notes.txt").write_text("mine")
  (out / "notes.txt").write_text("mine too")
  _publish(out, {"level_1/1.mat": "new", "metrics.json": "{1}"})
  assert (out / "level_1" / "1.mat").read_text() == "new"
  assert not (out / "level_2").exists()
  assert (out / "level_1" / "notes.txt").read_text() == "mine"
  assert (out / "notes.txt").read_text() == "mine too"
  manifest = json.loads((out / outputs.MANIFEST).read_text())
  assert manifest["files"] == ["level_1/1.mat", "metrics.json"]
  assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == [outputs.MANIFEST]


def test_a_users_file_of_an_outputs_name_stops_the_command_before_any_work(tmp_path):
  """A file of an output's name that no run of ours wrote (no manifest lists it), a folder of
  that name, a link on the way (OUT/level_1 -> elsewhere) and a damaged manifest are each
  refused in one line; nothing is written or removed."""
  out = tmp_path / "out"
  (out / "level_1").mkdir(parents=True)
  (out / "level_1" / "1.mat").write_text("the user's")
  with pytest.raises(InputError, match=r"level_1/1.mat is there and was not written by cdeit-jax"):
    _publish(out, {"level_1/1.mat": "x", "metrics.json": "{}"})
  assert (out / "level_1" / "1.mat").read_text() == "the user's"
  assert sorted(os.listdir(out)) == ["level_1"]
  (out / "metrics.json").mkdir()
  with pytest.raises(InputError, match="metrics.json is there and was not written"):
    _publish(out, {"metrics.json": "{}"})
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  (out / "level_2").symlink_to(elsewhere)
  with pytest.raises(InputError, match="level_2 is a symbolic link"):
    _publish(out, {"level_2/1.mat": "x", "answers.png": "y"})
  assert os.listdir(elsewhere) == []
  (out / outputs.MANIFEST).write_text("{not json")
  with pytest.raises(InputError, match="damaged"):
    _publish(out, {"answers.png": "y"})
  # the check runs again at publication: a file that appeared meanwhile is kept
  fresh = tmp_path / "fresh"

  def write_all(folder):
    (fresh / "metrics.json").write_text("appeared")
    (open(os.path.join(folder, "metrics.json"), "w")).close()
    return ["metrics.json"]

  outputs.check_out(str(fresh), names=["metrics.json"])
  with pytest.raises(InputError, match="metrics.json is there and was not written"):
    outputs.publish(str(fresh), write_all)
  assert (fresh / "metrics.json").read_text() == "appeared"
  assert sorted(os.listdir(fresh)) == ["metrics.json"]


def test_a_file_size_limit_while_writing_frames_is_one_line(tmp_path):
  """A process whose files may not pass 200 kB (`ulimit -f`) writing 50 frames of 128 x 128:
  the write fails with EFBIG (Python ignores SIGXFSZ), and the command says so in one line
  naming the folder; nothing is left half-written (the staging folder is removed)."""
  out = tmp_path / "o"
  code = f"""
import resource
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
import numpy as np
from cdeit_jax.infer import frames, outputs
staged = outputs.Staged({str(out)!r})
try:
  with outputs.failing(staged):
    w = frames.FramesWriter(staged.work, 50, 128, False, np.zeros(0, np.int64), 1.0)
    w.add(0, np.ones((50, 128, 128), np.float32), None)
    staged.commit(w.finish({{}}, fps=10.0, figures=False, targets=None))
except outputs.OutputError as e:
  print("ONE LINE:", e)
"""
  p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
  assert p.returncode == 0, p.stderr[-2000:]
  line = p.stdout.strip()
  assert line.startswith(f"ONE LINE: {out}: a file there would pass the largest file"), line
  assert "\n" not in line and [q.name for q in out.iterdir()] == []
