"""No file is written through a symbolic link: anyone who can write a shared workdir or output
folder could otherwise plant a link and make a run overwrite a file its user can write. Each
writer of the commands against a link planted where it writes; the link's target (a "victim"
file or folder) must stay as it was, and the refusal is one line naming the link."""

import os
import pathlib
import subprocess
import sys

import pytest

from cdeit_jax.common import fileio, logs
from cdeit_jax.common.errors import InputError
from cdeit_jax.infer import outputs
from cdeit_jax.train import workdir_lock

REPO = pathlib.Path(__file__).parent.parent


@pytest.fixture
def victim(tmp_path):
  v = tmp_path / "victim.txt"
  v.write_text("precious")
  return v


def test_the_lock(tmp_path, victim):
  wd = tmp_path / "run"
  wd.mkdir()
  (wd / "lock").symlink_to(victim)
  with pytest.raises(InputError, match=f"{wd / 'lock'} is a symbolic link"):
    workdir_lock.WorkdirLock(str(wd)).acquire()
  assert victim.read_text() == "precious"


def test_train_py_with_a_linked_lock_stops_in_one_line(tmp_path, victim):
  """The issue's case: train.py on a workdir whose `lock` is a link leaves the target whole."""
  wd = tmp_path / "run"
  wd.mkdir()
  (wd / "lock").symlink_to(victim)
  r = subprocess.run(
    [sys.executable, "train.py", "--config", "configs/test.py", "--workdir", str(wd)],
    capture_output=True,
    text=True,
    cwd=REPO,
    timeout=300,
  )
  assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
  assert f"error: {wd / 'lock'} is a symbolic link" in r.stderr
  assert victim.read_text() == "precious" and not (wd / "checkpoints").exists()


def test_append_logs(tmp_path, victim):
  """metrics.jsonl continued in place refuses a link; one rewritten from `initial` replaces the
  link with a file of its own."""
  log = tmp_path / "metrics.jsonl"
  log.symlink_to(victim)
  with pytest.raises(InputError, match="is a symbolic link"):
    fileio.AppendLog(str(log))
  a = fileio.AppendLog(str(log), initial="{}\n")
  a.write("{}\n")
  a.close()
  assert not log.is_symlink() and log.read_text() == "{}\n{}\n"
  assert victim.read_text() == "precious"


def test_the_debug_log(tmp_path, victim):
  (tmp_path / logs.DEBUG_LOG).symlink_to(victim)
  with pytest.raises(InputError, match="is a symbolic link"):
    logs.debug_log(str(tmp_path))
  assert victim.read_text() == "precious"


def test_atomic_writes_replace_a_link_and_never_follow_a_planted_temporary(tmp_path, victim):
  """metrics.json (every output is an atomic write) as a link: the link is replaced; links
  planted under the temporary names the writer used before (`.NAME.tmp`) stay untouched, as
  does the probe of `writable_folder`."""
  out = tmp_path / "out"
  out.mkdir()
  (out / "metrics.json").symlink_to(victim)
  (out / ".metrics.json.tmp").symlink_to(victim)
  (out / f".write-test-{os.getpid()}").symlink_to(victim)
  fileio.writable_folder(str(out), "--out")
  fileio.write_text(str(out / "metrics.json"), "{}")
  assert not (out / "metrics.json").is_symlink() and (out / "metrics.json").read_text() == "{}"
  assert victim.read_text() == "precious"


def test_staging(tmp_path, victim):
  """A staging folder that is a link is refused; staging folders of processes that are gone
  (a SIGTERMed run) are removed by the next run, a live process's are kept."""
  out = tmp_path / "out"
  out.mkdir()
  (out / f".staging-{os.getpid()}").symlink_to(tmp_path)
  with pytest.raises(InputError, match="is a symbolic link"):
    outputs.Staged(str(out))
  (out / f".staging-{os.getpid()}").unlink()
  dead = subprocess.run(
    [sys.executable, "-c", "import os; print(os.getpid())"],
    capture_output=True,
    text=True,
    check=True,
  )
  stale = out / f".staging-{int(dead.stdout)}"
  stale.mkdir()
  (stale / "pred.npy").symlink_to(victim)  # a dead run's folder holding a planted link
  live = out / f".staging-{os.getppid()}"
  live.mkdir()
  staged = outputs.Staged(str(out))
  assert not stale.exists() and live.exists() and victim.read_text() == "precious"
  staged.abort()
  assert sorted(p.name for p in out.iterdir()) == [live.name]


def test_atomic_writes_keep_the_usual_file_mode(tmp_path):
  """A published file gets the mode an ordinary create gives under the process's umask (0644
  under 022), not a temporary file's 0600."""
  old = os.umask(0o022)
  try:
    fileio.write_text(str(tmp_path / "metrics.json"), "{}")
  finally:
    os.umask(old)
  assert (tmp_path / "metrics.json").stat().st_mode & 0o777 == 0o644
