"""cdeit_jax/common/logs.py: the metric logger's TensorBoard file, and its start-up cost."""

import importlib.util
import json
import struct
import subprocess
import sys

import pytest
from conftest import REPO


def _scalars(path) -> dict[tuple[str, int], float]:
  """(tag, step) -> value of an event file, read by hand: TFRecord frames (length, its CRC, the
  serialised Event, its CRC) holding tensorboardX's own Event protos."""
  from tensorboardX.proto import event_pb2

  data, out, i = path.read_bytes(), {}, 0
  while i < len(data):
    (n,) = struct.unpack("<Q", data[i : i + 8])
    event = event_pb2.Event.FromString(data[i + 12 : i + 12 + n])
    for v in event.summary.value:
      out[(v.tag, event.step)] = v.simple_value
    i += 12 + n + 4
  return out


def test_the_logger_writes_scalars_without_importing_torch(tmp_path):
  """tensorboardX imports torch whenever it is installed (1.8 s of every train.py start on 2
  cores); the logger hides it from that import, and torch stays importable afterwards."""
  if importlib.util.find_spec("torch") is None:
    pytest.skip("torch is not installed: nothing to hide")
  code = f"""
import sys
from cdeit_jax.common import logs
m = logs.MetricLogger({str(tmp_path)!r}, total_steps=4, start_step=0)
m.write(2, {{"loss": 0.5, "val_loss": float("nan")}}, advance=2)
m.write(4, {{"loss": 0.25}}, advance=2)
m.close()
print("torch imported:", "torch" in sys.modules)
import torch
print("torch afterwards:", torch.tensor([1.0]).item())
"""
  p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
  assert p.returncode == 0, p.stderr[-3000:]
  assert "torch imported: False" in p.stdout and "torch afterwards: 1.0" in p.stdout
  (events,) = (tmp_path / "tensorboard").glob("events.out.tfevents.*")
  assert _scalars(events) == {("loss", 2): 0.5, ("loss", 4): 0.25}
  records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert records == [{"step": 2, "loss": 0.5, "val_loss": None}, {"step": 4, "loss": 0.25}]


def test_a_refusal_names_the_debug_log_only_where_one_is_kept(tmp_path):
  """No step of a run reads: the refusal names the debug log with its path where the command
  keeps one (a training's workdir, an evaluation's output), and no log where none is kept (the
  reconstruct command: no debug.log to look for)."""
  from cdeit_jax.checkpoints import checkpoint
  from cdeit_jax.common import logs

  def unreadable(step):
    raise checkpoint.CheckpointError(f"step {step} damaged")

  logs.debug_log(str(tmp_path), enabled=False)
  with pytest.raises(checkpoint.CheckpointError) as e:
    checkpoint.first_intact([3, 2], unreadable, "RUN/checkpoints")
  assert "debug" not in str(e.value) and "move the steps away" in str(e.value)
  logs.debug_log(str(tmp_path))
  try:
    with pytest.raises(checkpoint.CheckpointError) as e:
      checkpoint.first_intact([3], unreadable, "RUN/checkpoints")
    assert f"The whole errors are in {tmp_path / logs.DEBUG_LOG};" in str(e.value)
  finally:
    logs.debug_log(str(tmp_path), enabled=False)
