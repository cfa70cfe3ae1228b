"""W&B tracking (cdeit_jax/common/tracking.py) for real, in its offline mode: the runs wandb writes
are read back from their files (conftest.wandb_offline_runs). The two-process case is in
tests/test_training.py (test_two_processes_stop_together_on_sigterm_and_match_one)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
import yaml
from conftest import REPO, run_train, wandb_offline_runs

pytest.importorskip("wandb")  # the optional extra cdeit-jax[wandb] (in the test extra)

UEF = str(REPO / "data" / "uef2017")
FLAGS = ["--config.wandb.project=check", "--config.log_every=5", "--config.eval_every=10"]


def _env(wandb_dir) -> dict:
  return dict(os.environ, WANDB_MODE="offline", WANDB_DIR=str(wandb_dir))


# make test-all: 40 s; a W&B run kept across a resume: the two-process test in test_training.py
@pytest.mark.slow
def test_a_resumed_training_is_one_offline_run_and_eval_logs_into_it(tmp_path):
  """train.py for 10 steps, then resumed to 20: one offline run under WANDB_DIR/wandb (the
  resumed attempt rewrote it whole), its id kept in WORKDIR/wandb.json, the config in it, every
  metrics.jsonl record in its history, the summary's loss the last loss of metrics.jsonl, the
  checkpoint steps logged at each save; eval.py then logs its metrics into the same run id."""
  wd, d = tmp_path / "run", tmp_path / "D"
  rc, _, err = run_train(wd, *FLAGS, "--config.steps=10", env=_env(d))
  assert rc == 0, err[-3000:]
  first = json.loads((wd / "wandb.json").read_text())
  assert f"logging offline to {d}/wandb/offline-run-" in err and "wandb sync" in err
  rc, _, err = run_train(wd, *FLAGS, "--config.steps=20", env=_env(d))
  assert rc == 0, err[-3000:]
  assert "resumed from" in err
  (run,) = wandb_offline_runs(d)
  assert run["id"] == first["id"] == json.loads((wd / "wandb.json").read_text())["id"]
  assert run["project"] == "check"
  assert run["config"]["batch_size"] == 8 and run["config"]["model"]["hidden_size"] == 32
  jsonl = [json.loads(line) for line in (wd / "metrics.jsonl").open()]
  logged = [h for h in run["history"] if "loss" in h]
  assert [h["_step"] for h in logged] == [r["step"] for r in jsonl] == [5, 10, 15, 20]
  for h, r in zip(logged, jsonl):
    assert h["loss"] == r["loss"] and h.get("val_loss") == r.get("val_loss")
  assert run["summary"]["loss"] == jsonl[-1]["loss"]
  assert [h["checkpoint_step"] for h in logged if "checkpoint_step" in h] == [10, 20]
  assert run["summary"]["device"].startswith("devices: 8 x cpu over 1 process(es)")
  files = run["dir"] / "files"  # also as files, as wandb's online runs have them
  assert json.loads((files / "wandb-summary.json").read_text())["loss"] == jsonl[-1]["loss"]
  assert yaml.safe_load((files / "config.yaml").read_text())["batch_size"] == {"value": 8}

  from cdeit_jax.infer import data_kinds

  old = {k: os.environ.get(k) for k in ("WANDB_MODE", "WANDB_DIR")}
  os.environ.update(_env(d))
  try:
    r = data_kinds.evaluate(
      str(wd), "uef2017", UEF, str(tmp_path / "eval"), {"sampling.steps": 1, "eval.figure": True}
    )
  finally:
    for k, v in old.items():
      os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
  runs = wandb_offline_runs(d)
  assert len(runs) == 2 and {x["id"] for x in runs} == {run["id"]}
  (ev,) = [x for x in runs if x["dir"] != run["dir"]]
  assert ev["summary"]["uef2017/cdeit/rmse"] == r["metrics"]["cdeit"]["rmse"]
  assert any(k.startswith("uef2017/figure/") for h in ev["history"] for k in h)  # a wandb.Image


@pytest.mark.e2e
def test_a_broken_wandb_never_stops_the_training(tmp_path):
  """An unwritable WANDB_DIR (wandb falls back to a temporary folder by itself) and a run id
  W&B refuses (a damaged wandb.json): one warning, and the training resumes and finishes."""
  wd, blocker = tmp_path / "run", tmp_path / "a_file"
  blocker.write_text("")
  env = _env(blocker / "sub")
  rc, _, err = run_train(wd, *FLAGS, "--config.steps=5", env=env)
  assert rc == 0, err[-3000:]
  (wd / "wandb.json").write_text(json.dumps({"id": "bad/id", "project": "check"}))
  rc, _, err = run_train(wd, *FLAGS, "--config.steps=10", env=env)
  assert rc == 0, err[-3000:]
  warnings = [line for line in err.splitlines() if "W&B start failed" in line]
  assert len(warnings) == 1 and "training goes on without it" in warnings[0], err[-2000:]
  assert json.loads((wd / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 10


def test_without_a_project_nothing_imports_wandb(tmp_path):
  """W&B off (the default): a tracker does nothing and neither command imports wandb; `import
  wandb` appears in tracking.py only, inside its functions."""
  code = (
    "import sys\n"
    "from cdeit_jax import config_lib\n"
    "from cdeit_jax.common import tracking\n"
    "from cdeit_jax.train import train_loop\n"
    "from cdeit_jax.infer import evaluate\n"
    "t = tracking.Tracker.start(config_lib.default_config(), sys.argv[1], 'd', 0, '', True)\n"
    "t.log(1, {'loss': 1.0}, checkpoint=1); t.finish()\n"
    "assert t.run is None and 'wandb' not in sys.modules, sorted(sys.modules)\n"
  )
  p = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True)
  assert p.returncode == 0, p.stderr[-2000:]
  assert not (tmp_path / "wandb.json").exists()
  for path in pathlib.Path(REPO, "cdeit_jax").rglob("*.py"):
    lines = [line for line in path.read_text().splitlines() if "import wandb" in line]
    if path.name == "tracking.py":
      assert lines and all(line.startswith("  ") for line in lines)
    else:
      assert lines == [], path


def test_wandb_mode_unknown_is_one_line_before_work_and_empty_is_unset(tmp_path, monkeypatch):
  """WANDB_MODE=garbage with a project: train.py refuses in one line naming the variable and its
  modes, before anything is written (before: W&B turned itself off with a 4-line validation
  error); WANDB_MODE left empty counts as unset (removed: wandb refuses an empty one)."""
  from cdeit_jax.common import tracking
  from cdeit_jax.common.errors import InputError

  env = dict(os.environ, WANDB_MODE="garbage", WANDB_DIR=str(tmp_path / "D"))
  rc, _, err = run_train(tmp_path / "run", *FLAGS, "--config.steps=5", env=env)
  lines = [x for x in err.splitlines() if x.startswith("error:")]
  assert rc == 1 and "Traceback" not in err, err[-3000:]
  assert lines == [
    "error: WANDB_MODE='garbage': not a W&B mode; set it to online, offline or disabled, or "
    "unset it (then online with credentials, else offline)"
  ]
  assert not (tmp_path / "run" / "checkpoints").exists() and not (tmp_path / "D").exists()
  monkeypatch.setenv("WANDB_MODE", "")
  tracking.check_mode_env()
  assert "WANDB_MODE" not in os.environ
  monkeypatch.setenv("WANDB_MODE", "dryrun")
  tracking.check_mode_env()
  monkeypatch.setenv("WANDB_MODE", "Offline")
  with pytest.raises(InputError, match="WANDB_MODE='Offline': not a W&B mode"):
    tracking.check_mode_env()


@pytest.mark.e2e
def test_a_damaged_wandb_json_is_a_warning_and_eval_finishes(tiny_run, tmp_path):
  """WORKDIR/wandb.json that is not a run record (garbage, a list, no id): eval.py writes its
  outputs and exits 0 with one warning naming the file (before: rc 1 and a traceback after the
  outputs were written)."""
  import shutil

  wd = tmp_path / "run"
  shutil.copytree(tiny_run, wd)
  for i, text in enumerate(("{garbage", "[1, 2]", '{"project": "p"}')):
    (wd / "wandb.json").write_text(text)
    out = tmp_path / f"e{i}"
    p = subprocess.run(
      [sys.executable, "eval.py", f"--workdir={wd}", "--data=uef2017", f"--data_path={UEF}"]
      + [f"--out={out}", "--config.eval.max_examples=2", "--config.sampling.steps=1"]
      + ["--config.sampling.num_samples=1", "--config.eval.figure=False"],
      capture_output=True,
      text=True,
      cwd=REPO,
      env=dict(os.environ, WANDB_MODE="offline", WANDB_DIR=str(tmp_path / "D")),
      timeout=300,
    )
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-3000:]
    warned = [x for x in p.stderr.splitlines() if "W&B:" in x]
    assert len(warned) == 1 and f"{wd / 'wandb.json'}: damaged (" in warned[0], p.stderr[-2000:]
    assert "the evaluation is not logged to W&B" in warned[0]
    assert (out / "metrics.json").exists()


def test_an_unreachable_server_goes_offline_within_the_start_timeout(tmp_path, monkeypatch):
  """Online with credentials but no server answering: the run starts offline after the start
  timeout (INIT_TIMEOUT_S, 15 s; 2 s here), with one warning (before: wandb's 90 s default
  held the training up for 95 s)."""
  import time

  import ml_collections

  from cdeit_jax.common import tracking

  assert tracking.INIT_TIMEOUT_S <= 15
  monkeypatch.setattr(tracking, "INIT_TIMEOUT_S", 2.0)
  monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # the discard port: refused
  monkeypatch.setenv("WANDB_API_KEY", "a" * 40)
  monkeypatch.setenv("WANDB_DIR", str(tmp_path))
  monkeypatch.delenv("WANDB_MODE", raising=False)
  monkeypatch.delenv("WANDB_INIT_TIMEOUT", raising=False)
  w = ml_collections.ConfigDict(dict(project="p", entity="", name="", tags=(), mode="online"))
  t0 = time.perf_counter()
  run, mode = tracking._start(w, str(tmp_path), None, {}, "train")
  took = time.perf_counter() - t0
  run.finish()
  assert mode == "offline" and took < 30, took
