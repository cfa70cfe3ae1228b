"""A model folder that ships with the code (`models/NAME`: `manifest.json` beside `checkpoints/`)
is read-only for every command, at any depth below it (`shipped.refuse_write`): each refuses a
write there in one line before any work, and the refusal's advice puts the folder back."""

import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
from conftest import REPO

from cdeit_jax.checkpoints import shipped
from cdeit_jax.common.errors import InputError

CDEIT16 = REPO / "models" / "cdeit16"
UEF = REPO / "data" / "uef2017"


def _run(*args, cwd=REPO):
  return subprocess.run(
    [sys.executable, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=300
  )


def _files(folder: pathlib.Path) -> dict[str, str]:
  """Every file under `folder` (links not followed) -> the SHA-256 of its bytes."""
  return {
    str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
    for p in sorted(folder.rglob("*"))
    if p.is_file()
  }


@pytest.fixture
def model_copy(tmp_path):
  copy = tmp_path / "models" / "cdeit16"
  shutil.copytree(CDEIT16, copy)
  return copy


def test_a_path_at_any_depth_of_a_model_folder_is_refused(model_copy, tmp_path):
  """The folder itself, its checkpoints, its step, a file not yet made in the step, and a link
  into it are all refused, naming the flag and the folder; a path beside it is not."""
  step = json.loads((model_copy / "manifest.json").read_text())["step"]
  (tmp_path / "link").symlink_to(model_copy / "checkpoints")
  for p in (
    model_copy,
    model_copy / "checkpoints",
    model_copy / "checkpoints" / str(step),
    model_copy / "checkpoints" / str(step) / "new" / "d.npz",
    tmp_path / "link" / "x",
  ):
    assert shipped.model_folder_of(str(p)) == str(model_copy), p
    with pytest.raises(InputError, match=rf"^--out {p} (is|lies inside) the model folder "):
      shipped.refuse_write(str(p), "--out")
  for p in (tmp_path / "models", tmp_path / "models" / "cdeit16-copy", tmp_path / "other"):
    assert shipped.model_folder_of(str(p)) is None, p
    shipped.refuse_write(str(p), "--out")
  # a manifest.json with no checkpoints/ beside it (some other tool's) is not a model folder
  (tmp_path / "web").mkdir()
  (tmp_path / "web" / "manifest.json").write_text("{}")
  assert shipped.model_folder_of(str(tmp_path / "web" / "out")) is None


def test_the_refusals_advice_restores_tracked_and_added_files(model_copy, tmp_path):
  """In a git checkout holding the model, a changed weight file, an added file and an added step
  folder are undone by the commands the refusal gives, run as printed (absolute paths)."""
  env = {
    **os.environ,
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_CONFIG_GLOBAL": "/dev/null",
  }
  env |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
  git = lambda *a: subprocess.run(
    ["git", *a], cwd=tmp_path, env=env, check=True, capture_output=True
  )
  git("init", "-q")
  git("add", "models")
  git("commit", "-q", "-m", "models")
  before = _files(model_copy)
  step_dir = (
    model_copy / "checkpoints" / str(json.loads((model_copy / "manifest.json").read_text())["step"])
  )
  (step_dir / "uncertainty.json").write_text('{"scale": 2.0}')
  (step_dir / "extra.txt").write_text("x")
  (model_copy / "checkpoints" / "8").mkdir()
  (model_copy / "checkpoints" / "8" / "state").write_text("y")
  with pytest.raises(InputError) as e:
    shipped.refuse_write(str(step_dir / "more"), "--workdir")
  advice = str(e.value).split("restore it: ")[1].split(" (a copy outside git")[0]
  assert advice == f"git checkout -- {model_copy} && git clean -fdx {model_copy}"
  subprocess.run(advice, shell=True, cwd=tmp_path, env=env, check=True, capture_output=True)
  assert _files(model_copy) == before
  shipped.verify(str(model_copy))  # reads again


def _refused(p, flag, target):
  assert p.returncode == 1, (p.returncode, p.stderr[-3000:])
  lines = [x for x in p.stderr.splitlines() if x.startswith("error:")]
  assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
  assert lines[0].startswith(f"error: {flag} {target} ")
  assert "the model folder" in lines[0] and "read-only" in lines[0] and "git clean -fdx" in lines[0]


def test_every_command_refuses_to_write_into_a_model_folder(model_copy, tmp_path):
  """train.py (the folder, its checkpoints/, its step), eval.py, reconstruct, answer_study,
  calibrate, interpolate, ship, simulate and sequence, each aimed at a path in a copy of
  models/cdeit16: rc 1, one line naming the flag and the folder, and not one byte of the copy
  changed or added. Inputs that do not exist (frames, device) show the refusal comes first."""
  before = _files(model_copy)
  step_dir = (
    model_copy / "checkpoints" / str(json.loads((model_copy / "manifest.json").read_text())["step"])
  )
  m = model_copy
  cases = [
    ("--workdir", m, ["train.py", "--config=configs/test.py", f"--workdir={m}"]),
    (
      "--workdir",
      m / "checkpoints",
      ["train.py", "--config=configs/test.py", f"--workdir={m / 'checkpoints'}"],
    ),
    ("--workdir", step_dir, ["train.py", "--config=configs/test.py", f"--workdir={step_dir}"]),
    (
      "--out",
      m / "e",
      ["eval.py", f"--workdir={m}", "--data=uef2017", f"--data_path={UEF}", f"--out={m / 'e'}"],
    ),
    (
      "--out",
      step_dir / "r",
      [
        "-m",
        "cdeit_jax.reconstruct",
        f"--workdir={m}",
        "--frames=none.npy",
        f"--out={step_dir / 'r'}",
      ],
    ),
    (
      "--out",
      m / "s.json",
      ["-m", "cdeit_jax.infer.answer_study", f"--workdir={m}", "--ktc=x", f"--out={m / 's.json'}"],
    ),
    (
      "--out",
      step_dir / "d.npz",
      ["-m", "cdeit_jax.calibrate", "--device=none.mat", f"--out={step_dir / 'd.npz'}"],
    ),
    (
      "--out",
      m / "checkpoints" / "w",
      [
        "-m",
        "cdeit_jax.checkpoints.interpolate",
        f"--workdir={m}",
        "--alpha=0.5",
        f"--out={m / 'checkpoints' / 'w'}",
      ],
    ),
    (
      "--out",
      m / "checkpoints" / "x",
      ["-m", "cdeit_jax.ship", f"--workdir={m}", f"--out={m / 'checkpoints' / 'x'}"],
    ),
    (
      "--out",
      m / "data",
      [
        "-m",
        "cdeit_jax.simulate",
        "--config=configs/test.py",
        f"--out={m / 'data'}",
        "--num_train=2",
      ],
    ),
    ("--out", m / "q.npz", ["-m", "cdeit_jax.sequence", f"--out={m / 'q.npz'}"]),
  ]
  for flag, target, args in cases:
    _refused(_run(*args), flag, target)
    assert _files(model_copy) == before, args


def test_an_uncertainty_fit_on_a_model_folder_keeps_its_scale_beside_the_outputs(
  model_copy, tmp_path
):
  """eval.py --config.eval.fit_uncertainty=True on a copy of models/cdeit16: the copy's bytes are
  unchanged, the fitted scale is OUT/uncertainty.json, and this evaluation's coverage is at that
  scale (the std scaled by it covers 68.3 % at 1 std on the examples it was fitted on)."""
  before = _files(model_copy)
  out = tmp_path / "O"
  p = _run(
    "eval.py",
    f"--workdir={model_copy}",
    "--data=simulated",
    f"--data_path={UEF}",
    "--units=uef2017",
    f"--out={out}",
    "--config.eval.fit_uncertainty=True",
    "--config.eval.max_examples=2",
    "--config.sampling.num_samples=2",
    "--config.eval.figure=False",
  )
  assert p.returncode == 0, p.stderr[-3000:]
  assert _files(model_copy) == before
  fitted = json.loads((out / "uncertainty.json").read_text())
  assert fitted["examples"] == 2 and fitted["num_samples"] == 2
  u = json.loads((out / "metrics.json").read_text())["metrics"]["uncertainty"]
  assert u["scale"] == pytest.approx(fitted["scale"]) and u["coverage_1std"] == pytest.approx(
    0.683, abs=0.01
  )
  assert "uncertainty.json" in json.loads((out / ".cdeit-outputs.json").read_text())["files"]
  assert f"kept in {out / 'uncertainty.json'}" in p.stderr
