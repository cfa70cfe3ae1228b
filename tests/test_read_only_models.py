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
  folder are undone by the commands the refusal gives, run as printed (absolute paths) from
  outside the checkout."""
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
  assert advice == f"git -C {model_copy} checkout -- . && git -C {model_copy} clean -fdx ."
  elsewhere = tmp_path.parent  # run from outside the checkout, as printed
  subprocess.run(advice, shell=True, cwd=elsewhere, env=env, check=True, capture_output=True)
  assert _files(model_copy) == before
  shipped.verify(str(model_copy))  # reads again


def _refused(p, flag, target):
  assert p.returncode == 1, (p.returncode, p.stderr[-3000:])
  lines = [x for x in p.stderr.splitlines() if x.startswith("error:")]
  assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
  assert lines[0].startswith(f"error: {flag} {target} ")
  assert "the model folder" in lines[0] and "read-only" in lines[0]
  # a copy no git checkout tracks (tests' copies): no git command, which could delete it
  assert "copy it again" in lines[0] and "git -C" not in lines[0]


@pytest.mark.e2e
def test_every_command_refuses_to_write_into_a_model_folder(model_copy, tmp_path):
  """train.py (the folder, its checkpoints/, its step), eval.py, reconstruct, answer_study,
  calibrate, interpolate, ship, simulate, sequence, voltage_stats and export, and the
  accelerator check, make gpu-run and the PyTorch comparison, each aimed at a path in a copy of
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
      ["-m", "cdeit_jax.answer_study", f"--workdir={m}", "--ktc=x", f"--out={m / 's.json'}"],
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
        "cdeit_jax.interpolate",
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
    (
      "--out",
      m / "checkpoints",
      ["-m", "cdeit_jax.voltage_stats", UEF, "--units=uef2017", f"--out={m}/checkpoints"],
    ),
    ("--out", m / "m.st", ["-m", "cdeit_jax.export", f"--workdir={m}", f"--out={m}/m.st"]),
  ]  # fmt: skip
  for flag, target, args in cases:
    _refused(_run(*args), flag, target)
    assert _files(model_copy) == before, args
  # the argparse commands' (the accelerator check, the GPU run, a benchmark: one line, rc 2)
  for args in (
    ["-m", "cdeit_jax.accelerator_check", f"--out={m / 'checkpoints'}"],
    ["-m", "cdeit_jax.gpu_run", f"--out={m / 'gpu'}"],
    ["bench/bench_vs_reference.py", "--reference=none", f"--out={m / 'vs.json'}"],
  ):
    p = _run(*args)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    assert "error: --out " in last and "the model folder" in last and "read-only" in last, last
    assert _files(model_copy) == before, args


@pytest.mark.e2e
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


def test_an_edit_to_the_manifests_own_fields_is_refused(model_copy):
  """The recipe, a score, a config value changed, or the manifest's own SHA-256 removed: every
  reader refuses the folder in one line (before: only the step's files were checked)."""
  from cdeit_jax.checkpoints import loading

  path = model_copy / "manifest.json"
  original = path.read_text()
  shipped.verify(str(model_copy))
  edits = [
    lambda m: m.update(recipe="make something-else"),
    lambda m: m["scores"]["uef2017"]["metrics"]["cdeit"].update(rmse=0.01),
    lambda m: m["config"]["sampling"].update(steps=50),
    lambda m: m.pop("manifest_sha256"),
  ]
  for edit in edits:
    m = json.loads(original)
    edit(m)
    path.write_text(json.dumps(m, indent=1) + "\n")
    with pytest.raises(shipped.ManifestError, match=r"its manifest.json was edited") as e:
      loading.load(str(model_copy))
    assert str(e.value).startswith(f"model folder {model_copy}: ") and "\n" not in str(e.value)
  assert "which it lacks" in str(e.value)
  path.write_text(original)
  shipped.verify(str(model_copy))


def test_a_lost_or_folder_manifest_is_one_line_and_still_read_only(model_copy, tmp_path):
  """manifest.json deleted from a folder that is obviously a model's (one step as ship writes
  it), in models/ or a copy elsewhere: readers refuse it, train.py refuses to train there
  (before: an ordinary run); a converted step in models/ is an ordinary checkpoint.
  manifest.json that is a folder: one line from eval.py, no traceback."""
  import shutil

  from cdeit_jax.checkpoints import loading

  (model_copy / "manifest.json").unlink()
  with pytest.raises(shipped.ManifestError, match=r"its manifest.json is missing"):
    loading.load(str(model_copy))
  assert shipped.model_folder_of(str(model_copy / "checkpoints")) == str(model_copy)
  before = _files(model_copy)
  _refused(
    _run("train.py", "--config=configs/test.py", f"--workdir={model_copy / 'checkpoints'}"),
    "--workdir",
    model_copy / "checkpoints",
  )
  assert _files(model_copy) == before
  elsewhere = tmp_path / "runs" / "cdeit16"
  shutil.copytree(model_copy, elsewhere)
  assert shipped.lost_manifest(str(elsewhere))
  assert shipped.model_folder_of(str(elsewhere / "checkpoints")) == str(elsewhere)
  with pytest.raises(InputError, match=r"\(its manifest.json is missing: its one step is as ship"):
    shipped.refuse_write(str(elsewhere / "checkpoints"), "--workdir")
  with pytest.raises(shipped.ManifestError, match=r"its manifest.json is missing"):
    loading.load(str(elsewhere))
  (model_copy / "manifest.json").mkdir()
  p = _run(
    "eval.py",
    f"--workdir={model_copy}",
    "--data=uef2017",
    f"--data_path={UEF}",
    f"--out={tmp_path / 'e'}",
  )
  assert p.returncode == 1 and p.stderr.count("error:") == 1, p.stderr[-3000:]
  assert "Traceback" not in p.stderr and "its manifest.json is a folder" in p.stderr


def test_a_converted_step_in_models_is_not_taken_for_a_lost_model(tiny_run, tmp_path):
  """A user's own checkpoint kept in a models/ folder (save_inference, as convert writes it) has
  no manifest and is no model folder: it reads and trains as before."""
  import shutil

  mine = tmp_path / "models" / "mine"
  shutil.copytree(tiny_run, mine)
  assert not shipped.lost_manifest(str(mine)) and shipped.model_folder_of(str(mine)) is None
  assert shipped.verify(str(mine)) is None
