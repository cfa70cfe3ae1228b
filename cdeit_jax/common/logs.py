"""Logging: one logger (`cdeit_jax` and its children) for every message, shown on stderr through
tqdm so progress bars stay intact; the debug log of full errors behind one-line reports; and the
training metrics of process 0: a progress bar on a terminal, `metrics.jsonl`, TensorBoard event
files (tensorboardX, no TensorFlow)."""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import tempfile
import time
from typing import Any

from cdeit_jax.common import compat, fileio

log = logging.getLogger("cdeit_jax")
DEBUG_LOG = "debug.log"


class _Console(logging.Handler):
  """stderr through `tqdm.write` (a running progress bar is redrawn below the message); warnings
  and errors are prefixed with their level."""

  def emit(self, record: logging.LogRecord) -> None:
    try:
      from tqdm import tqdm

      text = record.getMessage()
      if record.levelno >= logging.WARNING:
        text = f"{record.levelname.lower()}: {text}"
      tqdm.write(text, file=sys.stderr)
    except Exception as e:  # logging's convention: report, never raise
      if not compat.is_disk_full(e):  # a full disk is reported once, by the command
        self.handleError(record)


class _Lines:
  """Progress as log lines, for a stderr that is not a terminal (a log file, a pipe, a batch
  job), where a progress bar shows nothing: one line at most every `every` seconds, and one at
  the end."""

  def __init__(self, total: float, desc: str, unit: str, initial: float = 0, every: float = 10.0):
    self.total, self.desc, self.unit, self.every = total, desc, unit, every
    self.done = self.start = self.said_done = initial  # a resumed run starts at `initial`
    self.postfix, self.t0 = {}, time.perf_counter()
    self.said = self.t0

  def update(self, n: float = 1) -> None:
    self.done += n
    if time.perf_counter() - self.said >= self.every:
      self._say()

  def set_postfix(self, postfix: dict | None = None, refresh: bool = False, **kwargs) -> None:
    """As tqdm's: values shown after the count (a dict, or keywords)."""
    self.postfix = {**(postfix or {}), **kwargs}

  def _say(self) -> None:
    self.said, self.said_done = time.perf_counter(), self.done
    rate = (self.done - self.start) / max(self.said - self.t0, 1e-9)  # this run's own
    extra = "".join(f", {k}={v}" for k, v in self.postfix.items())
    log.info(
      f"{self.desc}: {self.done:.0f}/{self.total:.0f} {self.unit}s "
      f"({rate:.1f} {self.unit}s/s{extra})"
    )

  def close(self) -> None:
    if self.done != self.said_done:  # the end, unless the last line said it
      self._say()

  def __enter__(self) -> _Lines:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def progress(
  total: float, desc: str, unit: str, enabled: bool = True, initial: float = 0, **tqdm_kwargs
):
  """A progress bar on a terminal (tqdm), log lines every 10 s elsewhere (`_Lines`); nothing
  when not `enabled` (a process other than 0)."""
  from tqdm import tqdm

  if not enabled:
    return tqdm(total=total, disable=True)
  if sys.stderr.isatty():
    return tqdm(
      total=total,
      desc=desc,
      unit=unit,
      file=sys.stderr,
      initial=initial,
      **{"mininterval": 0.5, **tqdm_kwargs},
    )
  return _Lines(total, desc, unit, initial)


def console(primary: bool = True) -> None:
  """Show the `cdeit_jax` loggers on stderr (commands call this once jax knows the process):
  information from process 0, warnings and errors from every process."""
  for h in [h for h in log.handlers if isinstance(h, _Console)]:
    log.removeHandler(h)
  log.addHandler(_Console())
  log.setLevel(logging.INFO if primary else logging.WARNING)
  log.propagate = False


debug = logging.getLogger("cdeit_jax.debug")  # full errors behind one-line reports
debug.propagate = False


class _AppendHandler(logging.Handler):
  """Records appended to a `fileio.AppendLog` (a local file or an object), opened on the first
  record and continuing what the file already holds."""

  def __init__(self, path: str):
    super().__init__()
    self.path, self._log = path, None

  def emit(self, record: logging.LogRecord) -> None:
    try:
      if self._log is None:
        self._log = fileio.AppendLog(self.path)
      self._log.write(self.format(record) + "\n")
    except Exception as e:  # logging's convention: report, never raise
      if not compat.is_disk_full(e):  # a full disk is reported once, by the command
        self.handleError(record)

  def close(self) -> None:
    if self._log is not None:
      self._log.close()
      self._log = None
    super().close()


def debug_log_path() -> str | None:
  """Where the debug log goes in this process (`debug_log`), or None: no command set one."""
  return next((h.path for h in debug.handlers if isinstance(h, _AppendHandler)), None)


