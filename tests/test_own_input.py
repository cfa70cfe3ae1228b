"""No command's output replaces its own input (`fileio.refuse_own_input`, the one check): an
--out that is an input (also through a link or a hard link), lies inside one, or holds one where
the command writes is refused in one line before any work, and the input keeps its bytes."""

import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO

from cdeit_jax.common import fileio
from cdeit_jax.common.errors import InputError

CDEIT16 = REPO / "models" / "cdeit16"


def _run(*args):
  return subprocess.run(
    [sys.executable, *map(str, args)], capture_output=True, text=True, cwd=REPO, timeout=300
  )


def _one_line(p) -> str:
  assert p.returncode == 1, (p.returncode, p.stderr[-3000:])
  lines = [x for x in p.stderr.splitlines() if x.startswith("error:")]
  assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
  return lines[0]


def test_is_inside_holds_and_writes_over_an_input_are_told_apart(tmp_path):
  """Each relation is named; a folder that only holds an input elsewhere than where the command
  writes (`writes` given) and an input of None are let through."""
  d = tmp_path / "D.npz"
  d.write_bytes(b"x")
  (tmp_path / "link.npz").symlink_to(d)
  os.link(d, tmp_path / "hard.npz")
  data = tmp_path / "data"
  (data / "valid").mkdir(parents=True)
  cases = [
    (d, [("--device", d)], (), "is"),
    (tmp_path / "link.npz", [("--device", d)], (), "is"),
    (tmp_path / "hard.npz", [("--device", d)], (), "is"),
    (data / "valid" / "s.json", [("--sims", data)], (), "lies inside"),
    (tmp_path, [("--sims", data)], None, "contains"),
    (tmp_path, [("--frames", d)], ("D.npz",), "would replace, as D.npz,"),
  ]
  for out, inputs, writes, where in cases:
    what, given = inputs[0]
    with pytest.raises(InputError) as e:
      fileio.refuse_own_input(str(out), "--out", [(w, str(g)) for w, g in inputs], writes)
    assert str(e.value) == (
      f"--out {out} {where} {what} ({given}): a command's output never replaces or mixes with "
      "its own input; give another --out"
    )
  fileio.refuse_own_input(str(tmp_path), "--out", [("--frames", str(d))], ("frames.npz",))
  fileio.refuse_own_input(str(tmp_path / "o.npz"), "--out", [("--reference", None)], ())


def test_calibrate_refuses_its_device_file_as_out_and_leaves_it(tmp_path):
  """calibrate --device D.npz --out D.npz (or a link to it): rc 1, one line naming both flags,
  D.npz's bytes unchanged (before: its empty tank became the fitted subset's)."""
  d = tmp_path / "D.npz"
  np.savez(d, Uelref=np.arange(2356.0), Injref=np.eye(32)[:, :76], Mpat=np.eye(32)[:, :31])
  before = d.read_bytes()
  (tmp_path / "L.npz").symlink_to(d)
  for out in (d, tmp_path / "L.npz"):
    line = _one_line(
      _run("-m", "cdeit_jax.calibrate", f"--device={d}", f"--out={out}", "--patterns=0-3")
    )
    assert line == (
      f"error: --out {out} is --device ({d}): a command's output never replaces or mixes with "
      "its own input; give another --out"
    )
    assert d.read_bytes() == before


def test_reconstruct_refuses_an_out_where_it_would_write_over_its_frames(tmp_path):
  """--frames O/frames.npz --out O (what an earlier run wrote, read back) and --reference
  O/frames.mat: refused before the model is read, the file unchanged; frames elsewhere in O are
  fine (make moving-demo keeps its sequence there)."""
  out = tmp_path / "O"
  out.mkdir()
  f = out / "frames.npz"
  np.savez(f, frames=np.zeros((2, 208)))
  before = f.read_bytes()
  line = _one_line(
    _run("-m", "cdeit_jax.reconstruct", f"--workdir={CDEIT16}", f"--frames={f}", f"--out={out}")
  )
  assert line.startswith(f"error: --out {out} would replace, as frames.npz, --frames ({f}): ")
  assert f.read_bytes() == before
  ref = out / "frames.mat"
  ref.write_bytes(b"m")
  line = _one_line(
    _run(
      "-m",
      "cdeit_jax.reconstruct",
      f"--workdir={CDEIT16}",
      f"--frames={tmp_path / 'x.npy'}",
      f"--reference={ref}",
      f"--out={out}",
    )
  )
  assert line.startswith(f"error: --out {out} would replace, as frames.mat, --reference ({ref})")
  assert ref.read_bytes() == b"m"


def test_answer_study_refuses_an_out_inside_its_simulations(tmp_path):
  """--out inside a --sims split: one line, nothing written there."""
  sims = tmp_path / "data" / "valid"
  sims.mkdir(parents=True)
  out = sims / "study.json"
  line = _one_line(
    _run(
      "-m",
      "cdeit_jax.answer_study",
      f"--workdir={CDEIT16}",
      f"--sims={sims}",
      f"--out={out}",
    )
  )
  assert line.startswith(f"error: --out {out} lies inside --sims ({sims}): ")
  assert os.listdir(sims) == []


def test_ship_refuses_to_write_a_model_folder_over_itself(tmp_path):
  """ship --workdir K --out K, K a copy of models/cdeit16 (before: rc 0, the folder rewritten
  in place with another name, recipe and scores): rc 1, one line naming both flags, every file
  of K keeps its bytes."""
  import shutil

  k = tmp_path / "K"
  shutil.copytree(CDEIT16, k)
  before = {p: p.read_bytes() for p in sorted(k.rglob("*")) if p.is_file()}
  line = _one_line(_run("-m", "cdeit_jax.ship", f"--workdir={k}", f"--out={k}", "--recipe=x"))
  assert line.startswith(f"error: --out {k} is --workdir ({k}): a command's output never"), line
  assert {p: p.read_bytes() for p in sorted(k.rglob("*")) if p.is_file()} == before


def test_interpolating_a_shipped_model_away_from_its_builder_says_why(tmp_path):
  """A copy of models/cdeit16 (fine-tuned from its builder's run, recorded by path only) on a
  machine without that run: interpolate refuses in one line that says the start is not here and
  why (before: a raw 'no such file or directory' naming the builder's path)."""
  import json
  import shutil

  start = json.loads((CDEIT16 / "manifest.json").read_text())["config"]["init_from"]
  if os.path.exists(start):
    pytest.skip(f"{start} exists on this machine: the builder's own")
  k = tmp_path / "K"
  shutil.copytree(CDEIT16, k)
  out = tmp_path / "o"
  p = _run("-m", "cdeit_jax.interpolate", f"--workdir={k}", "--alpha=0.5", f"--out={out}")
  line = _one_line(p)
  assert f"fine-tuned from {start} (config.init_from), which is not here" in line, line