def debug_log(directory: str, enabled: bool = True) -> None:
  """Send the full errors behind one-line reports (damaged checkpoints) to
  `<directory>/debug.log` (created on the first record; local or gs://)."""
  debug.setLevel(logging.DEBUG)
  for h in list(debug.handlers):
    debug.removeHandler(h)
    h.close()
  if enabled:
    fileio.refuse_link(fileio.join(directory, DEBUG_LOG))
    handler = _AppendHandler(fileio.join(directory, DEBUG_LOG))
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    debug.addHandler(handler)


def cut_jsonl(text: str | None, last_step: int) -> tuple[str, int]:
  """(the records of steps <= `last_step` (the step training resumes from), each step once (its
  last record), in step order; how many lines were dropped)."""
  records, total = {}, 0
  for line in (text or "").splitlines(keepends=True):
    total += 1
    try:
      r = json.loads(line)
      step = int(r["step"])
    except (ValueError, KeyError, TypeError):
      continue  # a line cut by a kill
    if step <= last_step:
      records[step] = line if line.endswith("\n") else line + "\n"
  return "".join(records[s] for s in sorted(records)), total - len(records)


class StderrCapture:
  """While active, the process's stderr (fd 2) goes to a temporary file.

  A failed orbax restore leaves TensorStore reads in flight whose callbacks, from TensorStore's
  own threads, print "Event loop is closed" tracebacks straight to fd 2 (hundreds of lines for one
  truncated file). Restore attempts run under this: set `failed` when one fails; the captured
  text then goes to the debug log after a short wait for the late callbacks, and otherwise (only
  warnings) back to stderr.
  """

  def __init__(self, grace_s: float = 0.5):
    self.failed = False
    self.grace_s = grace_s

  def __enter__(self) -> StderrCapture:
    sys.stderr.flush()
    self._saved = os.dup(2)
    self._tmp = tempfile.TemporaryFile()
    os.dup2(self._tmp.fileno(), 2)
    return self

  def __exit__(self, *exc) -> None:
    if self.failed or exc[0] is not None:
      time.sleep(self.grace_s)
    sys.stderr.flush()
    os.dup2(self._saved, 2)
    os.close(self._saved)
    self._tmp.seek(0)
    text = self._tmp.read().decode(errors="replace")
    self._tmp.close()
    if self.failed or exc[0] is not None:
      if text:
        debug.debug("stderr during the failed checkpoint restore:\n%s", text)
    elif text:
      sys.stderr.write(text)


def _summary_writer_class() -> type:
  """tensorboardX's SummaryWriter, imported with torch hidden: its package imports torch when
  installed (as it is beside a PyTorch checkpoint to convert) only to accept torch tensors: a
  test train.py run's start-up went from 2.9 s to 1.5 s on 2 cores without it. We write Python
  floats. A `None` in `sys.modules` makes that one `import torch` fail as if torch were absent
  for that one import."""
  if "torch" in sys.modules:
    from tensorboardX import SummaryWriter

    return SummaryWriter
  sys.modules["torch"] = None  # type: ignore[assignment]
  try:
    from tensorboardX import SummaryWriter
  finally:
    del sys.modules["torch"]
  return SummaryWriter


class MetricLogger:
  """`start_step` is the step the run resumes from (0 for a new run): records of later steps,
  written by an earlier attempt whose checkpoints did not all commit, are dropped from
  metrics.jsonl and hidden from TensorBoard (`purge_step`), so each step appears once."""

  def __init__(self, workdir: str, total_steps: int, start_step: int, enabled: bool = True):
    self.enabled = enabled
    self.history = ""
    if not enabled:
      return
    SummaryWriter = _summary_writer_class()
    fileio.makedirs(workdir)
    path = fileio.join(workdir, "metrics.jsonl")
    kept, self.dropped = cut_jsonl(fileio.read_text(path), start_step)
    self.history = kept  # the records up to start_step (tracking rewrites an offline run from them)
    self.jsonl = fileio.AppendLog(path, kept)  # rewritten atomically first
    # tensorboardX writes gs:// itself (google-cloud-storage; the whole event file per flush).
    self.tb = SummaryWriter(fileio.join(workdir, "tensorboard"), purge_step=start_step + 1)
    # a bar on a terminal (steps, rate, tqdm's ETA) below the training's own line per log window;
    # elsewhere (a log file) those lines alone
    self.bar = None
    if sys.stderr.isatty():
      self.bar = progress(
        total_steps, "training", "step", initial=start_step, dynamic_ncols=True, mininterval=2.0
      )

  def write(self, step: int, metrics: dict[str, Any], advance: int = 0) -> None:
    if not self.enabled:
      return
    clean = {
      k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()
    }
    self.jsonl.write(json.dumps({"step": step, **clean}) + "\n")
    for k, v in metrics.items():
      if isinstance(v, (int, float)) and v is not None and math.isfinite(v):
        self.tb.add_scalar(k, v, step)
    if advance and self.bar is not None:
      self.bar.update(advance)

  def close(self) -> None:
    if self.enabled:
      if self.bar is not None:
        self.bar.close()
      self.tb.close()
      self.jsonl.close()
